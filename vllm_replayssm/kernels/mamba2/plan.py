"""Plain-decode plan for Mamba-2 (the first of three launches; `decode.py` runs them).

One program per (group, row) reads the row's cursor words (nobody writes them in this
launch), applies commit and the flush rule (`cursor.plan_step`), and computes what every
head of the group needs from the history, once: the scalars B_j . C of the group and, per
head, the readout coefficients w_j (B_j . C) (flush rows: the fold weights w_j), the output
scale e^{A Λ_m}, the current token's coefficient and the fold decay. It appends the
row-shared records (dt after softplus per head, B per group). The group-0 program writes the
dense plan row and, for rows that must read HP (flush rows, and rows whose LP is stale),
appends the row to the HP list. The new cursor words travel in the plan row and are stored
by the readout launch, so every launch has a single writer of them.

Speculative windows (T = 1 + k tokens per row, q <= T of them live) run the same three
launches specialised for T (`_mamba2_plan_window_kernel` here): the plan commits the
previous step's accepted records, applies the flush rule h + q + T > L + T, and writes per
(row, head) the coefficients of every window token i: its history coefficients
w_l (B_l . C_i), its window coefficients over tokens j <= i (D on the diagonal) and its
output scale e^{A Λ_i}, so that the readout reads the checkpoint tile once for the window.

Scratch (`Mamba2Scratch`) is caller-allocated and sized by the largest batch, so the three
launches are safe in CUDA graphs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import cdiv, next_pow2, pow2_block
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.plan_row import (
    PLAN_LEN,
    T_PLAN_LEN,
    T_PLAN_SLOT,
    store_plan_row,
    store_plan_words,
)
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS
from vllm_replayssm.kernels.common.triton_cursor import (
    plan_row,
    row_tokens,
    softplus,
)


@functools.cache  # pure; the launchers ask several times per launch
def history_block(buffer_len: int) -> int:
    """Coefficient slots per (row, head): a power of two >= L and >= 16 (the fold's dot
    needs an inner dimension of at least 16)."""
    return pow2_block(buffer_len)


@functools.cache
def window_block(window: int) -> int:
    """Token slots of a window (a power of two >= T; 1 for plain decode)."""
    return next_pow2(window)


@functools.cache
def coef_offsets(buffer_len: int, window: int) -> tuple[int, int, int]:
    """Offsets of the window coefficients, the output scales and the fold decay in a
    (row, head) coefficient row; the history coefficients start at 0.

    Per (row, head), BLOCK_T = window_block(T) and BLOCK_L = history_block(L):
    [0, BLOCK_T * BLOCK_L) history coefficients of token i at i * BLOCK_L (flush rows, whose
    history is folded: the fold weights, in every token's row), then [BLOCK_T, BLOCK_T]
    window coefficients (token i, token j), BLOCK_T output scales and the fold decay. For
    plain decode (T = 1) that is [BLOCK_L history, current token, scale, decay]."""
    bt, bl = window_block(window), history_block(buffer_len)
    off_w = bt * bl
    off_s = off_w + bt * bt
    return off_w, off_s, off_s + bt


@functools.cache
def coef_len(buffer_len: int, window: int = 1) -> int:
    """Length of a (row, head) coefficient row (`coef_offsets`), padded to a multiple of
    2 * BLOCK_L."""
    unit = 2 * history_block(buffer_len)
    return unit * cdiv(coef_offsets(buffer_len, window)[2] + 1, unit)


@dataclass
class Mamba2Scratch:
    """Caller-owned scratch of the plain-decode launches, for up to `max_rows` rows.

    plan: [max_rows, PLAN_LEN] int32; coef: [max_rows, H, coef_len(L, T)] fp32;
    hp_rows: [max_rows] int32 (rows that read HP this step, in any order);
    hp_count: [1] int32, the length of hp_rows (`mamba2_plan` zeroes it first).
    """

    plan: torch.Tensor
    coef: torch.Tensor
    hp_rows: torch.Tensor
    hp_count: torch.Tensor

    @classmethod
    def allocate(
        cls,
        max_rows: int,
        nheads: int,
        buffer_len: int,
        device: torch.device | str,
        window: int = 1,
    ) -> Mamba2Scratch:
        """Scratch for up to max_rows rows of windows of up to `window` tokens."""
        return cls(
            plan=torch.zeros(max_rows, PLAN_LEN, dtype=torch.int32, device=device),
            coef=torch.zeros(
                max_rows,
                nheads,
                coef_len(buffer_len, window),
                dtype=torch.float32,
                device=device,
            ),
            hp_rows=torch.zeros(max_rows, dtype=torch.int32, device=device),
            hp_count=torch.zeros(1, dtype=torch.int32, device=device),
        )

    def fits(self, num_rows: int, nheads: int, buffer_len: int, window: int = 1) -> bool:
        return (
            self.plan.shape[0] >= num_rows
            and self.coef.shape[1] == nheads
            and self.coef.shape[2] == coef_len(buffer_len, window)
        )


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _mamba2_plan_kernel(
    meta_ptr,
    ring_dt_ptr,
    ring_B_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    dt_bias_ptr,
    state_indices_ptr,
    plan_ptr,
    coef_ptr,
    hp_rows_ptr,
    hp_count_ptr,
    null_block_id,
    num_ring_rows,
    stride_meta_slot,
    stride_meta_word,
    stride_rdt_slot,
    stride_rdt_head,
    stride_rdt_row,
    stride_rB_slot,
    stride_rB_group,
    stride_rB_row,
    stride_rB_dstate,
    stride_dt_tok,
    stride_dt_head,
    stride_B_tok,
    stride_B_group,
    stride_B_dstate,
    stride_C_tok,
    stride_C_group,
    stride_C_dstate,
    stride_coef_row,
    stride_coef_head,
    HEADS_PER_GROUP: tl.constexpr,
    dstate: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_HG: tl.constexpr,
    BLOCK_L: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_LP: tl.constexpr,
):
    pid_g = tl.program_id(0)
    r = tl.program_id(1)
    p_plan = plan_ptr + r * T_PLAN_LEN
    slot32 = tl.load(state_indices_ptr + r).to(tl.int32)
    if slot32 == null_block_id:
        if pid_g == 0:
            tl.store(p_plan + T_PLAN_SLOT, slot32)
        return
    slot = slot32.to(tl.int64)
    r64 = r.to(tl.int64)

    # Loads that do not depend on the cursor words.
    o_hg = tl.arange(0, BLOCK_HG)
    m_hg = o_hg < HEADS_PER_GROUP
    h = pid_g * HEADS_PER_GROUP + o_hg  # [BLOCK_HG]
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    A = tl.load(A_ptr + h, mask=m_hg, other=0.0).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h, mask=m_hg, other=0.0).to(tl.float32)
    dt_raw = tl.load(dt_ptr + r64 * stride_dt_tok + h * stride_dt_head, mask=m_hg, other=0.0)
    b_cur = tl.load(
        B_ptr + r64 * stride_B_tok + pid_g * stride_B_group + o_n * stride_B_dstate,
        mask=m_n,
        other=0.0,
    )
    c = tl.load(
        C_ptr + r64 * stride_C_tok + pid_g * stride_C_group + o_n * stride_C_dstate,
        mask=m_n,
        other=0.0,
    ).to(tl.float32)
    # Commit (plain decode: everything pending) and the flush rule, q = T = 1.
    o_next, n_next, kap, fo, fn, flush, stale = plan_row(
        meta_ptr + slot * stride_meta_slot,
        stride_meta_word,
        state_indices_ptr,
        r,
        1,
        num_ring_rows,
        1,
        False,
    )
    o_next, n_next, kap = o_next.to(tl.int32), n_next.to(tl.int32), kap.to(tl.int32)
    fo, fn = fo.to(tl.int32), fn.to(tl.int32)
    write_row = o_next + n_next
    write_row = tl.where(write_row >= num_ring_rows, write_row - num_ring_rows, write_row)
    # The history of a non-flush row, the fold region of a flush row: entries [0, n) from o.
    o = tl.where(flush, fo, o_next)
    n = tl.where(flush, fn, n_next)

    o_j = tl.arange(0, BLOCK_L)
    m_j = o_j < n
    rows = o + o_j
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    dt_h = tl.load(
        ring_dt_ptr
        + slot * stride_rdt_slot
        + h[:, None] * stride_rdt_head
        + rows[None, :] * stride_rdt_row,
        mask=m_hg[:, None] & m_j[None, :],
        other=0.0,
    )  # [BLOCK_HG, BLOCK_L]
    B_h = tl.load(
        ring_B_ptr
        + slot * stride_rB_slot
        + pid_g * stride_rB_group
        + rows[:, None] * stride_rB_row
        + o_n[None, :] * stride_rB_dstate,
        mask=(m_j & (flush == 0))[:, None] & m_n[None, :],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_L, BLOCK_N]
    bc = tl.sum(B_h * c[None, :], axis=1)  # [BLOCK_L]
    bc_cur = tl.sum(b_cur.to(tl.float32) * c, axis=0)
    dt_cur = softplus(dt_raw.to(tl.float32) + dt_bias)  # [BLOCK_HG]
    lam = tl.cumsum(dt_h, axis=1)
    lam_n = tl.sum(dt_h, axis=1)
    # Readout of logical m = n (history + the current token); a flush row folds [0, n)
    # and then reads out from the fresh checkpoint with an empty history.
    lam_end = tl.where(flush, lam_n, lam_n + dt_cur)
    keep = m_hg[:, None] & m_j[None, :]
    w = tl.where(
        keep, dt_h * tl.exp(tl.where(keep, A[:, None] * (lam_end[:, None] - lam), 0.0)), 0.0
    )
    coef = tl.where(flush, w, w * bc[None, :])
    scale = tl.exp(A * tl.where(flush, dt_cur, lam_n + dt_cur))
    cur = dt_cur * bc_cur
    if HAS_D:
        cur += tl.load(D_ptr + h, mask=m_hg, other=0.0).to(tl.float32)
    decay = tl.exp(A * lam_n)
    p_coef = coef_ptr + r64 * stride_coef_row + h * stride_coef_head  # [BLOCK_HG]
    tl.store(p_coef[:, None] + o_j[None, :], coef, mask=m_hg[:, None])
    tl.store(p_coef + BLOCK_L, cur, mask=m_hg)
    tl.store(p_coef + BLOCK_L + 1, scale, mask=m_hg)
    tl.store(p_coef + BLOCK_L + 2, decay, mask=m_hg)

    # Row-shared records of the current token.
    tl.store(
        ring_dt_ptr + slot * stride_rdt_slot + h * stride_rdt_head + write_row * stride_rdt_row,
        dt_cur,
        mask=m_hg,
    )
    tl.store(
        ring_B_ptr
        + slot * stride_rB_slot
        + pid_g * stride_rB_group
        + write_row * stride_rB_row
        + o_n * stride_rB_dstate,
        b_cur,
        mask=m_n,
    )

    if pid_g == 0:
        store_plan_row(
            p_plan,
            slot32,
            o_next,
            n_next,
            write_row,
            1,
            kap,
            fo,
            fn,
            flush,
            stale,
            hp_rows_ptr,
            hp_count_ptr,
            r,
            HAS_LP,
        )


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _mamba2_plan_window_kernel(
    meta_ptr,
    ring_dt_ptr,
    ring_B_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    dt_bias_ptr,
    state_indices_ptr,
    qsl_ptr,
    acc_ptr,
    plan_ptr,
    coef_ptr,
    hp_rows_ptr,
    hp_count_ptr,
    null_block_id,
    num_ring_rows,
    stride_meta_slot,
    stride_meta_word,
    stride_rdt_slot,
    stride_rdt_head,
    stride_rdt_row,
    stride_rB_slot,
    stride_rB_group,
    stride_rB_row,
    stride_rB_dstate,
    stride_dt_tok,
    stride_dt_head,
    stride_B_tok,
    stride_B_group,
    stride_B_dstate,
    stride_C_tok,
    stride_C_group,
    stride_C_dstate,
    stride_coef_row,
    stride_coef_head,
    HEADS_PER_GROUP: tl.constexpr,
    dstate: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_HG: tl.constexpr,
    BLOCK_L: tl.constexpr,
    OFF_W: tl.constexpr,
    OFF_S: tl.constexpr,
    OFF_D: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_LP: tl.constexpr,
    HAS_ACC: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HP_LIST: tl.constexpr = True,
):
    """The plan of a speculative step: as `_mamba2_plan_kernel`, for the q <= WINDOW tokens
    of each row (window token i at logical position n + i, n the committed history).
    HP_LIST False: no HP list (`fused.py`'s launch reads each row's plan itself)."""
    pid_g = tl.program_id(0)
    r = tl.program_id(1)
    p_plan = plan_ptr + r * T_PLAN_LEN
    slot32 = tl.load(state_indices_ptr + r).to(tl.int32)
    if slot32 == null_block_id:
        if pid_g == 0:
            tl.store(p_plan + T_PLAN_SLOT, slot32)
        return
    slot = slot32.to(tl.int64)
    r64 = r.to(tl.int64)
    bos, q = row_tokens(qsl_ptr, r64, IS_VARLEN)

    o_hg = tl.arange(0, BLOCK_HG)
    m_hg = o_hg < HEADS_PER_GROUP
    h = pid_g * HEADS_PER_GROUP + o_hg  # [BLOCK_HG]
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    o_t = tl.arange(0, BLOCK_T)
    m_t = o_t < q
    o_j = tl.arange(0, BLOCK_L)
    A = tl.load(A_ptr + h, mask=m_hg, other=0.0).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h, mask=m_hg, other=0.0).to(tl.float32)
    m_ht = m_hg[:, None] & m_t[None, :]
    dt_raw = tl.load(
        dt_ptr + (bos + o_t[None, :]) * stride_dt_tok + h[:, None] * stride_dt_head,
        mask=m_ht,
        other=0.0,
    )  # [BLOCK_HG, BLOCK_T]
    dt_w = tl.where(m_ht, softplus(dt_raw.to(tl.float32) + dt_bias[:, None]), 0.0)
    B_w = tl.load(
        B_ptr
        + (bos + o_t[:, None]) * stride_B_tok
        + pid_g * stride_B_group
        + o_n[None, :] * stride_B_dstate,
        mask=m_t[:, None] & m_n[None, :],
        other=0.0,
    )  # [BLOCK_T, BLOCK_N], the records' dtype

    o_next, n_next, kap, fo, fn, flush, stale = plan_row(
        meta_ptr + slot * stride_meta_slot,
        stride_meta_word,
        acc_ptr,
        r64,
        q,
        num_ring_rows,
        WINDOW,
        HAS_ACC,
    )
    o_next, n_next, kap = o_next.to(tl.int32), n_next.to(tl.int32), kap.to(tl.int32)
    fo, fn = fo.to(tl.int32), fn.to(tl.int32)
    first = o_next + n_next  # ring row of window token 0
    first = tl.where(first >= num_ring_rows, first - num_ring_rows, first)
    o = tl.where(flush, fo, o_next)
    n = tl.where(flush, fn, n_next)
    m_j = o_j < n
    rows = o + o_j
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    dt_h = tl.load(
        ring_dt_ptr
        + slot * stride_rdt_slot
        + h[:, None] * stride_rdt_head
        + rows[None, :] * stride_rdt_row,
        mask=m_hg[:, None] & m_j[None, :],
        other=0.0,
    )  # [BLOCK_HG, BLOCK_L]
    B_h = tl.load(
        ring_B_ptr
        + slot * stride_rB_slot
        + pid_g * stride_rB_group
        + rows[:, None] * stride_rB_row
        + o_n[None, :] * stride_rB_dstate,
        mask=(m_j & (flush == 0))[:, None] & m_n[None, :],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_L, BLOCK_N]
    # Group-shared dot products: bc_h[i, l] = B_l . C_i (history), bc_w[i, j] = B_j . C_i.
    bc_h = tl.zeros([BLOCK_T, BLOCK_L], dtype=tl.float32)
    bc_w = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
    for i in tl.static_range(WINDOW):
        c_i = tl.load(
            C_ptr + (bos + i) * stride_C_tok + pid_g * stride_C_group + o_n * stride_C_dstate,
            mask=m_n & (i < q),
            other=0.0,
        ).to(tl.float32)
        bc_h = tl.where(o_t[:, None] == i, tl.sum(B_h * c_i[None, :], axis=1)[None, :], bc_h)
        bc_w = tl.where(
            o_t[:, None] == i, tl.sum(B_w.to(tl.float32) * c_i[None, :], axis=1)[None, :], bc_w
        )

    # Decay sums: history λ_l, window Λ'_i (window tokens only), token i's Λ_i from the
    # checkpoint (a flush row reads the freshly folded checkpoint: no history before it).
    lam_h = tl.cumsum(dt_h, axis=1)  # [BLOCK_HG, BLOCK_L]
    lam_n = tl.sum(dt_h, axis=1)  # [BLOCK_HG]
    lam_w = tl.cumsum(dt_w, axis=1)  # [BLOCK_HG, BLOCK_T]
    lam_i = tl.where(flush, 0.0, lam_n)[:, None] + lam_w  # [BLOCK_HG, BLOCK_T]
    # History coefficients [BLOCK_HG, BLOCK_T, BLOCK_L]; flush rows: the fold weights.
    keep = m_hg[:, None, None] & m_t[None, :, None] & m_j[None, None, :]
    expo = A[:, None, None] * (lam_i[:, :, None] - lam_h[:, None, :])
    w_hist = tl.where(keep, dt_h[:, None, :] * tl.exp(tl.where(keep, expo, 0.0)), 0.0)
    fold_expo = A[:, None] * (lam_n[:, None] - lam_h)
    keep_f = m_hg[:, None] & m_j[None, :]
    w_fold = tl.where(keep_f, dt_h * tl.exp(tl.where(keep_f, fold_expo, 0.0)), 0.0)
    coef_h = tl.where(flush, w_fold[:, None, :], w_hist * bc_h[None, :, :])
    # Window coefficients [BLOCK_HG, BLOCK_T (i), BLOCK_T (j)], j <= i; D on the diagonal.
    tri = m_hg[:, None, None] & (o_t[None, None, :] <= o_t[None, :, None]) & m_t[None, :, None]
    expo_w = A[:, None, None] * (lam_w[:, :, None] - lam_w[:, None, :])
    coef_w = tl.where(tri, dt_w[:, None, :] * tl.exp(tl.where(tri, expo_w, 0.0)), 0.0)
    coef_w = coef_w * bc_w[None, :, :]
    if HAS_D:
        D = tl.load(D_ptr + h, mask=m_hg, other=0.0).to(tl.float32)
        diag = (o_t[None, None, :] == o_t[None, :, None]) & m_t[None, :, None]
        coef_w += tl.where(diag, D[:, None, None], 0.0)
    scale = tl.where(m_ht, tl.exp(A[:, None] * lam_i), 0.0)  # [BLOCK_HG, BLOCK_T]
    decay = tl.exp(A * lam_n)

    p_coef = coef_ptr + r64 * stride_coef_row + h * stride_coef_head  # [BLOCK_HG]
    p_c3 = p_coef[:, None, None] + o_t[None, :, None] * BLOCK_L + o_j[None, None, :]
    tl.store(p_c3, coef_h, mask=m_hg[:, None, None])
    p_w3 = p_coef[:, None, None] + OFF_W + o_t[None, :, None] * BLOCK_T + o_t[None, None, :]
    tl.store(p_w3, coef_w, mask=m_hg[:, None, None])
    tl.store(p_coef[:, None] + OFF_S + o_t[None, :], scale, mask=m_hg[:, None])
    tl.store(p_coef + OFF_D, decay, mask=m_hg)

    # Row-shared records of the window tokens (dt after softplus per head, B per group).
    w_rows = first + o_t
    w_rows = tl.where(w_rows >= num_ring_rows, w_rows - num_ring_rows, w_rows)
    tl.store(
        ring_dt_ptr
        + slot * stride_rdt_slot
        + h[:, None] * stride_rdt_head
        + w_rows[None, :] * stride_rdt_row,
        dt_w,
        mask=m_ht,
    )
    tl.store(
        ring_B_ptr
        + slot * stride_rB_slot
        + pid_g * stride_rB_group
        + w_rows[:, None] * stride_rB_row
        + o_n[None, :] * stride_rB_dstate,
        B_w,
        mask=m_t[:, None] & m_n[None, :],
    )

    if pid_g == 0:
        if HP_LIST:
            store_plan_row(
                p_plan,
                slot32,
                o_next,
                n_next,
                first,
                q.to(tl.int32),
                kap,
                fo,
                fn,
                flush,
                stale,
                hp_rows_ptr,
                hp_count_ptr,
                r,
                HAS_LP,
            )
        else:
            store_plan_words(
                p_plan, slot32, o_next, n_next, first, q.to(tl.int32), kap, fo, fn, flush, stale,
                HAS_LP,
            )  # fmt: skip


def mamba2_plan(
    cache,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    scratch: Mamba2Scratch,
    *,
    num_ring_rows: int,
    buffer_len: int,
    null_block_id: int,
    window: int = 1,
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    num_warps: int = 1,
    hp_list: bool = True,
) -> None:
    """Launch the plan for R rows: plain decode (window 1, one token per row) or a
    speculative step (windows of up to `window` tokens).

    cache: Mamba2ReplayCache (reads meta, ring_dt, ring_B; appends dt and B records);
    dt: [num_tokens, H] raw; A, D, dt_bias: [H]; B, C: [num_tokens, G, N]; state_indices:
    [R] int; query_start_loc: [R + 1] int (None: one token per row); num_accepted_tokens:
    [R] int, the previous step's accepted count (None: everything pending commits);
    scratch (for `window`): written (plan rows, coefficients, HP list and its length).
    hp_list False (speculative steps only): neither the HP list nor its length is written,
    for `fused.mamba2_window_fused`, which reads each row's plan itself: no zeroing of the
    count (a memset per layer and step).
    """
    H = dt.shape[1]
    R = state_indices.shape[0]
    G, N = B.shape[1], B.shape[2]
    plain = window == 1 and query_start_loc is None and num_accepted_tokens is None
    if not hp_list and plain:
        raise ValueError("plain decode's flush reads the HP list: hp_list must be True")
    if hp_list:
        scratch.hp_count.zero_()
    common = (
        scratch.plan,
        scratch.coef,
        scratch.hp_rows,
        scratch.hp_count,
        null_block_id,
        num_ring_rows,
        *cache.meta.stride(),
        *cache.ring_dt.stride(),
        *cache.ring_B.stride(),
        *dt.stride(),
        *B.stride(),
        *C.stride(),
        scratch.coef.stride(0),
        scratch.coef.stride(1),
    )
    shapes = dict(
        HEADS_PER_GROUP=H // G,
        dstate=N,
        BLOCK_N=pow2_block(N),
        BLOCK_HG=pow2_block(H // G, 2),
        BLOCK_L=history_block(buffer_len),
        HAS_D=D is not None,
        HAS_LP=cache.lp is not None,
        num_warps=num_warps,
    )
    tensors = (cache.meta, cache.ring_dt, cache.ring_B, dt, A, B, C, D if D is not None else A)
    if plain:
        launch(_mamba2_plan_kernel, (G, R), *tensors, dt_bias, state_indices, *common, **shapes)
        return
    off_w, off_s, off_d = coef_offsets(buffer_len, window)
    launch(
        _mamba2_plan_window_kernel,
        (G, R),
        *tensors,
        dt_bias,
        state_indices,
        query_start_loc if query_start_loc is not None else state_indices,
        num_accepted_tokens if num_accepted_tokens is not None else state_indices,
        *common,
        WINDOW=window,
        BLOCK_T=window_block(window),
        OFF_W=off_w,
        OFF_S=off_s,
        OFF_D=off_d,
        HAS_ACC=num_accepted_tokens is not None,
        IS_VARLEN=query_start_loc is not None,
        HP_LIST=hp_list,
        **shapes,
    )
