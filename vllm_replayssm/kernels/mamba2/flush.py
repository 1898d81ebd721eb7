"""Plain-decode flush for Mamba-2 (the second launch; `decode.py` runs them).

Runs only over the rows that read HP this step (the plan's HP list): flush rows, and rows
whose LP is stale (a stock-route step wrote HP alone). A persistent grid walks the list's
(row, head, headdim tile) items. Per item it reads the HP tile once; a flush row folds its
committed records in one tensor-core product at fp32 accuracy (a 3-way bf16 split of the
weighted x records against the exact bf16 B records, or tf32x3):

    S = e^{A Λ_n} S0 + (X diag(w))ᵀ B          X: [n, P] records, B: [n, N] records

writes HP and LP from registers, and reads out the current token from S (an empty history);
a stale row reads out from HP and its history as the readout launch would. LP never enters
HP. The readout launch skips these rows.

Speculative windows (`_mamba2_flush_window_kernel`): the same fold, then every window
token is read out from the folded tile (`readout.read_window`, or with products "dot" as
tensor-core products: `readout.window_tile_dot`, `readout.finish_window_dot`). Its
stale-LP branch mirrors the plain launch's; no speculative layer meets it (the stock route,
which leaves LP stale, steps plain decode only).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import cdiv, pow2_block
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.plan_row import (
    T_PLAN_COUNT,
    T_PLAN_FLUSH,
    T_PLAN_FOLD_COUNT,
    T_PLAN_FOLD_ORIGIN,
    T_PLAN_LEN,
    T_PLAN_ORIGIN,
    T_PLAN_SLOT,
    T_PLAN_WRITE_ROW,
)
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS
from vllm_replayssm.kernels.common.triton_checkpoint import store_lp
from vllm_replayssm.kernels.common.triton_cursor import row_tokens
from vllm_replayssm.kernels.mamba2.plan import (
    Mamba2Scratch,
    coef_offsets,
    history_block,
    window_block,
)
from vllm_replayssm.kernels.mamba2.readout import (
    finish_window_dot,
    read_window,
    window_products,
    window_tile_dot,
)


@triton.jit
def _flush_tile(
    S,
    p_hp,
    p_lp,
    p_rx,
    p_rB,
    fo,
    fn,
    coef,
    decay,
    num_ring_rows,
    o_j,
    o_p,
    o_n,
    m_p,
    m_n,
    m_pn,
    stride_rx_row,
    stride_rx_dim,
    stride_rB_row,
    stride_rB_dstate,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Fold ring entries [fo, fo + fn) into one head's HP tile S ([BLOCK_P, BLOCK_N] fp32)
    at fp32 accuracy, S e^{A Λ} + (X diag(w))ᵀ B (module docstring; coef: [BLOCK_L] fold
    weights, decay: e^{A Λ}), write HP and LP from registers and return the new tile.
    p_hp, p_lp: the tile's pointers; p_rx, p_rB: the head's x and the group's B records."""
    rows = fo + o_j
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    m_j = o_j < fn
    x_f = tl.load(
        p_rx + o_p[:, None] * stride_rx_dim + rows[None, :] * stride_rx_row,
        mask=m_p[:, None] & m_j[None, :],
        other=0.0,
    )  # [BLOCK_P, BLOCK_L]
    B_f = tl.load(
        p_rB + rows[:, None] * stride_rB_row + o_n[None, :] * stride_rB_dstate,
        mask=m_j[:, None] & m_n[None, :],
        other=0.0,
    )  # [BLOCK_L, BLOCK_N]
    a = x_f.to(tl.float32) * coef[None, :]
    if DOT_PRECISION == "bf16x3":
        # B records are bf16 (exact operands); a = hi + mid + lo in bf16 carries 24 bits,
        # so three bf16 products accumulated in fp32 are fp32-accurate.
        a_hi = a.to(tl.bfloat16)
        a = a - a_hi.to(tl.float32)
        a_mid = a.to(tl.bfloat16)
        a_lo = (a - a_mid.to(tl.float32)).to(tl.bfloat16)
        S = tl.dot(a_hi, B_f, acc=S * decay)
        S = tl.dot(a_mid, B_f, acc=S)
        S = tl.dot(a_lo, B_f, acc=S)
    else:
        S = tl.dot(a, B_f.to(tl.float32), acc=S * decay, input_precision=DOT_PRECISION)
    tl.store(p_hp, S, mask=m_pn)
    if HAS_LP:
        store_lp(p_lp, S, m_pn, LP_IS_FP16)
    return S


