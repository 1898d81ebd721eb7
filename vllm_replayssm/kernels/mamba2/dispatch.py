"""The one Mamba-2 decode op the layer calls on GPUs, and the route policy.

Routes: "replay" (`decode.py`: plan / flush / readout, for plain decode and, specialised
for the window, speculative decoding) and "stock" (`stock_route.py`: the stock read + write
step on the ReplaySSM page, for batches where replay is slower; plain decode only). "auto"
picks by batch size, from H200 measurements (`STOCK_ROUTE_MAX_ROWS`).
"""

from __future__ import annotations

import torch

from vllm_replayssm.kernels.mamba2.decode import mamba2_replay_decode
from vllm_replayssm.kernels.mamba2.plan import Mamba2Scratch
from vllm_replayssm.kernels.mamba2.stock_route import mamba2_stock_route_decode
from vllm_replayssm.layout import NULL_BLOCK_ID, Mamba2ReplayCache

ROUTES = ("auto", "replay", "stock")
# Plain decode of up to this many rows takes the stock route. H200, 2026-12-01
# (benchmarks/results/kernels-h200-20261201-*-route-*.json), replay vs stock route: Nemotron-3
# Super bs 4 0.71-0.76x vs 0.94x of vLLM's kernel, bs 8 0.89-1.06x vs 0.99x, bs 16
# 1.10-1.33x vs 1.02x; Nano 4B alike.
STOCK_ROUTE_MAX_ROWS = 8


def choose_route(route: str, num_rows: int, plain: bool) -> str:
    """ "replay" or "stock" for a step of num_rows rows (speculative steps always replay)."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if not plain:
        return "replay"
    if route == "auto":
        return "stock" if num_rows <= STOCK_ROUTE_MAX_ROWS else "replay"
    return route


def mamba2_decode(
    cache: Mamba2ReplayCache,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    route: str = "auto",
    stagger: bool = True,
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    scratch: Mamba2Scratch | None = None,
    null_block_id: int = NULL_BLOCK_ID,
) -> str:
    """One decode step of a Mamba-2 layer on its ReplaySSM page; returns the route it took
    ("replay" or "stock").

    Arguments as `reference.mamba2_replay_decode` (x: [num_tokens, H, P] act; dt:
    [num_tokens, H]; B, C: [num_tokens, G, N]; A, D, dt_bias: [H]; state_indices: [R];
    out: [num_tokens, H, P] written), plus route ("auto", "replay", "stock"), stagger (the
    stock route's cursor reset) and scratch (`Mamba2Scratch` for >= R rows; required under
    CUDA graphs).
    """
    plain = window == 1 and query_start_loc is None and num_accepted_tokens is None
    if choose_route(route, state_indices.shape[0], plain) == "stock":
        mamba2_stock_route_decode(
            cache,
            x,
            dt,
            A,
            B,
            C,
            D,
            dt_bias,
            state_indices,
            out,
            buffer_len=buffer_len,
            window=window,
            stagger=stagger,
            null_block_id=null_block_id,
        )
        return "stock"
    mamba2_replay_decode(
        cache,
        x,
        dt,
        A,
        B,
        C,
        D,
        dt_bias,
        state_indices,
        out,
        buffer_len=buffer_len,
        window=window,
        query_start_loc=query_start_loc,
        num_accepted_tokens=num_accepted_tokens,
        null_block_id=null_block_id,
        scratch=scratch,
    )
    return "replay"
