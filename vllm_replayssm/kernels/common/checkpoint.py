"""Checkpoint reads and writes shared by both families' torch references."""

from __future__ import annotations

import torch


def read_checkpoint(cache, slots: torch.Tensor, lp_stale: torch.Tensor) -> torch.Tensor:
    """The read copy of the checkpoint of `slots`: [R, ...] fp32 from LP, or from HP where LP
    is off or stale. cache: a Mamba2ReplayCache or GDNReplayCache; lp_stale: [R] bool."""
    hp = cache.hp[slots].float()
    if cache.lp is None:
        return hp
    return torch.where(lp_stale.view(-1, *([1] * (hp.dim() - 1))), hp, cache.lp[slots].float())


def write_checkpoint(cache, slots: torch.Tensor, S: torch.Tensor) -> None:
    """HP <- S (fp32) and LP <- S cast (saturating for fp16) for `slots`."""
    cache.hp[slots] = S
    if cache.lp is not None:
        if cache.lp.dtype == torch.float16:
            S = S.clamp(-65504.0, 65504.0)
        cache.lp[slots] = S.to(cache.lp.dtype)
