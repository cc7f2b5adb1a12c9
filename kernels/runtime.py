"""The rank launcher that every fused kernel runs on, and the arenas of its symmetric heap (the heap
itself, a rank's context and RankError: taxes.kernels.rank).

Two backends give the arenas:
- cuda: one buffer from PyTorch symmetric memory (torch.distributed._symmetric_memory.empty, then
  rendezvous), peers mapped through get_buffer. NVLink multicast is never used.
- emulated: CPU tensors in shared memory, allocated before the rank processes fork, so they sit at the
  same address in every rank; kernels run under Triton's interpreter
  (TRITON_INTERPRET=1), which reads and writes a peer's arena like its own. Timings mean nothing there;
  the logic is the same code.

`launch(fn, world, backend=...)` starts one process per rank, runs fn(ctx) in each, and returns the
ranks' results. It never waits forever: a rank that raises, dies or overruns its time budget ends the
whole run with one RankError line naming the rank and what it was doing (its last `ctx.doing(...)`); a
rank still running at the deadline writes its threads' stacks to a file, which that line names.
Ranks never outlive the launcher: every exit path (error, Ctrl-C, the launcher itself killed) stops and
reaps them, so no orphan keeps a GPU. Under torchrun (RANK, WORLD_SIZE and LOCAL_RANK set) with the cuda
backend, `launch` runs fn in the calling process as that rank instead (see `launch`).
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import socket
import tempfile
import time
import traceback

import torch

from taxes.kernels.device import interpreting
from taxes.kernels.rank import RankContext, RankError, StartGate, SymmetricHeap

# Multicast objects can take a shared host's GPUs down: keep them off in every process we start.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# A collective that fails or outlives the process group's timeout ends its process (3: tear down without
# aborting the communicator, which can itself hang on a dead peer), so a dead peer ends the others.
# Set only where the user has not chosen otherwise.
NCCL_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
REAP_GRACE_S = 5.0  # how long a rank gets to exit after SIGTERM before SIGKILL


# ---- the launcher ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGKILL this rank when the launcher dies, even by SIGKILL, so no orphan
    rank keeps running (or keeps a GPU). Elsewhere a no-op."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the launcher died before the request above took effect
        os._exit(1)


STACKS_SIGNAL = signal.SIGUSR1  # the launcher's request to a late rank: write your threads' stacks
STACKS_WAIT_S = 2.0  # how long the launcher waits for the late ranks' stacks before stopping them


def _rank_main(rank, world, backend, fn, args, results, doing, port, arenas, barrier, scratch, heap_bytes, timeout_s,
               parent_pid, stacks_dir):
    import faulthandler

    _die_with_parent(parent_pid)
    # Ctrl-C in a terminal reaches every process of the group: the launcher alone handles it (it stops and
    # reaps the ranks), so a rank never dies half-way through a collective on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(SAFE_ENV)
    for k, v in NCCL_DEFAULTS.items():
        os.environ.setdefault(k, v)
    # If this rank is still running at the launcher's deadline, the launcher asks (STACKS_SIGNAL) where it is
    # stuck: the answer goes to a file of its own (the launcher gathers them and names the result), never to
    # the terminal. faulthandler writes it from the signal handler, in C, even while the rank is inside C code.
    stacks = open(os.path.join(stacks_dir, f"rank{rank}.txt"), "w")
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    try:
        if backend == "cuda":
            ctx = _cuda_context(rank, world, rank, heap_bytes, timeout_s, f"tcp://127.0.0.1:{port}")
        else:
            torch.set_num_threads(1)
            ctx = RankContext(rank, world, "emulated", SymmetricHeap(rank, world, arenas), torch.device("cpu"), barrier,
                              _scratch=scratch)
        ctx._doing = doing
        out = fn(ctx, *args)
        results.put((rank, "ok", out))
    except BaseException as e:  # report every failure as one line, with the traceback for debugging
        tb = traceback.format_exc(limit=-8)
        results.put((rank, "error", _one_line(e), tb))
    finally:
        faulthandler.unregister(STACKS_SIGNAL)
        stacks.close()
        if backend == "cuda":
            _end_process_group()


def _one_line(e: BaseException) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text[:500]


def _end_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a broken group (dead peer) cannot always be torn down cleanly; the process ends anyway
            pass


def _cuda_context(rank, world, local_rank, heap_bytes, timeout_s, init_method) -> RankContext:
    """Process group (NCCL, with a timeout: a collective a dead peer never joins ends within it) and the
    symmetric heap on GPU `local_rank`."""
    import datetime

    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), device_id=dev)
    arena = symm_mem.empty(heap_bytes, dtype=torch.uint8, device=dev)
    handle = symm_mem.rendezvous(arena, group=dist.group.WORLD.group_name)
    arenas = [arena if r == rank else handle.get_buffer(r, (heap_bytes,), torch.uint8, 0) for r in range(world)]
    return RankContext(rank, world, "cuda", SymmetricHeap(rank, world, arenas, keepalive=handle), dev,
                       _gate=_start_gate(rank, world, dev))


def _start_gate(rank: int, world: int, dev) -> StartGate | None:
    """The ranks' StartGate: rank 0 makes the page, every rank maps it and proves that it sees the others' writes
    (a process may see a /dev/shm of its own), and nothing is left behind. Tried as an anonymous file (memfd,
    which the others open through rank 0's /proc entry), then a file in /dev/shm, then in the temporary folder,
    removed once every rank has mapped it (never the user's folders). None on every rank where no place gives
    one page to all (then the iterations start from dist.barrier, and rank 0 says so)."""
    import secrets

    import torch.distributed as dist

    why = []
    # rank 0's places, on every rank: each try below is a collective, so every rank must make as many
    places = [[StartGate.MEMFD] + list(dict.fromkeys(f for f in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(f)))]
    dist.broadcast_object_list(places, src=0)
    for place in places[0]:
        fd, path, gate = -1, None, None
        if rank == 0:
            try:
                fd, path = StartGate.create(world, place)
            except (OSError, AttributeError) as e:  # AttributeError: no memfd on this system
                why.append(f"{place}: {getattr(e, 'strerror', None) or e}")
        names = [path]
        dist.broadcast_object_list(names, src=0)
        if names[0] is None:
            continue
        try:
            if rank != 0:
                fd = os.open(names[0], os.O_RDWR)
            gate = StartGate(fd, rank, world)
        except (OSError, ValueError) as e:
            why.append(f"{place}: rank {rank}: {getattr(e, 'strerror', None) or e}")
        if rank != 0 and fd >= 0:
            os.close(fd)
        token = secrets.randbits(62) + 1
        if gate is not None:
            gate.mark(token)
        tokens = [None] * world
        dist.all_gather_object(tokens, token if gate is not None else None)  # also: every rank has opened it
        if rank == 0:  # rank 0's fd is what the others opened a memfd by: closed only now
            if fd >= 0:
                os.close(fd)
            if path is not None and place != StartGate.MEMFD:
                os.unlink(path)
        shared = gate is not None and all(t is not None and gate.marked(r) == t for r, t in enumerate(tokens))
        ok = torch.tensor([1 if shared else 0], device=dev)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item():
            gate.mark(0)
            gate.place = place
            return gate
        if gate is not None:
            if not shared:
                why.append(f"{place}: rank {rank} does not see the others' writes")
            gate.close()
    everyone = [None] * world
    dist.all_gather_object(everyone, why)
    if rank == 0:
        why = [w for ws in everyone for w in ws]
        print("taxes: the ranks share no start gate (" + "; ".join(why or ["no place"]) + "): iterations start "
              "from dist.barrier", file=sys.stderr)
    return None


def launch(fn, world: int, *args, backend: str = "emulated", heap_bytes: int = 64 << 20, timeout_s: float = 600.0):
    """Run fn(ctx, *args) on `world` ranks, one process each; return [result of rank 0, 1, ...].

    emulated: forks (fn may be any function); the arenas are shared memory made here, before the fork.
    cuda: spawns fresh interpreters (fn must be importable), one GPU per rank, NCCL and symmetric memory;
    the process group's timeout is timeout_s.
    cuda under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set): no processes are started; this process is
    rank RANK on GPU LOCAL_RANK, runs fn once, and every rank returns the same list of all ranks' results
    (gathered, so results must be picklable). A rank whose fn raises raises RankError at once without
    gathering; torchrun then stops the others. A rank still running after timeout_s dumps its stack and
    exits with code 1.
    Raises RankError naming the first rank that failed, died or overran timeout_s (a rank that died
    without reporting is named before ranks that failed after it). Ctrl-C (KeyboardInterrupt) stops and
    reaps every rank, then propagates."""
    if backend == "cuda":
        here = torchrun_rank()
        if here is not None:
            return _launch_here(fn, world, args, here, heap_bytes, timeout_s)
    return _launch_processes(fn, world, args, backend, heap_bytes, timeout_s)


def _launch_processes(fn, world, args, backend, heap_bytes, timeout_s):
    import multiprocessing as mp

    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise RankError(f"world must be a positive whole number of ranks, not {world!r}")
    if backend == "cuda":
        _require_gpus(world, world)
        ctx_mp = mp.get_context("spawn")
        arenas, barrier, scratch = None, None, None
    elif backend == "emulated":
        if not interpreting():
            raise RankError("emulated ranks run kernels under Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
        ctx_mp = mp.get_context("fork")
        arenas = [torch.zeros(heap_bytes, dtype=torch.uint8).share_memory_() for _ in range(world)]
        barrier = ctx_mp.Barrier(world)
        scratch = torch.zeros(world, 64, dtype=torch.float64).share_memory_()
    else:
        raise ValueError(f"unknown backend {backend!r}")
    os.environ.update(SAFE_ENV)
    results = ctx_mp.Queue()
    doing = _SharedText(ctx_mp, world)
    port = _free_port()
    stacks_dir = tempfile.mkdtemp(prefix="taxes-ranks-")
    procs = [ctx_mp.Process(target=_rank_main, args=(r, world, backend, fn, args, results, doing, port, arenas, barrier,
                                                     scratch, heap_bytes, timeout_s, os.getpid(), stacks_dir), daemon=True)
             for r in range(world)]
    out: dict[int, object] = {}
    errors: dict[int, str] = {}  # rank -> its one-line error, in order of arrival

    def collect(wait_s: float) -> None:
        """Move what the ranks reported into out/errors; wait up to wait_s for the first item."""
        try:
            item = results.get(timeout=wait_s)
        except queue.Empty:
            return
        while True:
            rank, status = item[0], item[1]
            if status == "error":
                if os.environ.get("TAXES_DEBUG"):
                    print(item[3])
                errors.setdefault(rank, item[2])
            else:
                out[rank] = item[2]
            try:
                item = results.get_nowait()
            except queue.Empty:
                return

    def silent_dead() -> list[int]:
        return [r for r, p in enumerate(procs) if p.exitcode is not None and r not in out and r not in errors]

    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        while len(out) < world:
            collect(0.2)
            dead = silent_dead()
            if dead:
                collect(2.0)  # a rank that exited after reporting has flushed its report: take it before judging
                dead = silent_dead()
            if dead:  # died without a word: the likeliest cause of whatever the others report
                r = dead[0]
                raise RankError(f"rank {r} died ({_exit_text(procs[r].exitcode)}) while {doing.get(r, 'starting')}; "
                                f"the other ranks were stopped")
            if errors:
                r, line = next(iter(errors.items()))
                raise RankError(f"rank {r} failed while {doing.get(r, 'starting')}: {line}")
            if time.monotonic() > deadline:
                late = [r for r in range(world) if r not in out]
                stacks = gather_stacks(stacks_dir, {r: procs[r] for r in late})
                raise RankError(f"rank {late[0]} did not finish within {timeout_s:g} s (it was {doing.get(late[0], 'starting')}); "
                                f"the ranks were stopped" + (f"; their stacks: {stacks}" if stacks else ""))
    finally:
        _reap(procs)
        _remove_tree(stacks_dir)
    return [out[r] for r in range(world)]


def gather_stacks(stacks_dir: str, late: dict) -> str | None:
    """Ask each late rank ({rank: process}) for its threads' stacks (STACKS_SIGNAL: each writes its own file
    in stacks_dir), wait up to STACKS_WAIT_S for them, and put them in one file, each under its rank's
    heading, in the system's temporary directory. Its path, or None when no rank answered."""
    for p in late.values():
        try:
            os.kill(p.pid, STACKS_SIGNAL)
        except (ProcessLookupError, TypeError):  # exited meanwhile, or never started
            pass
    files = {r: os.path.join(stacks_dir, f"rank{r}.txt") for r in late}
    deadline = time.monotonic() + STACKS_WAIT_S
    while time.monotonic() < deadline and not all(_size(f) for f in files.values()):
        time.sleep(0.05)
    time.sleep(0.1)  # a dump is written line by line: let the last lines land
    parts = []
    for r, path in files.items():
        try:
            with open(path, errors="replace") as f:
                text = f.read(1 << 20)  # a stack dump is a few kB; never hold more
        except OSError:
            continue
        if text.strip():
            parts.append(f"rank {r}: its threads' stacks at the deadline (most recent call first)\n{text}")
    if not parts:
        return None
    fd, path = tempfile.mkstemp(prefix="taxes-stacks-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(parts))
    return path


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _exit_text(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _reap(procs) -> None:
    """Stop every rank still running (SIGTERM, then SIGKILL after REAP_GRACE_S) and wait for all of them,
    so none is left behind; a second Ctrl-C does not interrupt this."""
    import threading

    shield = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if shield else None
    try:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + REAP_GRACE_S
        for p in started:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in started:
            if p.exitcode is None:
                p.kill()
        for p in started:
            p.join(REAP_GRACE_S)
    finally:
        if shield:
            signal.signal(signal.SIGINT, old)


def _require_gpus(world: int, need_index: int) -> None:
    if not torch.cuda.is_available():
        raise RankError("no CUDA GPU here: use backend='emulated' (Triton interpreter) instead")
    if torch.cuda.device_count() < need_index:
        raise RankError(f"{world} ranks need {need_index} GPUs on this host; this machine has {torch.cuda.device_count()}")


# ---- torchrun: this process is one rank ----------------------------------------------------------


def torchrun_rank() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when torchrun started this process (RANK, WORLD_SIZE and LOCAL_RANK
    set), else None. Malformed values are a RankError."""
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    if not all(os.environ.get(k) for k in keys):
        return None
    try:
        rank, size, local = (int(os.environ[k]) for k in keys)
    except ValueError:
        raise RankError("torchrun environment is malformed: " + ", ".join(f"{k}={os.environ[k]!r}" for k in keys)) from None
    if size < 1 or not 0 <= rank < size or local < 0:
        raise RankError("torchrun environment is inconsistent: " + ", ".join(f"{k}={os.environ[k]}" for k in keys))
    return rank, size, local


def _launch_here(fn, world, args, here, heap_bytes, timeout_s, make_context=None):
    """launch() under torchrun: run fn as this process's rank; every rank returns every rank's result."""
    rank, size, local = here
    if size != world:
        raise RankError(f"torchrun started {size} processes but this run asks for {world} ranks: "
                        f"start it with torchrun --nproc-per-node {world}")
    if make_context is None:
        local_size = os.environ.get("LOCAL_WORLD_SIZE")
        if local_size is not None and local_size != str(size):
            raise RankError(f"rank {rank}: the {size} ranks span more than one host (LOCAL_WORLD_SIZE={local_size}); "
                            f"symmetric memory needs every rank on one host")
        _require_gpus(world, local + 1)
        os.environ.update(SAFE_ENV)
        for k, v in NCCL_DEFAULTS.items():
            os.environ.setdefault(k, v)

        def make_context():
            return _cuda_context(rank, world, local, heap_bytes, timeout_s, "env://")

    return _run_here(fn, args, rank, world, make_context, timeout_s)


def _run_here(fn, args, rank, world, make_context, timeout_s):
    """Build this rank's context, run fn, gather every rank's result. Bounded: past timeout_s the process
    dumps its stack and exits (code 1), which the launcher of the ranks (torchrun) sees."""
    import faulthandler

    import torch.distributed as dist

    doing: dict[int, str] = {}
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    try:
        try:
            ctx = make_context()
            ctx._doing = doing
            result = fn(ctx, *args)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)  # no kernel of ours still touches a peer's arena
        except Exception as e:
            raise RankError(f"rank {rank} failed while {doing.get(rank, 'starting')}: {_one_line(e)}") from e
        doing[rank] = "gathering every rank's result"
        gathered = [None] * world
        try:
            dist.all_gather_object(gathered, result)
        except Exception as e:  # a peer failed (it raised RankError and left) or died
            raise RankError(f"rank {rank} finished but could not gather the others' results (a peer failed or died): "
                            f"{_one_line(e)}") from e
        return gathered
    finally:
        faulthandler.cancel_dump_traceback_later()
        _end_process_group()


class _SharedText:
    """A tiny shared 'what is rank r doing' board for forked ranks."""

    def __init__(self, ctx_mp, world, width=200):
        self.width = width
        self.buf = ctx_mp.Array("c", world * width, lock=False)

    def __setitem__(self, rank, text):
        b = text.encode()[: self.width - 1]
        self.buf[rank * self.width:(rank + 1) * self.width] = b + b"\0" * (self.width - len(b))

    def get(self, rank, default=None):
        raw = bytes(self.buf[rank * self.width:(rank + 1) * self.width]).split(b"\0", 1)[0]
        return raw.decode(errors="replace") or default
