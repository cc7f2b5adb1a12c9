"""The fused GEMM + reduce-scatter's device code (kernels/gemm_rs.py says why it looks as it does; its host
side binds and launches it)."""

from __future__ import annotations

import triton
import triton.language as tl

from taxes.kernels.sync import peer_ptr, signal, wait_at_least


@triton.jit
def _rs_tile(t, a_desc, w_desc, c_desc, staging_desc, inbox_desc, inbox_ptr, flags_ptr, bases, err_ptr, rank, epoch, N, K_local,
             shard_rows, num_m_shard, num_n, budget, chunk_blocks, WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, GROUP_M: tl.constexpr, WARP_SPEC: tl.constexpr, INTERPRET: tl.constexpr,
             DOT_F32: tl.constexpr, CE: tl.constexpr):
    """Tile t of the queue: the K loop, then push it to its owner (CE: store it in the local staging
    buffer), or (own rows) reduce and write out."""
    tiles_per_shard = num_m_shard * num_n
    owner = (rank + 1 + t // tiles_per_shard) % WORLD
    t_in = t % tiles_per_shard
    per_group = GROUP_M * num_n  # row blocks grouped GROUP_M at a time so W tiles are reused from L2
    first_m = (t_in // per_group) * GROUP_M
    size_m = tl.minimum(num_m_shard - first_m, GROUP_M)
    pm = first_m + (t_in % per_group) % size_m  # row block within the owner's shard
    pn = (t_in % per_group) // size_m
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    off_m = owner * shard_rows + pm * BM
    if WARP_SPEC:
        for k in tl.range(0, K_local, BK, warp_specialize=True):
            acc = tl.dot(a_desc.load([off_m, k]), w_desc.load([k, pn * BN]), acc)
    else:
        for k in range(0, K_local, BK):
            a = a_desc.load([off_m, k])
            b = w_desc.load([k, pn * BN])
            if DOT_F32:  # Triton 3.6's interpreter multiplies bf16 wrongly; float32 is exact there
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
            else:
                acc = tl.dot(a, b, acc)
    parity = epoch % 2
    if CE:
        parity = 0  # one inbox half: the copy engine's guard waits for the owner's previous reduction
    flag = pm * num_n + pn  # the tile's flag within one source's block of flags
    if CE:
        flag = pm // chunk_blocks  # the copy engine raises one flag per chunk of chunk_blocks row blocks
    if owner != rank:
        if CE:  # HBM speed: the CTA goes on at once, the copy engine moves the block later
            step = (owner - rank + WORLD) % WORLD
            staging_desc.store([(step - 1) * shard_rows + pm * BM, pn * BN], acc.to(staging_desc.dtype))
        else:
            rows = pm * BM + tl.arange(0, BM)
            cols = pn * BN + tl.arange(0, BN)
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = cols[None, :] < N
            slot = (rank - owner - 1 + WORLD) % WORLD
            dst = peer_ptr(inbox_ptr + (parity * (WORLD - 1) + slot) * shard_rows.to(tl.int64) * N, bases, rank, owner)
            tl.store(dst + offs, acc.to(inbox_ptr.dtype.element_ty), mask=mask)
            signal(peer_ptr(flags_ptr + slot * tiles_per_shard + flag, bases, rank, owner), epoch, "sys")
    else:
        for d in range(1, WORLD):  # rank-1 sent first, then rank-2, ...
            slot = (WORLD - 1) - d
            wait_at_least(flags_ptr + slot * tiles_per_shard + flag, epoch, err_ptr, budget, 1,
                          slot * tiles_per_shard + flag, "sys", INTERPRET)
            # TMA, not a pointer per element: 128 x 256 int64 addresses beside the float32 accumulator
            # spilled registers in every tile (255 registers and ~4 KB of spills, against 194 and none at
            # world 1)
            part = inbox_desc.load([(parity * (WORLD - 1) + slot) * shard_rows + pm * BM, pn * BN])
            acc += part.to(tl.float32)
        c_desc.store([pm * BM, pn * BN], acc.to(c_desc.dtype))


@triton.jit(do_not_specialize=["rank", "budget", "t_begin", "t_end", "chunk_blocks"])
def gemm_rs_fused_kernel(
    a_desc, w_desc, c_desc,  # TMA: local A (M x K/p), local W (K/p x N), out (M/p x N)
    staging_desc,  # TMA, CE only: (p-1) M/p x N local partials for the copy engine (else c_desc again)
    inbox_desc,  # TMA over the local inbox as 2 (p-1) M/p x N rows (world 1: c_desc again, never read)
    inbox_ptr, flags_ptr, bases, counters_ptr, err_ptr, done_ptr,  # done: CE only, epochs whose reduction ended
    rank, M, N, K_local, budget, t_begin, t_end,  # this launch takes tiles t_begin..t_end-1 of the queue
    chunk_blocks,  # CE: row blocks per copied chunk
    WORLD: tl.constexpr, GRID: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, WARP_SPEC: tl.constexpr, INTERPRET: tl.constexpr, DOT_F32: tl.constexpr,
    CE: tl.constexpr,
):
    # counters (one row of 3 per launch of a call): [0] next tile of the queue, [1] CTAs finished, [2] the
    # last finished call's epoch (on the device so a CUDA graph can replay the launch; the copy engine
    # copies it into the owner's flag); the last CTA to finish resets the queue.
    epoch = tl.load(counters_ptr + 2, volatile=True) + 1
    shard_rows = M // WORLD
    num_m_shard = shard_rows // BM
    num_n = tl.cdiv(N, BN)
    t = t_begin + tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
    while t < t_end:
        _rs_tile(t, a_desc, w_desc, c_desc, staging_desc, inbox_desc, inbox_ptr, flags_ptr, bases, err_ptr, rank, epoch, N,
                 K_local, shard_rows, num_m_shard, num_n, budget, chunk_blocks, WORLD, BM, BN, BK, GROUP_M, WARP_SPEC,
                 INTERPRET, DOT_F32, CE)
        t = t_begin + tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
    done = tl.atomic_add(counters_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == GRID - 1:
        if CE:
            tiles_per_shard = num_m_shard * num_n
            if t_end == WORLD * tiles_per_shard:  # the own rows' launch: this rank's inbox is free again
                tl.atomic_xchg(done_ptr + rank, epoch, sem="release", scope="sys")
            else:
                # The copy engine's guard: this launch ends (and the copy behind it starts) only once the
                # owner has reduced the previous call out of the inbox. A guard kernel on the copy stream
                # could not be scheduled while the spinning own-rows launch holds every SM.
                owner = (rank + 1 + t_begin // tiles_per_shard) % WORLD
                wait_at_least(peer_ptr(done_ptr + owner, bases, rank, owner), epoch - 1, err_ptr, budget, 2, owner,
                              "sys", INTERPRET)
        tl.store(counters_ptr, 0)
        tl.store(counters_ptr + 1, 0)
        tl.atomic_xchg(counters_ptr + 2, epoch, sem="release", scope="gpu")
