"""Triton Mamba-2 ReplaySSM step for speculative windows (T = 1 + k tokens per row): one
launch per layer and step. Plain decode (T = 1) runs the plan / flush / readout launches of
`decode.py` instead; this kernel serves speculative decoding until those launches gain a
window specialisation.

One program per (headdim tile, group, row), looping over the group's heads: the cursor plan,
the ring's B records and their dot products with the window's C are computed once per
program and shared by the heads. Per head it either folds the committed entries into HP
(flush rows: HP and LP written, the folded state kept in registers) or reads LP (HP when LP
is off), reads out every window token from checkpoint + ring history + window, and appends
the window's records. The row's last program stores the new cursor words. No host
synchronisation, no allocation, launch shape fixed by the batch: safe in CUDA graphs.
Semantics: `reference.mamba2_replay_decode`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import pow2_block
from vllm_replayssm.kernels.common.triton_checkpoint import store_lp
from vllm_replayssm.kernels.common.triton_cursor import finish_row, plan_row, row_tokens, softplus
from vllm_replayssm.kernels.mamba2.tiles import fold_tile
from vllm_replayssm.layout import Mamba2ReplayCache, ring_rows


@triton.jit
def _fold_head(
    hp_base,
    off_hp,
    lp_base,
    off_lp,
    p_rdt,
    p_rx,
    p_rB,
    A,
    fo,
    fn,
    num_ring_rows,
    o_p,
    o_n,
    m_p,
    m_n,
    m_pn,
    stride_rdt_row,
    stride_rx_row,
    stride_rx_dim,
    stride_rB_row,
    stride_rB_dstate,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
):
    """Fold ring entries [fo, fo + fn) of one head into its HP tile; write HP and LP; return
    the folded tile (fp32)."""
    S = fold_tile(
        tl.load(hp_base + off_hp, mask=m_pn, other=0.0),
        p_rdt,
        p_rx,
        p_rB,
        A,
        fo,
        fn,
        num_ring_rows,
        o_p,
        o_n,
        m_p,
        m_n,
        stride_rdt_row,
        stride_rx_row,
        stride_rx_dim,
        stride_rB_row,
        stride_rB_dstate,
    )
    tl.store(hp_base + off_hp, S, mask=m_pn)
    if HAS_LP:
        store_lp(lp_base + off_lp, S, m_pn, LP_IS_FP16)
    return S


@triton.jit
def _dot_window(S, c_w, o_t, WINDOW: tl.constexpr):
    """[BLOCK_T, BLOCK_P] = S . C_i for the window's tokens (S dies here: only this small
    tile stays live in the readout)."""
    sc = tl.zeros([c_w.shape[0], S.shape[0]], dtype=tl.float32)
    for i in tl.static_range(WINDOW):
        c_i = tl.sum(tl.where(o_t[:, None] == i, c_w, 0.0), axis=0)
        sc = tl.where(o_t[:, None] == i, tl.sum(S * c_i[None, :], axis=1)[None, :], sc)
    return sc


@triton.jit
def _load_checkpoint(hp_base, off_hp, lp_base, off_lp, m_pn, HAS_LP: tl.constexpr):
    if HAS_LP:
        S = tl.load(lp_base + off_lp, mask=m_pn, other=0.0).to(tl.float32)
    else:
        S = tl.load(hp_base + off_hp, mask=m_pn, other=0.0)
    return S


@triton.jit
def _mamba2_window_kernel(
    hp_ptr,
    lp_ptr,
    ring_dt_ptr,
    ring_x_ptr,
    ring_B_ptr,
    meta_ptr,
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    dt_bias_ptr,
    state_indices_ptr,
    qsl_ptr,
    acc_ptr,
    out_ptr,
    null_block_id,
    heads_per_group,
    num_programs_per_row,
    num_ring_rows,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_dim,
    stride_hp_dstate,
    stride_lp_slot,
    stride_lp_head,
    stride_lp_dim,
    stride_lp_dstate,
    stride_rdt_slot,
    stride_rdt_head,
    stride_rdt_row,
    stride_rx_slot,
    stride_rx_head,
    stride_rx_row,
    stride_rx_dim,
    stride_rB_slot,
    stride_rB_group,
    stride_rB_row,
    stride_rB_dstate,
    stride_meta_slot,
    stride_meta_word,
    stride_x_tok,
    stride_x_head,
    stride_x_dim,
    stride_dt_tok,
    stride_dt_head,
    stride_B_tok,
    stride_B_group,
    stride_B_dstate,
    stride_C_tok,
    stride_C_group,
    stride_C_dstate,
    stride_out_tok,
    stride_out_head,
    stride_out_dim,
    headdim: tl.constexpr,
    dstate: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_ACC: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid_p = tl.program_id(0)
    pid_hb = tl.program_id(1).to(tl.int64)
    pid_r = tl.program_id(2).to(tl.int64)
    bos, q = row_tokens(qsl_ptr, pid_r, IS_VARLEN)
    o_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    m_p = o_p < headdim
    h0 = pid_hb * HEADS_PER_PROGRAM
    pid_g = h0 // heads_per_group
    slot = tl.load(state_indices_ptr + pid_r).to(tl.int64)
    if slot == null_block_id:
        for h in range(h0, h0 + HEADS_PER_PROGRAM):
            for i in tl.static_range(WINDOW):
                p_out = out_ptr + (bos + i) * stride_out_tok + h * stride_out_head
                tl.store(
                    p_out + o_p * stride_out_dim,
                    tl.zeros([BLOCK_P], dtype=tl.float32),
                    mask=m_p & (i < q),
                )
        return

    p_meta = meta_ptr + slot * stride_meta_slot
    o, n, kap, fo, fn, flush, stale = plan_row(
        p_meta, stride_meta_word, acc_ptr, pid_r, q, num_ring_rows, WINDOW, HAS_ACC
    )
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    m_pn = m_p[:, None] & m_n[None, :]
    # int32 offsets inside a head's tile; pointers are formed where they are used.
    off_hp = (o_p[:, None] * stride_hp_dim + o_n[None, :] * stride_hp_dstate).to(tl.int32)
    off_lp = (o_p[:, None] * stride_lp_dim + o_n[None, :] * stride_lp_dstate).to(tl.int32)
    o_t = tl.arange(0, BLOCK_T)
    o_h = tl.arange(0, BLOCK_H)
    # The committed history (< L entries, empty after a flush) at the post-flush origin.
    m_hist = o_h < n
    row_h = (o + o_h) % num_ring_rows
    p_rB = ring_B_ptr + slot * stride_rB_slot + pid_g * stride_rB_group

    # Group-shared dot products: bc_h[i, j] = B_j . C_i (history), bc_w[i, j] = B_j . C_i.
    B_h = tl.load(
        p_rB + row_h[:, None] * stride_rB_row + o_n[None, :] * stride_rB_dstate,
        mask=m_hist[:, None] & m_n[None, :],
        other=0.0,
    ).to(tl.float32)
    c_w = tl.load(
        C_ptr
        + (bos + o_t[:, None]) * stride_C_tok
        + pid_g * stride_C_group
        + o_n[None, :] * stride_C_dstate,
        mask=(o_t < q)[:, None] & m_n[None, :],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_T, BLOCK_N]
    bc_h = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    bc_w = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
    for i in tl.static_range(WINDOW):
        c_i = tl.sum(tl.where(o_t[:, None] == i, c_w, 0.0), axis=0)
        bc_h = tl.where(o_t[:, None] == i, tl.sum(B_h * c_i[None, :], axis=1)[None, :], bc_h)
        for j in tl.static_range(i + 1):
            B_l = tl.load(
                B_ptr + (bos + j) * stride_B_tok + pid_g * stride_B_group + o_n * stride_B_dstate,
                mask=m_n & (i < q),
                other=0.0,
            )
            bc_w = tl.where(
                (o_t[:, None] == i) & (o_t[None, :] == j),
                tl.sum(B_l.to(tl.float32) * c_i, axis=0),
                bc_w,
            )
            if j == i:  # noqa: SIM102 (constexpr, then runtime)
                if (pid_p == 0) & (h0 % heads_per_group == 0):  # append B_i once per group
                    tl.store(
                        p_rB + (o + n + i) % num_ring_rows * stride_rB_row + o_n * stride_rB_dstate,
                        B_l,
                        mask=m_n & (i < q),
                    )

    for h in tl.range(h0, h0 + HEADS_PER_PROGRAM, num_stages=NUM_STAGES):
        A = tl.load(A_ptr + h).to(tl.float32)
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
        p_rdt = ring_dt_ptr + slot * stride_rdt_slot + h * stride_rdt_head
        p_rx = ring_x_ptr + slot * stride_rx_slot + h * stride_rx_head
        hp_h = hp_ptr + slot * stride_hp_slot + h * stride_hp_head
        lp_h = lp_ptr + slot * stride_lp_slot + h * stride_lp_head
        # sc[i] = checkpoint . C_i; the checkpoint tile is dead after this. Flush rows use
        # the folded HP in registers; rows whose LP is stale (a stock-route step) read HP;
        # the others read LP (or HP).
        if flush:
            sc = _dot_window(
                _fold_head(
                    hp_h,
                    off_hp,
                    lp_h,
                    off_lp,
                    p_rdt,
                    p_rx,
                    p_rB,
                    A,
                    fo,
                    fn,
                    num_ring_rows,
                    o_p,
                    o_n,
                    m_p,
                    m_n,
                    m_pn,
                    stride_rdt_row,
                    stride_rx_row,
                    stride_rx_dim,
                    stride_rB_row,
                    stride_rB_dstate,
                    HAS_LP,
                    LP_IS_FP16,
                ),
                c_w,
                o_t,
                WINDOW,
            )
        elif stale:
            sc = _dot_window(tl.load(hp_h + off_hp, mask=m_pn, other=0.0), c_w, o_t, WINDOW)
        else:
            sc = _dot_window(
                _load_checkpoint(hp_h, off_hp, lp_h, off_lp, m_pn, HAS_LP), c_w, o_t, WINDOW
            )
        dt_h = tl.load(p_rdt + row_h * stride_rdt_row, mask=m_hist, other=0.0)
        lam_h = tl.cumsum(dt_h, axis=0)
        lam_n = tl.sum(dt_h, axis=0)
        x_h = tl.load(
            p_rx + row_h[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
            mask=m_hist[:, None] & m_p[None, :],
            other=0.0,
        ).to(tl.float32)
        if HAS_D:
            D = tl.load(D_ptr + h).to(tl.float32)
        # Window token i at logical n + i: checkpoint + history + window tokens 0..i.
        lam_i = lam_n
        for i in tl.static_range(WINDOW):
            tok_i = bos + i
            live_i = i < q
            dt_i = softplus(
                tl.load(
                    dt_ptr + tok_i * stride_dt_tok + h * stride_dt_head, mask=live_i, other=0.0
                ).to(tl.float32)
                + dt_bias
            )
            lam_i += dt_i
            bc_hi = tl.sum(tl.where(o_t[:, None] == i, bc_h, 0.0), axis=0)  # [BLOCK_H]
            w_h = (
                tl.where(m_hist, dt_h * tl.exp(tl.where(m_hist, A * (lam_i - lam_h), 0.0)), 0.0)
                * bc_hi
            )
            y = tl.sum(tl.where(o_t[:, None] == i, sc, 0.0), axis=0) * tl.exp(A * lam_i)
            y += tl.sum(w_h[:, None] * x_h, axis=0)
            lam_l = lam_n
            for j in tl.static_range(i + 1):
                tok_l = bos + j
                dt_l = softplus(
                    tl.load(
                        dt_ptr + tok_l * stride_dt_tok + h * stride_dt_head, mask=live_i, other=0.0
                    ).to(tl.float32)
                    + dt_bias
                )
                lam_l += dt_l
                x_l = tl.load(
                    x_ptr + tok_l * stride_x_tok + h * stride_x_head + o_p * stride_x_dim,
                    mask=m_p & live_i,
                    other=0.0,
                )
                bc_il = tl.sum(
                    tl.sum(tl.where((o_t[:, None] == i) & (o_t[None, :] == j), bc_w, 0.0), axis=1),
                    axis=0,
                )
                y += (dt_l * tl.exp(A * (lam_i - lam_l)) * bc_il) * x_l.to(tl.float32)
                if j == i:
                    if HAS_D:
                        y += D * x_l.to(tl.float32)
                    row_i = (o + n + i) % num_ring_rows
                    tl.store(
                        p_rx + row_i * stride_rx_row + o_p * stride_rx_dim, x_l, mask=m_p & live_i
                    )
                    if pid_p == 0:
                        tl.store(p_rdt + row_i * stride_rdt_row, dt_l, mask=live_i)
            p_out = out_ptr + tok_i * stride_out_tok + h * stride_out_head
            tl.store(p_out + o_p * stride_out_dim, y, mask=m_p & live_i)
    finish_row(p_meta, stride_meta_word, num_programs_per_row, o, n, q, kap, fo, fn, stale)


def mamba2_window_decode(
    cache: Mamba2ReplayCache,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    query_start_loc: torch.Tensor | None,
    num_accepted_tokens: torch.Tensor | None,
    null_block_id: int,
    block_p: int = 16,
    num_warps: int = 1,
    heads_per_program: int = 1,
    num_stages: int = 1,
) -> None:
    """Launch the window step. Arguments and effects as `reference.mamba2_replay_decode`
    (checked by the caller, `decode.mamba2_replay_decode`); heads_per_program divides the
    heads per group (the heads one program loops over), num_stages pipelines that loop."""
    H, P = x.shape[1], x.shape[2]
    G, N = B.shape[1], B.shape[2]
    R = state_indices.shape[0]
    if (H // G) % heads_per_program:
        raise ValueError(
            f"heads_per_program={heads_per_program} must divide the {H // G} heads per group"
        )
    grid = (triton.cdiv(P, block_p), H // heads_per_program, R)
    lp = cache.lp if cache.lp is not None else cache.hp
    _mamba2_window_kernel[grid](
        cache.hp,
        lp,
        cache.ring_dt,
        cache.ring_x,
        cache.ring_B,
        cache.meta,
        x,
        dt,
        A,
        B,
        C,
        D if D is not None else A,
        dt_bias,
        state_indices,
        query_start_loc if query_start_loc is not None else state_indices,
        num_accepted_tokens if num_accepted_tokens is not None else state_indices,
        out,
        null_block_id,
        H // G,
        grid[0] * grid[1],
        ring_rows(buffer_len, window),
        *cache.hp.stride(),
        *lp.stride(),
        *cache.ring_dt.stride(),
        *cache.ring_x.stride(),
        *cache.ring_B.stride(),
        *cache.meta.stride(),
        *x.stride(),
        *dt.stride(),
        *B.stride(),
        *C.stride(),
        *out.stride(),
        headdim=P,
        dstate=N,
        WINDOW=window,
        BLOCK_T=pow2_block(window, 1),
        BLOCK_P=block_p,
        BLOCK_N=pow2_block(N),
        BLOCK_H=pow2_block(buffer_len),
        HAS_LP=cache.lp is not None,
        LP_IS_FP16=cache.lp is not None and cache.lp.dtype == torch.float16,
        HAS_D=D is not None,
        HAS_ACC=num_accepted_tokens is not None,
        IS_VARLEN=query_start_loc is not None,
        HEADS_PER_PROGRAM=heads_per_program,
        NUM_STAGES=num_stages,
        num_warps=num_warps,
    )
