"""GDN tile helpers: the chunked (WY) fold `wy_fold_tile` against the float64 delta rule and
against the serial `advance_tile`, in Triton's interpreter on small tiles; and the WY
algorithm with the dot splits' rounding emulated in torch (tf32x3, bf16x3), against float64
at the real tile size, since the interpreter multiplies dot operands in plain fp32."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from vllm_replayssm.kernels.gdn.tiles import advance_tile, wy_fold_tile

from ..tables import table
from ..tolerances import tol_for

TOL = tol_for()  # fp32 reassociation only


@triton.jit
def _fold_kernel(
    hp_ptr,
    out_ptr,
    ring_g_ptr,
    ring_beta_ptr,
    ring_k_ptr,
    ring_d_ptr,
    ring_v_ptr,
    fo,
    fn,
    num_ring_rows,
    V,
    K,
    stride_rg_row,
    stride_rbeta_row,
    stride_rk_row,
    stride_rk_k,
    stride_rd_row,
    stride_rd_v,
    stride_rv_row,
    stride_rv_v,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_L: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_WY: tl.constexpr,
):
    """out[V, K] = hp[V, K] advanced over ring entries [fo, fo + fn); one program per
    BLOCK_V rows (test harness)."""
    o_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    o_k = tl.arange(0, BLOCK_K)
    m_v = o_v < V
    m_k = o_k < K
    m_vk = m_v[:, None] & m_k[None, :]
    S = tl.load(hp_ptr + o_v[:, None] * K + o_k[None, :], mask=m_vk, other=0.0)
    if USE_WY:
        S = wy_fold_tile(
            S,
            ring_g_ptr,
            ring_beta_ptr,
            ring_k_ptr,
            ring_d_ptr,
            ring_v_ptr,
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
            EXACT_FLUSH,
            BLOCK_L,
            PRECISION,
        )
    else:
        S = advance_tile(
            S,
            ring_g_ptr,
            ring_beta_ptr,
            ring_k_ptr,
            ring_d_ptr,
            ring_v_ptr,
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
            EXACT_FLUSH,
        )
    tl.store(out_ptr + o_v[:, None] * K + o_k[None, :], S, mask=m_vk)


# Gates: realistic decays; a state that grows (g > 0, up to e^8 over 16 records, beta near
# 1, large values); one that shrinks by e^-10..e^-30 per record; keys nearly parallel
# (I + A far from I).
GATES = {
    "real": dict(g=(-5.0, 0.0), beta=(0.0, 1.0), v_scale=1.0, k_spread=1.0),
    "grow": dict(g=(0.0, 0.5), beta=(0.9, 1.0), v_scale=30.0, k_spread=1.0),
    "shrink": dict(g=(-30.0, -10.0), beta=(0.0, 1.0), v_scale=1.0, k_spread=1.0),
    "parallel_keys": dict(g=(-0.5, 0.0), beta=(0.5, 1.0), v_scale=1.0, k_spread=0.05),
}


def make_ring(
    num_ring_rows: int, V: int, K: int, *, gates: str, act: torch.dtype, d_dtype, seed: int
) -> dict:
    """Random ring records (g, beta fp32 [R]; k [R, K] and v [R, V] act; d [R, V] d_dtype)
    and a checkpoint S0 [V, K] fp32; the buffers of unused rows hold NaN-free garbage."""
    gen = torch.Generator().manual_seed(seed)
    c = GATES[gates]

    def unif(lo_hi, *shape):
        lo, hi = lo_hi
        return lo + (hi - lo) * torch.rand(*shape, generator=gen)

    base = torch.randn(K, generator=gen)
    k = base * (c["k_spread"] < 1.0) + c["k_spread"] * torch.randn(num_ring_rows, K, generator=gen)
    return dict(
        S0=torch.randn(V, K, generator=gen),
        g=unif(c["g"], num_ring_rows),
        beta=unif(c["beta"], num_ring_rows),
        k=k.to(act),
        v=(c["v_scale"] * torch.randn(num_ring_rows, V, generator=gen)).to(act),
        d=torch.randn(num_ring_rows, V, generator=gen).to(d_dtype),
    )


def oracle(ring: dict, fo: int, fn: int, exact: bool) -> torch.Tensor:
    """The serial delta rule (exact) or the weighted sum of cached d (fold) in float64."""
    f = torch.float64
    R = ring["g"].shape[0]
    S = ring["S0"].to(f)
    for j in range(fn):
        r = (fo + j) % R
        k = ring["k"][r].to(f)
        k = k / torch.sqrt((k * k).sum() + 1e-6)
        S = S * torch.exp(ring["g"][r].to(f))
        if exact:
            d = ring["beta"][r].to(f) * (ring["v"][r].to(f) - S @ k)
        else:
            d = ring["d"][r].to(f)
        S = S + d[:, None] * k[None, :]
    return S


def run_kernel(ring: dict, fo: int, fn: int, *, exact, use_wy, block_v, block_l, precision):
    V, K = ring["S0"].shape
    out = torch.full_like(ring["S0"], float("nan"))
    _fold_kernel[(triton.cdiv(V, block_v),)](
        ring["S0"],
        out,
        ring["g"],
        ring["beta"],
        ring["k"],
        ring["d"],
        ring["v"],
        fo,
        fn,
        ring["g"].shape[0],
        V,
        K,
        ring["g"].stride(0),
        ring["beta"].stride(0),
        *ring["k"].stride(),
        *ring["d"].stride(),
        *ring["v"].stride(),
        BLOCK_V=block_v,
        BLOCK_K=max(16, triton.next_power_of_2(K)),
        BLOCK_L=block_l,
        EXACT_FLUSH=exact,
        PRECISION=precision,
        USE_WY=use_wy,
    )
    return out


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


# Interpreter rows (tiny shapes): each row changes one factor from the base row.
ROWS = table(
    {
        "fold": {"mid": (3, 9), "empty": (3, 0), "one": (3, 1), "full": (0, 16), "wrap": (11, 16)},
        "mode": {"exact": True, "fold": False},
        "gates": {g: g for g in GATES},
        "shape": {
            "v16_k8": (16, 8, 16),  # (V, K, BLOCK_V)
            "v32_k128": (32, 128, 32),
            "v64_k128": (64, 128, 64),
            "v40_k20": (40, 20, 16),  # a partial value tile and masked keys
        },
        "act": {"fp32": torch.float32, "bf16": torch.bfloat16},
    }
)


@pytest.mark.parametrize("row", ROWS)
def test_wy_fold_matches_serial_and_oracle(row):
    fo, fn = row["fold"]
    V, K, block_v = row["shape"]
    R = 17  # a ring of L + 1 rows at L = 16
    ring = make_ring(R, V, K, gates=row["gates"], act=row["act"], d_dtype=row["act"], seed=fn + V)
    ref = oracle(ring, fo, fn, row["mode"])
    kw = dict(exact=row["mode"], block_v=block_v, block_l=16, precision="tf32x3")
    wy = run_kernel(ring, fo, fn, use_wy=True, **kw)
    serial = run_kernel(ring, fo, fn, use_wy=False, **kw)
    assert not wy.isnan().any()
    assert rel(wy, ref) < TOL
    assert rel(wy, serial.double()) < TOL
    assert rel(serial, ref) < TOL
    if fn == 0:
        assert torch.equal(wy, ring["S0"])


@pytest.fixture
def bf16_dots(monkeypatch):
    """Triton's interpreter multiplies bf16 dot operands as their raw 16-bit patterns; read
    them as bf16 values instead (exact in fp32, as on the tensor cores), so that the bf16x3
    path runs here. A no-op on a GPU."""
    if not os.environ.get("TRITON_INTERPRET"):
        return
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def as_fp32(t):
        if t.dtype.scalar != tl.bfloat16:
            return t
        bits = t.data.astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def bf16_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, as_fp32(a), as_fp32(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", bf16_create_dot)


BF16X3_ROWS = table(
    {
        "mode": {"exact": True, "fold": False},
        "fold": {"wrap": (11, 16), "mid": (3, 9), "full": (0, 16)},
        "gates": {g: g for g in GATES},
    }
)


@pytest.mark.parametrize("row", BF16X3_ROWS)
def test_wy_fold_bf16x3(row, bf16_dots):
    """The bf16x3 path (three bf16 parts against the raw bf16 k, 1/||k|| applied outside the
    products) on a 64 x 128 tile, against float64 and the serial tile."""
    exact, (fo, fn) = row["mode"], row["fold"]
    ring = make_ring(
        17, 64, 128, gates=row["gates"], act=torch.bfloat16, d_dtype=torch.float32, seed=fn
    )
    ref = oracle(ring, fo, fn, exact)
    wy = run_kernel(
        ring, fo, fn, exact=exact, use_wy=True, block_v=64, block_l=16, precision="bf16x3"
    )
    serial = run_kernel(
        ring, fo, fn, exact=exact, use_wy=False, block_v=64, block_l=16, precision="ieee"
    )
    assert rel(wy, ref) < TOL
    assert rel(wy, serial.double()) < TOL


@pytest.mark.parametrize(
    "ring_rows,fo,fn,block_l",
    [(40, 30, 16, 32), (5, 3, 5, 16)],
    ids=["block_l_above_fn", "ring_below_block_l"],
)
def test_wy_fold_padding(ring_rows, fo, fn, block_l):
    """Padding rows contribute nothing: BLOCK_L 32 with 16 records; a 5-row ring folded
    whole from row 3 with BLOCK_L 16 (padding rows past twice the ring are masked). The d
    ring is in a wider dtype than k."""
    ring = make_ring(
        ring_rows, 16, 16, gates="real", act=torch.bfloat16, d_dtype=torch.float32, seed=fn
    )
    for exact in (True, False):
        ref = oracle(ring, fo, fn, exact)
        wy = run_kernel(
            ring, fo, fn, exact=exact, use_wy=True, block_v=16, block_l=block_l, precision="tf32x3"
        )
        assert rel(wy, ref) < TOL


def test_wy_fold_detects_a_wrong_record():
    """A sign flip of one record's beta moves the state by far more than the bound."""
    ring = make_ring(17, 16, 8, gates="real", act=torch.float32, d_dtype=torch.float32, seed=9)
    ref = oracle(ring, 3, 9, True)
    ring["beta"][7] = -ring["beta"][7]
    wy = run_kernel(ring, 3, 9, exact=True, use_wy=True, block_v=16, block_l=16, precision="ieee")
    assert rel(wy, ref) > 100 * TOL


