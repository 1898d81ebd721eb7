"""tests/triton_interpreter.py: a kernel whose @triton.jit helper reaches triton.language
through both its modules (tl.sum's lives in language.core) still computes what torch does,
launch after launch, with overflow checks off and the language patched once per launch;
each launch leaves triton.language as it found it."""

import pytest
import torch
import triton
import triton.language as tl

from .conftest import HAS_CUDA

pytestmark = pytest.mark.skipif(HAS_CUDA, reason="the interpreter's session (CPU)")


@triton.jit
def _row_total(x_ptr, row, N: tl.constexpr):
    return tl.sum(tl.load(x_ptr + row * N + tl.arange(0, N)), axis=0)


@triton.jit
def _kernel(x_ptr, out_ptr, N: tl.constexpr):
    row = tl.program_id(0)
    total = _row_total(x_ptr, row, N) * 2 + _row_total(x_ptr, row, N)
    offs = row * N + tl.arange(0, N)
    tl.store(out_ptr + offs, tl.cumsum(tl.load(x_ptr + offs), axis=0) + total)


def test_helpers_inside_launches_compute_as_torch():
    before = tl.program_id, tl.arange
    for seed in range(3):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(seed))
        out = torch.empty_like(x)
        _kernel[(5,)](x, out, 8)
        torch.testing.assert_close(out, x.cumsum(1) + 3 * x.sum(1, keepdim=True))
        assert (tl.program_id, tl.arange) == before
