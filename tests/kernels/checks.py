"""Checks shared by both families' reference and kernel tests."""

from __future__ import annotations

import torch

from vllm_replayssm.kernels.common.cursor import COMMITTED, ORIGIN

from .scenario import random_schedule, run_scenario
from .tolerances import TOL, tol_for


def check_scenario(
    fam, *, L: int, T: int, lp: torch.dtype | None, spec: bool, requests: int = 4,
    cycles: int = 3, churn: bool = False, stagger: bool = True, seed: int = 0,
    rounding: torch.dtype | None = None, check_untouched: bool = True,
) -> None:
    """Decode >= `cycles` flush cycles and compare every output and the final state."""
    gen = torch.Generator().manual_seed(seed)
    steps = cycles * L + L // 2 + 2
    sched = random_schedule(requests, steps, T, gen, spec=spec, churn=churn)
    res = run_scenario(fam, L, T, lp, sched, spec=spec, stagger=stagger, seed=seed,
                       check_untouched=check_untouched)
    tol = tol_for(lp, rounding)
    worst = max(res.step_errors)
    assert worst <= tol, f"output error {worst:.3g} > {tol:.3g} (per step: {res.step_errors})"
    assert res.state_errors, "no request ran to the end"
    state_tol = tol_for(rounding)
    for r, e in res.state_errors.items():
        assert e <= state_tol, f"request {r}: materialised HP error {e:.3g} > {state_tol:.3g}"
    if not spec and not churn:
        assert res.flushes >= requests * (cycles - 1), f"only {res.flushes} flushes"


def check_hp_independent_of_lp(make_fam, *, L: int, T: int, spec: bool, seed: int = 0) -> None:
    """HP written at every flush is bitwise the same with LP off, bf16 and fp16."""
    gen = torch.Generator().manual_seed(seed)
    sched = random_schedule(3, 3 * L + 3, T, gen, spec=spec)
    traces = {}
    for lp in (None, torch.bfloat16, torch.float16):
        trace: list[tuple[torch.Tensor, torch.Tensor]] = []

        def record(_step, cache, flushed, trace=trace):
            trace.append((flushed.clone(), cache.hp[flushed].clone()))

        run_scenario(make_fam(), L, T, lp, sched, spec=spec, seed=seed, observer=record)
        traces[lp] = trace
    assert sum(len(f) for f, _ in traces[None]) >= 3, "too few flushes to compare"
    for lp in (torch.bfloat16, torch.float16):
        for s, (a, b) in enumerate(zip(traces[None], traces[lp], strict=True)):
            assert torch.equal(a[0], b[0]), f"step {s}: different rows flushed"
            assert torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8)), (
                f"step {s}: HP differs between LP off and LP {lp}")


def check_perturbed_history_fails(make_fam, *, L: int, T: int) -> None:
    """Corrupting one committed ring record must change the next outputs beyond tolerance,
    so the scenario check cannot pass with a path that ignores the history."""
    gen = torch.Generator().manual_seed(1)
    sched = random_schedule(2, L, T, gen, spec=False, null_rows=0)
    fam = make_fam()

    def corrupt(step: int, cache, _flushed) -> None:
        if step != L // 2:
            return
        for slot in range(1, cache.meta.shape[0]):
            n = int(cache.meta[slot, COMMITTED])
            if 0 < n <= 64:
                row = int(cache.meta[slot, ORIGIN])  # logical entry 0
                for ring in fam.ring_tensors(cache):
                    if ring.dim() == 4:  # per-token vectors (x, B; k, d, v)
                        ring[slot, :, row] = ring[slot, :, row] * 3 + 1

    res = run_scenario(fam, L, T, None, sched, spec=False, observer=corrupt)
    assert max(res.step_errors[L // 2 + 1:]) > 100 * TOL[torch.float32], res.step_errors