# --- the dot splits' rounding, emulated in torch at the flush kernel's tile size ---


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> tf32 (10 explicit mantissa bits), round to nearest, ties away (cvt.rna)."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def emulated_dot(a: torch.Tensor, b: torch.Tensor, precision: str, acc=None) -> torch.Tensor:
    """acc + a @ b (fp32) as the tensor cores form it: parts rounded to the operand format,
    exact products, fp32 accumulation. "tf32x3": hi.hi + hi.lo + lo.hi; "bf16x3": three
    bf16 parts of a against b, which must be exactly bf16, smallest part first (as
    `_dot3`); "tf32", "bf16": one pass."""
    out = torch.zeros(a.shape[0], b.shape[1]) if acc is None else acc
    if precision in ("tf32", "tf32x3"):
        a_hi, b_hi = round_tf32(a), round_tf32(b)
        prod = a_hi @ b_hi
        if precision == "tf32x3":
            prod = prod + (a_hi @ round_tf32(b - b_hi) + round_tf32(a - a_hi) @ b_hi)
        return out + prod
    assert torch.equal(b.bfloat16().float(), b)
    parts = [a.bfloat16().float()]
    if precision == "bf16x3":
        for _ in range(2):
            parts.append((a - sum(parts)).bfloat16().float())
    for p in reversed(parts):
        out = out + p @ b
    return out


