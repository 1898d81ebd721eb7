"""The one table of what vllm-replayssm overrides or registers in vLLM, applied by
`register()`.

Models are registered by string, so nothing heavy is imported until vLLM resolves the
architecture; importing `vllm_replayssm.models` then swaps the layers (register_oot).
"""

from __future__ import annotations

_MODELS = "vllm_replayssm.models"
MODEL_OVERRIDES: dict[str, str] = {
    "Qwen3NextForCausalLM": f"{_MODELS}:ReplayQwen3NextForCausalLM",
    "NemotronHForCausalLM": f"{_MODELS}:ReplayNemotronHForCausalLM",
    "Qwen3_5ForConditionalGeneration": f"{_MODELS}:ReplayQwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration": f"{_MODELS}:ReplayQwen3_5MoeForConditionalGeneration",
}


def register_models() -> None:
    from vllm.model_executor.models import ModelRegistry

    for arch, target in MODEL_OVERRIDES.items():
        ModelRegistry.register_model(arch, target)


def register_config_checks() -> None:
    """Put our start-up checks in front of vLLM's per-architecture config hook (adding one
    where vLLM has none) for every architecture we support or plan to."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig

    from vllm_replayssm.config_checks import PLANNED_ARCHS, SUPPORTED_ARCHS, config_hook

    for arch in (*SUPPORTED_ARCHS, *PLANNED_ARCHS):
        base = MODELS_CONFIG_MAP.get(arch, VerifyAndUpdateConfig)
        if not hasattr(base, "replay_base"):  # idempotent
            MODELS_CONFIG_MAP[arch] = config_hook(base)


def register_failure_checks(error: BaseException) -> None:
    """After a failed `register()`: every architecture we know refuses replayssm.enabled at
    start-up with `error` in the message (best effort: nothing to do if vLLM's config map
    itself cannot be imported)."""
    try:
        from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig

        from vllm_replayssm.config_checks import (
            PLANNED_ARCHS,
            SUPPORTED_ARCHS,
            failed_plugin_hook,
        )
    except Exception:
        return
    for arch in (*SUPPORTED_ARCHS, *PLANNED_ARCHS):
        base = MODELS_CONFIG_MAP.get(arch, VerifyAndUpdateConfig)
        while hasattr(base, "replay_base"):  # unwrap our own hooks
            base = base.replay_base
        MODELS_CONFIG_MAP[arch] = failed_plugin_hook(base, error)
