"""The short causal conv state of SSM layers on our page: its dim-first view
(`conv_state_view`), and, under speculative decoding, the conv of a window on the one-page
layout (torch on the CPU platform; on GPUs its one-launch Triton twin,
`kernels/common/triton_conv.py`).

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

from collections.abc import Sequence

import torch
from torch.nn import functional


def conv_state_view(kv_cache: Sequence[torch.Tensor]) -> torch.Tensor:
    """A layer's conv state (its page's tensor 0, as vLLM's stock layers keep it) as
    [slots, dim, width], dim-first whatever the stored orientation (a view)."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    conv = kv_cache[0]
    return conv if is_conv_state_dim_first() else conv.transpose(-1, -2)


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


def conv_context_commit(
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    pending: torch.Tensor,
    committed: torch.Tensor,
    kernel: int,
) -> None:
    """Put the committed context of `slots` in the last K - 1 columns, where a prefilled
    slot (pending 0) keeps it: a page whose last step left a window of `pending` tokens, of
    which `committed` count now (min(accepted, pending)), has its context end at column
    e = M - pending + committed. conv_state: [S, D, M] (the dim-first view); slots,
    pending, committed: [R] int."""
    if slots.numel() == 0:
        return
    w, M = kernel - 1, conv_state.shape[-1]
    rows = conv_state[slots]  # [R, D, M], a copy
    end = (M - pending.long() + committed.long()).clamp(w, M)
    idx = end[:, None] + torch.arange(-w, 0, device=end.device)[None, :]  # [R, K - 1]
    rows[..., M - w :] = torch.gather(rows, 2, idx[:, None, :].expand(-1, rows.shape[1], -1))
    conv_state[slots] = rows


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
    window: int,
) -> torch.Tensor:
    """Conv outputs of R decode windows and the new conv states, with tensor ops only (no
    host synchronisation, fixed shapes: usable inside CUDA graphs). On CUDA tensors the
    one-launch Triton twin runs instead (`kernels/common/triton_conv.py`: these ~25 ops each
    cost a kernel's latency in every SSM layer of a speculative step).

    x: [num_tokens, D] window inputs, rows in query_start_loc order ([R + 1] int, from token
    0; rows of 0 tokens allowed, e.g. graph padding); conv_state: [S, D, M] dim-first view,
    updated in place for `slots` [R] (padding rows may all name the NULL slot: whatever they
    write there is never read); pending: [R] int, each row's previous window length (0 after
    a prefill); committed: [R] int, how many of those tokens are committed now
    (min(accepted, pending)); weight: [D, K]; bias: [D] or None; window: >= every row's
    token count. Returns [num_tokens, D] in x's dtype (tokens past query_start_loc[-1]: 0).
    """
    if x.is_cuda:
        from vllm_replayssm.kernels.common.triton_conv import spec_conv_update_triton

        return spec_conv_update_triton(
            x,
            conv_state,
            slots,
            query_start_loc,
            pending,
            committed,
            weight,
            bias,
            activation,
            window,
        )
    R, D, K = slots.shape[0], weight.shape[0], weight.shape[-1]
    M, N = conv_state.shape[-1], x.shape[0]
    dev = x.device
    if R == 0 or N == 0:
        return torch.zeros_like(x)
    qsl = query_start_loc.to(device=dev, dtype=torch.long)
    starts, q = qsl[:-1], qsl[1:] - qsl[:-1]
    i = torch.arange(window, device=dev)
    mask = i[None, :] < q[:, None]  # [R, window]
    tok = torch.where(mask, starts[:, None] + i[None, :], 0).clamp(max=N - 1)
    rows = conv_state[slots]  # [R, D, M]
    xw = torch.where(mask[:, None, :], x[tok].transpose(1, 2).to(rows.dtype), 0)  # [R, D, window]
    end = (M - pending.long() + committed.long()).clamp(K - 1, M)  # committed context end
    prior_idx = end[:, None] + torch.arange(-(K - 1), 0, device=dev)[None, :]  # [R, K - 1]
    prior = torch.gather(rows, 2, prior_idx[:, None, :].expand(R, D, K - 1))
    seq = torch.cat([prior, xw], dim=-1).to(weight.dtype)  # [R, D, K - 1 + window]
    y = functional.conv1d(
        seq.reshape(1, R * D, K - 1 + window),
        weight.repeat(R, 1)[:, None, :],
        None if bias is None else bias.repeat(R),
        groups=R * D,
    )
    y = y.reshape(R, D, window)
    if activation in ("silu", "swish"):
        y = functional.silu(y)
    # Token t of row r(t) at window position t - qsl[r(t)].
    t = torch.arange(N, device=dev)
    r_of_t = (torch.searchsorted(qsl[1:], t, right=True)).clamp(max=R - 1)
    pos = (t - starts[r_of_t]).clamp(0, window - 1)
    out = y[r_of_t, :, pos].to(x.dtype)
    out = torch.where((t < qsl[-1])[:, None], out, 0)
    # New state: the last M columns of (committed columns [0, end), then the q inputs).
    m = torch.arange(M, device=dev)
    src = end[:, None] + q[:, None] - M + m[None, :]  # position in that sequence  [R, M]
    from_state = torch.gather(rows, 2, src.clamp(0, M - 1)[:, None, :].expand(R, D, M))
    from_x = torch.gather(
        xw, 2, (src - end[:, None]).clamp(0, window - 1)[:, None, :].expand(R, D, M)
    )
    conv_state[slots] = torch.where((src < end[:, None])[:, None, :], from_state, from_x)
    return out
