"""Plain-decode flush for Gated DeltaNet (the second launch; `decode.py` runs them).

Runs only over the rows that read HP this step (the plan's HP list): flush rows, and rows
whose LP is stale (a stock-route step wrote HP alone). A persistent grid walks the list's
(row, value head, value tile) items. Per item it reads the HP tile once; a flush row folds
its committed records into it (`_fold`: exact, the delta rule from HP over the cached k, v,
g, β, in WY form with tensor-core products at fp32 accuracy (the serial stock order up to
fp32 reassociation); fold mode, the weighted sum of the cached d), writes
HP and LP from registers and reads out the current token from the new state (an empty
history); a stale row reads out from HP and its history exactly as the readout launch would
from LP. LP never enters HP. It stores d_t (and v_t) at the write row and o_t; the readout
launch skips these rows.
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
from vllm_replayssm.kernels.common.triton_checkpoint import store_lp
from vllm_replayssm.kernels.gdn.plan import (
    T_COEF_ALPHA,
    T_COEF_BETA,
    T_COEF_EXP_GAMMA,
    T_COEF_KQ,
    GDNScratch,
    history_block,
)
from vllm_replayssm.kernels.gdn.tiles import (
    advance_tile,
    readout_tile,
    wy_fold_tile,
)


@triton.jit
def fold_tile(
    S,
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
    EXACT_FLUSH: tl.constexpr,
    BLOCK_L: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The fold (this flush, the window step's flush): S ([BLOCK_V, BLOCK_K] fp32 HP tile)
    advanced over ring entries [fo, fo + fn). DOT_PRECISION "bf16x3" / "tf32x3" / "ieee":
    the WY form with tensor-core products (`tiles.wy_fold_tile`); "serial": record by
    record (`tiles.advance_tile`)."""
    if DOT_PRECISION == "serial":
        return advance_tile(
            S,
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
            EXACT_FLUSH,
        )
    else:
        return wy_fold_tile(
            S,
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
            EXACT_FLUSH,
            BLOCK_L,
            DOT_PRECISION,
        )


