"""Row selections our metadata builders decide on the host, from the builder's CPU tensors,
so that a layer picks rows on the device by index (`index_select`) and never reads a
device tensor back: a boolean mask on a CUDA tensor (`slots[mask]`) or `.item()` waits for
the GPU to drain, once per layer that does it."""

from __future__ import annotations

from typing import Any

import torch


def to_device(host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`host` (a CPU tensor) on `like`'s device, copied asynchronously from pinned memory
    (no synchronisation); `host` itself when `like` is on the CPU."""
    if like.device.type == "cpu":
        return host
    return host.pin_memory().to(like.device, non_blocking=True)


def prefill_init_rows(common: Any, first: int, count: int, like: torch.Tensor) -> torch.Tensor:
    """[<= count] int64 on `like`'s device: which of the step's prefill rows (rows first ..
    first + count - 1 of vLLM's CommonAttentionMetadata `common`, in batch order) continue
    a stored state, i.e. have tokens computed before this step's (vLLM's has_initial_state,
    its `seq_lens - query_lens > 0`), as positions among those rows. From the host's query
    starts and sequence lengths: vLLM's upper bound is exact for prefill rows (it overstates
    only rows with drafts pending, whose seq_len - q > 0 either way)."""
    qsl = common.query_start_loc_cpu[first : first + count + 1].long()
    upper = common.seq_lens_cpu_upper_bound
    seq_lens = (common.seq_lens if upper is None else upper)[first : first + count]
    computed = seq_lens.cpu().long() - (qsl[1:] - qsl[:-1])
    return to_device(torch.nonzero(computed > 0).squeeze(1), like)
