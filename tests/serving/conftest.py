"""Serving tests: a real `vllm-replayssm serve` process on 127.0.0.1, started through the
launcher (`python -m vllm_replayssm.cli`) in its own process group, stopped with its engine
processes at the end of the module that uses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_replayssm import server_process
from vllm_replayssm.server_process import launcher_cmd  # noqa: F401 (the tests' import point)

START_TIMEOUT_S = 420  # engine start-up is 20-70 s alone; CI machines are shared
# Defaults for server processes (the caller's environment wins): vLLM's CPU worker pins
# every engine to core 0 by default, and a test module runs several engines at once, so let
# the OS place single-threaded engines instead.
SERVER_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


class ServerProcess(server_process.ServerProcess):
    """A test server: SERVER_ENV defaults, START_TIMEOUT_S to come up."""

    def __init__(self, args: list[str], log: Path) -> None:
        super().__init__(args, log, env=SERVER_ENV)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> float:
        return super().wait_ready(timeout)


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
