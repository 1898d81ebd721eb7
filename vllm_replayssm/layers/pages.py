"""The ReplaySSM page of a layer as vLLM sees it: state shapes and dtypes for MambaSpec (one
function for the layer and the model classmethod, so page sizes agree), and the bound
kv_cache tensors named and typed as our caches."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from vllm.logger import init_logger

from vllm_replayssm.config import ReplayConfig, ReplayConfigError
from vllm_replayssm.config_checks import SUPPORTED_ARCHS
from vllm_replayssm.layers.conv import conv_state_view
from vllm_replayssm.layout import (
    GDNGeometry,
    GDNReplayCache,
    Mamba2Geometry,
    Mamba2ReplayCache,
    StateTensorSpec,
    gdn_state_specs,
    mamba2_state_specs,
    page_size_bytes,
)

logger = init_logger(f"vllm.{__name__}")  # under "vllm": vLLM configures only that tree


def _num_spec(vllm_config: Any) -> int:
    spec = vllm_config.speculative_config
    return spec.num_speculative_tokens if spec else 0


def gdn_page_specs(vllm_config: Any, hf_config: Any) -> list[StateTensorSpec]:
    """Page of one GDN layer of `hf_config` (Qwen3-Next / Qwen3.5 text config) on one TP
    rank: the stock conv state first, then HP in the stock state's place, then ours."""
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateDtypeCalculator,
        MambaStateShapeCalculator,
    )

    cfg = ReplayConfig.from_vllm_config(vllm_config).for_family("gdn")
    tp = vllm_config.parallel_config.tensor_parallel_size
    num_spec = _num_spec(vllm_config)
    Hk, Hv = hf_config.linear_num_key_heads, hf_config.linear_num_value_heads
    K, V = hf_config.linear_key_head_dim, hf_config.linear_value_head_dim
    conv_shape, _ = MambaStateShapeCalculator.gated_delta_net_state_shape(
        tp, Hk, Hv, K, V, hf_config.linear_conv_kernel_dim, num_spec
    )
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    conv_dtype = MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        model_config.dtype, cache_config.mamba_cache_dtype, cache_config.mamba_ssm_cache_dtype
    )[0]
    if Hk % tp or Hv % tp:
        raise ValueError(f"GDN heads ({Hk} key, {Hv} value) not divisible by TP size {tp}")
    geom = GDNGeometry(Hk // tp, Hv // tp, K, V)
    return gdn_state_specs(
        geom,
        cfg.buffer_len,
        1 + num_spec,
        model_config.dtype,
        cfg.lp_torch_dtype,
        cfg.gdn_flush == "exact",
        tuple(conv_shape),
        conv_dtype,
        d_dtype=cfg.gdn_d_torch_dtype,
    )


def mamba2_page_specs(
    vllm_config: Any,
    *,
    num_heads: int,
    head_dim: int,
    state_size: int,
    n_groups: int,
    conv_kernel: int,
) -> list[StateTensorSpec]:
    """Page of one Mamba-2 layer on one TP rank (model-level head and group counts in; the
    TP-extended group count of vLLM's `extra_groups_for_head_shards` applied here)."""
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateDtypeCalculator,
        MambaStateShapeCalculator,
    )

    cfg = ReplayConfig.from_vllm_config(vllm_config).for_family("mamba2")
    tp = vllm_config.parallel_config.tensor_parallel_size
    num_spec = _num_spec(vllm_config)
    if num_heads % tp:
        raise ValueError(f"Mamba-2 heads ({num_heads}) not divisible by TP size {tp}")
    if n_groups % tp and n_groups != 1:
        raise ValueError(f"Mamba-2 groups ({n_groups}) must be 1 or divisible by TP size {tp}")
    conv_shape, ssm_shape = MambaStateShapeCalculator.mamba2_state_shape(
        tp_world_size=tp,
        intermediate_size=num_heads * head_dim,
        n_groups=n_groups,
        num_heads=num_heads,
        head_dim=head_dim,
        state_size=state_size,
        conv_kernel=conv_kernel,
        num_spec=num_spec,
    )
    groups = (n_groups + MambaStateShapeCalculator.extra_groups_for_head_shards(n_groups, tp)) // tp
    model_config, cache_config = vllm_config.model_config, vllm_config.cache_config
    conv_dtype = MambaStateDtypeCalculator.mamba2_state_dtype(
        model_config.dtype, cache_config.mamba_cache_dtype, cache_config.mamba_ssm_cache_dtype
    )[0]
    geom = Mamba2Geometry(*ssm_shape, groups)
    return mamba2_state_specs(
        geom,
        cfg.buffer_len,
        1 + num_spec,
        model_config.dtype,
        cfg.lp_torch_dtype,
        tuple(conv_shape),
        conv_dtype,
    )


def shapes_and_dtypes(specs: list[StateTensorSpec]) -> tuple[tuple, tuple]:
    return tuple(s.shape for s in specs), tuple(s.dtype for s in specs)


