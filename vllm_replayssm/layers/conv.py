"""The short causal conv of SSM layers under speculative decoding, on our one-page layout
(torch; the CPU platform).

The conv state of a slot holds M = K - 1 + k input columns (vLLM's width with k speculative
tokens), in vLLM's GPU order: the newest column last. After a decode step of q tokens the
state ends with the q window inputs, preceded by the committed inputs before the window.
When the next step commits a' = min(accepted, pending) of those q window tokens, the
committed context ends at column e = M - q + a'; the rejected columns after it are never
read, and the next window's inputs replace them. A freshly prefilled slot (pending 0) has
its context at the end (e = M): `conv_context_to_back` puts it there after vLLM's CPU
prefill conv, which keeps the last K - 1 inputs in the first columns
(`conv_context_to_front` is the inverse, for the next chunk of a chunked prefill).
"""

from __future__ import annotations

import torch
from torch.nn import functional


def conv_context_to_back(conv_state: torch.Tensor, slots: torch.Tensor, kernel: int) -> None:
    """Move the K - 1 context columns of `slots` from the front to the back.
    conv_state: [S, D, M] (any strides; the dim-first view); slots: [R] long."""
    if slots.numel() == 0:
        return
    w = kernel - 1
    rows = conv_state[slots]
    conv_state[slots] = torch.cat([rows[..., w:], rows[..., :w]], dim=-1)


def conv_context_to_front(conv_state: torch.Tensor, slots: torch.Tensor, kernel: int) -> None:
    """Inverse of `conv_context_to_back` (the next prefill chunk reads the front)."""
    if slots.numel() == 0:
        return
    w = kernel - 1
    rows = conv_state[slots]
    conv_state[slots] = torch.cat([rows[..., -w:], rows[..., :-w]], dim=-1)


def spec_conv_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    pending: torch.Tensor,
    committed: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    """Conv outputs of R decode windows and the new conv states.

    x: [num_tokens, D] window inputs, rows in query_start_loc order ([R + 1] int, the
    decode rows from token 0); conv_state: [S, D, M] dim-first view, updated in place for
    `slots` [R] (long, no NULL rows); pending: [R] int, the window length of each row's
    previous step (0 after a prefill); committed: [R] int, how many of those tokens are
    committed now (min(accepted, pending)); weight: [D, K]; bias: [D] or None.
    Returns [num_tokens, D] in x's dtype.
    """
    K = weight.shape[-1]
    M = conv_state.shape[-1]
    out = torch.empty_like(x)
    qsl = query_start_loc.tolist()
    ends = (M - pending.long() + committed.long()).tolist()
    rows = conv_state[slots]  # [R, D, M]
    new_rows = torch.empty_like(rows)
    w = weight.unsqueeze(1)  # [D, 1, K]
    for r in range(slots.numel()):
        e = int(ends[r])
        if not K - 1 <= e <= M:
            raise RuntimeError(f"conv context end {e} outside [{K - 1}, {M}] (row {r})")
        xr = x[qsl[r]:qsl[r + 1]].transpose(0, 1)  # [D, q]
        seq = torch.cat([rows[r, :, :e], xr.to(rows.dtype)], dim=-1)  # [D, e + q]
        y = functional.conv1d(seq[:, e - (K - 1):].unsqueeze(0).to(weight.dtype), w, bias,
                     groups=weight.shape[0])[0]  # [D, q]
        if activation in ("silu", "swish"):
            y = functional.silu(y)
        out[qsl[r]:qsl[r + 1]] = y.transpose(0, 1).to(out.dtype)
        tail = seq[:, -M:]
        if tail.shape[-1] < M:  # cannot happen with e >= K - 1 and q >= 1 when M <= K - 1 + q
            tail = torch.cat([rows[r, :, : M - tail.shape[-1]], tail], dim=-1)
        new_rows[r] = tail
    conv_state[slots] = new_rows
    return out