@triton.jit
def _mamba2_flush_kernel(
    hp_ptr,
    lp_ptr,
    ring_x_ptr,
    ring_B_ptr,
    x_ptr,
    C_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    hp_rows_ptr,
    hp_count_ptr,
    num_ring_rows,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_dim,
    stride_hp_dstate,
    stride_lp_slot,
    stride_lp_head,
    stride_lp_dim,
    stride_lp_dstate,
    stride_rx_slot,
    stride_rx_head,
    stride_rx_row,
    stride_rx_dim,
    stride_rB_slot,
    stride_rB_group,
    stride_rB_row,
    stride_rB_dstate,
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
    NUM_HEADS: tl.constexpr,
    HEADS_PER_GROUP: tl.constexpr,
    TILES_PER_HEAD: tl.constexpr,
    headdim: tl.constexpr,
    dstate: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    items_per_row: tl.constexpr = NUM_HEADS * TILES_PER_HEAD
    total = tl.load(hp_count_ptr) * items_per_row
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    o_j = tl.arange(0, BLOCK_L)
    for item in tl.range(pid, total, num_programs):
        k = item // items_per_row
        h = (item % items_per_row) // TILES_PER_HEAD
        g = h // HEADS_PER_GROUP
        o_p = (item % TILES_PER_HEAD) * BLOCK_P + tl.arange(0, BLOCK_P)
        m_p = o_p < headdim
        m_pn = m_p[:, None] & m_n[None, :]
        r = tl.load(hp_rows_ptr + k)
        r64 = r.to(tl.int64)
        p_plan = plan_ptr + r * T_PLAN_LEN
        slot = tl.load(p_plan + T_PLAN_SLOT).to(tl.int64)
        o = tl.load(p_plan + T_PLAN_ORIGIN)
        n = tl.load(p_plan + T_PLAN_COUNT)
        write_row = tl.load(p_plan + T_PLAN_WRITE_ROW)
        flush = tl.load(p_plan + T_PLAN_FLUSH)
        fo = tl.load(p_plan + T_PLAN_FOLD_ORIGIN)
        fn = tl.load(p_plan + T_PLAN_FOLD_COUNT)
        p_coef = coef_ptr + r64 * stride_coef_row + h * stride_coef_head
        coef = tl.load(p_coef + o_j)  # fold weights (flush) or history coefficients
        cur = tl.load(p_coef + BLOCK_L)
        scale = tl.load(p_coef + BLOCK_L + 1)
        decay = tl.load(p_coef + BLOCK_L + 2)
        c = tl.load(
            C_ptr + r64 * stride_C_tok + g * stride_C_group + o_n * stride_C_dstate,
            mask=m_n,
            other=0.0,
        ).to(tl.float32)
        x = tl.load(
            x_ptr + r64 * stride_x_tok + h * stride_x_head + o_p * stride_x_dim, mask=m_p, other=0.0
        )
        p_hp = (
            hp_ptr
            + slot * stride_hp_slot
            + h * stride_hp_head
            + o_p[:, None] * stride_hp_dim
            + o_n[None, :] * stride_hp_dstate
        )
        S = tl.load(p_hp, mask=m_pn, other=0.0)  # [BLOCK_P, BLOCK_N]
        p_rx = ring_x_ptr + slot * stride_rx_slot + h * stride_rx_head
        if flush != 0:
            S = _flush_tile(
                S,
                p_hp,
                lp_ptr
                + slot * stride_lp_slot
                + h * stride_lp_head
                + o_p[:, None] * stride_lp_dim
                + o_n[None, :] * stride_lp_dstate,
                p_rx,
                ring_B_ptr + slot * stride_rB_slot + g * stride_rB_group,
                fo,
                fn,
                coef,
                decay,
                num_ring_rows,
                o_j,
                o_p,
                o_n,
                m_p,
                m_n,
                m_pn,
                stride_rx_row,
                stride_rx_dim,
                stride_rB_row,
                stride_rB_dstate,
                HAS_LP,
                LP_IS_FP16,
                DOT_PRECISION,
            )
            y = scale * tl.sum(S * c[None, :], axis=1)
        else:  # stale LP: read out from HP and the history, as the readout would from LP
            rows = o + o_j
            rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
            x_h = tl.load(
                p_rx + rows[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
                mask=(o_j < n)[:, None] & m_p[None, :],
                other=0.0,
            )
            y = scale * tl.sum(S * c[None, :], axis=1)
            y += tl.sum(coef[:, None] * x_h.to(tl.float32), axis=0)
        y += cur * x.to(tl.float32)
        tl.store(
            out_ptr + r64 * stride_out_tok + h * stride_out_head + o_p * stride_out_dim, y, mask=m_p
        )
        tl.store(p_rx + write_row * stride_rx_row + o_p * stride_rx_dim, x, mask=m_p)


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _mamba2_flush_window_kernel(
    hp_ptr,
    lp_ptr,
    ring_x_ptr,
    ring_B_ptr,
    x_ptr,
    C_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    hp_rows_ptr,
    hp_count_ptr,
    qsl_ptr,
    num_ring_rows,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_dim,
    stride_hp_dstate,
    stride_lp_slot,
    stride_lp_head,
    stride_lp_dim,
    stride_lp_dstate,
    stride_rx_slot,
    stride_rx_head,
    stride_rx_row,
    stride_rx_dim,
    stride_rB_slot,
    stride_rB_group,
    stride_rB_row,
    stride_rB_dstate,
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
    NUM_HEADS: tl.constexpr,
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
    OFF_D: tl.constexpr,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    PRODUCTS: tl.constexpr,
    DOT_T: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    items_per_row: tl.constexpr = NUM_HEADS * TILES_PER_HEAD
    total = tl.load(hp_count_ptr) * items_per_row
    for item in tl.range(pid, total, num_programs):
        flush_window_item(
            hp_ptr,
            lp_ptr,
            ring_x_ptr,
            ring_B_ptr,
            x_ptr,
            C_ptr,
            out_ptr,
            plan_ptr,
            coef_ptr,
            qsl_ptr,
            num_ring_rows,
            stride_hp_slot,
            stride_hp_head,
            stride_hp_dim,
            stride_hp_dstate,
            stride_lp_slot,
            stride_lp_head,
            stride_lp_dim,
            stride_lp_dstate,
            stride_rx_slot,
            stride_rx_head,
            stride_rx_row,
            stride_rx_dim,
            stride_rB_slot,
            stride_rB_group,
            stride_rB_row,
            stride_rB_dstate,
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
            OFF_D,
            HAS_LP,
            LP_IS_FP16,
            DOT_PRECISION,
            IS_VARLEN,
            PRODUCTS,
            DOT_T,
            tl.load(hp_rows_ptr + item // items_per_row),
            (item % items_per_row) // TILES_PER_HEAD,
            item % TILES_PER_HEAD,
        )


@triton.jit
def flush_window_item(
    hp_ptr,
    lp_ptr,
    ring_x_ptr,
    ring_B_ptr,
    x_ptr,
    C_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    qsl_ptr,
    num_ring_rows,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_dim,
    stride_hp_dstate,
    stride_lp_slot,
    stride_lp_head,
    stride_lp_dim,
    stride_lp_dstate,
    stride_rx_slot,
    stride_rx_head,
    stride_rx_row,
    stride_rx_dim,
    stride_rB_slot,
    stride_rB_group,
    stride_rB_row,
    stride_rB_dstate,
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
    OFF_D: tl.constexpr,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    PRODUCTS: tl.constexpr,
    DOT_T: tl.constexpr,
    r,
    h,
    tile,
):
    """One item of the window flush (`_mamba2_flush_window_kernel`): tile `tile` of head h
    of row r, a row that reads HP (a flush row folds its records first; a stale-LP row reads
    out from HP). Also the HP rows' part of `fused.py`'s launch."""
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    o_j = tl.arange(0, BLOCK_L)
    o_t = tl.arange(0, BLOCK_T)
    g = h // HEADS_PER_GROUP
    o_p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    m_p = o_p < headdim
    m_pn = m_p[:, None] & m_n[None, :]
    r64 = r.to(tl.int64)
    bos, q = row_tokens(qsl_ptr, r64, IS_VARLEN)
    m_t = o_t < q
    p_plan = plan_ptr + r * T_PLAN_LEN
    slot = tl.load(p_plan + T_PLAN_SLOT).to(tl.int64)
    o = tl.load(p_plan + T_PLAN_ORIGIN)
    n = tl.load(p_plan + T_PLAN_COUNT)
    first = tl.load(p_plan + T_PLAN_WRITE_ROW)
    flush = tl.load(p_plan + T_PLAN_FLUSH)
    fo = tl.load(p_plan + T_PLAN_FOLD_ORIGIN)
    fn = tl.load(p_plan + T_PLAN_FOLD_COUNT)
    p_coef = coef_ptr + r64 * stride_coef_row + h * stride_coef_head
    x_w = tl.load(
        x_ptr
        + (bos + o_t[:, None]) * stride_x_tok
        + h * stride_x_head
        + o_p[None, :] * stride_x_dim,
        mask=m_t[:, None] & m_p[None, :],
        other=0.0,
    )  # [BLOCK_T, BLOCK_P]
    p_hp = (
        hp_ptr
        + slot * stride_hp_slot
        + h * stride_hp_head
        + o_p[:, None] * stride_hp_dim
        + o_n[None, :] * stride_hp_dstate
    )
    S = tl.load(p_hp, mask=m_pn, other=0.0)  # [BLOCK_P, BLOCK_N]
    p_rx = ring_x_ptr + slot * stride_rx_slot + h * stride_rx_head
    if flush != 0:
        S = _flush_tile(
            S,
            p_hp,
            lp_ptr
            + slot * stride_lp_slot
            + h * stride_lp_head
            + o_p[:, None] * stride_lp_dim
            + o_n[None, :] * stride_lp_dstate,
            p_rx,
            ring_B_ptr + slot * stride_rB_slot + g * stride_rB_group,
            fo,
            fn,
            tl.load(p_coef + o_j),
            tl.load(p_coef + OFF_D),
            num_ring_rows,
            o_j,
            o_p,
            o_n,
            m_p,
            m_n,
            m_pn,
            stride_rx_row,
            stride_rx_dim,
            stride_rB_row,
            stride_rB_dstate,
            HAS_LP,
            LP_IS_FP16,
            DOT_PRECISION,
        )
        if PRODUCTS == "fma":
            x_h = tl.zeros([BLOCK_L, BLOCK_P], dtype=tl.float32)  # the history is folded
    else:  # stale LP: read out from HP and the history, as the readout would from LP
        if PRODUCTS == "fma":
            rows = o + o_j
            rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
            x_h = tl.load(
                p_rx + rows[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
                mask=(o_j < n)[:, None] & m_p[None, :],
                other=0.0,
            ).to(tl.float32)
    if PRODUCTS == "fma":
        read_window(
            S,
            p_coef,
            x_h,
            x_w.to(tl.float32),
            C_ptr,
            out_ptr + bos * stride_out_tok + h * stride_out_head + o_p * stride_out_dim,
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
    else:  # tensor-core products from the tile in registers (`readout.read_window_dot`)
        o_d = tl.arange(0, DOT_T)
        c_t = tl.load(
            C_ptr
            + (bos + o_d[None, :]) * stride_C_tok
            + g * stride_C_group
            + o_n[:, None] * stride_C_dstate,
            mask=m_n[:, None] & (o_d < q)[None, :],
            other=0.0,
        )  # [BLOCK_N, DOT_T]
        y = window_tile_dot(S, c_t, tl.zeros([BLOCK_P, DOT_T], dtype=tl.float32), PRODUCTS)
        rows = o + o_j
        rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
        finish_window_dot(
            y,
            p_rx,
            rows,
            n,  # 0 for a flush row: the plan's history after the fold
            x_ptr + bos * stride_x_tok + h * stride_x_head,
            p_coef,
            out_ptr + bos * stride_out_tok + h * stride_out_head,
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
    w_rows = first + o_t
    w_rows = tl.where(w_rows >= num_ring_rows, w_rows - num_ring_rows, w_rows)
    tl.store(
        p_rx + w_rows[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
        x_w,
        mask=m_t[:, None] & m_p[None, :],
    )


def fold_precision(cache, x: torch.Tensor, dot_precision: str | None) -> str:
    """The fold's DOT_PRECISION (`mamba2_flush`'s dot_precision): None picks "bf16x3" for
    bf16 records on a GPU, "tf32x3" otherwise; "bf16x3" needs bf16 records (ValueError)."""
    if dot_precision is None:
        bf16_records = cache.ring_B.dtype == torch.bfloat16
        return "bf16x3" if bf16_records and x.is_cuda else "tf32x3"
    if dot_precision == "bf16x3" and cache.ring_B.dtype != torch.bfloat16:
        raise ValueError("dot_precision bf16x3 needs bf16 records")
    return dot_precision


def mamba2_flush(
    cache,
    x: torch.Tensor,
    C: torch.Tensor,
    out: torch.Tensor,
    scratch: Mamba2Scratch,
    *,
    num_ring_rows: int,
    buffer_len: int,
    block_p: int,
    num_warps: int,
    num_programs: int,
    dot_precision: str | None = None,
    window: int = 1,
    query_start_loc: torch.Tensor | None = None,
    products: str = "fma",
    maxnreg: int = 0,
) -> None:
    """Launch the flush over the plan's HP list (after `mamba2_plan`, before
    `mamba2_readout`): HP and LP of flush rows written; out [num_tokens, H, P] and the x
    records written for the listed rows. num_programs: the persistent grid (any size >= 1).
    dot_precision of the fold: "bf16x3" (bf16 records on a GPU; the default there),
    "tf32x3" (the default otherwise: Triton's interpreter multiplies bf16 dot operands as
    raw bits) or "ieee". window / query_start_loc: as given to the plan. products: how a
    speculative window reads its tokens out of the folded fp32 tile, as
    `readout.mamba2_readout` takes it ("fma" or "dot"; plain decode "fma" only). maxnreg:
    a cap on the program's registers (Triton's launch option; 0: the compiler's choice),
    so that more programs of the persistent grid fit on an SM."""
    if maxnreg < 0:
        raise ValueError(f"maxnreg must be >= 0, got {maxnreg}")
    dot_precision = fold_precision(cache, x, dot_precision)
    H, P = x.shape[1], x.shape[2]
    G, N = C.shape[1], C.shape[2]
    lp = cache.lp if cache.lp is not None else cache.hp
    plain = window == 1 and query_start_loc is None
    tile_products = window_products(products, torch.float32, C.dtype, block_p, plain, "flush")
    tiles = cdiv(P, block_p)
    tensors = (
        cache.hp,
        lp,
        cache.ring_x,
        cache.ring_B,
        x,
        C,
        out,
        scratch.plan,
        scratch.coef,
        scratch.hp_rows,
        scratch.hp_count,
    )
    args = (
        num_ring_rows,
        *cache.hp.stride(),
        *lp.stride(),
        *cache.ring_x.stride(),
        *cache.ring_B.stride(),
        *x.stride(),
        *C.stride(),
        *out.stride(),
        scratch.coef.stride(0),
        scratch.coef.stride(1),
    )
    shapes = dict(
        NUM_HEADS=H,
        HEADS_PER_GROUP=H // G,
        TILES_PER_HEAD=tiles,
        headdim=P,
        dstate=N,
        BLOCK_P=block_p,
        BLOCK_N=pow2_block(N),
        BLOCK_L=history_block(buffer_len),
        HAS_LP=cache.lp is not None,
        LP_IS_FP16=cache.lp is not None and cache.lp.dtype == torch.float16,
        DOT_PRECISION=dot_precision,
        num_warps=num_warps,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    grid = (max(1, num_programs),)
    if plain:  # plain decode (the window layout at T = 1)
        launch(_mamba2_flush_kernel, grid, *tensors, *args, **shapes)
        return
    off_w, off_s, off_d = coef_offsets(buffer_len, window)
    launch(
        _mamba2_flush_window_kernel,
        grid,
        *tensors,
        query_start_loc if query_start_loc is not None else scratch.hp_rows,
        *args,
        WINDOW=window,
        BLOCK_T=window_block(window),
        OFF_W=off_w,
        OFF_S=off_s,
        OFF_D=off_d,
        IS_VARLEN=query_start_loc is not None,
        PRODUCTS=tile_products,
        DOT_T=max(16, window_block(window)),
        **shapes,
    )
