"""The prefill hook (`prefill_hook.apply_prefill_hook`) in one Triton launch (GPUs).

The torch form selects the rows that are not NULL with a boolean mask (a device read-back,
which stalls the host once per SSM layer and prefill step) and copies the checkpoint through
a gathered fp32 temporary, its LP cast and a scatter. Here one launch covers every row: the
programs of a NULL row return at once; those of another row copy their share of the slot's
HP into LP (`triton_checkpoint.store_lp`: the same cast and fp16 saturation) and the row's
first program stores the reset cursor words (`cursor.reset_words`). No host synchronisation
and, for a contiguous slot list, no allocation; HP is read once and LP written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.cursor import stagger_modulus
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS, require_row_contiguous
from vllm_replayssm.kernels.common.triton_checkpoint import store_lp
from vllm_replayssm.kernels.common.triton_cursor import store_reset_words
from vllm_replayssm.layout import NULL_BLOCK_ID, ring_rows

# Programs per row: a row's checkpoint (MiBs) is split over this many programs, each looping
# over its share in BLOCK-element steps.
SPLIT = 16
BLOCK = 2048


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _prefill_hook_kernel(
    hp_ptr,
    lp_ptr,
    meta_ptr,
    slots_ptr,
    stride_hp,
    stride_lp,
    stride_meta_slot,
    stride_meta_word,
    n,
    null_block_id,
    capacity,
    phase_mod,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    SPLIT_: tl.constexpr,
    BLOCK_: tl.constexpr,
):
    row = tl.program_id(0)
    split_id = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if slot == null_block_id:
        return
    if HAS_LP:
        p_hp = hp_ptr + slot * stride_hp
        p_lp = lp_ptr + slot * stride_lp
        offs = tl.arange(0, BLOCK_)
        for start in range(split_id * BLOCK_, n, SPLIT_ * BLOCK_):
            idx = start + offs
            m = idx < n
            store_lp(p_lp + idx, tl.load(p_hp + idx, mask=m, other=0.0), m, LP_IS_FP16)
    if split_id == 0:
        p_meta = meta_ptr + slot * stride_meta_slot
        store_reset_words(p_meta, stride_meta_word, slot, capacity, phase_mod)


def same_slot_order(hp: torch.Tensor, lp: torch.Tensor | None) -> tuple | None:
    """(hp, lp) as views whose per-slot regions are contiguous in the same element order (the
    tensors themselves, or both with their last two dims swapped back), or None where there
    are no such views (then the torch form runs)."""
    pairs = [(hp, lp)]
    if hp.dim() >= 3:
        pairs.append((hp.transpose(-1, -2), None if lp is None else lp.transpose(-1, -2)))
    for h, lo in pairs:
        if h[0].is_contiguous() and (lo is None or (lo[0].is_contiguous() and lo.shape == h.shape)):
            return h, lo
    return None


def prefill_hook_triton(
    hp: torch.Tensor,
    lp: torch.Tensor | None,
    meta: torch.Tensor,
    state_indices: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    stagger: bool,
    null_block_id: int = NULL_BLOCK_ID,
) -> bool:
    """`prefill_hook.apply_prefill_hook` (same arguments and effects) in one launch. Returns
    False, having done nothing, where the slots' HP and LP regions do not share one element
    order (`same_slot_order`) or state_indices is not one slot per row ([R]); the caller then
    runs the torch form."""
    views = same_slot_order(hp, lp)
    if views is None or state_indices.dim() != 1:  # block tables: the torch form takes them
        return False
    hp, lp = views
    R = state_indices.shape[0]
    if R == 0:
        return True
    state_indices = state_indices.contiguous()  # a strided column would be misread
    require_row_contiguous(state_indices=state_indices)
    launch(
        _prefill_hook_kernel,
        (R, SPLIT),
        hp,
        hp if lp is None else lp,
        meta,
        state_indices,
        hp.stride(0),
        (hp if lp is None else lp).stride(0),
        *meta.stride(),
        hp[0].numel(),
        null_block_id,
        ring_rows(buffer_len, window),
        stagger_modulus(buffer_len, window, stagger),
        HAS_LP=lp is not None,
        LP_IS_FP16=lp is not None and lp.dtype == torch.float16,
        SPLIT_=SPLIT,
        BLOCK_=BLOCK,
    )
    return True
