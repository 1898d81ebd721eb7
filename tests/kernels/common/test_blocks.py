"""Launcher block sizes (`kernels/common/blocks.py`)."""

from vllm_replayssm.kernels.common import blocks


def test_pow2_block():
    assert blocks.pow2_block(5) == 16 and blocks.pow2_block(100) == 128
    assert blocks.pow2_block(3, 1) == 4 and blocks.pow2_block(1, 1) == 1


def test_auto_readout_tiles():
    """readout_tiles=0: the largest divisor of a key head's tiles, at most 8, that leaves
    READOUT_MIN_PROGRAMS programs."""
    pick = blocks.auto_readout_tiles
    assert blocks.READOUT_MIN_PROGRAMS == 4096
    assert pick(8, 32 * 4 * 256) == 8  # Qwen3.5-4B, 32-row tiles, bs 256
    assert pick(8, 32 * 4 * 64) == 2  # bs 64
    assert pick(8, 32 * 4 * 17) == 1
    assert pick(12, 10**6) == 6  # 8 does not divide 12
    assert pick(7, 10**6) == 7 and pick(1, 10**6) == 1
    assert pick(6, 10**6, head_tiles=2) == 6 and pick(6, 10**6, head_tiles=4) == 2
    assert pick(12, 10**6, head_tiles=3) == 6  # 4 neither divides nor is a multiple of 3
    # the plain GDN readout's cap (`readout.MAX_TILES`): Qwen3.5-122B bf16 LP at bs 256 / 64
    assert pick(16, 64 * 4 * 256, max_tiles=4) == 4 and pick(16, 64 * 4 * 16, max_tiles=4) == 1


def test_host_integer_helpers_match_tritons():
    """cdiv and next_pow2 answer as triton.cdiv and triton.next_power_of_2 (the launchers'
    host code uses these: Triton's are constexpr functions, slow from Python)."""
    import triton

    from vllm_replayssm.kernels.common.blocks import cdiv, next_pow2

    for n in range(0, 1100):
        assert next_pow2(n) == triton.next_power_of_2(n), n
        for d in (1, 2, 3, 16, 64, 100):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)
