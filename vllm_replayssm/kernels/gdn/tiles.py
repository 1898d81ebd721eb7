"""Triton tile helpers shared by the Gated DeltaNet kernels (the plain-decode launches
`plan.py`, `readout.py`, `flush.py`; the window step `window.py`; the stock route
`stock_route.py`): the key normalisation, the plain-decode readout of one tile, and the
advance of one value head's checkpoint tile over committed ring entries, record by record
(`advance_tile`) or in chunked WY form with tensor-core products (`wy_fold_tile`)."""

import triton
import triton.language as tl

from vllm_replayssm.kernels.common.triton_cursor import softplus
from vllm_replayssm.kernels.common.triton_dots import dot16, dot_split3


@triton.jit
def l2norm(x):
    """x / sqrt(sum(x^2) + 1e-6) of a [BLOCK_K] fp32 vector (vLLM's in-kernel q/k norm)."""
    return x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def log_decay(neg_A, dt_bias, a):
    """A token's log decay g = -e^{A_log} softplus(a + dt_bias), vLLM's gate, in fp32;
    neg_A = -e^{A_log} and dt_bias per head (fp32), a in its input dtype; shapes
    broadcast."""
    return neg_A * softplus(a.to(tl.float32) + dt_bias)


@triton.jit
def history_weights(g_h, keep, AXIS: tl.constexpr):
    """(w, gam_n) of a history of log decays g_h (records along AXIS; `keep` masks the
    committed ones): gam_n = Σ_l g_l, the checkpoint's decay over the whole history, and
    w_l = e^{gam_n - Γ_l} (Γ the inclusive prefix sum), the decay that the records after
    l apply to record l's update; 0 where not kept."""
    gam_n = tl.sum(g_h, axis=AXIS)
    rest = tl.where(keep, tl.expand_dims(gam_n, AXIS) - tl.cumsum(g_h, axis=AXIS), 0.0)
    return tl.where(keep, tl.exp(rest), 0.0), gam_n


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


