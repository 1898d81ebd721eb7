"""kernels/common/streams.py: one side stream per device, the device's SM count."""

from __future__ import annotations

import pytest
import torch

from vllm_replayssm.kernels.common.streams import num_sms, side_stream


@pytest.mark.gpu
def test_one_side_stream_per_device():
    dev = torch.device("cuda", torch.cuda.current_device())
    stream = side_stream(dev)
    assert side_stream(dev) is stream
    assert stream != torch.cuda.current_stream(dev)
    assert num_sms(dev) == num_sms(torch.device("cuda")) > 0
