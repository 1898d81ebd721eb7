"""The layers' event counters (metrics.StepCounters) against the cursor machine's own
decisions (kernels/common/cursor.plan_step) over random plain and speculative schedules."""

import random

import pytest
import torch

from vllm_replayssm.kernels.common.cursor import plan_step, reset_meta
from vllm_replayssm.metrics import FIELDS, StepCounters


@pytest.mark.parametrize("spec", [False, True])
def test_counters_match_the_cursor_plan(spec):
    rng = random.Random(3)
    L, T, S = 6, 3 if spec else 1, 9
    meta = torch.zeros(S, 8, dtype=torch.int32)
    slots = torch.tensor([2, 5, 7, 0])  # slot 0: the NULL block, an inactive row
    reset_meta(meta, slots[:3], L, T, stagger=True)
    counters = StepCounters("mamba2", L + T)
    want = dict.fromkeys(FIELDS, 0)
    pending = torch.zeros(3, dtype=torch.long)
    for _ in range(60):
        q = torch.tensor([rng.randint(1, T) for _ in range(3)])
        acc = torch.tensor([rng.randint(1, max(int(p), 1)) for p in pending]) if spec else None
        before = meta[slots].clone()
        plan = plan_step(meta[slots[:3]], q, acc, L, T)
        meta[slots[:3]] = plan.meta()
        full_acc = None if acc is None else torch.cat([acc, torch.ones(1, dtype=torch.long)])
        counters.count(before, meta[slots], slots != 0, full_acc)
        committed = pending if acc is None else torch.minimum(acc, pending)
        want["decode_rows"] += 3
        want["flushes"] += int(plan.flush.sum())
        want["ring_records"] += int((plan.committed + plan.pending).sum())
        if spec:
            want["spec_committed"] += int(committed.sum())
            want["spec_rejected"] += int((pending - committed).sum())
        pending = q
    assert dict(zip(FIELDS, counters.totals.tolist(), strict=True)) == want
    assert want["flushes"] > 0 and (not spec or want["spec_rejected"] > 0)


def test_step_counts_the_route_it_took():
    """`step` counts the active rows of a stock-route step in stock_route_rows (the rest of
    decode_rows replayed) and refuses a step that names no route."""
    L, S = 4, 6
    meta = torch.zeros(S, 8, dtype=torch.int32)
    slots = torch.tensor([1, 3, 0])  # slot 0: the NULL block
    reset_meta(meta, slots[:2], L, 1, stagger=True)
    counters = StepCounters("gdn", L + 1)
    counters.step(meta, slots, lambda: "replay")
    counters.step(meta, slots, lambda: "stock")
    counters.step(meta, slots, lambda: "stock")
    got = dict(zip(FIELDS, counters.totals.tolist(), strict=True))
    assert got["decode_rows"] == 6 and got["stock_route_rows"] == 4, got
    with pytest.raises(ValueError, match="returned route None"):
        counters.step(meta, slots, lambda: None)


def test_info_metric_labels_a_buffer_len_left_to_the_model():
    """A hub model's launcher cannot set buffer_len from the family; the label says so."""
    from prometheus_client import REGISTRY, generate_latest

    from vllm_replayssm.config import ReplayConfig
    from vllm_replayssm.metrics import export_info

    export_info(ReplayConfig.from_dict({"enabled": True}).as_dict(), "0.test")
    text = generate_latest(REGISTRY).decode()
    info = [line for line in text.splitlines() if line.startswith("replayssm_info{")]
    assert len(info) == 1 and 'buffer_len="default"' in info[0] and 'enabled="true"' in info[0]
