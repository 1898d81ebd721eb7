"""ReplaySSM state pages: which tensors a layer's page holds, their shapes, dtypes and offsets.

One page per (request, layer) holds, in this order (design §3.3): the stock conv state, the
fp32 HP checkpoint (so stock code, which touches only indices 0 and 1, keeps working), the
optional LP copy, the ring records, the cursor words and, under speculative decoding, the
window start. vLLM carves a page into
consecutive views without padding (`GPUModelRunner._reshape_kv_cache_tensors`), so uint8
pads are inserted to start every tensor on an ALIGN_BYTES boundary. `carve` reproduces that
carving for tests and benchmarks, so kernels always see vLLM's paged strides. Starts and the
page size are multiples of 128 bytes: every slot stride is then a multiple of 16 elements,
which Triton needs to prove 16-byte alignment and vectorise loads and stores.

Ring tensors are head-major ([heads, num_ring_rows, ...]) so one head's history is
contiguous; `ring_rows` gives their length. The cursor words (`META_LEN` int32 per page) are
read and written by the cursor machine (`kernels/common/cursor.py`), which defines them.
Slot (block id) `NULL_BLOCK_ID` is vLLM's null block: never a request's page; every op skips
rows that name it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

ALIGN_BYTES = 128
META_LEN = 8  # int32 cursor words per page
NULL_BLOCK_ID = 0  # vLLM's null block (block 0 of the pool): padding rows and freed requests


def ring_rows(buffer_len: int, window: int) -> int:
    """Ring length L + T: L committed entries plus one verify window of T = window tokens."""
    if window < 1 or buffer_len < window:
        raise ValueError(f"need 1 <= window <= buffer_len, got window={window}, L={buffer_len}")
    return buffer_len + window


@dataclass(frozen=True)
class Mamba2Geometry:
    """One TP rank's Mamba-2 mixer: nheads x headdim state rows, dstate columns.

    ngroups is the TP-extended per-rank group count (vLLM's `extra_groups_for_head_shards`).
    """

    nheads: int
    headdim: int
    dstate: int
    ngroups: int

    def __post_init__(self) -> None:
        if min(self.nheads, self.headdim, self.dstate, self.ngroups) < 1:
            raise ValueError(f"bad Mamba-2 geometry {self}")
        if self.nheads % self.ngroups:
            raise ValueError(f"nheads={self.nheads} not divisible by ngroups={self.ngroups}")

    @property
    def state_elems(self) -> int:
        return self.nheads * self.headdim * self.dstate


@dataclass(frozen=True)
class GDNGeometry:
    """One TP rank's Gated DeltaNet layer: value heads share key heads."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int

    def __post_init__(self) -> None:
        if min(self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim) < 1:
            raise ValueError(f"bad GDN geometry {self}")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"num_v_heads={self.num_v_heads} not divisible by num_k_heads={self.num_k_heads}"
            )

    @property
    def state_elems(self) -> int:
        return self.num_v_heads * self.head_v_dim * self.head_k_dim


@dataclass(frozen=True)
class StateTensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _aligned(specs: list[StateTensorSpec]) -> list[StateTensorSpec]:
    """Insert uint8 pads so every tensor starts on ALIGN_BYTES; pad the page end too."""
    out: list[StateTensorSpec] = []
    offset = 0
    for spec in specs:
        gap = -offset % ALIGN_BYTES
        if gap:
            out.append(StateTensorSpec(f"pad{len(out)}", (gap,), torch.uint8))
            offset += gap
        out.append(spec)
        offset += spec.nbytes
    gap = -offset % ALIGN_BYTES
    if gap:
        out.append(StateTensorSpec(f"pad{len(out)}", (gap,), torch.uint8))
    return out


def _window_start_specs(window: int) -> list[StateTensorSpec]:
    """Under speculative decoding (window > 1) a page also keeps its window start: the tokens
    before its pending window, from which the next step derives what it commits
    (`layers/spec.py`). It lives in the page so that a page copied to another block (vLLM's
    prefix caching moves a running request's page, and caches a copy at block boundaries)
    describes itself wherever it lands."""
    return [StateTensorSpec("window_start", (1,), torch.int64)] if window > 1 else []


