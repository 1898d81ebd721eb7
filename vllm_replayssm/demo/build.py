"""Build or check the embedded demo models (`python -m vllm_replayssm.demo.build`, or
scripts/build_demo_model.py).

Without --check: train each demo from scratch (vllm_replayssm/demo/train.py: fixed seed, CPU,
one thread each) and write it into the package. With --check, verify what is shipped without
retraining: config.json, generation_config.json and the tokenizer files are what the current
code writes byte for byte; model.safetensors has the SHA-256 that training.json records; and
the shipped weights give the recorded validation loss on the held-out corpus documents.
`--check --retrain` also retrains into a temporary directory and compares the final
validation loss (and reports whether the weights came out byte-identical, which needs the
same CPU, thread count and library versions).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from vllm_replayssm.demo import DEMO_DIR, DEMOS
from vllm_replayssm.demo.train import FILES, MAX_POSITIONS, Recipe, model_config, train_demo

VAL_LOSS_TOL = 2e-3  # the recorded loss is rounded to 1e-4; summation order may differ
RETRAIN_LOSS_TOL = 0.05  # another machine's rounding takes another training trajectory
REBUILT = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def digests(directory: Path, files: tuple[str, ...] = FILES) -> dict[str, str]:
    return {f: hashlib.sha256((Path(directory) / f).read_bytes()).hexdigest() for f in files}


@functools.cache
def _tokenizer() -> Any:
    from vllm_replayssm.demo import corpus
    from vllm_replayssm.demo.tokenizer import train_tokenizer
    from vllm_replayssm.demo.train import VOCAB_SIZE

    return train_tokenizer(VOCAB_SIZE, corpus.split()[0])


def write_untrained_files(kind: str, out_dir: Path) -> Path:
    """config.json, generation_config.json and the tokenizer files of demo `kind` as training
    writes them (the weights of an untrained model are written too, and not compared)."""
    import torch
    from transformers import AutoModelForCausalLM

    from vllm_replayssm.demo.tokenizer import save_tokenizer

    model = AutoModelForCausalLM.from_config(model_config(kind), dtype=torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(_tokenizer(), Path(out_dir), MAX_POSITIONS)
    return Path(out_dir)


def shipped_val_loss(directory: Path) -> float:
    """Validation loss of the shipped weights, measured as training.json's was."""
    import torch
    from transformers import AutoModelForCausalLM

    from vllm_replayssm.demo import corpus
    from vllm_replayssm.demo.train import encode, loss_on

    record = json.loads((Path(directory) / "training.json").read_text())
    recipe = Recipe(**{**record["recipe"], "betas": tuple(record["recipe"]["betas"])})
    torch.set_num_threads(recipe.threads)
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    return loss_on(model, encode(_tokenizer(), corpus.split()[1]), recipe)


def check_demo(kind: str, directory: Path, *, retrain: bool = False) -> list[str]:
    """What differs between the shipped demo `kind` in `directory` and what it should be;
    empty when everything checks out."""
    directory = Path(directory)
    record = json.loads((directory / "training.json").read_text())
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        fresh = digests(write_untrained_files(kind, Path(tmp)), REBUILT)
    shipped = digests(directory, REBUILT)
    problems += [f"{f} differs from a rebuild" for f in REBUILT if fresh[f] != shipped[f]]
    if digests(directory, ("model.safetensors",))["model.safetensors"] != record["model_sha256"]:
        problems.append("model.safetensors is not the file training.json records")
    loss = shipped_val_loss(directory)
    if abs(loss - record["val_loss_bf16_weights"]) > VAL_LOSS_TOL:
        problems.append(f"validation loss {loss:.4f}, recorded {record['val_loss_bf16_weights']}")
    if retrain:
        recipe = Recipe(**{**record["recipe"], "betas": tuple(record["recipe"]["betas"])})
        with tempfile.TemporaryDirectory() as tmp:
            again = train_demo(kind, Path(tmp), recipe)
        delta = again["val_loss_bf16_weights"] - record["val_loss_bf16_weights"]
        same = again["model_sha256"] == record["model_sha256"]
        print(f"{kind}: retrained, validation loss {delta:+.4f}, weights identical: {same}")
        if abs(delta) > RETRAIN_LOSS_TOL:
            problems.append(f"retrained validation loss differs by {delta:+.4f}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEMO_DIR,
        help="parent directory of the demo folders (default: the package's)",
    )
    parser.add_argument(
        "--check", action="store_true", help="verify the demos in --out without retraining"
    )
    parser.add_argument(
        "--retrain", action="store_true", help="with --check: also retrain and compare"
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
            out = train_demo(kind, args.out / kind, log=lambda s: print(s, flush=True))
            print(
                f"{kind}: wrote {args.out / kind} (validation loss {out['val_loss_bf16_weights']})"
            )
            continue
        problems = check_demo(kind, args.out / kind, retrain=args.retrain)
        print(f"{kind}: " + ("; ".join(problems) if problems else "shipped files check out"))
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
