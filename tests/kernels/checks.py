"""Checks shared by both families' reference and kernel tests."""

from __future__ import annotations

import torch

from vllm_replayssm.kernels.common.cursor import COMMITTED, ORIGIN

from .scenario import random_schedule, run_scenario
from .tolerances import TOL, tol_for


def check_scenario(
    fam,
    *,
    L: int,
    T: int,
    lp: torch.dtype | None,
    spec: bool,
    requests: int = 4,
    cycles: int = 3,
    churn: bool = False,
    stagger: bool = True,
    seed: int = 0,
    rounding: torch.dtype | None = None,
    check_untouched: bool = True,
    out_tol: float | None = None,
) -> None:
    """Decode >= `cycles` flush cycles and compare every output and the final state.
    out_tol: a tighter output bound than the table's (None: `tol_for(lp, rounding)`)."""
    gen = torch.Generator().manual_seed(seed)
    steps = cycles * L + L // 2 + 2
    sched = random_schedule(requests, steps, T, gen, spec=spec, churn=churn)
    res = run_scenario(
        fam, L, T, lp, sched, spec=spec, stagger=stagger, seed=seed, check_untouched=check_untouched
    )
    tol = tol_for(lp, rounding)
    if out_tol is not None:
        assert out_tol <= tol, "out_tol may only tighten the table's bound"
        tol = out_tol
    worst = max(res.step_errors)
    assert worst <= tol, f"output error {worst:.3g} > {tol:.3g} (per step: {res.step_errors})"
    assert res.state_errors, "no request ran to the end"
    state_tol = tol_for(rounding)
    for r, e in res.state_errors.items():
        assert e <= state_tol, f"request {r}: materialised HP error {e:.3g} > {state_tol:.3g}"
    if not spec and not churn:
        assert res.flushes >= requests * (cycles - 1), f"only {res.flushes} flushes"
    elif not churn:  # every step commits a token or more: each row passes L at least once
        assert res.flushes >= requests, f"only {res.flushes} flushes"


