"""`kernels/common/args.require_tensors`: the decode launchers' argument checks."""

import pytest
import torch

from vllm_replayssm.kernels.common.args import require_tensors

CPU = torch.device("cpu")


def _want(t: torch.Tensor | None) -> tuple:
    ok = torch.zeros(2, 3)
    return (
        ("ok", ok, (2, 3), torch.float32),
        ("t", t, (4,), torch.int32),
        ("last", ok, (2, 3), None),
    )


@pytest.mark.parametrize(
    "t, match",
    [
        (torch.zeros(5, dtype=torch.int32), r"t: shape \(5,\), expected \(4,\)"),
        (torch.zeros(4), "t: dtype torch.float32, expected torch.int32"),
        (torch.zeros(4, dtype=torch.int32, device="meta"), "t is on meta, x on cpu"),
    ],
    ids=["shape", "dtype", "device"],
)
def test_the_first_misfit_is_named(t, match):
    with pytest.raises(ValueError, match=match):
        require_tensors(_want(t), CPU, "x")


def test_fitting_and_absent_tensors_pass():
    require_tensors(_want(torch.zeros(4, dtype=torch.int32)), CPU, "x")
    require_tensors(_want(None), CPU, "x")  # an absent optional tensor is not checked
    # torch.Size and tuple shapes compare alike; dtype None takes any
    require_tensors(
        (("s", torch.zeros(2, 3, dtype=torch.half), torch.Size([2, 3]), None),), CPU, "x"
    )