def mamba2_state_specs(
    geom: Mamba2Geometry,
    buffer_len: int,
    window: int,
    act_dtype: torch.dtype,
    lp_dtype: torch.dtype | None,
    conv_shape: tuple[int, ...],
    conv_dtype: torch.dtype,
) -> list[StateTensorSpec]:
    """Page of one Mamba-2 layer: conv, hp, [lp], ring_dt, ring_x, ring_B, meta,
    [window_start] (+ pads)."""
    num_ring_rows = ring_rows(buffer_len, window)
    H, P, N, G = geom.nheads, geom.headdim, geom.dstate, geom.ngroups
    specs = [
        StateTensorSpec("conv", tuple(conv_shape), conv_dtype),
        StateTensorSpec("hp", (H, P, N), torch.float32),
    ]
    if lp_dtype is not None:
        specs.append(StateTensorSpec("lp", (H, P, N), lp_dtype))
    specs += [
        StateTensorSpec("ring_dt", (H, num_ring_rows), torch.float32),
        StateTensorSpec("ring_x", (H, num_ring_rows, P), act_dtype),
        StateTensorSpec("ring_B", (G, num_ring_rows, N), act_dtype),
        StateTensorSpec("meta", (META_LEN,), torch.int32),
    ]
    return _aligned(specs + _window_start_specs(window))


def gdn_d_records_allowed(
    d_dtype: torch.dtype, lp_dtype: torch.dtype | None, exact_flush: bool
) -> bool:
    """Whether a GDN page may keep its corrected values d in d_dtype: fp32 always; below fp32
    only in the dtype of an LP copy with the exact flush, which recomputes d from HP (a flush
    that sums the records would put their rounding into HP)."""
    return d_dtype == torch.float32 or (d_dtype == lp_dtype and exact_flush)


def gdn_state_specs(
    geom: GDNGeometry,
    buffer_len: int,
    window: int,
    act_dtype: torch.dtype,
    lp_dtype: torch.dtype | None,
    exact_flush: bool,
    conv_shape: tuple[int, ...],
    conv_dtype: torch.dtype,
    d_dtype: torch.dtype = torch.float32,
) -> list[StateTensorSpec]:
    """Page of one GDN layer: conv, hp, [lp], ring_g, [ring_beta], ring_k, ring_d, [ring_v],
    meta, [window_start] (+ pads). beta and v are kept only for the exact flush. The
    corrected values d are fp32 (they carry the state dependence: HP-only replay is then as
    accurate as stock fp32), or d_dtype = the LP dtype (`config.gdn_d_dtype` "lp") with an
    LP copy and the exact flush, which then recomputes d from HP: the records feed only
    readouts, whose error is the LP read's level anyway."""
    if not gdn_d_records_allowed(d_dtype, lp_dtype, exact_flush):
        raise ValueError(
            f"d records in {d_dtype} need an LP copy of that dtype and the exact flush "
            f"(got LP {lp_dtype}, exact flush {exact_flush})"
        )
    num_ring_rows = ring_rows(buffer_len, window)
    Hk, Hv, K, V = geom.num_k_heads, geom.num_v_heads, geom.head_k_dim, geom.head_v_dim
    specs = [
        StateTensorSpec("conv", tuple(conv_shape), conv_dtype),
        StateTensorSpec("hp", (Hv, V, K), torch.float32),
    ]
    if lp_dtype is not None:
        specs.append(StateTensorSpec("lp", (Hv, V, K), lp_dtype))
    specs.append(StateTensorSpec("ring_g", (Hv, num_ring_rows), torch.float32))
    if exact_flush:
        specs.append(StateTensorSpec("ring_beta", (Hv, num_ring_rows), torch.float32))
    specs += [
        StateTensorSpec("ring_k", (Hk, num_ring_rows, K), act_dtype),
        StateTensorSpec("ring_d", (Hv, num_ring_rows, V), d_dtype),
    ]
    if exact_flush:
        specs.append(StateTensorSpec("ring_v", (Hv, num_ring_rows, V), act_dtype))
    specs.append(StateTensorSpec("meta", (META_LEN,), torch.int32))
    return _aligned(specs + _window_start_specs(window))


