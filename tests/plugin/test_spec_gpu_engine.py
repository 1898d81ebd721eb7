"""Speculative decoding with ReplaySSM on a CUDA GPU (`gpu` marker; run on the GPU host). All
seven cases passed on the H200 on 2026-12-02 at 50e8544
(benchmarks/results/pytest-gpu-h200-20261202-50e8544-spec.log), which lifted the start-up
check's refusal of speculative ReplaySSM on GPUs.

The CPU test's workloads (test_spec_cpu_engine.py): NemotronH with ngram drafts on prompts
that repeat a pattern, Qwen3-Next on P + G + P prompts (G its own greedy continuation of P),
Qwen3-Next and NemotronH with vLLM's MTP drafters (k = 1 and 3; vLLM runs them with async
scheduling and padded drafts, so most batches are uniform and replay a graph), and
Qwen3-Next one-token prompts in recycled slots (vLLM's GDN metadata makes each a spec
decode row with placeholder drafts, which starts from a fresh page: on the GPU the reset runs
inside the step, `kernels/common/triton_fresh.py`). The engines capture FULL CUDA graphs for
uniform speculative batches (1 + k tokens per row); batches with prefill rows or rows
without drafts run eagerly. Lossless against non-speculative ReplaySSM on the GPU (route
replay), drafts partly accepted and partly rejected. Rule: tests/models/compare.py's near-tie
rule, where a divergence is wider than a near-tie of the bf16 reference judged on
transformers' fp32 model teacher-forced on the shared context (`TeacherForcedOracle`): on the
H200 (2026-12-02) the GDN runs parted only at fp32 near-ties (fp32 gaps 0.003-0.19, 16
divergences), which the bf16 reference's own logprobs put up to 0.31 apart (batch-shape
rounding; the checkpoint's MoE layer routes top-2 of 4 experts), while a wrong state leaves the
candidate's token far behind in fp32 (the NemotronH CUDA-graph defect of that day: 2.4).
At 133230c the Qwen3-Next nodes passed but the one-token test, which parted at a routing
tie (benchmarks/results/diag-h200-20261202-133230c-gdn-one-token-routing-tie.json: the MoE
router's second and third experts 0.0016 apart in fp32, a fifth of a bf16 step, so that
either run's rounding picks the experts; the spec run's token was the fp32 model's); the
rule now names such divergences instead of failing them (`TeacherForcedOracle.routing_tie`).
Not yet run on a GPU: `test_gdn_spec_decode_on_gpu_wide_batches` (24 rows: the planned split
window route, which the 3-row tests never reach) and `test_eagle_spec_decode_on_gpu_is_lossless`
(vLLM's EAGLE drafter; lossless on CPU in CI)."""

from __future__ import annotations

import pytest

from ..models.compare import check_greedy
from ..models.runs import (
    BUFFER_LEN,
    GPU_ENGINE,
    MTP_CHECKPOINTS,
    NEMOTRON_H_PROMPTS,
    NEMOTRON_H_TOKENS,
    PEAKED,
    mtp_checkpoint,
)
from ..models.tiny import TeacherForcedOracle, add_eagle_head
from .test_spec_cpu_engine import (
    GDN_NGRAM,
    GDN_ONE_TOKEN_PROMPTS,
    MTP_CASES,
    NEW_TOKENS,
    ONE_TOKEN_NEW_TOKENS,
    _check_partly_accepted,
    mtp_prompts,  # noqa: F401
    qwen_dir,  # noqa: F401  (module fixture: the tiny Qwen3-Next with one MoE layer)
    qwen_prompts,  # noqa: F401
)

pytestmark = [pytest.mark.engine, pytest.mark.gpu]

