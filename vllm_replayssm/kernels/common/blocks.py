"""Block sizes of the Triton launchers (both families), and the integer helpers their host
code uses instead of `triton.cdiv` / `triton.next_power_of_2`: Triton 3.6 makes those
constexpr functions, which cost a few µs per call from Python (argument unwrapping), and
the launchers called them several times per launch. An eager step (a PIECEWISE CUDA-graph
step runs the SSM layers eagerly) is paced by that host time."""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of ints (`triton.cdiv`)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n, 0 for 0 (`triton.next_power_of_2`)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def pow2_block(x: int, lo: int = 16) -> int:
    """The block (tile) extent that covers x: the next power of two, at least lo."""
    return max(lo, next_pow2(x))


# Readout launches with readout_tiles=0 (GDN: the window step's planned readout and the plain
# readout) take as many value tiles per program as keep this many programs (H200: 132 SMs
# of about 8 one-warp programs each, four waves).
READOUT_MIN_PROGRAMS = 4096
READOUT_MAX_TILES = 8


def auto_readout_tiles(
    key_head_tiles: int, row_tiles: int, head_tiles: int = 1, max_tiles: int = READOUT_MAX_TILES
) -> int:
    """readout_tiles=0's choice: the largest divisor of a key head's key_head_tiles value
    tiles, at most max_tiles, that leaves READOUT_MIN_PROGRAMS programs of the step's
    row_tiles (all rows' tiles) and divides or is a multiple of a value head's head_tiles;
    1 for a small step."""
    best = 1
    for n in range(2, min(key_head_tiles, max_tiles) + 1):
        fits = n % head_tiles == 0 or head_tiles % n == 0
        if fits and key_head_tiles % n == 0 and row_tiles // n >= READOUT_MIN_PROGRAMS:
            best = n
    return best
