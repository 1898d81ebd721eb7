"""benchmarks/kernels/host_decode.py: the per-part host timers around our decode call."""

from __future__ import annotations

import time
import types

from benchmarks.kernels.host_decode import Parts


def test_parts_add_up_each_wrapped_function_and_restore_them():
    def slow(x):
        time.sleep(0.002)
        return x + 1

    def fast(x):
        return x * 2

    mod = types.SimpleNamespace(slow=slow, fast=fast)
    parts = Parts(mod, ["slow", "fast"])
    assert mod.slow is not slow and mod.fast is not fast
    assert [mod.slow(1), mod.fast(3), mod.slow(2)] == [2, 6, 3]
    parts.restore()
    assert mod.slow is slow and mod.fast is fast
    assert parts.total["slow"] >= 0.004 and parts.total["fast"] < parts.total["slow"] / 4
