"""The speculative conv update of `layers/conv.spec_conv_update` in one Triton launch (GPUs).

The torch version is a chain of ~25 small tensor ops per layer and step (gathers, a
grouped conv1d, a scatter); at small batches each costs a kernel's latency, which a
speculative step pays in every SSM layer. Here one program per (row, channel block) loads
the state columns and window inputs each output needs as [BLOCK_D] vectors at their
(runtime) columns, computes the window's conv outputs and writes the new state, gathered
from the old state and the inputs (the same layout rule: the committed context ends at
column e = clamp(M - pending + committed, K - 1, M), then the q window inputs; the new state
is the last M columns of that sequence). Rows of 0 tokens (CUDA-graph padding, on the NULL
slot) rewrite their state as the torch version does; tokens past the last row are zero
(written by the last row's programs). Fixed grid, no host synchronisation, no allocation
besides the output and no launch besides this one (the output was zeroed by a launch of
its own before 2026-12-06). sm_90
(Qwen3-Next, K = 4, k = 3, bf16 state, SiLU, no bias; `sm90_report.py` at bf5a250): 40
registers, no spills, no shuffles, one barrier, 584 SASS instructions at the default 256
channels on four warps (64 registers, 936 instructions at the former 128 on one warp). The
kernel it replaced (7055fdc) held the state and the inputs as 2-D tiles and picked columns by
masked sums across lanes: 211 registers, 448 shuffles, 2,872 instructions, and 2.5x the time
of vLLM's `causal_conv1d_update` on the H200; this one takes 1.5x at bs 256
(`spec_conv_update_triton`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.common.blocks import cdiv, pow2_block
from vllm_replayssm.kernels.common.launch import launch
from vllm_replayssm.kernels.common.rows import ROW_INDEX_ARGS, require_row_contiguous


@triton.jit(do_not_specialize_on_alignment=ROW_INDEX_ARGS)
def _spec_conv_kernel(
    x_ptr,
    state_ptr,
    slots_ptr,
    qsl_ptr,
    pending_ptr,
    committed_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    D,
    N,
    stride_x_tok,
    stride_x_d,
    stride_s_slot,
    stride_s_d,
    stride_s_m,
    stride_w_d,
    stride_w_k,
    stride_o_tok,
    stride_o_d,
    K: tl.constexpr,
    M: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    o_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    slot = tl.load(slots_ptr + r).to(tl.int64)
    bos = tl.load(qsl_ptr + r).to(tl.int64)
    q = tl.load(qsl_ptr + r + 1).to(tl.int64) - bos
    end = M - tl.load(pending_ptr + r).to(tl.int64) + tl.load(committed_ptr + r).to(tl.int64)
    end = tl.minimum(tl.maximum(end, K - 1), M)
    p_state = state_ptr + slot * stride_s_slot + o_d * stride_s_d  # [BLOCK_D]
    p_x = x_ptr + o_d * stride_x_d

    # Window token t reads sequence positions t .. t + K - 1 of [context (K - 1) | window],
    # i.e. state column end - (K - 1) + j for j < K - 1, window input j - (K - 1) otherwise:
    # each a [BLOCK_D] vector loaded at its (runtime) column, one layout throughout.
    bias = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:  # once, not per window token
        bias += tl.load(bias_ptr + o_d, mask=m_d, other=0.0).to(tl.float32)
    for t in tl.static_range(WINDOW):
        acc = bias
        for i in tl.static_range(K):
            j = t + i
            w_i = tl.load(w_ptr + o_d * stride_w_d + i * stride_w_k, mask=m_d, other=0.0)
            if j < K - 1:
                v = tl.load(p_state + (end - (K - 1) + j) * stride_s_m, mask=m_d, other=0.0)
            else:  # a window input as the state stores it
                tok = bos + j - (K - 1)
                v = tl.load(p_x + tok * stride_x_tok, mask=m_d & (j - (K - 1) < q), other=0.0)
                v = v.to(state_ptr.dtype.element_ty)
            acc += w_i.to(tl.float32) * v.to(tl.float32)
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        tl.store(
            out_ptr + (bos + t) * stride_o_tok + o_d * stride_o_d,
            acc.to(out_ptr.dtype.element_ty),
            mask=m_d & (t < q),
        )

    # New state: column c holds sequence position src = end + q - M + c of
    # [committed columns 0 .. end - 1 | the q window inputs], gathered from the old state and
    # the inputs as one [BLOCK_D, BLOCK_M] tile before any column is rewritten.
    o_m = tl.arange(0, BLOCK_M)
    m_dm = m_d[:, None] & (o_m < M)[None, :]
    src = end + q - M + o_m  # [BLOCK_M]
    col = tl.minimum(tl.maximum(src, 0), M - 1)
    w_col = tl.minimum(tl.maximum(src - end, 0), WINDOW - 1)
    from_state = tl.load(
        p_state[:, None] + col[None, :] * stride_s_m, mask=m_dm & (src < end)[None, :], other=0.0
    )
    from_x = tl.load(
        p_x[:, None] + (bos + w_col)[None, :] * stride_x_tok,
        mask=m_dm & (src >= end)[None, :],
        other=0.0,
    ).to(state_ptr.dtype.element_ty)
    new = tl.where((src < end)[None, :], from_state, from_x)
    tl.debug_barrier()  # every warp's reads of the old state land before any column changes
    tl.store(p_state[:, None] + o_m[None, :] * stride_s_m, new, mask=m_dm)

    # Tokens past the last row (none but in padded batches) are zero, as in the torch
    # version: the last row's programs write them, so the output needs no zeroing launch.
    if r == tl.num_programs(0) - 1:
        zero = tl.zeros([BLOCK_D], dtype=out_ptr.dtype.element_ty)
        for tok in range(bos + q, N):
            tl.store(out_ptr + tok * stride_o_tok + o_d * stride_o_d, zero, mask=m_d)


def spec_conv_update_triton(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    pending: torch.Tensor,
    committed: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    window: int,
    block_d: int = 256,
    num_warps: int = 4,
) -> torch.Tensor:
    """`layers/conv.spec_conv_update` (same arguments and effects) in one launch; block_d
    channels per program, num_warps per program. Defaults from the launch-shape sweep on the
    H200 (`benchmarks/kernels/bench_conv.py`, T = 4, µs per layer and step against vLLM's
    `causal_conv1d_update`; `conv-spec-h200-20261203-bf5a250-launch-shapes.json.gz`): two
    channels per thread win, 256 channels on four warps or 128 on two alike (bs 256
    Qwen3-Next 37.8 / 38.0 against 49.3 for the former 128 on one warp, vLLM 25.7;
    Nemotron-3 Super 46.1 / 46.1 against 60.7, vLLM 31.9; bs 64 13.3 against 15.7 and 14.8
    against 19.3, vLLM 8.6 and 10.9); one warp per 256 or 512 channels took about twice as
    long. sm_90 (Qwen3-Next, K = 4, k = 3): 40 registers at 256 x 4 against 64 at 128 x 1,
    584 SASS instructions against 936."""
    R, D, K = slots.shape[0], weight.shape[0], weight.shape[-1]
    M, N = conv_state.shape[-1], x.shape[0]
    if R == 0 or N == 0:
        return torch.zeros_like(x)
    out = torch.empty_like(x)  # every token written by the kernel (padding tokens zero)
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"unsupported conv activation {activation!r}")
    if M < K - 1:
        raise ValueError(f"conv state width {M} below the kernel's context {K - 1}")
    require_row_contiguous(
        slots=slots, query_start_loc=query_start_loc, pending=pending, committed=committed
    )
    w2 = weight.reshape(D, K)
    grid = (R, cdiv(D, block_d))
    launch(
        _spec_conv_kernel,
        grid,
        x,
        conv_state,
        slots,
        query_start_loc,
        pending,
        committed,
        w2,
        bias if bias is not None else w2,
        out,
        D,
        N,
        *x.stride(),
        *conv_state.stride(),
        *w2.stride(),
        *out.stride(),
        K=K,
        M=M,
        WINDOW=window,
        BLOCK_D=block_d,
        BLOCK_M=pow2_block(M, 1),
        HAS_BIAS=bias is not None,
        SILU=activation in ("silu", "swish"),
        num_warps=num_warps,
    )
    return out
