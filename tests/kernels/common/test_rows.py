"""Per-row index arguments must be contiguous (vllm_replayssm/kernels/common/rows.py): the
guard itself, and the fresh-row reset launch refusing a strided slot column."""

import pytest
import torch

from vllm_replayssm.kernels.common.rows import require_row_contiguous


def test_guard():
    table = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    require_row_contiguous(a=table[:, 0].contiguous(), b=table[:1, 0], c=None, d=table[0])
    with pytest.raises(ValueError, match="a: stride 4"):
        require_row_contiguous(a=table[:, 0])


def test_fresh_reset_refuses_strided_slots(device):
    from vllm_replayssm.kernels.common.triton_fresh import reset_fresh_rows

    hp = torch.ones(6, 2, 8, device=device)
    meta = torch.zeros(6, 8, dtype=torch.int32, device=device)
    slots = torch.tensor([1, 2, 3], device=device)[:, None].repeat(1, 4)[:, 0]
    seq_lens = torch.ones(3, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="slots: stride 4"):
        reset_fresh_rows([hp], meta, slots, None, seq_lens, buffer_len=4, window=1, stagger=False)
    assert bool((hp == 1).all()), "nothing may be written before the refusal"
