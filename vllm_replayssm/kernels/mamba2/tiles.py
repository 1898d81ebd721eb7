"""Triton tile helpers shared by the Mamba-2 kernels that fold a head's ring records one at
a time (the one-launch window step, `window.py`, and the stock route, `stock_route.py`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fold_tile(
    S,
    p_rdt,
    p_rx,
    p_rB,
    A,
    fo,
    fn,
    num_ring_rows,
    o_p,
    o_n,
    m_p,
    m_n,
    stride_rdt_row,
    stride_rx_row,
    stride_rx_dim,
    stride_rB_row,
    stride_rB_dstate,
):
    """S (one head's [BLOCK_P, BLOCK_N] fp32 tile) folded over ring entries [fo, fo + fn) of
    a ring of num_ring_rows rows. Rank-1 fp32 updates, for kernels whose every program
    carries this code (a tensor-core dot would cost registers in all of them; `flush.py` has
    the dot)."""
    lam_tot = tl.zeros([], dtype=tl.float32)
    for j in tl.range(fn, num_stages=1):
        lam_tot += tl.load(p_rdt + ((fo + j) % num_ring_rows) * stride_rdt_row)
    S = S * tl.exp(A * lam_tot)
    lam_j = tl.zeros([], dtype=tl.float32)
    for j in tl.range(fn, num_stages=1):
        row_j = (fo + j) % num_ring_rows
        dt_j = tl.load(p_rdt + row_j * stride_rdt_row)
        lam_j += dt_j
        x_j = tl.load(p_rx + row_j * stride_rx_row + o_p * stride_rx_dim, mask=m_p, other=0.0).to(
            tl.float32
        )
        B_j = tl.load(
            p_rB + row_j * stride_rB_row + o_n * stride_rB_dstate, mask=m_n, other=0.0
        ).to(tl.float32)
        S += (dt_j * tl.exp(A * (lam_tot - lam_j)) * x_j)[:, None] * B_j[None, :]
    return S
