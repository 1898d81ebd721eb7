"""Triton Mamba-2 ReplaySSM decode: one launch per layer and step, plain or speculative.

One program per (headdim tile, head, row). It plans the row's cursor (every program of the
row derives the same plan), then either folds the committed ring entries into HP (flush
rows: HP and LP written, the folded state kept in registers) or reads LP (HP when LP is
off), reads out every window token from checkpoint + ring history + window, and appends the
window's records. The row's last program stores the new cursor words. No host
synchronisation, no allocation, launch shape fixed by the batch: safe in CUDA graphs.
Semantics: `reference.mamba2_replay_decode`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.cursor import ring_rows
from vllm_replayssm.kernels.common.triton_cursor import finish_row, plan_row, row_tokens, softplus
from vllm_replayssm.layout import Mamba2ReplayCache

NULL_BLOCK_ID = 0
FP16_MAX = 65504.0


@triton.jit
def _mamba2_replay_decode_kernel(
    hp_ptr, lp_ptr, ring_dt_ptr, ring_x_ptr, ring_B_ptr, meta_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dt_bias_ptr,
    state_indices_ptr, qsl_ptr, acc_ptr, out_ptr,
    null_block_id, headdim, dstate, heads_per_group, num_programs_per_row, C,
    stride_hp_slot, stride_hp_head, stride_hp_dim, stride_hp_dstate,
    stride_lp_slot, stride_lp_head, stride_lp_dim, stride_lp_dstate,
    stride_rdt_slot, stride_rdt_head, stride_rdt_row,
    stride_rx_slot, stride_rx_head, stride_rx_row, stride_rx_dim,
    stride_rB_slot, stride_rB_group, stride_rB_row, stride_rB_dstate,
    stride_meta_slot, stride_meta_word,
    stride_x_tok, stride_x_head, stride_x_dim,
    stride_dt_tok, stride_dt_head,
    stride_B_tok, stride_B_group, stride_B_dstate,
    stride_C_tok, stride_C_group, stride_C_dstate,
    stride_out_tok, stride_out_head, stride_out_dim,
    T: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    HAS_LP: tl.constexpr, LP_IS_FP16: tl.constexpr, HAS_D: tl.constexpr,
    HAS_ACC: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_p = tl.program_id(0)
    pid_h = tl.program_id(1).to(tl.int64)
    pid_r = tl.program_id(2).to(tl.int64)
    bos, q = row_tokens(qsl_ptr, pid_r, IS_VARLEN)
    o_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    m_p = o_p < headdim
    slot = tl.load(state_indices_ptr + pid_r).to(tl.int64)
    if slot == null_block_id:
        for i in tl.static_range(T):
            p_out = out_ptr + (bos + i) * stride_out_tok + pid_h * stride_out_head
            tl.store(p_out + o_p * stride_out_dim, tl.zeros([BLOCK_P], dtype=tl.float32),
                     mask=m_p & (i < q))
        return

    p_meta = meta_ptr + slot * stride_meta_slot
    o, n, kap, fo, fn, flush = plan_row(p_meta, stride_meta_word, acc_ptr, pid_r, q, C, T,
                                        HAS_ACC)
    g = pid_h // heads_per_group
    A = tl.load(A_ptr + pid_h).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + pid_h).to(tl.float32)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    o_c = tl.arange(0, BLOCK_C)
    m_pn = m_p[:, None] & m_n[None, :]

    p_rdt = ring_dt_ptr + slot * stride_rdt_slot + pid_h * stride_rdt_head
    p_rx = ring_x_ptr + slot * stride_rx_slot + pid_h * stride_rx_head
    p_rB = ring_B_ptr + slot * stride_rB_slot + g * stride_rB_group
    p_hp = (hp_ptr + slot * stride_hp_slot + pid_h * stride_hp_head
            + o_p[:, None] * stride_hp_dim + o_n[None, :] * stride_hp_dstate)

    # Checkpoint: fold [fo, fo + fn) into HP on a flush, else read LP (or HP).
    if flush:
        f_row = (fo + o_c) % C
        m_f = o_c < fn
        dt_f = tl.load(p_rdt + f_row * stride_rdt_row, mask=m_f, other=0.0)
        lam_f = tl.cumsum(dt_f, axis=0)
        lam_tot = tl.sum(dt_f, axis=0)
        w_f = tl.where(m_f, dt_f * tl.exp(A * (lam_tot - lam_f)), 0.0)
        x_f = tl.load(p_rx + f_row[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
                      mask=m_f[:, None] & m_p[None, :], other=0.0).to(tl.float32)
        B_f = tl.load(p_rB + f_row[:, None] * stride_rB_row + o_n[None, :] * stride_rB_dstate,
                      mask=m_f[:, None] & m_n[None, :], other=0.0).to(tl.float32)
        xw = tl.trans(x_f * w_f[:, None])  # [BLOCK_P, BLOCK_C]
        S = tl.load(p_hp, mask=m_pn, other=0.0) * tl.exp(A * lam_tot)
        S = tl.dot(xw, B_f, acc=S, input_precision=DOT_PRECISION)  # [BLOCK_P, BLOCK_N]
        tl.store(p_hp, S, mask=m_pn)
        if HAS_LP:
            S_lp = S
            if LP_IS_FP16:
                S_lp = tl.minimum(tl.maximum(S, -65504.0), 65504.0)
            p_lp = (lp_ptr + slot * stride_lp_slot + pid_h * stride_lp_head
                    + o_p[:, None] * stride_lp_dim + o_n[None, :] * stride_lp_dstate)
            tl.store(p_lp, S_lp.to(lp_ptr.dtype.element_ty), mask=m_pn)
    else:
        if HAS_LP:
            p_lp = (lp_ptr + slot * stride_lp_slot + pid_h * stride_lp_head
                    + o_p[:, None] * stride_lp_dim + o_n[None, :] * stride_lp_dstate)
            S = tl.load(p_lp, mask=m_pn, other=0.0).to(tl.float32)
        else:
            S = tl.load(p_hp, mask=m_pn, other=0.0)

    # Entries in logical order: committed history [0, n) from the ring, then the window.
    row_c = (o + o_c) % C
    is_hist = o_c < n
    is_win = (o_c >= n) & (o_c < n + q)
    tok_c = bos + tl.maximum(o_c - n, 0)
    dt_h = tl.load(p_rdt + row_c * stride_rdt_row, mask=is_hist, other=0.0)
    dt_w = tl.load(dt_ptr + tok_c * stride_dt_tok + pid_h * stride_dt_head, mask=is_win,
                   other=0.0).to(tl.float32)
    dt_c = tl.where(is_hist, dt_h, tl.where(is_win, softplus(dt_w + dt_bias), 0.0))
    lam = tl.cumsum(dt_c, axis=0)
    X = (tl.load(p_rx + row_c[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
                 mask=is_hist[:, None] & m_p[None, :], other=0.0).to(tl.float32)
         + tl.load(x_ptr + tok_c[:, None] * stride_x_tok + pid_h * stride_x_head
                   + o_p[None, :] * stride_x_dim,
                   mask=is_win[:, None] & m_p[None, :], other=0.0).to(tl.float32))
    Bm = (tl.load(p_rB + row_c[:, None] * stride_rB_row + o_n[None, :] * stride_rB_dstate,
                  mask=is_hist[:, None] & m_n[None, :], other=0.0).to(tl.float32)
          + tl.load(B_ptr + tok_c[:, None] * stride_B_tok + g * stride_B_group
                    + o_n[None, :] * stride_B_dstate,
                    mask=is_win[:, None] & m_n[None, :], other=0.0).to(tl.float32))

    # Readout of window token i (logical m = n + i).
    if HAS_D:
        D = tl.load(D_ptr + pid_h).to(tl.float32)
    for i in tl.static_range(T):
        m = n + i
        lam_m = tl.sum(tl.where(o_c == m, lam, 0.0), axis=0)
        c_i = tl.load(C_ptr + (bos + i) * stride_C_tok + g * stride_C_group
                      + o_n * stride_C_dstate, mask=m_n & (i < q), other=0.0).to(tl.float32)
        bc = tl.sum(Bm * c_i[None, :], axis=1)  # [BLOCK_C]: B_j . C_i
        upto = o_c <= m
        w = tl.where(upto, dt_c * tl.exp(tl.where(upto, A * (lam_m - lam), 0.0)) * bc, 0.0)
        y = tl.sum(w[:, None] * X, axis=0) + tl.sum(S * c_i[None, :], axis=1) * tl.exp(A * lam_m)
        if HAS_D:
            y += D * tl.sum(tl.where((o_c == m)[:, None], X, 0.0), axis=0)
        p_out = out_ptr + (bos + i) * stride_out_tok + pid_h * stride_out_head
        tl.store(p_out + o_p * stride_out_dim, y, mask=m_p & (i < q))

    # Append the window's records (fold rows and history rows are never these rows).
    tl.store(p_rx + row_c[:, None] * stride_rx_row + o_p[None, :] * stride_rx_dim,
             X.to(ring_x_ptr.dtype.element_ty), mask=is_win[:, None] & m_p[None, :])
    if pid_p == 0:
        tl.store(p_rdt + row_c * stride_rdt_row, dt_c, mask=is_win)
        if pid_h % heads_per_group == 0:
            tl.store(p_rB + row_c[:, None] * stride_rB_row + o_n[None, :] * stride_rB_dstate,
                     Bm.to(ring_B_ptr.dtype.element_ty), mask=is_win[:, None] & m_n[None, :])
    finish_row(p_meta, stride_meta_word, num_programs_per_row, o, n, q, kap, fo, fn)


def _pow2(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(x))


def default_block_p(headdim: int, num_rows: int) -> int:
    """Headdim tile: whole heads at large batch (B and C reused across the tile), smaller
    tiles at small batch so that enough programs are in flight."""
    if num_rows <= 8:
        return 16
    return min(_pow2(headdim), 64)


def mamba2_replay_decode(
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
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    null_block_id: int = NULL_BLOCK_ID,
    block_p: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Triton twin of `reference.mamba2_replay_decode` (same arguments and effects).

    block_p / num_warps override the launch configuration (benchmarks, tuning).
    """
    H, P = x.shape[1], x.shape[2]
    G, N = B.shape[1], B.shape[2]
    R = state_indices.shape[0]
    Cn = ring_rows(buffer_len, window)
    _check(cache, x, dt, A, B, C, D, dt_bias, state_indices, out, Cn, query_start_loc,
           num_accepted_tokens, R)
    if R == 0:
        return
    bp = block_p or default_block_p(P, R)
    grid = (triton.cdiv(P, bp), H, R)
    lp = cache.lp if cache.lp is not None else cache.hp
    interp = x.device.type != "cuda"
    _mamba2_replay_decode_kernel[grid](
        cache.hp, lp, cache.ring_dt, cache.ring_x, cache.ring_B, cache.meta,
        x, dt, A, B, C, D if D is not None else A, dt_bias,
        state_indices, query_start_loc if query_start_loc is not None else state_indices,
        num_accepted_tokens if num_accepted_tokens is not None else state_indices, out,
        null_block_id, P, N, H // G, grid[0] * H, Cn,
        *cache.hp.stride(), *lp.stride(), *cache.ring_dt.stride(), *cache.ring_x.stride(),
        *cache.ring_B.stride(), *cache.meta.stride(),
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *out.stride(),
        T=window, BLOCK_P=bp, BLOCK_N=_pow2(N), BLOCK_C=_pow2(Cn),
        HAS_LP=cache.lp is not None,
        LP_IS_FP16=cache.lp is not None and cache.lp.dtype == torch.float16,
        HAS_D=D is not None, HAS_ACC=num_accepted_tokens is not None,
        IS_VARLEN=query_start_loc is not None,
        DOT_PRECISION="ieee" if interp else "tf32x3",
        num_warps=num_warps or (4 if bp <= 16 else 8),
    )