NGRAM = {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
PLAIN = {"enabled": True, "buffer_len": BUFFER_LEN, "route": "replay"}


def _engine(k: int, rows: int, compilation: dict | None = None) -> dict:
    """GPU_ENGINE for up to `rows` running requests, with capture sizes that hold uniform
    batches of 1 + k tokens per row (1, 2 and `rows` rows); `compilation`: entries over its
    compilation config."""
    graphs = {**GPU_ENGINE["compilation_config"], **(compilation or {})}
    if k:
        graphs["cudagraph_capture_sizes"] = [(1 + k) * n for n in sorted({1, 2, rows})]
    budget = max(GPU_ENGINE["max_num_batched_tokens"], (1 + k) * rows)
    return {
        **GPU_ENGINE,
        "compilation_config": graphs,
        "max_num_seqs": rows,
        "max_num_batched_tokens": budget,
    }


def _run(
    runs,
    model_dir,
    prompts,
    tokens,
    replayssm,
    k=0,
    drafter=NGRAM,
    metrics=None,
    rows=3,
    compilation=None,
):
    """Greedy run on the GPU (`greedy_outputs` picks vLLM's Triton GDN prefill there)."""
    spec = {"speculative_config": {**drafter, "num_speculative_tokens": k}} if k else {}
    return runs.greedy(
        model_dir,
        prompts,
        tokens,
        logprobs=5,
        metrics=metrics,
        additional_config={"replayssm": replayssm},
        **spec,
        **_engine(k, rows, compilation),
    )


def _check_lossless(
    runs,
    capsys,
    name,
    model_dir,
    prompts,
    tokens,
    replayssm,
    k,
    drafter=NGRAM,
    rows=3,
    compilation=None,
) -> dict[str, float]:
    """Plain ReplaySSM (route replay) and speculative decoding with `replayssm` and k drafts
    on the same prompts, up to `rows` requests at a time; the speculative run held to the
    fp32-judged near-tie rule against the plain one; `compilation`: both engines' compilation
    config entries over GPU_ENGINE's. Returns the speculative engine's metrics."""
    plain = _run(runs, model_dir, prompts, tokens, PLAIN, rows=rows, compilation=compilation)
    metrics: dict[str, float] = {}
    ours = _run(
        runs,
        model_dir,
        prompts,
        tokens,
        replayssm,
        k,
        drafter=drafter,
        metrics=metrics,
        rows=rows,
        compilation=compilation,
    )
    check_greedy(
        capsys,
        f"{name} vs non-speculative ReplaySSM",
        plain,
        ours,
        prompts=prompts,
        oracle=TeacherForcedOracle(model_dir),
    )
    return metrics


NEMOTRON_H_CASES = {
    "k3_L16": (3, {"buffer_len": 16}),
    # buffer_len unset: Mamba-2 with an LP copy rings 32 steps (config.DEFAULT_BUFFER_LEN)
    "k3_default": (3, {}),
    "k5_L6_hp_only": (5, {"buffer_len": 6, "lp_dtype": "none"}),
}


@pytest.mark.parametrize("case", list(NEMOTRON_H_CASES))
def test_spec_decode_on_gpu_is_lossless(runs, case, capsys):
    k, settings = NEMOTRON_H_CASES[case]
    name = f"nemotron_h (GPU) {case}"
    metrics = _check_lossless(
        runs,
        capsys,
        name,
        runs.checkpoint("nemotron_h", **PEAKED),
        NEMOTRON_H_PROMPTS,
        NEMOTRON_H_TOKENS,
        {"enabled": True, "debug_checks": True, **settings},
        k,
    )
    _check_partly_accepted(name, metrics, capsys)


GDN_CASES = {
    "k3_L4": (3, {"buffer_len": 4}),
    "k2_L16_hp_only": (2, {"buffer_len": 16, "lp_dtype": "none"}),
}


@pytest.mark.parametrize("case", list(GDN_CASES))
def test_gdn_spec_decode_on_gpu_is_lossless(runs, qwen_dir, qwen_prompts, case, capsys):  # noqa: F811
    k, settings = GDN_CASES[case]
    name = f"qwen3_next (GPU) {case}"
    metrics = _check_lossless(
        runs,
        capsys,
        name,
        qwen_dir,
        qwen_prompts,
        NEW_TOKENS,
        {"enabled": True, **settings},
        k,
        drafter=GDN_NGRAM,
    )
    _check_partly_accepted(name, metrics, capsys)


def test_gdn_spec_decode_on_gpu_wide_batches(runs, qwen_dir, qwen_prompts, capsys):  # noqa: F811
    """24 requests at a time (the 12 P + G + P prompts and the same rotated by one token):
    twice the 12 rows of the test above. Both take the split route (window plan, flush
    launch over the listed rows, planned readout; only steps of one row, two HP only,
    `dispatch.FUSED_ROUTE_MAX_ROWS{,_HP_ONLY}`, run the one-launch window step), here
    eagerly and as FULL graphs of 24 rows (up to 16 rows ran the one-launch step until
    3997590's A/B)."""
    prompts = qwen_prompts + [p[1:] + p[:1] for p in qwen_prompts]
    k, settings = GDN_CASES["k3_L4"]
    name = "qwen3_next (GPU) k3_L4, 24 rows"
    metrics = _check_lossless(
        runs,
        capsys,
        name,
        qwen_dir,
        prompts,
        NEW_TOKENS,
        {"enabled": True, **settings},
        k,
        drafter=GDN_NGRAM,
        rows=len(prompts),
    )
    _check_partly_accepted(name, metrics, capsys)


def test_gdn_one_token_prompts_on_gpu(runs, qwen_dir, capsys):  # noqa: F811
    _check_lossless(
        runs,
        capsys,
        "qwen3_next (GPU) one-token prompts, k3_L16",
        qwen_dir,
        GDN_ONE_TOKEN_PROMPTS,
        ONE_TOKEN_NEW_TOKENS,
        {"enabled": True, "buffer_len": 16, "lp_dtype": "none"},
        3,
        drafter=GDN_NGRAM,
    )


# vLLM's GPU ngram drafter (`method="ngram_gpu"`: the proposer runs on the device, with
# async scheduling and padded drafts, so nearly every batch is uniform and replays a graph).
# It cannot run on the CPU platform (vLLM pins host buffers for it), and vLLM 0.26 compiles
# its proposer with torch.compile, so an engine with compilation mode 0 fails at start-up
# ("No compilation mode is set", also without ReplaySSM: H200, bf5a250,
# benchmarks/results/pytest-gpu-h200-20261203-bf5a250-spec-ngram-gpu.log). These runs take
# vLLM's default mode 3 with FULL_AND_PIECEWISE graphs, plain and speculative alike.
# Passed for both families on the H200 at f9dd7f8 (benchmarks/results/
# pytest-gpu-h200-20261203-f9dd7f8-ngram-gpu-*.log); `config_checks` allows ngram_gpu since.
NGRAM_GPU_CASES = {
    "qwen3_next": {"method": "ngram_gpu", "prompt_lookup_max": 3, "prompt_lookup_min": 1},
    "nemotron_h": {**NGRAM, "method": "ngram_gpu"},
}
COMPILED = {"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"}


@pytest.mark.parametrize("kind", list(NGRAM_GPU_CASES))
def test_ngram_gpu_spec_decode_on_gpu_is_lossless(runs, kind, request, capsys):
    """The ngram tests' workloads (k = 3, buffer_len 16, bf16 LP) with vLLM's GPU ngram
    drafter, both runs compiled (COMPILED): lossless against plain ReplaySSM, drafts partly
    accepted. The Qwen3-Next fixtures are asked for only by that case: its prompts come from
    an engine run of their own, which the NemotronH case does not need."""
    name = f"{kind} ngram_gpu (GPU, compiled) k3_L16"
    if kind == "qwen3_next":
        model_dir = request.getfixturevalue("qwen_dir")
        prompts, tokens = request.getfixturevalue("qwen_prompts"), NEW_TOKENS
    else:
        model_dir = runs.checkpoint("nemotron_h", **PEAKED)
        prompts, tokens = NEMOTRON_H_PROMPTS, NEMOTRON_H_TOKENS
    metrics = _check_lossless(
        runs,
        capsys,
        name,
        model_dir,
        prompts,
        tokens,
        {"enabled": True, "buffer_len": 16},
        3,
        drafter=NGRAM_GPU_CASES[kind],
        compilation=COMPILED,
    )
    _check_partly_accepted(name, metrics, capsys)


def _check_model_drafter_on_gpu(runs, capsys, kind, prompts, drafter, k, settings, name):
    """`_check_lossless` with a model drafter (`drafter`: vLLM's speculative config without
    k) on the MTP checkpoint of `kind`; then the drafter ran and its drafts were partly
    accepted (as test_spec_cpu_engine's `_check_model_drafter`)."""
    metrics = _check_lossless(
        runs,
        capsys,
        name,
        mtp_checkpoint(runs, kind),
        prompts,
        NEW_TOKENS,
        {"enabled": True, **settings},
        k,
        drafter=drafter,
    )
    assert metrics["vllm:spec_decode_num_draft_tokens"] >= len(prompts) * (NEW_TOKENS // 2), (
        f"the {drafter['method']} drafter did not run"
    )
    _check_partly_accepted(name, metrics, capsys, share=0.1)


@pytest.mark.parametrize("case", list(MTP_CASES))
@pytest.mark.parametrize("kind", list(MTP_CHECKPOINTS))
def test_mtp_spec_decode_on_gpu_is_lossless(runs, kind, mtp_prompts, case, capsys):  # noqa: F811
    """vLLM's MTP drafters (Qwen3NextMTP, NemotronHMTP) on the CPU test's checkpoints,
    whose drafts are partly accepted (test_spec_cpu_engine.py)."""
    k, settings = MTP_CASES[case]
    name = f"{kind} mtp (GPU) {case}"
    mtp = {"method": "mtp"}
    _check_model_drafter_on_gpu(runs, capsys, kind, mtp_prompts, mtp, k, settings, name)


@pytest.mark.parametrize("kind", list(MTP_CHECKPOINTS))
def test_eagle_spec_decode_on_gpu_is_lossless(runs, kind, mtp_prompts, capsys):  # noqa: F811
    """vLLM's EAGLE drafter (`EagleLlamaForCausalLM`, k = 3) on the MTP checkpoints with the
    CPU test's crafted head (`tiny.add_eagle_head`), whose drafts are partly accepted."""
    eagle = {"method": "eagle", "model": str(add_eagle_head(mtp_checkpoint(runs, kind)))}
    name = f"{kind} eagle (GPU) k3_L16"
    _check_model_drafter_on_gpu(runs, capsys, kind, mtp_prompts, eagle, 3, {"buffer_len": 16}, name)