def page_size_bytes(specs: list[StateTensorSpec]) -> int:
    return sum(s.nbytes for s in specs)


def carve(raw: torch.Tensor, specs: list[StateTensorSpec], page_bytes: int | None = None):
    """Views [num_blocks, *shape] over a flat uint8 buffer, laid out as vLLM 0.26 does.

    raw: contiguous uint8 of num_blocks * page_bytes bytes (page_bytes defaults to the
    specs' sum; vLLM may pad pages further). Returns {name: view}, pads included.
    """
    page = page_bytes if page_bytes is not None else page_size_bytes(specs)
    if raw.dtype != torch.uint8 or raw.numel() % page:
        raise ValueError(f"raw buffer must be uint8 with a multiple of {page} bytes")
    num_blocks = raw.numel() // page
    views: dict[str, torch.Tensor] = {}
    offset = 0
    for spec in specs:
        size = _itemsize(spec.dtype)
        if offset % size or page % size:
            raise ValueError(f"{spec.name}: offset {offset} not aligned to its dtype")
        inner = torch.empty(spec.shape, device="meta").stride() if spec.shape else ()
        views[spec.name] = torch.as_strided(
            raw.view(spec.dtype),
            size=(num_blocks, *spec.shape),
            stride=(page // size, *inner),
            storage_offset=offset // size,
        )
        offset += spec.nbytes
    return views


class Mamba2ReplayCache(NamedTuple):
    """One Mamba-2 layer's ReplaySSM tensors, each [num_slots, ...] (slot = block id).

    hp: [S, H, P, N] fp32; lp: [S, H, P, N] bf16/fp16 or None; ring_dt: [S, H, num_ring_rows]
    fp32 (post-softplus dt); ring_x: [S, H, num_ring_rows, P] act; ring_B: [S, G,
    num_ring_rows, N] act; meta: [S, META_LEN] int32 (num_ring_rows = `ring_rows(buffer_len,
    window)`).
    """

    hp: torch.Tensor
    lp: torch.Tensor | None
    ring_dt: torch.Tensor
    ring_x: torch.Tensor
    ring_B: torch.Tensor
    meta: torch.Tensor

    @classmethod
    def from_views(cls, views: dict[str, torch.Tensor]) -> Mamba2ReplayCache:
        return cls(
            views["hp"],
            views.get("lp"),
            views["ring_dt"],
            views["ring_x"],
            views["ring_B"],
            views["meta"],
        )


class GDNReplayCache(NamedTuple):
    """One GDN layer's ReplaySSM tensors, each [num_slots, ...].

    hp: [S, Hv, V, K] fp32; lp: like hp in bf16/fp16 or None; ring_g: [S, Hv, num_ring_rows]
    fp32 (log decay); ring_beta: like ring_g, or None (fold mode); ring_k: [S, Hk,
    num_ring_rows, K] act (pre-norm k); ring_d: [S, Hv, num_ring_rows, V] fp32 or the LP
    dtype (corrected values, `gdn_state_specs`); ring_v: [S, Hv, num_ring_rows, V] act, or
    None (fold mode); meta: [S, META_LEN] int32.
    """

    hp: torch.Tensor
    lp: torch.Tensor | None
    ring_g: torch.Tensor
    ring_beta: torch.Tensor | None
    ring_k: torch.Tensor
    ring_d: torch.Tensor
    ring_v: torch.Tensor | None
    meta: torch.Tensor

    @property
    def exact_flush(self) -> bool:
        return self.ring_v is not None

    @classmethod
    def from_views(cls, views: dict[str, torch.Tensor]) -> GDNReplayCache:
        return cls(
            views["hp"],
            views.get("lp"),
            views["ring_g"],
            views.get("ring_beta"),
            views["ring_k"],
            views["ring_d"],
            views.get("ring_v"),
            views["meta"],
        )


def allocate_pages(
    specs: list[StateTensorSpec],
    num_blocks: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A fresh paged buffer filled with seeded garbage bytes (NaNs included), since vLLM
    never zeroes mamba pages."""
    page = page_size_bytes(specs)
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (num_blocks * page,), dtype=torch.uint8, generator=gen)
    return carve(raw.to(device), specs, page)
