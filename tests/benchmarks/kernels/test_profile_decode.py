"""benchmarks/kernels/profile_decode.py --timeline: kernels placed within their step."""

from __future__ import annotations

import pytest

from benchmarks.kernels.profile_decode import print_timeline


def test_timeline_places_overlapping_kernels_within_their_steps(capsys):
    spans = [(0.0, 3.0, "fill")]  # before the first step: skipped
    for t0 in (10.0, 110.0):  # two steps: plan, then flush beside the readout
        spans += [
            (t0, t0 + 12.0, "_gdn_plan_kernel"),
            (t0 + 12.5, t0 + 90.0, "_gdn_flush_kernel"),
            (t0 + 13.0, t0 + 70.0, "_gdn_readout_kernel"),
        ]
    spans.reverse()  # any order
    print_timeline(spans, "_plan_kernel")
    out = capsys.readouterr().out
    lines = {line.split()[-1]: line.split() for line in out.splitlines()[1:-1]}
    assert "fill" not in lines
    assert float(lines["_gdn_flush_kernel"][1]) == pytest.approx(12.5)
    assert float(lines["_gdn_flush_kernel"][3]) == pytest.approx(90.0)
    assert float(lines["_gdn_readout_kernel"][3]) == pytest.approx(70.0)
    assert lines["_gdn_readout_kernel"][4] == "2"
    assert out.splitlines()[-1].split()[2:4] == ["90.00", "us"]
