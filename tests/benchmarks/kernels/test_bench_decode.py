"""benchmarks/kernels/bench_decode.py without a GPU: the buffer_len each measurement takes
(the plugin's per family and LP unless --buffer-len) and its check against --window."""

from __future__ import annotations

import pytest

from benchmarks.kernels import bench_decode as bench
from vllm_replayssm.config import DEFAULT_BUFFER_LEN


def test_buffer_len_is_the_plugins_per_family_and_lp_unless_given():
    super_, q122b = bench.GEOMETRIES["nemotron3_super"], bench.GEOMETRIES["qwen35_122b"]
    got = {
        (g, lp): bench.buffer_len_for(bench.GEOMETRIES[g], lp)
        for g in ("nemotron3_super", "qwen35_122b")
        for lp in ("none", "bf16", "fp16")
    }
    assert got == {
        ("nemotron3_super", "none"): DEFAULT_BUFFER_LEN[("mamba2", False)],
        ("nemotron3_super", "bf16"): DEFAULT_BUFFER_LEN[("mamba2", True)],
        ("nemotron3_super", "fp16"): DEFAULT_BUFFER_LEN[("mamba2", True)],
        ("qwen35_122b", "none"): DEFAULT_BUFFER_LEN[("gdn", False)],
        ("qwen35_122b", "bf16"): DEFAULT_BUFFER_LEN[("gdn", True)],
        ("qwen35_122b", "fp16"): DEFAULT_BUFFER_LEN[("gdn", True)],
    }
    assert (got[("nemotron3_super", "bf16")], got[("nemotron3_super", "none")]) == (32, 16)
    assert bench.buffer_len_for(super_, "bf16", 24) == bench.buffer_len_for(q122b, "none", 24) == 24


def _dry_run_rows(capsys, *argv: str) -> dict[tuple[str, str], list[str]]:
    assert bench.main(["--dry-run", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("geometry"))
    assert lines[header].split()[:3] == ["geometry", "lp", "L"]
    return {tuple(line.split()[:2]): line.split() for line in lines[header + 2 :] if line.strip()}


def test_dry_run_rows_take_their_own_buffer_len(capsys):
    rows = _dry_run_rows(capsys, "--geoms", "nemotron3_super,qwen35_122b", "--lp", "none,bf16")
    assert {k: int(v[2]) for k, v in rows.items()} == {
        ("nemotron3_super", "none"): 16,
        ("nemotron3_super", "bf16"): 32,
        ("qwen35_122b", "none"): 16,
        ("qwen35_122b", "bf16"): 16,
    }
    # the bytes model follows L: a Mamba-2 bf16 row at L = 32 moves fewer bytes than at 16
    at16 = _dry_run_rows(capsys, "--geoms", "nemotron3_super", "--lp", "bf16", "--buffer-len", "16")
    assert int(at16[("nemotron3_super", "bf16")][2]) == 16
    assert float(rows[("nemotron3_super", "bf16")][-2]) > float(
        at16[("nemotron3_super", "bf16")][-2]
    )


def test_window_is_checked_against_every_measurements_buffer_len(capsys):
    # T = 20 fits Mamba-2 with an LP copy (L = 32), not its HP-only L = 16
    rows = _dry_run_rows(capsys, "--families", "mamba2", "--lp", "bf16", "--window", "20")
    assert all(int(v[2]) == 32 for v in rows.values())
    with pytest.raises(SystemExit, match="got 20 and 16"):
        bench.main(["--dry-run", "--families", "mamba2", "--lp", "bf16,none", "--window", "20"])
