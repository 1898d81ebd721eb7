"""The LP write in Triton: the kernels' twin of `checkpoint.to_lp` (same saturation)."""

import triton
import triton.language as tl

from vllm_replayssm.kernels.common.checkpoint import FP16_MAX

LP_FP16_MAX = tl.constexpr(FP16_MAX)


@triton.jit
def store_lp(p_lp, S, mask, LP_IS_FP16: tl.constexpr):
    """Store the fp32 tile S at p_lp in LP's dtype, clamped to ±FP16_MAX when LP is fp16."""
    if LP_IS_FP16:
        S = tl.minimum(tl.maximum(S, -LP_FP16_MAX), LP_FP16_MAX)
    tl.store(p_lp, S.to(p_lp.dtype.element_ty), mask=mask)
