"""kernels/common/triton_fresh.py's host checks: the slot-density test on sizes and strides
against torch's own answer (the kernels are tested with the layers' step start,
tests/layers/test_spec.py, and the fresh-row reset, tests/layers/test_fresh.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from vllm_replayssm.kernels.common.triton_fresh import is_dense, slot_is_dense, slot_zero_args


def _views():
    """Views of a few shapes: permuted, sliced, with size-1 and empty dims."""
    base = torch.zeros(5, 4, 3, 2)
    for perm in itertools.permutations(range(4)):
        t = base.permute(perm)
        yield t
        yield t[:, :1]
        yield t[1:3]
        yield t[:, ::2]
        yield t[..., :1]
        yield t[:, :0]
    yield torch.zeros(7)
    yield torch.zeros(7)[::2]
    yield torch.zeros(3, 1, 4).expand(3, 5, 4)


def test_is_dense_is_torchs_is_contiguous():
    for t in _views():
        assert is_dense(tuple(t.shape), t.stride()) == t.is_contiguous(), (t.shape, t.stride())


def test_slot_is_dense_is_torchs_answer_for_a_slot_or_its_transpose():
    for t in _views():
        want = t[0].is_contiguous() or (t.dim() >= 3 and t.transpose(-1, -2)[0].is_contiguous())
        assert slot_is_dense(tuple(t.shape), t.stride()) == want, (t.shape, t.stride())


def test_slot_zero_args():
    hp = torch.zeros(4, 2, 3)
    conv = torch.zeros(4, 5, 6).transpose(1, 2)  # dim-first conv state: dense per slot
    padded, strides, numels = slot_zero_args([hp, conv])
    assert padded == [hp, conv, hp] and strides == (6, 30, 6) and numels == (6, 30, 6)
    with pytest.raises(ValueError, match="not contiguous"):
        slot_zero_args([hp[:, :, :2]])
    with pytest.raises(ValueError, match="1 to 3 tensors"):
        slot_zero_args([hp] * 4)
