"""benchmarks/common.py's bytes model against the cursor rule it models."""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks import common
from vllm_replayssm.kernels.common.cursor import plan_step, reset_words


def _simulate(buffer_len: int, window: int, steps: int = 200) -> tuple[int, float]:
    """Run `cursor.plan_step` on one row, every token accepted: (steps between the last two
    flushes, mean history read per step over whole cycles)."""
    meta = reset_words(torch.tensor([0]), buffer_len, window, stagger=False)
    q = torch.tensor([window])
    flushes, history = [], []
    for step in range(steps):
        plan = plan_step(meta, q, None if window == 1 else q, buffer_len, window)
        if bool(plan.flush[0]):
            flushes.append(step)
        history.append(int(plan.committed[0]))
        meta = plan.meta()
    a, b = flushes[-2], flushes[-1]
    return b - a, sum(history[a:b]) / (b - a)


@pytest.mark.parametrize("L,T", [(16, 1), (16, 2), (16, 4), (16, 6), (16, 8), (32, 4), (8, 3)])
def test_flush_cycle_and_history_follow_the_cursor_rule(L, T):
    cycle, mean_history = _simulate(L, T)
    assert common.flush_cycle(L, T) == cycle
    # ring_bytes reads (c - 1) T / 2 records per step on average: 1 byte per record here
    rec = common.RecordBytes(write=0, readout=1, flush=0)
    assert common.ring_bytes(rec, L, T) == pytest.approx(mean_history)


@pytest.mark.parametrize("L,T", [(16, 1), (16, 4), (32, 8)])
def test_divisible_windows_keep_the_closed_form(L, T):
    """T dividing L: a flush every L / T steps, a mean history of (L - T) / 2 (design §2)."""
    rec = common.RecordBytes(write=3, readout=5, flush=7)
    E = 1 << 20
    assert common.ring_bytes(rec, L, T) == T * 3 + 5 * (L - T) / 2 + T * 7
    ring = common.ring_bytes(rec, L, T)
    assert common.replay_bytes(E, L, rec, None, T) == 4 * E * (1 + T / L) + ring
    assert common.replay_bytes(E, L, rec, 2, T) == 2 * E + 8 * E * T / L + ring


def test_window_longer_than_the_ring_is_refused():
    with pytest.raises(ValueError, match="window 17"):
        common.flush_cycle(16, 17)


def test_host_state_reads_the_load_and_tolerates_a_missing_nvidia_smi(monkeypatch):
    state = common.host_state()
    assert len(state["loadavg"]) == 3 and all(v >= 0 for v in state["loadavg"])
    assert state["uptime_s"] > 0
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi on the path
    state = common.host_state()
    assert state["gpus"] is None and state["gpu_processes"] is None


def test_triton_cache_entries_count_kernel_directories(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "none"))
    assert (
        common.triton_cache_entries() is None
        and common.host_state()["triton_cache_entries"] is None
    )
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    for name in ("AB12", "CD34"):
        (tmp_path / name).mkdir()
    (tmp_path / "stray.lock").write_text("")
    assert common.triton_cache_entries() == 2


def test_new_triton_kernels_name_the_entries_compiled_between_snapshots(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "none"))
    assert common.triton_cache_kernels() is None
    assert common.new_triton_kernels(None, {}) is None
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    (tmp_path / "AB12").mkdir()
    (tmp_path / "AB12" / "_plan_kernel.json").write_text("{}")
    (tmp_path / "AB12" / "__grp___plan_kernel.json").write_text("{}")
    before = common.triton_cache_kernels()
    assert before == {"AB12": "_plan_kernel"}
    for entry, name in (("CD34", "_readout_kernel"), ("EF56", "_plan_kernel"), ("GH78", None)):
        (tmp_path / entry).mkdir()
        if name:
            (tmp_path / entry / f"{name}.json").write_text("{}")
    after = common.triton_cache_kernels()
    assert common.new_triton_kernels(before, after) == ["?", "_plan_kernel", "_readout_kernel"]


def test_cpu_info_reads_the_model_and_clock_and_times_the_probe(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some CPU 9000\ncpu MHz\t\t: 2000.0\n\n"
        "processor\t: 1\nmodel name\t: Some CPU 9000\ncpu MHz\t\t: 3000.0\n"
    )
    info = common.cpu_info(cpuinfo)
    assert info["model"] == "Some CPU 9000" and info["mhz_mean"] == 2500.0
    assert info["logical_cpus"] == os.cpu_count() and info["python_probe_ms"] > 0.0
    missing = common.cpu_info(tmp_path / "absent")
    assert missing["model"] is None and missing["mhz_mean"] is None
    assert common.machine_info()["cpu"]["python_probe_ms"] > 0.0


def test_machine_info_records_vllm_env(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    env = common.machine_info()["vllm_env"]
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_PLUGINS" not in env and all(k.startswith("VLLM_") for k in env)
