"""The engine tests' comparison rule (tests/models/compare.py) on hand-made outputs: the top-5
rule, the near-tie rule, and the fp32 oracle's verdict on divergences wider than a near-tie."""

import pytest
import torch

from .compare import NEAR_TIE, check_greedy, compare_greedy

PROMPTS = [[1, 2, 3], [4, 5]]


def _run(tokens: list[int], tops: list[dict[int, float]]):
    return (tokens, tops)


def _outputs(gap: float):
    """Reference and candidate parting at prompt 0, position 1 (tokens 7 vs 8), the
    reference preferring 7 by `gap`; prompt 1 identical."""
    top = {7: -1.0, 8: -1.0 - gap, 9: -3.0, 10: -4.0, 11: -5.0}
    cand_top = {8: -1.0, 7: -1.0 - gap, 9: -3.0, 10: -4.0, 11: -5.0}
    same = {20: -0.5, 21: -2.0, 22: -3.0, 23: -4.0, 24: -5.0}
    ref = [_run([5, 7, 9], [same, top, same]), _run([20, 20], [same, same])]
    cand = [_run([5, 8, 9], [same, cand_top, same]), _run([20, 20], [same, same])]
    return ref, cand


class _Oracle:
    """next_logprobs: a fixed distribution with tokens 7 and 8 `fp32_gap` apart; records the
    contexts asked for."""

    def __init__(self, fp32_gap: float) -> None:
        self.fp32_gap = fp32_gap
        self.contexts: list[list[int]] = []

    def next_logprobs(self, context: list[int]) -> torch.Tensor:
        self.contexts.append(context)
        lp = torch.full((32,), -10.0)
        lp[7], lp[8] = -1.0, -1.0 - self.fp32_gap
        return lp


def test_near_tie_passes(capsys):
    ref, cand = _outputs(NEAR_TIE / 2)
    cmp = check_greedy(capsys, "near-tie", ref, cand)
    assert cmp.identical == 1 and [(i, p) for i, p, _ in cmp.divergences] == [(0, 1)]


def test_wide_divergence_fails_without_oracle(capsys):
    ref, cand = _outputs(2 * NEAR_TIE)
    with pytest.raises(AssertionError):
        check_greedy(capsys, "wide", ref, cand)


def test_oracle_near_tie_accepts_a_wide_bf16_gap(capsys):
    ref, cand = _outputs(2 * NEAR_TIE)
    oracle = _Oracle(NEAR_TIE / 4)
    check_greedy(capsys, "wide, fp32 near-tie", ref, cand, prompts=PROMPTS, oracle=oracle)
    # The shared context: prompt 0 and the reference's tokens before the divergence.
    assert oracle.contexts == [[1, 2, 3, 5]]


def test_oracle_far_apart_fails(capsys):
    ref, cand = _outputs(2 * NEAR_TIE)
    with pytest.raises(AssertionError):
        check_greedy(capsys, "wide, fp32 far", ref, cand, prompts=PROMPTS, oracle=_Oracle(1.0))


def test_oracle_candidate_far_better_fails(capsys):
    """A candidate the oracle prefers by far is not lossless either: the rule is symmetric."""
    ref, cand = _outputs(2 * NEAR_TIE)
    with pytest.raises(AssertionError):
        check_greedy(capsys, "wide, fp32 far", ref, cand, prompts=PROMPTS, oracle=_Oracle(-1.0))


def test_top5_rule_is_not_overridden_by_the_oracle(capsys):
    ref, cand = _outputs(2 * NEAR_TIE)
    cand[0][1][1] = {8: -1.0, 30: -1.1, 31: -1.2, 9: -3.0, 10: -4.0}  # 7 not in its top-5
    with pytest.raises(AssertionError, match="top-5"):
        compare_greedy(ref, cand)
    with pytest.raises(AssertionError, match="top-5"):
        check_greedy(capsys, "top-5", ref, cand, prompts=PROMPTS, oracle=_Oracle(0.0))


def test_teacher_forced_oracle_matches_transformers_generate(runs):
    """The oracle's next-token logprobs after prompt + the first tokens equal those of
    transformers' own fp32 generate at those positions (same model, same context)."""
    from .runs import PEAKED
    from .tiny import TeacherForcedOracle, transformers_greedy_outputs

    path = runs.checkpoint("qwen3_next", **PEAKED, mlp_only_layers=[0, 1, 2])
    prompt = [5, 17, 42, 99, 3]
    ((tokens, tops),) = transformers_greedy_outputs(path, [prompt], 3, dtype=torch.float32)
    oracle = TeacherForcedOracle(path)
    for pos in range(3):
        lp = oracle.next_logprobs(prompt + tokens[:pos])
        assert int(lp.argmax()) == tokens[pos]
        for tok, val in tops[pos].items():
            assert abs(float(lp[tok]) - val) < 1e-4, (pos, tok)
