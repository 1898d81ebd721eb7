"""The cursor machine (design §1.4) under random acceptance: invariants, flush cadence,
stagger, and garbage pages."""

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_replayssm.kernels.common.cursor import (
    CAPACITY,
    COMMITTED,
    MAGIC,
    META_LEN,
    PENDING,
    meta_is_valid,
    plan_step,
    reset_meta,
    ring_rows,
)


def _fresh(slots, L, T, stagger=True):
    meta = torch.zeros(max(slots) + 1, META_LEN, dtype=torch.int32)
    reset_meta(meta, torch.tensor(slots), L, T, stagger)
    return meta[torch.tensor(slots)]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), T=st.integers(1, 6), extra=st.integers(0, 20), slot=st.integers(1, 500))
def test_invariants_under_random_acceptance(data, T, extra, slot):
    L = T + extra
    C = ring_rows(L, T)
    meta = _fresh([slot], L, T)
    prev_q = 0
    since_flush = 0
    for _ in range(3 * L + 5):
        q = data.draw(st.integers(1, T))
        a = data.draw(st.integers(1, max(prev_q, 1)))
        plan = plan_step(meta, torch.tensor([q]), torch.tensor([a]), L, T)
        n, o = int(plan.committed[0]), int(plan.origin[0])
        assert bool(plan.valid[0])
        # The window fits and (on a flush) never overlaps the fold region.
        assert n + q <= C
        if bool(plan.flush[0]):
            fo, fn = int(plan.fold_origin[0]), int(plan.fold_count[0])
            fold_rows = {(fo + i) % C for i in range(fn)}
            win_rows = {(o + i) % C for i in range(q)}
            assert not fold_rows & win_rows
            assert fn <= L  # a fold never exceeds L entries
            since_flush = 0
        else:
            since_flush += 1
            # Early flush: a non-flush step leaves room for any next window.
            assert n + q + T <= int(plan.capacity[0])
        meta = plan.meta()
        assert bool(meta_is_valid(meta, L, T)[0])
        prev_q = q
    assert since_flush <= L


def test_plain_decode_flushes_exactly_every_L_steps():
    L, T = 16, 1
    slots = list(range(1, 33))
    meta = _fresh(slots, L, T)
    flush_steps = {s: [] for s in slots}
    for step in range(5 * L):
        plan = plan_step(meta, torch.ones(len(slots)), None, L, T)
        for i, s in enumerate(slots):
            if plan.flush[i]:
                flush_steps[s].append(step)
                assert int(plan.fold_count[i]) == L or len(flush_steps[s]) == 1
        meta = plan.meta()
    for s, st_ in flush_steps.items():
        gaps = {b - a for a, b in itertools.pairwise(st_)}
        assert gaps == {L}, (s, st_)
    # Stagger: 32 slots over L phases flush on every step of a cycle, 2 per step.
    per_step = torch.bincount(torch.tensor([x for v in flush_steps.values() for x in v]))
    assert per_step[L : 4 * L].min() == 2 and per_step[L : 4 * L].max() == 2


def test_without_stagger_all_rows_flush_together():
    L, T = 8, 1
    meta = _fresh([1, 2, 3, 4], L, T, stagger=False)
    for step in range(2 * L + 1):
        plan = plan_step(meta, torch.ones(4), None, L, T)
        assert plan.flush.all() or not plan.flush.any()
        assert bool(plan.flush.any()) == (step in (L, 2 * L))
        meta = plan.meta()


def test_garbage_meta_reads_as_fresh():
    L, T = 8, 2
    gen = torch.Generator().manual_seed(0)
    meta = torch.randint(-(2**31), 2**31 - 1, (64, META_LEN), dtype=torch.int64, generator=gen)
    meta = meta.to(torch.int32)
    assert not meta_is_valid(meta, L, T).any()
    plan = plan_step(meta, torch.full((64,), T), torch.full((64,), 5), L, T)
    assert (plan.committed == 0).all() and (plan.origin == 0).all()
    assert not plan.flush.any() and not plan.valid.any()
    # A magic word alone does not make bad cursors valid.
    meta[:, MAGIC] = int(_fresh([1], L, T)[0, MAGIC])
    meta[:, COMMITTED], meta[:, PENDING], meta[:, CAPACITY] = 100, 0, ring_rows(L, T)
    assert not meta_is_valid(meta, L, T).any()


def test_acceptance_clamped_to_pending():
    L, T = 8, 4
    meta = _fresh([1], L, T)
    meta = plan_step(meta, torch.tensor([3]), torch.tensor([1]), L, T).meta()  # p = 3
    plan = plan_step(meta, torch.tensor([2]), torch.tensor([99]), L, T)
    assert int(plan.committed[0]) == 3
    plan = plan_step(meta, torch.tensor([2]), torch.tensor([-5]), L, T)
    assert int(plan.committed[0]) == 0
