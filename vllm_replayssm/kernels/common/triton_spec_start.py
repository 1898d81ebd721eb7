"""The start of a speculative step's SSM layer in one Triton launch: the fresh-row reset
(`triton_fresh.py`) and the commit counts (`triton_acceptance.py`, storing each page's new
window start), which ran as two launches and three small torch ops (the slots' int64 copy,
q from query_start_loc, the window-start store). An eager step (vLLM runs the SSM layers of
a PIECEWISE CUDA-graph step eagerly) is paced by the host, where each launch costs tens of
µs in every SSM layer (H100: `benchmarks/kernels/host_decode.py`).

Grid (R, SPLIT) as the reset's: every program of a fresh row zeroes its share of the row's
slot in up to three tensors (HP, LP, the conv state); the row's first program also reads
the page's cursor words and window start, stores the new start, the four counts and, for a
fresh row, the reset words. A fresh row has nothing pending (its words are reset), so its
counts are taken from its window start and positions alone, as the two launches gave them.
Fixed grid, no host synchronisation, no allocation but the counts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.cursor import stagger_modulus
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS, require_row_contiguous
from vllm_replayssm.kernels.common.triton_cursor import load_words, store_reset_words
from vllm_replayssm.kernels.common.triton_fresh import (
    BLOCK,
    SPLIT,
    is_fresh,
    slot_zero_args,
    zero_slot_share,
)
from vllm_replayssm.layout import NULL_BLOCK_ID, ring_rows


# num_rows unspecialised: one compile serves every batch size.
@triton.jit(do_not_specialize=("num_rows",), do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _spec_start_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    meta_ptr,
    window_start_ptr,
    slots_ptr,
    qsl_ptr,
    seq_lens_ptr,
    out_ptr,
    num_rows,
    stride_a,
    stride_b,
    stride_c,
    stride_meta_slot,
    stride_meta_word,
    stride_start_slot,
    n_a,
    n_b,
    n_c,
    null_block_id,
    num_ring_rows,
    phase_mod,
    NUM_TENSORS: tl.constexpr,
    WINDOW: tl.constexpr,
    SPLIT_: tl.constexpr,
    BLOCK_: tl.constexpr,
):
    row = tl.program_id(0)
    split_id = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    q = tl.load(qsl_ptr + row + 1).to(tl.int64) - tl.load(qsl_ptr + row).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + row).to(tl.int64)
    fresh = is_fresh(slot, q, seq_len, null_block_id)
    if split_id == 0:
        p_meta = meta_ptr + slot * stride_meta_slot
        _, _, p, _, _, _, _, valid = load_words(p_meta, stride_meta_word, num_ring_rows, WINDOW)
        pending = tl.where(fresh, 0, tl.where(valid, p, 0))
        start = seq_len - q
        p_start = window_start_ptr + slot * stride_start_slot
        accepted = tl.maximum(start - tl.load(p_start), 0)
        tl.store(p_start, start)
        tl.store(out_ptr + row, start)
        tl.store(out_ptr + num_rows + row, accepted)
        tl.store(out_ptr + 2 * num_rows + row, pending)
        tl.store(out_ptr + 3 * num_rows + row, tl.minimum(accepted, pending))
        if fresh:
            store_reset_words(p_meta, stride_meta_word, slot, num_ring_rows, phase_mod)
    if fresh:
        zero_slot_share(
            a_ptr, b_ptr, c_ptr, slot, stride_a, stride_b, stride_c, n_a, n_b, n_c, split_id,
            NUM_TENSORS, SPLIT_, BLOCK_,
        )  # fmt: skip


def spec_step_start(
    tensors: list[torch.Tensor],
    meta: torch.Tensor,
    window_start: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    stagger: bool,
    null_block_id: int = NULL_BLOCK_ID,
    zero_args: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`triton_fresh.reset_fresh_rows` then `triton_acceptance.spec_acceptance` with
    store_start, in one launch (module docstring): the same effects and counts.

    tensors: 1 to 3 tensors [S, ...] zeroed per fresh slot (HP, LP, the conv state; each
    slot's region contiguous, possibly with its last two dims transposed); meta:
    [S, META_LEN] int32 cursor words; window_start: [S] int64 (any slot stride); slots,
    seq_lens (request lengths after the step): [R] int; query_start_loc: [R + 1] int.
    Returns (start, accepted, pending, committed), [R] int64 each. The rows' slots must be
    distinct but for NULL padding rows (whose counts and window start are never read).
    zero_args: `triton_fresh.slot_zero_args(tensors)` where the caller keeps it (None:
    derived here).
    """
    padded, strides, numels = slot_zero_args(tensors) if zero_args is None else zero_args
    require_row_contiguous(slots=slots, query_start_loc=query_start_loc, seq_lens=seq_lens)
    R = slots.shape[0]
    if query_start_loc.shape != (R + 1,):
        raise ValueError(f"query_start_loc {tuple(query_start_loc.shape)} for {R} rows")
    out = torch.empty(4, R, dtype=torch.int64, device=slots.device)
    if R:
        launch(
            _spec_start_kernel,
            (R, SPLIT),
            *padded,
            meta,
            window_start,
            slots,
            query_start_loc,
            seq_lens,
            out,
            R,
            *strides,
            *meta.stride(),
            window_start.stride(0),
            *numels,
            null_block_id,
            ring_rows(buffer_len, window),
            stagger_modulus(buffer_len, window, stagger),
            NUM_TENSORS=len(tensors),
            WINDOW=window,
            SPLIT_=SPLIT,
            BLOCK_=BLOCK,
        )
    return out.unbind(0)
