"""Greedy-equality rule for end-to-end comparisons (vLLM's own): outputs are equal, or at the
first divergence each side's token is in the other's top-k logprobs; generation after the
first divergence is not compared (the contexts differ). `check_greedy` adds the near-tie
rule: every divergence is a near-tie of the reference, or, given an fp32 oracle, of the
oracle's distribution on the shared context."""

from __future__ import annotations

from dataclasses import dataclass

# Largest reference logprob gap allowed where two paths part: 4 bf16 steps of the logits at
# the scale of the tiny checkpoints and the demo models (top logprobs about -1 to -2.5). Paths
# that differ only by fp32 summation order (or LP rounding) may only part at such near-ties.
NEAR_TIE = 0.25


@dataclass
class Comparison:
    prompts: int
    identical: int
    divergences: list[tuple[int, int, float]]  # (prompt, position, ref logprob gap there)


def compare_greedy(reference, candidate, k: int = 5) -> Comparison:
    """reference / candidate: [(token ids, [{token: logprob}] per position)] per prompt.
    Raises AssertionError on a divergence that breaks the rule."""
    assert len(reference) == len(candidate)
    identical, divergences = 0, []
    for i, ((ref, ref_lp), (cand, cand_lp)) in enumerate(zip(reference, candidate, strict=True)):
        assert len(ref) == len(cand), f"prompt {i}: {len(ref)} vs {len(cand)} tokens"
        pos = next((j for j, (a, b) in enumerate(zip(ref, cand, strict=True)) if a != b), None)
        if pos is None:
            identical += 1
            continue
        top_ref = dict(sorted(ref_lp[pos].items(), key=lambda t: -t[1])[:k])
        top_cand = dict(sorted(cand_lp[pos].items(), key=lambda t: -t[1])[:k])
        assert cand[pos] in top_ref and ref[pos] in top_cand, (
            f"prompt {i}, position {pos}: reference {ref[pos]} (top-{k} {top_ref}) vs "
            f"candidate {cand[pos]} (top-{k} {top_cand})"
        )
        gap = top_ref[ref[pos]] - top_ref.get(cand[pos], float("-inf"))
        divergences.append((i, pos, gap))
    return Comparison(len(reference), identical, divergences)


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
    leaves the candidate's token far behind in fp32 too."""
    cmp = compare_greedy(reference, candidate)
    wide = [d for d in cmp.divergences if d[2] > NEAR_TIE]
    judged = []
    if near_tie and wide and oracle is not None:
        assert prompts is not None, "the oracle needs the prompts"
        for i, pos, gap in wide:
            ref_tok, cand_tok = reference[i][0][pos], candidate[i][0][pos]
            lp = oracle.next_logprobs(list(prompts[i]) + list(reference[i][0][:pos]))
            judged.append((i, pos, gap, abs(float(lp[ref_tok] - lp[cand_tok]))))
        wide = [(i, pos, gap) for i, pos, gap, fp32_gap in judged if fp32_gap > NEAR_TIE]
    with capsys.disabled():
        print(
            f"\n{name}: {cmp.identical}/{cmp.prompts} identical; divergences "
            f"(prompt, position, reference logprob gap): {cmp.divergences}"
            + (
                f"; fp32 oracle gaps there (prompt, position, gap, fp32 gap): {judged}"
                if judged
                else ""
            )
        )
    if near_tie:
        assert not wide, (name, cmp.divergences, judged)
    return cmp


def distinct_tokens(outputs) -> int:
    return len({t for toks, _ in outputs for t in toks})
