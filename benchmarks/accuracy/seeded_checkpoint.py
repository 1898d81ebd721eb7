"""A seeded random-weight checkpoint at a real SSM geometry, for the accuracy study on a GPU
(issue 17: the model-level KL of the two precisions at real state sizes and vocabularies).

The geometry is the e2e benchmark's (`benchmarks/e2e/bench_decode_e2e.py`: Nemotron-3 Super's
Mamba-2 layers, Qwen3.5-4B's GDN layers, their vocabularies), at --layers depth. Weights:
transformers' own initialisation under `torch.manual_seed(seed)` with the weights' standard
deviation --init-gain / sqrt(hidden size) (the models' default, 0.02, gives a nearly flat
next-token distribution: on the tiny geometry the mean top probability is 0.003-0.004 of a
512-token vocabulary; std 0.3 gives 0.2-0.3, the peaked distributions a KL can tell apart;
the default gain 3 at the real NemotronH geometry, 4 layers, gave top probabilities
0.02-0.29 and entropies of 5.0-6.9 nats where a uniform 32,000-token distribution has 10.4),
then every layer's (A_log, dt_bias) redrawn as Mamba-2 initialises them
(`vllm_replayssm.demo.train.init_ssm_params`: A ~ U[1, 16], dt log-uniform in [1e-3, 1e-1]),
saved in bfloat16 with a `seeded_checkpoint.json` of the settings and the weights' sha256.
No tokenizer: the study then prompts with seeded token ids.

    python benchmarks/accuracy/seeded_checkpoint.py --model nemotron_h --layers 8 \
        --out /tmp/seeded-nemotron_h
    python benchmarks/accuracy/study.py --families nemotron_h --model /tmp/seeded-nemotron_h \
        --kl-in-engine --workdir /tmp/kl --prompts 4 --new-tokens 2048

Same arguments, same library versions: byte-identical weights (the JSON's sha256 says so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

MANIFEST = "seeded_checkpoint.json"
WEIGHTS = "model.safetensors"


def build(
    kind: str,
    out_dir: Path,
    *,
    layers: int,
    seed: int = 0,
    init_gain: float = 3.0,
    tiny: bool = False,
    max_model_len: int = 4096,
) -> dict:
    """Write the checkpoint into out_dir; return its manifest (also written there)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from benchmarks.e2e.bench_decode_e2e import model_config
    from vllm_replayssm.demo.train import init_ssm_params

    config = model_config(kind, tiny=tiny, layers=layers, max_model_len=max_model_len)
    config.initializer_range = init_gain / config.hidden_size**0.5
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    ssm_layers = init_ssm_params(model, seed)
    if ssm_layers == 0:
        raise RuntimeError(f"{kind}: no (A_log, dt_bias) parameters found")
    model = model.to(torch.bfloat16).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    weights = out_dir / WEIGHTS
    if not weights.is_file():
        raise RuntimeError(f"expected one {WEIGHTS} in {out_dir} (sharded save?)")
    digest = hashlib.sha256()
    with weights.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            digest.update(chunk)
    manifest = {
        "script": "benchmarks/accuracy/seeded_checkpoint.py",
        "model": kind,
        "architecture": config.architectures[0],
        "layers": layers,
        "ssm_layers": ssm_layers,
        "tiny": tiny,
        "seed": seed,
        "init_gain": init_gain,
        "initializer_range": config.initializer_range,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights_sha256": digest.hexdigest(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "build_s": round(time.perf_counter() - t0, 1),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=("nemotron_h", "qwen3_next"))
    p.add_argument("--out", required=True, type=Path, help="checkpoint directory (created)")
    p.add_argument("--layers", type=int, default=8, help="depth (the e2e layer pattern)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--init-gain",
        type=float,
        default=3.0,
        help="weights' standard deviation times sqrt(hidden size)",
    )
    p.add_argument("--tiny", action="store_true", help="the e2e benchmark's CPU geometry")
    p.add_argument("--max-model-len", type=int, default=4096)
    args = p.parse_args(argv)
    if args.layers < 1 or args.init_gain <= 0:
        p.error("--layers >= 1 and --init-gain > 0")
    if args.out.exists() and any(args.out.iterdir()):
        p.error(f"--out {args.out} is not empty")
    print(f"building {args.model} ({args.layers} layers, seed {args.seed}) in {args.out} ...")
    manifest = build(
        args.model,
        args.out,
        layers=args.layers,
        seed=args.seed,
        init_gain=args.init_gain,
        tiny=args.tiny,
        max_model_len=args.max_model_len,
    )
    print(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
