"""End to end on a CUDA GPU (`gpu` marker; run on the GPU host): the tiny NemotronH and
Qwen3-Next models with FULL CUDA graphs for pure decode batches, ReplaySSM (route "auto":
the measured policy, and "replay": the replay kernels at every batch size) against stock vLLM
0.26 in the same scheduler setting as the CPU tests: chunked prefill, mixed prefill + decode
batches, late arrivals, five flush cycles per request. Rule: tests/models/compare.py, and
every divergence must be a near-tie."""

from __future__ import annotations

import pytest

from ..models.compare import NEAR_TIE, compare_greedy, distinct_tokens
from ..models.runs import BUFFER_LEN, GPU_ENGINE, GPU_NEW_TOKENS, PEAKED, prompts
from ..models.tiny import greedy_outputs

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", params=["nemotron_h", "qwen3_next"])
def model(request, runs):
    kind = request.param
    return kind, runs.checkpoint(kind, **PEAKED)


def _run(model, **replayssm):
    return greedy_outputs(
        model[1],
        prompts(),
        GPU_NEW_TOKENS,
        logprobs=5,
        additional_config={"replayssm": {"buffer_len": BUFFER_LEN, **replayssm}},
        **GPU_ENGINE,
    )


@pytest.mark.gpu
def test_replayssm_matches_stock_on_gpu(model, capsys):
    stock = _run(model, enabled=False)
    assert distinct_tokens(stock) > 80, "reference outputs are not diverse"
    for route in ("auto", "replay"):
        ours = _run(model, enabled=True, lp_dtype="bfloat16", route=route)
        cmp = compare_greedy(stock, ours)
        with capsys.disabled():
            print(
                f"\n{model[0]} route={route} vs stock vLLM (GPU): {cmp.identical}/"
                f"{cmp.prompts} identical; divergences {cmp.divergences}"
            )
        assert all(gap <= NEAR_TIE for _, _, gap in cmp.divergences), cmp.divergences


@pytest.mark.gpu
def test_gdn_one_token_prompts_on_gpu(runs, capsys):
    """Plain decode on Qwen3-Next: vLLM's GDN metadata makes a new one-token request a decode
    row, and vLLM does not clear recycled state pages; ReplaySSM resets such a row's page in
    the step (`layers/fresh.py`, one launch, inside the CUDA graph). Ten prompts, six of them
    one token long (test_spec_cpu_engine.GDN_ONE_TOKEN_PROMPTS), three requests at a time, so
    slots are recycled; held to transformers' own model in fp32 by the top-5 rule (a row
    decoded from another request's state is top-5 apart at its first token)."""
    import torch

    from ..models.compare import check_greedy
    from ..models.tiny import transformers_greedy_outputs
    from .test_spec_cpu_engine import GDN_ONE_TOKEN_PROMPTS, ONE_TOKEN_NEW_TOKENS

    path = runs.checkpoint("qwen3_next", **PEAKED, mlp_only_layers=[0, 1, 2])
    oracle = transformers_greedy_outputs(
        path, GDN_ONE_TOKEN_PROMPTS, ONE_TOKEN_NEW_TOKENS, dtype=torch.float32
    )
    for route in ("auto", "replay"):
        ours = greedy_outputs(
            path,
            GDN_ONE_TOKEN_PROMPTS,
            ONE_TOKEN_NEW_TOKENS,
            logprobs=5,
            additional_config={
                "replayssm": {"enabled": True, "buffer_len": BUFFER_LEN, "route": route}
            },
            **GPU_ENGINE,
        )
        check_greedy(
            capsys,
            f"qwen3_next one-token prompts, route {route}, vs transformers fp32",
            oracle,
            ours,
            near_tie=False,
        )
