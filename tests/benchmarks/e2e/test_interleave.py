"""benchmarks/e2e/interleave.py (`bench_decode_e2e.py --interleave`): children start one
after another, each once the previous one's engine is up; their turns never overlap and
alternate in order every repeat; a child that fails a batch size, never comes up, or hangs
in a turn leaves the others' turns intact and no process behind."""

from __future__ import annotations

import io
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.e2e import bench_decode_e2e as bench
from benchmarks.e2e import interleave
from vllm_replayssm.server_process import end_group

REPO = Path(__file__).resolve().parents[3]

# A child that follows the protocol as run_worker does: ready, then per batch size a
# warm-up turn and `repeats` timed turns (each logging its start and end), catching up
# after a size that failed, then its engine kept until stdin closes. argv: log file, batch
# sizes, repeats, behaviour ("ok", "fail:<bs>" raises in that size's first timed turn,
# "exit" never comes up, "hang:<bs>" sleeps in that size's first timed turn).
CHILD = f"""
import json, sys, time
sys.path.insert(0, {str(REPO)!r})
from benchmarks.e2e.interleave import Turns
log, sizes, repeats, how = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if how == "exit":
    sys.exit(2)
turns = Turns()
print("vLLM log line", flush=True)
time.sleep(0.2)
with open(log, "a") as f:
    f.write(json.dumps(["up", time.monotonic()]) + "\\n")
turns.say("ready")

def phase(bs, what):
    t0 = time.monotonic()
    if how == f"fail:{{bs}}" and what == 0:
        raise RuntimeError("this size fails")
    if how == f"hang:{{bs}}" and what == 0:
        time.sleep(300)
    time.sleep(0.05)
    with open(log, "a") as f:
        f.write(json.dumps([bs, what, t0, time.monotonic()]) + "\\n")

for i, bs in enumerate(sizes):
    try:
        with turns.turn():
            phase(bs, "warm-up")
        for r in range(repeats):
            with turns.turn():
                phase(bs, r)
    except RuntimeError:
        pass
    turns.catch_up((i + 1) * (1 + repeats))
sys.stdin.read()
"""


def _start(tmp_path: Path, hows: list[str], sizes=(1, 4), repeats=3, timeout=60.0):
    lines: list[tuple[str, str]] = []
    logs = [tmp_path / f"child{i}.log" for i in range(len(hows))]
    commands = [
        (how, [sys.executable, "-c", CHILD, str(log), json.dumps(list(sizes)), str(repeats), how])
        for log, how in zip(logs, hows, strict=True)
    ]
    children = interleave.start_children(
        commands, lambda name, line: lines.append((name, line)), timeout, end_group, print
    )
    return children, logs, lines


def _phases(log: Path) -> list[list]:
    if not log.exists():
        return []
    return [json.loads(x) for x in log.read_text().splitlines()]


def test_turns_alternate_and_never_overlap(tmp_path):
    children, logs, lines = _start(tmp_path, ["ok", "ok"])
    order = interleave.run_turns(children, [1, 4], 3)
    assert [c.stop() for c in children] == [0, 0]
    # per size: warm-ups in order, then the repeats A B, B A, A B
    per_size = ["warm-up/0", "warm-up/1", "0/0", "0/1", "1/1", "1/0", "2/0", "2/1"]
    assert order == [f"{bs}/{x}" for bs in (1, 4) for x in per_size]
    a, b = (_phases(log) for log in logs)
    assert a[0][0] == b[0][0] == "up" and a[0][1] < b[0][1]  # B started after A was up
    spans = sorted([p[2], p[3]] for p in a[1:] + b[1:])
    assert len(spans) == 16
    assert all(end <= nxt_start for (_, end), (nxt_start, _) in itertools.pairwise(spans))
    # the children's other output reached on_line; the protocol's lines did not
    assert sorted(line for _, line in lines) == ["vLLM log line\n"] * 2


def test_a_failed_size_keeps_every_child_in_step(tmp_path):
    children, logs, _ = _start(tmp_path, ["fail:1", "ok"])
    order = interleave.run_turns(children, [1, 4], 3)
    assert [c.stop() for c in children] == [0, 0]
    assert len(order) == 16  # the failed child answered its remaining turns of size 1
    a, b = (_phases(log) for log in logs)
    assert [p[:2] for p in a[1:]] == [[1, "warm-up"]] + [[4, x] for x in ("warm-up", 0, 1, 2)]
    assert len(b) == 1 + 8


def test_a_child_that_never_comes_up_is_skipped(tmp_path):
    children, _, _ = _start(tmp_path, ["exit", "ok"], sizes=[1], repeats=2)
    assert not children[0].alive
    order = interleave.run_turns(children, [1], 2)
    assert order == ["1/warm-up/1", "1/0/1", "1/1/1"]
    assert [c.stop() for c in children] == [2, 0]


