"""Block sizes of the Triton launchers (both families)."""

import triton


def pow2_block(x: int, lo: int = 16) -> int:
    """The block (tile) extent that covers x: the next power of two, at least lo."""
    return max(lo, triton.next_power_of_2(x))