def _bound_views(kv_cache, specs: list[StateTensorSpec]) -> dict[str, torch.Tensor]:
    """The bound tensors of one layer by spec name, checked against the declared page."""
    if len(kv_cache) != len(specs):
        raise RuntimeError(f"layer has {len(kv_cache)} state tensors, page declares {len(specs)}")
    views = {}
    for spec, t in zip(specs, kv_cache, strict=True):
        if tuple(t.shape[1:]) != spec.shape or t.dtype != spec.dtype:
            raise RuntimeError(
                f"state tensor {spec.name}: bound {tuple(t.shape[1:])} "
                f"{t.dtype}, declared {spec.shape} {spec.dtype}"
            )
        views[spec.name] = t
    return views


def same_tensors(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    """Whether a and b hold the very same tensor objects in the same order (a binding, or
    something derived from one, still current)."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


class PageViews:
    """One layer's bound state tensors, named and viewed as its ops take them, built once per
    binding (`ReplayPage.page_views`): eager steps asked for them in every layer, and checking
    each tensor against the declared page anew cost about 20 µs of host time per step and
    layer. kv_cache: the layer's bound tensors; specs: its page (`replay_specs`)."""

    __slots__ = ("_made", "specs", "tensors", "views")

    def __init__(self, kv_cache: Sequence[torch.Tensor], specs: list[StateTensorSpec]) -> None:
        self.views = _bound_views(kv_cache, specs)
        self.tensors = tuple(kv_cache)
        self.specs = specs
        self._made: dict = {}

    def binds(self, kv_cache: Sequence[torch.Tensor], specs: list[StateTensorSpec]) -> bool:
        """Whether these are still the layer's tensors and page (vLLM binds new tensors
        when it reallocates the cache)."""
        return specs is self.specs and same_tensors(kv_cache, self.tensors)

    def _get(self, key, make):
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = make()
        return made

    def mamba2(self) -> Mamba2ReplayCache:
        """The tensors of a Mamba-2 page, named."""
        return self._get("mamba2", lambda: Mamba2ReplayCache.from_views(self.views))

    def gdn(self, state_k_major: bool) -> GDNReplayCache:
        """The tensors of a GDN page, named. state_k_major: the platform's stock kernels
        store each head's state as [K, V] in the memory declared [V, K] (vLLM's CPU
        kernels); HP and LP are then viewed transposed so that our ops see [V, K] either
        way."""

        def make() -> GDNReplayCache:
            views = dict(self.views)
            if state_k_major:
                for name in ("hp", "lp"):
                    if views.get(name) is not None:
                        S, H, V, K = views[name].shape
                        views[name] = views[name].view(S, H, K, V).transpose(-1, -2)
            return GDNReplayCache.from_views(views)

        return self._get(("gdn", state_k_major), make)

    def conv(self) -> torch.Tensor:
        """[S, D, M] the conv state, dim-first (`conv.conv_state_view`)."""
        return self._get("conv", lambda: conv_state_view(self.tensors))

    def window_start(self) -> torch.Tensor:
        """[S] int64: the window start word of every page (a strided view; pages of
        speculative decoding only, `layout._window_start_specs`)."""
        return self._get("window_start", lambda: self.views["window_start"][:, 0])


def page_rows(state: torch.Tensor, page_bytes: int) -> torch.Tensor:
    """[num_blocks, page_bytes] uint8 view of one layer's pages, from its tensor 0 (`state`,
    [num_blocks, ...] as vLLM binds it: each page one contiguous run from tensor 0's block
    start, `layout.carve`; the block stride may exceed the page, when vLLM pads pages)."""
    stride = state.stride(0) * state.element_size()
    if stride < page_bytes:
        raise RuntimeError(f"block stride {stride} B is below the page's {page_bytes} B")
    raw = torch.empty(0, dtype=torch.uint8, device=state.device).set_(state.untyped_storage())
    return raw.as_strided(
        (state.shape[0], page_bytes), (stride, 1), state.storage_offset() * state.element_size()
    )


def page_copy_func(page_bytes: int):
    """vLLM's prefix caching in "align" mode moves a request's state to its next block with
    one `MambaStateCopyFunc` per state tensor of the model's `get_mamba_state_copy_func`
    (`vllm.v1.worker.mamba_utils.preprocess_mamba`, through `collect_mamba_copy_meta`,
    which pairs the functions with the layer's tensors and stops at the shorter). A
    ReplaySSM page is contiguous per block (vLLM carves it from one page-sized run, tensor 0
    at its start: `layout.carve`), so one copy of `page_bytes` from tensor 0's block start
    moves all of it: conv, HP, LP, ring, cursor words and window start. Returns that
    function, for tensor 0 only. It copies the source block whole whatever the accepted
    count vLLM passes (under speculative decoding, the tokens its last step accepted): the
    page's cursor words and window start let the next step derive what it commits
    (`layers/spec.py`), where vLLM's own states are cut at the accepted token. The function
    carries `replayssm_page_bytes` so that `prefix_cache.py` can recognise our pages."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaCopySpec

    def copy_page(state: torch.Tensor, block_ids: list[int], cur_block_idx: int, accepted: int):
        if page_bytes % state.element_size():
            raise RuntimeError(f"page of {page_bytes} B is not a multiple of tensor 0's dtype")
        start = state[block_ids[cur_block_idx]].data_ptr()
        return MambaCopySpec(start_addr=start, num_elements=page_bytes // state.element_size())

    copy_page.replayssm_page_bytes = page_bytes  # type: ignore[attr-defined]
    return copy_page


class ReplayPage:
    """Mixin of our SSM layers (before vLLM's class in the bases): `get_state_shape` /
    `get_state_dtype` answer the ReplaySSM page (`self.replay_specs`) when replayssm is
    enabled, vLLM's own otherwise and inside `stock_page()`."""

    replay: ReplayConfig | None = None
    replay_specs: list[StateTensorSpec]
    replay_window: int
    _stock_page = False
    _page_views: PageViews | None = None

    def page_views(self) -> PageViews:
        """This layer's bound page, named and viewed (`PageViews`), rebuilt when vLLM binds
        other tensors. Replay pages only."""
        memo = self._page_views
        kv = self.kv_cache  # type: ignore[attr-defined]
        if memo is None or not memo.binds(kv, self.replay_specs):
            memo = self._page_views = PageViews(kv, self.replay_specs)
        return memo

    def _start_replay(self, vllm_config: Any, family: str) -> bool:
        """Read the replayssm settings into `self.replay` (buffer_len set for `family`, "mamba2"
        or "gdn"); when enabled, refuse what the layer cannot run (an architecture whose page
        vLLM sizes, a window the ring cannot hold) and set `self.replay_window`. Returns
        whether replayssm is enabled."""
        self.replay = ReplayConfig.from_vllm_config(vllm_config).for_family(family)
        if not self.replay.enabled:
            return False
        arch = vllm_config.model_config.architecture
        if arch not in SUPPORTED_ARCHS:  # its page would be sized by vLLM's classmethods
            raise ReplayConfigError(f"replayssm does not support {arch} yet")
        num_spec = self.num_spec  # type: ignore[attr-defined]
        self.replay.check_window(num_spec)
        self.replay_window = 1 + num_spec
        return True

    def _log_spec_memory(self, family: str) -> None:
        """Start-up line under speculative decoding: state bytes per request and layer, ours
        (one page) vs stock speculative decoding (1 + k pages), before vLLM pads pages to a
        common size."""
        num_spec = self.num_spec  # type: ignore[attr-defined]
        if not num_spec:
            return
        with self.stock_page():
            shapes, dtypes = self.get_state_shape(), self.get_state_dtype()  # type: ignore[attr-defined]
        stock = sum(math.prod(s) * d.itemsize for s, d in zip(shapes, dtypes, strict=True))
        stock_spec = (1 + num_spec) * stock
        ours = page_size_bytes(self.replay_specs)  # type: ignore[attr-defined]
        logger.info_once(
            "ReplaySSM speculative decoding (k=%d): %.1f KiB of %s state per request and "
            "layer (one page: HP, LP, ring of %d records) vs %.1f KiB for stock speculative "
            "decoding (1 + k = %d pages): %.2fx as many requests per byte of state",
            num_spec,
            ours / 1024,
            family,
            self.replay.buffer_len + self.replay_window,
            stock_spec / 1024,
            1 + num_spec,
            stock_spec / ours,
        )

    def get_kv_cache_spec(self, vllm_config: Any):
        """vLLM's MambaSpec, with one page per request under speculative decoding: the
        window's records go to the ring, so no draft ever needs a state slot of its own."""
        spec = super().get_kv_cache_spec(vllm_config)  # type: ignore[misc]
        if self._replay_page() and spec is not None and spec.num_speculative_blocks:
            spec = dataclasses.replace(spec, num_speculative_blocks=0)
        return spec

    def _replay_page(self) -> bool:
        return self.replay is not None and self.replay.enabled and not self._stock_page

    def get_state_shape(self):
        if not self._replay_page():
            return super().get_state_shape()  # type: ignore[misc]
        return shapes_and_dtypes(self.replay_specs)[0]

    def get_state_dtype(self):
        if not self._replay_page():
            return super().get_state_dtype()  # type: ignore[misc]
        return shapes_and_dtypes(self.replay_specs)[1]

    @contextlib.contextmanager
    def metadata_view(self, attn_metadata: dict, view) -> Iterator[None]:
        """vLLM's own methods of this layer read `view` (a prefill-only view of the step's
        metadata) where they look up attn_metadata[self.prefix]; the step's metadata is put
        back afterwards, whatever happens."""
        md = attn_metadata[self.prefix]
        attn_metadata[self.prefix] = view
        try:
            yield
        finally:
            attn_metadata[self.prefix] = md

    @contextlib.contextmanager
    def stock_page(self) -> Iterator[None]:
        """vLLM's kernel warm-ups unpack get_state_dtype() into exactly (conv, ssm)."""
        self._stock_page = True
        try:
            yield
        finally:
            self._stock_page = False
