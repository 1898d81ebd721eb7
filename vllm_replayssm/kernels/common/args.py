"""The argument checks the decode launchers share: shapes, dtypes and devices of a step's
tensors, refused by name before anything is launched. Eager steps (a PIECEWISE CUDA-graph
step runs the SSM layers eagerly) check in every layer, so the pass is lean: torch.Size is
compared as it is, and a message is built only for a refusal."""

from __future__ import annotations

import torch


def require_tensors(want: tuple, device: torch.device, anchor: str) -> None:
    """ValueError naming the first entry of `want`, (name, tensor or None, shape, dtype or
    None for any) tuples, whose tensor has another shape, dtype or device than `device`,
    that of the argument named `anchor`. None tensors are skipped."""
    for name, t, shape, dtype in want:
        if t is not None and (
            t.shape != shape or (dtype is not None and t.dtype != dtype) or t.device != device
        ):
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
            if dtype is not None and t.dtype != dtype:
                raise ValueError(f"{name}: dtype {t.dtype}, expected {dtype}")
            raise ValueError(f"{name} is on {t.device}, {anchor} on {device}")
