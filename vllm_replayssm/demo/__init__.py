"""Embedded demo models: tiny seeded hybrids shipped with the package, so `vllm-replayssm
serve` runs on a machine with no network and no model download.

- `nemotron_h`: NemotronHForCausalLM (Mamba-2 + attention + MLP layers), the default;
- `qwen3_next`: Qwen3NextForCausalLM (Gated DeltaNet + attention, MoE).

The weights are random (seeded, realistic scale): the text they produce is random words. They
exist to exercise the whole serving path, not to answer questions. `demo/build.py` rebuilds
them byte for byte.
"""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
DEMOS = ("nemotron_h", "qwen3_next")
DEFAULT_DEMO = "nemotron_h"


def demo_path(kind: str = DEFAULT_DEMO) -> Path:
    """The shipped checkpoint directory of demo `kind`; raise if it is not installed."""
    if kind not in DEMOS:
        raise ValueError(f"unknown demo model {kind!r}; choose one of {list(DEMOS)}")
    path = DEMO_DIR / kind
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"demo model {kind!r} is missing from {path}: reinstall vllm-replayssm or run "
            "`python -m vllm_replayssm.demo.build`"
        )
    return path


def served_name(kind: str = DEFAULT_DEMO) -> str:
    """The model name the demo is served under (`/v1/models`)."""
    return f"replayssm-demo-{kind.replace('_', '-')}"
