"""Interleaved modes for `bench_decode_e2e.py --interleave`: every mode of a model keeps its
engine up at once (each in its own child process, on a share of the GPU's memory) and the
modes' timed generates take turns, the order reversed every repeat (A B, B A, A B, ...).

Why: the decode steps these runs time are paced by the host, and a GPU host's Python speed
was seen to drift by 2x within minutes (the e2e JSONs' `python_probe_ms`, 27 to 56 ms on one
machine in one call, 2026-12-04). Modes run one after another then compare different
hosts: in two A/B runs of one build (NemotronH 52 with prefix caching, 64 and 256
requests sharing a 2k prefix, the two sides differing only in a metadata short path, run in
either order), whichever engine ran second decoded 13-35% faster. Turns a few
seconds long see the same host, and each repeat's pair gives a ratio of its own.

The protocol, over the child's stdin and stdout (vLLM's logs share the stdout; ours are
whole lines that start with MARK):
  child   `MARK ready`          its engine is up (the driver then starts the next mode's)
  driver  `go`                  one turn: the warm-up generate of a batch size, or one
                                timed repeat (prefill-only and full generates)
  child   `MARK done`           that turn is over (also after a turn that failed)
  driver  closes stdin          no more turns: the child shuts its engine down and exits
Per batch size the driver hands each child 1 + repeats turns: warm-ups in mode order,
then the repeats alternating. A child whose batch size failed answers that size's
remaining turns at once (`Turns.catch_up`), so every child stays in step."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO

MARK = "@@replayssm-e2e"


class DriverGoneError(RuntimeError):
    """The driver closed the child's stdin before a turn it was waiting for."""


class Turns:
    """The child's side: waits for the driver's `go` before each timed phase."""

    def __init__(self, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.taken = 0

    def say(self, word: str) -> None:
        print(f"{MARK} {word}", file=self.stdout, flush=True)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """One turn: returns when the driver says go; says done when the block ends, also
        when it raises."""
        line = self.stdin.readline()
        if not line:
            raise DriverGoneError("the driver closed stdin before a turn")
        if line.strip() != "go":
            raise RuntimeError(f"unexpected line from the driver: {line!r}")
        self.taken += 1
        try:
            yield
        finally:
            self.say("done")

    def catch_up(self, total: int) -> None:
        """Answer turns until `total` were taken (after a batch size that failed)."""
        while self.taken < total:
            with self.turn():
                pass


class Child:
    """The driver's side of one interleaved (model, mode) child: `cmd` runs the worker with
    its spec; lines without MARK go to `on_line`. Each wait is bounded by `timeout` seconds
    (None: unbounded); a child that misses one is killed with its process group and takes
    no further turns."""

    def __init__(
        self,
        cmd: list[str],
        on_line: Callable[[str], None],
        timeout: float | None,
        end_group: Callable[[int], list[int]],
        env: dict[str, str] | None = None,
    ) -> None:
        self.timeout = timeout
        self.end_group = end_group
        self.rc: int | str | None = None
        self.events: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
            env=env,
        )

        def read() -> None:
            for line in self.proc.stdout:
                if line.startswith(MARK):
                    self.events.put(line[len(MARK) :].strip())
                else:
                    on_line(line)
            self.events.put(None)  # end of output: the child exited

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    @property
    def alive(self) -> bool:
        return self.rc is None and self.proc.poll() is None

    def wait_for(self, word: str) -> bool:
        """Whether the child said `word` before its output ended or the time-out."""
        while True:
            try:
                got = self.events.get(timeout=self.timeout)
            except queue.Empty:
                self.stop("timeout")
                return False
            if got is None:
                return False
            if got == word:
                return True

    def turn(self) -> bool:
        """Hand the child one turn and wait until it is over (False: the child is gone)."""
        if not self.alive:
            return False
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return self.wait_for("done")

    def stop(self, rc: int | str | None = None) -> int | str:
        """Close stdin (the child shuts its engine down and exits), wait for it within the
        time-out, then end its group: no engine process outlives it."""
        if rc is not None:
            self.rc = rc
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.close()
        if self.rc is None:
            try:
                self.rc = self.proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.rc = "timeout"
        left = self.end_group(self.proc.pid)
        self.proc.wait()
        self.reader.join(timeout=10)
        if left:
            print(f"# processes {left} of the worker's group outlived SIGKILL", file=sys.stderr)
        return self.rc


def run_turns(children: list[Child], batch_sizes: list[int], repeats: int) -> list[str]:
    """Hand out the turns of every batch size (module docstring); returns the order they
    ran in, as `bs/repeat/child index` strings ("warm-up" for repeat -1) for the record."""
    order = []
    for bs in batch_sizes:
        for i, child in enumerate(children):
            if child.turn():
                order.append(f"{bs}/warm-up/{i}")
        for r in range(repeats):
            ids = list(range(len(children)))
            for i in ids if r % 2 == 0 else ids[::-1]:
                if children[i].turn():
                    order.append(f"{bs}/{r}/{i}")
    return order


def start_children(
    commands: list[tuple[str, list[str]]],
    on_line: Callable[[str, str], None],
    timeout: float | None,
    end_group: Callable[[int], list[int]],
    log: Callable[[str], None],
    envs: dict[str, dict[str, str] | None] | None = None,
) -> list[Child]:
    """Start one child per (name, command), each after the previous one's engine is up
    (vLLM sizes its KV cache from the memory it finds free at start-up, so two engines must
    not profile at once); their other output goes to on_line(name, line); envs[name], where
    given, is that child's whole environment. A child whose engine did not come up is
    stopped and stays in the list (its turns are skipped; its result records what
    failed)."""
    children = []
    for name, cmd in commands:
        log(f"{name}: starting worker (interleaved)")
        child = Child(
            cmd,
            lambda line, name=name: on_line(name, line),
            timeout,
            end_group,
            (envs or {}).get(name),
        )
        if not child.wait_for("ready"):
            child.stop()
        children.append(child)
    return children