def wy_fold_emulated(S0, g, beta, k, v, d, *, exact: bool, precision: str) -> torch.Tensor:
    """`wy_fold_tile` in torch, fp32, step for step, every dot through `emulated_dot`.
    S0: [V, K] fp32; g, beta: [n]; k: [n, K] raw (bf16 for bf16 splits); v, d: [n, V]."""
    n = g.shape[0]
    k32 = k.float()
    rnorm = 1.0 / torch.sqrt((k32 * k32).sum(1) + 1e-6)
    bf16 = precision.startswith("bf16")
    k_op = k32 if bf16 else k32 * rnorm[:, None]
    g_next = torch.cat([g[1:], g.new_zeros(1)])
    lam = g_next.flip(0).cumsum(0).flip(0)  # Σ_{l>j} g_l
    if exact:
        P = emulated_dot(S0, k_op.T.contiguous(), precision)
        gram = k_op @ k_op.T  # bf16 operands: exact products
        if bf16:
            P = P * rnorm[None, :]
            gram = gram * rnorm[:, None] * rnorm[None, :]
        else:
            gram = emulated_dot(k_op, k_op.T.contiguous(), precision)
        R = beta[None, :] * (v.float().T - torch.exp(g.cumsum(0))[None, :] * P)
        below = torch.ones(n, n, dtype=torch.bool).tril(-1)
        A = torch.where(
            below, beta[:, None] * torch.exp((lam[None, :] - lam[:, None]) * below) * gram, 0.0
        )
        D = R.clone()
        for i in range(n - 1):
            D -= D[:, i : i + 1] * A[:, i][None, :]
    else:
        D = d.float().T
    w = torch.exp(lam) * (rnorm if bf16 else 1.0)
    return emulated_dot(D * w[None, :], k_op, precision, acc=torch.exp(g.sum()) * S0)


