"""The per-(request, layer) cursor machine that every ReplaySSM path shares (torch form).

Each state page carries `META_LEN` int32 words (`layout.py`). Logical ring entry i lives in
ring row (origin + i) mod C, C = buffer_len + window. A decode step on one row with q tokens
and the previous step's acceptance a does (design §1.4):

1. commit: committed += min(a, pending); pending = 0 (plain decode: a = pending);
2. flush iff committed + q + window > capacity: fold logical [0, committed) into the
   checkpoint, fold_origin/fold_count = origin/committed, origin += committed,
   committed = 0, capacity = C;
3. append the q window records at logical committed .. committed + q - 1;
4. token i of the window reads the checkpoint and logical [0, committed + i];
5. pending = q.

Invariant after every step: committed + pending + window <= capacity <= C, so the next
window always fits and a fold region never overlaps the window written in the same step.
A page whose words break the invariant (garbage, never reset) is read as freshly reset
(empty ring over whatever the checkpoint holds): kernels stay memory-safe for any meta.

The MAGIC word also says whether LP equals HP: META_MAGIC (LP fresh) or META_MAGIC_LP_STALE
(the stock route updated HP alone; readouts read HP until the next flush writes LP).

The Triton kernels implement the same rules; `plan_step` is their oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_replayssm.layout import META_LEN, ring_rows

ORIGIN, COMMITTED, PENDING, CAPACITY, FOLD_ORIGIN, FOLD_COUNT, MAGIC, TICKET = range(META_LEN)
META_MAGIC = 0x52504C59  # "RPLY": the page was reset by ReplaySSM, LP == HP
META_MAGIC_LP_STALE = 0x52504C53  # "RPLS": as above, but LP is stale (HP was updated alone)


def stagger_modulus(buffer_len: int, window: int, stagger: bool) -> int:
    """M with phi = slot mod M: L - T + 1, or 1 without stagger (phi = 0). The kernels that
    store reset cursor words take it as an argument."""
    return buffer_len - window + 1 if stagger else 1


def stagger_phase(slots: torch.Tensor, buffer_len: int, window: int, stagger: bool) -> torch.Tensor:
    """phi = slot mod (L - T + 1): the first cycle of a slot is phi steps shorter."""
    return torch.remainder(slots, stagger_modulus(buffer_len, window, stagger))


def reset_meta(
    meta: torch.Tensor,
    slots: torch.Tensor,
    buffer_len: int,
    window: int,
    stagger: bool,
    lp_stale: bool = False,
) -> None:
    """Reset the cursor words of `slots` in place (after a checkpoint write by prefill, a
    materialise, or a stock-route step with lp_stale=True).

    meta: [num_slots, META_LEN] int32 (any strides); slots: [R] int, NULL rows excluded.
    """
    slots = slots.to(device=meta.device, dtype=torch.long)
    meta[slots] = reset_words(slots, buffer_len, window, stagger, lp_stale).to(meta.dtype)


def reset_words(
    slots: torch.Tensor, buffer_len: int, window: int, stagger: bool, lp_stale: bool = False
) -> torch.Tensor:
    """[R, META_LEN] int64: the words `reset_meta` stores for `slots` ([R] int64)."""
    C = ring_rows(buffer_len, window)
    phi = stagger_phase(slots, buffer_len, window, stagger)
    words = torch.zeros(slots.numel(), META_LEN, dtype=torch.int64, device=slots.device)
    words[:, CAPACITY] = C - phi
    words[:, MAGIC] = META_MAGIC_LP_STALE if lp_stale else META_MAGIC
    return words


def meta_is_valid(meta_rows: torch.Tensor, buffer_len: int, window: int) -> torch.Tensor:
    """[R] bool: the words satisfy the cursor invariant (see module docstring)."""
    C = ring_rows(buffer_len, window)
    m = meta_rows.to(torch.int64)
    o, n, p, kap = m[:, ORIGIN], m[:, COMMITTED], m[:, PENDING], m[:, CAPACITY]
    return (
        ((m[:, MAGIC] == META_MAGIC) | (m[:, MAGIC] == META_MAGIC_LP_STALE))
        & (o >= 0)
        & (o < C)
        & (n >= 0)
        & (p >= 0)
        & (p <= window)
        & (kap >= 2 * window)
        & (kap <= C)
        & (n + p + window <= kap)
    )


@dataclass
class StepPlan:
    """One decode step's cursor decisions for R rows (all int64 [R] unless noted).

    origin/committed are the values after commit and flush: the window goes to logical
    committed .. committed + q - 1. fold_origin/fold_count describe the fold of a flush row.
    """

    origin: torch.Tensor
    committed: torch.Tensor
    pending: torch.Tensor
    capacity: torch.Tensor
    fold_origin: torch.Tensor
    fold_count: torch.Tensor
    flush: torch.Tensor  # bool
    valid: torch.Tensor  # bool: the incoming words were sane
    lp_stale: torch.Tensor  # bool: LP is stale after this step (a flush makes it fresh)

    def meta(self) -> torch.Tensor:
        """[R, META_LEN] int32 words to store back."""
        R = self.origin.numel()
        words = torch.zeros(R, META_LEN, dtype=torch.int64, device=self.origin.device)
        words[:, ORIGIN] = self.origin
        words[:, COMMITTED] = self.committed
        words[:, PENDING] = self.pending
        words[:, CAPACITY] = self.capacity
        words[:, FOLD_ORIGIN] = self.fold_origin
        words[:, FOLD_COUNT] = self.fold_count
        words[:, MAGIC] = torch.where(self.lp_stale, META_MAGIC_LP_STALE, META_MAGIC)
        return words.to(torch.int32)


def plan_step(
    meta_rows: torch.Tensor,
    num_tokens: torch.Tensor,
    num_accepted: torch.Tensor | None,
    buffer_len: int,
    window: int,
    force_flush: bool = False,
) -> StepPlan:
    """Apply commit and the flush rule to R rows.

    meta_rows: [R, META_LEN] int32, the words read at the start of the step.
    num_tokens: [R] int, q <= window tokens of each row this step.
    num_accepted: [R] int, the previous step's accepted count (drafts + bonus), or None for
        plain decode (everything pending is committed).
    force_flush: fold every committed entry regardless of the rule (materialise).
    """
    C = ring_rows(buffer_len, window)
    m = meta_rows.to(torch.int64)
    valid = meta_is_valid(meta_rows, buffer_len, window)
    zero = torch.zeros_like(m[:, 0])
    o = torch.where(valid, m[:, ORIGIN], zero)
    n = torch.where(valid, m[:, COMMITTED], zero)
    p = torch.where(valid, m[:, PENDING], zero)
    kap = torch.where(valid, m[:, CAPACITY], zero + C)
    q = num_tokens.to(device=m.device, dtype=torch.int64)
    if num_accepted is None:
        a = p
    else:
        a = num_accepted.to(device=m.device, dtype=torch.int64).clamp(min=0)
        a = torch.minimum(a, p)
    n = n + a
    flush = (n + q + window > kap) if not force_flush else torch.ones_like(valid)
    fold_o = torch.where(flush, o, torch.where(valid, m[:, FOLD_ORIGIN], zero))
    fold_n = torch.where(flush, n, torch.where(valid, m[:, FOLD_COUNT], zero))
    o = torch.where(flush, torch.remainder(o + n, C), o)
    n = torch.where(flush, zero, n)
    kap = torch.where(flush, zero + C, kap)
    stale = valid & (m[:, MAGIC] == META_MAGIC_LP_STALE) & ~flush
    return StepPlan(o, n, q, kap, fold_o, fold_n, flush, valid, stale)


def logical_to_row(origin: torch.Tensor, logical: torch.Tensor, C: int) -> torch.Tensor:
    """Ring row of logical entries: (origin + logical) mod C, broadcast."""
    return torch.remainder(origin + logical, C)
