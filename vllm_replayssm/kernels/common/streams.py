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


# Below this many rows an eager step (not being captured) runs the flush on the current
# stream: its launches are paced by the host (tens of µs each), so the GPU has finished
# the flush of a few rows before the readout is launched, and the stream switch (two
# event waits, a stream context) would only add host time (H100, 2026-12-06:
# benchmarks/kernels/host_decode.py). Captured steps always overlap (free at replay).
EAGER_OVERLAP_MIN_ROWS = 64


@contextlib.contextmanager
def beside(device: torch.device, enabled: bool, rows: int | None = None):
    """A region of launches on the current stream, except those under the context it yields,
    which run on the side stream beside them: on entry the side stream waits for the
    current one, on exit the current one waits for the side stream (CUDA-graph capture
    records both). Not enabled, not a CUDA device, or an eager step of fewer than
    EAGER_OVERLAP_MIN_ROWS `rows` (None: any number): the yielded context does nothing.

        with beside(device, overlap, rows=R) as on_side:
            with on_side:
                flush(...)
            readout(...)
    """
    if (
        not enabled
        or device.type != "cuda"
        or (
            rows is not None
            and rows < EAGER_OVERLAP_MIN_ROWS
            and not torch.cuda.is_current_stream_capturing()
        )
    ):
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