@triton.jit
def _dot3(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b at fp32 accuracy (a: fp32; b: fp32, or bf16 for "bf16x3", where it must
    be exact: three bf16 parts of a carry its 24 bits against b's exact bf16 values). The
    parts are formed before the products, smallest first (fewer live registers: the exact
    WY fold spills none at 64 x 128)."""
    if PRECISION == "bf16x3":
        acc = dot_split3(a, b, acc)
    else:
        acc = tl.dot(a, b.to(tl.float32), acc=acc, input_precision=PRECISION)
    return acc


@triton.jit
def wy_fold_tile(
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
    BLOCK_L: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """`advance_tile` in chunked (WY) form: the same result up to fp32 reassociation, with
    the fn <= BLOCK_L records loaded at once and folded by tensor-core products (README,
    Flush). S: [BLOCK_V, BLOCK_K] fp32, BLOCK_V, BLOCK_K >= 16; BLOCK_L: a power of two
    >= max(fn, 16); fo < num_ring_rows, fn <= num_ring_rows. PRECISION: "bf16x3" (bf16 k
    records: the exact operand of every product) or "tf32x3" (any record dtype); "ieee"
    runs in the interpreter only."""
    rows, m_l, g, lam, k, k_op, rnorm = _wy_records(
        p_rg,
        p_rk,
        fo,
        fn,
        num_ring_rows,
        o_k,
        m_k,
        stride_rg_row,
        stride_rk_row,
        stride_rk_k,
        BLOCK_L,
        PRECISION,
    )
    decay = tl.exp(tl.sum(g, axis=0))
    if EXACT_FLUSH:
        beta = tl.load(p_rbeta + rows * stride_rbeta_row, mask=m_l, other=0.0)
        gam = tl.cumsum(g, axis=0)  # Γ_j, inclusive
        v = tl.load(
            p_rv + o_v[:, None] * stride_rv_v + rows[None, :] * stride_rv_row,
            mask=m_v[:, None] & m_l[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_V, BLOCK_L]
        P = _dot3(S, tl.trans(k_op), tl.zeros([S.shape[0], BLOCK_L], dtype=tl.float32), PRECISION)
        if PRECISION == "bf16x3":
            P = P * rnorm[None, :]
        R = beta[None, :] * (v - tl.exp(gam)[None, :] * P)  # [BLOCK_V, BLOCK_L]
        A = _wy_lower(k, k_op, rnorm, beta, lam, BLOCK_L, PRECISION)
        D = _substitute(R, A, BLOCK_L)
    else:
        D = tl.load(
            p_rd + o_v[:, None] * stride_rd_v + rows[None, :] * stride_rd_row,
            mask=m_v[:, None] & m_l[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_V, BLOCK_L]
    w = tl.exp(lam)
    if PRECISION == "bf16x3":
        w = w * rnorm
    return _dot3(D * w[None, :], k_op, S * decay, PRECISION)


@triton.jit
def _wy_records(
    p_rg,
    p_rk,
    fo,
    fn,
    num_ring_rows,
    o_k,
    m_k,
    stride_rg_row,
    stride_rk_row,
    stride_rk_k,
    BLOCK_L: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """A WY fold's records over ring entries [fo, fo + fn): (rows, m_l, g, Λ, k, k_op,
    rnorm); k raw [BLOCK_L, BLOCK_K], k_op the products' operand (bf16x3: k itself, else
    the normalised fp32 keys), rnorm the keys' 1 / ‖k‖ (wy_fold_tile's record loads, apart
    from its products)."""
    rows, m_l, g, lam = _wy_record_gates(p_rg, fo, fn, num_ring_rows, stride_rg_row, BLOCK_L)
    k = tl.load(
        p_rk + rows[:, None] * stride_rk_row + o_k[None, :] * stride_rk_k,
        mask=m_l[:, None] & m_k[None, :],
        other=0.0,
    )  # [BLOCK_L, BLOCK_K], raw records
    k32 = k.to(tl.float32)
    rnorm = 1.0 / tl.sqrt(tl.sum(k32 * k32, axis=1) + 1e-6)  # [BLOCK_L]
    if PRECISION == "bf16x3":
        tl.static_assert(k.dtype == tl.bfloat16, "bf16x3 needs bf16 k records")
        k_op = k
    else:
        k_op = k32 * rnorm[:, None]
    return rows, m_l, g, lam, k, k_op, rnorm


@triton.jit
def _wy_record_gates(p_rg, fo, fn, num_ring_rows, stride_rg_row, BLOCK_L: tl.constexpr):
    """A WY fold's ring rows over entries [fo, fo + fn) and their gates: (rows, m_l, g, Λ),
    [BLOCK_L] each."""
    o_l = tl.arange(0, BLOCK_L)
    m_l = o_l < fn
    rows = fo + o_l
    rows = tl.where(rows >= num_ring_rows, rows - num_ring_rows, rows)
    g = tl.load(p_rg + rows * stride_rg_row, mask=m_l, other=0.0)
    # Λ_j = Σ_{l>j} g_l summed from the end (no difference of long prefix sums): the decay
    # of record j to the fold's end, accurate to u |Λ_j| where its weight e^{Λ_j} is large.
    rows_next = tl.where(rows + 1 >= num_ring_rows, rows + 1 - num_ring_rows, rows + 1)
    g_next = tl.load(p_rg + rows_next * stride_rg_row, mask=o_l + 1 < fn, other=0.0)
    lam = tl.cumsum(g_next, axis=0, reverse=True)
    return rows, m_l, g, lam


@triton.jit
def _wy_lower(k, k_op, rnorm, beta, lam, BLOCK_L: tl.constexpr, PRECISION: tl.constexpr):
    """The WY fold's strictly lower A [BLOCK_L (j), BLOCK_L (i)]: A[j, i] = β_j e^{Γ_j −
    Γ_i} (k̂_i · k̂_j) for i < j (Γ_j − Γ_i = Λ_i − Λ_j), from the raw k records (bf16x3:
    exact products, then the norms) or the normalised k_op."""
    o_l = tl.arange(0, BLOCK_L)
    if PRECISION == "bf16x3":  # exact products
        gram = dot16(k, tl.trans(k), tl.zeros([BLOCK_L, BLOCK_L], dtype=tl.float32))
        gram = gram * rnorm[:, None] * rnorm[None, :]
    else:
        gram = tl.dot(k_op, tl.trans(k_op), input_precision=PRECISION)
    below = o_l[None, :] < o_l[:, None]  # no exponent above the diagonal
    return tl.where(
        below,
        beta[:, None] * tl.exp(tl.where(below, lam[None, :] - lam[:, None], 0.0)) * gram,
        0.0,
    )


@triton.jit
def _substitute(D, A, BLOCK_L: tl.constexpr):
    """X = D (I + A)⁻ᵀ for D [N, BLOCK_L] and the strictly lower A (`_wy_lower`), i.e.
    (I + A) Xᵀ = Dᵀ, by forward substitution in place, column i final at step i;
    in-register rank-1 updates without barriers."""
    o_l = tl.arange(0, BLOCK_L)
    for i in tl.static_range(BLOCK_L - 1):
        d_i = tl.sum(tl.where(o_l[None, :] == i, D, 0.0), axis=1)  # [N]
        a_i = tl.sum(tl.where(o_l[None, :] == i, A, 0.0), axis=1)  # [BLOCK_L (j)]
        D -= d_i[:, None] * a_i[None, :]
    return D
