"""The readout and the flush of a small speculative batch in one launch (`decode.py` runs it
after the plan when a step has at most `fused_max_rows` rows).

At bs 1 the flush launch usually finds no row to fold (a row flushes once every few
steps), yet costs a launch, and the plan a memset of the HP list's length: a few µs each
in a CUDA graph, tens of µs of host time in an eager step (a PIECEWISE step runs the SSM
layers eagerly). Here one program per (row, head, headdim tile), as the readout launch has
them, reads its row's plan: a row that reads LP runs the readout's program
(`readout.readout_window_program`), a row that reads HP (a flush, or a stale LP) runs the
flush's item for the same tile (`flush.flush_window_item`). So there is no HP list, and the
plan writes none (`mamba2_plan(hp_list=False)`).

One tile size and one warp count serve both bodies (`fused_block_p`, `fused_warps`: 16 rows
on two warps by default, from the H200 sweep in `decode.launch_config`): the kernel takes
the registers of the larger body, which costs occupancy in wide batches, where the two
launches' own tiles and the flush's persistent grid are the better choice.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import cdiv, pow2_block
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.plan_row import T_PLAN_LEN, T_PLAN_READ_HP, T_PLAN_SLOT
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS
from vllm_replayssm.kernels.mamba2.flush import flush_window_item, fold_precision
from vllm_replayssm.kernels.mamba2.plan import (
    Mamba2Scratch,
    coef_offsets,
    history_block,
    window_block,
)
from vllm_replayssm.kernels.mamba2.readout import readout_window_program, window_products


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _mamba2_window_fused_kernel(
    hp_ptr,
    lp_ptr,
    ring_x_ptr,
    ring_B_ptr,
    meta_ptr,
    x_ptr,
    C_ptr,
    out_ptr,
    plan_ptr,
    coef_ptr,
    qsl_ptr,
    null_block_id,
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
    OFF_D: tl.constexpr,
    HAS_LP: tl.constexpr,
    LP_IS_FP16: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    READOUT_PRODUCTS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FLUSH_PRODUCTS: tl.constexpr,
    DOT_T: tl.constexpr,
):
    pid = tl.program_id(0)
    r = tl.program_id(1)
    # The readout's program stores the row's cursor words (pid 0) and returns at once for
    # a NULL row (zeros out) or a row that reads HP; lp_ptr is HP when there is no LP copy.
    readout_window_program(
        lp_ptr,
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
        stride_lp_slot,
        stride_lp_head,
        stride_lp_dim,
        stride_lp_dstate,
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
        READOUT_PRODUCTS,
        BLOCK_K,
        DOT_T,
        pid,
        r,
    )
    # A NULL row's plan holds only its slot word: its read-HP word is stale.
    p_plan = plan_ptr + r * T_PLAN_LEN
    slot32 = tl.load(p_plan + T_PLAN_SLOT)
    read_hp = tl.load(p_plan + T_PLAN_READ_HP)
    if (slot32 != null_block_id) & (read_hp != 0):
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
            FLUSH_PRODUCTS,
            DOT_T,
            r,
            pid // TILES_PER_HEAD,
            pid % TILES_PER_HEAD,
        )


def mamba2_window_fused(
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
    window: int,
    query_start_loc: torch.Tensor | None,
    block_p: int,
    num_warps: int,
    readout_products: str = "dot",
    flush_products: str = "fma",
    dot_precision: str | None = None,
) -> None:
    """Launch the readout and the flush of a speculative step as one (module docstring),
    after `mamba2_plan` (either hp_list). Effects as `readout.mamba2_readout` followed by
    `flush.mamba2_flush` with the same window, products and dot_precision: out
    [num_tokens, H, P], the x records, HP and LP of flush rows, every row's cursor words.
    block_p: the tile of both bodies (>= 16 with "dot" products); num_warps: the program's
    warps."""
    H, P = x.shape[1], x.shape[2]
    G, N = C.shape[1], C.shape[2]
    lp = cache.lp if cache.lp is not None else cache.hp
    readout_kind = window_products(readout_products, lp.dtype, C.dtype, block_p, False)
    flush_kind = window_products(flush_products, torch.float32, C.dtype, block_p, False, "flush")
    dot_precision = fold_precision(cache, x, dot_precision)
    off_w, off_s, off_d = coef_offsets(buffer_len, window)
    tiles = cdiv(P, block_p)
    block_n = pow2_block(N)
    launch(
        _mamba2_window_fused_kernel,
        (H * tiles, num_rows),
        cache.hp,
        lp,
        cache.ring_x,
        cache.ring_B,
        cache.meta,
        x,
        C,
        out,
        scratch.plan,
        scratch.coef,
        query_start_loc if query_start_loc is not None else scratch.plan,
        null_block_id,
        num_ring_rows,
        *cache.hp.stride(),
        *lp.stride(),
        *cache.ring_x.stride(),
        *cache.ring_B.stride(),
        *cache.meta.stride(),
        *x.stride(),
        *C.stride(),
        *out.stride(),
        scratch.coef.stride(0),
        scratch.coef.stride(1),
        HEADS_PER_GROUP=H // G,
        TILES_PER_HEAD=tiles,
        headdim=P,
        dstate=N,
        WINDOW=window,
        BLOCK_T=window_block(window),
        BLOCK_P=block_p,
        BLOCK_N=block_n,
        BLOCK_L=history_block(buffer_len),
        OFF_W=off_w,
        OFF_S=off_s,
        OFF_D=off_d,
        HAS_LP=cache.lp is not None,
        LP_IS_FP16=cache.lp is not None and cache.lp.dtype == torch.float16,
        DOT_PRECISION=dot_precision,
        IS_VARLEN=query_start_loc is not None,
        READOUT_PRODUCTS=readout_kind,
        # as the readout launch's: an fp32 tile's bf16 parts in 32-column chunks
        BLOCK_K=block_n if lp.element_size() == 2 else min(32, block_n),
        FLUSH_PRODUCTS=flush_kind,
        DOT_T=max(16, window_block(window)),
        num_warps=num_warps,
    )
