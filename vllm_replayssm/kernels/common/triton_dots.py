"""Tensor-core products shared by both families' Triton kernels: a product of two 16-bit
operands of one dtype (exact products, fp32 accumulation), the 3-way bf16 split of an fp32
operand, and the products of an exact bf16 operand with a split one (fp32-accurate)."""

import os

import triton
import triton.language as tl

# Triton's interpreter takes bf16 dot operands as raw bits, so under it the 16-bit products
# run on their exact fp32 values (the same sums: a 16-bit x 16-bit product is exact in fp32).
_DOT16_AS_FP32 = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def dot16(a, b, acc):
    """acc + a @ b of 16-bit a and b of one dtype (bf16 or fp16; fp32 accumulation)."""
    if _DOT16_AS_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc, input_precision="ieee")
    return tl.dot(a, b, acc=acc)


@triton.jit
def bf16_parts(x):
    """x (fp32) as hi + mid + lo, three bf16 parts that carry its 24 bits."""
    hi = x.to(tl.bfloat16)
    mid = (x - hi.to(tl.float32)).to(tl.bfloat16)
    lo = (x - hi.to(tl.float32) - mid.to(tl.float32)).to(tl.bfloat16)
    return hi, mid, lo


@triton.jit
def dot_split3(a, b, acc):
    """acc + a @ b at fp32 accuracy for an fp32 `a` and an exact bf16 `b`: a's three bf16
    parts (`bf16_parts`, formed before the products) against b, smallest part first."""
    a_hi, a_mid, a_lo = bf16_parts(a)
    acc = dot16(a_lo, b, acc)
    acc = dot16(a_mid, b, acc)
    acc = dot16(a_hi, b, acc)
    return acc


@triton.jit
def dot_bf16_parts(a, b_hi, b_mid, b_lo, acc):
    """acc + a @ b at fp32 accuracy for a bf16 `a` (exact: an LP tile) and an fp32 `b` given
    as its bf16 parts (`bf16_parts`, split once for many tiles), in three bf16 products
    (smallest part first): a third of tf32x3's tensor-core time (half-rate tf32 products,
    and no split of the large operand)."""
    acc = dot16(a, b_lo, acc)
    acc = dot16(a, b_mid, acc)
    acc = dot16(a, b_hi, acc)
    return acc


@triton.jit
def dot_bf16_parts2(a, b_hi, b_mid, acc):
    """`dot_bf16_parts` with the two larger parts of b: b to 16 significant bits (relative
    error below 2^-16), for a bf16 `a` whose own rounding (2^-9) dominates: an LP tile."""
    acc = dot16(a, b_mid, acc)
    acc = dot16(a, b_hi, acc)
    return acc
