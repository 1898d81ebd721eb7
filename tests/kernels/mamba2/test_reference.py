"""Mamba-2 torch reference (ReplaySSM decode, materialise) against the float64 oracle."""

import pytest
import torch

from vllm_replayssm.kernels.mamba2.naive import mamba2_naive_scan
from vllm_replayssm.kernels.mamba2.reference import mamba2_prefill_scan
from vllm_replayssm.layout import Mamba2Geometry

from ..checks import (
    check_hp_independent_of_lp,
    check_mixed_routes,
    check_perturbed_history_fails,
    check_scenario,
)
from ..families import Mamba2Family

GEOMS = {
    "tiny": Mamba2Geometry(nheads=4, headdim=8, dstate=16, ngroups=2),
    # Nemotron-3 Super (128, 64, 128, 8) scaled down, 16 heads per group kept.
    "nemotron_super": Mamba2Geometry(nheads=16, headdim=8, dstate=16, ngroups=1),
    # Nemotron-3 Nano 4B (96, 80, 128, 8): 12 heads per group, headdim not a power of 2.
    "nemotron_nano4b": Mamba2Geometry(nheads=12, headdim=10, dstate=16, ngroups=1),
    # TP-extended groups: one group per head pair.
    "tp_groups": Mamba2Geometry(nheads=6, headdim=4, dstate=8, ngroups=3),
}

BASE = dict(
    geom="tiny", L=4, T=1, lp=None, act=torch.float32, spec=False, churn=False, stagger=True
)
CASES = {
    "base": {},
    "lp_bf16": dict(lp=torch.bfloat16),
    "lp_fp16": dict(lp=torch.float16),
    "act_bf16": dict(act=torch.bfloat16),  # records are the inputs: no extra error
    "L1": dict(L=1),
    "L16": dict(L=16),
    "no_stagger": dict(stagger=False),
    "nemotron_super": dict(geom="nemotron_super"),
    "nemotron_nano4b": dict(geom="nemotron_nano4b", lp=torch.bfloat16),
    "tp_groups": dict(geom="tp_groups"),
    "spec_T2": dict(spec=True, T=2),
    "spec_T4_tight": dict(spec=True, T=4, L=4),
    "spec_T3_L16_lp": dict(spec=True, T=3, L=16, lp=torch.bfloat16),
    "churn": dict(churn=True),
    "spec_churn": dict(spec=True, T=3, L=6, churn=True),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_replay_matches_naive(case):
    c = {**BASE, **CASES[case]}
    fam = Mamba2Family(GEOMS[c["geom"]], act_dtype=c["act"], seed=7)
    check_scenario(
        fam,
        L=c["L"],
        T=c["T"],
        lp=c["lp"],
        spec=c["spec"],
        churn=c["churn"],
        stagger=c["stagger"],
        seed=sum(map(ord, case)),
    )


@pytest.mark.parametrize("spec", [False, True], ids=["ar", "spec"])
def test_hp_bitwise_independent_of_lp(spec):
    check_hp_independent_of_lp(
        lambda: Mamba2Family(GEOMS["tiny"], seed=3), L=4, T=3 if spec else 1, spec=spec
    )


def test_perturbed_history_fails():
    check_perturbed_history_fails(lambda: Mamba2Family(GEOMS["tiny"], seed=5), L=8, T=1)


@pytest.mark.parametrize("lp", [None, torch.bfloat16, torch.float16], ids=["none", "bf16", "fp16"])
def test_stock_route_interleaved_with_replay(lp):
    fam = Mamba2Family(GEOMS["tiny"], act_dtype=torch.bfloat16, seed=9)
    check_mixed_routes(fam, L=4, lp=lp, rounding=None)


@pytest.mark.parametrize("with_initial", [False, True])
def test_prefill_scan_matches_naive(with_initial):
    """The CPU prefill of the layer (stock maths when replayssm is off, HP writer when on):
    varlen sequences, optional initial states, fp32 vs the float64 recurrence."""
    gen = torch.Generator().manual_seed(3)
    H, P, N, G = 4, 8, 16, 2
    lens = [1, 5, 12]
    T = sum(lens)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    x = torch.randn(T, H, P, generator=gen)
    dt = torch.randn(T, H, generator=gen)
    B, C = torch.randn(T, G, N, generator=gen), torch.randn(T, G, N, generator=gen)
    A = -torch.rand(H, generator=gen) * 4 - 0.5
    D, dt_bias = torch.randn(H, generator=gen), torch.randn(H, generator=gen)
    init = torch.randn(len(lens), H, P, N, generator=gen) if with_initial else None
    out = torch.empty(T, H, P)
    finals = mamba2_prefill_scan(x, dt, A, B, C, D, dt_bias, qsl, init, out)
    for r, (s, e) in enumerate(zip(qsl[:-1].tolist(), qsl[1:].tolist(), strict=True)):
        S0 = init[r] if init is not None else torch.zeros(H, P, N)
        y, S = mamba2_naive_scan(S0, x[s:e], dt[s:e], A, B[s:e], C[s:e], D, dt_bias)
        torch.testing.assert_close(out[s:e].double(), y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(finals[r].double(), S, rtol=1e-5, atol=1e-5)
