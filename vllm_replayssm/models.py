"""Model classes with ReplaySSM page sizing (registered over vLLM's by `registry.py`).

vLLM sizes hybrid pages from the model class's `get_mamba_state_{shape,dtype}_from_config`
(`Platform._align_hybrid_block_size`) before any layer exists; these overrides return the
ReplaySSM page of `layers/pages.py`, the same function the layers use, so the two agree.
Importing this module also swaps the SSM layers for ours (`PluggableLayer.register_oot`).
"""

from __future__ import annotations

from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

from vllm_replayssm.config import ReplayConfig
from vllm_replayssm.layers.gdn import ReplayQwenGatedDeltaNetAttention
from vllm_replayssm.layers.pages import gdn_page_specs, shapes_and_dtypes

QwenGatedDeltaNetAttention.register_oot(ReplayQwenGatedDeltaNetAttention)


class ReplayQwen3NextForCausalLM(Qwen3NextForCausalLM):
    """Qwen3NextForCausalLM whose GDN pages are ReplaySSM pages when replayssm is enabled."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if ReplayConfig.from_vllm_config(vllm_config).enabled:
            stock = [name for name, m in self.named_modules()
                     if isinstance(m, QwenGatedDeltaNetAttention)
                     and not isinstance(m, ReplayQwenGatedDeltaNetAttention)]
            if stock:  # fail closed: a stock layer would silently ignore replayssm
                raise RuntimeError(f"replayssm is enabled but layers {stock[:3]} are stock "
                                   "QwenGatedDeltaNetAttention (another plugin replaced ours?)")

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        page = _replay_page(vllm_config)
        return page[0] if page else super().get_mamba_state_shape_from_config(vllm_config)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        page = _replay_page(vllm_config)
        return page[1] if page else super().get_mamba_state_dtype_from_config(vllm_config)


def _replay_page(vllm_config) -> tuple[tuple, tuple] | None:
    """(shapes, dtypes) of the ReplaySSM GDN page, or None when replayssm is off."""
    if not ReplayConfig.from_vllm_config(vllm_config).enabled:
        return None
    return shapes_and_dtypes(
        gdn_page_specs(vllm_config, vllm_config.model_config.hf_text_config))
