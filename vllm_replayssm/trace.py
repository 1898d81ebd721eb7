"""Step trace for diagnosis, off unless REPLAYSSM_TRACE_STEPS names a file (one per process:
the process id is appended to the name). Each line is a JSON object:
- "build": every metadata build of the ReplaySSM Mamba-2 backend (speculative decoding), i.e.
  every step, CUDA-graph replays included (vLLM builds metadata in Python before it replays
  a graph): the batch as vLLM's metadata describes it;
- "forward": the speculative decode rows of one Mamba-2 layer (the first one traced) in an
  eager forward. A step whose "build" line has decode rows and that has no "forward" line
  replayed a CUDA graph.
Each line synchronises with the GPU: for diagnosis only, never in production runs.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

TRACE_ENV = "REPLAYSSM_TRACE_STEPS"

_state: dict[str, Any] = {"step": 0, "layer": None, "file": None}


def enabled() -> bool:
    return bool(os.environ.get(TRACE_ENV))


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def _write(kind: str, fields: dict[str, Any]) -> None:
    if _state["file"] is None:
        _state["file"] = open(f"{os.environ[TRACE_ENV]}.{os.getpid()}", "a")  # noqa: SIM115
    line = {"kind": kind, "step": _state["step"], **{k: _plain(v) for k, v in fields.items()}}
    _state["file"].write(json.dumps(line) + "\n")
    _state["file"].flush()


def build(builder: int, fields: dict[str, Any]) -> None:
    """One metadata build of builder `builder` (an id; one builder per KV-cache group of
    Mamba-2 layers): starts a new step number. Builds for a CUDA-graph capture are marked,
    without their tensors (no host synchronisation while capturing)."""
    if _state.setdefault("first_builder", builder) == builder:
        _state["step"] += 1  # builders of other groups build the same step after it
    if _capturing():
        _write("build", {"builder": builder, "capturing": True})
        return
    _write("build", {"builder": builder, **fields})


def forward(layer: str, fields: dict[str, Any]) -> None:
    """An eager forward of `layer`; only the first layer that calls this is traced. Skipped
    while a CUDA graph is captured (no host synchronisation allowed there)."""
    if _state["layer"] is None:
        _state["layer"] = layer
    if layer != _state["layer"] or _capturing():
        return
    _write("forward", fields)
