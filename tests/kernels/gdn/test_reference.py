"""GDN torch reference (ReplaySSM decode, both flush modes, materialise) against the
float64 oracle and against the stock fp32 decode step."""

import pytest
import torch

from vllm_replayssm.kernels.common.cursor import plan_step
from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.layout import GDNGeometry

from ..checks import (
    check_hp_independent_of_lp,
    check_mixed_routes,
    check_perturbed_history_fails,
    check_scenario,
)
from ..families import GDNFamily

GEOMS = {
    "tiny": GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8),
    # Qwen3-Next / Qwen3.5-4B (16, 32, 128, 128) scaled down: 2 value heads per key head.
    "qwen3_next": GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16),
    # Qwen3.5-122B (16, 64, 128, 128): 4 value heads per key head.
    "qwen35_122b": GDNGeometry(num_k_heads=1, num_v_heads=4, head_k_dim=16, head_v_dim=16),
    "uneven": GDNGeometry(num_k_heads=1, num_v_heads=3, head_k_dim=12, head_v_dim=20),
}

BASE = dict(
    geom="tiny",
    L=4,
    T=1,
    lp=None,
    act=torch.float32,
    spec=False,
    churn=False,
    stagger=True,
    exact=True,
)
CASES = {
    "base": {},
    "lp_bf16": dict(lp=torch.bfloat16),
    "lp_fp16": dict(lp=torch.float16),
    "act_bf16": dict(act=torch.bfloat16),
    "fold": dict(exact=False),
    "fold_act_bf16": dict(exact=False, act=torch.bfloat16),
    "L1": dict(L=1),
    "L16": dict(L=16),
    "no_stagger": dict(stagger=False),
    "qwen3_next": dict(geom="qwen3_next"),
    "qwen35_122b": dict(geom="qwen35_122b", lp=torch.bfloat16),
    "uneven": dict(geom="uneven"),
    "spec_T2": dict(spec=True, T=2),
    "spec_T4_tight": dict(spec=True, T=4, L=4),
    "spec_T3_L16_lp": dict(spec=True, T=3, L=16, lp=torch.bfloat16),
    "spec_fold": dict(spec=True, T=3, L=6, exact=False),
    "churn": dict(churn=True),
    "spec_churn": dict(spec=True, T=3, L=6, churn=True),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_replay_matches_naive(case):
    c = {**BASE, **CASES[case]}
    fam = GDNFamily(GEOMS[c["geom"]], act_dtype=c["act"], exact_flush=c["exact"], seed=7)
    # Cached corrected values d are fp32 and k, v are stored as the inputs are: bf16
    # activations reach the oracle too, so every case is held to the fp32 bound.
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
def test_exact_flush_hp_bitwise_independent_of_lp(spec):
    check_hp_independent_of_lp(
        lambda: GDNFamily(GEOMS["tiny"], act_dtype=torch.bfloat16, seed=3),
        L=4,
        T=3 if spec else 1,
        spec=spec,
    )


def test_fold_flush_lets_lp_rounding_into_hp():
    """Why `exact` is the default: with `fold`, HP depends on the LP dtype."""
    with pytest.raises(AssertionError, match="HP differs"):
        check_hp_independent_of_lp(
            lambda: GDNFamily(GEOMS["tiny"], exact_flush=False, seed=3), L=4, T=1, spec=False
        )


@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp_only", "lp_bf16"])
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_exact_flush_equals_stock_fp32_path_bitwise(lp, act):
    """At every flush, HP equals the state the stock fp32 decode path reaches after the same
    tokens, bit for bit (torch; both use `delta_rule_step`)."""
    fam = GDNFamily(GEOMS["qwen3_next"], act_dtype=act, seed=11)
    L, T, R, steps = 4, 1, 5, 14
    gen = torch.Generator().manual_seed(0)
    cache = fam.cache(fam.specs(L, T, lp), R + 2)
    slots = torch.tensor([3, 1, 6, 2, 5], dtype=torch.int32)
    stock = torch.stack([fam.initial_state(gen) for _ in range(R + 2)])
    cache.hp[slots.long()] = stock[slots.long()]
    apply_prefill_hook(cache.hp, cache.lp, cache.meta, slots, buffer_len=L, window=T, stagger=True)
    compared = 0
    for _ in range(steps):
        tok = fam.tokens(R, gen)
        plan = plan_step(cache.meta[slots.long()], torch.ones(R), None, L, T)
        fam.decode(cache, tok, slots, torch.empty(fam.out_shape(R)), L, T)
        for r in plan.flush.nonzero().flatten().tolist():
            s = int(slots[r])
            assert torch.equal(cache.hp[s], stock[s]), f"slot {s}: HP != stock state"
            compared += 1
        fam.stock(stock, tok, slots, torch.empty(fam.out_shape(R)))
    assert compared >= R * 2


def test_perturbed_history_fails():
    check_perturbed_history_fails(lambda: GDNFamily(GEOMS["tiny"], seed=5), L=8, T=1)


@pytest.mark.parametrize("lp", [None, torch.bfloat16, torch.float16], ids=["none", "bf16", "fp16"])
def test_stock_route_interleaved_with_replay(lp):
    fam = GDNFamily(GEOMS["tiny"], act_dtype=torch.bfloat16, seed=9)
    check_mixed_routes(fam, L=4, lp=lp)
