"""Where one decode step's GPU time goes: a kernel-level breakdown of the e2e benchmark's
models (benchmarks/e2e/bench_decode_e2e.py geometries, dummy weights), ReplaySSM off vs on.

Per mode, one engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so that
`torch.profiler` sees the model runner's CUDA kernels), eager (CUDA graphs would hide the
kernels inside a graph replay), bs prompts of --input-len random ids. Two profiled greedy
generates with the same prompts: A with max_tokens=1 (prefill), B with max_tokens=1+S.
Per kernel name, (CUDA time in B - CUDA time in A) / S is its time per decode step; the
table lists the top kernels and the sum of all, for off and on side by side, plus the wall
time per decode step of the eager run (which includes launch overhead that the CUDA-graph
benchmark does not pay). Modes as the e2e benchmark's: off_spec / on_spec add
--speculative (default ngram k = 3); their B run generates S new tokens in fewer verify
steps, so their figures are per new token. JSON to --json (default
benchmarks/results/profile-<gpu>-<date>-<commit>.json).

    source .gpu/activate.sh && python benchmarks/e2e/profile_decode.py --model nemotron_h \
        --batch-size 256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import common
from benchmarks.e2e import bench_decode_e2e as e2e


def kernel_times(prof: Any) -> dict[str, float]:
    """CUDA (device) time per kernel name in µs, from a finished torch.profiler run."""
    out: dict[str, float] = {}
    for evt in prof.key_averages():
        us = getattr(evt, "device_time_total", None)
        if us is None:
            us = getattr(evt, "cuda_time_total", 0.0)
        # only CUDA activity is recorded: every event is a kernel, memcpy or memset
        if us and evt.key:
            out[evt.key] = out.get(evt.key, 0.0) + us
    return out


def profile_mode(
    model: str, mode: str, model_dir: Path, args: argparse.Namespace, vocab: int
) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams

    kwargs = e2e.tool_engine_kwargs(
        args,
        model,
        mode,
        model_dir,
        args.max_model_len,
        torch.cuda.is_available(),
        enforce_eager=True,
    )
    e2e.log(f"engine start {json.dumps(kwargs['additional_config'])}", f"{model}/{mode}")
    llm = LLM(**kwargs)
    prompts = [
        {"prompt_token_ids": p}
        for p in e2e.make_prompts(args.batch_size, args.input_len, vocab, args.seed)
    ]
    warm = [
        {"prompt_token_ids": p}
        for p in e2e.make_prompts(args.batch_size, args.input_len, vocab, args.seed + 1)
    ]
    greedy = dict(temperature=0.0, ignore_eos=True)
    llm.generate(warm, SamplingParams(max_tokens=8, **greedy), use_tqdm=False)
    runs = {}
    for name, max_tokens in (("A", 1), ("B", 1 + args.steps)):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            llm.generate(prompts, SamplingParams(max_tokens=max_tokens, **greedy), use_tqdm=False)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        runs[name] = {"wall_s": wall, "kernels": kernel_times(prof)}
    names = set(runs["A"]["kernels"]) | set(runs["B"]["kernels"])
    per_step = {
        k: (runs["B"]["kernels"].get(k, 0.0) - runs["A"]["kernels"].get(k, 0.0)) / args.steps
        for k in names
    }
    del llm
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    return {
        "mode": mode,
        "kwargs": kwargs,
        "wall_per_step_us": (runs["B"]["wall_s"] - runs["A"]["wall_s"]) / args.steps * 1e6,
        "gpu_per_step_us": sum(v for v in per_step.values() if v > 0),
        "kernels_per_step_us": dict(sorted(per_step.items(), key=lambda kv: -kv[1])),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=e2e.MODELS, default="nemotron_h")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=32, help="profiled decode steps")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--modes", default="off,on", help=f"comma list of {', '.join(e2e.MODES)}")
    e2e.add_engine_json_args(p)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    bad = [m for m in args.modes.split(",") if m not in e2e.MODES]
    if bad:
        p.error(f"--modes: unknown {bad}; known: {', '.join(e2e.MODES)}")
    if args.max_model_len is None:
        args.max_model_len = args.input_len + args.steps + 16
    payload: dict[str, Any] = {
        **common.run_header(__file__, common.machine_info()),
        "settings": vars(args),
        "modes": [],
    }
    with tempfile.TemporaryDirectory(prefix="replayssm-prof-") as tmp:
        model_dir, config = e2e.write_model_dir(
            args.model, Path(tmp), tiny=False, layers=args.layers, max_model_len=args.max_model_len
        )
        payload["model_config"] = config
        modes = args.modes.split(",")
        if len(modes) == 1:
            payload["modes"].append(
                profile_mode(args.model, modes[0], model_dir, args, config["vocab_size"])
            )
        else:  # one child process per mode: an in-process engine keeps its GPU memory
            for mode in modes:
                part = Path(tmp) / f"{mode}.json"
                argv_child = [a for a in (argv if argv is not None else sys.argv[1:])]
                cmd = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    *argv_child,
                    "--modes",
                    mode,
                    "--json",
                    str(part),
                ]
                done = subprocess.run(cmd, check=False)
                if done.returncode != 0 or not part.is_file():
                    print(f"# FAILED {args.model}/{mode}: child exited {done.returncode}")
                    return 1
                payload["modes"].extend(json.loads(part.read_text())["modes"])
    modes = payload["modes"]
    top = sorted(
        {k for m in modes for k in list(m["kernels_per_step_us"])[: args.top]},
        key=lambda k: -max(m["kernels_per_step_us"].get(k, 0.0) for m in modes),
    )
    rows = [[k[:90], *[round(m["kernels_per_step_us"].get(k, 0.0), 1) for m in modes]] for k in top]
    rows.append(
        ["ALL KERNELS (sum, per decode step)", *[round(m["gpu_per_step_us"], 1) for m in modes]]
    )
    rows.append(["wall per decode step, eager", *[round(m["wall_per_step_us"], 1) for m in modes]])
    print(
        f"# {args.model} bs {args.batch_size} in {args.input_len} steps {args.steps} | "
        f"{(payload['machine'].get('gpu') or {}).get('name', 'no GPU')} | "
        f"commit {payload['commit'][:12]}"
    )
    print(common.format_table(["kernel (µs per decode step)", *[m["mode"] for m in modes]], rows))
    if any(e2e.is_spec(m["mode"]) for m in modes):
        print("# *_spec columns: per new token (a verify step emits up to 1 + k of them)")
    path = (
        Path(args.json)
        if args.json
        else common.default_json_path(
            f"profile-{args.model}-bs{args.batch_size}", payload["machine"]
        )
    )
    common.write_json(path, payload)
    print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
