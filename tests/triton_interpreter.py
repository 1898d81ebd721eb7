"""Triton's interpreter (TRITON_INTERPRET=1: the kernels in the CPU test session) without
two kinds of work that cannot change a result, found with cProfile on the Mamba-2 window
scenarios (2026-12-07: tests/kernels/mamba2/test_decode.py::test_kernel_matches_naive
[spec_T4_L16_lp_bf16], 34.5 s before, 21 s after, on 2 AMD EPYC cores)."""

from __future__ import annotations

import dataclasses
import inspect


def speed_up() -> None:
    """Both changes below, in this process (engine processes that a test spawns keep the
    interpreter as it is)."""
    _quiet_overflow_checks()
    _patch_language_once_per_launch()


def _quiet_overflow_checks() -> None:
    """The interpreter recomputes every int32 add, sub and mul in int64 and builds a range
    test whose `device_assert` it drops unless the debug option is on (a third of the
    time). The interpreter's options never turn debug on, so these checks cannot fire."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


class _LaunchPatch:
    """The language patch of one interpreted launch; restoring it ends the launch."""

    langs: set[int] | None = None  # ids of the modules the running launch has patched

    def __init__(self, scope, langs: set[int]) -> None:
        self.scope = scope
        _LaunchPatch.langs = langs

    def restore(self) -> None:
        _LaunchPatch.langs = None
        self.scope.restore()


class _NoPatch:
    def restore(self) -> None:
        pass


def _patch_language_once_per_launch() -> None:
    """The interpreter patches triton.language (every builtin, found by
    `inspect.getmembers`) at each launch and again at every call of a @triton.jit helper
    inside it, with the same builder, on modules the launch has patched already (a fifth of
    the time). Inside a launch a helper whose language modules are patched runs as it is;
    one that sees another (tl.sum's module sees triton.language.core) patches it once, and,
    as in the interpreter, that patch is not undone when the launch ends."""
    import triton.language as tl
    from triton.runtime import interpreter

    patch = interpreter._patch_lang

    def patch_once(fn):
        langs = {
            id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)
        }
        if _LaunchPatch.langs is None:
            return _LaunchPatch(patch(fn), langs)
        if langs <= _LaunchPatch.langs:
            return _NoPatch()
        _LaunchPatch.langs |= langs
        return patch(fn)

    interpreter._patch_lang = patch_once