SPLITS = {"tf32x3": torch.float32, "bf16x3": torch.bfloat16}


@pytest.mark.parametrize("gates", list(GATES))
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fold"])
@pytest.mark.parametrize("precision", list(SPLITS))
def test_split_reaches_fp32(precision, exact, gates):
    """A 64 x 128 tile over 16 records: the 3-pass splits stay at fp32 level against float64
    (observed ~1e-7); one pass does not pass the bound (so the check can fail)."""
    act = SPLITS[precision]
    ring = make_ring(16, 64, 128, gates=gates, act=act, d_dtype=torch.float32, seed=11)
    ref = oracle(ring, 0, 16, exact)
    args = [ring[x] for x in ("S0", "g", "beta", "k", "v", "d")]
    got = wy_fold_emulated(*args, exact=exact, precision=precision)
    assert rel(got, ref) < TOL
    one_pass = wy_fold_emulated(*args, exact=exact, precision=precision[:4])
    assert rel(one_pass, ref) > TOL


@pytest.mark.gpu
@pytest.mark.parametrize("gates", list(GATES))
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fold"])
@pytest.mark.parametrize("precision", list(SPLITS))
def test_wy_fold_on_gpu(precision, exact, gates):
    """The flush kernel's tile (64 x 128, BLOCK_L 16, 4 warps) with the tensor cores' own
    splits, 16 records across the ring's wrap: fp32 level against float64 and the serial
    tile."""
    ring = make_ring(17, 128, 128, gates=gates, act=torch.bfloat16, d_dtype=torch.float32, seed=13)
    ring = {name: t.cuda() for name, t in ring.items()}
    ref = oracle(ring, 5, 16, exact)
    kw = dict(exact=exact, block_v=64, block_l=16, precision=precision)
    wy = run_kernel(ring, 5, 16, use_wy=True, **kw)
    serial = run_kernel(ring, 5, 16, use_wy=False, **kw)
    assert rel(wy, ref) < TOL
    assert rel(wy, serial.double()) < TOL
