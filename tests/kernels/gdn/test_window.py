"""Triton GDN window step (`window.py`: the speculative path, which also runs T = 1 when
asked) against the torch reference and the float64 oracle.

On CPU the kernel runs in Triton's interpreter on tiny shapes (CI); on the GPU host the
same checks run at real geometries (`gpu` marker)."""

import functools

import pytest
import torch

from vllm_replayssm.kernels.gdn import stock_route as gdn_stock
from vllm_replayssm.kernels.gdn import window as gdn_window
from vllm_replayssm.layout import GDNGeometry

from ..checks import (
    check_kernel_matches_reference,
    check_mixed_routes,
    check_scenario,
    out_tolerance,
)
from ..families import GDNFamily
from ..tables import table
from .test_reference import GEOMS


def _op(route, **knobs):
    """route: "fused" or "split" (plan, flush, readout launches); knobs: more
    `gdn_window_decode` launch arguments."""
    return functools.partial(gdn_window.gdn_window_decode, route=route, **knobs)


LP = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
CASES = {
    "ar_fused": dict(L=4, T=1, lp=None, spec=False, route="fused"),
    "ar_fold_split": dict(L=4, T=1, lp=None, spec=False, exact=False, route="split"),
    "ar_lp_fp16_split": dict(L=4, T=1, lp=torch.float16, spec=False, route="split"),
    "spec_T3_split": dict(L=5, T=3, lp=None, spec=True, route="split"),
    # two value tiles per readout program (`readout_tiles`)
    "spec_T2_lp_fp16_split_tiles2": dict(
        L=4, T=2, lp=torch.float16, spec=True, route="split", readout_tiles=2
    ),
    "spec_T2_lp_fp16_churn_fused": dict(
        L=4, T=2, lp=torch.float16, spec=True, churn=True, route="fused"
    ),
    # d records in the LP dtype (gdn_d_dtype "lp")
    "spec_T3_lp_bf16_d_lp_split": dict(
        L=5, T=3, lp=torch.bfloat16, spec=True, route="split", d_lp=True
    ),
}


@pytest.mark.parametrize(
    "row", table({"geom": {g: g for g in ("tiny", "uneven")}, "case": {c: c for c in CASES}})
)
def test_kernel_matches_naive(row, device):
    case = row["case"]
    c = CASES[case]
    fam = GDNFamily(
        GEOMS[row["geom"]],
        decode_op=_op(c["route"], readout_tiles=c.get("readout_tiles", 1)),
        device=device,
        seed=3,
        exact_flush=c.get("exact", True),
        d_lp=c.get("d_lp", False),
    )
    check_scenario(
        fam,
        L=c["L"],
        T=c["T"],
        lp=c["lp"],
        spec=c["spec"],
        churn=c.get("churn", False),
        requests=3,
        cycles=3,
        seed=len(case),
    )


@pytest.mark.parametrize(
    "row",
    table(
        {
            "route": {"split": "split", "fused": "fused"},
            "flush": {"exact": True, "fold": False},
            "lp": LP,
            "T": {"T1": 1, "T3": 3},
        }
    ),
)
def test_kernel_matches_reference_buffers(row, device):
    _check_reference(device, _op(row["route"]), row["flush"], row["lp"], row["T"], seed=4)


def _check_reference(device, op, exact, lp, T, act=torch.float16, seed=4, d_lp=False):
    """The kernel step `op` against the torch reference on the same buffers, at a geometry
    whose tiles a tensor-core product takes (K, V >= 16); d_lp: d records in the LP dtype."""
    check_kernel_matches_reference(
        lambda decode_op: GDNFamily(
            GEOMS["qwen35_122b"],
            act_dtype=act,
            device=device,
            exact_flush=exact,
            d_lp=d_lp,
            decode_op=decode_op,
            seed=seed,
        ),
        op,
        L=4,
        T=T,
        lp=lp,
        # fold: HP sums cached fp32 d, which follow the LP read: an interpreted bf16 LP
        # (truncated, not rounded) reaches HP through them.
        out_tol=out_tolerance(lp, device),
        hp_tol=1e-5 if exact or lp is None else out_tolerance(lp, device),
    )


