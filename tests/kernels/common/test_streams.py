"""kernels/common/streams.py: one side stream per device, the fork and join around a flush
beside its readout, the device's SM count."""

from __future__ import annotations

import contextlib

import pytest
import torch

from vllm_replayssm.kernels.common.streams import beside, num_sms, side_stream


def test_beside_off_or_on_cpu_runs_on_the_current_stream():
    for device, enabled in ((torch.device("cpu"), True), (torch.device("cuda", 0), False)):
        with beside(device, enabled) as on_side:  # nothing touches CUDA here
            assert isinstance(on_side, contextlib.nullcontext)


@pytest.mark.gpu
def test_one_side_stream_per_device():
    dev = torch.device("cuda", torch.cuda.current_device())
    stream = side_stream(dev)
    assert side_stream(dev) is stream
    assert stream != torch.cuda.current_stream(dev)
    assert num_sms(dev) == num_sms(torch.device("cuda")) > 0


@pytest.mark.gpu
def test_beside_orders_the_side_stream_between_the_current_streams_work():
    dev = torch.device("cuda", torch.cuda.current_device())
    a = torch.zeros(1 << 20, device=dev)
    a += 1  # before the fork: the side stream sees it
    with beside(dev, True) as on_side:
        with on_side:
            assert torch.cuda.current_stream(dev) == side_stream(dev)
            torch.cuda._sleep(10_000_000)  # a long kernel on the side stream
            b = a * 2
        assert torch.cuda.current_stream(dev) != side_stream(dev)
    c = b + 1  # after the join: waits for the side stream's work
    torch.cuda.synchronize()
    assert bool((c == 3).all())
