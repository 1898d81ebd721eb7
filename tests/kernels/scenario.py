"""Multi-step decode scenarios checked against the float64 oracle.

A scenario is a list of steps; each step is a batch (request ids in batch order, NULL rows
as -1), the tokens each request decodes (q <= T) and the acceptance of its previous window.
The runner drives a family's decode op over a paged cache and, for every request, replays
the same tokens through the naive recurrence: commit the accepted prefix of the previous
window, then read out the new window. Requests that appear for the first time are
prefilled (HP written, prefill hook); requests that come back after missing steps are
re-prefilled with their committed state, as vLLM's preemption recompute does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vllm_replayssm.kernels.common.cursor import META_LEN, plan_step
from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook

from .families import cat_tokens, index_tokens

NULL = -1


@dataclass
class Step:
    order: list[int]  # request ids in batch order; NULL = a padded row
    q: dict[int, int]  # tokens of each request this step (1..T)
    acc: dict[int, int] = field(default_factory=dict)  # accepted count of its previous window


def random_schedule(
    num_requests: int,
    num_steps: int,
    T: int,
    gen: torch.Generator,
    *,
    spec: bool,
    null_rows: int = 1,
    churn: bool = False,
) -> list[Step]:
    """Random batches: permuted rows, NULL rows, random q and acceptance in spec mode, and
    with churn, requests that leave early, arrive late or skip steps (preemption)."""

    def rint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    first = [0 if not churn or r % 3 else rint(0, num_steps // 2) for r in range(num_requests)]
    last = [
        num_steps if not churn or r % 4 != 1 else rint(num_steps // 2, num_steps)
        for r in range(num_requests)
    ]
    prev_q: dict[int, int] = {}
    steps = []
    for s in range(num_steps):
        live = [r for r in range(num_requests) if first[r] <= s < last[r]]
        if churn:
            live = [r for r in live if s == first[r] or rint(0, 9) > 0]  # ~10% skip a step
        order = live + [NULL] * null_rows
        perm = torch.randperm(len(order), generator=gen).tolist()
        order = [order[i] for i in perm]
        q = {r: (rint(1, T) if spec else 1) for r in live}
        acc = {r: (rint(1, prev_q[r]) if spec else prev_q[r]) for r in live if r in prev_q}
        for r in live:
            prev_q[r] = q[r]
        steps.append(Step(order, q, acc))
    return steps


@dataclass
class ScenarioResult:
    step_errors: list[float]  # max over requests of ||y - y_ref|| / ||y_ref|| per step
    state_errors: dict[int, float]  # materialised HP vs the oracle's committed state
    flushes: int
    steps: int


def _ntok(tok: dict[str, torch.Tensor]) -> int:
    return next(iter(tok.values())).shape[0]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run_scenario(
    fam,
    L: int,
    T: int,
    lp: torch.dtype | None,
    schedule: list[Step],
    *,
    spec: bool,
    stagger: bool = True,
    seed: int = 0,
    check_untouched: bool = False,
    num_slots: int | None = None,
    observer=None,
) -> ScenarioResult:
    """Run `schedule`; `observer(step_index, cache, plan_flush_slots)` sees the cache after
    every step (e.g. to record HP)."""
    gen = torch.Generator().manual_seed(seed)
    dev = fam.device
    requests = sorted({r for st in schedule for r in st.order if r != NULL})
    n_slots = num_slots or (2 * len(requests) + 3)
    cache = fam.cache(fam.specs(L, T, lp), n_slots)
    perm = (torch.randperm(n_slots - 1, generator=gen) + 1).tolist()  # slot 0 is NULL
    slot = {r: perm[i] for i, r in enumerate(requests)}
    committed: dict[int, torch.Tensor] = {}  # float64 committed state per request
    pending: dict[int, dict[str, torch.Tensor]] = {}  # last window's tokens per request
    last_seen: dict[int, int] = {}
    step_errors: list[float] = []
    flushes = 0

    def prefill(r: int, state64: torch.Tensor) -> None:
        s = torch.tensor([slot[r]], device=dev)
        cache.hp[s] = state64.to(torch.float32).to(dev)[None]
        apply_prefill_hook(
            cache.hp, cache.lp, cache.meta, s, buffer_len=L, window=T, stagger=stagger
        )

    for si, st in enumerate(schedule):
        for r in st.order:
            if r == NULL:
                continue
            if r not in committed:
                committed[r] = fam.initial_state(gen).double()
                prefill(r, committed[r])
            elif last_seen.get(r) != si - 1:  # came back: recompute-prefill of its prefix
                a = st.acc.get(r, _ntok(pending[r]))
                committed[r] = fam.naive(committed[r], index_tokens(pending[r], slice(0, a)))[1]
                pending.pop(r)
                prefill(r, committed[r])
            last_seen[r] = si
        qs = [1 if r == NULL else st.q[r] for r in st.order]
        toks = [fam.tokens(q, gen) for q in qs]
        batch = cat_tokens(toks)
        state_indices = torch.tensor(
            [0 if r == NULL else slot[r] for r in st.order], dtype=torch.int32, device=dev
        )
        qsl = None
        acc = None
        if spec:
            qsl = torch.tensor(
                [0, *torch.tensor(qs).cumsum(0).tolist()], dtype=torch.int32, device=dev
            )
            acc = torch.tensor(
                [st.acc.get(r, 1) if r != NULL else 1 for r in st.order],
                dtype=torch.int32,
                device=dev,
            )
        live = [i for i, r in enumerate(st.order) if r != NULL]
        live_slots = state_indices[live].long()
        plan = plan_step(
            cache.meta[live_slots],
            torch.tensor([qs[i] for i in live]),
            None if acc is None else acc[live],
            L,
            T,
        )
        flushes += int(plan.flush.sum())
        before = _snapshot(cache) if check_untouched else None
        out = torch.full(fam.out_shape(sum(qs)), float("nan"), dtype=torch.float32, device=dev)
        fam.decode(cache, batch, state_indices, out, L, T, qsl, acc)
        starts = [0, *torch.tensor(qs).cumsum(0).tolist()]
        worst = 0.0
        for i, r in enumerate(st.order):
            y = out[starts[i] : starts[i + 1]]
            if r == NULL:
                assert torch.equal(y, torch.zeros_like(y)), "NULL row output not zeroed"
                continue
            if r in pending:
                a = st.acc[r] if spec else _ntok(pending[r])
                committed[r] = fam.naive(committed[r], index_tokens(pending[r], slice(0, a)))[1]
            y_ref, _ = fam.naive(committed[r], toks[i])
            assert not torch.isnan(y).any(), f"step {si}: unwritten or NaN output"
            worst = max(worst, _rel(y, y_ref))
            pending[r] = toks[i]
        step_errors.append(worst)
        if observer is not None:
            observer(si, cache, live_slots[plan.flush])
        if before is not None:
            _check_untouched(fam, cache, before, live_slots, plan, T)

    # Materialise every request still running and compare HP with the committed state.
    state_errors = {}
    final = [r for r in requests if last_seen.get(r) == len(schedule) - 1]
    if final:
        accs = []
        for r in final:
            n = _ntok(pending[r])
            a = int(torch.randint(1, n + 1, (1,), generator=gen)) if spec else n
            committed[r] = fam.naive(committed[r], index_tokens(pending[r], slice(0, a)))[1]
            accs.append(a)
        idx = torch.tensor([slot[r] for r in final], dtype=torch.int32, device=dev)
        fam.materialise(
            cache,
            idx,
            L,
            T,
            stagger,
            torch.tensor(accs, dtype=torch.int32, device=dev) if spec else None,
        )
        for r in final:
            state_errors[r] = _rel(cache.hp[slot[r]], committed[r])
            if cache.lp is not None:
                assert torch.equal(cache.lp[slot[r]], cache.hp[slot[r]].to(cache.lp.dtype))
    return ScenarioResult(step_errors, state_errors, flushes, len(schedule))


def _snapshot(cache) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in cache._asdict().items() if v is not None}


def _check_untouched(fam, cache, before, live_slots, plan, T) -> None:
    """Slots outside the batch are untouched; non-flush rows keep HP/LP; ring rows outside
    the window are untouched."""
    n_slots = cache.hp.shape[0]
    others = torch.ones(n_slots, dtype=torch.bool, device=cache.hp.device)
    others[live_slots] = False
    others[0] = False  # NULL block: never read, never written (checked below too)
    for name, old in before.items():
        new = getattr(cache, name)
        assert torch.equal(new[others].view(torch.uint8), old[others].view(torch.uint8)), (
            f"{name} of a slot outside the batch changed"
        )
        assert torch.equal(new[0].view(torch.uint8), old[0].view(torch.uint8)), (
            f"{name} of the NULL block changed"
        )
    keep = live_slots[~plan.flush]
    for name in ("hp", "lp"):
        if name in before:
            assert torch.equal(
                getattr(cache, name)[keep].view(torch.uint8), before[name][keep].view(torch.uint8)
            ), f"{name} of a non-flush row"
    C = fam.ring_tensors(cache)[0].shape[2]
    for ri, s in enumerate(live_slots.tolist()):
        first = int(plan.origin[ri] + plan.committed[ri])
        win = {(first + i) % C for i in range(int(plan.pending[ri]))}
        outside = [c for c in range(C) if c not in win]
        for ring_t in fam.ring_tensors(cache):
            name = next(k for k, v in cache._asdict().items() if v is ring_t)
            assert torch.equal(
                ring_t[s][:, outside].view(torch.uint8),
                before[name][s][:, outside].view(torch.uint8),
            ), f"{name}: a ring row outside the window changed"
    assert cache.meta.shape[1] == META_LEN
