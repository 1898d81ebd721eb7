"""Plain-decode readout for Mamba-2 (the third launch; `decode.py` runs them).

One program per (row, head, headdim tile) of BLOCK_P x dstate checkpoint elements (about
8 KiB: 16 x 128 fp32 HP or 32 x 128 bf16 LP), no loop over heads:

    y = scale * (S0 . C) + sum_j coef_j x_j + cur * x

with scale, coef and cur from the plan, x_j the history records of this head and tile.
Everything but the tile and the history records is loaded before the plan row arrives.
Rows that read HP (flush rows, stale LP) are left to the flush launch, which may run at
the same time (the two touch different rows). The program of head 0, tile 0 stores the
row's new cursor words from the plan row. No atomics, no barriers across warps.

Speculative windows (`_mamba2_readout_window_kernel`): the same program reads its tile once
and reads out every window token i from it (`read_window`):

    y_i = scale_i * (S0 . C_i) + sum_l coef_il x_l + sum_{j <= i} coef_ij x'_j

x'_j the window's own x, whose records it appends. With products "dot" (`read_window_dot`)
all tokens come from one block of tensor-core products instead of per-token reductions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import cdiv, pow2_block
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.plan_row import (
    T_PLAN_COUNT,
    T_PLAN_LEN,
    T_PLAN_ORIGIN,
    T_PLAN_READ_HP,
    T_PLAN_SLOT,
    T_PLAN_WRITE_ROW,
    store_cursor_words,
)
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS
from vllm_replayssm.kernels.common.triton_cursor import row_tokens
from vllm_replayssm.kernels.common.triton_dots import (
    bf16_parts,
    dot16,
    dot_bf16_parts,
    dot_split3,
)
from vllm_replayssm.kernels.mamba2.plan import (
    Mamba2Scratch,
    coef_offsets,
    history_block,
    window_block,
)


@triton.jit
def _mamba2_readout_kernel(
    ckpt_ptr,
    ring_x_ptr,
    meta_ptr,
    x_ptr,
    C_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    null_block_id,
    num_ring_rows,
    stride_ck_slot,
    stride_ck_head,
    stride_ck_dim,
    stride_ck_dstate,
    stride_rx_slot,
    stride_rx_head,
    stride_rx_row,
    stride_rx_dim,
    stride_meta_slot,
    stride_meta_word,
    stride_x_tok,
    stride_x_head,
    stride_x_dim,
    stride_C_tok,
    stride_C_group,
    stride_C_dstate,
    stride_out_tok,
    stride_out_head,
    stride_out_dim,
    stride_coef_row,
    stride_coef_head,
    HEADS_PER_GROUP: tl.constexpr,
    TILES_PER_HEAD: tl.constexpr,
    headdim: tl.constexpr,
    dstate: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    pid = tl.program_id(0)
    r = tl.program_id(1)
    h = pid // TILES_PER_HEAD
    g = h // HEADS_PER_GROUP
    o_p = (pid % TILES_PER_HEAD) * BLOCK_P + tl.arange(0, BLOCK_P)
    m_p = o_p < headdim
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    o_j = tl.arange(0, BLOCK_L)
    r64 = r.to(tl.int64)

    # Loads that do not depend on the plan row.
    p_plan = plan_ptr + r * T_PLAN_LEN
    slot32 = tl.load(p_plan + T_PLAN_SLOT)
    o = tl.load(p_plan + T_PLAN_ORIGIN)
    n = tl.load(p_plan + T_PLAN_COUNT)
    write_row = tl.load(p_plan + T_PLAN_WRITE_ROW)
    read_hp = tl.load(p_plan + T_PLAN_READ_HP)
    p_coef = coef_ptr + r64 * stride_coef_row + h * stride_coef_head
    coef = tl.load(p_coef + o_j)
    cur = tl.load(p_coef + BLOCK_L)
    scale = tl.load(p_coef + BLOCK_L + 1)
    c = tl.load(
        C_ptr + r64 * stride_C_tok + g * stride_C_group + o_n * stride_C_dstate, mask=m_n, other=0.0
    ).to(tl.float32)
    x = tl.load(
        x_ptr + r64 * stride_x_tok + h * stride_x_head + o_p * stride_x_dim, mask=m_p, other=0.0
    )
    p_out = out_ptr + r64 * stride_out_tok + h * stride_out_head + o_p * stride_out_dim

    if pid == 0:
        store_cursor_words(
            p_plan, meta_ptr, slot32, null_block_id, stride_meta_slot, stride_meta_word
        )
    if slot32 == null_block_id:
        tl.store(p_out, tl.zeros([BLOCK_P], dtype=tl.float32), mask=m_p)
        return
    if read_hp != 0:
        return
    slot = slot32.to(tl.int64)
    S0 = tl.load(
        ckpt_ptr
        + slot * stride_ck_slot
        + h * stride_ck_head
        + o_p[:, None] * stride_ck_dim
        + o_n[None, :] * stride_ck_dstate,
        mask=m_p[:, None] & m_n[None, :],
        other=0.0,
    )  # [BLOCK_P, BLOCK_N]
    rows = o + o_j
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    p_rx = ring_x_ptr + slot * stride_rx_slot + h * stride_rx_head
    x_h = tl.load(
        p_rx + rows[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
        mask=(o_j < n)[:, None] & m_p[None, :],
        other=0.0,
    )  # [BLOCK_L, BLOCK_P]
    y = scale * tl.sum(S0.to(tl.float32) * c[None, :], axis=1)
    y += tl.sum(coef[:, None] * x_h.to(tl.float32), axis=0)
    y += cur * x.to(tl.float32)
    tl.store(p_out, y, mask=m_p)
    tl.store(p_rx + write_row * stride_rx_row + o_p * stride_rx_dim, x, mask=m_p)


@triton.jit
def read_window(
    S0,
    p_coef,
    x_h,
    x_w,
    C_ptr,
    p_out,
    bos,
    q,
    g,
    o_n,
    m_n,
    m_p,
    stride_C_tok,
    stride_C_group,
    stride_C_dstate,
    stride_out_tok,
    WINDOW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_L: tl.constexpr,
    OFF_W: tl.constexpr,
    OFF_S: tl.constexpr,
):
    """Store y_i (module docstring) for the window tokens i < q of one (row, head, tile).

    S0: [BLOCK_P, BLOCK_N] checkpoint tile; p_coef: the (row, head) coefficient row;
    x_h: [BLOCK_L, BLOCK_P] history records (zero past the history); x_w: [BLOCK_T,
    BLOCK_P] the window's x (zero past q); p_out: the output of token bos + 0 at this tile."""
    o_j = tl.arange(0, BLOCK_L)
    o_t = tl.arange(0, BLOCK_T)
    for i in tl.static_range(WINDOW):
        c_i = tl.load(
            C_ptr + (bos + i) * stride_C_tok + g * stride_C_group + o_n * stride_C_dstate,
            mask=m_n & (i < q),
            other=0.0,
        ).to(tl.float32)
        ch = tl.load(p_coef + i * BLOCK_L + o_j)
        cw = tl.load(p_coef + OFF_W + i * BLOCK_T + o_t)
        y = tl.load(p_coef + OFF_S + i) * tl.sum(S0.to(tl.float32) * c_i[None, :], axis=1)
        y += tl.sum(ch[:, None] * x_h, axis=0)
        y += tl.sum(cw[:, None] * x_w, axis=0)
        tl.store(p_out + i * stride_out_tok, y, mask=m_p & (i < q))