def test_a_child_that_hangs_in_a_turn_is_killed_and_the_others_go_on(tmp_path):
    children, logs, _ = _start(tmp_path, ["hang:1", "ok"], repeats=2, timeout=3.0)
    t0 = time.monotonic()
    order = interleave.run_turns(children, [1, 4], 2)
    assert time.monotonic() - t0 < 60
    assert [c.stop() for c in children] == ["timeout", 0]
    assert order[0] == "1/warm-up/0" and all(not x.endswith("/0") for x in order[1:])
    assert len(_phases(logs[1])) == 1 + 2 * 3
    pid = children[0].proc.pid
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_turns_say_done_also_when_the_phase_fails():
    out = io.StringIO()
    turns = interleave.Turns(io.StringIO("go\ngo\n"), out)
    with pytest.raises(ValueError), turns.turn():
        raise ValueError
    with turns.turn():
        pass
    assert out.getvalue().splitlines() == [f"{interleave.MARK} done"] * 2
    with pytest.raises(interleave.DriverGoneError), turns.turn():
        pass
    with (
        pytest.raises(RuntimeError, match="unexpected"),
        interleave.Turns(io.StringIO("stop\n"), out).turn(),
    ):
        pass


def test_measure_batch_times_each_phase_in_its_turn():
    """measure_batch waits for a turn before the warm-up and before each repeat, and the
    interleaved run counts preemptions over the timed generates."""
    read_fd, write_fd = os.pipe()
    driver, out = os.fdopen(write_fd, "w"), io.StringIO()
    turns = interleave.Turns(os.fdopen(read_fd), out)
    spec = {
        "model": "nemotron_h",
        "mode": "on",
        "vocab_size": 1000,
        "input_len": 8,
        "output_len": 4,
        "warmup_tokens": 4,
        "seed": 0,
        "repeats": 2,
        "shared_prefix_len": 0,
        "replay": {"route": "replay"},
        "interleave": True,
    }
    llm = _RecordingLLMWithCounter()
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(row=bench.measure_batch(llm, 3, spec, "t", turns))
    )
    worker.start()
    for n_calls in (1, 3, 5):  # warm-up; prefill + full per repeat
        time.sleep(0.2)
        assert len(llm.calls) == n_calls - (1 if n_calls == 1 else 2)
        driver.write("go\n")
        driver.flush()
        deadline = time.monotonic() + 10
        while len(llm.calls) < n_calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(llm.calls) == n_calls
    worker.join(timeout=10)
    assert turns.taken == 3
    assert result["row"]["preemptions"] == 2.0  # one per full generate
    # the host's Python speed before each repeat, for the record
    assert len(result["row"]["python_probe_ms_per_repeat"]) == 2
    driver.close()


