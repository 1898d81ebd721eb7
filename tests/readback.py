"""Which tensor ops of a call would read a device tensor back to the host, recorded on CPU
tensors: on a GPU each one waits for the queued work (a `.item()`, `bool(t)`, `int(t)`, a
boolean-mask selection or assignment, `nonzero`). Used to hold host-decided paths to
reading nothing back, without a GPU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that need a tensor's values on the host.
_READS = {
    "aten._local_scalar_dense.default",
    "aten.nonzero.default",
    "aten.masked_select.default",
}
# Ops that do when one of their index tensors is a boolean mask.
_MASKED = {"aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default"}


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in _READS:
            self.reads.append(name)
        elif name in _MASKED and len(args) > 1:
            indices = args[1] if isinstance(args[1], list | tuple) else [args[1]]
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                self.reads.append(f"{name} (boolean mask)")
        return func(*args, **(kwargs or {}))


def device_readbacks(fn: Callable[[], object]) -> list[str]:
    """The read-back ops `fn()` dispatches, in order (empty: it reads nothing back)."""
    with _Recorder() as rec:
        fn()
    return rec.reads
