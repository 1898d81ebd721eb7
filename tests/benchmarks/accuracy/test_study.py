"""The accuracy study (benchmarks/accuracy/study.py): its metrics on hand-made distributions."""

from __future__ import annotations

import numpy as np

from benchmarks.accuracy import study

# --- metrics ---------------------------------------------------------------------------


def _logprobs(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_kl_is_zero_for_equal_and_matches_the_definition():
    rng = np.random.default_rng(0)
    p = _logprobs(rng.normal(size=(2, 5, 7)))
    q = _logprobs(rng.normal(size=(2, 5, 7)))
    assert np.abs(study.kl_per_position(p, p)).max() < 1e-15
    expected = (np.exp(p) * (p - q)).sum(axis=-1)
    np.testing.assert_allclose(study.kl_per_position(p, q), expected, rtol=1e-12)
    # float32 log-probabilities whose sum is off by rounding read as no divergence
    shifted = (p + 1e-7).astype(np.float32)
    assert np.abs(study.kl_per_position(p, shifted)).max() < 1e-12


def test_ranges_and_agreement_lengths():
    assert study.ranges_for(2048) == [(0, 256), (256, 1024), (1024, 2048)]
    assert study.ranges_for(300) == [(0, 256), (256, 300)]
    ref = np.array([[1, 2, 3, 4], [1, 1, 1, 1]])
    lp = np.log(np.full((2, 4, 5), 0.1))
    lp[0, [0, 1, 2, 3], [1, 2, 0, 4]] = 0.0  # argmax differs at position 2
    lp[1, :, 1] = 0.0  # never differs
    assert study.agreement_lengths(ref, lp) == [2, 4]


def test_claims():
    def res(kls):
        return {"ranges": [{"kl_mean": v} for v in kls]}

    claims = study.check_claims(
        "x",
        {
            "stock_bf16": res([1e-3, 5e-3]),
            "replayssm_lp_bf16": res([1e-4, 1e-4]),
            "replayssm_hp_only": res([1e-12, 1e-12]),
        },
    )
    assert claims["lp_bf16_below_shared_bf16_every_range"]
    assert claims["gap_grows_with_position"]
    assert claims["hp_only_below_lp_bf16_every_range"]
