"""Serving tests: a real `vllm-replayssm serve` process on 127.0.0.1, started through the
launcher (`python -m vllm_replayssm.cli`) in its own process group, stopped with its engine
processes at the end of the module that uses it."""

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
import pytest

START_TIMEOUT_S = 420  # engine start-up is 20-70 s alone; CI machines are shared
STOP_TIMEOUT_S = 60
# Defaults for server processes (the caller's environment wins): vLLM's CPU worker pins
# every engine to core 0 by default, and a test module runs several engines at once, so let
# the OS place single-threaded engines instead.
SERVER_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_replayssm.cli", *args]


class ServerProcess:
    """`vllm-replayssm serve ARGS --host 127.0.0.1 --port P`, output in `log`."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._log_file = open(log, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            launcher_cmd("serve", *args, "--host", "127.0.0.1", "--port", str(self.port)),
            stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True,
            env={**SERVER_ENV, **os.environ, "PYTHONUNBUFFERED": "1"}, cwd=log.parent)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        self._log_file.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the process group (the API server and its engine processes), SIGKILL
        whatever is left after STOP_TIMEOUT_S."""
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        self._log_file.close()


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """Start servers (`serve(args)` returns a started, not yet ready ServerProcess); all
    are stopped at the end of the module."""
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        log = tmp_path_factory.mktemp("server") / "server.log"
        server = ServerProcess(list(args), log)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
