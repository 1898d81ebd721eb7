"""The stock route of Gated DeltaNet decode in Triton: the stock read + write step on a
ReplaySSM page, for plain decode where replay is slower (`dispatch.launch_config`).

One program per (value-dim tile, value head, row) reads the HP tile before the cursor,
advances it over any committed ring entries (a row arriving from the replay route), applies
the token's delta-rule step, writes HP alone and, unless the row is already in the stock
steady state, resets the cursor with LP marked stale. Semantics:
`reference.gdn_stock_route_decode`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import cdiv, pow2_block
from vllm_replayssm.kernels.common.cursor import stagger_modulus
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS
from vllm_replayssm.kernels.common.triton_cursor import finish_stock_row, stock_route_row
from vllm_replayssm.kernels.gdn.tiles import advance_tile, beta_gate, l2norm, log_decay
from vllm_replayssm.layout import NULL_BLOCK_ID, GDNReplayCache, ring_rows


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _gdn_stock_route_kernel(
    hp_ptr,
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
    out_ptr,
    scale,
    null_block_id,
    num_programs_per_row,
    num_ring_rows,
    stagger_mod,
    stride_hp_slot,
    stride_hp_head,
    stride_hp_v,
    stride_hp_k,
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
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_h = tl.program_id(1).to(tl.int64)
    pid_r = tl.program_id(2).to(tl.int64)
    o_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_v = o_v < head_v_dim
    p_out = out_ptr + pid_r * stride_out_tok + pid_h * stride_out_head + o_v * stride_out_v
    slot = tl.load(state_indices_ptr + pid_r).to(tl.int64)
    if slot == null_block_id:
        tl.store(p_out, tl.zeros([BLOCK_V], dtype=tl.float32), mask=m_v)
        return
    kh = pid_h // v_per_k
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < head_k_dim
    m_vk = m_v[:, None] & m_k[None, :]
    # Loads that do not depend on the cursor first.
    p_hp = (
        hp_ptr
        + slot * stride_hp_slot
        + pid_h * stride_hp_head
        + o_v[:, None] * stride_hp_v
        + o_k[None, :] * stride_hp_k
    )
    S = tl.load(p_hp, mask=m_vk, other=0.0)
    k_t = tl.load(
        k_ptr + pid_r * stride_k_tok + kh * stride_k_head + o_k * stride_k_k, mask=m_k, other=0.0
    ).to(tl.float32)
    q_t = tl.load(
        q_ptr + pid_r * stride_q_tok + kh * stride_q_head + o_k * stride_q_k, mask=m_k, other=0.0
    ).to(tl.float32)
    v_t = tl.load(
        v_ptr + pid_r * stride_v_tok + pid_h * stride_v_head + o_v * stride_v_v, mask=m_v, other=0.0
    ).to(tl.float32)
    a_t = tl.load(a_ptr + pid_r * stride_a_tok + pid_h * stride_a_head).to(tl.float32)
    b_raw = tl.load(b_ptr + pid_r * stride_b_tok + pid_h * stride_b_head)
    g_t = log_decay(
        -tl.exp(tl.load(A_log_ptr + pid_h).to(tl.float32)),
        tl.load(dt_bias_ptr + pid_h).to(tl.float32),
        a_t,
    )
    beta_t = beta_gate(b_raw)
    k_t = l2norm(k_t)
    q_t = l2norm(q_t) * scale
    p_meta = meta_ptr + slot * stride_meta_slot
    o, n_c, kap_reset, reset = stock_route_row(
        p_meta, stride_meta_word, slot, num_ring_rows, stagger_mod, WINDOW
    )
    if n_c > 0:  # a row arriving from the replay route: advance over its ring first
        S = advance_tile(
            S,
            ring_g_ptr + slot * stride_rg_slot + pid_h * stride_rg_head,
            ring_beta_ptr + slot * stride_rbeta_slot + pid_h * stride_rbeta_head,
            ring_k_ptr + slot * stride_rk_slot + kh * stride_rk_head,
            ring_d_ptr + slot * stride_rd_slot + pid_h * stride_rd_head,
            ring_v_ptr + slot * stride_rv_slot + pid_h * stride_rv_head,
            o,
            n_c,
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
    S = S * tl.exp(g_t)
    d_t = (v_t - tl.sum(S * k_t[None, :], axis=1)) * beta_t
    S = S + d_t[:, None] * k_t[None, :]
    tl.store(p_hp, S, mask=m_vk)
    tl.store(p_out, tl.sum(S * q_t[None, :], axis=1), mask=m_v)
    if reset:
        finish_stock_row(p_meta, stride_meta_word, num_programs_per_row, kap_reset)


def gdn_stock_route_decode(
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
    stagger: bool,
    null_block_id: int = NULL_BLOCK_ID,
    block_v: int = 16,
    num_warps: int = 1,
) -> None:
    """Triton twin of `reference.gdn_stock_route_decode` (same arguments and effects):
    q, k: [R, Hk, K], v: [R, Hv, V] (one token per row). Launch configuration
    (`dispatch.launch_config` chooses it for the layers): block_v, the value-dim tile, and
    num_warps."""
    Hk, K = k.shape[1], k.shape[2]
    Hv, V = v.shape[1], v.shape[2]
    R = state_indices.shape[0]
    if v.shape[0] != R or tuple(out.shape) != tuple(v.shape):
        raise ValueError(
            f"the stock route takes one token per row: v {tuple(v.shape)}, "
            f"out {tuple(out.shape)}, {R} rows"
        )
    if R == 0:
        return
    num_ring_rows = ring_rows(buffer_len, window)
    grid = (cdiv(V, block_v), Hv, R)
    beta = cache.ring_beta if cache.ring_beta is not None else cache.ring_g
    ring_v = cache.ring_v if cache.ring_v is not None else cache.ring_d
    launch(
        _gdn_stock_route_kernel,
        grid,
        cache.hp,
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
        out,
        scale,
        null_block_id,
        grid[0] * Hv,
        num_ring_rows,
        stagger_modulus(buffer_len, window, stagger),
        *cache.hp.stride(),
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
        v_per_k=Hv // Hk,
        WINDOW=window,
        BLOCK_V=block_v,
        BLOCK_K=pow2_block(K),
        EXACT_FLUSH=cache.exact_flush,
        num_warps=num_warps,
    )