@triton.jit
def _history_d(p_rd, o, n, o_j, o_v, m_v, num_ring_rows, stride_rd_row, stride_rd_v):
    """The cached d of a row's history ([BLOCK_L, BLOCK_V] fp32 from fp32 or LP-dtype
    records, zero past its n records): flush rows have n = 0 (coefficients of an empty
    history), stale rows their history."""
    rows = o + o_j
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    return tl.load(
        p_rd + (rows[:, None] * stride_rd_row + o_v[None, :] * stride_rd_v),
        mask=(o_j < n)[:, None] & m_v[None, :],
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _gdn_flush_kernel(
    hp_ptr,
    lp_ptr,
    ring_g_ptr,
    ring_beta_ptr,
    ring_k_ptr,
    ring_d_ptr,
    ring_v_ptr,
    v_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    kq_ptr,
    hp_rows_ptr,
    hp_count_ptr,
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
    stride_v_tok,
    stride_v_head,
    stride_v_v,
    stride_out_tok,
    stride_out_head,
    stride_out_v,
    stride_coef_row,
    stride_coef_head,
    stride_kq_row,
    stride_kq_head,
    stride_kq_which,
    NUM_V_HEADS: tl.constexpr,
    V_PER_K: tl.constexpr,
    TILES_PER_HEAD: tl.constexpr,
    head_k_dim: tl.constexpr,
    head_v_dim: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_L: tl.constexpr,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
    RECOMPUTE_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    items_per_row: tl.constexpr = NUM_V_HEADS * TILES_PER_HEAD
    total = tl.load(hp_count_ptr) * items_per_row
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < head_k_dim
    o_j = tl.arange(0, BLOCK_L)
    for item in tl.range(pid, total, num_programs):
        h = (item % items_per_row) // TILES_PER_HEAD
        hk = h // V_PER_K
        r = tl.load(hp_rows_ptr + item // items_per_row)
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
        coef_k = tl.load(p_coef + o_j)  # zero for a flush row (empty history after the fold)
        coef_q = tl.load(p_coef + BLOCK_L + o_j)
        exp_gam = tl.load(p_coef + 2 * BLOCK_L + T_COEF_EXP_GAMMA)
        alpha = tl.load(p_coef + 2 * BLOCK_L + T_COEF_ALPHA)
        beta = tl.load(p_coef + 2 * BLOCK_L + T_COEF_BETA)
        kq = tl.load(p_coef + 2 * BLOCK_L + T_COEF_KQ)
        p_kq = kq_ptr + r64 * stride_kq_row + hk * stride_kq_head
        kn = tl.load(p_kq + o_k, mask=m_k, other=0.0)
        qn = tl.load(p_kq + stride_kq_which + o_k, mask=m_k, other=0.0)
        o_v = (item % TILES_PER_HEAD) * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < head_v_dim
        m_vk = m_v[:, None] & m_k[None, :]
        v_raw = tl.load(
            v_ptr + r64 * stride_v_tok + h * stride_v_head + o_v * stride_v_v, mask=m_v, other=0.0
        )
        p_hp_head = hp_ptr + slot * stride_hp_slot + h * stride_hp_head
        p_lp_head = lp_ptr + slot * stride_lp_slot + h * stride_lp_head
        p_rg = ring_g_ptr + slot * stride_rg_slot + h * stride_rg_head
        p_rbeta = ring_beta_ptr + slot * stride_rbeta_slot + h * stride_rbeta_head
        p_rk = ring_k_ptr + slot * stride_rk_slot + hk * stride_rk_head
        p_rd = ring_d_ptr + slot * stride_rd_slot + h * stride_rd_head
        p_rv = ring_v_ptr + slot * stride_rv_slot + h * stride_rv_head
        p_hp = p_hp_head + (o_v[:, None] * stride_hp_v + o_k[None, :] * stride_hp_k)
        S = tl.load(p_hp, mask=m_vk, other=0.0)  # [BLOCK_V, BLOCK_K]
        if flush != 0:
            S = fold_tile(
                S,
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
                RECOMPUTE_D,
                BLOCK_L,
                DOT_PRECISION,
            )
            tl.store(p_hp, S, mask=m_vk)
            if HAS_LP:
                store_lp(
                    p_lp_head + (o_v[:, None] * stride_lp_v + o_k[None, :] * stride_lp_k),
                    S,
                    m_vk,
                    LP_IS_FP16,
                )
        d_h = _history_d(p_rd, o, n, o_j, o_v, m_v, num_ring_rows, stride_rd_row, stride_rd_v)
        d_t, o_t = readout_tile(
            S, kn, qn, coef_k, coef_q, d_h, exp_gam, alpha, beta, kq, v_raw.to(tl.float32)
        )
        tl.store(
            out_ptr + r64 * stride_out_tok + h * stride_out_head + o_v * stride_out_v,
            o_t,
            mask=m_v,
        )
        tl.store(p_rd + (write_row * stride_rd_row + o_v * stride_rd_v), d_t, mask=m_v)
        if EXACT_FLUSH:
            tl.store(p_rv + (write_row * stride_rv_row + o_v * stride_rv_v), v_raw, mask=m_v)


def recomputes_d(cache, recompute: bool | int | None) -> bool:
    """Whether the flush recomputes the corrected values from HP (`gdn_flush`'s recompute:
    None recomputes where an LP copy exists); only the exact flush ever does. d records in
    the LP dtype (`config.gdn_d_dtype` "lp") must be recomputed: summing them would put
    their rounding into HP."""
    if recompute is None:
        recompute = cache.lp is not None
    if not recompute and cache.ring_d.dtype != torch.float32:
        raise ValueError(
            f"the d records are {cache.ring_d.dtype}: the flush must recompute them from HP "
            "(flush_recompute 0 sums them into HP, which needs fp32 records)"
        )
    return cache.exact_flush and bool(recompute)


def gdn_flush(
    cache,
    v: torch.Tensor,
    out: torch.Tensor,
    scratch: GDNScratch,
    *,
    num_ring_rows: int,
    buffer_len: int,
    block_v: int,
    num_warps: int,
    num_programs: int,
    dot_precision: str | None = None,
    recompute: bool | None = None,
) -> None:
    """Launch the flush over the plan's HP list (after `gdn_plan`, before or beside
    `gdn_readout`): HP and LP of flush rows written; out [R, Hv, V] and the d (and v)
    records written for the listed rows. v: [R, Hv, V] act; num_programs: the persistent
    grid (any size >= 1). dot_precision of the fold: "bf16x3" (bf16 k records on a GPU;
    the default there), "tf32x3" (the default otherwise: Triton's interpreter multiplies
    bf16 dot operands as raw bits), "ieee", or "serial" (the record-by-record fold).

    recompute (exact flush only): True recomputes the corrected values from HP over the
    cached k, v, g, β (the WY form); False sums the cached d. None (the default) recomputes
    where an LP copy exists and sums the cached d without one: every d was then computed
    from HP and its own history (the readout, the flush and the window step all read HP),
    so the sum is the delta rule from HP up to fp32 reassociation, with one tensor-core
    product instead of three and a substitution. With an LP copy the cached d follow the
    LP read and only the recomputation keeps LP out of HP."""
    if dot_precision is None:
        bf16_records = cache.ring_k.dtype == torch.bfloat16
        dot_precision = "bf16x3" if bf16_records and v.is_cuda else "tf32x3"
    if dot_precision not in ("bf16x3", "tf32x3", "ieee", "serial"):
        raise ValueError(f"unknown dot_precision {dot_precision!r}")
    if dot_precision == "bf16x3" and cache.ring_k.dtype != torch.bfloat16:
        raise ValueError("dot_precision bf16x3 needs bf16 k records")
    recompute = recomputes_d(cache, recompute)
    Hv, V = v.shape[1], v.shape[2]
    Hk, K = scratch.kq.shape[1], scratch.kq.shape[3]
    lp = cache.lp if cache.lp is not None else cache.hp
    beta = cache.ring_beta if cache.ring_beta is not None else cache.ring_g
    ring_v = cache.ring_v if cache.ring_v is not None else cache.ring_d
    tiles = cdiv(V, block_v)
    launch(
        _gdn_flush_kernel,
        (max(1, num_programs),),
        cache.hp,
        lp,
        cache.ring_g,
        beta,
        cache.ring_k,
        cache.ring_d,
        ring_v,
        v,
        out,
        scratch.plan,
        scratch.coef,
        scratch.kq,
        scratch.hp_rows,
        scratch.hp_count,
        num_ring_rows,
        *cache.hp.stride(),
        *lp.stride(),
        *cache.ring_g.stride(),
        *beta.stride(),
        *cache.ring_k.stride(),
        *cache.ring_d.stride(),
        *ring_v.stride(),
        *v.stride(),
        *out.stride(),
        scratch.coef.stride(0),
        scratch.coef.stride(1),
        *scratch.kq.stride()[:3],
        NUM_V_HEADS=Hv,
        V_PER_K=Hv // Hk,
        TILES_PER_HEAD=tiles,
        head_k_dim=K,
        head_v_dim=V,
        BLOCK_V=block_v,
        BLOCK_K=pow2_block(K),
        BLOCK_L=history_block(buffer_len),
        HAS_LP=cache.lp is not None,
        LP_IS_FP16=cache.lp is not None and cache.lp.dtype == torch.float16,
        EXACT_FLUSH=cache.exact_flush,
        RECOMPUTE_D=recompute,
        DOT_PRECISION=dot_precision,
        num_warps=num_warps,
    )
