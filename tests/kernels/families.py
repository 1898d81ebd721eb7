"""Test adapters that give Mamba-2 and GDN one interface: parameters, token inputs, the
float64 oracle, and the decode / materialise ops under test (torch reference by default,
any op with the same signature otherwise)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vllm_replayssm.kernels.gdn import reference as gdn_ref
from vllm_replayssm.kernels.gdn.naive import gdn_naive_scan
from vllm_replayssm.kernels.mamba2 import reference as m2_ref
from vllm_replayssm.kernels.mamba2.naive import mamba2_naive_scan
from vllm_replayssm.layout import (
    GDNGeometry,
    GDNReplayCache,
    Mamba2Geometry,
    Mamba2ReplayCache,
    allocate_pages,
    gdn_state_specs,
    mamba2_state_specs,
)

CONV = ((12, 3), torch.float32)  # a stand-in conv state: kernels never touch it


def inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def realistic_dt_bias(n: int, gen: torch.Generator) -> torch.Tensor:
    """dt_bias such that softplus(dt_bias) is log-uniform in [1e-3, 1e-1] (Mamba-2 init)."""
    u = torch.rand(n, generator=gen)
    dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    return inv_softplus(dt)


@dataclass
class Mamba2Family:
    geom: Mamba2Geometry
    act_dtype: torch.dtype = torch.float32
    seed: int = 0
    decode_op: Callable = m2_ref.mamba2_replay_decode
    materialise_op: Callable = m2_ref.mamba2_replay_materialise
    stock_route_op: Callable = m2_ref.mamba2_stock_route_decode
    device: str = "cpu"
    params: dict = field(init=False)
    name = "mamba2"
    copied_rings = ("ring_x", "ring_B")  # records that are inputs, stored bit for bit

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        H = self.geom.nheads
        self.params = {
            "A": -torch.exp(torch.rand(H, generator=gen) * math.log(16.0)),  # A in [-16, -1]
            "D": torch.randn(H, generator=gen),
            "dt_bias": realistic_dt_bias(H, gen),
        }
        self.params = {k: v.to(self.device) for k, v in self.params.items()}

    def specs(self, L: int, T: int, lp: torch.dtype | None, **_: object):
        return mamba2_state_specs(self.geom, L, T, self.act_dtype, lp, *CONV)

    def cache(self, specs, num_slots: int) -> Mamba2ReplayCache:
        return Mamba2ReplayCache.from_views(allocate_pages(specs, num_slots, self.device))

    @property
    def state_shape(self) -> tuple[int, ...]:
        g = self.geom
        return (g.nheads, g.headdim, g.dstate)

    def initial_state(self, gen: torch.Generator) -> torch.Tensor:
        return torch.randn(self.state_shape, generator=gen)

    def out_shape(self, n: int) -> tuple[int, ...]:
        return (n, self.geom.nheads, self.geom.headdim)

    def tokens(self, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        g = self.geom
        t = {
            "x": torch.randn(n, g.nheads, g.headdim, generator=gen),
            "dt": torch.randn(n, g.nheads, generator=gen) * 0.5,
            "B": torch.randn(n, g.ngroups, g.dstate, generator=gen),
            "C": torch.randn(n, g.ngroups, g.dstate, generator=gen) / math.sqrt(g.dstate),
        }
        return {k: v.to(self.act_dtype).to(self.device) for k, v in t.items()}

    def naive(self, S0: torch.Tensor, tok: dict[str, torch.Tensor]):
        p = self.params
        return mamba2_naive_scan(
            S0.cpu(),
            tok["x"].cpu(),
            tok["dt"].cpu(),
            p["A"].cpu(),
            tok["B"].cpu(),
            tok["C"].cpu(),
            p["D"].cpu(),
            p["dt_bias"].cpu(),
        )

    def decode(self, cache, tok, state_indices, out, L, T, qsl=None, acc=None) -> None:
        p = self.params
        (self.decode_op or m2_ref.mamba2_replay_decode)(
            cache,
            tok["x"],
            tok["dt"],
            p["A"],
            tok["B"],
            tok["C"],
            p["D"],
            p["dt_bias"],
            state_indices,
            out,
            buffer_len=L,
            window=T,
            query_start_loc=qsl,
            num_accepted_tokens=acc,
        )

    def decode_stock_route(self, cache, tok, state_indices, out, L, T, stagger=True) -> None:
        p = self.params
        self.stock_route_op(
            cache,
            tok["x"],
            tok["dt"],
            p["A"],
            tok["B"],
            tok["C"],
            p["D"],
            p["dt_bias"],
            state_indices,
            out,
            buffer_len=L,
            window=T,
            stagger=stagger,
        )

    def stock(self, state, tok, state_indices, out) -> None:
        p = self.params
        m2_ref.mamba2_stock_decode(
            state,
            tok["x"],
            tok["dt"],
            p["A"],
            tok["B"],
            tok["C"],
            p["D"],
            p["dt_bias"],
            state_indices,
            out,
        )

    def materialise(self, cache, state_indices, L, T, stagger, acc=None) -> None:
        self.materialise_op(
            cache,
            self.params["A"],
            state_indices,
            buffer_len=L,
            window=T,
            stagger=stagger,
            num_accepted_tokens=acc,
        )

    def ring_tensors(self, cache) -> list[torch.Tensor]:
        return [cache.ring_dt, cache.ring_x, cache.ring_B]


@dataclass
class GDNFamily:
    geom: GDNGeometry
    act_dtype: torch.dtype = torch.float32
    seed: int = 0
    exact_flush: bool = True
    d_lp: bool = False  # d records in the LP dtype where there is an LP copy (gdn_d_dtype "lp")
    decode_op: Callable = gdn_ref.gdn_replay_decode
    materialise_op: Callable = gdn_ref.gdn_replay_materialise
    stock_route_op: Callable = gdn_ref.gdn_stock_route_decode
    device: str = "cpu"
    params: dict = field(init=False)
    name = "gdn"
    copied_rings = ("ring_k", "ring_v")

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        Hv = self.geom.num_v_heads
        self.params = {
            "A_log": torch.rand(Hv, generator=gen) * math.log(16.0),  # exp(A_log) in [1, 16]
            "dt_bias": realistic_dt_bias(Hv, gen),
        }
        self.params = {k: v.to(self.device) for k, v in self.params.items()}
        self.scale = self.geom.head_k_dim**-0.5

    def specs(self, L: int, T: int, lp: torch.dtype | None, **_: object):
        d = lp if self.d_lp and lp is not None else torch.float32
        return gdn_state_specs(self.geom, L, T, self.act_dtype, lp, self.exact_flush, *CONV, d)

    def cache(self, specs, num_slots: int) -> GDNReplayCache:
        return GDNReplayCache.from_views(allocate_pages(specs, num_slots, self.device))

    @property
    def state_shape(self) -> tuple[int, ...]:
        g = self.geom
        return (g.num_v_heads, g.head_v_dim, g.head_k_dim)

    def initial_state(self, gen: torch.Generator) -> torch.Tensor:
        return torch.randn(self.state_shape, generator=gen) * 0.5

    def out_shape(self, n: int) -> tuple[int, ...]:
        return (n, self.geom.num_v_heads, self.geom.head_v_dim)

    def tokens(self, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        g = self.geom
        t = {
            "q": torch.randn(n, g.num_k_heads, g.head_k_dim, generator=gen),
            "k": torch.randn(n, g.num_k_heads, g.head_k_dim, generator=gen),
            "v": torch.randn(n, g.num_v_heads, g.head_v_dim, generator=gen),
            "a": torch.randn(n, g.num_v_heads, generator=gen) * 0.5,
            "b": torch.randn(n, g.num_v_heads, generator=gen),
        }
        return {k: v.to(self.act_dtype).to(self.device) for k, v in t.items()}

    def naive(self, S0: torch.Tensor, tok: dict[str, torch.Tensor]):
        p = self.params
        return gdn_naive_scan(
            S0.cpu(),
            tok["q"].cpu(),
            tok["k"].cpu(),
            tok["v"].cpu(),
            tok["a"].cpu(),
            tok["b"].cpu(),
            p["A_log"].cpu(),
            p["dt_bias"].cpu(),
            self.scale,
        )

    def decode(self, cache, tok, state_indices, out, L, T, qsl=None, acc=None) -> None:
        p = self.params
        (self.decode_op or gdn_ref.gdn_replay_decode)(
            cache,
            tok["q"],
            tok["k"],
            tok["v"],
            tok["a"],
            tok["b"],
            p["A_log"],
            p["dt_bias"],
            state_indices,
            out,
            scale=self.scale,
            buffer_len=L,
            window=T,
            query_start_loc=qsl,
            num_accepted_tokens=acc,
        )

    def decode_stock_route(self, cache, tok, state_indices, out, L, T, stagger=True) -> None:
        p = self.params
        self.stock_route_op(
            cache,
            tok["q"],
            tok["k"],
            tok["v"],
            tok["a"],
            tok["b"],
            p["A_log"],
            p["dt_bias"],
            state_indices,
            out,
            scale=self.scale,
            buffer_len=L,
            window=T,
            stagger=stagger,
        )

    def stock(self, state, tok, state_indices, out) -> None:
        p = self.params
        gdn_ref.gdn_stock_decode(
            state,
            tok["q"],
            tok["k"],
            tok["v"],
            tok["a"],
            tok["b"],
            p["A_log"],
            p["dt_bias"],
            state_indices,
            out,
            scale=self.scale,
        )

    def materialise(self, cache, state_indices, L, T, stagger, acc=None) -> None:
        self.materialise_op(
            cache,
            state_indices,
            buffer_len=L,
            window=T,
            stagger=stagger,
            num_accepted_tokens=acc,
        )

    def ring_tensors(self, cache) -> list[torch.Tensor]:
        return [
            t
            for t in (cache.ring_g, cache.ring_beta, cache.ring_k, cache.ring_d, cache.ring_v)
            if t is not None
        ]


def index_tokens(tok: dict[str, torch.Tensor], idx) -> dict[str, torch.Tensor]:
    return {k: v[idx] for k, v in tok.items()}


def cat_tokens(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
