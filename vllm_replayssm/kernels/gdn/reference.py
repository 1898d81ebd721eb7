"""Torch twins of the Gated DeltaNet decode ops (stock baseline and ReplaySSM).

They are the oracles of the Triton kernels (same signatures) and the CPU path of the vLLM
layer. Arithmetic is fp32. The exact flush and the stock step share `delta_rule_step`, so in
torch an exact flush leaves HP bitwise equal to the stock fp32 path. Maths: `README.md`.
"""

from __future__ import annotations

import torch

from vllm_replayssm.kernels.common.checkpoint import read_checkpoint, write_checkpoint
from vllm_replayssm.kernels.common.cursor import plan_step, reset_meta
from vllm_replayssm.kernels.common.ring import gather_logical, scatter_window, window_tokens
from vllm_replayssm.kernels.common.rows import active_rows
from vllm_replayssm.kernels.gdn.naive import gdn_gates, l2norm
from vllm_replayssm.layout import NULL_BLOCK_ID, GDNReplayCache, ring_rows


def delta_rule_step(
    S: torch.Tensor, kn: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """One gated delta-rule update in fp32, in vLLM's decode-kernel order.

    S: [..., Hv, V, K]; kn: [..., Hv, K] normalised keys; v: [..., Hv, V]; g, beta: [..., Hv].
    """
    S = S * torch.exp(g)[..., None, None]
    d = (v - (S * kn[..., None, :]).sum(-1)) * beta[..., None]
    return S + d[..., None] * kn[..., None, :]


def _heads(x: torch.Tensor, rep: int, dim: int) -> torch.Tensor:
    return x.repeat_interleave(rep, dim=dim) if rep > 1 else x


def _stock_update(
    S: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One delta-rule step in fp32. S: [R, Hv, V, K]; q, k: [R, Hk, K]; v: [R, Hv, V];
    a, b: [R, Hv]. Returns the new state and o: [R, Hv, V] (fp32)."""
    rep = v.shape[1] // k.shape[1]
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    kn = _heads(l2norm(k.float()), rep, 1)
    qn = _heads(l2norm(q.float()), rep, 1) * scale
    S = delta_rule_step(S, kn, v.float(), g, beta)
    return S, (S * qn[:, :, None, :]).sum(-1)


def gdn_stock_decode(
    ssm_state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """Baseline decode step (vLLM's packed GDN decode semantics): read, update, write.

    ssm_state: [S, Hv, V, K] (updated in place, computed in fp32); q, k: [R, Hk, K];
    v: [R, Hv, V]; a, b: [R, Hv]; A_log, dt_bias: [Hv]; state_indices: [R];
    out: [R, Hv, V] (NULL rows get zeros).
    """
    active = state_indices != null_block_id
    out[~active] = 0
    if not bool(active.any()):
        return
    slots = state_indices[active].long()
    S, o = _stock_update(
        ssm_state[slots].float(),
        q[active],
        k[active],
        v[active],
        a[active],
        b[active],
        A_log,
        dt_bias,
        scale,
    )
    out[active] = o.to(out.dtype)
    ssm_state[slots] = S.to(ssm_state.dtype)


def _fold(
    cache: GDNReplayCache,
    slots: torch.Tensor,
    origin: torch.Tensor,
    count: torch.Tensor,
    steps: int | None = None,
) -> torch.Tensor:
    """HP advanced over logical entries [0, count): [R, Hv, V, K] fp32 (nothing written).

    exact (ring keeps v and beta): the delta rule replayed serially from HP, over `steps`
    entries (each row's past its count leave it as it is; None: the largest count, read
    back from the device);
    fold: e^{Gamma_n} S0 + sum_j e^{Gamma_n - Gamma_j} d_j k_j^T over cached d.
    """
    Hv, Hk = cache.hp.shape[1], cache.ring_k.shape[1]
    rep = Hv // Hk
    num_ring_rows = cache.ring_g.shape[2]
    keep = torch.arange(num_ring_rows, device=slots.device)[None, :] < count[:, None]
    g = torch.where(keep[:, None, :], gather_logical(cache.ring_g, slots, origin), 0.0)
    ks = gather_logical(cache.ring_k, slots, origin).float()
    ks = torch.where(keep[:, None, :, None], ks, 0.0)
    kn = _heads(l2norm(ks), rep, 1)  # [R, Hv, num_ring_rows, K]
    S = cache.hp[slots].float()
    if cache.exact_flush:
        vs = gather_logical(cache.ring_v, slots, origin).float()
        vs = torch.where(keep[:, None, :, None], vs, 0.0)
        beta = torch.where(keep[:, None, :], gather_logical(cache.ring_beta, slots, origin), 0.0)
        if steps is None:
            steps = int(count.max()) if count.numel() else 0
        for j in range(steps):
            nxt = delta_rule_step(S, kn[:, :, j], vs[:, :, j], g[:, :, j], beta[:, :, j])
            S = torch.where(keep[:, j, None, None, None], nxt, S)
        return S
    ds = gather_logical(cache.ring_d, slots, origin).float()
    ds = torch.where(keep[:, None, :, None], ds, 0.0)
    gam = torch.cumsum(g, dim=-1)
    gam_n = gam[..., -1:]
    w = torch.where(keep[:, None, :], torch.exp(gam_n - gam), 0.0)  # [R, Hv, num_ring_rows]
    return torch.exp(gam_n)[..., None] * S + torch.einsum("rhc,rhcv,rhck->rhvk", w, ds, kn)


def gdn_replay_decode(
    cache: GDNReplayCache,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    buffer_len: int,
    window: int,
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """One ReplaySSM decode step (plain or speculative) for a batch of rows.

    cache: the layer's paged tensors (updated in place: ring records of the window, meta,
        and HP + LP of rows that flush).
    q, k: [num_tokens, Hk, K] act (pre-norm); v: [num_tokens, Hv, V] act;
    a, b: [num_tokens, Hv]; A_log, dt_bias: [Hv] fp32; state_indices: [R] int (NULL rows
    skipped, outputs zeroed); out: [num_tokens, Hv, V] (written).
    query_start_loc / num_accepted_tokens: as in `mamba2_replay_decode`.
    A window of several tokens is verified output-only: corrected values d_i solve
    (I + A) d = r by forward substitution (design §1.5); nothing but records is written.
    """
    num_ring_rows = ring_rows(buffer_len, window)
    dev = v.device
    R = state_indices.numel()
    Hv, Hk = v.shape[1], k.shape[1]
    rep = Hv // Hk
    tok, mask, q_len = window_tokens(R, window, query_start_loc, dev)
    active = state_indices.to(dev) != null_block_id
    out[tok[~active][mask[~active]]] = 0
    if not bool(active.any()):
        return
    slots = state_indices.to(dev)[active].long()
    tok, mask, q_len = tok[active], mask[active], q_len[active]
    acc = None if num_accepted_tokens is None else num_accepted_tokens.to(dev)[active]
    plan = plan_step(cache.meta[slots], q_len, acc, buffer_len, window)

    S0 = read_checkpoint(cache, slots, plan.lp_stale)
    if bool(plan.flush.any()):
        f = plan.flush
        S_new = _fold(cache, slots[f], plan.fold_origin[f], plan.fold_count[f])
        write_checkpoint(cache, slots[f], S_new)
        S0[f] = S_new

    # Window quantities, fp32: [R, window, Hv, ...].
    gw, bw = gdn_gates(a[tok], b[tok], A_log, dt_bias)  # [R, window, Hv]
    gw = torch.where(mask[..., None], gw, 0.0)
    knw = _heads(l2norm(k[tok].float()), rep, 2)  # [R, window, Hv, K]
    qnw = _heads(l2norm(q[tok].float()), rep, 2) * scale
    vw = v[tok].float()

    # History: committed entries [0, n) at the (post-flush) origin.
    hist = torch.arange(num_ring_rows, device=dev)[None, :] < plan.committed[:, None]
    gh = torch.where(hist[:, None, :], gather_logical(cache.ring_g, slots, plan.origin), 0.0)
    hist4 = hist[:, None, :, None]
    kh = torch.where(hist4, gather_logical(cache.ring_k, slots, plan.origin).float(), 0.0)
    knh = _heads(l2norm(kh), rep, 1)  # [R, Hv, num_ring_rows, K]
    dh = torch.where(hist4, gather_logical(cache.ring_d, slots, plan.origin).float(), 0.0)
    gam = torch.cumsum(gh, dim=-1)
    gam_n = gam[..., -1]  # [R, Hv]
    wh = torch.where(hist[:, None, :], torch.exp(gam_n[..., None] - gam), 0.0)

    # u_i = S_n k_i and w_i = S_n q_i with S_n = e^{Gamma_n} S0 + sum_j wh_j d_j k_j^T.
    def apply_state(vec: torch.Tensor) -> torch.Tensor:  # [R, window, Hv, K] -> [.., V]
        ck = torch.einsum("rhvk,rthk->rthv", S0, vec) * torch.exp(gam_n)[:, None, :, None]
        gram = torch.einsum("rhck,rthk->rthc", knh, vec) * wh[:, None]
        return ck + torch.einsum("rthc,rhcv->rthv", gram, dh)

    u, w = apply_state(knw), apply_state(qnw)
    G = torch.cumsum(gw, dim=1)  # [R, window, Hv] window-local, inclusive
    kk = torch.einsum("rihk,rjhk->rhij", knw, knw)
    kq = torch.einsum("rjhk,rihk->rhij", knw, qnw)  # [R, Hv, i, j] = k_j . q_i
    ds: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    for i in range(window):
        d_i = bw[:, i, :, None] * (vw[:, i] - torch.exp(G[:, i])[..., None] * u[:, i])
        for j in range(i):
            coef = bw[:, i] * torch.exp(G[:, i] - G[:, j]) * kk[:, :, i, j]
            d_i = d_i - coef[..., None] * ds[j]
        ds.append(d_i)
        o_i = torch.exp(G[:, i])[..., None] * w[:, i]
        for j in range(i + 1):
            o_i = o_i + (torch.exp(G[:, i] - G[:, j]) * kq[:, :, i, j])[..., None] * ds[j]
        outs.append(o_i)
    dw = torch.stack(ds, dim=1)  # [R, window, Hv, V]
    ow = torch.stack(outs, dim=1)

    first = plan.origin + plan.committed
    scatter_window(cache.ring_g, slots, first, gw, mask)
    scatter_window(cache.ring_k, slots, first, k[tok], mask)
    scatter_window(cache.ring_d, slots, first, dw, mask)
    if cache.exact_flush:
        scatter_window(cache.ring_beta, slots, first, bw, mask)
        scatter_window(cache.ring_v, slots, first, v[tok], mask)
    out[tok[mask]] = ow[mask].to(out.dtype)
    cache.meta[slots] = plan.meta()


def gdn_replay_materialise(
    cache: GDNReplayCache,
    state_indices: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    stagger: bool,
    num_accepted_tokens: torch.Tensor | None = None,
    null_block_id: int = NULL_BLOCK_ID,
    null_free: bool = False,
) -> None:
    """Fold every committed ring entry into HP (HP + LP written) and reset the cursor, so
    stock code may read HP of these rows (see `mamba2_replay_materialise`, also for
    null_free; with it the exact fold walks every ring row instead of reading the largest
    count back)."""
    slots, acc = active_rows(state_indices, num_accepted_tokens, null_block_id, null_free)
    if slots is None:
        return
    zero_q = torch.zeros_like(slots)
    plan = plan_step(cache.meta[slots], zero_q, acc, buffer_len, window, force_flush=True)
    steps = cache.ring_g.shape[2] if null_free else None
    S = _fold(cache, slots, plan.fold_origin, plan.fold_count, steps)
    write_checkpoint(cache, slots, S)
    reset_meta(cache.meta, slots, buffer_len, window, stagger)


def gdn_stock_route_decode(
    cache: GDNReplayCache,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    buffer_len: int,
    window: int,
    stagger: bool,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """The stock read + write step on a ReplaySSM page (see `mamba2_stock_route_decode`):
    committed ring entries folded first, then one delta-rule step on HP, written alone; LP
    marked stale and the cursor reset. Arguments as in `gdn_replay_decode` (plain decode)."""
    active = state_indices != null_block_id
    out[~active] = 0
    if not bool(active.any()):
        return
    slots = state_indices[active].long()
    zero_q = torch.zeros_like(slots)
    plan = plan_step(cache.meta[slots], zero_q, None, buffer_len, window, force_flush=True)
    S = _fold(cache, slots, plan.fold_origin, plan.fold_count)
    S, o = _stock_update(
        S, q[active], k[active], v[active], a[active], b[active], A_log, dt_bias, scale
    )
    out[active] = o.to(out.dtype)
    cache.hp[slots] = S
    reset_meta(cache.meta, slots, buffer_len, window, stagger, lp_stale=True)
