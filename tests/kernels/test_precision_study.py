"""Two-precision accuracy study over 2048 decode steps with realistic decays.

Variants, all with bf16 activations and fp32 outputs, against the float64 recurrence:
  (a)  stock decode, fp32 state (vLLM's default for these models)
  (a') ReplaySSM, HP fp32 only
  (b)  stock decode, one shared bf16 state (read and written every step)
  (c)  ReplaySSM, HP fp32 + LP bf16 (LP serves non-flush reads)
  (c') GDN only: (c) with the d records in bf16 (gdn_d_dtype "lp")
Asserted: HP of (c) and (c') is bitwise HP of (a') after every step (GDN exact flush: also bitwise
the stock fp32 state at every flush); (c)'s output error stays bounded and flat; (b)'s is
several times larger (and grows, for Mamba-2).
The table printed here is the one in the README.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.layout import GDNGeometry, Mamba2Geometry

from .families import GDNFamily, Mamba2Family

STEPS, L, R, BLOCK = 2048, 16, 4, 256


def _study(fam) -> tuple[dict[str, list[float]], dict[str, float]]:
    gen = torch.Generator().manual_seed(0)
    slots = torch.arange(1, R + 1, dtype=torch.int32)
    S0 = torch.stack([fam.initial_state(gen) for _ in range(R)])
    toks = [fam.tokens(R, gen) for _ in range(STEPS)]
    # Oracle: float64, token by token, per row.
    ref_out = torch.zeros(STEPS, *fam.out_shape(R), dtype=torch.float64)
    ref_state = []
    for r in range(R):
        seq = {k: torch.stack([t[k][r] for t in toks]) for k in toks[0]}
        y, S = fam.naive(S0[r].double(), seq)
        ref_out[:, r] = y
        ref_state.append(S)
    ref_state = torch.stack(ref_state)

    stock = {
        name: torch.zeros(R + 1, *fam.state_shape, dtype=dt)
        for name, dt in (("a", torch.float32), ("b", torch.bfloat16))
    }
    caches = {
        name: fam.cache(fam.specs(L, 1, lp), R + 1)
        for name, lp in (("a'", None), ("c", torch.bfloat16))
    }
    if fam.name == "gdn":  # (c'): the d records in the LP's dtype
        caches["c'"] = fam.cache(
            dataclasses.replace(fam, d_lp=True).specs(L, 1, torch.bfloat16), R + 1
        )
        assert caches["c'"].ring_d.dtype == torch.bfloat16
    for st in stock.values():
        st[1:] = S0.to(st.dtype)
    for cache in caches.values():
        cache.hp[1:] = S0
        apply_prefill_hook(
            cache.hp, cache.lp, cache.meta, slots, buffer_len=L, window=1, stagger=True
        )
    errs: dict[str, list[torch.Tensor]] = {k: [] for k in ("a", "b", *caches)}
    flush_checks = 0
    prev_stock = stock["a"][1:].clone()
    for t in range(STEPS):
        for name, st in stock.items():
            out = torch.empty(fam.out_shape(R))
            fam.stock(st, toks[t], slots, out)
            errs[name].append(out)
        for name, cache in caches.items():
            out = torch.empty(fam.out_shape(R))
            before = cache.meta[1:, 4:6].clone()  # fold descriptor changes on a flush
            fam.decode(cache, toks[t], slots, out, L, 1)
            errs[name].append(out)
            if name in ("c", "c'"):
                assert torch.equal(cache.hp.view(torch.uint8), caches["a'"].hp.view(torch.uint8)), (
                    f"step {t}: HP({name}) != HP(a')"
                )
                flushed = (cache.meta[1:, 4:6] != before).any(1)
                if name == "c" and fam.name == "gdn" and flushed.any():
                    # HP just folded tokens [0, t): the stock state one step earlier.
                    assert torch.equal(cache.hp[1:][flushed], prev_stock[flushed])
                    flush_checks += int(flushed.sum())
        prev_stock = stock["a"][1:].clone()
    if fam.name == "gdn":
        assert flush_checks >= R * (STEPS // L - 1)
    blocks = {}
    for name, outs in errs.items():
        y = torch.stack(outs).double()
        blocks[name] = [
            float(
                (y[i : i + BLOCK] - ref_out[i : i + BLOCK]).norm() / ref_out[i : i + BLOCK].norm()
            )
            for i in range(0, STEPS, BLOCK)
        ]
    finals = {"a": stock["a"][1:], "b": stock["b"][1:]}
    for name, cache in caches.items():
        fam.materialise(cache, slots, L, 1, True)
        finals[name] = cache.hp[1:]
    state_err = {
        k: float((v.double() - ref_state).norm() / ref_state.norm()) for k, v in finals.items()
    }
    return blocks, state_err


def _table(title: str, blocks, state_err) -> str:
    labels = {
        "a": "(a) stock, fp32 state",
        "a'": "(a') ReplaySSM, HP fp32",
        "b": "(b) stock, bf16 state",
        "c": "(c) ReplaySSM, HP fp32 + LP bf16",
        "c'": "(c') (c) with bf16 d records",
    }
    cols = [f"{i}-{i + BLOCK}" for i in range(0, STEPS, BLOCK)]
    pick = [0, 1, 3, 7]
    lines = [
        f"{title}: output error vs float64 by step range; final-state error",
        "| variant | " + " | ".join(f"steps {cols[i]}" for i in pick) + " | state @2048 |",
        "|---" * (len(pick) + 2) + "|",
    ]
    for k in [k for k in labels if k in blocks]:
        lines.append(
            f"| {labels[k]} | "
            + " | ".join(f"{blocks[k][i]:.2e}" for i in pick)
            + f" | {state_err[k]:.2e} |"
        )
    return "\n".join(lines)


FAMILIES = {
    "mamba2": lambda: Mamba2Family(Mamba2Geometry(8, 16, 32, 1), act_dtype=torch.bfloat16, seed=1),
    "gdn": lambda: GDNFamily(GDNGeometry(2, 4, 32, 32), act_dtype=torch.bfloat16, seed=1),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_two_precision_study(family, capsys):
    blocks, state_err = _study(FAMILIES[family]())
    with capsys.disabled():
        print("\n" + _table(family, blocks, state_err))
    # Full-precision paths agree with float64. GDN replay keeps its corrected values d in
    # fp32, so its HP-only outputs are as accurate as stock fp32 (the 1e-5 target;
    # bf16 d records were ~1e-3 off).
    assert max(blocks["a"]) < 2e-5 and state_err["a"] < 2e-5, (blocks["a"], state_err["a"])
    assert max(blocks["a'"]) < (2e-5 if family == "mamba2" else 1e-5), blocks["a'"]
    assert state_err["a'"] < 2e-5, state_err["a'"]
    # (c): bounded by the LP rounding of the checkpoint, no drift; its HP is exact.
    assert max(blocks["c"]) < 1e-2, blocks["c"]
    assert blocks["c"][-1] < 2 * blocks["c"][0] + 1e-4, blocks["c"]
    assert state_err["c"] < 2e-5
    # (b): a bf16 state rounds every update. Mamba-2 loses small increments and decays near
    # 1, so its error grows (then saturates); the delta rule re-corrects the state along
    # each key, so GDN's stays stationary, but several times (c)'s, and its state is wrong
    # at the bf16 level while HP stays fp32-exact.
    if family == "mamba2":
        assert blocks["b"][-1] > 2 * blocks["b"][0], blocks["b"]
    assert all(b > 3 * c for b, c in zip(blocks["b"], blocks["c"], strict=True))
    assert state_err["b"] > 1000 * state_err["c"]
    if family == "gdn":
        # (c'): d records in bf16 add their rounding to the LP read's (+30% here), no
        # drift; HP is unchanged (bitwise (a')'s, asserted in _study)
        assert all(cd < 1.5 * c for cd, c in zip(blocks["c'"], blocks["c"], strict=True))
        assert blocks["c'"][-1] < 2 * blocks["c'"][0] + 1e-4, blocks["c'"]
        assert all(b > 3 * cd for b, cd in zip(blocks["b"], blocks["c'"], strict=True))
        assert state_err["c'"] < 2e-5