# The split route's flush list / the fused flush in WY form (`flush.fold_tile`) and the
# planned readout's bf16 products with an LP tile, at a geometry whose tiles a product
# takes (K, V >= 16): (route, exact flush, LP dtype, T, activations, knobs).
TF32X3 = dict(flush_precision="tf32x3")
BF16 = torch.bfloat16
WY = dict(flush_precision="bf16x3", readout_precision="bf16x3")
# The planned route as `dispatch.launch_config` launches it with bf16 keys (16-row readout
# tiles in a pipelined loop, the flush unpipelined); with an LP copy it also reads flush
# rows' fresh LP copy (flush_rows_read "lp").
PLANNED_WY = dict(WY, block_v=16, readout_tiles=0, readout_stages=2, flush_stages=1)
WY_ROWS = {
    "split-exact-fp16-T3": ("split", True, torch.float16, 3, torch.float16, TF32X3),
    "split-exact-none-T3": ("split", True, None, 3, torch.float16, TF32X3),
    "fused-exact-bf16-T1": ("fused", True, BF16, 1, torch.float16, TF32X3),
    "split-fold-none-T3": ("split", False, None, 3, torch.float16, TF32X3),
    "split-exact-bf16-T3-defaults": (  # the GPU default of planned steps
        "split",
        True,
        BF16,
        3,
        BF16,
        dict(PLANNED_WY, flush_rows_read="lp"),
    ),
    "split-exact-bf16-T3-readout_tiles": (  # a key head's 4 tiles per program
        "split",
        True,
        BF16,
        3,
        BF16,
        dict(WY, readout_tiles=4),
    ),
    # the LP tile's product with 16-bit keys; on a GPU (output bound 1e-4) keys of 8 bits
    # fail, in the interpreter (bf16 truncation: the bf16 bound) only the LP level is checked
    "split-exact-bf16-T3-keys16": (
        "split",
        True,
        BF16,
        3,
        BF16,
        dict(PLANNED_WY, flush_rows_read="lp", readout_precision="bf16x2"),
    ),
    "split-exact-bf16-T3-one_flush_program": (  # one program takes every listed item
        "split",
        True,
        BF16,
        3,
        BF16,
        dict(PLANNED_WY, flush_rows_read="lp", flush_programs=1),
    ),
    "split-exact-bf16-T3-flush_rows_hp": (  # flush rows read the folded HP
        "split",
        True,
        BF16,
        3,
        BF16,
        dict(PLANNED_WY, flush_rows_read="hp"),
    ),
    "split-exact-fp16-T2": (
        "split",
        True,
        torch.float16,
        2,
        torch.float16,
        dict(TF32X3, readout_precision="bf16x3"),  # fp16 tiles: tf32x3
    ),
}


@pytest.mark.parametrize("row", list(WY_ROWS))
def test_wy_flush_matches_reference_buffers(row, device):
    route, exact, lp, T, act, knobs = WY_ROWS[row]
    _check_reference(device, _op(route, **knobs), exact, lp, T, act=act, seed=5)


# d records in the LP dtype (gdn_d_dtype "lp"): the readouts' history reads them, a window's
# own d stay in registers, the flush recomputes them from HP: (route, LP dtype, T, knobs).
D_LP_ROWS = {
    "split-bf16-T3-defaults": ("split", BF16, 3, dict(PLANNED_WY, flush_rows_read="lp")),
    "fused-bf16-T3": ("fused", BF16, 3, {}),
    "fused-fp16-T1": ("fused", torch.float16, 1, TF32X3),
}


@pytest.mark.parametrize("row", list(D_LP_ROWS))
def test_d_records_in_lp_dtype_match_reference_buffers(row, device):
    route, lp, T, knobs = D_LP_ROWS[row]
    _check_reference(device, _op(route, **knobs), True, lp, T, act=lp, seed=6, d_lp=True)


