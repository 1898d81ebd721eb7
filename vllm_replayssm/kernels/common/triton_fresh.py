"""Zero the per-slot regions of the rows that start a request, inside CUDA graphs.

`layers/fresh.py` resets a fresh row's page before its step reads it. On the CPU platform it
selects those rows on the host; a captured step cannot (the selection depends on data), so
on GPUs one launch covers every row of the step: the programs of rows that are not fresh
return at once, and those of a fresh row zero its slot in each of up to three tensors (HP,
LP, conv state). Fixed grid, no host synchronisation, no allocation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Programs per row: a fresh row's bytes are split over this many programs (each loops over
# its share), so that a step with a fresh row is not one program's serial memset while a
# step without any costs R * SPLIT programs that exit at once.
SPLIT = 8
BLOCK = 1024


@triton.jit
def _zero_share(base, n, split_id, SPLIT_: tl.constexpr, BLOCK_: tl.constexpr):
    offs = tl.arange(0, BLOCK_)
    zero = tl.zeros([BLOCK_], dtype=base.dtype.element_ty)
    for start in range(split_id * BLOCK_, n, SPLIT_ * BLOCK_):
        idx = start + offs
        tl.store(base + idx, zero, mask=idx < n)


@triton.jit
def _zero_fresh_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    slots_ptr,
    fresh_ptr,
    stride_a,
    stride_b,
    stride_c,
    n_a,
    n_b,
    n_c,
    NUM_TENSORS: tl.constexpr,
    SPLIT_: tl.constexpr,
    BLOCK_: tl.constexpr,
):
    row = tl.program_id(0)
    split_id = tl.program_id(1)
    if tl.load(fresh_ptr + row) == 0:
        return
    slot = tl.load(slots_ptr + row).to(tl.int64)
    _zero_share(a_ptr + slot * stride_a, n_a, split_id, SPLIT_, BLOCK_)
    if NUM_TENSORS > 1:
        _zero_share(b_ptr + slot * stride_b, n_b, split_id, SPLIT_, BLOCK_)
    if NUM_TENSORS > 2:
        _zero_share(c_ptr + slot * stride_c, n_c, split_id, SPLIT_, BLOCK_)


def zero_fresh_slots(tensors: list[torch.Tensor], slots: torch.Tensor, fresh: torch.Tensor) -> None:
    """Zero `t[slots[r]]` for every row r with `fresh[r]`, for each t in `tensors`.

    tensors: 1 to 3 tensors [S, ...] whose per-slot region is contiguous memory (a page
    tensor's view, possibly with its last two dims transposed: HP, LP, the conv state);
    slots: [R] int (NULL rows must not be
    fresh); fresh: [R] bool, on the tensors' device.
    """
    if not 1 <= len(tensors) <= 3:
        raise ValueError(f"1 to 3 tensors, got {len(tensors)}")
    tensors = [_slot_contiguous(t) for t in tensors]
    R = slots.shape[0]
    if R == 0:
        return
    padded = list(tensors) + [tensors[0]] * (3 - len(tensors))
    _zero_fresh_kernel[(R, SPLIT)](
        *padded,
        slots,
        fresh.to(torch.int8),
        *(t.stride(0) for t in padded),
        *(t[0].numel() for t in padded),
        NUM_TENSORS=len(tensors),
        SPLIT_=SPLIT,
        BLOCK_=BLOCK,
    )


def _slot_contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t`, or `t` with its last two dims swapped back, whichever has contiguous slots
    (zeroing does not care about the order inside a slot)."""
    if t[0].is_contiguous():
        return t
    if t.dim() >= 3 and t.transpose(-1, -2)[0].is_contiguous():
        return t.transpose(-1, -2)
    raise ValueError(f"a slot's region of a {tuple(t.shape)} tensor is not contiguous")
