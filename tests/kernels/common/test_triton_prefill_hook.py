"""kernels/common/triton_prefill_hook.py: the prefill hook's one launch writes exactly what the
torch form writes (LP <- HP with the same cast and fp16 saturation, the reset cursor words),
skips NULL rows, leaves every other slot's bytes alone, and hands layouts it cannot copy
in one element order back to the torch form."""

import pytest
import torch

from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.kernels.common.triton_prefill_hook import prefill_hook_triton, same_slot_order

SLOTS = 7
L = 16


def _pages(device, lp_dtype, shape=(3, 8, 16), transposed=False, seed=0):
    """HP [SLOTS, *shape] fp32 with values past fp16's range, LP (lp_dtype or None) and meta
    holding other bytes; `transposed`: both as views with their last two dims swapped (the
    order the CPU platform's GDN pages use)."""
    gen = torch.Generator().manual_seed(seed)
    hp = torch.randn(SLOTS, *shape, generator=gen) * 3e4
    lp = None if lp_dtype is None else torch.randn(SLOTS, *shape, generator=gen).to(lp_dtype)
    meta = torch.randint(-5, 50, (SLOTS, 8), generator=gen, dtype=torch.int32)
    hp, meta = hp.to(device), meta.to(device)
    lp = None if lp is None else lp.to(device)
    if transposed:
        hp = hp.transpose(-1, -2).contiguous().transpose(-1, -2)
        lp = None if lp is None else lp.transpose(-1, -2).contiguous().transpose(-1, -2)
    return hp, lp, meta


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).cpu()


def _lp_is_cast_of(lp: torch.Tensor, ref_lp: torch.Tensor, hp: torch.Tensor) -> bool:
    """lp holds the torch form's LP (ref_lp) bit for bit; under the Triton interpreter a bf16
    element may instead hold HP's truncation (the interpreter casts fp32 to bf16 by dropping
    the low half, the GPU rounds to nearest even as torch does)."""
    ours, ref = lp.contiguous().cpu().view(torch.int16), ref_lp.contiguous().cpu().view(torch.int16)
    if lp.is_cuda or lp.dtype != torch.bfloat16:
        return torch.equal(ours, ref)
    truncated = (hp.contiguous().cpu().view(torch.int32) >> 16).to(torch.int16)
    return bool(((ours == ref) | (ours == truncated)).all())


@pytest.mark.parametrize("transposed", [False, True], ids=["slot_major", "transposed"])
@pytest.mark.parametrize("stagger", [True, False], ids=["stagger", "no_stagger"])
@pytest.mark.parametrize("lp_dtype", [torch.bfloat16, torch.float16, None], ids=str)
def test_matches_torch_form(device, lp_dtype, stagger, transposed):
    window = 4
    # NULL rows among the slots (CUDA-graph padding), slot 6 last so that the stagger phase
    # differs from the slot order.
    slots = torch.tensor([3, 0, 1, 6, 0], dtype=torch.int32, device=device)
    ours = _pages(device, lp_dtype, transposed=transposed)
    ref = [None if t is None else t.clone() for t in ours]
    args = dict(buffer_len=L, window=window, stagger=stagger)
    assert prefill_hook_triton(*ours, slots, **args)
    ref_hp, ref_lp, ref_meta = ref
    ref_slots = slots.cpu()
    torch_form = [None if t is None else t.cpu() for t in ref]
    # The torch form on the host (it reads the mask back there anyway).
    apply_prefill_hook(*torch_form, ref_slots, **args)
    hp, lp, meta = ours
    assert torch.equal(_bits(hp), _bits(ref_hp)), "HP is only read"
    assert torch.equal(meta.cpu(), torch_form[2])
    if lp_dtype is not None:
        listed = [3, 1, 6]
        assert _lp_is_cast_of(lp[listed], torch_form[1][listed], ref_hp[listed])
        if lp_dtype == torch.float16:
            assert lp.float().abs().max() <= torch.finfo(torch.float16).max
    for s in (0, 2, 4, 5):  # NULL and unlisted slots keep their bytes
        assert torch.equal(_bits(meta[s]), _bits(ref_meta[s]))
        if lp_dtype is not None:
            assert torch.equal(_bits(lp[s]), _bits(ref_lp[s]))


def test_long_slots_loop_over_shares(device):
    """A slot larger than SPLIT x BLOCK elements: each program loops over several blocks."""
    hp, lp, meta = _pages(device, torch.bfloat16, shape=(4, 64, 160), seed=2)
    slots = torch.tensor([5, 2], dtype=torch.int64, device=device)
    assert prefill_hook_triton(hp, lp, meta, slots, buffer_len=L, window=1, stagger=False)
    for s in (5, 2):
        assert _lp_is_cast_of(lp[s], hp[s].to(torch.bfloat16), hp[s])


def test_mixed_layouts_go_back_to_the_torch_form(device):
    hp, lp, meta = _pages(device, torch.bfloat16)
    lp_t = lp.transpose(-1, -2).contiguous().transpose(-1, -2)  # LP alone transposed
    assert same_slot_order(hp, lp_t) is None
    before = _bits(lp_t)
    slots = torch.tensor([1], dtype=torch.int32, device=device)
    assert not prefill_hook_triton(hp, lp_t, meta, slots, buffer_len=L, window=1, stagger=False)
    assert torch.equal(_bits(lp_t), before), "nothing written when refused"


def test_strided_slots_and_block_tables(device):
    """A strided slot column is read as its values (made contiguous); a 2-D block table goes
    back to the torch form, which takes every entry."""
    hp, lp, meta = _pages(device, torch.bfloat16, seed=3)
    table = torch.tensor([[4, 0], [2, 0]], dtype=torch.int32, device=device)
    assert prefill_hook_triton(hp, lp, meta, table[:, 0], buffer_len=L, window=1, stagger=False)
    for s in (4, 2):
        assert _lp_is_cast_of(lp[s], hp[s].to(torch.bfloat16), hp[s])
    assert not prefill_hook_triton(hp, lp, meta, table, buffer_len=L, window=1, stagger=False)
