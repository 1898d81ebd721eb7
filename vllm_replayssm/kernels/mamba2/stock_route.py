"""Triton stock-route step for Mamba-2 on a ReplaySSM page: for batches where replay is
slower (small batches, plain decode). One program per (headdim tile, head, row) reads the
HP tile (issued before the cursor words, so the dependent-load chain is as short as stock
vLLM's), folds any committed ring entries first (a row arriving from the replay route),
applies the token, writes HP alone and, unless the row is already in the stock steady
state, resets the cursor with LP marked stale. Semantics:
`reference.mamba2_stock_route_decode`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import cdiv, pow2_block
from vllm_replayssm.kernels.common.cursor import stagger_modulus
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS, require_row_contiguous
from vllm_replayssm.kernels.common.triton_cursor import finish_stock_row, softplus, stock_route_row
from vllm_replayssm.kernels.mamba2.tiles import fold_tile
from vllm_replayssm.layout import NULL_BLOCK_ID, Mamba2ReplayCache, ring_rows


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _mamba2_stock_route_kernel(
    hp_ptr,
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
    out_ptr,
    null_block_id,
    heads_per_group,
    num_programs_per_row,
    num_ring_rows,
    stagger_mod,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_dim,
    stride_hp_dstate,
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
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_D: tl.constexpr,
):
    pid_p = tl.program_id(0)
    pid_h = tl.program_id(1).to(tl.int64)
    pid_r = tl.program_id(2).to(tl.int64)
    o_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    m_p = o_p < headdim
    p_out = out_ptr + pid_r * stride_out_tok + pid_h * stride_out_head + o_p * stride_out_dim
    slot = tl.load(state_indices_ptr + pid_r).to(tl.int64)
    if slot == null_block_id:
        tl.store(p_out, tl.zeros([BLOCK_P], dtype=tl.float32), mask=m_p)
        return
    g = pid_h // heads_per_group
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < dstate
    m_pn = m_p[:, None] & m_n[None, :]
    # Loads that do not depend on the cursor first.
    p_hp = (
        hp_ptr
        + slot * stride_hp_slot
        + pid_h * stride_hp_head
        + o_p[:, None] * stride_hp_dim
        + o_n[None, :] * stride_hp_dstate
    )
    S = tl.load(p_hp, mask=m_pn, other=0.0)
    x = tl.load(
        x_ptr + pid_r * stride_x_tok + pid_h * stride_x_head + o_p * stride_x_dim,
        mask=m_p,
        other=0.0,
    ).to(tl.float32)
    B = tl.load(
        B_ptr + pid_r * stride_B_tok + g * stride_B_group + o_n * stride_B_dstate,
        mask=m_n,
        other=0.0,
    ).to(tl.float32)
    Cv = tl.load(
        C_ptr + pid_r * stride_C_tok + g * stride_C_group + o_n * stride_C_dstate,
        mask=m_n,
        other=0.0,
    ).to(tl.float32)
    dt = tl.load(dt_ptr + pid_r * stride_dt_tok + pid_h * stride_dt_head).to(tl.float32)
    A = tl.load(A_ptr + pid_h).to(tl.float32)
    dt = softplus(dt + tl.load(dt_bias_ptr + pid_h).to(tl.float32))
    p_meta = meta_ptr + slot * stride_meta_slot
    o, n_c, kap_reset, reset = stock_route_row(
        p_meta, stride_meta_word, slot, num_ring_rows, stagger_mod, WINDOW
    )
    if n_c > 0:  # a row arriving from the replay route: fold its ring first
        S = fold_tile(
            S,
            ring_dt_ptr + slot * stride_rdt_slot + pid_h * stride_rdt_head,
            ring_x_ptr + slot * stride_rx_slot + pid_h * stride_rx_head,
            ring_B_ptr + slot * stride_rB_slot + g * stride_rB_group,
            A,
            o,
            n_c,
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
    S = S * tl.exp(A * dt) + (dt * x)[:, None] * B[None, :]
    y = tl.sum(S * Cv[None, :], axis=1)
    if HAS_D:
        y += tl.load(D_ptr + pid_h).to(tl.float32) * x
    tl.store(p_hp, S, mask=m_pn)
    tl.store(p_out, y, mask=m_p)
    if reset:
        finish_stock_row(p_meta, stride_meta_word, num_programs_per_row, kap_reset)


def mamba2_stock_route_decode(
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
    stagger: bool,
    null_block_id: int = NULL_BLOCK_ID,
    block_p: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Triton twin of `reference.mamba2_stock_route_decode` (same arguments and effects):
    x: [R, H, P] (one token per row), dt: [R, H], B, C: [R, G, N]. block_p / num_warps
    override the launch configuration."""
    H, P = x.shape[1], x.shape[2]
    G, N = B.shape[1], B.shape[2]
    R = state_indices.shape[0]
    if x.shape[0] != R or tuple(out.shape) != tuple(x.shape):
        raise ValueError(
            f"the stock route takes one token per row: x {tuple(x.shape)}, "
            f"out {tuple(out.shape)}, {R} rows"
        )
    if cache.ring_x.dtype != x.dtype:
        raise ValueError("ring records must have the activations' dtype")
    require_row_contiguous(state_indices=state_indices)
    if R == 0:
        return
    Cn = ring_rows(buffer_len, window)
    bp = block_p or 8  # H200 bs 1: 8 rows 4-6% faster than 16 (Super, Nano 4B), 4 alike
    grid = (cdiv(P, bp), H, R)
    launch(
        _mamba2_stock_route_kernel,
        grid,
        cache.hp,
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
        out,
        null_block_id,
        H // G,
        grid[0] * H,
        Cn,
        stagger_modulus(buffer_len, window, stagger),
        *cache.hp.stride(),
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
        BLOCK_P=bp,
        BLOCK_N=pow2_block(N),
        HAS_D=D is not None,
        num_warps=num_warps or 1,
    )
