"""The fused all-gather + GEMM's persistent tile queue, run as the kernel runs it (kernels/ag_gemm_kernel.py):
one CTA per SM takes the next tile of one queue (an atomic counter), waits until the chunks holding the tile's
rows of A have arrived, then computes it; copier CTAs first move rows, then join the queue.

The model prices the fused kernel from this rather than from the GEMM as one server: a wave that does not
fill the GPU, a chunk of rows that feeds fewer tiles than there are SMs and the SMs the copiers hold all fall
out of it, and it gives each CTA's own wait, which is what the attribution reads off the kernel's stamps (the
longest any CTA waited: taxes.run.measure.longest_wait_ns). docs/model.md gives the formulas.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueRun:
    """One run of the queue, us from the kernel's start."""

    finish_us: float  # the last tile's end
    longest_wait_us: float  # the most any one CTA waited for rows, summed over its tiles
    total_wait_us: float  # every CTA's waits together


def tile_order(world: int, m_blocks: int, n_blocks: int, group_m: int) -> list[tuple[int, int]]:
    """(source shard's queue position, row block within the shard) of each tile, in queue order, the same on
    every rank: the shards in the order their rows arrive (position 0 is the rank's own shard, then rank-1's,
    rank-2's, ...), within a shard row blocks grouped group_m at a time, the rows of a group cycling fastest
    (the kernel's _tile_coords)."""
    order = []
    per_group = max(1, group_m) * n_blocks
    for position in range(world):
        for t_in in range(m_blocks * n_blocks):
            first_m = (t_in // per_group) * max(1, group_m)
            size_m = min(m_blocks - first_m, max(1, group_m))
            order.append((position, first_m + (t_in % per_group) % size_m))
    return order


def run_queue(ready_us: Sequence[float], tile_us: float, ctas: int, busy_until_us: Sequence[float] = ()) -> QueueRun:
    """Tiles taken in queue order by whichever CTA is free first (ties: the lowest CTA); tile i can start at
    ready_us[i], runs tile_us. busy_until_us: when each of the first CTAs (the copiers) joins the queue; the
    others start at 0. A CTA waits from when it took a tile to when the tile's rows are ready."""
    if ctas <= 0:
        raise ValueError("a persistent kernel needs at least one CTA")
    free = [(float(busy_until_us[c]) if c < len(busy_until_us) else 0.0, c) for c in range(ctas)]
    heapq.heapify(free)
    waited = [0.0] * ctas
    finish = 0.0
    for ready in ready_us:
        at, c = heapq.heappop(free)
        start = max(at, ready)
        waited[c] += start - at
        end = start + tile_us
        finish = max(finish, end)
        heapq.heappush(free, (end, c))
    return QueueRun(finish, max(waited, default=0.0), math.fsum(waited))
