"""Tolerances of ReplaySSM paths against the float64 oracle, one table.

Errors are relative Frobenius norms ||y - y_ref|| / ||y_ref|| over a step's outputs (or a
state). The key is the lowest precision a path rounds through:
- float32: only fp32 arithmetic (replay reassociates sums over <= C + 1 terms): observed
  ~1e-7, bound 2e-5 (~170 ulp) leaves room for long runs and large heads.
- float16 (LP copy): the checkpoint is rounded once to 11 bits (u = 4.9e-4); only the
  checkpoint term of a readout sees it: bound 4e-3.
- bfloat16 (LP copy, or GDN corrected values d kept in bf16): u = 3.9e-3 on the rounded
  terms: bound 3e-2.
A bug (wrong entry, wrong decay, stale checkpoint) moves outputs by O(1).
"""

import torch

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def tol_for(*dtypes: torch.dtype | None) -> float:
    return max(TOL[d] for d in (torch.float32, *dtypes) if d is not None)
