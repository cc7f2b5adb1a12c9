"""The method's shared definitions (docs/method.md), one home each: every builder, check and report reads
them from here, so a change here changes them all.

- TAXES: which attribution rows (and model components) make up each tax;
- STATISTIC: the statistic every E2E is given as;
- PERTURBED: measuring cost above this share of a variant's plain E2E marks it perturbed (and fails the
  measurement check);
- TOLERANCE: the largest relative error of a variant's output against the float32 reference that passes;
- round_sizes: how n iterations are split into interleaved rounds (what the harness times, what the checks
  and comparisons split again).
"""

TAXES = {
    "bulk-synchronous": ("sync_wait", "exposed_transfer"),
    "data-locality": ("locality",),
    "kernel-launch": ("launch",),
}
STATISTIC = "interquartile mean"
PERTURBED = 0.03
TOLERANCE = 1e-2


def round_sizes(n: int, rounds: int) -> list[int]:
    """n iterations in `rounds` blocks as evenly as whole iterations allow: n // rounds each, the first
    n % rounds one more."""
    return [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]
