"""Parameter tables of the kernel tests: a base row and rows that each change one factor
from it run in CI (`make test`); the rest of the full product of the factors is marked
`slow` and runs under `make test-all`.

    ROWS = table({"route": {"fused": "fused", "split": "split"},
                  "lp": {"none": None, "fp16": torch.float16}})
    @pytest.mark.parametrize("row", ROWS)
    def test_x(row): ...  # row["route"], row["lp"]

Each factor maps value ids to values, the base row's value first. Row ids join the value
ids in factor order ("fused-none" is the base row here; "split-fp16" is slow)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest


def table(factors: dict[str, dict[str, Any]]) -> list:
    """pytest params (one dict per row): the base row, the rows that change one factor from
    it, then the other rows of the full product, marked `slow`."""
    names = list(factors)
    fast, slow = [], []
    for ids in itertools.product(*(list(factors[n]) for n in names)):
        row = {n: factors[n][i] for n, i in zip(names, ids, strict=True)}
        changed = sum(i != next(iter(factors[n])) for n, i in zip(names, ids, strict=True))
        if changed <= 1:
            fast.append(pytest.param(row, id="-".join(ids)))
        else:
            slow.append(pytest.param(row, id="-".join(ids), marks=pytest.mark.slow))
    return fast + slow