@pytest.mark.parametrize(
    "row",
    table({"flush": {"exact": True, "fold": False}, "lp": {"none": None, "bf16": torch.bfloat16}}),
)
def test_stock_route_interleaved(row, device):
    """Stock-route steps (HP alone, LP marked stale) between replay steps: vs the oracle,
    and in lockstep with the torch reference (cursor words exact)."""
    lp, exact = row["lp"], row["flush"]
    fam = GDNFamily(
        GEOMS["tiny"],
        act_dtype=torch.bfloat16,
        device=device,
        seed=9,
        exact_flush=exact,
        decode_op=_op("split"),
        stock_route_op=gdn_stock.gdn_stock_route_decode,
    )
    # fold mode: HP sums the cached d, which follow the LP read (README, Flush: "HP then
    # depends on LP"), so the final state carries LP rounding: the table's bound for it, as
    # test_kernel_matches_reference_buffers's hp_tol. (With 2e-5 this slow row failed at
    # 1.65e-4 on 2026-12-02, LP rounding.)
    check_mixed_routes(fam, L=4, lp=lp, rounding=None if exact else lp)
    tol = out_tolerance(lp, device)
    check_kernel_matches_reference(
        lambda op: GDNFamily(
            GEOMS["qwen35_122b"],
            act_dtype=torch.float16,
            device=device,
            exact_flush=exact,
            decode_op=op,
            seed=4,
        ),
        _op("fused"),
        L=4,
        T=1,
        lp=lp,
        out_tol=tol,
        hp_tol=1e-5 if exact or lp is None else tol,
        stock_route_op=gdn_stock.gdn_stock_route_decode,
        stock_share=0.4,
    )


@pytest.mark.parametrize("lp", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_planned_lp_only_refreshes_stale_lp(lp, device):
    """The planned route reading LP for every row (flush_rows_read "lp": the readout built
    without its HP branch) between stock-route steps, which leave LP stale: the flush launch
    must copy HP into a stale LP before the readout reads it, or the outputs are off by the
    whole LP-vs-HP difference (`check_mixed_routes`)."""
    fam = GDNFamily(
        GEOMS["qwen3_next"],
        act_dtype=torch.bfloat16,
        device=device,
        seed=11,
        decode_op=_op("split", **dict(PLANNED_WY, flush_rows_read="lp")),
        stock_route_op=gdn_stock.gdn_stock_route_decode,
    )
    check_mixed_routes(fam, L=4, lp=lp, stock_share=0.5)


REAL = {
    "qwen35_4b": GDNGeometry(16, 32, 128, 128),
    "qwen35_122b": GDNGeometry(16, 64, 128, 128),
}


# id -> (route, launch knobs): the serial and WY flushes per route, the planned route as
# `dispatch` launches it and with other knobs
GPU_VARIANTS = {
    "fused-serial": ("fused", dict(flush_precision="serial")),
    "split-serial": ("split", dict(flush_precision="serial")),
    "fused-wy": ("fused", WY),
    "split-wy": ("split", dict(PLANNED_WY, flush_rows_read="lp")),
    # flush rows read the folded HP (the same as the HP-only runs, which have no LP copy)
    "split-wy_flush_rows_hp": ("split", dict(PLANNED_WY, flush_rows_read="hp")),
    # 8 tiles per readout program as at bs 256 (`auto_readout_tiles` picks 1 for 8 rows)
    "split-wy_tiles8": ("split", dict(PLANNED_WY, readout_tiles=8)),
    # the LP tile's product with 16-bit keys (here the output bound is 1e-4)
    "split-wy_keys16": (
        "split",
        dict(PLANNED_WY, flush_rows_read="lp", readout_precision="bf16x2"),
    ),
}


def _check_real_geometry(geom, lp, T, variant, d_lp=False):
    """A GPU_VARIANTS route at a real geometry against the oracle (d_lp: d records in the
    LP dtype)."""
    route, knobs = GPU_VARIANTS[variant]
    fam = GDNFamily(
        REAL[geom],
        act_dtype=torch.bfloat16,
        device="cuda",
        seed=1,
        d_lp=d_lp,
        decode_op=_op(route, **knobs),
    )
    check_scenario(fam, L=16, T=T, lp=lp, spec=T > 1, requests=8, cycles=2)


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("variant", list(GPU_VARIANTS))
def test_real_geometry_on_gpu(geom, lp, T, variant):
    _check_real_geometry(geom, lp, T, variant)


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("variant", ["fused-wy", "split-wy"])
def test_real_geometry_d_records_in_lp_dtype_on_gpu(geom, T, variant):
    """d records in the bf16 LP's dtype (gdn_d_dtype "lp"), the routes as `dispatch`
    launches them."""
    _check_real_geometry(geom, torch.bfloat16, T, variant, d_lp=True)


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
def test_real_geometry_stock_route_on_gpu(geom, lp):
    fam = GDNFamily(
        REAL[geom],
        act_dtype=torch.bfloat16,
        device="cuda",
        seed=2,
        decode_op=_op("split"),
        stock_route_op=gdn_stock.gdn_stock_route_decode,
    )
    check_mixed_routes(fam, L=16, lp=lp)
