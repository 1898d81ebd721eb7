"""The prefill hook (torch form): after stock code wrote a row's HP, copy it to LP and reset
the row's cursor. It runs for every prefill chunk, which also cleans recycled pages and
preemption recompute: the ring of such a row is simply forgotten."""

from __future__ import annotations

import torch

from vllm_replayssm.kernels.common.checkpoint import to_lp
from vllm_replayssm.kernels.common.cursor import reset_meta
from vllm_replayssm.layout import NULL_BLOCK_ID


def apply_prefill_hook(
    hp: torch.Tensor,
    lp: torch.Tensor | None,
    meta: torch.Tensor,
    state_indices: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    stagger: bool,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """hp: [S, ...] fp32; lp: like hp in bf16/fp16, or None; meta: [S, META_LEN] int32;
    state_indices: [R] int slots whose HP prefill just wrote (NULL rows skipped). LP of those
    slots <- HP (saturating for fp16), their cursors reset (staggered if `stagger`). On CUDA
    tensors one Triton launch does it (`triton_prefill_hook`: no device read-back)."""
    if hp.is_cuda:
        from vllm_replayssm.kernels.common.triton_prefill_hook import prefill_hook_triton

        done = prefill_hook_triton(
            hp,
            lp,
            meta,
            state_indices,
            buffer_len=buffer_len,
            window=window,
            stagger=stagger,
            null_block_id=null_block_id,
        )
        if done:
            return
    slots = state_indices[state_indices != null_block_id].long()
    if slots.numel() == 0:
        return
    if lp is not None:
        lp[slots] = to_lp(hp[slots], lp.dtype)
    reset_meta(meta, slots, buffer_len, window, stagger)
