"""The obvious Mamba-2 recurrence in float64: the oracle every other Mamba-2 path is tested on.

Per head h (group g = h // (H / G)):
    dt_t = softplus(dt_t + dt_bias)  (identity above 20),  a_t = exp(A * dt_t)
    S_t  = a_t * S_{t-1} + dt_t * x_t B_t^T          S: [P, N]
    y_t  = S_t C_t + D * x_t
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812


def softplus_dt(dt: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """vLLM's dt transform: softplus(dt + dt_bias), identity above 20 (same dtype as dt)."""
    return F.softplus(dt + dt_bias, threshold=20.0)


def mamba2_naive_scan(
    S0: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one sequence token by token in float64.

    S0: [H, P, N]; x: [T, H, P]; dt: [T, H] (raw, before bias and softplus); A, D, dt_bias:
    [H]; B, C: [T, G, N]. Returns y: [T, H, P] and the final state [H, P, N], float64.
    """
    f = torch.float64
    S = S0.to(f).clone()
    H = S.shape[0]
    G = B.shape[1]
    rep = H // G
    dts = softplus_dt(dt.to(f), dt_bias.to(f))
    ys = []
    for t in range(x.shape[0]):
        Bt = B[t].to(f).repeat_interleave(rep, dim=0)  # [H, N]
        Ct = C[t].to(f).repeat_interleave(rep, dim=0)
        decay = torch.exp(A.to(f) * dts[t])  # [H]
        S = decay[:, None, None] * S + (dts[t][:, None] * x[t].to(f))[:, :, None] * Bt[:, None, :]
        ys.append(torch.einsum("hpn,hn->hp", S, Ct) + D.to(f)[:, None] * x[t].to(f))
    return torch.stack(ys), S
