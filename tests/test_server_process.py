"""vllm_replayssm/server_process.py: ending a process group leaves none of its members
running (the engine processes of a server or benchmark worker hold the GPU's memory)."""

from __future__ import annotations

import subprocess
import sys

from vllm_replayssm.server_process import end_group, live_in_group


def test_end_group_waits_for_every_member():
    # A leader whose child outlives it in the same group, as vLLM's engine core does.
    child = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
    try:
        for _ in range(100):  # until the child has started
            if len(live_in_group(proc.pid)) == 2:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert len(live_in_group(proc.pid)) == 2
        assert end_group(proc.pid, wait_s=30) == []
        proc.wait(timeout=10)
        assert live_in_group(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
