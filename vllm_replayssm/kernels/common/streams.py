"""GPU facts the decode launchers share: the side stream a step's flush runs on beside its
readout (the two touch different rows), and the SM count that sizes persistent grids."""

from __future__ import annotations

import functools

import torch

_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The flush's stream beside the readout's (one per device, made on first use, before
    any CUDA-graph capture: the layers' warm-up runs a decode step first). The caller
    makes it wait for the current stream before its launch and the current stream wait for
    it after the readout's."""
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device."""
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
