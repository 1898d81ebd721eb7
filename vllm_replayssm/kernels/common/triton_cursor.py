"""The cursor machine in Triton: the kernels' twin of `cursor.plan_step` (same rules).

Every program of a row reads the row's words at its start and derives the same plan; the
words are written back once, by the row's last program to finish (a ticket counter in the
TICKET word, reset with the words). No program reads the words after its ticket, so a row's
programs never need to be co-resident and no second launch is needed. The ticket is a
relaxed atomic: every program's word loads have returned before its ticket issues (all of
its addresses depend on them), and an acq_rel atomic would add a GPU-scope fence to each of
tens of thousands of programs.
"""

import triton
import triton.language as tl

from vllm_replayssm.kernels.common.cursor import (
    CAPACITY,
    COMMITTED,
    FOLD_COUNT,
    FOLD_ORIGIN,
    MAGIC,
    META_MAGIC,
    META_MAGIC_LP_STALE,
    ORIGIN,
    PENDING,
    TICKET,
)
from vllm_replayssm.layout import META_LEN

W_ORIGIN = tl.constexpr(ORIGIN)
W_COMMITTED = tl.constexpr(COMMITTED)
W_PENDING = tl.constexpr(PENDING)
W_CAPACITY = tl.constexpr(CAPACITY)
W_FOLD_ORIGIN = tl.constexpr(FOLD_ORIGIN)
W_FOLD_COUNT = tl.constexpr(FOLD_COUNT)
W_MAGIC = tl.constexpr(MAGIC)
W_TICKET = tl.constexpr(TICKET)
MAGIC_WORD = tl.constexpr(META_MAGIC)
MAGIC_WORD_LP_STALE = tl.constexpr(META_MAGIC_LP_STALE)
META_WORDS = tl.constexpr(META_LEN)


@triton.jit
def row_tokens(qsl_ptr, pid_r, IS_VARLEN: tl.constexpr):
    """(first token, number of tokens) of batch row pid_r."""
    if IS_VARLEN:
        bos = tl.load(qsl_ptr + pid_r).to(tl.int64)
        q = tl.load(qsl_ptr + pid_r + 1).to(tl.int64) - bos
    else:
        bos = pid_r.to(tl.int64)
        q = bos * 0 + 1
    return bos, q


@triton.jit
def load_words(p_meta, stride_word, num_ring_rows, WINDOW: tl.constexpr):
    """The row's cursor words (int64) and whether they satisfy the invariant of cursor.py."""
    o = tl.load(p_meta + W_ORIGIN * stride_word).to(tl.int64)
    n = tl.load(p_meta + W_COMMITTED * stride_word).to(tl.int64)
    p = tl.load(p_meta + W_PENDING * stride_word).to(tl.int64)
    kap = tl.load(p_meta + W_CAPACITY * stride_word).to(tl.int64)
    fo = tl.load(p_meta + W_FOLD_ORIGIN * stride_word).to(tl.int64)
    fn = tl.load(p_meta + W_FOLD_COUNT * stride_word).to(tl.int64)
    magic = tl.load(p_meta + W_MAGIC * stride_word)
    valid = (
        ((magic == MAGIC_WORD) | (magic == MAGIC_WORD_LP_STALE))
        & (o >= 0)
        & (o < num_ring_rows)
        & (n >= 0)
        & (p >= 0)
        & (p <= WINDOW)
        & (kap >= 2 * WINDOW)
        & (kap <= num_ring_rows)
        & (n + p + WINDOW <= kap)
    )
    return o, n, p, kap, fo, fn, magic, valid


@triton.jit
def plan_row(
    p_meta,
    stride_word,
    acc_ptr,
    pid_r,
    q,
    num_ring_rows,
    WINDOW: tl.constexpr,
    HAS_ACC: tl.constexpr,
):
    """Commit and the flush rule for one row (see cursor.py). Returns (origin, committed,
    capacity, fold_origin, fold_count, flush, lp_stale) after commit and flush; lp_stale:
    LP lags HP (a stock-route step) and no flush rewrites it this step."""
    o, n, p, kap, fo, fn, magic, valid = load_words(p_meta, stride_word, num_ring_rows, WINDOW)
    o = tl.where(valid, o, 0)
    n = tl.where(valid, n, 0)
    p = tl.where(valid, p, 0)
    kap = tl.where(valid, kap, num_ring_rows)
    fo = tl.where(valid, fo, 0)
    fn = tl.where(valid, fn, 0)
    if HAS_ACC:
        a = tl.load(acc_ptr + pid_r).to(tl.int64)
        a = tl.minimum(tl.maximum(a, 0), p)
    else:
        a = p
    n = n + a
    flush = n + q + WINDOW > kap
    fo = tl.where(flush, o, fo)
    fn = tl.where(flush, n, fn)
    # Valid words have o < num_ring_rows and n <= capacity <= num_ring_rows: no modulo.
    o_end = o + n
    o = tl.where(flush, tl.where(o_end >= num_ring_rows, o_end - num_ring_rows, o_end), o)
    n = tl.where(flush, 0, n)
    kap = tl.where(flush, num_ring_rows, kap)
    stale = valid & (magic == MAGIC_WORD_LP_STALE) & (flush == 0)
    return o, n, kap, fo, fn, flush, stale


