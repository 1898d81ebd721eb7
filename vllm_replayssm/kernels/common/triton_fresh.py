"""Reset the pages of the rows that start a request, inside CUDA graphs: one launch.

`layers/fresh.py` resets a fresh row's page before its step reads it (a row is fresh when
its request has nothing computed before this step: seq_len == q, q > 0, slot not NULL). On
the CPU platform it selects those rows on the host; a captured step cannot (the selection
depends on data), so on GPUs one launch covers every row of the step. Each program decides
its row's freshness from `q` and `seq_lens`; those of rows that are not fresh return at
once, and those of a fresh row zero its slot in each of up to three tensors (HP, LP, conv
state) and, in the row's first program, store the reset cursor words (`cursor.reset_words`:
capacity C - phi, the magic word, the rest zero). Fixed grid, no host synchronisation, no
allocation, no other kernel.
"""

from __future__ import annotations

from math import prod

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.cursor import stagger_modulus
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS, require_row_contiguous
from vllm_replayssm.kernels.common.triton_cursor import store_reset_words
from vllm_replayssm.layout import NULL_BLOCK_ID, ring_rows

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
def is_fresh(slot, q, seq_len, null_block_id):
    """Whether a row is fresh (module docstring): seq_len == q, q > 0, slot not NULL."""
    return (seq_len == q) & (q > 0) & (slot != null_block_id)


@triton.jit
def zero_slot_share(
    a_ptr,
    b_ptr,
    c_ptr,
    slot,
    stride_a,
    stride_b,
    stride_c,
    n_a,
    n_b,
    n_c,
    split_id,
    NUM_TENSORS: tl.constexpr,
    SPLIT_: tl.constexpr,
    BLOCK_: tl.constexpr,
):
    """This program's share (split_id of SPLIT_) of zeroing `slot` in up to three tensors
    (`slot_zero_args`)."""
    _zero_share(a_ptr + slot * stride_a, n_a, split_id, SPLIT_, BLOCK_)
    if NUM_TENSORS > 1:
        _zero_share(b_ptr + slot * stride_b, n_b, split_id, SPLIT_, BLOCK_)
    if NUM_TENSORS > 2:
        _zero_share(c_ptr + slot * stride_c, n_c, split_id, SPLIT_, BLOCK_)


@triton.jit(do_not_specialize_on_alignment=(*ROW_INDEX_ARGS, "q_ptr"))
def _fresh_reset_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    meta_ptr,
    slots_ptr,
    q_ptr,
    seq_lens_ptr,
    stride_a,
    stride_b,
    stride_c,
    stride_meta_slot,
    stride_meta_word,
    n_a,
    n_b,
    n_c,
    null_block_id,
    capacity,
    phase_mod,
    NUM_TENSORS: tl.constexpr,
    HAS_Q: tl.constexpr,
    SPLIT_: tl.constexpr,
    BLOCK_: tl.constexpr,
):
    row = tl.program_id(0)
    split_id = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if HAS_Q:
        q = tl.load(q_ptr + row).to(tl.int64)
    else:  # plain decode: one token per row
        q = tl.full([], 1, tl.int64)
    seq_len = tl.load(seq_lens_ptr + row).to(tl.int64)
    if is_fresh(slot, q, seq_len, null_block_id):
        zero_slot_share(
            a_ptr, b_ptr, c_ptr, slot, stride_a, stride_b, stride_c, n_a, n_b, n_c, split_id,
            NUM_TENSORS, SPLIT_, BLOCK_,
        )  # fmt: skip
        if split_id == 0:
            p_meta = meta_ptr + slot * stride_meta_slot
            store_reset_words(p_meta, stride_meta_word, slot, capacity, phase_mod)


def reset_fresh_rows(
    tensors: list[torch.Tensor],
    meta: torch.Tensor,
    slots: torch.Tensor,
    q: torch.Tensor | None,
    seq_lens: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    stagger: bool,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """Reset the page of every fresh row (module docstring) in one launch.

    tensors: 1 to 3 tensors [S, ...] zeroed per fresh slot, whose per-slot region is
    contiguous memory (a page tensor's view, possibly with its last two dims transposed: HP,
    LP, the conv state); meta: [S, META_LEN] int32 cursor words; slots, q (tokens this
    step; None: one per row, plain decode), seq_lens (request lengths after it): [R] int,
    on the tensors' device.
    """
    padded, strides, numels = slot_zero_args(tensors)
    require_row_contiguous(slots=slots, q=q, seq_lens=seq_lens)
    R = slots.shape[0]
    if R == 0:
        return
    launch(
        _fresh_reset_kernel,
        (R, SPLIT),
        *padded,
        meta,
        slots,
        slots if q is None else q,
        seq_lens,
        *strides,
        *meta.stride(),
        *numels,
        null_block_id,
        ring_rows(buffer_len, window),
        stagger_modulus(buffer_len, window, stagger),
        NUM_TENSORS=len(tensors),
        HAS_Q=q is not None,
        SPLIT_=SPLIT,
        BLOCK_=BLOCK,
    )


def slot_zero_args(tensors: list[torch.Tensor]) -> tuple[list, tuple, tuple]:
    """The tensor arguments of a kernel that zeroes slots of 1 to 3 tensors [S, ...]
    (`zero_slot_share`): three tensors (unused places repeat the first), their slot strides
    and their elements per slot. Each slot's region must be contiguous memory, possibly with
    the tensor's last two dims transposed (ValueError otherwise, or for 0 or > 3 tensors).
    Checked on sizes and strides alone: eager steps call this per layer, and indexing a slot
    to ask torch costs µs per tensor."""
    if not 1 <= len(tensors) <= 3:
        raise ValueError(f"1 to 3 tensors, got {len(tensors)}")
    for t in tensors:
        if not slot_is_dense(t.shape, t.stride()):
            raise ValueError(f"a slot's region of a {tuple(t.shape)} tensor is not contiguous")
    padded = [*tensors] + [tensors[0]] * (3 - len(tensors))
    return padded, tuple(t.stride(0) for t in padded), tuple(prod(t.shape[1:]) for t in padded)


def slot_is_dense(shape: tuple, stride: tuple) -> bool:
    """Whether each slot (index of dim 0) of a tensor of these sizes and strides covers
    contiguous memory, as is or with its last two dims swapped (the zeroing does not care
    about the order inside a slot)."""
    shape, stride = tuple(shape[1:]), tuple(stride[1:])
    if is_dense(shape, stride):
        return True
    if len(shape) < 2:
        return False
    return is_dense(shape[:-2] + shape[:-3:-1], stride[:-2] + stride[:-3:-1])


def is_dense(shape: tuple, stride: tuple) -> bool:
    """torch's `is_contiguous` from sizes and strides: row-major strides, any stride for a
    dim of size 1, and an empty tensor is contiguous."""
    if 0 in shape:
        return True
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True
