"""A kernel for known answers: z = a * x + b, elementwise, float32.

Two launches (y = 2x, then z = y + 1) round-trip y through HBM; one launch (z = 2x + 1) does not: the
difference is a data-locality tax of exactly 2 |y| bytes, planted on purpose (taxes.run.planted).
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def affine_kernel(x_ptr, z_ptr, n, a, b, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok)
    tl.store(z_ptr + offs, x * a + b, mask=ok)


def affine(x, z, a: float, b: float) -> None:
    """z = a * x + b (contiguous float32 tensors of one size)."""
    n = x.numel()
    affine_kernel[(triton.cdiv(n, BLOCK),)](x, z, n, a, b, BLOCK=BLOCK, num_warps=8)