@triton.jit
def finish_row(p_meta, stride_word, num_programs, o, n, q, kap, fo, fn, stale):
    """Take a ticket; the row's last program stores the new words (and a zero ticket)."""
    ticket = tl.atomic_add(p_meta + W_TICKET * stride_word, 1, sem="relaxed")
    if ticket == num_programs - 1:
        tl.store(p_meta + W_ORIGIN * stride_word, o.to(tl.int32))
        tl.store(p_meta + W_COMMITTED * stride_word, n.to(tl.int32))
        tl.store(p_meta + W_PENDING * stride_word, q.to(tl.int32))
        tl.store(p_meta + W_CAPACITY * stride_word, kap.to(tl.int32))
        tl.store(p_meta + W_FOLD_ORIGIN * stride_word, fo.to(tl.int32))
        tl.store(p_meta + W_FOLD_COUNT * stride_word, fn.to(tl.int32))
        tl.store(
            p_meta + W_MAGIC * stride_word,
            tl.where(stale, MAGIC_WORD_LP_STALE, MAGIC_WORD).to(tl.int32),
        )
        tl.store(p_meta + W_TICKET * stride_word, 0)


@triton.jit
def softplus(x):
    """log(1 + e^x), identity above 20 (vLLM's rule). log1p is evaluated as
    u * log(1 + u) / ((1 + u) - 1), accurate to a few ulp where log(1 + u) alone loses
    digits (small dt: log(1 + e^x) has ~1e-4 relative error at softplus = 1e-3)."""
    u = tl.exp(x)
    w = 1.0 + u
    log1p_u = tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))
    return tl.where(x <= 20.0, log1p_u, x)


@triton.jit
def stock_route_row(p_meta, stride_word, slot, num_ring_rows, stagger_mod, WINDOW: tl.constexpr):
    """Cursor of a stock-route step (one token, everything pending committed): returns
    (origin, committed count to fold first, capacity after the reset, reset needed). A row
    already in the stock steady state (empty ring, LP stale, reset words) needs no write."""
    o, n, p, kap, fo, fn, magic, valid = load_words(p_meta, stride_word, num_ring_rows, WINDOW)
    o = tl.where(valid, o, 0)
    n_c = tl.where(valid, n + p, 0)
    kap_reset = num_ring_rows - slot % stagger_mod
    steady = (
        valid
        & (o == 0)
        & (n_c == 0)
        & (kap == kap_reset)
        & (fo == 0)
        & (fn == 0)
        & (magic == MAGIC_WORD_LP_STALE)
    )
    return o, n_c, kap_reset, steady == 0


@triton.jit
def finish_stock_row(p_meta, stride_word, num_programs, kap_reset):
    """Take a ticket; the row's last program stores the reset words with LP marked stale."""
    ticket = tl.atomic_add(p_meta + W_TICKET * stride_word, 1, sem="relaxed")
    if ticket == num_programs - 1:
        tl.store(p_meta + W_ORIGIN * stride_word, 0)
        tl.store(p_meta + W_COMMITTED * stride_word, 0)
        tl.store(p_meta + W_PENDING * stride_word, 0)
        tl.store(p_meta + W_CAPACITY * stride_word, kap_reset.to(tl.int32))
        tl.store(p_meta + W_FOLD_ORIGIN * stride_word, 0)
        tl.store(p_meta + W_FOLD_COUNT * stride_word, 0)
        tl.store(p_meta + W_MAGIC * stride_word, MAGIC_WORD_LP_STALE)
        tl.store(p_meta + W_TICKET * stride_word, 0)


@triton.jit
def store_reset_words(p_meta, stride_word, slot, num_ring_rows, phase_mod):
    """Store a reset page's cursor words (`cursor.reset_words`, LP fresh): capacity C - phi
    with phi = slot mod phase_mod (1 without stagger: phi = 0), the magic word, the rest 0."""
    w = tl.arange(0, META_WORDS)
    phi = slot % phase_mod
    words = tl.where(w == W_CAPACITY, num_ring_rows - phi, tl.where(w == W_MAGIC, MAGIC_WORD, 0))
    tl.store(p_meta + w * stride_word, words.to(tl.int32))
