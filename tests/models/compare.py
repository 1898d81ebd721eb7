"""Greedy-equality rule for end-to-end comparisons (vLLM's own): outputs are equal, or at the
first divergence each side's token is in the other's top-k logprobs; generation after the
first divergence is not compared (the contexts differ). `check_greedy` adds the near-tie
rule: every divergence is a near-tie of the reference, or, given an fp32 oracle, of the
oracle's distribution on the shared context; and the one exception, given the oracle: a
divergence where an MoE router's choice is below bf16 resolution in fp32 (a routing tie:
bf16 rounding picks the experts, and either side of that choice is the model's)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Largest reference logprob gap allowed where two paths part: 4 bf16 steps of the logits at
# the scale of the tiny checkpoints and the demo models (top logprobs about -1 to -2.5). Paths
# that differ only by fp32 summation order (or LP rounding) may only part at such near-ties.
NEAR_TIE = 0.25


@dataclass
class Comparison:
    prompts: int
    identical: int
    divergences: list[tuple[int, int, float]]  # (prompt, position, ref logprob gap there)
    # (prompt, position) of divergences that break the top-k rule (top_k_rule=False only)
    outside_top_k: list[tuple[int, int]] = field(default_factory=list)


def compare_greedy(reference, candidate, k: int = 5, *, top_k_rule: bool = True) -> Comparison:
    """reference / candidate: [(token ids, [{token: logprob}] per position)] per prompt.
    Raises AssertionError on a divergence that breaks the top-k rule; with top_k_rule False
    it lists them instead (`check_greedy` asks its oracle about those)."""
    assert len(reference) == len(candidate)
    identical, divergences, outside = 0, [], []
    for i, ((ref, ref_lp), (cand, cand_lp)) in enumerate(zip(reference, candidate, strict=True)):
        assert len(ref) == len(cand), f"prompt {i}: {len(ref)} vs {len(cand)} tokens"
        pos = next((j for j, (a, b) in enumerate(zip(ref, cand, strict=True)) if a != b), None)
        if pos is None:
            identical += 1
            continue
        top_ref = dict(sorted(ref_lp[pos].items(), key=lambda t: -t[1])[:k])
        top_cand = dict(sorted(cand_lp[pos].items(), key=lambda t: -t[1])[:k])
        if not (cand[pos] in top_ref and ref[pos] in top_cand):
            assert not top_k_rule, (
                f"prompt {i}, position {pos}: reference {ref[pos]} (top-{k} {top_ref}) vs "
                f"candidate {cand[pos]} (top-{k} {top_cand})"
            )
            outside.append((i, pos))
        gap = top_ref[ref[pos]] - top_ref.get(cand[pos], float("-inf"))
        divergences.append((i, pos, gap))
    return Comparison(len(reference), identical, divergences, outside)


def check_greedy(
    capsys,
    name: str,
    reference,
    candidate,
    *,
    near_tie: bool = True,
    prompts: list[list[int]] | None = None,
    oracle=None,
) -> Comparison:
    """`compare_greedy` (the top-5 rule), one summary line in the test log, and with
    `near_tie`, every divergence a near-tie (gap <= NEAR_TIE) of the reference or, where
    the reference's own gap is wider and an `oracle` is given (`tiny.TeacherForcedOracle`,
    with the runs' `prompts`), of the oracle's fp32 distribution after the context both runs
    share up to the divergence. The second form asks the more precise implementation: two
    bf16 runs of different batch shapes can each round a fp32 near-tie their own way, by
    more than NEAR_TIE in a bf16 reference where an MoE routing choice flips; a wrong state
    leaves the candidate's token far behind in fp32 too. With the oracle, a divergence that
    breaks the top-5 rule or whose fp32 gap is wide passes only at a routing tie
    (`TeacherForcedOracle.routing_tie`: an MoE router whose k-th and (k + 1)-th experts are
    closer in fp32 than one bf16 step), where which experts run, and so the next-token
    distribution, is decided by bf16 rounding; those are named in the summary line."""
    judge = near_tie and oracle is not None
    cmp = compare_greedy(reference, candidate, top_k_rule=not judge)
    outside = set(cmp.outside_top_k)
    wide = [d for d in cmp.divergences if d[2] > NEAR_TIE or d[:2] in outside]
    judged = []
    if judge and wide:
        assert prompts is not None, "the oracle needs the prompts"
        for i, pos, gap in wide:
            ref_tok, cand_tok = reference[i][0][pos], candidate[i][0][pos]
            context = list(prompts[i]) + list(reference[i][0][:pos])
            lp = oracle.next_logprobs(context)
            fp32_gap = abs(float(lp[ref_tok] - lp[cand_tok]))
            judged.append((i, pos, gap, fp32_gap, oracle.routing_tie(context)))
        wide = [
            (i, pos, gap)
            for i, pos, gap, fp32_gap, tie in judged
            if not tie and ((i, pos) in outside or fp32_gap > NEAR_TIE)
        ]
    with capsys.disabled():
        print(
            f"\n{name}: {cmp.identical}/{cmp.prompts} identical; divergences "
            f"(prompt, position, reference logprob gap): {cmp.divergences}"
            + (f"; outside the top-5: {cmp.outside_top_k}" if cmp.outside_top_k else "")
            + (
                f"; fp32 oracle there (prompt, position, gap, fp32 gap, routing tie): {judged}"
                if judged
                else ""
            )
        )
    if near_tie:
        assert not wide, (name, cmp.divergences, cmp.outside_top_k, judged)
    return cmp


def check_logprobs(capsys, name: str, reference, candidate, bound: float = NEAR_TIE) -> float:
    """Where two runs chose the same tokens (each prompt up to its first divergence), the
    logprob each gave its token differs by at most `bound`; one summary line; returns the
    largest difference. The token rules alone miss a state that lost some of its history on
    a peaked checkpoint: the NemotronH prefix-caching test with the hit's ring fold skipped
    kept every token and moved the follow-up turn's logprobs by 0.32, against at most 0.06
    with the fold (2026-12-05). For checkpoints whose bf16 runs move single logprobs by about
    NEAR_TIE anyway (the tiny Qwen3-Next: up to 0.27 from its fp32 model at one position)
    it is no rule."""
    worst, where = 0.0, None
    for i, ((ref, ref_lp), (cand, cand_lp)) in enumerate(zip(reference, candidate, strict=True)):
        for pos, (a, b) in enumerate(zip(ref, cand, strict=True)):
            if a != b:
                break
            d = abs(ref_lp[pos][a] - cand_lp[pos][a])
            if d > worst:
                worst, where = d, (i, pos)
    with capsys.disabled():
        print(f"\n{name}: largest logprob difference on equal tokens {worst:.4f} at {where}")
    assert worst <= bound, (name, worst, where)
    return worst


def distinct_tokens(outputs) -> int:
    return len({t for toks, _ in outputs for t in toks})
