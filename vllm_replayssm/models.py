"""Model classes with ReplaySSM page sizing (registered over vLLM's by `registry.py`).

vLLM sizes hybrid pages from the model class's `get_mamba_state_{shape,dtype}_from_config`
(`Platform._align_hybrid_block_size`) before any layer exists; these overrides return the
ReplaySSM page of `layers/pages.py`, the same function the layers use, so the two agree.
Importing this module also swaps the SSM layers for ours (`PluggableLayer.register_oot`).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
from vllm.model_executor.models.qwen3_5 import (
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration,
)
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

from vllm_replayssm import prefix_cache
from vllm_replayssm.config import ReplayConfig
from vllm_replayssm.layers.gdn import ReplayQwenGatedDeltaNetAttention
from vllm_replayssm.layers.mamba2 import ReplayMambaMixer2
from vllm_replayssm.layers.pages import (
    gdn_page_specs,
    mamba2_page_specs,
    page_copy_func,
    shapes_and_dtypes,
)
from vllm_replayssm.layout import StateTensorSpec, page_size_bytes

QwenGatedDeltaNetAttention.register_oot(ReplayQwenGatedDeltaNetAttention)
MambaMixer2.register_oot(ReplayMambaMixer2)


class _ReplayPages:
    """Mixin: ReplaySSM page sizing when replayssm is enabled, and a fail-closed check that
    every SSM layer of the model is ours."""

    _stock_layer: type[torch.nn.Module]
    _replay_layer: type[torch.nn.Module]

    _replay_page_bytes: int | None = None

    # vLLM's loader passes `prefix` explicitly, and only to classes whose __init__ names it.
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if not ReplayConfig.from_vllm_config(vllm_config).enabled:
            return
        self._replay_page_bytes = page_size_bytes(self._replay_specs(vllm_config))
        if vllm_config.speculative_config and vllm_config.cache_config.enable_prefix_caching:
            prefix_cache.install()  # block-boundary copies of our pages
        stock = [
            name
            for name, m in self.named_modules()  # type: ignore[attr-defined]
            if isinstance(m, self._stock_layer) and not isinstance(m, self._replay_layer)
        ]
        if stock:  # a stock layer would silently ignore replayssm
            raise RuntimeError(
                f"replayssm is enabled but layers {stock[:3]} are stock "
                f"{self._stock_layer.__name__} (another plugin replaced ours?)"
            )

    @classmethod
    def _replay_specs(cls, vllm_config: Any) -> list[StateTensorSpec]:
        raise NotImplementedError

    def get_mamba_state_copy_func(self):
        """How vLLM's prefix caching ("align" mode) copies a request's state between blocks:
        with replayssm enabled, the whole ReplaySSM page in one copy (`page_copy_func`);
        vLLM's conv and SSM copies otherwise. An instance method over vLLM's classmethod:
        the runner calls it on the model, and the page size is known per instance."""
        if self._replay_page_bytes is None:
            return super().get_mamba_state_copy_func()
        return (page_copy_func(self._replay_page_bytes),)

    @classmethod
    def _replay_page(cls, vllm_config: Any) -> tuple[tuple, tuple] | None:
        if not ReplayConfig.from_vllm_config(vllm_config).enabled:
            return None
        return shapes_and_dtypes(cls._replay_specs(vllm_config))

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        page = cls._replay_page(vllm_config)
        return page[0] if page else super().get_mamba_state_shape_from_config(vllm_config)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        page = cls._replay_page(vllm_config)
        return page[1] if page else super().get_mamba_state_dtype_from_config(vllm_config)


class _GDNPages(_ReplayPages):
    """Models whose SSM layers are Gated DeltaNet (Qwen3-Next, Qwen3.5)."""

    _stock_layer = QwenGatedDeltaNetAttention
    _replay_layer = ReplayQwenGatedDeltaNetAttention

    @classmethod
    def _replay_specs(cls, vllm_config: Any) -> list[StateTensorSpec]:
        return gdn_page_specs(vllm_config, vllm_config.model_config.hf_text_config)


class ReplayNemotronHForCausalLM(_ReplayPages, NemotronHForCausalLM):
    """NemotronHForCausalLM whose Mamba-2 pages are ReplaySSM pages when replayssm is
    enabled."""

    _stock_layer = MambaMixer2
    _replay_layer = ReplayMambaMixer2

    @classmethod
    def _replay_specs(cls, vllm_config: Any) -> list[StateTensorSpec]:
        hf = vllm_config.model_config.hf_text_config
        return mamba2_page_specs(
            vllm_config,
            num_heads=hf.mamba_num_heads,
            head_dim=hf.mamba_head_dim,
            state_size=hf.ssm_state_size,
            n_groups=hf.n_groups,
            conv_kernel=hf.conv_kernel,
        )


class ReplayQwen3NextForCausalLM(_GDNPages, Qwen3NextForCausalLM):
    """Qwen3NextForCausalLM whose GDN pages are ReplaySSM pages when replayssm is enabled."""


class ReplayQwen3_5ForConditionalGeneration(  # noqa: N801 (vLLM's name)
    _GDNPages, Qwen3_5ForConditionalGeneration
):
    """Qwen3_5ForConditionalGeneration (dense) with ReplaySSM GDN pages when enabled."""


class ReplayQwen3_5MoeForConditionalGeneration(  # noqa: N801 (vLLM's name)
    _GDNPages, Qwen3_5MoeForConditionalGeneration
):
    """Qwen3_5MoeForConditionalGeneration with ReplaySSM GDN pages when enabled (its own
    subclass: vLLM's MoE class does not inherit page sizing from a dense override)."""