def _check(cache, x, dt, A, B, C, D, dt_bias, state_indices, out, Cn, qsl, acc, R) -> None:
    H, P = x.shape[1], x.shape[2]
    G, N = B.shape[1], B.shape[2]
    S = cache.hp.shape[0]
    want = {
        "hp": (cache.hp, (S, H, P, N), torch.float32),
        "ring_dt": (cache.ring_dt, (S, H, Cn), torch.float32),
        "ring_x": (cache.ring_x, (S, H, Cn, P), None),
        "ring_B": (cache.ring_B, (S, G, Cn, N), None),
        "meta": (cache.meta, (S, 8), torch.int32),
        "dt": (dt, (x.shape[0], H), None),
        "C": (C, tuple(B.shape), None),
        "A": (A, (H,), None),
        "dt_bias": (dt_bias, (H,), None),
        "out": (out, tuple(x.shape), None),
        "state_indices": (state_indices, (R,), None),
    }
    if cache.lp is not None:
        want["lp"] = (cache.lp, (S, H, P, N), None)
    if D is not None:
        want["D"] = (D, (H,), None)
    if qsl is not None:
        want["query_start_loc"] = (qsl, (R + 1,), None)
    if acc is not None:
        want["num_accepted_tokens"] = (acc, (R,), None)
    for name, (t, shape, dtype) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {shape}")
        if dtype is not None and t.dtype != dtype:
            raise ValueError(f"{name}: dtype {t.dtype}, expected {dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    if H % G:
        raise ValueError(f"nheads={H} not divisible by ngroups={G}")
    if cache.ring_x.dtype != x.dtype or cache.ring_B.dtype != B.dtype:
        raise ValueError("ring records must have the activations' dtype")
    if qsl is None and x.shape[0] != R:
        raise ValueError(f"{x.shape[0]} tokens for {R} rows without query_start_loc")
