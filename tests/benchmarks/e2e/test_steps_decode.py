"""benchmarks/e2e/steps_decode.py: what the step recorder keeps of an engine step and how it
groups steps by phase and CUDA-graph mode (the hooks themselves need an engine: the tool's
own CPU run, `--tiny`)."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.e2e.bench_decode_e2e import TINY_MIN_MODEL_LEN
from benchmarks.e2e.steps_decode import (
    StepRecorder,
    dispatch_recorded,
    max_model_len,
    parse_args,
    write_outputs,
)


def _scheduled(tokens_per_row: list[int], drafts: list[int]):
    return SimpleNamespace(
        total_num_scheduled_tokens=sum(tokens_per_row),
        num_scheduled_tokens={f"r{i}": n for i, n in enumerate(tokens_per_row)},
        scheduled_spec_decode_tokens={f"r{i}": [0] * d for i, d in enumerate(drafts) if d},
    )


def test_steps_are_grouped_by_phase_and_cudagraph_mode():
    rec = StepRecorder()
    rec.phase = "full0"
    for wall, mode, drafts in (
        (0.030, "FULL", [3, 3]),
        (0.034, "FULL", [3, 3]),
        (0.2, "NONE", [1, 3]),
    ):
        rec._cg, rec._host = (mode, 8), {"_prepare_inputs": 0.001}
        rec.record(_scheduled([1 + d for d in drafts], drafts), wall)
    rec.record(_scheduled([], []), 1.0)  # nothing scheduled: not a step
    rec.phase = "first0"
    rec._cg, rec._host = None, {}
    rec.record(_scheduled([128, 128], [0, 0]), 0.3)
    assert [s["drafts"] for s in rec.steps[:3]] == [{"3": 2}, {"3": 2}, {"1": 1, "3": 1}]
    summary = rec.summary()
    assert list(summary) == ["full0", "first0"]
    full = summary["full0"]
    assert full["steps"] == 3 and full["wall_ms_sum"] == pytest.approx(264.0)
    graphs = full["by_cudagraph_mode"]["FULL"]
    assert graphs["steps"] == 2 and graphs["wall_ms_median"] == pytest.approx(32.0)
    assert graphs["host_ms_median"] == {"_prepare_inputs": pytest.approx(1.0)}
    assert full["by_cudagraph_mode"]["NONE"]["steps"] == 1
    assert summary["first0"]["by_cudagraph_mode"]["None"]["steps"] == 1


def test_a_step_keeps_what_the_dispatcher_was_asked():
    """Why a step ran PIECEWISE: the runner's uniform-decode flag and whether it ruled FULL
    graphs out, next to the mode the dispatcher chose."""
    rec = StepRecorder()
    rec.phase = "full0"
    full, piecewise = SimpleNamespace(name="FULL"), SimpleNamespace(name="PIECEWISE")

    def dispatch(self, num_tokens, uniform_decode=False, invalid_modes=None, **_):
        ruled_out = invalid_modes and any(m is full for m in invalid_modes)
        return (piecewise if ruled_out else full), SimpleNamespace(num_tokens=8)

    hook = dispatch_recorded(rec, dispatch)
    hook(None, num_tokens=4, uniform_decode=True, invalid_modes=[full])
    rec.record(_scheduled([4], [3]), 0.01)
    hook(None, num_tokens=4, uniform_decode=True, invalid_modes=None)
    rec.record(_scheduled([4], [3]), 0.01)
    first, second = rec.steps
    assert first["cudagraph"] == "PIECEWISE" and second["cudagraph"] == "FULL"
    assert first["dispatch"] == {
        "uniform_decode": True,
        "full_ruled_out": True,
        "padded_tokens": 8,
    }
    assert second["dispatch"]["full_ruled_out"] is False
    rec._cg = ("FULL", 2)  # not hooked (the tests above): nothing known
    rec.record(_scheduled([1], [0]), 0.01)
    assert rec.steps[-1]["dispatch"] is None


def test_the_period_runs_from_the_previous_step_of_the_same_phase():
    # Under asynchronous scheduling a step call returns before its batch has run: the time
    # between launches is the step time, not the call's wall time.
    rec = StepRecorder()
    rec.phase = "first0"
    rec.record(_scheduled([8, 8], [0, 0]), 0.5, start_s=10.0)
    rec.phase = "full0"
    rec._cg = ("FULL", 2)
    for start in (11.0, 11.007, 11.016, 11.023):
        rec.record(_scheduled([1, 1], [0, 0]), 0.002, start_s=start)
    periods = [s["period_ms"] for s in rec.steps]
    assert periods[:2] == [None, None]  # a phase's first step has no predecessor in it
    assert periods[2:] == [pytest.approx(7.0), pytest.approx(9.0), pytest.approx(7.0)]
    full = rec.summary()["full0"]["by_cudagraph_mode"]["FULL"]
    assert full["period_ms_median"] == pytest.approx(7.0)
    assert full["wall_ms_median"] == pytest.approx(2.0)
    assert rec.summary()["first0"]["by_cudagraph_mode"]["None"]["period_ms_median"] is None


def test_gpu_times_are_filled_in_after_the_generate(monkeypatch):
    class Event:  # a CUDA event pair's stand-in: elapsed_time in ms
        def __init__(self, t):
            self.t = t

        def elapsed_time(self, end):
            return end.t - self.t

    rec = StepRecorder()
    rec.phase = "full0"
    rec._phase_events = [
        ("_model_forward", Event(0.0), Event(3.0)),
        ("_model_forward", Event(5.0), Event(6.5)),
        ("_sample", Event(7.0), Event(7.5)),
        ("_sample", Event(8.0), Event(8.25)),
    ]
    rec.record(_scheduled([1], [0]), 0.01, start_s=1.0)
    rec._phase_events = [("propose_draft_token_ids", Event(9.0), Event(11.0))]
    rec.record(_scheduled([1], [0]), 0.01, start_s=1.01)
    rec._phase_events = []
    rec.record(_scheduled([1], [0]), 0.01, start_s=1.02)
    assert [s["forward_gpu_ms"] for s in rec.steps] == [None, None, None]
    assert all(s["phase_gpu_ms"] == {} for s in rec.steps)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # nothing runs here
    rec.resolve_gpu_times()
    assert [s["forward_gpu_ms"] for s in rec.steps] == [pytest.approx(4.5), None, None]
    # phase spans add up per phase within a step
    assert [s["phase_gpu_ms"] for s in rec.steps] == [
        {"_sample": pytest.approx(0.75)},
        {"propose_draft_token_ids": pytest.approx(2.0)},
        {},
    ]
    rec.resolve_gpu_times()  # nothing pending: a no-op
    assert rec.steps[0]["forward_gpu_ms"] == pytest.approx(4.5)
    graphs = rec.summary()["full0"]["by_cudagraph_mode"]["None"]
    # a step without a phase counts as 0 in that phase's median
    assert graphs["phase_gpu_ms_median"] == {
        "_sample": pytest.approx(0.0),
        "propose_draft_token_ids": pytest.approx(0.0),
    }


def test_arguments_are_checked():
    assert parse_args(["--modes", "on_spec"]).modes == ["on_spec"]
    with pytest.raises(SystemExit):
        parse_args(["--modes", "sideways"])
    with pytest.raises(SystemExit):
        parse_args(["--output-len", "1"])


def test_host_timed_functions_add_to_the_current_step():
    rec = StepRecorder()
    rec.phase = "full0"
    calls = []
    hooked = rec.host_timed(lambda *a, **k: calls.append((a, k)) or "done", "preprocess_mamba")
    assert hooked(1, copy=True) == "done" and calls == [((1,), {"copy": True})]
    hooked()
    rec._cg = ("FULL", 4)
    rec.record(_scheduled([1, 1], [0, 0]), 0.01)
    host = rec.steps[0]["host_ms"]
    assert set(host) == {"preprocess_mamba"} and host["preprocess_mamba"] >= 0.0
    rec._host = {}  # a new step starts empty (EngineCore.step's hook resets it)
    rec.record(_scheduled([1], [0]), 0.01)
    assert rec.steps[1]["host_ms"] == {}


def test_shared_prefix_lengthens_the_model():
    args = parse_args(["--shared-prefix-len", "2048", "--input-len", "64", "--output-len", "256"])
    assert max_model_len(args) == 2048 + 64 + 256 + 16
    # the e2e benchmark's floor for the tiny CPU geometry applies here too
    tiny = parse_args(["--tiny", "--input-len", "16", "--output-len", "8"])
    assert max_model_len(tiny) == TINY_MIN_MODEL_LEN
    with pytest.raises(SystemExit):
        parse_args(["--shared-prefix-len", "-1"])


def test_per_step_records_go_to_a_gzipped_side_file(tmp_path):
    """The JSON keeps the summaries; the per-step records and cProfile texts sit beside it."""
    steps = [{"phase": "full0", "wall_ms": 30.5, "host_ms": {"_sample": 0.1}}]
    payload = {
        "settings": {"batch_size": 2},
        "modes": [
            {"mode": "on", "summary": {"full0": {"steps": 1}}, "steps": steps, "cprofile": "p"},
            {"mode": "off", "summary": {"full0": {"steps": 0}}, "steps": []},
        ],
    }
    path = tmp_path / "steps-x.json"
    write_outputs(path, payload)
    data = json.loads(path.read_text())
    assert data["steps_file"] == "steps-x-steps.json.gz"
    assert all("steps" not in m for m in data["modes"])
    assert data["modes"][0]["summary"] == {"full0": {"steps": 1}}
    assert data["modes"][0]["cprofile_file"] == "steps-x-on-cprofile.txt"
    assert (tmp_path / "steps-x-on-cprofile.txt").read_text() == "p"
    with gzip.open(tmp_path / data["steps_file"]) as f:
        assert json.load(f) == {"on": steps, "off": []}


@pytest.mark.parametrize("interleave", [False, True])
def test_modes_run_one_after_another_or_interleaved(tmp_path, monkeypatch, interleave):
    """Each mode's child gets the run's arguments and its own mode; with --interleave the
    children run through `run_interleaved` (their phases in turns: --turns), and a mode whose
    child failed fails the run."""
    from benchmarks.e2e import steps_decode

    monkeypatch.setattr(
        steps_decode.e2e, "write_model_dir", lambda *a, **k: (tmp_path, {"vocab_size": 512})
    )
    seen: dict[str, list[str]] = {}

    def run_child(cmd):
        at = cmd.index("--mode-json")  # after the run's own arguments: --modes <mode>
        mode, part = cmd[at - 1], Path(cmd[at + 1])
        seen[mode] = cmd
        part.write_text(json.dumps({"mode": mode, "summary": {}}))
        return 0

    def interleaved(args, cmds, envs):
        assert args.interleave and list(cmds) == ["on", "on_pc"]
        assert envs == {"on": None, "on_pc": None}  # no --devices: inherited
        return {mode: run_child(cmd) for mode, cmd in cmds.items()}

    monkeypatch.setattr(steps_decode, "run_interleaved", interleaved)
    real_run = steps_decode.subprocess.run

    def run(cmd, **kw):  # the module's subprocess is everyone's: only the children faked
        if "--mode-json" not in cmd:
            return real_run(cmd, **kw)
        return SimpleNamespace(returncode=run_child(cmd))

    monkeypatch.setattr(steps_decode.subprocess, "run", run)
    argv = ["--tiny", "--modes", "on,on_pc", "--json", str(tmp_path / "steps.json")]
    argv += ["--interleave"] if interleave else []
    assert steps_decode.main(argv) == 0
    assert set(seen) == {"on", "on_pc"}
    assert all(("--turns" in cmd) is interleave for cmd in seen.values())
    data = json.loads((tmp_path / "steps.json").read_text())
    assert [m["mode"] for m in data["modes"]] == ["on", "on_pc"]
    if interleave:
        monkeypatch.setattr(
            steps_decode,
            "run_interleaved",
            lambda args, cmds, envs: {"on": 0, "on_pc": "timeout"},
        )
        assert steps_decode.main(argv) == 1


def test_collections_are_charged_to_the_next_recorded_step(monkeypatch):
    """Garbage collections (gc.callbacks) add their time to the next recorded step's
    host_ms["gc"] with their generations; the summary sums them and counts the full ones."""
    clock = iter([10.0, 10.004, 11.0, 11.05, 12.0, 12.001])
    monkeypatch.setattr("benchmarks.e2e.steps_decode.time.perf_counter", lambda: next(clock))
    rec = StepRecorder()
    rec.phase = "full0"
    rec._cg, rec._host = ("FULL", 2), {}
    rec.record(_scheduled([1, 1], [0, 0]), 0.02)  # no collection: no gc entry
    for gen in (0, 2):
        rec.gc_callback("start", {"generation": gen})
        rec.gc_callback("stop", {"generation": gen})
    rec._host = {}
    rec.record(_scheduled([1, 1], [0, 0]), 0.08)
    rec.gc_callback("start", {"generation": 1})
    rec.gc_callback("stop", {"generation": 1})
    rec._host = {}
    rec.record(_scheduled([1, 1], [0, 0]), 0.02)
    assert "gc" not in rec.steps[0]["host_ms"] and rec.steps[0]["gc_generations"] == []
    assert rec.steps[1]["host_ms"]["gc"] == pytest.approx(54.0)
    assert rec.steps[1]["gc_generations"] == [0, 2]
    assert rec.steps[2]["host_ms"]["gc"] == pytest.approx(1.0)
    full = rec.summary()["full0"]["by_cudagraph_mode"]["FULL"]
    assert full["host_ms_sum"]["gc"] == pytest.approx(55.0)
    assert full["gc_full_collections"] == 1


def test_each_child_gets_its_memory_share():
    args = parse_args(["--modes", "off_pc,on_pc", "--gpu-memory-utilization", "0.3,0.55"])
    assert args.memory_shares == [0.3, 0.55]
    # a child's arguments end with its own share, which wins
    run = ["--modes", "off_pc,on_pc", "--gpu-memory-utilization", "0.3,0.55"]
    child = parse_args([*run, "--modes", "on_pc", "--gpu-memory-utilization", "0.55"])
    assert child.modes == ["on_pc"] and child.gpu_memory_utilization == 0.55
    with pytest.raises(SystemExit):
        parse_args(["--modes", "on", "--gpu-memory-utilization", "0.3,0.55"])


@pytest.mark.parametrize("interleave", [False, True])
def test_each_child_runs_on_its_devices(tmp_path, monkeypatch, interleave):
    """--devices 0,1: each mode's child runs with its own CUDA_VISIBLE_DEVICES and is told
    only its own set, one after another or interleaved."""
    from benchmarks.e2e import steps_decode

    monkeypatch.setattr(
        steps_decode.e2e, "write_model_dir", lambda *a, **k: (tmp_path, {"vocab_size": 512})
    )
    seen: dict[str, tuple[argparse.Namespace, str]] = {}

    def run_child(cmd, env):
        at = cmd.index("--mode-json")
        mode, part = cmd[at - 1], Path(cmd[at + 1])
        seen[mode] = (parse_args(cmd[2:]), env["CUDA_VISIBLE_DEVICES"])
        part.write_text(json.dumps({"mode": mode, "summary": {}}))
        return 0

    monkeypatch.setattr(
        steps_decode,
        "run_interleaved",
        lambda args, cmds, envs: {m: run_child(cmds[m], envs[m]) for m in cmds},
    )
    real_run = steps_decode.subprocess.run

    def run(cmd, **kw):
        if "--mode-json" not in cmd:
            return real_run(cmd, **kw)
        return SimpleNamespace(returncode=run_child(cmd, kw["env"]))

    monkeypatch.setattr(steps_decode.subprocess, "run", run)
    argv = ["--tiny", "--modes", "off_spec,on_spec", "--devices", "0,1+2"]
    argv += ["--gpu-memory-utilization", "0.9,0.8", "--json", str(tmp_path / "steps.json")]
    argv += ["--interleave"] if interleave else []
    assert steps_decode.main(argv) == 0
    assert {m: env for m, (_, env) in seen.items()} == {"off_spec": "0", "on_spec": "1,2"}
    child = seen["on_spec"][0]
    assert child.modes == ["on_spec"] and child.device_sets == ["1,2"]
    assert child.gpu_memory_utilization == 0.8


def test_the_table_shows_the_gpu_phases_of_full_generates():
    from benchmarks.e2e.steps_decode import table

    rec = StepRecorder()
    rec.phase = "full0"
    rec._cg, rec._host = ("FULL", 8), {"_prepare_inputs": 0.002}
    rec.record(_scheduled([4, 4], [3, 3]), 0.03, start_s=1.0)
    rec.steps[0]["forward_gpu_ms"] = 25.0
    rec.steps[0]["phase_gpu_ms"] = {"_sample": 1.25, "propose_draft_token_ids": 3.5}
    text = table([{"mode": "on_spec", "summary": rec.summary()}])
    head, row = text.splitlines()[0], text.splitlines()[-1]
    assert "sample GPU ms" in head and "drafter GPU ms" in head
    cells = row.split()
    assert cells[:4] == ["on_spec", "full0", "FULL", "1"]
    assert cells[6:9] == ["25.0", "1.2", "3.5"]  # forward, sampling, drafter


def test_the_ssm_op_timer_steps_aside_while_dynamo_traces():
    """Under compilation mode 3 Dynamo traces the code around the SSM ops; a host timer
    cannot be traced (it failed so on the H100 at cf5baf2), so the hook calls the op untimed
    while tracing."""
    torch = pytest.importorskip("torch")
    from benchmarks.e2e.steps_decode import ssm_op_timed

    rec = StepRecorder()

    class Layer(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    forward = Layer.forward
    with_timer = rec.host_timed(forward, "ssm_layers")
    layer = Layer()
    traced = torch.compile(
        lambda x: with_timer(layer, x), backend="eager", fullgraph=True, dynamic=False
    )
    with pytest.raises(Exception, match="perf_counter"):  # the bare timer does not trace
        traced(torch.ones(3))
    torch._dynamo.reset()
    Layer.forward = ssm_op_timed(rec)(forward)
    try:
        compiled = torch.compile(layer, backend="eager", fullgraph=True, dynamic=False)
        assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))
        assert "ssm_layers" not in rec._host  # traced: untimed
        assert torch.equal(layer(torch.ones(3)), torch.full((3,), 2.0))
        assert rec._host["ssm_layers"] >= 0.0  # eager: timed
    finally:
        Layer.forward = forward
        torch._dynamo.reset()


def test_the_ssm_op_timer_times_the_outer_call_only(monkeypatch):
    """Our layers' op bodies call vLLM's through super() on the stock route; both are
    wrapped, and the step's time must count once."""
    import itertools

    from benchmarks.e2e import steps_decode

    ticks = itertools.count()
    monkeypatch.setattr(steps_decode.time, "perf_counter", lambda: float(next(ticks)))
    rec = StepRecorder()
    wrap = steps_decode.ssm_op_timed(rec)

    class Stock:
        def op(self, x):
            return x + 1

    class Ours(Stock):
        def op(self, x):
            return super().op(x) * 2

    monkeypatch.setattr(Stock, "op", wrap(Stock.__dict__["op"]))
    monkeypatch.setattr(Ours, "op", wrap(Ours.__dict__["op"]))
    assert Ours().op(1) == 4
    assert rec._host["ssm_layers"] == 1.0  # one pair of clock reads: the outer call's
    assert Stock().op(1) == 2
    assert rec._host["ssm_layers"] == 2.0
