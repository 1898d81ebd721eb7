"""Plain-decode readout for Gated DeltaNet (the third launch; `decode.py` runs them).

One one-warp program per (row, TILES value tiles of one key head) of BLOCK_V x K checkpoint
elements each (about 8 KiB: 16 x 128 fp32 HP or 32 x 128 bf16/fp16 LP):

    u = e^{Γn}(S0·k_t) + Σ_j a_j d_j,   w = e^{Γn}(S0·q_t) + Σ_j b_j d_j,
    d_t = β_t(v_t − α_t u),   o_t = α_t w + (k_t·q_t) d_t

with the coefficients and the normalised k_t / q_t from the plan and d_j the cached fp32
corrected values of this head and tile (`tiles.readout_tile`). The plan row and the key
head's k_t / q_t load once per program; the tiles run in a `tl.range` loop, not pipelined
(pipelined, with cp.async loads into shared memory, it measured 15-27% slower on the H200:
kernels README). Each tile stores d_t (and, for the exact flush, v_t) at the row's write
row and o_t. Rows that read HP (flush rows, stale LP) are left to the flush launch, which
may run at the same time (the two touch different rows). The row's first program stores
the row's new cursor words from the plan row. No atomics, no barriers across warps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import auto_readout_tiles, cdiv, pow2_block
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
from vllm_replayssm.kernels.gdn.plan import (
    T_COEF_ALPHA,
    T_COEF_BETA,
    T_COEF_EXP_GAMMA,
    T_COEF_KQ,
    GDNScratch,
    history_block,
)
from vllm_replayssm.kernels.gdn.tiles import readout_tile

# readout_tiles=0 takes at most this many tiles per program: at bs 256 four beat eight
# (`kernels-h200-20261203-fa40548-gdn-plain-readout-loop.json`; 122B bf16 LP 240.6 against
# 245.9 µs per layer and step, HP only 330.3 against 334.9).
MAX_TILES = 4


@triton.jit
def _gdn_readout_kernel(
    ckpt_ptr,
    ring_d_ptr,
    ring_v_ptr,
    meta_ptr,
    v_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    kq_ptr,
    null_block_id,
    num_ring_rows,
    stride_ck_slot,
    stride_ck_head,
    stride_ck_v,
    stride_ck_k,
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
    stride_coef_row,
    stride_coef_head,
    stride_kq_row,
    stride_kq_head,
    stride_kq_which,
    V_PER_K: tl.constexpr,
    TILES_PER_HEAD: tl.constexpr,
    head_k_dim: tl.constexpr,
    head_v_dim: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_L: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
    TILES: tl.constexpr,
):
    pid = tl.program_id(0)
    r = tl.program_id(1)
    t0 = pid * TILES  # the program's first tile (all its tiles of one key head)
    hk = t0 // (V_PER_K * TILES_PER_HEAD)
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < head_k_dim
    o_j = tl.arange(0, BLOCK_L)
    r64 = r.to(tl.int64)

    p_plan = plan_ptr + r * T_PLAN_LEN
    slot32 = tl.load(p_plan + T_PLAN_SLOT)
    o = tl.load(p_plan + T_PLAN_ORIGIN)
    n = tl.load(p_plan + T_PLAN_COUNT)
    write_row = tl.load(p_plan + T_PLAN_WRITE_ROW)
    read_hp = tl.load(p_plan + T_PLAN_READ_HP)
    p_kq = kq_ptr + r64 * stride_kq_row + hk * stride_kq_head + o_k
    kn = tl.load(p_kq, mask=m_k, other=0.0)
    qn = tl.load(p_kq + stride_kq_which, mask=m_k, other=0.0)

    if pid == 0:
        store_cursor_words(
            p_plan, meta_ptr, slot32, null_block_id, stride_meta_slot, stride_meta_word
        )
    if slot32 == null_block_id:
        for i in tl.static_range(TILES):
            h = (t0 + i) // TILES_PER_HEAD
            o_v = ((t0 + i) % TILES_PER_HEAD) * BLOCK_V + tl.arange(0, BLOCK_V)
            p_out = out_ptr + r64 * stride_out_tok + h * stride_out_head + o_v * stride_out_v
            tl.store(p_out, tl.zeros([BLOCK_V], dtype=tl.float32), mask=o_v < head_v_dim)
        return
    if read_hp != 0:
        return
    slot = slot32.to(tl.int64)
    rows = o + o_j
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    for i in tl.range(TILES, num_stages=1):
        h = (t0 + i) // TILES_PER_HEAD
        o_v = ((t0 + i) % TILES_PER_HEAD) * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < head_v_dim
        p_coef = coef_ptr + r64 * stride_coef_row + h * stride_coef_head
        coef_k = tl.load(p_coef + o_j)
        coef_q = tl.load(p_coef + BLOCK_L + o_j)
        exp_gam = tl.load(p_coef + 2 * BLOCK_L + T_COEF_EXP_GAMMA)
        alpha = tl.load(p_coef + 2 * BLOCK_L + T_COEF_ALPHA)
        beta = tl.load(p_coef + 2 * BLOCK_L + T_COEF_BETA)
        kq = tl.load(p_coef + 2 * BLOCK_L + T_COEF_KQ)
        v_raw = tl.load(
            v_ptr + r64 * stride_v_tok + h * stride_v_head + o_v * stride_v_v,
            mask=m_v,
            other=0.0,
        )
        S0 = tl.load(
            ckpt_ptr
            + slot * stride_ck_slot
            + h * stride_ck_head
            + (o_v[:, None] * stride_ck_v + o_k[None, :] * stride_ck_k),
            mask=m_v[:, None] & m_k[None, :],
            other=0.0,
        )  # [BLOCK_V, BLOCK_K]
        p_rd = ring_d_ptr + slot * stride_rd_slot + h * stride_rd_head
        d_h = tl.load(
            p_rd + (rows[:, None] * stride_rd_row + o_v[None, :] * stride_rd_v),
            mask=(o_j < n)[:, None] & m_v[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_L, BLOCK_V] (records fp32 or the LP dtype)
        d_t, o_t = readout_tile(
            S0.to(tl.float32),
            kn,
            qn,
            coef_k,
            coef_q,
            d_h,
            exp_gam,
            alpha,
            beta,
            kq,
            v_raw.to(tl.float32),
        )
        tl.store(
            out_ptr + r64 * stride_out_tok + h * stride_out_head + o_v * stride_out_v,
            o_t,
            mask=m_v,
        )
        tl.store(p_rd + (write_row * stride_rd_row + o_v * stride_rd_v), d_t, mask=m_v)
        if EXACT_FLUSH:
            tl.store(
                ring_v_ptr
                + slot * stride_rv_slot
                + h * stride_rv_head
                + (write_row * stride_rv_row + o_v * stride_rv_v),
                v_raw,
                mask=m_v,
            )


def gdn_readout(
    cache,
    v: torch.Tensor,
    out: torch.Tensor,
    scratch: GDNScratch,
    *,
    num_ring_rows: int,
    buffer_len: int,
    null_block_id: int,
    block_v: int,
    num_warps: int,
    readout_tiles: int = 1,
) -> None:
    """Launch the readout for R rows after `gdn_plan` (alongside `gdn_flush`).

    readout_tiles: value tiles per program (0: `blocks.auto_readout_tiles`, at most
    MAX_TILES); it must divide a key head's V_PER_K * cdiv(V, block_v) tiles.

    Reads LP (HP when LP is off), the ring_d history and the plan; writes out [R, Hv, V]
    for rows that read neither HP nor a NULL slot (zeros for NULL rows), their d (and v)
    records and every row's cursor words. v: [R, Hv, V] act.
    """
    R, Hv, V = v.shape
    Hk, K = scratch.kq.shape[1], scratch.kq.shape[3]
    ckpt = cache.lp if cache.lp is not None else cache.hp
    ring_v = cache.ring_v if cache.ring_v is not None else cache.ring_d
    tiles = cdiv(V, block_v)
    key_head_tiles = Hv // Hk * tiles
    if readout_tiles == 0:
        readout_tiles = auto_readout_tiles(key_head_tiles, Hv * tiles * R, max_tiles=MAX_TILES)
    if readout_tiles < 1 or key_head_tiles % readout_tiles:
        raise ValueError(
            f"readout_tiles must divide a key head's {key_head_tiles} value tiles, "
            f"got {readout_tiles}"
        )
    launch(
        _gdn_readout_kernel,
        (Hv * tiles // readout_tiles, R),
        ckpt,
        cache.ring_d,
        ring_v,
        cache.meta,
        v,
        out,
        scratch.plan,
        scratch.coef,
        scratch.kq,
        null_block_id,
        num_ring_rows,
        *ckpt.stride(),
        *cache.ring_d.stride(),
        *ring_v.stride(),
        *cache.meta.stride(),
        *v.stride(),
        *out.stride(),
        scratch.coef.stride(0),
        scratch.coef.stride(1),
        *scratch.kq.stride()[:3],
        V_PER_K=Hv // Hk,
        TILES_PER_HEAD=tiles,
        head_k_dim=K,
        head_v_dim=V,
        BLOCK_V=block_v,
        BLOCK_K=pow2_block(K),
        BLOCK_L=history_block(buffer_len),
        EXACT_FLUSH=cache.exact_flush,
        TILES=readout_tiles,
        num_warps=num_warps,
    )
