"""ReplaySSM on vLLM's `/metrics` (Prometheus).

Exported today, by the `vllm-replayssm` launcher in the API-server process (whose default
Prometheus registry vLLM's `/metrics` serves when it runs a single API server):

    replayssm_info{enabled, buffer_len, lp_dtype, hp_dtype, gdn_flush, stagger, route,
                   version} 1

Not exported yet: flush, ring-occupancy and speculative-commit counters. Those events happen
in the engine-core / worker processes (on GPU inside CUDA graphs, with the cursors on the
device), and nothing carries them to the API server today; counting them needs host-visible
counters written by the layers plus a transport (vLLM's multiprocess Prometheus directory, or
a stat-logger plugin fed through the scheduler's stats). With `--api-server-count > 1` vLLM
switches `/metrics` to its multiprocess collector, which does not read this process's
registry, so `replayssm_info` is absent there too.
"""

from __future__ import annotations

from typing import Any

INFO_METRIC = "replayssm_info"
_gauge: Any = None


def export_info(replay: dict[str, Any], version: str) -> None:
    """Set `replayssm_info` (value 1) from a validated replayssm config dict
    (`ReplayConfig.as_dict()`); calling again replaces the labels."""
    global _gauge
    from prometheus_client import Gauge

    labels = {k: _label(v) for k, v in sorted(replay.items()) if k != "debug_checks"}
    labels["version"] = version
    if _gauge is None:
        _gauge = Gauge(INFO_METRIC, "ReplaySSM configuration of this server (value is 1)",
                       labelnames=sorted(labels))
    _gauge.clear()
    _gauge.labels(**labels).set(1)


def _label(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
