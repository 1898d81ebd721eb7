"""Decode rows that start a request: their page may hold another request's state.

vLLM recycles state pages without clearing them, and not every first step of a request
reaches a layer as a prefill row with `has_initial_state` false:
- under speculative decoding, a new one-token request that joins a decode batch is scheduled
  as a verify window of 1 + k tokens (k placeholder drafts, so that decode batches stay
  uniform); vLLM's GDN metadata makes it a spec decode row, its Mamba-2 metadata a prefill
  row carrying drafts (`layers/mamba2.py` verifies those as decode rows too);
- vLLM's GDN metadata makes a new one-token request a decode row (decode threshold 1).
Such a row has nothing computed before this step (seq_len == q), and it must start from the
state a prefill of zero tokens leaves: HP and LP zero, conv context zero, cursor reset.
"""

from __future__ import annotations

import torch

from vllm_replayssm.kernels.common.cursor import reset_words
from vllm_replayssm.layout import NULL_BLOCK_ID


def fresh_rows(slots: torch.Tensor, q: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """[R] bool: rows whose request has no computed tokens before this step (seq_len == q),
    padding excluded (NULL rows, rows without tokens). slots, q (tokens this step), seq_lens
    (request lengths after it): [R] int."""
    q = q.long()
    return (seq_lens.long() == q) & (q > 0) & (slots != NULL_BLOCK_ID)


def start_fresh_rows(
    cache,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    q: torch.Tensor | None,
    seq_lens: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    stagger: bool,
    graph_safe: bool | None = None,
) -> None:
    """Reset the pages of the fresh rows (`fresh_rows`) before their step reads them.

    cache: the layer's Mamba2ReplayCache or GDNReplayCache (hp [S, ...] fp32, lp like hp or
    None, meta [S, META_LEN] int32); conv_state: [S, D, M] (the dim-first view); slots, q
    (tokens this step; None: one per row, plain decode), seq_lens (request lengths after
    it): [R] int. On the CPU platform
    the rows are selected on the host (free there; nothing to do on steps without fresh
    rows). On GPUs the step may be a CUDA graph: one launch over every row decides which
    are fresh and resets their HP, LP, conv state and cursor words
    (`kernels/common/triton_fresh.py`; the other rows' programs exit at once).
    `graph_safe` picks the latter on any device (None: on CUDA tensors)."""
    if graph_safe is None:
        graph_safe = cache.hp.is_cuda
    if graph_safe:
        from vllm_replayssm.kernels.common.triton_fresh import reset_fresh_rows

        lp = [] if cache.lp is None else [cache.lp]
        reset_fresh_rows(
            [cache.hp, *lp, conv_state],
            cache.meta,
            slots,
            q,
            seq_lens,
            buffer_len=buffer_len,
            window=window,
            stagger=stagger,
        )
        return
    if q is None:
        q = torch.ones_like(seq_lens)
    rows = slots[fresh_rows(slots, q, seq_lens)].long()
    if rows.numel() == 0:
        return
    cache.hp[rows] = 0
    if cache.lp is not None:
        cache.lp[rows] = 0
    conv_state[rows] = 0
    cache.meta[rows] = reset_words(rows, buffer_len, window, stagger).to(cache.meta.dtype)
