"""GPU facts the decode launchers share: the side stream a step's flush runs on beside its
readout (the two touch different rows), and the SM count that sizes persistent grids."""

from __future__ import annotations

import contextlib
import functools

import torch

_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The flush's stream beside the readout's (one per device, made on first use, before
    any CUDA-graph capture: the layers' warm-up runs a decode step first); `beside` orders
    it against the current stream."""
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


@contextlib.contextmanager
def beside(device: torch.device, enabled: bool):
    """A region of launches on the current stream, except those under the context it yields,
    which run on the side stream beside them: on entry the side stream waits for the
    current one, on exit the current one waits for the side stream (CUDA-graph capture
    records both). Not enabled, or not a CUDA device: the yielded context does nothing.

        with beside(device, overlap) as on_side:
            with on_side:
                flush(...)
            readout(...)
    """
    if not enabled or device.type != "cuda":
        yield contextlib.nullcontext()
        return
    current = torch.cuda.current_stream(device)
    side = side_stream(device)
    side.wait_stream(current)
    try:
        yield torch.cuda.stream(side)
    finally:
        current.wait_stream(side)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device."""
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
