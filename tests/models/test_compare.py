"""The engine tests' comparison rule (tests/models/compare.py) on hand-made outputs: the top-5
rule, the near-tie rule, the fp32 oracle's verdict on divergences wider than a near-tie and
its routing-tie exception; and the oracle itself on a real checkpoint."""

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
    contexts asked for; routing_tie: `tie`."""

    def __init__(self, fp32_gap: float, tie: bool = False) -> None:
        self.fp32_gap = fp32_gap
        self.tie = tie
        self.contexts: list[list[int]] = []

    def next_logprobs(self, context: list[int]) -> torch.Tensor:
        self.contexts.append(context)
        lp = torch.full((32,), -10.0)
        lp[7], lp[8] = -1.0, -1.0 - self.fp32_gap
        return lp

    def routing_tie(self, context: list[int]) -> bool:
        return self.tie


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


def _outside_top5():
    ref, cand = _outputs(2 * NEAR_TIE)
    cand[0][1][1] = {8: -1.0, 30: -1.1, 31: -1.2, 9: -3.0, 10: -4.0}  # 7 not in its top-5
    return ref, cand


def test_top5_rule_holds_where_no_router_ties(capsys):
    ref, cand = _outside_top5()
    with pytest.raises(AssertionError, match="top-5"):
        compare_greedy(ref, cand)
    with pytest.raises(AssertionError):
        check_greedy(capsys, "top-5", ref, cand, prompts=PROMPTS, oracle=_Oracle(0.0))


@pytest.mark.parametrize("fp32_gap", [1.0, -1.0])
def test_a_routing_tie_excuses_a_divergence(capsys, fp32_gap):
    """Outside the top-5 and far apart in fp32 (either way), at a routing tie: the experts
    were picked by rounding, and the divergence is named in the summary, not failed."""
    ref, cand = _outside_top5()
    cmp = check_greedy(
        capsys, "tie", ref, cand, prompts=PROMPTS, oracle=_Oracle(fp32_gap, tie=True)
    )
    assert cmp.outside_top_k == [(0, 1)]


def test_routing_tie_of_the_spec_tests_checkpoint(runs):
    """TeacherForcedOracle.routing_tie on the speculative tests' Qwen3-Next (top-2 of 4
    experts in its last layer): the context where the H200 runs of the one-token test parted
    on 2026-12-02 (fp32 router logits -1.3419, -1.3404, -1.3332 for three experts: the
    second and third 0.0016 apart, a fifth of a bf16 step) is a tie; the prompt alone (last
    position: a margin of 1.1) is not."""
    from ..plugin.test_spec_cpu_engine import GDN_ONE_TOKEN_PROMPTS
    from .runs import PEAKED, QWEN3_NEXT_SPEC
    from .tiny import TeacherForcedOracle

    oracle = TeacherForcedOracle(runs.checkpoint("qwen3_next", **PEAKED, **QWEN3_NEXT_SPEC))
    prompt = GDN_ONE_TOKEN_PROMPTS[2]
    assert oracle.routing_tie([*prompt, 65, 350, 134, 134, 351, 64, 155, 229, 417, 466, 451])
    assert not oracle.routing_tie(prompt)


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
