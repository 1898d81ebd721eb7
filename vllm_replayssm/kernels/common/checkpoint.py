"""Checkpoint reads and writes shared by both families' torch references and the prefill
hook. LP is a cast copy of HP, saturating for fp16: an fp32 state beyond fp16's range becomes
±FP16_MAX, not inf (`triton_checkpoint.store_lp` is the kernels' twin)."""

from __future__ import annotations

import torch

FP16_MAX = 65504.0  # the largest finite float16


def to_lp(S: torch.Tensor, lp_dtype: torch.dtype) -> torch.Tensor:
    """The LP copy of fp32 checkpoint values S (any shape): cast to lp_dtype, saturating
    for float16."""
    if lp_dtype == torch.float16:
        S = S.clamp(-FP16_MAX, FP16_MAX)
    return S.to(lp_dtype)


def read_checkpoint(cache, slots: torch.Tensor, lp_stale: torch.Tensor) -> torch.Tensor:
    """The read copy of the checkpoint of `slots`: [R, ...] fp32 from LP, or from HP where LP
    is off or stale. cache: a Mamba2ReplayCache or GDNReplayCache; lp_stale: [R] bool."""
    hp = cache.hp[slots].float()
    if cache.lp is None:
        return hp
    return torch.where(lp_stale.view(-1, *([1] * (hp.dim() - 1))), hp, cache.lp[slots].float())


def write_checkpoint(cache, slots: torch.Tensor, S: torch.Tensor) -> None:
    """HP <- S (fp32) and LP <- `to_lp(S)` for `slots`."""
    cache.hp[slots] = S
    if cache.lp is not None:
        cache.lp[slots] = to_lp(S, cache.lp.dtype)
