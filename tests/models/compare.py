"""Greedy-equality rule for end-to-end comparisons (vLLM's own): outputs are equal, or at the
first divergence each side's token is in the other's top-k logprobs; generation after the
first divergence is not compared (the contexts differ). `check_greedy` adds the near-tie
rule: every divergence is a near-tie of the reference."""

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


def check_greedy(capsys, name: str, reference, candidate, *, near_tie: bool = True) -> Comparison:
    """`compare_greedy` (the top-5 rule), one summary line in the test log, and with
    `near_tie`, every divergence a near-tie of the reference (gap <= NEAR_TIE)."""
    cmp = compare_greedy(reference, candidate)
    with capsys.disabled():
        print(
            f"\n{name}: {cmp.identical}/{cmp.prompts} identical; divergences "
            f"(prompt, position, reference logprob gap): {cmp.divergences}"
        )
    if near_tie:
        assert all(gap <= NEAR_TIE for _, _, gap in cmp.divergences), (name, cmp.divergences)
    return cmp


def distinct_tokens(outputs) -> int:
    return len({t for toks, _ in outputs for t in toks})