def check_mixed_routes(
    fam,
    *,
    L: int,
    lp: torch.dtype | None,
    seed: int = 0,
    stock_share: float = 0.4,
    rounding: torch.dtype | None = None,
) -> None:
    """Plain decode where each step takes the stock route (HP read + write, LP marked stale)
    or the replay route at random: every output and the final state against the oracle. A
    replay step that read a stale LP would be off by the whole LP-vs-HP difference."""
    gen = torch.Generator().manual_seed(seed + 1)
    replay = fam.decode
    routes: list[str] = []

    def decode(cache, tok, state_indices, out, L_, T_, qsl=None, acc=None) -> None:
        if float(torch.rand(1, generator=gen)) < stock_share:
            routes.append("stock")
            fam.decode_stock_route(cache, tok, state_indices, out, L_, T_)
        else:
            routes.append("replay")
            replay(cache, tok, state_indices, out, L_, T_, qsl, acc)

    fam.decode = decode
    try:
        check_scenario(
            fam,
            L=L,
            T=1,
            lp=lp,
            spec=False,
            churn=True,
            seed=seed,
            rounding=rounding,
            check_untouched=False,
        )
    finally:
        del fam.decode
    assert {"stock", "replay"} <= set(routes), routes


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
                f"step {s}: HP differs between LP off and LP {lp}"
            )


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
    assert max(res.step_errors[L // 2 + 1 :]) > 100 * TOL[torch.float32], res.step_errors


def out_tolerance(lp: torch.dtype | None, device: str) -> float:
    """Kernel-vs-reference output bound. Triton's interpreter casts fp32 -> bf16 by
    truncation (the GPU rounds to nearest even like torch), so an interpreted bf16 LP may sit
    one ulp (2^-7) away from the reference's: allow the bf16 tolerance there."""
    if lp == torch.bfloat16 and device != "cuda":
        return TOL[torch.bfloat16] / 3
    return 1e-4


def check_kernel_matches_reference(
    make_fam,
    kernel_op,
    *,
    L: int,
    T: int,
    lp: torch.dtype | None,
    requests: int = 4,
    seed: int = 0,
    out_tol: float = 1e-4,
    hp_tol: float = 1e-5,
    stock_route_op=None,
    stock_share: float = 0.0,
) -> None:
    """Run the torch reference and a kernel in lockstep on identical pages and inputs and
    compare everything each step: outputs, cursor words (exact), records copied from the
    inputs (exact), computed records, HP and LP (to rounding). With stock_share > 0 (plain
    decode), a random share of steps takes the stock route on both sides."""
    from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook

    ref, ker = make_fam(None), make_fam(kernel_op)
    if stock_route_op is not None:
        ker.stock_route_op = stock_route_op
    gen = torch.Generator().manual_seed(seed)
    route_gen = torch.Generator().manual_seed(seed + 7)
    spec = T > 1
    steps = 3 * L + 2
    sched = random_schedule(requests, steps, T, gen, spec=spec)
    n_slots = 2 * requests + 2
    specs = ref.specs(L, T, lp)
    caches = [ref.cache(specs, n_slots), ker.cache(specs, n_slots)]
    slots = (torch.randperm(n_slots - 1, generator=gen)[:requests] + 1).tolist()
    init = torch.stack([ref.initial_state(gen) for _ in slots]).to(caches[0].hp.device)
    idx = torch.tensor(slots, device=init.device)
    for cache in caches:
        cache.hp[idx] = init
        apply_prefill_hook(
            cache.hp, cache.lp, cache.meta, idx, buffer_len=L, window=T, stagger=True
        )
    for si, st in enumerate(sched):
        qs = [1 if r < 0 else st.q[r] for r in st.order]
        tok = ref.tokens(sum(qs), gen)
        dev = init.device
        state_indices = torch.tensor(
            [0 if r < 0 else slots[r] for r in st.order], dtype=torch.int32, device=dev
        )
        qsl = acc = None
        if spec:
            qsl = torch.tensor(
                [0, *torch.tensor(qs).cumsum(0).tolist()], dtype=torch.int32, device=dev
            )
            acc = torch.tensor(
                [st.acc.get(r, 1) if r >= 0 else 1 for r in st.order], dtype=torch.int32, device=dev
            )
        stock = not spec and float(torch.rand(1, generator=route_gen)) < stock_share
        outs = []
        for fam, cache in zip((ref, ker), caches, strict=True):
            out = torch.full(fam.out_shape(sum(qs)), float("nan"), device=dev)
            if stock:
                fam.decode_stock_route(cache, tok, state_indices, out, L, T)
            else:
                fam.decode(cache, tok, state_indices, out, L, T, qsl, acc)
            outs.append(out)
        err = float((outs[1] - outs[0]).norm() / outs[0].norm())
        assert err <= out_tol, f"step {si}: kernel vs reference output error {err:.3g}"
        r, k = caches[0]._asdict(), caches[1]._asdict()
        live = idx
        assert torch.equal(r["meta"][live], k["meta"][live]), f"step {si}: cursor words"
        for name in r:
            if name == "meta" or r[name] is None:
                continue
            a, b = r[name][live], k[name][live]
            if name in ref.copied_rings:
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"step {si}: {name}"
            elif name.startswith("ring_"):
                # Computed records: fp32 (dt, g, beta) to a few ulp, act-dtype (d) to 1 ulp
                # (GDN's d: as far as the outputs may differ, since d follows the LP read).
                _assert_close_where_written(a, b, name, si, out_tol)
            else:
                rel = float((a.double() - b.double()).norm() / a.double().norm())
                bound = hp_tol if name == "hp" else TOL[a.dtype] / 4
                assert rel <= bound, f"step {si}: {name} rel error {rel:.3g}"


def _assert_close_where_written(
    a: torch.Tensor, b: torch.Tensor, name: str, step: int, rel: float
) -> None:
    """Ring rows are compared where either path wrote them (rows neither wrote hold the same
    garbage bytes, NaN included): norm-wise, to max(16 ulp, rel)."""
    rows_a = a.reshape(a.shape[0], a.shape[1], a.shape[2], -1)
    rows_b = b.reshape(rows_a.shape)
    same = (rows_a.view(torch.uint8) == rows_b.view(torch.uint8)).all(-1)
    if bool(same.all()):
        return
    x, y = rows_a[~same].double(), rows_b[~same].double()
    tol = max(16 * torch.finfo(a.dtype).eps, rel)
    err = float((x - y).norm() / x.norm())
    assert err <= tol, f"step {step}: {name} differs by {err:.3g} (> {tol:.3g})"