class _RecordingLLMWithCounter:
    """`llm.generate` and `llm.get_metrics` as measure_batch calls them: each generate of
    more than one token counts one preemption."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.preempted = 0

    def generate(self, batch, params, use_tqdm=False):
        from types import SimpleNamespace

        self.calls.append(params.max_tokens)
        self.preempted += params.max_tokens > 1
        ids = [[b["prompt_token_ids"][-1]] * params.max_tokens for b in batch]
        return [
            SimpleNamespace(num_cached_tokens=0, outputs=[SimpleNamespace(token_ids=t)])
            for t in ids
        ]

    def get_metrics(self):
        from types import SimpleNamespace

        return [SimpleNamespace(name=bench.PREEMPTIONS, value=float(self.preempted))]


def test_interleaved_pairs_get_a_speed_up_per_repeat():
    def run(mode, full, pre, interleaved=True):
        row = {
            "bs": 2,
            "decode_tok_s": 1.0,
            "output_tok_s": 1.0,
            "tokens_sha256": "x",
            "t_full_all_s": full,
            "t_prefill_all_s": pre,
        }
        extra = {"interleaved": {"modes": ["off", "on"]}} if interleaved else {}
        return {"model": "m", "mode": mode, "results": [row], **extra}

    tokens = {("m", "off", 2): [[1], [2]], ("m", "on", 2): [[1], [2]]}
    runs = [run("off", [5.0, 7.0], [1.0, 1.0]), run("on", [3.0, 4.0], [1.0, 1.0])]
    (c,) = bench.compare(runs, tokens, 1)
    assert c["decode_speedup_per_repeat"] == [2.0, 2.0]
    runs = [run("off", [5.0, 7.0], [1.0, 1.0]), run("on", [3.0, 0.9], [1.0, 1.0])]
    assert bench.compare(runs, tokens, 1)[0]["decode_speedup_per_repeat"] == [2.0, None]
    runs = [run("off", [5.0], [1.0], False), run("on", [3.0], [1.0], False)]
    assert "decode_speedup_per_repeat" not in bench.compare(runs, tokens, 1)[0]
    # the decode inside the full generates, where the rows carry it
    runs = [run("off", [5.0, 7.0], [1.0, 1.0]), run("on", [3.0, 4.0], [1.0, 1.0])]
    runs[0]["results"][0].update(decode_tok_s_in_full=2.0, t_decode_in_full_all_s=[4.0, 6.0])
    runs[1]["results"][0].update(decode_tok_s_in_full=3.0, t_decode_in_full_all_s=[2.0, 4.0])
    (c,) = bench.compare(runs, tokens, 1)
    assert c["decode_speedup_in_full"] == 1.5
    assert c["decode_speedup_in_full_per_repeat"] == [2.0, 1.5]


def test_memory_shares_per_mode():
    """--gpu-memory-utilization: one share for every mode, or one per mode (engines up at
    once must not ask for more than the GPU); each worker spec gets its mode's share."""
    assert bench.memory_shares("0.85", ["off", "on"]) == [0.85, 0.85]
    assert bench.memory_shares("0.3,0.55", ["off_pc", "on_pc"]) == [0.3, 0.55]
    for bad in ("0.3,0.3,0.3", "0.6,0.6", "0,0.5", "x"):
        with pytest.raises(ValueError, match="gpu-memory-utilization"):
            bench.memory_shares(bad, ["off_pc", "on_pc"])
    args = bench.parse_args(
        ["--modes", "off_pc,on_pc", "--interleave", "--gpu-memory-utilization", "0.3,0.55"]
    )
    specs = [bench.mode_spec({"model": "m"}, args, m) for m in args.modes]
    assert [(s["mode"], s["gpu_memory_utilization"]) for s in specs] == [
        ("off_pc", 0.3),
        ("on_pc", 0.55),
    ]
    assert (
        bench.engine_kwargs(
            {
                **specs[1],
                "model_dir": "d",
                "max_model_len": 8,
                "max_num_seqs": 1,
                "enforce_eager": True,
                "replay": {},
            },
            True,
        )["gpu_memory_utilization"]
        == 0.55
    )
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "off,on", "--gpu-memory-utilization", "0.5,0.2,0.1"])


def test_devices_per_mode():
    """--devices: one CUDA device set for every mode or one per mode ('+' joins one engine's
    devices); the memory shares then only sum per GPU; each worker spec carries its set and
    its worker's environment sets CUDA_VISIBLE_DEVICES to it."""
    modes = ["off_spec", "on_spec"]
    assert bench.device_sets(None, modes) is None
    assert bench.device_sets("0,1", modes) == ["0", "1"]
    assert bench.device_sets("2+3", modes) == ["2,3", "2,3"]
    for bad in ("0,1,2", "a", "0,,1", "0+"):
        with pytest.raises(ValueError, match="--devices"):
            bench.device_sets(bad, modes)
    # two engines of 0.9 fit on two GPUs, not on one, nor where their device sets meet
    assert bench.memory_shares("0.9,0.9", modes, ["0", "1"]) == [0.9, 0.9]
    for devices in (None, ["0", "0"], ["0,1", "1"]):
        with pytest.raises(ValueError, match="sum past 1"):
            bench.memory_shares("0.9,0.9", modes, devices)
    run = ["--modes", "off_spec,on_spec", "--interleave", "--devices", "0,1"]
    args = bench.parse_args([*run, "--gpu-memory-utilization", "0.9,0.9"])
    specs = [bench.mode_spec({"model": "m"}, args, m) for m in args.modes]
    assert [s["cuda_visible_devices"] for s in specs] == ["0", "1"]
    env = bench.worker_env(specs[1]["cuda_visible_devices"])
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["PATH"] == os.environ["PATH"]
    assert bench.worker_env(None) is None
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "off,on", "--devices", "0,1,2"])


def test_each_child_starts_in_its_own_environment(tmp_path):
    """start_children: envs[name] is that child's environment (here: the CUDA devices a
    worker would see); a child without an entry inherits the driver's."""
    show = (
        f"import os, sys; sys.path.insert(0, {str(REPO)!r});"
        "from benchmarks.e2e.interleave import Turns;"
        "print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'), flush=True);"
        "Turns().say('ready'); sys.stdin.read()"
    )
    lines: list[tuple[str, str]] = []
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    children = interleave.start_children(
        [(name, [sys.executable, "-c", show]) for name in ("a", "b", "c")],
        lambda name, line: lines.append((name, line)),
        60.0,
        end_group,
        print,
        {"a": {**env, "CUDA_VISIBLE_DEVICES": "0"}, "b": {**env, "CUDA_VISIBLE_DEVICES": "1,2"}},
    )
    assert [c.stop() for c in children] == [0, 0, 0]
    seen = dict((name, line.strip()) for name, line in lines)
    assert seen["a"] == "0" and seen["b"] == "1,2"
    assert seen["c"] == os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
