"""Triton Mamba-2 decode kernel against the torch reference and the float64 oracle.

On CPU the kernel runs in Triton's interpreter on tiny shapes (CI); on the GPU host the
same checks run at real geometries (`gpu` marker)."""

import functools

import pytest
import torch

from vllm_replayssm.kernels.mamba2 import decode as m2_triton
from vllm_replayssm.kernels.mamba2 import stock_step as m2_stock
from vllm_replayssm.layout import Mamba2Geometry

from ..checks import (
    check_kernel_matches_reference,
    check_mixed_routes,
    check_scenario,
    out_tolerance,
)
from ..families import Mamba2Family
from .test_reference import GEOMS


def _op(route):
    return functools.partial(m2_triton.mamba2_replay_decode, route=route)


CASES = {
    "ar_fused": dict(L=4, T=1, lp=None, spec=False, route="fused"),
    "ar_lp_fp16_split": dict(L=4, T=1, lp=torch.float16, spec=False, route="split"),
    "spec_T3_split": dict(L=5, T=3, lp=None, spec=True, route="split"),
    "spec_T2_lp_fp16_churn_fused": dict(L=4, T=2, lp=torch.float16, spec=True, churn=True,
                                        route="fused"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("geom", ["tiny", "nemotron_nano4b"])
def test_kernel_matches_naive(case, geom, device):
    c = CASES[case]
    fam = Mamba2Family(GEOMS[geom], decode_op=_op(c["route"]), device=device, seed=3)
    check_scenario(fam, L=c["L"], T=c["T"], lp=c["lp"], spec=c["spec"],
                   churn=c.get("churn", False), requests=3, cycles=3, seed=len(case))


@pytest.mark.parametrize("route", ["fused", "split"])
@pytest.mark.parametrize("lp", [None, torch.float16, torch.bfloat16], ids=["none", "fp16", "bf16"])
@pytest.mark.parametrize("T", [1, 3])
def test_kernel_matches_reference_buffers(lp, T, route, device):
    check_kernel_matches_reference(
        lambda op: Mamba2Family(GEOMS["tp_groups"], act_dtype=torch.float16, device=device,
                                decode_op=op, seed=4),
        _op(route), L=4, T=T, lp=lp, out_tol=out_tolerance(lp, device))


@pytest.mark.parametrize("lp", [None, torch.float16, torch.bfloat16], ids=["none", "fp16", "bf16"])
def test_stock_route_interleaved(lp, device):
    """Stock-route steps (HP alone, LP marked stale) between replay steps: vs the oracle,
    and in lockstep with the torch reference (cursor words exact)."""
    fam = Mamba2Family(GEOMS["tiny"], act_dtype=torch.bfloat16, device=device, seed=9,
                       decode_op=_op("split"), stock_route_op=m2_stock.mamba2_stock_route_decode)
    check_mixed_routes(fam, L=4, lp=lp)
    check_kernel_matches_reference(
        lambda op: Mamba2Family(GEOMS["tp_groups"], act_dtype=torch.float16, device=device,
                                decode_op=op, seed=4),
        _op("fused"), L=4, T=1, lp=lp, out_tol=out_tolerance(lp, device),
        stock_route_op=m2_stock.mamba2_stock_route_decode, stock_share=0.4)

REAL = {
    "nemotron3_super": Mamba2Geometry(128, 64, 128, 8),
    "nemotron3_nano4b": Mamba2Geometry(96, 80, 128, 8),
}


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("route", ["fused", "split"])
def test_real_geometry_on_gpu(geom, lp, T, route):
    fam = Mamba2Family(REAL[geom], act_dtype=torch.bfloat16, device="cuda", seed=1,
                       decode_op=_op(route))
    check_scenario(fam, L=16, T=T, lp=lp, spec=T > 1, requests=8, cycles=2)


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
def test_real_geometry_stock_route_on_gpu(geom, lp):
    fam = Mamba2Family(REAL[geom], act_dtype=torch.bfloat16, device="cuda", seed=2,
                       decode_op=_op("split"), stock_route_op=m2_stock.mamba2_stock_route_decode)
    check_mixed_routes(fam, L=16, lp=lp, rounding=None)
