"""ReplaySSM on vLLM's `/metrics` (Prometheus).

API-server process (the `vllm-replayssm` launcher):

    replayssm_info{enabled, buffer_len, lp_dtype, hp_dtype, gdn_flush, gdn_d_dtype, stagger,
                   route, version} 1

Worker processes (where the layers run), per SSM family (`mamba2`, `gdn`), summed over the
layers and tensor-parallel ranks of the server:

    replayssm_decode_rows_total           decode rows stepped (one per layer and request)
    replayssm_flushes_total               of those, rows that folded their ring into the
                                          checkpoint (wrote HP and LP)
    replayssm_ring_records_total          ring records held after each row's step; divided
                                          by replayssm_decode_rows_total: the mean ring
                                          occupancy in records
    replayssm_spec_committed_total        speculative steps: window records committed by
                                          the next step's acceptance
    replayssm_spec_rejected_total         ... and rolled back (overwritten later)
    replayssm_stock_route_rows_total      of the decode rows, those the stock route stepped
                                          (HP read and written, no records); the rest
                                          replayed. `route: auto` picks by batch size
    replayssm_ring_occupancy              gauge: mean fraction of the ring in use over the
                                          last export interval

The layers add to a small device tensor with graph-safe torch ops (no host synchronisation;
the counts come from the cursor words before and after the step); a daemon thread in each
worker copies the totals every EXPORT_INTERVAL_S seconds into prometheus_client metrics. The
launcher points PROMETHEUS_MULTIPROC_DIR at a fresh directory before vLLM is imported, so
that vLLM's `/metrics` (which then uses prometheus_client's multiprocess collector) serves the
workers' metrics with its own. With plain `vllm serve` and no PROMETHEUS_MULTIPROC_DIR, the
worker metrics stay in the workers and only vLLM's own are served. On GPUs the layers count
only with REPLAYSSM_GPU_COUNTERS=1 (see GPU_COUNTERS).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from vllm_replayssm.kernels.common.cursor import COMMITTED, PENDING
from vllm_replayssm.layout import NULL_BLOCK_ID

INFO_METRIC = "replayssm_info"
EXPORT_INTERVAL_S = 1.0
# On GPUs the counting ops run inside the decode CUDA graphs; they have not been run on a
# GPU yet, so they stay off there unless REPLAYSSM_GPU_COUNTERS=1.
GPU_COUNTERS = os.environ.get("REPLAYSSM_GPU_COUNTERS", "0") == "1"
# Columns of a layer's counter tensor; the metric name is replayssm_<field>_total.
FIELDS = (
    "decode_rows",
    "flushes",
    "ring_records",
    "spec_committed",
    "spec_rejected",
    "stock_route_rows",
)
_gauge: Any = None
_counters: weakref.WeakSet = weakref.WeakSet()
_exporter: threading.Thread | None = None
_lock = threading.Lock()


def enable_multiprocess_metrics() -> str:
    """Point PROMETHEUS_MULTIPROC_DIR at a fresh directory (removed at exit) unless it is set;
    must run before prometheus_client is imported. Returns the directory."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return os.environ["PROMETHEUS_MULTIPROC_DIR"]
    path = tempfile.mkdtemp(prefix="replayssm-prometheus-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


class StepCounters:
    """One layer's event counts: an int64 [len(FIELDS)] tensor on the layer's device, added
    to inside the decode step (CUDA-graph safe) and read by the exporter thread."""

    def __init__(self, family: str, ring_rows: int) -> None:
        self.family = family
        self.ring_rows = ring_rows
        self.totals: torch.Tensor | None = None
        self.host: torch.Tensor | None = None  # what the exporter reads

    def step(
        self,
        meta: torch.Tensor,
        slots: torch.Tensor,
        run: Callable[[], str],
        accepted: torch.Tensor | None = None,
    ) -> None:
        """Run one decode step `run()` (it returns the route it took, "replay" or "stock")
        and count its events from the cursor words of `slots` before and after (meta:
        [S, META_LEN]; slots: [R], NULL rows not counted; accepted: as in `count`).
        Graph-safe (the route of a captured step is fixed by its batch size); on GPUs the
        step only runs unless GPU_COUNTERS."""
        if meta.is_cuda and not GPU_COUNTERS:
            run()
            return
        before = meta[slots]
        route = run()
        if route not in ("replay", "stock"):
            raise ValueError(f"a decode step returned route {route!r}")
        self.count(before, meta[slots], slots != NULL_BLOCK_ID, accepted, stock=route == "stock")

    def count(
        self,
        before: torch.Tensor,
        after: torch.Tensor,
        active: torch.Tensor,
        accepted: torch.Tensor | None = None,
        *,
        stock: bool = False,
    ) -> None:
        """before/after: [R, META_LEN] int32 cursor words of the step's rows; active: [R]
        bool (False for NULL / padding rows); accepted: [R] the previous step's acceptance
        (drafts + 1) on speculative steps, None on plain decode (all pending commit); stock:
        the stock route stepped these rows."""
        if self.totals is None or self.totals.device != after.device:
            self.totals = torch.zeros(len(FIELDS), dtype=torch.int64, device=after.device)
            # On GPUs the step copies the totals into pinned host memory (a memcpy node in
            # the CUDA graph), so the exporter thread reads host memory and never issues a
            # CUDA call that could disturb a graph capture on another thread.
            self.host = (
                torch.zeros(len(FIELDS), dtype=torch.int64, pin_memory=True)
                if after.is_cuda
                else self.totals
            )
            _register(self)
        act = active.to(torch.int64)
        b, a = before.to(torch.int64), after.to(torch.int64)
        pending = b[:, PENDING].clamp(min=0)
        committed = (
            pending
            if accepted is None
            else torch.minimum(accepted.to(torch.int64).clamp(min=0), pending)
        )
        # A flush zeroes the committed count of a row that had something to fold; no other
        # step leaves it at zero then (the cursor rule in kernels/common/cursor.py).
        flushed = (a[:, COMMITTED] == 0) & (b[:, COMMITTED].clamp(min=0) + committed > 0)
        records = (a[:, COMMITTED] + a[:, PENDING]) * act
        spec = 0 if accepted is None else 1
        self.totals += torch.stack(
            [
                act.sum(),
                (flushed.to(torch.int64) * act).sum(),
                records.sum(),
                (committed * act).sum() * spec,
                ((pending - committed) * act).sum() * spec,
                act.sum() * int(stock),
            ]
        )
        if self.host is not self.totals:
            self.host.copy_(self.totals, non_blocking=True)


def _register(counters: StepCounters) -> None:
    global _exporter
    with _lock:
        _counters.add(counters)
        if _exporter is None:
            _exporter = threading.Thread(target=_export_loop, name="replayssm-metrics", daemon=True)
            _exporter.start()


def _read_totals() -> dict[str, tuple[list[int], int]]:
    """Per family: (FIELDS summed over its layers, ring rows C of one layer) now."""
    out: dict[str, tuple[list[int], int]] = {}
    with _lock:
        layers = [c for c in _counters if c.host is not None]
    for c in layers:
        host = c.host.clone()  # host memory only: no CUDA call from this thread
        vals, rows = out.get(c.family, ([0] * len(FIELDS), 0))
        out[c.family] = (
            [v + int(x) for v, x in zip(vals, host.tolist(), strict=True)],
            max(rows, c.ring_rows),
        )
    return out


def _export_loop() -> None:
    import time

    from prometheus_client import Counter, Gauge

    counters = {f: Counter(f"replayssm_{f}", _HELP[f], labelnames=["family"]) for f in FIELDS}
    occupancy = Gauge(
        "replayssm_ring_occupancy",
        "mean fraction of the ring in use over the last export interval",
        labelnames=["family"],
        multiprocess_mode="mostrecent",
    )
    last: dict[str, list[int]] = {}
    while True:
        time.sleep(EXPORT_INTERVAL_S)
        try:
            totals = _read_totals()
        except Exception:  # a worker shutting down: stop exporting, never disturb it
            return
        for family, (vals, ring_rows) in totals.items():
            prev = last.get(family, [0] * len(FIELDS))
            delta = [max(v - p, 0) for v, p in zip(vals, prev, strict=True)]
            for f, d in zip(FIELDS, delta, strict=True):  # every field, zeros included
                counters[f].labels(family=family).inc(d)
            rows = delta[FIELDS.index("decode_rows")]
            if rows:
                occupancy.labels(family=family).set(
                    delta[FIELDS.index("ring_records")] / rows / max(ring_rows, 1)
                )
            last[family] = vals


_HELP = {
    "decode_rows": "decode rows stepped by ReplaySSM layers (one per layer and request)",
    "flushes": "decode rows that folded their ring into the checkpoint (HP and LP written)",
    "ring_records": "ring records held after each decode row's step (divide by "
    "replayssm_decode_rows_total for the mean occupancy in records)",
    "spec_committed": "speculative window records committed by acceptance",
    "spec_rejected": "speculative window records rolled back (rejected drafts)",
    "stock_route_rows": "decode rows stepped by the stock route (HP read and written, no "
    "records); the other decode rows replayed",
}


def export_info(replay: dict[str, Any], version: str) -> None:
    """Set `replayssm_info` (value 1) from a validated replayssm config dict
    (`ReplayConfig.as_dict()`); calling again replaces the labels."""
    global _gauge
    from prometheus_client import Gauge

    labels = {k: _label(v) for k, v in sorted(replay.items()) if k != "debug_checks"}
    labels["version"] = version
    if _gauge is None:
        _gauge = Gauge(
            INFO_METRIC,
            "ReplaySSM configuration of this server (value is 1)",
            labelnames=sorted(labels),
            multiprocess_mode="max",
        )
    _gauge.clear()
    _gauge.labels(**labels).set(1)


def _label(value: Any) -> str:
    if value is None:  # a setting left to the model (buffer_len of a hub model)
        return "default"
    return str(value).lower() if isinstance(value, bool) else str(value)
