"""The dense per-step plan row of the plain-decode launches (both families).

The plan launch writes one row of PLAN_LEN int32 words per batch row; the flush and the
readout launches read it (and the readout stores the new cursor words from it, so every
launch has a single writer of the cursor). Words: the slot (NULL rows: NULL_BLOCK_ID and
nothing else), the history origin and length after commit and flush, the ring row the
current token's records go to, whether the row reads HP this step (flush, or a stale LP)
and whether it flushes, the fold region, then the new cursor words (META_LEN of them).
"""

import triton.language as tl

from vllm_replayssm.layout import META_LEN

PLAN_SLOT, PLAN_ORIGIN, PLAN_COUNT, PLAN_WRITE_ROW, PLAN_READ_HP, PLAN_FLUSH = range(6)
PLAN_FOLD_ORIGIN, PLAN_FOLD_COUNT = 6, 7
PLAN_META = 8  # words PLAN_META .. PLAN_META + META_LEN - 1: the new cursor words
PLAN_LEN = PLAN_META + META_LEN

T_PLAN_SLOT = tl.constexpr(PLAN_SLOT)
T_PLAN_ORIGIN = tl.constexpr(PLAN_ORIGIN)
T_PLAN_COUNT = tl.constexpr(PLAN_COUNT)
T_PLAN_WRITE_ROW = tl.constexpr(PLAN_WRITE_ROW)
T_PLAN_READ_HP = tl.constexpr(PLAN_READ_HP)
T_PLAN_FLUSH = tl.constexpr(PLAN_FLUSH)
T_PLAN_FOLD_ORIGIN = tl.constexpr(PLAN_FOLD_ORIGIN)
T_PLAN_FOLD_COUNT = tl.constexpr(PLAN_FOLD_COUNT)
T_PLAN_META = tl.constexpr(PLAN_META)
T_PLAN_LEN = tl.constexpr(PLAN_LEN)
T_META_LEN = tl.constexpr(META_LEN)
