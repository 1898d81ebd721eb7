"""benchmarks/e2e/bench_decode_e2e.py: a worker process and everything it started end with
it, on a time-out too (a vLLM engine core left behind keeps the GPU's memory, and the next
mode's engine fails to start)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks.e2e.bench_decode_e2e import run_worker_process


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _worker(pidfile: Path, then: str) -> list[str]:
    """A worker that starts a long-lived child (as vLLM starts its engine core), says so,
    then runs `then`."""
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('engine up', flush=True)\n" + then
    )
    return [sys.executable, "-c", code]


def test_a_timed_out_worker_leaves_no_process(tmp_path):
    pidfile, lines = tmp_path / "child.pid", []
    t0 = time.monotonic()
    rc = run_worker_process(_worker(pidfile, "time.sleep(300)"), 5, lines.append)
    assert rc == "timeout" and time.monotonic() - t0 < 60
    assert lines == ["engine up\n"]
    assert not _alive(int(pidfile.read_text()))


def test_a_worker_that_exits_leaves_no_process(tmp_path):
    pidfile, lines = tmp_path / "child.pid", []
    rc = run_worker_process(_worker(pidfile, "sys.exit(3)"), 60, lines.append)
    assert rc == 3 and lines == ["engine up\n"]
    assert not _alive(int(pidfile.read_text()))
