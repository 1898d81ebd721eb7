"""Relaunching a compiled Triton kernel without Triton's per-call dispatch.

`kernel[grid](*args, **kwargs)` binds and specialises every argument, builds a cache key
from the specialisation and the options, checks the kernel's globals and only then calls the
compiled kernel's launcher: tens of µs of host time for our 30-50-argument kernels (H100,
2026-12-06, benchmarks/kernels/host_decode.py). That is the eager step's cost: a captured
step replays its launches for free. `launch` remembers, per kernel, the compiled kernel of
each argument key it has seen and calls its launcher directly when the key repeats, which it
does on every eager step of a layer (the strides, the cache tensors and the knobs do not
change).

The key is stricter than Triton's specialisation, so a hit can only reuse the kernel Triton
would pick: each integer by value (Triton specialises integers on == 1, % 16 and their
range), each float, bool or None by type and value, each tensor by dtype and whether its
address is 16-byte aligned (Triton's pointer specialisation), and every keyword (constexprs
and launch options such as num_warps) by name and value. A miss goes through
`kernel[grid]`, which compiles if needed. Off (always `kernel[grid]`) under the
interpreter, while a Triton launch hook is set (a profiler wants its metadata; Triton's path
otherwise also builds that metadata and calls the empty hook chains on every launch), for
kernels whose runtime arguments are not all positional, or with REPLAYSSM_DIRECT_LAUNCH=0."""

from __future__ import annotations

import os

import torch
import triton

from vllm_replayssm.compat import triton_launch_parts, triton_raw_stream

DIRECT_LAUNCH_ENV = "REPLAYSSM_DIRECT_LAUNCH"
# Keys kept per kernel: eager steps of many batch shapes each add one; past this the memo
# starts over (a miss costs one ordinary launch).
MAX_KEYS = 256


def direct_launch_enabled() -> bool:
    """Whether `launch` may bypass Triton's dispatch (REPLAYSSM_DIRECT_LAUNCH, default on;
    never under TRITON_INTERPRET=1)."""
    return (
        os.environ.get(DIRECT_LAUNCH_ENV, "1") != "0"
        and os.environ.get("TRITON_INTERPRET", "0") != "1"
    )


class _Memo:
    """One kernel's compiled launches: argument key -> (launcher, function, packed
    metadata). `tail`: the parameters after the positional ones, in signature order (all
    constexprs: the launcher takes every parameter and skips the constexprs), with their
    defaults. `usable` False: this kernel always takes `kernel[grid]`. `kernel`: held so that
    its id, the memo's key in _MEMOS, cannot pass to another object while the memo exists."""

    __slots__ = ("entries", "kernel", "num_positional", "tail", "usable")

    def __init__(self, kernel, num_positional: int):
        self.entries: dict = {}
        self.kernel = kernel
        self.num_positional = num_positional
        params = getattr(kernel, "params", None)
        rest = [] if params is None else params[num_positional:]
        # A runtime argument passed by keyword or left to its default would sit in the
        # tail unkeyed by its specialisation: such kernels keep Triton's path.
        self.usable = params is not None and all(p.is_constexpr for p in rest)
        self.tail = tuple((p.name, p.default) for p in rest)


_MEMOS: dict[int, _Memo] = {}
_STATE: dict = {"enabled": direct_launch_enabled(), "stream": None}


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)`, through the compiled kernel's launcher when this
    argument key has launched before (module docstring). grid: 1 to 3 ints; runtime
    arguments positional, constexprs and options (num_warps, ...) by keyword."""
    runtime = triton.knobs.runtime
    if not (
        _STATE["enabled"] and _idle(runtime.launch_enter_hook) and _idle(runtime.launch_exit_hook)
    ):
        kernel[grid](*args, **kwargs)
        return
    memo = _MEMOS.get(id(kernel))
    if memo is None:
        memo = _MEMOS[id(kernel)] = _Memo(kernel, len(args))
    if not memo.usable or len(args) != memo.num_positional:
        kernel[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    # A list comprehension with the int test first: most arguments are strides, and a
    # generator expression with isinstance alone cost twice as much (about 7 µs for 40
    # arguments on a 2026 Xeon, 3 µs this way).
    Tensor = torch.Tensor
    key = (
        device,
        tuple(
            [
                a
                if a.__class__ is int
                else (a.dtype, a.data_ptr() & 15 == 0)
                if isinstance(a, Tensor)
                else (a.__class__, a)  # True, 1 and 1.0 are equal keys but not one kernel
                for a in args
            ]
        ),
        tuple(kwargs.items()),
    )
    entry = memo.entries.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **kwargs)
        parts = triton_launch_parts(compiled)
        if parts is None:
            memo.usable = False
            return
        if len(memo.entries) >= MAX_KEYS:
            memo.entries.clear()
        tail = tuple(kwargs.get(name, default) for name, default in memo.tail)
        memo.entries[key] = (*parts, tail)
        return
    stream = _STATE["stream"]
    if stream is None:
        stream = _STATE["stream"] = triton_raw_stream()
    run, function, metadata, tail = entry
    n = len(grid)
    run(
        grid[0],
        grid[1] if n > 1 else 1,
        grid[2] if n > 2 else 1,
        stream(device),
        function,
        metadata,
        None,  # launch metadata: only a launch hook reads it, and hooks take Triton's path
        None,
        None,
        *args,
        *tail,
    )


def _idle(hook) -> bool:
    """Whether a Triton launch hook does nothing: unset, or (Triton 3.6) a hook chain with no
    hooks in it. Otherwise a profiler wants the launch metadata that Triton's path builds."""
    return hook is None or getattr(hook, "calls", None) == []


def reset() -> None:
    """Forget every memo and re-read REPLAYSSM_DIRECT_LAUNCH (tests)."""
    _MEMOS.clear()
    _STATE.update(enabled=direct_launch_enabled(), stream=None)
