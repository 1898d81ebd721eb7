"""A `vllm-replayssm serve` child process on 127.0.0.1 (the launcher through `python -m
vllm_replayssm.cli`) in its own process group, output to a log file: start it, wait for
/health, stop it with its engine processes. The serving tests and
benchmarks/serving/bench_serving.py run their servers through it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STOP_TIMEOUT_S = 60
# vLLM picks its internal ports (torch.distributed store, engine sockets) by binding port 0
# and closing it again, so they come from the kernel's ephemeral range, which client
# connections (our /health polls among them) draw from too: a poll could take the port
# before the worker listens on it (seen once in CI: EADDRINUSE at worker start-up). With
# VLLM_PORT set, vLLM scans upward from it instead; a base below the ephemeral range
# (32768 on Linux by default) never meets a client socket.
INTERNAL_PORT_BASE, INTERNAL_PORT_SPAN = 10_000, 20_000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_replayssm.cli", *args]


def live_in_group(pgid: int) -> list[int]:
    """The processes of process group pgid that have not exited (zombies excluded: they
    hold no GPU memory, and a container's init may never reap an orphan's)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while we looked
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            live.append(int(stat.parent.name))
    return live


def end_group(pgid: int, wait_s: float = 60.0) -> list[int]:
    """SIGKILL what is left of process group pgid and wait until it has exited; returns
    the pids still alive after wait_s (empty when the group is gone). vLLM's engine core
    runs in its own process, which killing only the group's leader leaves running, with
    the GPU's memory: after such a kill on 2026-12-03 the next engine of a benchmark failed
    to start (its root cause went unlogged; the memory left in use is the likely one)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while (live := live_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return live


class ServerError(RuntimeError):
    """A server that exited, or did not answer /health in time; the message holds its log
    tail."""


class ServerProcess:
    """`vllm-replayssm serve ARGS --host 127.0.0.1 --port P`; `env` gives defaults that the
    caller's environment overrides."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # One base per server (from its HTTP port), so servers side by side scan apart.
        internal = INTERNAL_PORT_BASE + self.port % INTERNAL_PORT_SPAN
        self.log_path = log_path
        self.argv = launcher_cmd("serve", *args, "--host", "127.0.0.1", "--port", str(self.port))
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd or log_path.parent,
            env={"VLLM_PORT": str(internal), **(env or {}), **os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def wait_ready(self, timeout: float) -> float:
        """Seconds until /health answered 200; raise ServerError on exit or timeout."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"server exited with status {self.proc.returncode} before "
                    f"/health answered; log {self.log_path}, tail:\n"
                    f"{self.tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return time.monotonic() - t0
            time.sleep(1)
        raise ServerError(
            f"server not ready after {timeout:.0f} s; log {self.log_path}, tail:\n{self.tail()}"
        )

    def tail(self, lines: int = 60) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> int | None:
        """SIGTERM the process group (API server and engine processes), SIGKILL what is left
        after STOP_TIMEOUT_S and wait until every member has exited (`end_group`); return
        the leader's exit status."""
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        end_group(pgid)
        rc = self.proc.wait()
        self._log.close()
        return rc
