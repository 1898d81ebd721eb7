"""The commit counts of a speculative step (`layers/spec.SpecWindows.acceptance`) in one
Triton launch on GPUs: per row, the tokens before its window (start = seq_len - q), the
tokens accepted since the previous window's start, the pending count of valid cursor words
(0 for words that break the cursor invariant, as for a freshly reset page) and the committed
count min(accepted, pending). The torch version is ~15 small tensor ops per SSM layer and
step. One program per block of rows; no host synchronisation, fixed grid.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import cdiv
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS, require_row_contiguous
from vllm_replayssm.kernels.common.triton_cursor import load_words

BLOCK_ROWS = 64


@triton.jit(
    do_not_specialize=("num_rows",), do_not_specialize_on_alignment=(*ROW_INDEX_ARGS, "q_ptr")
)
def _acceptance_kernel(
    meta_ptr,
    window_start_ptr,
    slots_ptr,
    q_ptr,
    seq_lens_ptr,
    out_ptr,
    num_rows,
    num_ring_rows,
    stride_start_slot,
    stride_meta_slot,
    stride_meta_word,
    WINDOW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = r < num_rows
    slot = tl.load(slots_ptr + r, mask=m, other=0).to(tl.int64)
    start = tl.load(seq_lens_ptr + r, mask=m, other=0).to(tl.int64) - tl.load(
        q_ptr + r, mask=m, other=0
    ).to(tl.int64)
    window_start = tl.load(window_start_ptr + slot * stride_start_slot, mask=m, other=0)
    accepted = tl.maximum(start - window_start, 0)
    _, _, p, _, _, _, _, valid = load_words(
        meta_ptr + slot * stride_meta_slot, stride_meta_word, num_ring_rows, WINDOW
    )
    pending = tl.where(valid, p, 0)
    tl.store(out_ptr + r, start, mask=m)
    tl.store(out_ptr + num_rows + r, accepted, mask=m)
    tl.store(out_ptr + 2 * num_rows + r, pending, mask=m)
    tl.store(out_ptr + 3 * num_rows + r, tl.minimum(accepted, pending), mask=m)


def spec_acceptance(
    meta: torch.Tensor,
    window_start: torch.Tensor,
    slots: torch.Tensor,
    q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    num_ring_rows: int,
    window: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(start, accepted, pending, committed), [R] int64 each, as `SpecWindows.acceptance`
    computes them. meta: [S, META_LEN] int32; window_start: [S] int64 (any slot stride: a
    view into the pages); slots, q, seq_lens: [R] ints."""
    R = slots.shape[0]
    out = torch.empty(4, R, dtype=torch.int64, device=slots.device)
    if R:
        require_row_contiguous(slots=slots, q=q, seq_lens=seq_lens)
        launch(
            _acceptance_kernel,
            (cdiv(R, BLOCK_ROWS),),
            meta,
            window_start,
            slots,
            q,
            seq_lens,
            out,
            R,
            num_ring_rows,
            window_start.stride(0),
            *meta.stride(),
            WINDOW=window,
            BLOCK=BLOCK_ROWS,
            num_warps=1,
        )
    return out.unbind(0)
