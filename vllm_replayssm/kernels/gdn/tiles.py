"""Triton tile helpers shared by the Gated DeltaNet kernels (`decode.py`, the replay step;
`stock_route.py`, the stock read + write step): the key normalisation and the advance of one
value head's checkpoint tile over committed ring entries."""

import triton
import triton.language as tl


@triton.jit
def l2norm(x):
    """x / sqrt(sum(x^2) + 1e-6) of a [BLOCK_K] fp32 vector (vLLM's in-kernel q/k norm)."""
    return x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def advance_tile(
    S,
    p_rg,
    p_rbeta,
    p_rk,
    p_rd,
    p_rv,
    fo,
    fn,
    num_ring_rows,
    o_v,
    o_k,
    m_v,
    m_k,
    stride_rg_row,
    stride_rbeta_row,
    stride_rk_row,
    stride_rk_k,
    stride_rd_row,
    stride_rd_v,
    stride_rv_row,
    stride_rv_v,
    EXACT_FLUSH: tl.constexpr,
):
    """S (one value head's [BLOCK_V, BLOCK_K] fp32 tile) advanced over ring entries
    [fo, fo + fn) (rows mod num_ring_rows): exact, the delta rule replayed in the stock
    order; else the weighted sum of cached corrected values."""
    if EXACT_FLUSH:
        for j in tl.range(fn, num_stages=1):
            row = (fo + j) % num_ring_rows
            k_j = l2norm(
                tl.load(p_rk + row * stride_rk_row + o_k * stride_rk_k, mask=m_k, other=0.0).to(
                    tl.float32
                )
            )
            v_j = tl.load(p_rv + row * stride_rv_row + o_v * stride_rv_v, mask=m_v, other=0.0).to(
                tl.float32
            )
            S = S * tl.exp(tl.load(p_rg + row * stride_rg_row))
            d_j = (v_j - tl.sum(S * k_j[None, :], axis=1)) * tl.load(
                p_rbeta + row * stride_rbeta_row
            )
            S = S + d_j[:, None] * k_j[None, :]
    else:
        gam_tot = tl.zeros([], dtype=tl.float32)
        for j in tl.range(fn, num_stages=1):
            gam_tot += tl.load(p_rg + ((fo + j) % num_ring_rows) * stride_rg_row)
        S = S * tl.exp(gam_tot)
        gam_j = tl.zeros([], dtype=tl.float32)
        for j in tl.range(fn, num_stages=1):
            row = (fo + j) % num_ring_rows
            gam_j += tl.load(p_rg + row * stride_rg_row)
            k_j = l2norm(
                tl.load(p_rk + row * stride_rk_row + o_k * stride_rk_k, mask=m_k, other=0.0).to(
                    tl.float32
                )
            )
            d_j = tl.load(p_rd + row * stride_rd_row + o_v * stride_rd_v, mask=m_v, other=0.0).to(
                tl.float32
            )
            S += (tl.exp(gam_tot - gam_j) * d_j)[:, None] * k_j[None, :]
    return S
