"""The one table of what vllm-replayssm overrides in vLLM, applied by `register()`.

Models are registered by string, so nothing heavy is imported until vLLM resolves the
architecture; importing `vllm_replayssm.models` then swaps the layers (register_oot).
"""

from __future__ import annotations

MODEL_OVERRIDES: dict[str, str] = {
    "Qwen3NextForCausalLM": "vllm_replayssm.models:ReplayQwen3NextForCausalLM",
}


def register_models() -> None:
    from vllm.model_executor.models import ModelRegistry

    for arch, target in MODEL_OVERRIDES.items():
        ModelRegistry.register_model(arch, target)
