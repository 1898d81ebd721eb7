"""The dense per-step plan row of the plain-decode launches (both families).

The plan launch writes one row of PLAN_LEN int32 words per batch row; the flush and the
readout launches read it (and the readout stores the new cursor words from it, so every
launch has a single writer of the cursor). Words: the slot (NULL rows: NULL_BLOCK_ID and
nothing else), the history origin and length after commit and flush, the ring row the
current token's records go to, whether the row reads HP this step (flush, or a stale LP)
and whether it flushes, the fold region, then the new cursor words (META_LEN of them).
"""

import triton
import triton.language as tl

from vllm_replayssm.kernels.common.triton_cursor import (
    MAGIC_WORD,
    MAGIC_WORD_LP_STALE,
    W_CAPACITY,
    W_COMMITTED,
    W_FOLD_COUNT,
    W_FOLD_ORIGIN,
    W_MAGIC,
    W_ORIGIN,
    W_PENDING,
    W_TICKET,
)
from vllm_replayssm.layout import META_LEN

PLAN_SLOT, PLAN_ORIGIN, PLAN_COUNT, PLAN_WRITE_ROW, PLAN_READ_HP, PLAN_FLUSH = range(6)
PLAN_FOLD_ORIGIN, PLAN_FOLD_COUNT = 6, 7
PLAN_META = 8  # words PLAN_META .. PLAN_META + META_LEN - 1: the new cursor words
PLAN_LEN = PLAN_META + META_LEN

T_PLAN_SLOT = tl.constexpr(PLAN_SLOT)
T_PLAN_ORIGIN = tl.constexpr(PLAN_ORIGIN)
T_PLAN_COUNT = tl.constexpr(PLAN_COUNT)
T_PLAN_WRITE_ROW = tl.constexpr(PLAN_WRITE_ROW)
T_PLAN_READ_HP = tl.constexpr(PLAN_READ_HP)
T_PLAN_FLUSH = tl.constexpr(PLAN_FLUSH)
T_PLAN_FOLD_ORIGIN = tl.constexpr(PLAN_FOLD_ORIGIN)
T_PLAN_FOLD_COUNT = tl.constexpr(PLAN_FOLD_COUNT)
T_PLAN_META = tl.constexpr(PLAN_META)
T_PLAN_LEN = tl.constexpr(PLAN_LEN)
T_META_LEN = tl.constexpr(META_LEN)


@triton.jit
def store_plan_words(
    p_plan,
    slot32,
    o_next,
    n_next,
    write_row,
    pending,
    kap,
    fo,
    fn,
    flush,
    stale,
    HAS_LP: tl.constexpr,
):
    """A plan launch's dense row for one batch row (one program per row writes it): the
    words above and the new cursor words (`pending` records of this step). Returns whether
    the row reads HP this step (a flush, or a stale LP with an LP copy)."""
    read_hp = flush
    if HAS_LP:  # a stale LP is never read: such rows read HP until their next flush
        read_hp = flush | stale
    tl.store(p_plan + T_PLAN_SLOT, slot32)
    tl.store(p_plan + T_PLAN_ORIGIN, o_next)
    tl.store(p_plan + T_PLAN_COUNT, n_next)
    tl.store(p_plan + T_PLAN_WRITE_ROW, write_row)
    tl.store(p_plan + T_PLAN_READ_HP, read_hp.to(tl.int32))
    tl.store(p_plan + T_PLAN_FLUSH, flush.to(tl.int32))
    tl.store(p_plan + T_PLAN_FOLD_ORIGIN, fo)
    tl.store(p_plan + T_PLAN_FOLD_COUNT, fn)
    p_words = p_plan + T_PLAN_META
    tl.store(p_words + W_ORIGIN, o_next)
    tl.store(p_words + W_COMMITTED, n_next)
    tl.store(p_words + W_PENDING, pending)
    tl.store(p_words + W_CAPACITY, kap)
    tl.store(p_words + W_FOLD_ORIGIN, fo)
    tl.store(p_words + W_FOLD_COUNT, fn)
    tl.store(p_words + W_MAGIC, tl.where(stale, MAGIC_WORD_LP_STALE, MAGIC_WORD))
    tl.store(p_words + W_TICKET, 0)
    return read_hp


@triton.jit
def store_plan_row(
    p_plan,
    slot32,
    o_next,
    n_next,
    write_row,
    pending,
    kap,
    fo,
    fn,
    flush,
    stale,
    hp_rows_ptr,
    hp_count_ptr,
    r,
    HAS_LP: tl.constexpr,
):
    """`store_plan_words`, and r appended to the HP list where the row reads HP."""
    read_hp = store_plan_words(
        p_plan, slot32, o_next, n_next, write_row, pending, kap, fo, fn, flush, stale, HAS_LP
    )
    if read_hp:
        k = tl.atomic_add(hp_count_ptr, 1, sem="relaxed")
        tl.store(hp_rows_ptr + k, r)


@triton.jit
def store_cursor_words(p_plan, meta_ptr, slot32, null_block_id, stride_meta_slot, stride_meta_word):
    """Copy the plan row's new cursor words to the row's slot (not for a NULL row): the
    readout launch's single store of them."""
    if slot32 != null_block_id:
        o_w = tl.arange(0, T_META_LEN)
        words = tl.load(p_plan + T_PLAN_META + o_w)
        tl.store(meta_ptr + slot32.to(tl.int64) * stride_meta_slot + o_w * stride_meta_word, words)