@triton.jit
def _records_dot(x, w, acc):
    """acc + x @ w at fp32 accuracy for records x (the activations' dtype) and fp32
    coefficients w: exact bf16 records against w's three bf16 parts, other records (fp16,
    fp32) in tf32x3."""
    if x.dtype == tl.bfloat16:
        w_hi, w_mid, w_lo = bf16_parts(w)
        return dot_bf16_parts(x, w_hi, w_mid, w_lo, acc)
    return tl.dot(x.to(tl.float32), w, acc=acc, input_precision="tf32x3")


@triton.jit
def read_window_dot(
    p_s,
    p_rx,
    rows,
    n,
    p_x,
    p_C,
    p_coef,
    p_out,
    q,
    o_p,
    m_p,
    s_strides,
    stride_rx_row,
    stride_rx_dim,
    stride_x_tok,
    stride_x_dim,
    stride_C_tok,
    stride_C_dstate,
    stride_out_tok,
    stride_out_dim,
    dstate: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_T: tl.constexpr,
    DOT_T: tl.constexpr,
    OFF_W: tl.constexpr,
    OFF_S: tl.constexpr,
    PRODUCTS: tl.constexpr,
):
    """`read_window` in tensor-core products: every window token of one (row, head, tile)
    at once, as the columns i < q of

        Y = (S0 Cᵀ) diag(scale) + X_hᵀ W_h + X_wᵀ W_w       [BLOCK_P, DOT_T]

    S0 [BLOCK_P, dstate] the tile at p_s (s_strides: its dim and dstate strides), read in
    BLOCK_K-column chunks; Cᵀ [dstate, DOT_T] the window's C (p_C: token 0's, this group);
    X_hᵀ [BLOCK_P, BLOCK_L] the history records at ring rows `rows` (the first n); X_wᵀ
    [BLOCK_P, DOT_T] the window's x (p_x: token 0's, this head); W_h, W_w and scale the
    plan's coefficients (history l / window j by token i). The tile's products: "dot16"
    (a 16-bit tile and C of one dtype: exact products), "bf16x3" (an fp32 tile against
    bf16 C: the tile's three bf16 parts), "tf32x3" (any other pair); the records' products
    by `_records_dot`; every term fp32-accurate. Unlike `read_window`, no cross-lane
    reductions: at T = 4 those were 368 of the bf16 readout's 1,688 sm_90 instructions."""
    stride_s_dim, stride_s_dstate = s_strides
    o_d = tl.arange(0, DOT_T)
    m_d = o_d < q
    y = tl.zeros([BLOCK_P, DOT_T], dtype=tl.float32)
    for kc in tl.static_range(BLOCK_N // BLOCK_K):
        o_k = kc * BLOCK_K + tl.arange(0, BLOCK_K)
        m_k = o_k < dstate
        s = tl.load(
            p_s + o_p[:, None] * stride_s_dim + o_k[None, :] * stride_s_dstate,
            mask=m_p[:, None] & m_k[None, :],
            other=0.0,
        )  # [BLOCK_P, BLOCK_K]
        c_t = tl.load(
            p_C + o_d[None, :] * stride_C_tok + o_k[:, None] * stride_C_dstate,
            mask=m_k[:, None] & m_d[None, :],
            other=0.0,
        )  # [BLOCK_K, DOT_T]
        y = window_tile_dot(s, c_t, y, PRODUCTS)
    finish_window_dot(
        y,
        p_rx,
        rows,
        n,
        p_x,
        p_coef,
        p_out,
        q,
        o_p,
        m_p,
        stride_rx_row,
        stride_rx_dim,
        stride_x_tok,
        stride_x_dim,
        stride_out_tok,
        stride_out_dim,
        BLOCK_L,
        BLOCK_T,
        DOT_T,
        OFF_W,
        OFF_S,
    )


@triton.jit
def window_tile_dot(s, c_t, y, PRODUCTS: tl.constexpr):
    """y + s @ c_t: a checkpoint tile's columns s [BLOCK_P, K] against the window's C
    [K, DOT_T] (`read_window_dot`'s PRODUCTS: "dot16", "bf16x3" or "tf32x3")."""
    if PRODUCTS == "dot16":
        y = dot16(s, c_t, y)
    elif PRODUCTS == "bf16x3":
        y = dot_split3(s, c_t, y)
    else:
        y = tl.dot(s.to(tl.float32), c_t.to(tl.float32), acc=y, input_precision="tf32x3")
    return y


@triton.jit
def finish_window_dot(
    y,
    p_rx,
    rows,
    n,
    p_x,
    p_coef,
    p_out,
    q,
    o_p,
    m_p,
    stride_rx_row,
    stride_rx_dim,
    stride_x_tok,
    stride_x_dim,
    stride_out_tok,
    stride_out_dim,
    BLOCK_L: tl.constexpr,
    BLOCK_T: tl.constexpr,
    DOT_T: tl.constexpr,
    OFF_W: tl.constexpr,
    OFF_S: tl.constexpr,
):
    """Finish `read_window_dot` from y = S0 Cᵀ ([BLOCK_P, DOT_T]): scale the columns, add
    the history records' and the window's terms and store the tokens i < q."""
    o_d = tl.arange(0, DOT_T)
    m_d = o_d < q
    m_c = o_d < BLOCK_T  # the coefficient row's token slots
    o_j = tl.arange(0, BLOCK_L)
    y = y * tl.load(p_coef + OFF_S + o_d, mask=m_c, other=0.0)[None, :]
    x_h = tl.load(
        p_rx + rows[None, :] * stride_rx_row + o_p[:, None] * stride_rx_dim,
        mask=m_p[:, None] & (o_j < n)[None, :],
        other=0.0,
    )  # [BLOCK_P, BLOCK_L]
    w_h = tl.load(
        p_coef + o_d[None, :] * BLOCK_L + o_j[:, None], mask=m_c[None, :], other=0.0
    )  # [BLOCK_L, DOT_T]
    y = _records_dot(x_h, w_h, y)
    x_w = tl.load(
        p_x + o_d[None, :] * stride_x_tok + o_p[:, None] * stride_x_dim,
        mask=m_p[:, None] & m_d[None, :],
        other=0.0,
    )  # [BLOCK_P, DOT_T]
    w_w = tl.load(
        p_coef + OFF_W + o_d[None, :] * BLOCK_T + o_d[:, None],
        mask=m_c[:, None] & m_c[None, :],
        other=0.0,
    )  # [DOT_T (token j), DOT_T (token i)]
    y = _records_dot(x_w, w_w, y)
    tl.store(
        p_out + o_d[None, :] * stride_out_tok + o_p[:, None] * stride_out_dim,
        y,
        mask=m_p[:, None] & m_d[None, :],
    )


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _mamba2_readout_window_kernel(
    ckpt_ptr,
    ring_x_ptr,
    meta_ptr,
    x_ptr,
    C_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    qsl_ptr,
    null_block_id,
    num_ring_rows,
    stride_ck_slot,
    stride_ck_head,
    stride_ck_dim,
    stride_ck_dstate,
    stride_rx_slot,
    stride_rx_head,
    stride_rx_row,
    stride_rx_dim,
    stride_meta_slot,
    stride_meta_word,
    stride_x_tok,
    stride_x_head,
    stride_x_dim,
    stride_C_tok,
    stride_C_group,
    stride_C_dstate,
    stride_out_tok,
    stride_out_head,
    stride_out_dim,
    stride_coef_row,
    stride_coef_head,
    HEADS_PER_GROUP: tl.constexpr,
    TILES_PER_HEAD: tl.constexpr,
    headdim: tl.constexpr,
    dstate: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    OFF_W: tl.constexpr,
    OFF_S: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    PRODUCTS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_T: tl.constexpr,
):
    readout_window_program(
        ckpt_ptr,
        ring_x_ptr,
        meta_ptr,
        x_ptr,
        C_ptr,
        out_ptr,
        plan_ptr,
        coef_ptr,
        qsl_ptr,
        null_block_id,
        num_ring_rows,
        stride_ck_slot,
        stride_ck_head,
        stride_ck_dim,
        stride_ck_dstate,
        stride_rx_slot,
        stride_rx_head,
        stride_rx_row,
        stride_rx_dim,
        stride_meta_slot,
        stride_meta_word,
        stride_x_tok,
        stride_x_head,
        stride_x_dim,
        stride_C_tok,
        stride_C_group,
        stride_C_dstate,
        stride_out_tok,
        stride_out_head,
        stride_out_dim,
        stride_coef_row,
        stride_coef_head,
        HEADS_PER_GROUP,
        TILES_PER_HEAD,
        headdim,
        dstate,
        WINDOW,
        BLOCK_T,
        BLOCK_P,
        BLOCK_N,
        BLOCK_L,
        OFF_W,
        OFF_S,
        IS_VARLEN,
        PRODUCTS,
        BLOCK_K,
        DOT_T,
        tl.program_id(0),
        tl.program_id(1),
    )


@triton.jit
def readout_window_program(
    ckpt_ptr,
    ring_x_ptr,
    meta_ptr,
    x_ptr,
    C_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    qsl_ptr,
    null_block_id,
    num_ring_rows,
    stride_ck_slot,
    stride_ck_head,
    stride_ck_dim,
    stride_ck_dstate,
    stride_rx_slot,
    stride_rx_head,
    stride_rx_row,
    stride_rx_dim,
    stride_meta_slot,
    stride_meta_word,
    stride_x_tok,
    stride_x_head,
    stride_x_dim,
    stride_C_tok,
    stride_C_group,
    stride_C_dstate,
    stride_out_tok,
    stride_out_head,
    stride_out_dim,
    stride_coef_row,
    stride_coef_head,
    HEADS_PER_GROUP: tl.constexpr,
    TILES_PER_HEAD: tl.constexpr,
    headdim: tl.constexpr,
    dstate: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    OFF_W: tl.constexpr,
    OFF_S: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    PRODUCTS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_T: tl.constexpr,
    pid,
    r,
):
    """One readout program of a speculative step (`_mamba2_readout_window_kernel`): tile
    pid (head pid // TILES_PER_HEAD) of row r. Also the readout rows' part of
    `fused.py`'s launch."""
    h = pid // TILES_PER_HEAD
    g = h // HEADS_PER_GROUP
    o_p = (pid % TILES_PER_HEAD) * BLOCK_P + tl.arange(0, BLOCK_P)
    m_p = o_p < headdim
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    o_j = tl.arange(0, BLOCK_L)
    o_t = tl.arange(0, BLOCK_T)
    r64 = r.to(tl.int64)
    bos, q = row_tokens(qsl_ptr, r64, IS_VARLEN)
    m_t = o_t < q

    # Loads that do not depend on the plan row.
    p_plan = plan_ptr + r * T_PLAN_LEN
    slot32 = tl.load(p_plan + T_PLAN_SLOT)
    o = tl.load(p_plan + T_PLAN_ORIGIN)
    n = tl.load(p_plan + T_PLAN_COUNT)
    first = tl.load(p_plan + T_PLAN_WRITE_ROW)
    read_hp = tl.load(p_plan + T_PLAN_READ_HP)
    x_w = tl.load(
        x_ptr
        + (bos + o_t[:, None]) * stride_x_tok
        + h * stride_x_head
        + o_p[None, :] * stride_x_dim,
        mask=m_t[:, None] & m_p[None, :],
        other=0.0,
    )  # [BLOCK_T, BLOCK_P]
    p_out = out_ptr + bos * stride_out_tok + h * stride_out_head + o_p * stride_out_dim

    if pid == 0:
        store_cursor_words(
            p_plan, meta_ptr, slot32, null_block_id, stride_meta_slot, stride_meta_word
        )
    if slot32 == null_block_id:
        tl.store(
            p_out + o_t[:, None] * stride_out_tok,
            tl.zeros([BLOCK_T, BLOCK_P], dtype=tl.float32),
            mask=m_t[:, None] & m_p[None, :],
        )
        return
    if read_hp != 0:
        return
    slot = slot32.to(tl.int64)
    rows = o + o_j
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    p_rx = ring_x_ptr + slot * stride_rx_slot + h * stride_rx_head
    if PRODUCTS == "fma":
        S0 = tl.load(
            ckpt_ptr
            + slot * stride_ck_slot
            + h * stride_ck_head
            + o_p[:, None] * stride_ck_dim
            + o_n[None, :] * stride_ck_dstate,
            mask=m_p[:, None] & m_n[None, :],
            other=0.0,
        )  # [BLOCK_P, BLOCK_N]
        x_h = tl.load(
            p_rx + rows[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
            mask=(o_j < n)[:, None] & m_p[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_L, BLOCK_P]
        read_window(
            S0,
            coef_ptr + r64 * stride_coef_row + h * stride_coef_head,
            x_h,
            x_w.to(tl.float32),
            C_ptr,
            p_out,
            bos,
            q,
            g,
            o_n,
            m_n,
            m_p,
            stride_C_tok,
            stride_C_group,
            stride_C_dstate,
            stride_out_tok,
            WINDOW,
            BLOCK_T,
            BLOCK_L,
            OFF_W,
            OFF_S,
        )
    else:  # tensor-core products (`read_window_dot`)
        read_window_dot(
            ckpt_ptr + slot * stride_ck_slot + h * stride_ck_head,
            p_rx,
            rows,
            n,
            x_ptr + bos * stride_x_tok + h * stride_x_head,
            C_ptr + bos * stride_C_tok + g * stride_C_group,
            coef_ptr + r64 * stride_coef_row + h * stride_coef_head,
            out_ptr + bos * stride_out_tok + h * stride_out_head,
            q,
            o_p,
            m_p,
            (stride_ck_dim, stride_ck_dstate),
            stride_rx_row,
            stride_rx_dim,
            stride_x_tok,
            stride_x_dim,
            stride_C_tok,
            stride_C_dstate,
            stride_out_tok,
            stride_out_dim,
            dstate,
            BLOCK_P,
            BLOCK_N,
            BLOCK_K,
            BLOCK_L,
            BLOCK_T,
            DOT_T,
            OFF_W,
            OFF_S,
            PRODUCTS,
        )
    w_rows = first + o_t
    w_rows = tl.where(w_rows >= num_ring_rows, w_rows - num_ring_rows, w_rows)
    tl.store(
        p_rx + w_rows[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
        x_w,
        mask=m_t[:, None] & m_p[None, :],
    )


def mamba2_readout(
    cache,
    x: torch.Tensor,
    C: torch.Tensor,
    out: torch.Tensor,
    scratch: Mamba2Scratch,
    *,
    num_rows: int,
    num_ring_rows: int,
    buffer_len: int,
    null_block_id: int,
    block_p: int,
    num_warps: int,
    window: int = 1,
    query_start_loc: torch.Tensor | None = None,
    products: str = "fma",
) -> None:
    """Launch the readout for num_rows rows after `mamba2_plan` (alongside `mamba2_flush`).

    Reads LP (HP when LP is off), ring_x history, the plan; writes out [num_tokens, H, P]
    for rows that read neither HP nor a NULL slot (zeros for NULL rows), their x records
    and every row's cursor words. window / query_start_loc: as given to the plan.
    products: how a speculative window's readout forms its sums, "fma" (elementwise
    products and warp reductions, `read_window`) or "dot" (tensor-core products,
    `read_window_dot`; block_p >= 16); plain decode takes "fma" only.
    """
    H, P = x.shape[1], x.shape[2]
    G, N = C.shape[1], C.shape[2]
    ckpt = cache.lp if cache.lp is not None else cache.hp
    plain = window == 1 and query_start_loc is None
    tile_products = window_products(products, ckpt.dtype, C.dtype, block_p, plain)
    tiles = cdiv(P, block_p)
    args = (
        *ckpt.stride(),
        *cache.ring_x.stride(),
        *cache.meta.stride(),
        *x.stride(),
        *C.stride(),
        *out.stride(),
        scratch.coef.stride(0),
        scratch.coef.stride(1),
    )
    shapes = dict(
        HEADS_PER_GROUP=H // G,
        TILES_PER_HEAD=tiles,
        headdim=P,
        dstate=N,
        BLOCK_P=block_p,
        BLOCK_N=pow2_block(N),
        BLOCK_L=history_block(buffer_len),
        num_warps=num_warps,
    )
    tensors = (ckpt, cache.ring_x, cache.meta, x, C, out, scratch.plan, scratch.coef)
    grid = (H * tiles, num_rows)
    if window == 1 and query_start_loc is None:  # plain decode (the window layout at T = 1)
        launch(
            _mamba2_readout_kernel, grid, *tensors, null_block_id, num_ring_rows, *args, **shapes
        )
        return
    off_w, off_s, _ = coef_offsets(buffer_len, window)
    launch(
        _mamba2_readout_window_kernel,
        grid,
        *tensors,
        query_start_loc if query_start_loc is not None else scratch.plan,
        null_block_id,
        num_ring_rows,
        *args,
        WINDOW=window,
        BLOCK_T=window_block(window),
        OFF_W=off_w,
        OFF_S=off_s,
        IS_VARLEN=query_start_loc is not None,
        PRODUCTS=tile_products,
        # An fp32 tile's three bf16 parts live at once: 32-column chunks (sm_90 at 16 x 128:
        # 80 registers; 64 columns spill 8 bytes).
        BLOCK_K=shapes["BLOCK_N"] if ckpt.element_size() == 2 else min(32, shapes["BLOCK_N"]),
        DOT_T=max(16, window_block(window)),
        **shapes,
    )


READOUT_PRODUCTS = ("fma", "dot")
DOT_MIN_ROWS = 16  # a tensor-core product's smallest M: the fewest tile rows "dot" takes


def window_products(
    products: str,
    tile_dtype: torch.dtype,
    c_dtype: torch.dtype,
    block_p: int,
    plain: bool,
    launch: str = "readout",
) -> str:
    """The window readout's PRODUCTS constexpr for the `products` knob of a launch
    ("readout" or "flush", for the messages): "fma", or with "dot" the tile's product by its
    dtypes: "dot16" (a 16-bit tile and C of one dtype), "bf16x3" (an fp32 tile, bf16 C),
    "tf32x3" (any other pair). Refuses "dot" for plain decode and for tiles of fewer than
    DOT_MIN_ROWS rows."""
    if products not in READOUT_PRODUCTS:
        raise ValueError(f"{launch}_products must be one of {READOUT_PRODUCTS}, got {products!r}")
    if products == "fma":
        return "fma"
    if plain:
        raise ValueError(f'{launch}_products "dot" applies to speculative windows only')
    if block_p < DOT_MIN_ROWS:
        raise ValueError(
            f'{launch}_products "dot" needs {launch}_block_p >= {DOT_MIN_ROWS}, got {block_p}'
        )
    if tile_dtype == c_dtype and tile_dtype in (torch.bfloat16, torch.float16):
        return "dot16"
    if tile_dtype == torch.float32 and c_dtype == torch.bfloat16:
        return "bf16x3"
    return "tf32x3"
