"""Torch helpers for the ring and the decode window, shared by both families' references."""

from __future__ import annotations

import torch


def window_tokens(
    num_rows: int, window: int, query_start_loc: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token layout of a decode batch.

    query_start_loc: [R + 1] int (row r owns tokens [qsl[r], qsl[r+1])), or None for one
    token per row. Returns tok: [R, window] long token index (0 where masked),
    mask: [R, window] bool, q: [R] long tokens per row (checked <= window).
    """
    if query_start_loc is None:
        starts = torch.arange(num_rows, device=device)
        q = torch.ones(num_rows, dtype=torch.long, device=device)
    else:
        qsl = query_start_loc.to(device=device, dtype=torch.long)
        if qsl.numel() != num_rows + 1:
            raise ValueError(f"query_start_loc has {qsl.numel()} entries for {num_rows} rows")
        starts, q = qsl[:-1], qsl[1:] - qsl[:-1]
    if q.numel() and (int(q.max()) > window or int(q.min()) < 0):
        raise ValueError(f"a row has {q.tolist()} tokens; the window is {window}")
    i = torch.arange(window, device=device)
    mask = i[None, :] < q[:, None]
    tok = torch.where(mask, starts[:, None] + i[None, :], torch.zeros_like(mask, dtype=torch.long))
    return tok, mask, q


def gather_logical(ring: torch.Tensor, slots: torch.Tensor, origin: torch.Tensor) -> torch.Tensor:
    """Ring rows of `slots` in logical order (entry i = row (origin + i) mod num_ring_rows).

    ring: [S, heads, num_ring_rows, *rest]; slots, origin: [R]. Returns [R, heads,
    num_ring_rows, *rest] (a copy).
    """
    num_ring_rows = ring.shape[2]
    rows = torch.remainder(
        origin[:, None] + torch.arange(num_ring_rows, device=ring.device), num_ring_rows
    )  # [R, num_ring_rows]
    g = ring[slots]  # [R, heads, C, *rest]
    idx = rows[:, None, :].expand(-1, g.shape[1], -1)
    idx = idx.reshape(*idx.shape, *([1] * (g.dim() - 3))).expand(*g.shape[:3], *g.shape[3:])
    return torch.gather(g, 2, idx)


def scatter_window(
    ring: torch.Tensor,
    slots: torch.Tensor,
    first_row: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
) -> None:
    """Write window records into the ring in place.

    ring: [S, heads, num_ring_rows, *rest]; slots, first_row: [R] (ring row of window token
    0); values: [R, window, heads, *rest] in any float dtype (cast to the ring's); mask:
    [R, window].
    """
    r, i = mask.nonzero(as_tuple=True)
    rows = torch.remainder(first_row[r] + i, ring.shape[2])
    ring[slots[r], :, rows] = values[r, i].to(ring.dtype)
