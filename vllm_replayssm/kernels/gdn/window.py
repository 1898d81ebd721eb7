"""Triton Gated DeltaNet ReplaySSM step for speculative windows (T = 1 + k tokens per row).
Plain decode (T = 1) runs the plan / flush / readout launches of `decode.py` instead (this
step still runs T = 1 when a caller asks for it: benchmarks, tests).

Two launch forms; `dispatch.py` picks one, the launcher here runs what it is given:
- "fused" (one row, two HP only: `dispatch.FUSED_ROUTE_MAX_ROWS{,_HP_ONLY}`): one program
  per (value-dim tile, value-head block, row), looping over value heads of one key head: the
  cursor plan, the ring's keys, their norms and Gram products with the window's keys and
  queries once per program; per value head it either advances HP over the committed entries
  (flush rows; exact: the delta rule replayed serially from HP over the cached k, v, g,
  beta; fold: weighted sum of cached corrected values) and writes HP + LP, or reads LP (HP
  when LP is off); then window token i is read out from checkpoint + history + the window's
  own corrected values (forward substitution), and only records are written (d in fp32). The
  row's last program stores the cursor words.
- "split" (more rows): the window plan (one program per (key head, row): plan rows, the
  window's normalised keys and queries, every readout coefficient, the row-shared records,
  the list of rows the flush launch has work for), the flush launch over that list, then
  the planned readout: one program per row and up to 8 value tiles of one key head (a
  pipelined tile loop) that takes each tile's products with the window's keys and queries
  and with the history as two tensor-core products and stores the cursor words from the
  plan row.
Semantics: `reference.gdn_replay_decode`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.args import require_tensors
from vllm_replayssm.kernels.common.blocks import auto_readout_tiles, cdiv, pow2_block
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.plan_row import (
    PLAN_LEN,
    T_PLAN_COUNT,
    T_PLAN_FLUSH,
    T_PLAN_FOLD_COUNT,
    T_PLAN_FOLD_ORIGIN,
    T_PLAN_LEN,
    T_PLAN_ORIGIN,
    T_PLAN_READ_HP,
    T_PLAN_SLOT,
    T_PLAN_WRITE_ROW,
    store_cursor_words,
    store_plan_words,
)
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS, require_row_contiguous
from vllm_replayssm.kernels.common.streams import num_sms
from vllm_replayssm.kernels.common.triton_checkpoint import store_lp
from vllm_replayssm.kernels.common.triton_cursor import finish_row, plan_row, row_tokens
from vllm_replayssm.kernels.common.triton_dots import bf16_parts, dot_bf16_parts, dot_bf16_parts2
from vllm_replayssm.kernels.gdn.flush import fold_tile, recomputes_d
from vllm_replayssm.kernels.gdn.plan import history_block
from vllm_replayssm.kernels.gdn.tiles import (
    beta_gate,
    history_weights,
    l2norm_rows,
    log_decay,
)
from vllm_replayssm.layout import (
    NULL_BLOCK_ID,
    GDNReplayCache,
    gdn_d_records_allowed,
    ring_rows,
)

FLUSH_BLOCK_V = 16  # the split route's flush tile (value rows of one warp's program)
# Persistent one-warp flush programs per SM over the plan's row list: as many as its 255
# registers let an SM hold. Four one-warp programs were slower on the H100 at T = 4, bf16
# LP, bs 256 (4B 364 -> 456 µs, 122B 666 -> 819;
# `kernels-h100-20261205-37e4032-gdn-window4-flush-programs-keys.json`); so were programs
# of two or four warps sharing the tile, four or two per SM (122B 646 -> 952 / 1,322 µs, 4B
# 357 -> 510 / 696; `kernels-h100-20261205-3997590-gdn-window4-flush-warps-bf16.json`).
FLUSH_PROGRAMS_PER_SM = 8


@triton.jit
def _pick(mat, o_t, i):
    """Row i of a [BLOCK_W, X] register tile, as [X]."""
    return tl.sum(tl.where(o_t[:, None] == i, mat, 0.0), axis=0)


@triton.jit
def _pick_col(mat, o_n, i):
    """Column i of a [X, N] register tile, as [X]."""
    return tl.sum(tl.where(o_n[None, :] == i, mat, 0.0), axis=1)


@triton.jit
def _pick1(vec, o_t, i):
    return tl.sum(tl.where(o_t == i, vec, 0.0), axis=0)


@triton.jit
def _flush_head(
    p_hp,
    p_lp,
    p_rg,
    p_rbeta,
    p_rk,
    p_rd,
    p_rv,
    fo,
    fn,
    num_ring_rows,
    o_v,
    o_k,
    m_v,
    m_k,
    m_vk,
    stride_rg_row,
    stride_rbeta_row,
    stride_rk_row,
    stride_rk_k,
    stride_rd_row,
    stride_rd_v,
    stride_rv_row,
    stride_rv_v,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    FOLD_EXACT: tl.constexpr,
    FOLD: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """Advance one value head's HP tile over ring entries [fo, fo + fn); write HP and LP;
    return the new tile (fp32). FOLD: "serial" (record by record, `tiles.advance_tile`) or
    the WY form's product precision (`flush.fold_tile`); FOLD_EXACT: replay the delta rule over
    the cached k, v, g, β (else sum the cached d)."""
    S = fold_tile(
        tl.load(p_hp, mask=m_vk, other=0.0),
        p_rg,
        p_rbeta,
        p_rk,
        p_rd,
        p_rv,
        fo,
        fn,
        num_ring_rows,
        o_v,
        o_k,
        m_v,
        m_k,
        stride_rg_row,
        stride_rbeta_row,
        stride_rk_row,
        stride_rk_k,
        stride_rd_row,
        stride_rd_v,
        stride_rv_row,
        stride_rv_v,
        FOLD_EXACT,
        BLOCK_L,
        FOLD,
    )
    tl.store(p_hp, S, mask=m_vk)
    if HAS_LP:
        store_lp(p_lp, S, m_vk, LP_IS_FP16)
    return S


@triton.jit
def _history_products(
    p_rk, row_h, m_hist, k_w, q_w, o_t, o_k, m_k, stride_rk_row, stride_rk_k, WINDOW: tl.constexpr
):
    """Gram products of the normalised history keys with the window's normalised keys and
    scaled queries: ([BLOCK_W, BLOCK_H] k_j . k_i, [BLOCK_W, BLOCK_H] k_j . q_i); masked
    history rows give zeros."""
    k_h = l2norm_rows(
        tl.load(
            p_rk + row_h[:, None] * stride_rk_row + o_k[None, :] * stride_rk_k,
            mask=m_hist[:, None] & m_k[None, :],
            other=0.0,
        ).to(tl.float32)
    )
    gk = tl.zeros([k_w.shape[0], k_h.shape[0]], dtype=tl.float32)
    gq = tl.zeros([k_w.shape[0], k_h.shape[0]], dtype=tl.float32)
    for i in tl.static_range(WINDOW):
        gk = tl.where(
            o_t[:, None] == i, tl.sum(k_h * _pick(k_w, o_t, i)[None, :], axis=1)[None, :], gk
        )
        gq = tl.where(
            o_t[:, None] == i, tl.sum(k_h * _pick(q_w, o_t, i)[None, :], axis=1)[None, :], gq
        )
    return gk, gq


def window_coef_len(block_w: int, block_h: int) -> int:
    """Per (row, value head) words of the window plan's coefficients: c_u, c_w, β [BLOCK_W]
    each, the history coefficients A_h, B_h [BLOCK_W, BLOCK_H] and the window's own A_w, B_w
    [BLOCK_W, BLOCK_W] (`_gdn_window_plan_kernel`)."""
    return 3 * block_w + 2 * block_w * block_h + 2 * block_w * block_w


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _gdn_window_plan_kernel(
    ring_g_ptr,
    ring_beta_ptr,
    ring_k_ptr,
    meta_ptr,
    q_ptr,
    k_ptr,
    a_ptr,
    b_ptr,
    A_log_ptr,
    dt_bias_ptr,
    state_indices_ptr,
    qsl_ptr,
    acc_ptr,
    kq_ptr,
    coef_ptr,
    plan_ptr,
    flush_rows_ptr,
    flush_count_ptr,
    scale,
    null_block_id,
    num_ring_rows,
    stride_rg_slot,
    stride_rg_head,
    stride_rg_row,
    stride_rbeta_slot,
    stride_rbeta_head,
    stride_rbeta_row,
    stride_rk_slot,
    stride_rk_head,
    stride_rk_row,
    stride_rk_k,
    stride_meta_slot,
    stride_meta_word,
    stride_q_tok,
    stride_q_head,
    stride_q_k,
    stride_k_tok,
    stride_k_head,
    stride_k_k,
    stride_a_tok,
    stride_a_head,
    stride_b_tok,
    stride_b_head,
    stride_kq_row,
    stride_kq_head,
    stride_coef_row,
    stride_coef_head,
    v_per_k: tl.constexpr,
    head_k_dim: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HG: tl.constexpr,
    HAS_ACC: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
    HAS_LP: tl.constexpr,
    FLUSH_READS_LP: tl.constexpr,
    REFRESH_STALE: tl.constexpr = False,
):
    """The window step's plan, one program per (key head, row): everything but the state
    tile's products, once per row instead of in every (value tile, head block) readout
    program. Reads the cursor words (nobody writes them in this launch) and the history
    records; stores the window's normalised keys and scaled queries (kq[row, key head] =
    [2, BLOCK_W, BLOCK_K]) and per value head the coefficients of

        d_i = β_i v_i − c_u,i (S0·k_i) − Σ_l A_h[i, l] d_l − Σ_{j<i} A_w[i, j] d_j
        o_i = c_w,i (S0·q_i) + Σ_l B_h[i, l] d_l + Σ_{j≤i} B_w[i, j] d_j

    over the history records d_l and the window's own corrected values (c_w,i = e^{G_i + Γn},
    c_u,i = β_i c_w,i, A_h = β_i e^{G_i} w_l (k_l·k_i), B_h = e^{G_i} w_l (k_l·q_i), A_w =
    β_i e^{G_i − G_j} (k_j·k_i), B_w = e^{G_i − G_j} (k_j·q_i); `window_coef_len` words);
    appends the window's g, β (exact flush) and k records. Flush rows get an empty
    history: the readout reads their folded checkpoint, HP, or with FLUSH_READS_LP the LP
    copy the flush launch has just written from it (LP's rounding, as every other row's
    read; half the bytes of bf16 HP). The key head 0 program stores the row's plan words
    (`plan_row.store_plan_words`; NULL rows: the slot word only), which the readout launch
    reads instead of the cursor words. REFRESH_STALE (with FLUSH_READS_LP): no row reads HP,
    the flush launch refreshes a stale LP from HP. The rows the flush launch has work for
    (flush rows; with REFRESH_STALE stale ones too) are appended to
    flush_rows ([R] int32, in any order), their count to flush_count ([1] int32, zero
    before the launch) (`_gdn_window_flush_list_kernel`)."""
    pid_k = tl.program_id(0)
    pid_r = tl.program_id(1).to(tl.int64)
    slot32 = tl.load(state_indices_ptr + pid_r).to(tl.int32)
    p_plan = plan_ptr + pid_r * T_PLAN_LEN
    if slot32 == null_block_id:
        if pid_k == 0:
            tl.store(p_plan + T_PLAN_SLOT, slot32)
        return
    slot = slot32.to(tl.int64)
    bos, q = row_tokens(qsl_ptr, pid_r, IS_VARLEN)
    o, n, kap, fo, fn, flush, stale = plan_row(
        meta_ptr + slot * stride_meta_slot,
        stride_meta_word,
        acc_ptr,
        pid_r,
        q,
        num_ring_rows,
        WINDOW,
        HAS_ACC,
    )
    if pid_k == 0:
        write_row = o + n
        write_row = tl.where(write_row >= num_ring_rows, write_row - num_ring_rows, write_row)
        # With REFRESH_STALE the flush launch writes the LP of flush rows from their folded
        # HP and copies a stale LP's HP into it (`_gdn_window_flush_list_kernel`): every row
        # reads LP (the readout's LP_ONLY build), and LP is fresh in the new cursor words.
        stale_next = stale & (not REFRESH_STALE)
        store_plan_words(p_plan, slot32, o, n, write_row, q, kap, fo, fn, flush, stale_next, HAS_LP)
        if REFRESH_STALE:
            tl.store(p_plan + T_PLAN_READ_HP, 0)
        elif FLUSH_READS_LP:  # the flush rewrites a stale LP too: only stale rows read HP
            tl.store(p_plan + T_PLAN_READ_HP, (stale & (flush == 0)).to(tl.int32))
        if flush | (stale & REFRESH_STALE):
            i = tl.atomic_add(flush_count_ptr, 1, sem="relaxed")
            tl.store(flush_rows_ptr + i, pid_r.to(tl.int32))
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < head_k_dim
    o_h = tl.arange(0, BLOCK_H)
    m_hist = o_h < n
    row_h = (o + o_h) % num_ring_rows
    o_t = tl.arange(0, BLOCK_W)
    m_t = o_t < q
    tok = bos + o_t
    m_tk = m_t[:, None] & m_k[None, :]
    k_w_raw = tl.load(
        k_ptr + tok[:, None] * stride_k_tok + pid_k * stride_k_head + o_k[None, :] * stride_k_k,
        mask=m_tk,
        other=0.0,
    )
    q_raw = tl.load(
        q_ptr + tok[:, None] * stride_q_tok + pid_k * stride_q_head + o_k[None, :] * stride_q_k,
        mask=m_tk,
        other=0.0,
    )
    k_w = l2norm_rows(k_w_raw.to(tl.float32))
    q_w = l2norm_rows(q_raw.to(tl.float32)) * scale
    p_kq = kq_ptr + pid_r * stride_kq_row + pid_k * stride_kq_head
    tl.store(p_kq + o_t[:, None] * BLOCK_K + o_k[None, :], k_w)
    tl.store(p_kq + (BLOCK_W + o_t[:, None]) * BLOCK_K + o_k[None, :], q_w)
    p_rk = ring_k_ptr + slot * stride_rk_slot + pid_k * stride_rk_head
    gk, gq = _history_products(
        p_rk, row_h, m_hist, k_w, q_w, o_t, o_k, m_k, stride_rk_row, stride_rk_k, WINDOW
    )
    kk = tl.zeros([BLOCK_W, BLOCK_W], dtype=tl.float32)  # [i, j] k_j . k_i
    qk = tl.zeros([BLOCK_W, BLOCK_W], dtype=tl.float32)  # [i, j] k_j . q_i
    for j in tl.static_range(WINDOW):
        k_j = _pick(k_w, o_t, j)
        kk = tl.where(o_t[None, :] == j, tl.sum(k_w * k_j[None, :], axis=1)[:, None], kk)
        qk = tl.where(o_t[None, :] == j, tl.sum(q_w * k_j[None, :], axis=1)[:, None], qk)

    # Per value head of this key head: decays and gates, then the coefficients.
    o_hg = tl.arange(0, BLOCK_HG)
    m_hg = o_hg < v_per_k
    h = pid_k * v_per_k + o_hg
    keep = m_hg[:, None] & m_hist[None, :]
    g_h = tl.load(
        ring_g_ptr
        + slot * stride_rg_slot
        + h[:, None] * stride_rg_head
        + row_h[None, :] * stride_rg_row,
        mask=keep,
        other=0.0,
    )  # [BLOCK_HG, BLOCK_H]
    w_h, gam_n = history_weights(g_h, keep, 1)
    neg_A = -tl.exp(tl.load(A_log_ptr + h, mask=m_hg, other=0.0).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + h, mask=m_hg, other=0.0).to(tl.float32)
    m_ht = m_hg[:, None] & m_t[None, :]
    a_w = tl.load(
        a_ptr + tok[None, :] * stride_a_tok + h[:, None] * stride_a_head, mask=m_ht, other=0.0
    ).to(tl.float32)
    b_raw = tl.load(
        b_ptr + tok[None, :] * stride_b_tok + h[:, None] * stride_b_head, mask=m_ht, other=0.0
    )
    g_w = tl.where(m_ht, log_decay(neg_A[:, None], dt_bias[:, None], a_w), 0.0)  # [HG, W]
    beta_w = beta_gate(b_raw)
    G_w = tl.cumsum(g_w, axis=1)
    e_G = tl.exp(G_w)
    c_w = e_G * tl.exp(gam_n)[:, None]
    c_u = beta_w * c_w
    a_h = (beta_w * e_G)[:, :, None] * w_h[:, None, :] * gk[None, :, :]  # [HG, W, H]
    b_h = e_G[:, :, None] * w_h[:, None, :] * gq[None, :, :]
    le = (o_t[None, :] <= o_t[:, None])[None, :, :]  # [1, i, j]: j <= i
    lt = (o_t[None, :] < o_t[:, None])[None, :, :]
    e_ij = tl.where(le, tl.exp(tl.where(le, G_w[:, :, None] - G_w[:, None, :], 0.0)), 0.0)
    a_w = tl.where(lt, beta_w[:, :, None] * e_ij * kk[None, :, :], 0.0)  # [HG, W, W]
    b_w = tl.where(le, e_ij * qk[None, :, :], 0.0)

    p_c = coef_ptr + pid_r * stride_coef_row + h[:, None] * stride_coef_head  # [HG, 1]
    m_c = m_hg[:, None]
    tl.store(p_c + o_t[None, :], c_u, mask=m_c)
    tl.store(p_c + BLOCK_W + o_t[None, :], c_w, mask=m_c)
    tl.store(p_c + 2 * BLOCK_W + o_t[None, :], beta_w, mask=m_c)
    p_c3 = p_c[:, :, None] + 3 * BLOCK_W
    m_c3 = m_hg[:, None, None]
    p_hist = p_c3 + o_t[None, :, None] * BLOCK_H + o_h[None, None, :]
    tl.store(p_hist, a_h, mask=m_c3)
    tl.store(p_hist + BLOCK_W * BLOCK_H, b_h, mask=m_c3)
    p_win = p_c3 + 2 * BLOCK_W * BLOCK_H + o_t[None, :, None] * BLOCK_W + o_t[None, None, :]
    tl.store(p_win, a_w, mask=m_c3)
    tl.store(p_win + BLOCK_W * BLOCK_W, b_w, mask=m_c3)

    # The window's row-shared records at logical n .. n + q - 1.
    row_w = (o + n + o_t) % num_ring_rows
    tl.store(
        ring_g_ptr
        + slot * stride_rg_slot
        + h[:, None] * stride_rg_head
        + row_w[None, :] * stride_rg_row,
        g_w,
        mask=m_ht,
    )
    if EXACT_FLUSH:
        tl.store(
            ring_beta_ptr
            + slot * stride_rbeta_slot
            + h[:, None] * stride_rbeta_head
            + row_w[None, :] * stride_rbeta_row,
            beta_w,
            mask=m_ht,
        )
    tl.store(p_rk + row_w[:, None] * stride_rk_row + o_k[None, :] * stride_rk_k, k_w_raw, mask=m_tk)


@triton.jit
def _gdn_window_flush_list_kernel(
    hp_ptr,
    lp_ptr,
    ring_g_ptr,
    ring_beta_ptr,
    ring_k_ptr,
    ring_d_ptr,
    ring_v_ptr,
    plan_ptr,
    flush_rows_ptr,
    flush_count_ptr,
    num_ring_rows,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_v,
    stride_hp_k,
    stride_lp_slot,
    stride_lp_head,
    stride_lp_v,
    stride_lp_k,
    stride_rg_slot,
    stride_rg_head,
    stride_rg_row,
    stride_rbeta_slot,
    stride_rbeta_head,
    stride_rbeta_row,
    stride_rk_slot,
    stride_rk_head,
    stride_rk_row,
    stride_rk_k,
    stride_rd_slot,
    stride_rd_head,
    stride_rd_row,
    stride_rd_v,
    stride_rv_slot,
    stride_rv_head,
    stride_rv_row,
    stride_rv_v,
    num_v_heads: tl.constexpr,
    v_per_k: tl.constexpr,
    tiles_per_head: tl.constexpr,
    head_k_dim: tl.constexpr,
    head_v_dim: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    FOLD_EXACT: tl.constexpr,
    FOLD: tl.constexpr,
    BLOCK_L: tl.constexpr,
    REFRESH_STALE: tl.constexpr,
):
    """The planned window step's flush over the plan's list (`_gdn_window_plan_kernel`):
    a persistent grid, each program taking (listed row, value head, BLOCK_V
    value tile) items in turn. A flush row's tile is folded over its plan row's fold region
    (`_flush_head`: HP and LP written); with REFRESH_STALE a listed row that does not flush
    has a stale LP, which gets its HP tile. Unlisted rows cost nothing (a grid over every
    (tile, head, row) would spend a program on each)."""
    pid = tl.program_id(0)
    items_per_row: tl.constexpr = num_v_heads * tiles_per_head
    total = tl.load(flush_count_ptr) * items_per_row
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < head_k_dim
    for item in tl.range(pid, total, tl.num_programs(0), num_stages=1):
        r = tl.load(flush_rows_ptr + item // items_per_row).to(tl.int64)
        h = (item % items_per_row) // tiles_per_head
        o_v = (item % tiles_per_head) * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < head_v_dim
        m_vk = m_v[:, None] & m_k[None, :]
        p_plan = plan_ptr + r * T_PLAN_LEN
        slot = tl.load(p_plan + T_PLAN_SLOT).to(tl.int64)
        p_hp = (
            hp_ptr
            + slot * stride_hp_slot
            + h * stride_hp_head
            + o_v[:, None] * stride_hp_v
            + o_k[None, :] * stride_hp_k
        )
        p_lp = (
            lp_ptr
            + slot * stride_lp_slot
            + h * stride_lp_head
            + o_v[:, None] * stride_lp_v
            + o_k[None, :] * stride_lp_k
        )
        if tl.load(p_plan + T_PLAN_FLUSH) != 0:
            _flush_head(
                p_hp,
                p_lp,
                ring_g_ptr + slot * stride_rg_slot + h * stride_rg_head,
                ring_beta_ptr + slot * stride_rbeta_slot + h * stride_rbeta_head,
                ring_k_ptr + slot * stride_rk_slot + (h // v_per_k) * stride_rk_head,
                ring_d_ptr + slot * stride_rd_slot + h * stride_rd_head,
                ring_v_ptr + slot * stride_rv_slot + h * stride_rv_head,
                tl.load(p_plan + T_PLAN_FOLD_ORIGIN),
                tl.load(p_plan + T_PLAN_FOLD_COUNT),
                num_ring_rows,
                o_v,
                o_k,
                m_v,
                m_k,
                m_vk,
                stride_rg_row,
                stride_rbeta_row,
                stride_rk_row,
                stride_rk_k,
                stride_rd_row,
                stride_rd_v,
                stride_rv_row,
                stride_rv_v,
                HAS_LP,
                LP_IS_FP16,
                FOLD_EXACT,
                FOLD,
                BLOCK_L,
            )
        elif REFRESH_STALE:  # listed without a flush: the row's LP is stale
            store_lp(p_lp, tl.load(p_hp, mask=m_vk, other=0.0), m_vk, LP_IS_FP16)


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _gdn_window_readout_kernel(
    hp_ptr,
    lp_ptr,
    ring_d_ptr,
    ring_v_ptr,
    meta_ptr,
    v_ptr,
    out_ptr,
    qsl_ptr,
    plan_ptr,
    kq_ptr,
    coef_ptr,
    null_block_id,
    num_ring_rows,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_v,
    stride_hp_k,
    stride_lp_slot,
    stride_lp_head,
    stride_lp_v,
    stride_lp_k,
    stride_rd_slot,
    stride_rd_head,
    stride_rd_row,
    stride_rd_v,
    stride_rv_slot,
    stride_rv_head,
    stride_rv_row,
    stride_rv_v,
    stride_meta_slot,
    stride_meta_word,
    stride_v_tok,
    stride_v_head,
    stride_v_v,
    stride_out_tok,
    stride_out_head,
    stride_out_v,
    stride_kq_row,
    stride_kq_head,
    stride_coef_row,
    stride_coef_head,
    v_per_k: tl.constexpr,
    tiles_per_head: tl.constexpr,
    head_k_dim: tl.constexpr,
    head_v_dim: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_K: tl.constexpr,
    DOT_H: tl.constexpr,
    DOT_N: tl.constexpr,
    HAS_LP: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    LP_PRECISION: tl.constexpr,
    TILES: tl.constexpr,
    HEAD_TILES: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    LP_ONLY: tl.constexpr = False,
):
    """The planned window readout, one program per TILES consecutive (value head, value
    tile) pairs of one key head and a row (TILES divides v_per_k * tiles_per_head; HEAD_TILES
    of one value head in a row: TILES and tiles_per_head, the smaller divides the larger):
    no cursor words read. Per tile the checkpoint tile S [BLOCK_V, K] (LP, or HP where the plan
    row says so or without LP; LP_ONLY: LP for every row, the build without the HP branch,
    when the flush launch has written flush rows' LP and refreshed stale ones) meets the
    window's keys and queries in one product, the history records d_h in a second:

        X = (S [k_1..k_W, q_1..q_W]) diag(c_u, c_w) + d_h^T [A_h; B_h]^T    [BLOCK_V, 2 BLOCK_W]

    (fp32 accuracy: tf32x3; a bf16 LP tile with LP_PRECISION "bf16x3", three bf16 products
    of the exact tile with the keys' bf16 parts; "bf16x2": two, keys to 16 bits), so
    column i holds c_u,i S·k_i + Σ_l A_h[i, l] d_l and column BLOCK_W + i the w-side
    twin; then the forward substitution over the window's own corrected values on
    [BLOCK_V] vectors (`_gdn_window_plan_kernel` gives the coefficients). Stores the
    outputs, the d (and v) records at the plan's write rows; the program of the first tile
    stores the row's new cursor words from the plan row. The plan row, the keys and queries
    (and their bf16 parts) load once per program; the tile loop (NUM_STAGES: Triton's
    software pipelining) issues a tile's loads while the one before is computed."""
    pid = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    t0 = pid * TILES  # the program's first (value head, value tile), head-major
    o_k = tl.arange(0, DOT_K)
    m_k = o_k < head_k_dim
    o_n = tl.arange(0, DOT_N)
    m_n = o_n < 2 * BLOCK_W
    o_l = tl.arange(0, DOT_H)
    o_t = tl.arange(0, BLOCK_W)

    # Loads that depend on neither the plan row nor the slot.
    p_plan = plan_ptr + r * T_PLAN_LEN
    slot32 = tl.load(p_plan + T_PLAN_SLOT)
    bos, q = row_tokens(qsl_ptr, r, IS_VARLEN)
    m_t = o_t < q
    tok = bos + o_t
    kq_t = tl.load(
        kq_ptr
        + r * stride_kq_row
        + (t0 // (tiles_per_head * v_per_k)) * stride_kq_head
        + (o_n[None, :] * BLOCK_K + o_k[:, None]),
        mask=m_k[:, None] & m_n[None, :],
        other=0.0,
    )  # [DOT_K, DOT_N]: k_1..k_W, q_1..q_W as columns
    p_out = out_ptr + tok[:, None] * stride_out_tok

    if pid == 0:
        store_cursor_words(
            p_plan, meta_ptr, slot32, null_block_id, stride_meta_slot, stride_meta_word
        )
    if slot32 == null_block_id:
        for i in tl.range(TILES):
            h = (t0 + i) // tiles_per_head
            o_v = ((t0 + i) % tiles_per_head) * BLOCK_V + tl.arange(0, BLOCK_V)
            tl.store(
                p_out + h * stride_out_head + o_v[None, :] * stride_out_v,
                tl.zeros([BLOCK_W, BLOCK_V], dtype=tl.float32),
                mask=m_t[:, None] & (o_v < head_v_dim)[None, :],
            )
        return
    o = tl.load(p_plan + T_PLAN_ORIGIN)
    n = tl.load(p_plan + T_PLAN_COUNT)
    write_row = tl.load(p_plan + T_PLAN_WRITE_ROW)
    slot = slot32.to(tl.int64)
    rows = o + o_l
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    m_h = o_l < n
    p_rd = ring_d_ptr + slot * stride_rd_slot
    p_rv = ring_v_ptr + slot * stride_rv_slot
    p_c = coef_ptr + r * stride_coef_row
    lp_row = False  # whether the row reads LP (a runtime flag with an LP copy)
    if LP_ONLY:  # the flush launch made every row's LP current: no HP branch is built
        lp_row = True
    elif HAS_LP:
        lp_row = tl.load(p_plan + T_PLAN_READ_HP) == 0  # else stale LP, flush rows: HP
    # what both branches pass (Triton takes tuples of tensors and scalars as arguments)
    row = (kq_t, rows, m_h, write_row, num_ring_rows, t0, p_c, q, p_rd, p_rv)
    row += (v_ptr + bos * stride_v_tok, out_ptr + bos * stride_out_tok)
    lanes = (o_k, m_k, o_n, m_n, o_l, o_t)
    strides = (stride_rd_head, stride_rd_row, stride_rd_v, stride_rv_head, stride_rv_row)
    strides += (stride_rv_v, stride_v_tok, stride_v_head, stride_v_v, stride_out_tok)
    strides += (stride_out_head, stride_out_v, stride_coef_head)
    if lp_row:
        _readout_tiles(
            lp_ptr + slot * stride_lp_slot,
            (stride_lp_head, stride_lp_v, stride_lp_k),
            row,
            lanes,
            strides,
            tiles_per_head,
            head_v_dim,
            WINDOW,
            BLOCK_W,
            BLOCK_V,
            BLOCK_H,
            DOT_N,
            EXACT_FLUSH,
            TILES // HEAD_TILES,
            HEAD_TILES,
            NUM_STAGES,
            LP_PRECISION,
        )
    else:
        _readout_tiles(
            hp_ptr + slot * stride_hp_slot,
            (stride_hp_head, stride_hp_v, stride_hp_k),
            row,
            lanes,
            strides,
            tiles_per_head,
            head_v_dim,
            WINDOW,
            BLOCK_W,
            BLOCK_V,
            BLOCK_H,
            DOT_N,
            EXACT_FLUSH,
            TILES // HEAD_TILES,
            HEAD_TILES,
            NUM_STAGES,
            "tf32x3",
        )


@triton.jit
def _readout_tiles(
    p_s,
    s_strides,
    row,
    lanes,
    strides,
    tiles_per_head: tl.constexpr,
    head_v_dim: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_N: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
    HEADS: tl.constexpr,
    HEAD_TILES: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """The readout of HEADS x HEAD_TILES tiles of one row (`_gdn_window_readout_kernel`):
    HEADS value heads from t0's on, HEAD_TILES value tiles of each, from the state at p_s
    (the slot's HP or LP; PRECISION: the tile's product with the keys, "tf32x3" or "bf16x3"
    for an exact bf16 tile); the row's tokens from p_v0 / p_out0 on. A value head's
    coefficients load once, its tiles in a loop that Triton pipelines (NUM_STAGES). s_strides:
    the state's head, value and key strides; row, lanes, strides: as the readout kernel
    packs them."""
    stride_s_head, stride_s_v, stride_s_k = s_strides
    kq_t, rows, m_h, write_row, num_ring_rows, t0, p_c, q, p_rd, p_rv, p_v0, p_out0 = row
    o_k, m_k, o_n, m_n, o_l, o_t = lanes
    stride_rd_head, stride_rd_row, stride_rd_v, stride_rv_head, stride_rv_row = strides[:5]
    stride_rv_v, stride_v_tok, stride_v_head, stride_v_v, stride_out_tok = strides[5:10]
    stride_out_head, stride_out_v, stride_coef_head = strides[10:]
    m_t = o_t < q
    p_v = p_v0 + o_t[:, None] * stride_v_tok
    p_out = p_out0 + o_t[:, None] * stride_out_tok
    if PRECISION == "bf16x3" or PRECISION == "bf16x2":
        kq_hi, kq_mid, kq_lo = bf16_parts(kq_t)  # once per program, not per tile
    for hh in tl.static_range(HEADS):  # unrolled: the keys die after the last head
        t_h = t0 + hh * HEAD_TILES
        h = t_h // tiles_per_head
        p_ch = p_c + h * stride_coef_head
        c_uw = tl.load(p_ch + o_n, mask=m_n, other=0.0)  # [DOT_N]: c_u, then c_w
        ab_t = tl.load(
            p_ch + 3 * BLOCK_W + (o_n[None, :] * BLOCK_H + o_l[:, None]),
            mask=(o_l < BLOCK_H)[:, None] & m_n[None, :],
            other=0.0,
        )  # [DOT_H, DOT_N]: A_h, then B_h rows as columns
        for i in tl.range(HEAD_TILES, num_stages=NUM_STAGES):
            o_v = ((t_h + i) % tiles_per_head) * BLOCK_V + tl.arange(0, BLOCK_V)
            m_v = o_v < head_v_dim
            S = tl.load(
                p_s + h * stride_s_head + (o_v[:, None] * stride_s_v + o_k[None, :] * stride_s_k),
                mask=m_v[:, None] & m_k[None, :],
                other=0.0,
            )
            d_h_t = tl.load(
                p_rd
                + h * stride_rd_head
                + (rows[None, :] * stride_rd_row + o_v[:, None] * stride_rd_v),
                mask=m_v[:, None] & m_h[None, :],
                other=0.0,
            ).to(tl.float32)  # [BLOCK_V, DOT_H] (records fp32 or the LP dtype)
            x = tl.zeros([BLOCK_V, DOT_N], dtype=tl.float32)
            if PRECISION == "bf16x3":  # the bf16 tile is exact: split the keys only
                x = dot_bf16_parts(S, kq_hi, kq_mid, kq_lo, x)
            elif PRECISION == "bf16x2":  # keys to 16 bits: far below the LP tile's rounding
                x = dot_bf16_parts2(S, kq_hi, kq_mid, x)
            else:
                x = tl.dot(S.to(tl.float32), kq_t, x, input_precision="tf32x3")
            m_tv = m_t[:, None] & m_v[None, :]
            v_raw = tl.load(
                p_v + h * stride_v_head + o_v[None, :] * stride_v_v, mask=m_tv, other=0.0
            )  # [BLOCK_W, BLOCK_V]
            x = x * c_uw[None, :]
            x = tl.dot(d_h_t, ab_t, acc=x, input_precision="tf32x3")  # [BLOCK_V, DOT_N]
            _finish_window(
                x,
                p_ch,
                v_raw,
                p_out + h * stride_out_head + o_v[None, :] * stride_out_v,
                p_rd + h * stride_rd_head,
                p_rv + h * stride_rv_head,
                write_row,
                num_ring_rows,
                o_t,
                o_n,
                o_v,
                m_tv,
                (stride_rd_row, stride_rd_v, stride_rv_row, stride_rv_v),
                WINDOW,
                BLOCK_W,
                BLOCK_V,
                BLOCK_H,
                EXACT_FLUSH,
            )


@triton.jit
def _finish_window(
    x,
    p_c,
    v_raw,
    p_out,
    p_rd,
    p_rv,
    write_row,
    num_ring_rows,
    o_t,
    o_n,
    o_v,
    m_tv,
    ring_strides,
    WINDOW: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
):
    """A planned window's outputs from X ([BLOCK_V, DOT_N]: column i c_u,i S·k_i plus the
    history terms, column BLOCK_W + i the w-side twin) by the forward substitution over the
    window's own corrected values (coefficients at p_c, `_gdn_window_plan_kernel`); stores
    the outputs ([BLOCK_W, BLOCK_V] at p_out), the d records and (EXACT_FLUSH) the raw v
    records at the ring rows from write_row on. ring_strides: the d and v records' (row,
    value) strides."""
    stride_rd_row, stride_rd_v, stride_rv_row, stride_rv_v = ring_strides
    v_w = v_raw.to(tl.float32)
    c_aw = 3 * BLOCK_W + 2 * BLOCK_W * BLOCK_H
    c_bw = c_aw + BLOCK_W * BLOCK_W
    d_w = tl.zeros([BLOCK_W, BLOCK_V], dtype=tl.float32)
    o_w = tl.zeros([BLOCK_W, BLOCK_V], dtype=tl.float32)
    for i in tl.static_range(WINDOW):
        d_i = tl.load(p_c + 2 * BLOCK_W + i) * _pick(v_w, o_t, i) - _pick_col(x, o_n, i)
        o_i = _pick_col(x, o_n, BLOCK_W + i)
        for j in tl.static_range(i):
            d_j = _pick(d_w, o_t, j)
            d_i -= tl.load(p_c + c_aw + i * BLOCK_W + j) * d_j
            o_i += tl.load(p_c + c_bw + i * BLOCK_W + j) * d_j
        o_i += tl.load(p_c + c_bw + i * BLOCK_W + i) * d_i
        d_w = tl.where(o_t[:, None] == i, d_i[None, :], d_w)
        o_w = tl.where(o_t[:, None] == i, o_i[None, :], o_w)
    tl.store(p_out, o_w, mask=m_tv)
    rows_w = write_row + o_t
    rows_w = tl.where(rows_w >= num_ring_rows, rows_w - num_ring_rows, rows_w)
    tl.store(p_rd + (rows_w[:, None] * stride_rd_row + o_v[None, :] * stride_rd_v), d_w, mask=m_tv)
    if EXACT_FLUSH:
        tl.store(
            p_rv + (rows_w[:, None] * stride_rv_row + o_v[None, :] * stride_rv_v),
            v_raw,
            mask=m_tv,
        )


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _gdn_window_kernel(
    hp_ptr,
    lp_ptr,
    ring_g_ptr,
    ring_beta_ptr,
    ring_k_ptr,
    ring_d_ptr,
    ring_v_ptr,
    meta_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    A_log_ptr,
    dt_bias_ptr,
    state_indices_ptr,
    qsl_ptr,
    acc_ptr,
    out_ptr,
    scale,
    null_block_id,
    num_programs_per_row,
    num_ring_rows,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_v,
    stride_hp_k,
    stride_lp_slot,
    stride_lp_head,
    stride_lp_v,
    stride_lp_k,
    stride_rg_slot,
    stride_rg_head,
    stride_rg_row,
    stride_rbeta_slot,
    stride_rbeta_head,
    stride_rbeta_row,
    stride_rk_slot,
    stride_rk_head,
    stride_rk_row,
    stride_rk_k,
    stride_rd_slot,
    stride_rd_head,
    stride_rd_row,
    stride_rd_v,
    stride_rv_slot,
    stride_rv_head,
    stride_rv_row,
    stride_rv_v,
    stride_meta_slot,
    stride_meta_word,
    stride_q_tok,
    stride_q_head,
    stride_q_k,
    stride_k_tok,
    stride_k_head,
    stride_k_k,
    stride_v_tok,
    stride_v_head,
    stride_v_v,
    stride_a_tok,
    stride_a_head,
    stride_b_tok,
    stride_b_head,
    stride_out_tok,
    stride_out_head,
    stride_out_v,
    head_k_dim: tl.constexpr,
    head_v_dim: tl.constexpr,
    v_per_k: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
    HAS_ACC: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    FOLD_EXACT: tl.constexpr,
    FOLD: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """The fused window step (the module docstring's "fused"): one program per (value tile,
    block of HEADS_PER_PROGRAM value heads of one key head, row)."""
    pid_v = tl.program_id(0)
    pid_hb = tl.program_id(1).to(tl.int64)
    pid_r = tl.program_id(2).to(tl.int64)
    bos, q = row_tokens(qsl_ptr, pid_r, IS_VARLEN)
    o_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_v = o_v < head_v_dim
    h0 = pid_hb * HEADS_PER_PROGRAM
    pid_k = h0 // v_per_k
    slot = tl.load(state_indices_ptr + pid_r).to(tl.int64)
    if slot == null_block_id:
        for h in range(h0, h0 + HEADS_PER_PROGRAM):
            for i in tl.static_range(WINDOW):
                p_out = out_ptr + (bos + i) * stride_out_tok + h * stride_out_head
                tl.store(
                    p_out + o_v * stride_out_v,
                    tl.zeros([BLOCK_V], dtype=tl.float32),
                    mask=m_v & (i < q),
                )
        return

    p_meta = meta_ptr + slot * stride_meta_slot
    o, n, kap, fo, fn, flush, stale = plan_row(
        p_meta, stride_meta_word, acc_ptr, pid_r, q, num_ring_rows, WINDOW, HAS_ACC
    )
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < head_k_dim
    m_vk = m_v[:, None] & m_k[None, :]
    p_rk = ring_k_ptr + slot * stride_rk_slot + pid_k * stride_rk_head
    # Key-head-shared quantities. History: committed entries [0, n) (empty after a flush).
    o_h = tl.arange(0, BLOCK_H)
    m_hist = o_h < n
    row_h = (o + o_h) % num_ring_rows
    o_t = tl.arange(0, BLOCK_W)
    m_t = o_t < q
    tok = bos + o_t
    k_w_raw = tl.load(
        k_ptr + tok[:, None] * stride_k_tok + pid_k * stride_k_head + o_k[None, :] * stride_k_k,
        mask=m_t[:, None] & m_k[None, :],
        other=0.0,
    )
    k_w = l2norm_rows(k_w_raw.to(tl.float32))
    q_w = (
        l2norm_rows(
            tl.load(
                q_ptr
                + tok[:, None] * stride_q_tok
                + pid_k * stride_q_head
                + o_k[None, :] * stride_q_k,
                mask=m_t[:, None] & m_k[None, :],
                other=0.0,
            ).to(tl.float32)
        )
        * scale
    )
    row_w = (o + n + o_t) % num_ring_rows
    gk, gq = _history_products(
        p_rk, row_h, m_hist, k_w, q_w, o_t, o_k, m_k, stride_rk_row, stride_rk_k, WINDOW
    )
    if (pid_v == 0) & (h0 % v_per_k == 0):  # append k once per key head
        tl.store(
            p_rk + row_w[:, None] * stride_rk_row + o_k[None, :] * stride_rk_k,
            k_w_raw,
            mask=m_t[:, None] & m_k[None, :],
        )

    for h in tl.range(h0, h0 + HEADS_PER_PROGRAM, num_stages=NUM_STAGES):
        p_rg = ring_g_ptr + slot * stride_rg_slot + h * stride_rg_head
        p_rbeta = ring_beta_ptr + slot * stride_rbeta_slot + h * stride_rbeta_head
        p_rd = ring_d_ptr + slot * stride_rd_slot + h * stride_rd_head
        p_rv = ring_v_ptr + slot * stride_rv_slot + h * stride_rv_head
        p_hp = (
            hp_ptr
            + slot * stride_hp_slot
            + h * stride_hp_head
            + o_v[:, None] * stride_hp_v
            + o_k[None, :] * stride_hp_k
        )
        p_lp = (
            lp_ptr
            + slot * stride_lp_slot
            + h * stride_lp_head
            + o_v[:, None] * stride_lp_v
            + o_k[None, :] * stride_lp_k
        )
        # Flush rows use the advanced HP (in registers); rows whose LP is stale (a
        # stock-route step) read HP; others read LP.
        if flush:
            S = _flush_head(
                p_hp,
                p_lp,
                p_rg,
                p_rbeta,
                p_rk,
                p_rd,
                p_rv,
                fo,
                fn,
                num_ring_rows,
                o_v,
                o_k,
                m_v,
                m_k,
                m_vk,
                stride_rg_row,
                stride_rbeta_row,
                stride_rk_row,
                stride_rk_k,
                stride_rd_row,
                stride_rd_v,
                stride_rv_row,
                stride_rv_v,
                HAS_LP,
                LP_IS_FP16,
                FOLD_EXACT,
                FOLD,
                BLOCK_L,
            )
        elif stale:
            S = tl.load(p_hp, mask=m_vk, other=0.0)
        elif HAS_LP:
            S = tl.load(p_lp, mask=m_vk, other=0.0).to(tl.float32)
        else:
            S = tl.load(p_hp, mask=m_vk, other=0.0)

        d_h = tl.load(
            p_rd + row_h[:, None] * stride_rd_row + o_v[None, :] * stride_rd_v,
            mask=m_hist[:, None] & m_v[None, :],
            other=0.0,
        ).to(tl.float32)
        g_h = tl.load(p_rg + row_h * stride_rg_row, mask=m_hist, other=0.0)
        w_h, gam_n = history_weights(g_h, m_hist, 0)  # [BLOCK_H]
        decay_n = tl.exp(gam_n)
        neg_A = -tl.exp(tl.load(A_log_ptr + h).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
        a_w = tl.load(a_ptr + tok * stride_a_tok + h * stride_a_head, mask=m_t, other=0.0).to(
            tl.float32
        )
        b_raw = tl.load(b_ptr + tok * stride_b_tok + h * stride_b_head, mask=m_t, other=0.0)
        g_w = tl.where(m_t, log_decay(neg_A, dt_bias, a_w), 0.0)
        beta_w = beta_gate(b_raw)
        G_w = tl.cumsum(g_w, axis=0)
        v_w_raw = tl.load(
            v_ptr + tok[:, None] * stride_v_tok + h * stride_v_head + o_v[None, :] * stride_v_v,
            mask=m_t[:, None] & m_v[None, :],
            other=0.0,
        )
        v_w = v_w_raw.to(tl.float32)
        d_w = tl.zeros([BLOCK_W, BLOCK_V], dtype=tl.float32)
        for i in tl.static_range(WINDOW):
            k_i = _pick(k_w, o_t, i)
            q_i = _pick(q_w, o_t, i)
            # u = S_n k_i, w = S_n q_i, S_n = e^{Gamma_n} S + sum_j w_h[j] d_j k_j^T.
            u = tl.sum(S * k_i[None, :], axis=1) * decay_n + tl.sum(
                (w_h * _pick(gk, o_t, i))[:, None] * d_h, axis=0
            )
            w = tl.sum(S * q_i[None, :], axis=1) * decay_n + tl.sum(
                (w_h * _pick(gq, o_t, i))[:, None] * d_h, axis=0
            )
            G_i = _pick1(G_w, o_t, i)
            beta_i = _pick1(beta_w, o_t, i)
            d_i = beta_i * (_pick(v_w, o_t, i) - tl.exp(G_i) * u)
            o_i = tl.exp(G_i) * w
            for j in tl.static_range(i):
                d_j = _pick(d_w, o_t, j)
                G_ij = tl.exp(G_i - _pick1(G_w, o_t, j))
                k_j = _pick(k_w, o_t, j)
                d_i -= (beta_i * G_ij * tl.sum(k_i * k_j, axis=0)) * d_j
                o_i += (G_ij * tl.sum(k_j * q_i, axis=0)) * d_j
            o_i += tl.sum(k_i * q_i, axis=0) * d_i
            d_w = tl.where(o_t[:, None] == i, d_i[None, :], d_w)
            p_out = out_ptr + (bos + i) * stride_out_tok + h * stride_out_head
            tl.store(p_out + o_v * stride_out_v, o_i, mask=m_v & (i < q))

        # Append the window's records at logical n .. n + q - 1.
        tl.store(
            p_rd + row_w[:, None] * stride_rd_row + o_v[None, :] * stride_rd_v,
            d_w,
            mask=m_t[:, None] & m_v[None, :],
        )
        if EXACT_FLUSH:
            tl.store(
                p_rv + row_w[:, None] * stride_rv_row + o_v[None, :] * stride_rv_v,
                v_w_raw,
                mask=m_t[:, None] & m_v[None, :],
            )
        if pid_v == 0:
            tl.store(p_rg + row_w * stride_rg_row, g_w, mask=m_t)
            if EXACT_FLUSH:
                tl.store(p_rbeta + row_w * stride_rbeta_row, beta_w, mask=m_t)
    finish_row(p_meta, stride_meta_word, num_programs_per_row, o, n, q, kap, fo, fn, stale)


def gdn_window_decode(
    cache: GDNReplayCache,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    buffer_len: int,
    window: int,
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    null_block_id: int = NULL_BLOCK_ID,
    route: str = "fused",
    block_v: int = 16,
    num_warps: int = 1,
    heads_per_program: int = 1,
    num_stages: int = 1,
    flush_precision: str = "serial",
    readout_precision: str = "tf32x3",
    readout_tiles: int = 1,
    readout_stages: int = 1,
    flush_stages: int = 3,
    flush_rows_read: str = "hp",
    flush_programs: int = 0,
) -> None:
    """Triton window step, a twin of `reference.gdn_replay_decode` (same arguments and
    effects).

    Launch configuration (`dispatch.launch_config` chooses it for the layers): route
    "fused" (one launch; block_v, the value-dim tile; num_warps; heads_per_program, a
    divisor of the value heads per key head; num_stages, the head loop's pipelining) or
    "split" (plan, flush, readout launches). The split route's plan
    (`_gdn_window_plan_kernel`, one program per (key head, row)) computes everything but
    the checkpoint tile's products into scratch the step allocates (plan rows, [R,
    PLAN_LEN] int32; the window's normalised keys and queries, [R, Hk, 2 BLOCK_W BLOCK_K];
    per value head the readout's coefficients, [R, Hv, window_coef_len]; from the graph
    pool under CUDA-graph capture), appends the row-shared records and lists the rows the
    flush launch has work for; the flush launch folds the flush rows; the readout
    (`_gdn_window_readout_kernel`, readout_tiles block_v x K tiles per program on num_warps;
    block_v >= 16) reads the plan instead of the cursor words and takes the tile's products
    with the window as two tensor-core products. `benchmarks/kernels/bench_decode.py
    --families gdn --window 4 --route fused,split` measures. flush_precision: how flush
    rows fold their records into HP, "serial" (record by record) or the WY form's products
    ("bf16x3", bf16 k records; "tf32x3"; `flush.fold_tile`; tiles and key dims of >= 16).
    readout_precision (split): the planned readout's product of a bf16 LP tile with the
    keys, "tf32x3" or "bf16x3" (`triton_dots.dot_bf16_parts`; HP and fp16 tiles take tf32x3), or
    "bf16x2" (the keys' two larger parts, 16 bits: an LP tile's own rounding, 2^-9,
    dominates by far). readout_tiles (split): value tiles per readout program (a divisor of
    a key head's v_per_k * cdiv(V, block_v) tiles that divides or is a multiple of a value
    head's cdiv(V, block_v); 0: `auto_readout_tiles`), which load the plan row and split the
    keys once; readout_stages: the pipelining of that program's tile loop. flush_stages:
    Triton's num_stages for the fused launch and the flush launch, the depth to which Triton
    pipelines their loops that name none (3, Triton's default: the WY fold's loops then take
    33 KiB of shared memory per one-warp program at sm_90, 8 KiB with 1). flush_rows_read
    (split, with an LP copy): what the readout reads for flush rows, "hp" (the folded
    checkpoint) or "lp" (the LP copy the flush launch wrote from it: LP rounding, as the
    other rows, for half of bf16 HP's bytes; then the flush launch also copies HP into a
    stale LP, a stock-route step's, so that every row reads LP and the readout is built
    without its HP branch). The defaults are the small-batch row of that table. The torch
    reference keeps a stale row reading HP until its next flush, so after a stock-route
    step the two differ by LP rounding and the LP-stale cursor mark. The split route's
    flush launch is a persistent grid over the rows the plan lists
    (`_gdn_window_flush_list_kernel`; flush_programs one-warp programs, 0:
    FLUSH_PROGRAMS_PER_SM per SM, 8 off CUDA).
    """
    Hk, K = k.shape[1], k.shape[2]
    Hv, V = v.shape[1], v.shape[2]
    R = state_indices.shape[0]
    num_ring_rows = ring_rows(buffer_len, window)
    check_args(
        cache,
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state_indices,
        out,
        num_ring_rows,
        query_start_loc,
        num_accepted_tokens,
        R,
    )
    if route not in ("fused", "split"):
        raise ValueError(f"route must be 'fused' or 'split', got {route!r}")
    if (Hv // Hk) % heads_per_program:
        raise ValueError(
            f"heads_per_program={heads_per_program} must divide the {Hv // Hk} "
            "value heads per key head"
        )
    split = route == "split"
    if split and block_v < 16:
        raise ValueError(f"the planned readout takes value tiles of >= 16 rows, got {block_v}")
    if R == 0:
        return
    if flush_precision not in ("serial", "bf16x3", "tf32x3", "ieee"):
        raise ValueError(f"unknown flush_precision {flush_precision!r}")
    if flush_precision == "bf16x3" and cache.ring_k.dtype != torch.bfloat16:
        raise ValueError("flush_precision bf16x3 needs bf16 k records")
    if flush_precision != "serial" and min(pow2_block(K), FLUSH_BLOCK_V if split else block_v) < 16:
        raise ValueError("the WY flush takes value tiles and key dims of >= 16")
    if readout_precision not in ("tf32x3", "bf16x3", "bf16x2"):
        raise ValueError(f"unknown readout_precision {readout_precision!r}")
    if flush_rows_read not in ("hp", "lp"):
        raise ValueError(f"flush_rows_read must be 'hp' or 'lp', got {flush_rows_read!r}")
    if flush_rows_read == "lp" and not split:
        raise ValueError("flush_rows_read 'lp' is the split route's")
    tiles = cdiv(V, block_v)
    if (readout_tiles != 1 or readout_stages > 1) and not split:
        raise ValueError("readout_tiles and readout_stages are the split route's")
    if readout_tiles == 0:
        readout_tiles = auto_readout_tiles(Hv // Hk * tiles, Hv * tiles * R, tiles)
    if (
        readout_tiles < 1
        or (Hv // Hk * tiles) % readout_tiles
        or (readout_tiles % tiles and tiles % readout_tiles)
    ):
        raise ValueError(
            f"readout_tiles={readout_tiles} must divide the {Hv // Hk * tiles} value tiles "
            f"of a key head, and divide or be a multiple of a value head's {tiles}"
        )
    cfg = dict(
        block_v=block_v,
        num_warps=num_warps,
        heads_per_program=heads_per_program,
        num_stages=num_stages,
        flush_precision=flush_precision,
        flush_stages=flush_stages,
    )
    grid = (cdiv(V, block_v), Hv // heads_per_program, R)
    lp = cache.lp if cache.lp is not None else cache.hp
    beta = cache.ring_beta if cache.ring_beta is not None else cache.ring_g
    ring_v = cache.ring_v if cache.ring_v is not None else cache.ring_d
    args = (cache, lp, beta, ring_v, q, k, v, a, b, A_log, dt_bias, state_indices)
    args += (query_start_loc, num_accepted_tokens, out, scale, null_block_id)
    args += (K, V, Hv // Hk, num_ring_rows, window, buffer_len)
    if not split:
        _launch_fused(grid, cfg, *args)
        return
    bw, bk, bh = pow2_block(window, 1), pow2_block(K), pow2_block(buffer_len)
    # lp_only: every row reads LP (flush rows' as the flush launch writes it from the folded
    # HP, stale ones refreshed from HP there), so the readout is built without an HP branch
    # (sm_90, 122B, T = 4, 8 tiles, 2 stages: 106 registers and 19.9 KiB of shared memory
    # per program instead of 168 and 28.1 KiB).
    lp_only = flush_rows_read == "lp" and cache.lp is not None
    f32 = dict(dtype=torch.float32, device=v.device)
    plan = torch.empty((R, PLAN_LEN), dtype=torch.int32, device=v.device)
    kq = torch.empty((R, Hk, 2 * bw * bk), **f32)
    coef = torch.empty((R, Hv, window_coef_len(bw, bh)), **f32)
    # the plan lists the rows the flush launch has work for (the count zeroed first)
    flush_rows = torch.empty(R, dtype=torch.int32, device=v.device)
    flush_count = torch.zeros(1, dtype=torch.int32, device=v.device)
    qsl = query_start_loc if query_start_loc is not None else state_indices
    launch(
        _gdn_window_plan_kernel,
        (Hk, R),
        cache.ring_g,
        beta,
        cache.ring_k,
        cache.meta,
        q,
        k,
        a,
        b,
        A_log,
        dt_bias,
        state_indices,
        qsl,
        num_accepted_tokens if num_accepted_tokens is not None else state_indices,
        kq,
        coef,
        plan,
        flush_rows,
        flush_count,
        scale,
        null_block_id,
        num_ring_rows,
        *cache.ring_g.stride(),
        *beta.stride(),
        *cache.ring_k.stride(),
        *cache.meta.stride(),
        *q.stride(),
        *k.stride(),
        *a.stride(),
        *b.stride(),
        *kq.stride()[:2],
        *coef.stride()[:2],
        v_per_k=Hv // Hk,
        head_k_dim=K,
        WINDOW=window,
        BLOCK_W=bw,
        BLOCK_K=bk,
        BLOCK_H=bh,
        BLOCK_HG=pow2_block(Hv // Hk, 2),
        HAS_ACC=num_accepted_tokens is not None,
        IS_VARLEN=query_start_loc is not None,
        EXACT_FLUSH=cache.exact_flush,
        HAS_LP=cache.lp is not None,
        FLUSH_READS_LP=flush_rows_read == "lp" and cache.lp is not None,
        REFRESH_STALE=lp_only,
        num_warps=1,
    )

    if flush_programs <= 0:
        flush_programs = FLUSH_PROGRAMS_PER_SM * num_sms(v.device) if v.is_cuda else 8
    # block_v and num_warps are the readout's; the flush launch keeps its own tile
    _launch_flush_list(
        cache, lp, beta, ring_v, plan, flush_rows, flush_count, K, V, Hk, R,
        num_ring_rows, buffer_len, flush_programs, lp_only, cfg,
    )  # fmt: skip
    _launch_readout(
        cache, lp, ring_v, v, out, qsl, plan, kq, coef, null_block_id, num_ring_rows,
        Hk, K, V, R, tiles, window, bw, bk, bh, block_v, num_warps, query_start_loc,
        readout_precision, readout_tiles, readout_stages, lp_only,
    )  # fmt: skip


def _launch_readout(
    cache, lp, ring_v, v, out, qsl, plan, kq, coef, null_block_id, num_ring_rows, Hk,
    K, V, R, tiles, window, bw, bk, bh, block_v, num_warps, query_start_loc,
    readout_precision, readout_tiles, readout_stages, lp_only,
) -> None:  # fmt: skip
    """The planned readout launch (`gdn_window_decode`)."""
    Hv = v.shape[1]
    launch(
        _gdn_window_readout_kernel,
        (Hv * tiles // readout_tiles, R),
        cache.hp,
        lp,
        cache.ring_d,
        ring_v,
        cache.meta,
        v,
        out,
        qsl,
        plan,
        kq,
        coef,
        null_block_id,
        num_ring_rows,
        *cache.hp.stride(),
        *lp.stride(),
        *cache.ring_d.stride(),
        *ring_v.stride(),
        *cache.meta.stride(),
        *v.stride(),
        *out.stride(),
        *kq.stride()[:2],
        *coef.stride()[:2],
        v_per_k=Hv // Hk,
        tiles_per_head=tiles,
        head_k_dim=K,
        head_v_dim=V,
        WINDOW=window,
        BLOCK_W=bw,
        BLOCK_V=block_v,
        BLOCK_K=bk,
        BLOCK_H=bh,
        DOT_K=max(16, bk),
        DOT_H=max(16, bh),
        DOT_N=max(16, 2 * bw),
        HAS_LP=cache.lp is not None,
        EXACT_FLUSH=cache.exact_flush,
        IS_VARLEN=query_start_loc is not None,
        LP_PRECISION=readout_precision if lp.dtype == torch.bfloat16 else "tf32x3",
        TILES=readout_tiles,
        HEAD_TILES=min(readout_tiles, tiles),
        NUM_STAGES=readout_stages,
        LP_ONLY=lp_only,
        num_warps=num_warps,
    )


def _launch_flush_list(
    cache, lp, beta, ring_v, plan, flush_rows, flush_count, K, V, Hk, R, num_ring_rows,
    buffer_len, flush_programs, lp_only, cfg,
) -> None:  # fmt: skip
    """The planned step's flush launch over the plan's row list (`gdn_window_decode`)."""
    Hv = cache.hp.shape[1]
    tiles = cdiv(V, FLUSH_BLOCK_V)
    launch(
        _gdn_window_flush_list_kernel,
        (max(1, min(flush_programs, R * Hv * tiles)),),
        cache.hp,
        lp,
        cache.ring_g,
        beta,
        cache.ring_k,
        cache.ring_d,
        ring_v,
        plan,
        flush_rows,
        flush_count,
        num_ring_rows,
        *cache.hp.stride(),
        *lp.stride(),
        *cache.ring_g.stride(),
        *beta.stride(),
        *cache.ring_k.stride(),
        *cache.ring_d.stride(),
        *ring_v.stride(),
        num_v_heads=Hv,
        v_per_k=Hv // Hk,
        tiles_per_head=tiles,
        head_k_dim=K,
        head_v_dim=V,
        BLOCK_V=FLUSH_BLOCK_V,
        BLOCK_K=pow2_block(K),
        HAS_LP=cache.lp is not None,
        LP_IS_FP16=cache.lp is not None and cache.lp.dtype == torch.float16,
        FOLD_EXACT=fold_exact(cache, cfg["flush_precision"]),
        FOLD=cfg["flush_precision"],
        BLOCK_L=history_block(buffer_len),
        REFRESH_STALE=lp_only,
        num_warps=1,
        num_stages=cfg["flush_stages"],
    )


def _launch_fused(
    grid,
    cfg,
    cache,
    lp,
    beta,
    ring_v,
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_indices,
    query_start_loc,
    num_accepted_tokens,
    out,
    scale,
    null_block_id,
    K,
    V,
    v_per_k,
    num_ring_rows,
    window,
    buffer_len,
) -> None:
    """The fused step's launch of `_gdn_window_kernel` (`gdn_window_decode`)."""
    launch(
        _gdn_window_kernel,
        grid,
        cache.hp,
        lp,
        cache.ring_g,
        beta,
        cache.ring_k,
        cache.ring_d,
        ring_v,
        cache.meta,
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state_indices,
        query_start_loc if query_start_loc is not None else state_indices,
        num_accepted_tokens if num_accepted_tokens is not None else state_indices,
        out,
        scale,
        null_block_id,
        grid[0] * grid[1],
        num_ring_rows,
        *cache.hp.stride(),
        *lp.stride(),
        *cache.ring_g.stride(),
        *beta.stride(),
        *cache.ring_k.stride(),
        *cache.ring_d.stride(),
        *ring_v.stride(),
        *cache.meta.stride(),
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *a.stride(),
        *b.stride(),
        *out.stride(),
        head_k_dim=K,
        head_v_dim=V,
        v_per_k=v_per_k,
        WINDOW=window,
        BLOCK_W=pow2_block(window, 1),
        BLOCK_V=cfg["block_v"],
        BLOCK_K=pow2_block(K),
        BLOCK_H=pow2_block(buffer_len),
        HAS_LP=cache.lp is not None,
        LP_IS_FP16=cache.lp is not None and cache.lp.dtype == torch.float16,
        EXACT_FLUSH=cache.exact_flush,
        HAS_ACC=num_accepted_tokens is not None,
        IS_VARLEN=query_start_loc is not None,
        HEADS_PER_PROGRAM=cfg["heads_per_program"],
        NUM_STAGES=cfg["num_stages"],
        FOLD_EXACT=fold_exact(cache, cfg["flush_precision"]),
        FOLD=cfg["flush_precision"],
        BLOCK_L=history_block(buffer_len),
        num_warps=cfg["num_warps"],
        num_stages=cfg["flush_stages"],
    )


def fold_exact(cache, flush_precision: str) -> bool:
    """Whether a flush replays the delta rule over the cached k, v, g, β (else it sums the
    cached d): the serial fold as the flush mode says; the WY fold sums them where every d
    came from HP (no LP: `flush.recomputes_d`)."""
    if flush_precision == "serial":
        return cache.exact_flush
    return recomputes_d(cache, None)


def d_records_dtype(cache) -> torch.dtype:
    """The dtype the d records may have: theirs where the page allows it
    (`layout.gdn_d_records_allowed`), else fp32."""
    d = cache.ring_d.dtype
    lp = cache.lp.dtype if cache.lp is not None else None
    return d if gdn_d_records_allowed(d, lp, cache.exact_flush) else torch.float32


def check_args(
    cache, q, k, v, a, b, A_log, dt_bias, state_indices, out, num_ring_rows, qsl, acc, R
) -> None:
    """Shapes, dtypes and devices of a decode step's arguments (see gdn_window_decode);
    ValueError naming the first tensor that does not fit (`args.require_tensors`)."""
    Hk, K = k.shape[1], k.shape[2]
    Hv, V = v.shape[1], v.shape[2]
    S = cache.hp.shape[0]
    n_tok = v.shape[0]
    state = (S, Hv, V, K)
    want = (  # (name, tensor or None, shape, dtype or None for any)
        ("hp", cache.hp, state, torch.float32),
        ("lp", cache.lp, state, None),
        ("ring_g", cache.ring_g, (S, Hv, num_ring_rows), torch.float32),
        ("ring_k", cache.ring_k, (S, Hk, num_ring_rows, K), k.dtype),
        ("ring_d", cache.ring_d, (S, Hv, num_ring_rows, V), d_records_dtype(cache)),
        # the exact flush's records (None in fold mode)
        ("ring_beta", cache.ring_beta, (S, Hv, num_ring_rows), torch.float32),
        ("ring_v", cache.ring_v, (S, Hv, num_ring_rows, V), v.dtype),
        ("meta", cache.meta, (S, 8), torch.int32),
        ("q", q, (n_tok, Hk, K), None),
        ("k", k, (n_tok, Hk, K), None),
        ("a", a, (n_tok, Hv), None),
        ("b", b, (n_tok, Hv), None),
        ("A_log", A_log, (Hv,), None),
        ("dt_bias", dt_bias, (Hv,), None),
        ("out", out, (n_tok, Hv, V), None),
        ("state_indices", state_indices, (R,), None),
        ("query_start_loc", qsl, (R + 1,), None),
        ("num_accepted_tokens", acc, (R,), None),
    )
    require_tensors(want, v.device, "v")
    if Hv % Hk:
        raise ValueError(f"num_v_heads={Hv} not divisible by num_k_heads={Hk}")
    require_row_contiguous(
        state_indices=state_indices, query_start_loc=qsl, num_accepted_tokens=acc
    )
    if qsl is None and n_tok != R:
        raise ValueError(f"{n_tok} tokens for {R} rows without query_start_loc")
