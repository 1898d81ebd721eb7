"""Plain-decode plan for Gated DeltaNet (the first of three launches; `decode.py` runs them).

One one-warp program per (key head, row) reads the row's cursor words (nobody writes them
in this launch), applies commit and the flush rule (`cursor.plan_step`), and computes what
the key head's value heads need from the history, once: the normalised k_t and scaled
normalised q_t, the ring's keys (pre-norm, loaded once and normalised here), their products
k_j·k_t and k_j·q_t, and per value head the readout coefficients (README "Readout")

    a_j = e^{Γn−Γj}(k_j·k_t),  b_j = e^{Γn−Γj}(k_j·q_t),  e^{Γn},  α_t,  β_t,  k_t·q_t

from the cumulative log decays of ring_g. It appends the row-shared records of the current
token (g and, for the exact flush, β per value head; k per key head). The key-head-0
program writes the dense plan row (`common/plan_row.py`; the new cursor words travel in it
and the readout launch stores them, so every launch has a single writer of them) and, for
rows that must read HP (flush rows, and rows whose LP is stale), appends the row to the HP
list (one relaxed atomic per such row).

Flush rows: their coefficients are those of an empty history (a = b = 0, e^{Γn} = 1), since
the flush reads out from the folded state. The fold itself (`tiles.wy_fold_tile`) reads its
records (g, β, k, v; fold mode: d) from the ring; the fold region is in the plan row.

Scratch (`GDNScratch`) is caller-allocated and sized by the largest batch, so the three
launches are safe in CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import pow2_block
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.plan_row import (
    PLAN_LEN,
    T_PLAN_LEN,
    T_PLAN_SLOT,
    store_plan_row,
)
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS
from vllm_replayssm.kernels.common.triton_cursor import (
    plan_row,
)
from vllm_replayssm.kernels.gdn.tiles import (
    beta_gate,
    history_weights,
    l2norm,
    l2norm_rows,
    log_decay,
)

# Per (row, value head) scalars after the 2 * BLOCK_L history coefficients.
COEF_EXP_GAMMA, COEF_ALPHA, COEF_BETA, COEF_KQ = range(4)
T_COEF_EXP_GAMMA = tl.constexpr(COEF_EXP_GAMMA)
T_COEF_ALPHA = tl.constexpr(COEF_ALPHA)
T_COEF_BETA = tl.constexpr(COEF_BETA)
T_COEF_KQ = tl.constexpr(COEF_KQ)


def history_block(buffer_len: int) -> int:
    """History slots per (row, value head): a power of two >= L and >= 16 (a WY fold's dot
    needs an inner dimension of at least 16)."""
    return pow2_block(buffer_len)


def coef_len(buffer_len: int) -> int:
    """Per (row, value head): a_j in [0, BLOCK_L), b_j in [BLOCK_L, 2 BLOCK_L), then e^{Γn},
    α_t, β_t, k_t·q_t (padded to a multiple of 4 words)."""
    return 2 * history_block(buffer_len) + 4


@dataclass
class GDNScratch:
    """Caller-owned scratch of the plain-decode launches, for up to `max_rows` rows.

    plan: [max_rows, PLAN_LEN] int32; coef: [max_rows, Hv, coef_len(L)] fp32; kq:
    [max_rows, Hk, 2, K] fp32 (normalised k_t, then scaled normalised q_t); hp_rows:
    [max_rows] int32 (rows that read HP this step, in any order); hp_count: [1] int32, the
    length of hp_rows (`gdn_plan` zeroes it first).
    """

    plan: torch.Tensor
    coef: torch.Tensor
    kq: torch.Tensor
    hp_rows: torch.Tensor
    hp_count: torch.Tensor

    @classmethod
    def allocate(
        cls,
        max_rows: int,
        num_v_heads: int,
        num_k_heads: int,
        head_k_dim: int,
        buffer_len: int,
        device: torch.device | str,
    ) -> GDNScratch:
        f32 = dict(dtype=torch.float32, device=device)
        return cls(
            plan=torch.zeros(max_rows, PLAN_LEN, dtype=torch.int32, device=device),
            coef=torch.zeros(max_rows, num_v_heads, coef_len(buffer_len), **f32),
            kq=torch.zeros(max_rows, num_k_heads, 2, head_k_dim, **f32),
            hp_rows=torch.zeros(max_rows, dtype=torch.int32, device=device),
            hp_count=torch.zeros(1, dtype=torch.int32, device=device),
        )

    def fits(
        self, num_rows: int, num_v_heads: int, num_k_heads: int, head_k_dim: int, buffer_len: int
    ) -> bool:
        return (
            self.plan.shape[0] >= num_rows
            and tuple(self.coef.shape[1:]) == (num_v_heads, coef_len(buffer_len))
            and tuple(self.kq.shape[1:]) == (num_k_heads, 2, head_k_dim)
        )


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _gdn_plan_kernel(
    meta_ptr,
    ring_g_ptr,
    ring_beta_ptr,
    ring_k_ptr,
    q_ptr,
    k_ptr,
    a_ptr,
    b_ptr,
    A_log_ptr,
    dt_bias_ptr,
    state_indices_ptr,
    plan_ptr,
    coef_ptr,
    kq_ptr,
    hp_rows_ptr,
    hp_count_ptr,
    scale,
    null_block_id,
    num_ring_rows,
    stride_meta_slot,
    stride_meta_word,
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
    stride_coef_row,
    stride_coef_head,
    stride_kq_row,
    stride_kq_head,
    stride_kq_which,
    V_PER_K: tl.constexpr,
    head_k_dim: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_HG: tl.constexpr,
    BLOCK_L: tl.constexpr,
    HAS_LP: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
):
    pid_k = tl.program_id(0)
    r = tl.program_id(1)
    p_plan = plan_ptr + r * T_PLAN_LEN
    slot32 = tl.load(state_indices_ptr + r).to(tl.int32)
    if slot32 == null_block_id:
        if pid_k == 0:
            tl.store(p_plan + T_PLAN_SLOT, slot32)
        return
    slot = slot32.to(tl.int64)
    r64 = r.to(tl.int64)

    # Loads that do not depend on the cursor words.
    o_hg = tl.arange(0, BLOCK_HG)
    m_hg = o_hg < V_PER_K
    h = pid_k * V_PER_K + o_hg  # [BLOCK_HG] value heads of this key head
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < head_k_dim
    neg_A = -tl.exp(tl.load(A_log_ptr + h, mask=m_hg, other=0.0).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + h, mask=m_hg, other=0.0).to(tl.float32)
    a_t = tl.load(a_ptr + r64 * stride_a_tok + h * stride_a_head, mask=m_hg, other=0.0)
    b_t = tl.load(b_ptr + r64 * stride_b_tok + h * stride_b_head, mask=m_hg, other=0.0)
    k_raw = tl.load(
        k_ptr + r64 * stride_k_tok + pid_k * stride_k_head + o_k * stride_k_k, mask=m_k, other=0.0
    )
    q_raw = tl.load(
        q_ptr + r64 * stride_q_tok + pid_k * stride_q_head + o_k * stride_q_k, mask=m_k, other=0.0
    )
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

    o_j = tl.arange(0, BLOCK_L)
    p_rk = ring_k_ptr + slot * stride_rk_slot + pid_k * stride_rk_head

    # History: committed entries [0, n) from o (empty after a flush).
    m_j = o_j < n_next
    rows = o_next + o_j
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    k_h = tl.load(
        p_rk + rows[:, None] * stride_rk_row + o_k[None, :] * stride_rk_k,
        mask=m_j[:, None] & m_k[None, :],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_L, BLOCK_K]
    keep = m_hg[:, None] & m_j[None, :]
    g_h = tl.load(
        ring_g_ptr
        + slot * stride_rg_slot
        + h[:, None] * stride_rg_head
        + rows[None, :] * stride_rg_row,
        mask=keep,
        other=0.0,
    )  # [BLOCK_HG, BLOCK_L]
    kn = l2norm(k_raw.to(tl.float32))
    qn = l2norm(q_raw.to(tl.float32)) * scale
    kn_h = l2norm_rows(k_h)
    gk = tl.sum(kn_h * kn[None, :], axis=1)  # [BLOCK_L] k_j . k_t
    gq = tl.sum(kn_h * qn[None, :], axis=1)  # [BLOCK_L] k_j . q_t
    kq = tl.sum(kn * qn, axis=0)
    w, gam_n = history_weights(g_h, keep, 1)  # [BLOCK_HG, BLOCK_L], [BLOCK_HG]
    g_t = log_decay(neg_A, dt_bias, a_t)  # [BLOCK_HG]
    beta_t = beta_gate(b_t)

    p_coef = coef_ptr + r64 * stride_coef_row + h * stride_coef_head  # [BLOCK_HG]
    tl.store(p_coef[:, None] + o_j[None, :], w * gk[None, :], mask=m_hg[:, None])
    tl.store(p_coef[:, None] + BLOCK_L + o_j[None, :], w * gq[None, :], mask=m_hg[:, None])
    p_scal = p_coef + 2 * BLOCK_L
    tl.store(p_scal + T_COEF_EXP_GAMMA, tl.exp(gam_n), mask=m_hg)
    tl.store(p_scal + T_COEF_ALPHA, tl.exp(g_t), mask=m_hg)
    tl.store(p_scal + T_COEF_BETA, beta_t, mask=m_hg)
    tl.store(p_scal + T_COEF_KQ, kq + tl.zeros([BLOCK_HG], dtype=tl.float32), mask=m_hg)
    p_kq = kq_ptr + r64 * stride_kq_row + pid_k * stride_kq_head + o_k
    tl.store(p_kq, kn, mask=m_k)
    tl.store(p_kq + stride_kq_which, qn, mask=m_k)

    # Row-shared records of the current token.
    tl.store(
        ring_g_ptr + slot * stride_rg_slot + h * stride_rg_head + write_row * stride_rg_row,
        g_t,
        mask=m_hg,
    )
    if EXACT_FLUSH:
        tl.store(
            ring_beta_ptr
            + slot * stride_rbeta_slot
            + h * stride_rbeta_head
            + write_row * stride_rbeta_row,
            beta_t,
            mask=m_hg,
        )
    tl.store(p_rk + write_row * stride_rk_row + o_k * stride_rk_k, k_raw, mask=m_k)

    if pid_k == 0:
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


def gdn_plan(
    cache,
    q: torch.Tensor,
    k: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    scratch: GDNScratch,
    *,
    scale: float,
    num_ring_rows: int,
    buffer_len: int,
    null_block_id: int,
    num_warps: int = 1,
) -> None:
    """Launch the plan for R rows (plain decode, one token per row).

    cache: GDNReplayCache (reads meta, ring_g, ring_k; appends g, beta (exact) and k
    records); q, k: [R, Hk, K] act (pre-norm); a, b: [R, Hv]; A_log, dt_bias: [Hv];
    state_indices: [R] int; scratch: written (plan rows, coefficients, k_t / q_t, HP list
    and its length).
    """
    R, Hk, K = k.shape
    Hv = a.shape[1]
    beta = cache.ring_beta if cache.ring_beta is not None else cache.ring_g
    scratch.hp_count.zero_()
    launch(
        _gdn_plan_kernel,
        (Hk, R),
        cache.meta,
        cache.ring_g,
        beta,
        cache.ring_k,
        q,
        k,
        a,
        b,
        A_log,
        dt_bias,
        state_indices,
        scratch.plan,
        scratch.coef,
        scratch.kq,
        scratch.hp_rows,
        scratch.hp_count,
        scale,
        null_block_id,
        num_ring_rows,
        *cache.meta.stride(),
        *cache.ring_g.stride(),
        *beta.stride(),
        *cache.ring_k.stride(),
        *q.stride(),
        *k.stride(),
        *a.stride(),
        *b.stride(),
        scratch.coef.stride(0),
        scratch.coef.stride(1),
        *scratch.kq.stride()[:3],
        V_PER_K=Hv // Hk,
        head_k_dim=K,
        BLOCK_K=pow2_block(K),
        BLOCK_HG=pow2_block(Hv // Hk, 2),
        BLOCK_L=history_block(buffer_len),
        HAS_LP=cache.lp is not None,
        EXACT_FLUSH=cache.exact_flush,
        num_warps=num_warps,
    )
