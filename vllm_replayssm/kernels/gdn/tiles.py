"""Triton tile helpers shared by the Gated DeltaNet kernels (the plain-decode launches
`plan.py`, `readout.py`, `flush.py`; the window step `window.py`; the stock route
`stock_route.py`): the key normalisation, the plain-decode readout of one tile, and the
advance of one value head's checkpoint tile over committed ring entries."""

import triton
import triton.language as tl


@triton.jit
def l2norm(x):
    """x / sqrt(sum(x^2) + 1e-6) of a [BLOCK_K] fp32 vector (vLLM's in-kernel q/k norm)."""
    return x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def beta_gate(b):
    """β = sigmoid(b) rounded to b's dtype (as vLLM's kernel does), returned in fp32; b: any
    shape, in its input dtype. The bf16 rounding is written out (round to nearest even on
    the fp32 bits; sigmoid is finite and positive): GPUs round the plain cast the same way,
    but Triton's interpreter truncates it, which would put one-ulp β errors into every
    interpreted bf16 test."""
    beta = tl.sigmoid(b.to(tl.float32))
    if b.dtype == tl.bfloat16:
        bits = beta.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return beta.to(b.dtype).to(tl.float32)


@triton.jit
def l2norm_rows(x):
    """Each row of a [rows, BLOCK_K] fp32 tile normalised as `l2norm` does."""
    return x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]


@triton.jit
def readout_tile(S, kn, qn, coef_k, coef_q, d_h, exp_gam, alpha, beta, kq, v):
    """The plain-decode readout of one value tile (README "Readout"), fp32.

    S: [BLOCK_V, BLOCK_K] checkpoint tile S0; kn, qn: [BLOCK_K] normalised k_t and scaled q_t;
    coef_k, coef_q: [BLOCK_L] e^{Γn−Γj}(k_j·k_t) and e^{Γn−Γj}(k_j·q_t) (zero past the
    history); d_h: [BLOCK_L, BLOCK_V] cached corrected values; exp_gam = e^{Γn}; alpha =
    e^{g_t}; beta = β_t; kq = k_t·q_t; v: [BLOCK_V] fp32. Returns (d_t, o_t), [BLOCK_V] each:
    u = S_n k_t, w = S_n q_t, d_t = β(v − α u), o_t = α w + (k_t·q_t) d_t.
    """
    u = exp_gam * tl.sum(S * kn[None, :], axis=1) + tl.sum(coef_k[:, None] * d_h, axis=0)
    w = exp_gam * tl.sum(S * qn[None, :], axis=1) + tl.sum(coef_q[:, None] * d_h, axis=0)
    d_t = beta * (v - alpha * u)
    return d_t, alpha * w + kq * d_t


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
