"""Torch twins of the Mamba-2 decode ops (stock baseline and ReplaySSM), device-agnostic.

They are the oracles of the Triton kernels (same signatures) and the CPU path of the vLLM
layer. All arithmetic is fp32; records and outputs are stored in the dtypes of their
buffers. Maths: `README.md` beside this file.
"""

from __future__ import annotations

import torch

from vllm_replayssm.kernels.common.checkpoint import read_checkpoint, write_checkpoint
from vllm_replayssm.kernels.common.cursor import plan_step, reset_meta, ring_rows
from vllm_replayssm.kernels.common.ring import gather_logical, scatter_window, window_tokens
from vllm_replayssm.kernels.common.rows import active_rows
from vllm_replayssm.kernels.mamba2.naive import softplus_dt
from vllm_replayssm.layout import NULL_BLOCK_ID, Mamba2ReplayCache


def _stock_update(
    S: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrence step in fp32. S: [R, H, P, N] fp32; x: [R, H, P]; dt: [R, H];
    B, C: [R, G, N]. Returns the new state and y: [R, H, P] (fp32)."""
    H, G = x.shape[1], B.shape[1]
    dts = softplus_dt(dt.float(), dt_bias.float())  # [R, H]
    xs = x.float()
    Bh = B.float().repeat_interleave(H // G, dim=1)  # [R, H, N]
    Ch = C.float().repeat_interleave(H // G, dim=1)
    decay = torch.exp(A.float() * dts)
    S = decay[..., None, None] * S + (dts[..., None] * xs)[..., None] * Bh[:, :, None, :]
    return S, torch.einsum("rhpn,rhn->rhp", S, Ch) + D.float()[:, None] * xs


def mamba2_stock_decode(
    ssm_state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """Baseline decode step (vLLM's `selective_state_update` semantics): read, update, write.

    ssm_state: [S, H, P, N] (any float dtype; updated in place, computed in fp32);
    x: [R, H, P]; dt: [R, H] raw; A, D, dt_bias: [H] fp32; B, C: [R, G, N];
    state_indices: [R] int; out: [R, H, P] (NULL rows get zeros).
    """
    active = state_indices != null_block_id
    out[~active] = 0
    if not bool(active.any()):
        return
    slots = state_indices[active].long()
    S, y = _stock_update(
        ssm_state[slots].float(), x[active], dt[active], A, B[active], C[active], D, dt_bias
    )
    out[active] = y.to(out.dtype)
    ssm_state[slots] = S.to(ssm_state.dtype)


def mamba2_prefill_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    query_start_loc: torch.Tensor,
    initial_states: torch.Tensor | None,
    out: torch.Tensor,
) -> torch.Tensor:
    """Token-by-token prefill of a batch of sequences (the CPU stand-in for vLLM's chunked
    scan `mamba_chunk_scan_combined_varlen`, which is Triton only).

    x: [T, H, P]; dt: [T, H] raw; B, C: [T, G, N]; query_start_loc: [R + 1] int (sequence
    r owns tokens [qsl[r], qsl[r+1])); initial_states: [R, H, P, N] or None (zeros);
    out: [T, H, P], written. Returns the final states [R, H, P, N] fp32.
    """
    R = query_start_loc.shape[0] - 1
    H, P, N = x.shape[1], x.shape[2], B.shape[2]
    bounds = query_start_loc.tolist()
    finals = x.new_zeros((R, H, P, N), dtype=torch.float32)
    for r in range(R):
        S = (
            initial_states[r].float() if initial_states is not None else finals.new_zeros((H, P, N))
        )[None]
        for t in range(bounds[r], bounds[r + 1]):
            S, y = _stock_update(
                S, x[t : t + 1], dt[t : t + 1], A, B[t : t + 1], C[t : t + 1], D, dt_bias
            )
            out[t] = y[0].to(out.dtype)
        finals[r] = S[0]
    return finals


def _fold(
    cache: Mamba2ReplayCache,
    slots: torch.Tensor,
    origin: torch.Tensor,
    count: torch.Tensor,
    A: torch.Tensor,
) -> torch.Tensor:
    """HP folded over logical entries [0, count): [R, H, P, N] fp32 (nothing written)."""
    H, G = cache.hp.shape[1], cache.ring_B.shape[1]
    C = cache.ring_dt.shape[2]
    keep = torch.arange(C, device=slots.device)[None, :] < count[:, None]  # [R, C]
    dts = torch.where(keep[:, None, :], gather_logical(cache.ring_dt, slots, origin), 0.0)
    lam = torch.cumsum(dts, dim=-1)  # [R, H, C]
    lam_n = lam[..., -1:]
    w = dts * torch.exp(A.float()[None, :, None] * (lam_n - lam))  # zero where not kept
    # Rows outside the fold region may hold garbage (NaN): zero them, never multiply by 0.
    keep4 = keep[:, None, :, None]
    xs = torch.where(keep4, gather_logical(cache.ring_x, slots, origin).float(), 0.0)
    Bs = torch.where(keep4, gather_logical(cache.ring_B, slots, origin).float(), 0.0)
    Bs = Bs.repeat_interleave(H // G, dim=1)  # [R, H, C, N]
    S0 = cache.hp[slots].float()
    decay = torch.exp(A.float()[None, :] * lam_n[..., 0])  # [R, H]
    return decay[..., None, None] * S0 + torch.einsum("rhc,rhcp,rhcn->rhpn", w, xs, Bs)


def mamba2_replay_decode(
    cache: Mamba2ReplayCache,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """One ReplaySSM decode step (plain or speculative) for a batch of rows.

    cache: the layer's paged tensors (updated in place: ring records of the window, meta,
        and HP + LP of rows that flush).
    x: [num_tokens, H, P] act; dt: [num_tokens, H] raw dt; B, C: [num_tokens, G, N] act;
    A, D, dt_bias: [H] fp32; state_indices: [R] int (NULL rows are skipped, their outputs
    zeroed); out: [num_tokens, H, P] (written, pre-gate y).
    query_start_loc: [R + 1] int for R rows of up to `window` tokens, None = one token each.
    num_accepted_tokens: [R] int, the previous step's accepted drafts + 1; None = plain
    decode (everything pending is committed).
    Non-flush rows read LP (HP when LP is off); flush rows read the freshly folded HP.
    """
    L, T = buffer_len, window
    Cn = ring_rows(L, T)
    dev = x.device
    R = state_indices.numel()
    H, G = x.shape[1], B.shape[1]
    tok, mask, q = window_tokens(R, T, query_start_loc, dev)
    active = state_indices.to(dev) != null_block_id
    out[tok[~active][mask[~active]]] = 0
    if not bool(active.any()):
        return
    slots = state_indices.to(dev)[active].long()
    tok, mask, q = tok[active], mask[active], q[active]
    acc = None if num_accepted_tokens is None else num_accepted_tokens.to(dev)[active]
    plan = plan_step(cache.meta[slots], q, acc, L, T)

    # Non-flush rows read LP (HP when LP is off or stale); flush rows fold the committed
    # entries into HP and write HP and LP.
    S0 = read_checkpoint(cache, slots, plan.lp_stale)
    if bool(plan.flush.any()):
        f = plan.flush
        S_new = _fold(cache, slots[f], plan.fold_origin[f], plan.fold_count[f], A)
        write_checkpoint(cache, slots[f], S_new)
        S0[f] = S_new

    # Append the window's records (dt after softplus, fp32; x and B in the ring's dtype).
    xw, Bw = x[tok].float(), B[tok].float()  # [R, T, H, P], [R, T, G, N]
    dtw = softplus_dt(dt[tok].float(), dt_bias.float())  # [R, T, H]
    first = plan.origin + plan.committed
    scatter_window(cache.ring_dt, slots, first, dtw, mask)
    scatter_window(cache.ring_x, slots, first, xw, mask)
    scatter_window(cache.ring_B, slots, first, Bw, mask)

    # Readout of window token i at logical m_i = committed + i from checkpoint + ring [0, m_i].
    ds = gather_logical(cache.ring_dt, slots, plan.origin)  # [R, H, C]
    used = torch.arange(Cn, device=dev)[None, :] < (plan.committed + q)[:, None]
    ds = torch.where(used[:, None, :], ds, 0.0)
    lam = torch.cumsum(ds, dim=-1)  # [R, H, C]
    m = (plan.committed[:, None] + torch.arange(T, device=dev)[None, :]).clamp(max=Cn - 1)
    lam_m = torch.gather(lam, 2, m[:, None, :].expand(-1, H, -1))  # [R, H, T]
    j = torch.arange(Cn, device=dev)
    upto = j[None, None, :] <= m[:, :, None]  # [R, T, C]
    upto = upto[:, None]  # [R, 1, T, C]
    expo = A.float()[None, :, None, None] * (lam_m[..., None] - lam[:, :, None, :])  # [R,H,T,C]
    w = torch.where(upto, ds[:, :, None, :] * torch.exp(torch.where(upto, expo, 0.0)), 0.0)
    usedx = used[:, None, :, None]
    xs = torch.where(usedx, gather_logical(cache.ring_x, slots, plan.origin).float(), 0.0)
    Bs = torch.where(usedx, gather_logical(cache.ring_B, slots, plan.origin).float(), 0.0)
    Cw = C[tok].float()  # [R, T, G, N]
    bc = torch.einsum("rgcn,rtgn->rgtc", Bs, Cw).repeat_interleave(H // G, dim=1)  # [R,H,T,C]
    hist = torch.einsum("rhtc,rhcp->rthp", w * bc, xs)
    Ch = Cw.repeat_interleave(H // G, dim=2)  # [R, T, H, N]
    decay = torch.exp(A.float() * lam_m.transpose(1, 2))[..., None]  # [R, T, H, 1]
    ckpt = torch.einsum("rhpn,rthn->rthp", S0, Ch) * decay
    y = ckpt + hist + D.float()[None, None, :, None] * xw
    out[tok[mask]] = y[mask].to(out.dtype)
    cache.meta[slots] = plan.meta()


def mamba2_replay_materialise(
    cache: Mamba2ReplayCache,
    A: torch.Tensor,
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
    stock code may read HP of these rows. state_indices: [R]; num_accepted_tokens as in
    `mamba2_replay_decode` (the acceptance of the last decode step, if drafts are pending).
    null_free: the caller vouches that no row is the null block, so the rows are taken as
    they are, and nothing is read back from the device (`active_rows`).
    """
    slots, acc = active_rows(state_indices, num_accepted_tokens, null_block_id, null_free)
    if slots is None:
        return
    zero_q = torch.zeros_like(slots)
    plan = plan_step(cache.meta[slots], zero_q, acc, buffer_len, window, force_flush=True)
    write_checkpoint(cache, slots, _fold(cache, slots, plan.fold_origin, plan.fold_count, A))
    reset_meta(cache.meta, slots, buffer_len, window, stagger)


def mamba2_stock_route_decode(
    cache: Mamba2ReplayCache,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    stagger: bool,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """The stock read + write step on a ReplaySSM page, for batches where replay is slower:
    one token per row; any committed ring entries are folded first (a row coming from the
    replay route), then the recurrence updates HP, which is written back alone; LP is marked
    stale and the cursor reset, so later replay steps read HP until their first flush.
    Arguments as in `mamba2_replay_decode` (plain decode only)."""
    active = state_indices != null_block_id
    out[~active] = 0
    if not bool(active.any()):
        return
    slots = state_indices[active].long()
    zero_q = torch.zeros_like(slots)
    plan = plan_step(cache.meta[slots], zero_q, None, buffer_len, window, force_flush=True)
    S = _fold(cache, slots, plan.fold_origin, plan.fold_count, A)
    S, y = _stock_update(S, x[active], dt[active], A, B[active], C[active], D, dt_bias)
    out[active] = y.to(out.dtype)
    cache.hp[slots] = S
    reset_meta(cache.meta, slots, buffer_len, window, stagger, lp_stale=True)
