"""kernels/common/streams.py: one side stream per device, the fork and join around a flush
beside its readout, the device's SM count."""

from __future__ import annotations

import contextlib

import pytest
import torch

from vllm_replayssm.kernels.common.streams import (
    EAGER_OVERLAP_MIN_ROWS,
    beside,
    num_sms,
    side_stream,
)


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


@pytest.mark.gpu
def test_beside_keeps_small_eager_steps_on_the_current_stream():
    dev = torch.device("cuda", torch.cuda.current_device())
    main = torch.cuda.current_stream(dev)
    for rows in (1, EAGER_OVERLAP_MIN_ROWS - 1):
        with beside(dev, True, rows=rows) as on_side:
            assert isinstance(on_side, contextlib.nullcontext)
    for rows in (EAGER_OVERLAP_MIN_ROWS, None):
        with beside(dev, True, rows=rows) as on_side, on_side:
            assert torch.cuda.current_stream(dev) == side_stream(dev)
    assert torch.cuda.current_stream(dev) == main


@pytest.mark.gpu
def test_beside_overlaps_a_captured_step_of_any_size():
    dev = torch.device("cuda", torch.cuda.current_device())
    a = torch.zeros(1024, device=dev)
    seen = []
    graph = torch.cuda.CUDAGraph()
    side_stream(dev)  # made before the capture, as the layers' warm-up does
    with torch.cuda.graph(graph):
        with beside(dev, True, rows=1) as on_side:
            with on_side:
                seen.append(torch.cuda.current_stream(dev) == side_stream(dev))
                b = a + 1
            c = a + 2
        d = b + c
    graph.replay()
    torch.cuda.synchronize()
    assert seen == [True]
    assert bool((d == 3).all())
