"""Embedded demo models: tiny trained hybrids shipped with the package, so `vllm-replayssm
serve` runs on a machine with no network and no model download.

- `nemotron_h`: NemotronHForCausalLM (Mamba-2 + attention + MLP layers), the default;
- `qwen3_next`: Qwen3NextForCausalLM (Gated DeltaNet + attention, MoE).

Both are trained from scratch on CPU on the prose of the Python standard library (its
docstrings and the language reference topics; `demo/corpus.py`, `demo/train.py`): they write
documentation-like English, recognisable words and phrases at a 0.2-0.3M-parameter model's
level, not answers. `python -m vllm_replayssm.demo.build` retrains them, `--check` verifies the
shipped files.
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
