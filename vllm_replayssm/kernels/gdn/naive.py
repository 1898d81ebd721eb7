"""The obvious gated delta rule in float64: the oracle every other GDN path is tested on.

Per value head h (key head h // (Hv / Hk)), with k and q L2-normalised (eps 1e-6) and q
scaled by `scale`:
    g_t = -exp(A_log) * softplus(a_t + dt_bias),  beta_t = sigmoid(b_t) (rounded to b's dtype)
    S_t = e^{g_t} S_{t-1};  d_t = beta_t (v_t - S_t k_t);  S_t += d_t k_t^T;  o_t = S_t q_t
S: [V, K]. Equivalently o_t = e^{g_t} S_{t-1} q_t + (k_t . q_t) d_t.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) as vLLM's decode kernel forms them, in fp32 (a, b: [..., Hv]).

    beta is rounded to b's dtype first, as the stock kernel does."""
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), threshold=20.0)
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    return g, beta


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in x's dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_naive_scan(
    S0: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one sequence token by token in float64.

    S0: [Hv, V, K]; q, k: [T, Hk, K]; v: [T, Hv, V]; a, b: [T, Hv]; A_log, dt_bias: [Hv].
    Returns o: [T, Hv, V] and the final state [Hv, V, K], float64.
    """
    f = torch.float64
    S = S0.to(f).clone()
    Hv, Hk = v.shape[1], k.shape[1]
    rep = Hv // Hk
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    g, beta = g.to(f), beta.to(f)
    qn = l2norm(q.to(f)).repeat_interleave(rep, dim=1) * scale  # [T, Hv, K]
    kn = l2norm(k.to(f)).repeat_interleave(rep, dim=1)
    outs = []
    for t in range(v.shape[0]):
        S = torch.exp(g[t])[:, None, None] * S
        d = beta[t][:, None] * (v[t].to(f) - torch.einsum("hvk,hk->hv", S, kn[t]))
        S = S + d[:, :, None] * kn[t][:, None, :]
        outs.append(torch.einsum("hvk,hk->hv", S, qn[t]))
    return torch.stack(outs), S
