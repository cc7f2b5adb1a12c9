"""The fused all-gather + GEMM's device code (kernels/ag_gemm.py says why it looks as it does; its host
side binds and launches it): the persistent GEMM with its tile queue, the copier CTAs, and the
copy-engine producer's guard."""

from __future__ import annotations

import triton
import triton.language as tl

from taxes.kernels.sync import globaltimer_ns, peer_ptr, signal, wait_at_least

CTA_TRACE_WORDS = tl.constexpr(6)  # traced fused kernel, per CTA (see ag_gemm_fused_kernel)


@triton.jit
def _copy_chunk(src, dst, n_elems, BLOCK: tl.constexpr):
    """dst[0:n] = src[0:n]: contiguous rows, wide vector loads and stores, by one CTA."""
    offs0 = tl.arange(0, BLOCK).to(tl.int64)
    for start in range(0, n_elems, BLOCK):
        offs = start + offs0
        mask = offs < n_elems
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _tile_coords(t, rank, num_m_shard, num_n, WORLD: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile t of the queue -> (row block, column block, source shard). Shards in the order their rows arrive
    (kernels/ag_gemm.py, queue_sources): rank, rank-1, rank-2, ...; within a shard, row blocks grouped
    GROUP_M at a time so W tiles are reused from L2."""
    tiles_per_shard = num_m_shard * num_n
    shard = (rank + WORLD - t // tiles_per_shard) % WORLD
    t_in = t % tiles_per_shard
    per_group = GROUP_M * num_n
    first_m = (t_in // per_group) * GROUP_M
    size_m = tl.minimum(num_m_shard - first_m, GROUP_M)
    pm = shard * num_m_shard + first_m + (t_in % per_group) % size_m
    pn = (t_in % per_group) // size_m
    return pm, pn, shard


@triton.jit
def _gemm_tile(u, a_desc, w_desc, c_desc, flags_ptr, err_ptr, trace_ptr, partials_ptr, tile_counts_ptr, rank, epoch,
               K, shard_rows, chunk_rows, n_chunks, num_m_shard, num_n, budget, WORLD: tl.constexpr,
               FLAG_SCOPE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
               SPLIT_K: tl.constexpr, WARP_SPEC: tl.constexpr, SPLIT_EPILOGUE: tl.constexpr, TRACE: tl.constexpr,
               INTERPRET: tl.constexpr, DOT_F32: tl.constexpr):
    """One work unit: slice u % SPLIT_K of K for output tile u // SPLIT_K. Wait for the chunks holding the
    tile's rows of A (peer rows only), then the K loop over the slice; with SPLIT_K > 1 the last slice of a
    tile to finish adds the others' float32 partials (_split_k_fixup) and stores the tile.
    Traced: the wait (ns) of a tile's first slice goes to trace_ptr[tile]. Returns the ns waited (0 untraced)."""
    t = u // SPLIT_K
    split = u % SPLIT_K
    pm, pn, shard = _tile_coords(t, rank, num_m_shard, num_n, WORLD, GROUP_M)
    waited = tl.zeros((), tl.int64)
    if shard != rank:
        if TRACE:
            t0 = globaltimer_ns(INTERPRET)
        r0 = pm * BM - shard * shard_rows
        for c in range(r0 // chunk_rows, (r0 + BM - 1) // chunk_rows + 1):
            wait_at_least(flags_ptr + shard * n_chunks + c, epoch, err_ptr, budget, 1, shard * n_chunks + c,
                          FLAG_SCOPE, INTERPRET)
        if TRACE:
            waited = globaltimer_ns(INTERPRET) - t0
    if TRACE:
        if split == 0:
            tl.store(trace_ptr + t, waited)
    off_m = pm * BM
    off_n = pn * BN
    k_slice = K // SPLIT_K
    k_lo = split * k_slice
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if WARP_SPEC:
        for k in tl.range(k_lo, k_lo + k_slice, BK, warp_specialize=True):
            acc = tl.dot(a_desc.load([off_m, k]), w_desc.load([k, off_n]), acc)
    else:
        for k in range(k_lo, k_lo + k_slice, BK):
            a = a_desc.load([off_m, k])
            b = w_desc.load([k, off_n])
            if DOT_F32:  # Triton 3.6's interpreter multiplies bf16 wrongly; float32 is exact there
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
            else:
                acc = tl.dot(a, b, acc)
    if SPLIT_K > 1:
        acc, last = _split_k_fixup(acc, t, split, partials_ptr, tile_counts_ptr, BM, BN, SPLIT_K)
        if last:
            _store_tile(acc, c_desc, off_m, off_n, BM, BN, SPLIT_EPILOGUE)
    else:
        _store_tile(acc, c_desc, off_m, off_n, BM, BN, SPLIT_EPILOGUE)
    return waited


@triton.jit
def _store_tile(acc, c_desc, off_m, off_n, BM: tl.constexpr, BN: tl.constexpr, SPLIT_EPILOGUE: tl.constexpr):
    """The output tile through TMA, whole or as two half-width stores (half the shared memory)."""
    if SPLIT_EPILOGUE:  # two half-width stores: half the shared memory for the output tile
        left, right = _halves(acc, BM, BN)
        c_desc.store([off_m, off_n], left.to(c_desc.dtype))
        c_desc.store([off_m, off_n + BN // 2], right.to(c_desc.dtype))
    else:
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def _halves(x, BM: tl.constexpr, BN: tl.constexpr):
    """An (BM, BN) tile as its left and right (BM, BN/2) halves."""
    return tl.split(tl.permute(tl.reshape(x, (BM, 2, BN // 2)), (0, 2, 1)))


@triton.jit
def _joined(left, right, BM: tl.constexpr, BN: tl.constexpr):
    """The (BM, BN) tile of two (BM, BN/2) halves (_halves' inverse)."""
    return tl.reshape(tl.permute(tl.join(left, right), (0, 2, 1)), (BM, BN))


@triton.jit
def _split_k_fixup(acc, t, split, partials_ptr, tile_counts_ptr, BM: tl.constexpr, BN: tl.constexpr,
                   SPLIT_K: tl.constexpr):
    """Split-K: every slice of tile t leaves its float32 partial in partials[t, split] and counts itself
    done; the last to count adds the other slices' partials to its own (in slice order), resets the tile's
    count for the next call and returns (sum, True). Others return (acc, False). At split_k 2 the sum is
    the same whichever slice is last; beyond, the last float32 bit may differ from run to run.
    The partials move a quarter of the tile's columns at a time: a whole float32 tile loaded beside the
    accumulator would not fit in registers (the first build spilled)."""
    Q: tl.constexpr = BN // 4
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, Q)[None, :]  # int32 within a tile
    base = partials_ptr + (t.to(tl.int64) * SPLIT_K) * (BM * BN)
    left, right = _halves(acc, BM, BN)
    q0, q1 = _halves(left, BM, BN // 2)
    q2, q3 = _halves(right, BM, BN // 2)
    mine = base + split * (BM * BN) + offs
    tl.store(mine, q0)
    tl.store(mine + Q, q1)
    tl.store(mine + 2 * Q, q2)
    tl.store(mine + 3 * Q, q3)
    tl.debug_barrier()  # every thread's part of the partial is stored before the count says so
    done = tl.atomic_add(tile_counts_ptr + t, 1, sem="acq_rel", scope="gpu")
    last = done == SPLIT_K - 1
    if last:
        for s in tl.static_range(SPLIT_K):
            if s != split:
                theirs = base + s * (BM * BN) + offs
                q0 += tl.load(theirs, cache_modifier=".cg")
                q1 += tl.load(theirs + Q, cache_modifier=".cg")
                q2 += tl.load(theirs + 2 * Q, cache_modifier=".cg")
                q3 += tl.load(theirs + 3 * Q, cache_modifier=".cg")
        tl.store(tile_counts_ptr + t, 0)  # every slice of this call has counted: none reads it again
    acc = _joined(_joined(q0, q1, BM, BN // 2), _joined(q2, q3, BM, BN // 2), BM, BN)
    return acc, last


@triton.jit(do_not_specialize=["rank", "budget"])
def ag_gemm_fused_kernel(
    a_desc, w_desc, c_desc,  # TMA: gathered A (M x K), local W (K x N_local), C (M x N_local)
    a_ptr, bases, flags_ptr, aux_ptr, counters_ptr, err_ptr, cta_trace_ptr, tile_trace_ptr, partials_ptr, tile_counts_ptr,
    rank, M, N_local, K, chunk_rows, budget,
    WORLD: tl.constexpr, PUSH: tl.constexpr, COPIERS: tl.constexpr, COPIERS_JOIN: tl.constexpr,
    EXTERNAL_PRODUCER: tl.constexpr, GRID: tl.constexpr, STATIC: tl.constexpr, WARP_SPEC: tl.constexpr,
    FLATTEN: tl.constexpr, SPLIT_EPILOGUE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
    COPY_BLOCK: tl.constexpr,
    TRACE: tl.constexpr, INTERPRET: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid = tl.program_id(0)
    # counters: [0] next tile of the queue, [1] CTAs finished, [2] the last finished call's epoch. The epoch
    # lives on the device so a CUDA graph can replay the launch; the last CTA to finish resets the queue.
    epoch = tl.load(counters_ptr + 2, volatile=True) + 1
    if TRACE:  # per CTA: start, end, ns waiting for data, ns waiting for peers ready/free, tiles, copies done
        tl.store(cta_trace_ptr + pid * CTA_TRACE_WORDS, globaltimer_ns(INTERPRET))
    peer_wait = tl.zeros((), tl.int64)
    data_wait = tl.zeros((), tl.int64)
    n_tiles_done = tl.zeros((), tl.int64)
    shard_rows = M // WORLD
    n_chunks = shard_rows // chunk_rows
    FLAG_SCOPE: tl.constexpr = "sys" if (PUSH or EXTERNAL_PRODUCER) else "gpu"

    # -- pull: announce that this rank's rows are ready for the peers to read
    if not PUSH and WORLD > 1 and not EXTERNAL_PRODUCER:
        if pid == 0:
            for d in range(1, WORLD):
                peer = (rank + d) % WORLD
                signal(peer_ptr(aux_ptr + rank, bases, rank, peer), epoch, "sys")

    # -- copiers: move chunks, flag each one; items ordered by when the GEMM needs them
    if COPIERS > 0 and WORLD > 1:
        if pid < COPIERS:
            n_items = (WORLD - 1) * n_chunks
            waited = 0
            for item in range(pid, n_items, COPIERS):
                d = item // n_chunks + 1
                c = item % n_chunks
                # push: to rank+1 first (who reads rank's rows right after its own); pull: from rank-1 first
                peer = (rank + d) % WORLD if PUSH else (rank + WORLD - d) % WORLD
                if PUSH:
                    # my rows -> peer's a_full, once the peer has finished reading its previous call
                    if waited < d:
                        if TRACE:
                            t0 = globaltimer_ns(INTERPRET)
                        wait_at_least(aux_ptr + peer, epoch - 1, err_ptr, budget, 2, peer, "sys", INTERPRET)
                        if TRACE:
                            peer_wait += globaltimer_ns(INTERPRET) - t0
                        waited = d
                    row0 = rank * shard_rows + c * chunk_rows
                    src = a_ptr + row0.to(tl.int64) * K
                    _copy_chunk(src, peer_ptr(src, bases, rank, peer), chunk_rows.to(tl.int64) * K, COPY_BLOCK)
                    signal(peer_ptr(flags_ptr + rank * n_chunks + c, bases, rank, peer), epoch, "sys")
                else:
                    # peer's rows -> my a_full, once the peer said they are ready
                    if waited < d:
                        if TRACE:
                            t0 = globaltimer_ns(INTERPRET)
                        wait_at_least(aux_ptr + peer, epoch, err_ptr, budget, 2, peer, "sys", INTERPRET)
                        if TRACE:
                            peer_wait += globaltimer_ns(INTERPRET) - t0
                        waited = d
                    row0 = peer * shard_rows + c * chunk_rows
                    dst = a_ptr + row0.to(tl.int64) * K
                    _copy_chunk(peer_ptr(dst, bases, rank, peer), dst, chunk_rows.to(tl.int64) * K, COPY_BLOCK)
                    signal(flags_ptr + peer * n_chunks + c, epoch, "gpu")
            if TRACE:
                tl.store(cta_trace_ptr + pid * CTA_TRACE_WORDS + 5, globaltimer_ns(INTERPRET))

    # -- the GEMM: a persistent loop over tiles, this rank's rows first
    num_m_shard = shard_rows // BM
    num_n = tl.cdiv(N_local, BN)
    num_units = WORLD * num_m_shard * num_n * SPLIT_K  # a tile's K slices are consecutive units
    first_gemm_pid = 0 if COPIERS_JOIN else COPIERS
    if pid >= first_gemm_pid:
        if STATIC:  # fixed round-robin: unit u goes to program first_gemm_pid + u % (GRID - first_gemm_pid)
            for u in tl.range(pid - first_gemm_pid, num_units, GRID - first_gemm_pid, flatten=FLATTEN):
                data_wait += _gemm_tile(u, a_desc, w_desc, c_desc, flags_ptr, err_ptr, tile_trace_ptr, partials_ptr,
                                        tile_counts_ptr, rank, epoch, K, shard_rows, chunk_rows, n_chunks, num_m_shard,
                                        num_n, budget, WORLD, FLAG_SCOPE, BM, BN, BK, GROUP_M, SPLIT_K, WARP_SPEC,
                                        SPLIT_EPILOGUE, TRACE, INTERPRET, DOT_F32)
                n_tiles_done += 1
        else:  # a queue: an atomic counter whose epoch-relative value is the next unit
            u = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
            while u < num_units:
                data_wait += _gemm_tile(u, a_desc, w_desc, c_desc, flags_ptr, err_ptr, tile_trace_ptr, partials_ptr,
                                        tile_counts_ptr, rank, epoch, K, shard_rows, chunk_rows, n_chunks, num_m_shard,
                                        num_n, budget, WORLD, FLAG_SCOPE, BM, BN, BK, GROUP_M, SPLIT_K, WARP_SPEC,
                                        SPLIT_EPILOGUE, TRACE, INTERPRET, DOT_F32)
                n_tiles_done += 1
                u = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")

    # -- the last CTA to finish: push tells every peer this rank is done reading its a_full; then the
    # queue is reset and the epoch published (no CTA of this call touches the counters any more)
    done = tl.atomic_add(counters_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == GRID - 1:
        if PUSH and WORLD > 1:
            for d in range(1, WORLD):
                peer = (rank + d) % WORLD
                signal(peer_ptr(aux_ptr + rank, bases, rank, peer), epoch, "sys")
        tl.store(counters_ptr, 0)
        tl.store(counters_ptr + 1, 0)
        tl.atomic_xchg(counters_ptr + 2, epoch, sem="release", scope="gpu")
    if TRACE:
        row = cta_trace_ptr + pid * CTA_TRACE_WORDS
        tl.store(row + 1, globaltimer_ns(INTERPRET))
        tl.store(row + 2, data_wait)
        tl.store(row + 3, peer_wait)
        tl.store(row + 4, n_tiles_done)




# Triton specialises integer arguments equal to 1 or divisible by 16: an epoch or rank passed plainly
# would compile (and load) a new kernel mid-run, and loading a module while a spinning kernel holds the
# GPU deadlocks against the peer. Per-call values are therefore never specialised.
@triton.jit(do_not_specialize=["rank", "budget"])
def wait_peers_kernel(aux_ptr, stamp_ptr, rank, err_ptr, budget, WORLD: tl.constexpr, INTERPRET: tl.constexpr):
    """The copy-engine producer's guard, on the copy stream before a call's copies: e = the call's epoch
    (stamp + 1: the guard runs once per call, so it counts calls as the GEMM's counters do, on the device,
    and a CUDA graph can replay it); wait until every peer reported it finished reading call e - 1
    (aux >= e - 1); then stamp = e, the value the flag copies behind it carry.

    The epoch is not read from the GEMM's counters: this call's GEMM may already have finished (its peers'
    rows arrived) and published e before the guard runs; the guard would then wait for call e to end on
    the peers, which waits for this guard's copies."""
    epoch = tl.load(stamp_ptr, volatile=True) + 1
    for d in range(1, WORLD):
        peer = (rank + d) % WORLD
        wait_at_least(aux_ptr + peer, epoch - 1, err_ptr, budget, 2, peer, "sys", INTERPRET)
    tl.store(stamp_ptr, epoch)
