"""Where per-rank work runs: worker processes of this machine, or the workers of a Dask cluster.

Both run the same per-rank functions (taxes.attribution.analyze). `start(fn, args)` runs fn once per rank and returns
handles to the results, each kept where it was made: in this process for the local pool (the pool's
workers send their results back), on the worker that made it for Dask (nothing is sent). `each(fn,
handles, args)` runs fn(result, *args) where each result lives and brings back only what fn returns: the
small per-rank tables. `then(fn, handles, args)` makes a new result from each the same way and returns
handles to those (a result is never changed in place: the stage that changes it makes a new one). Light steps of the local pool run here, in turn; heavy ones (heavy=True) in the
pool, one rank per worker.

Dask is optional (`pip install 'taxes[dask]'`): it is imported only when a scheduler address is given
(`--scheduler ADDRESS`, or DASK_SCHEDULER_ADDRESS). The workers must import the same taxes and read the
trace paths as given (a shared file system).
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ProcessPoolExecutor

from taxes.errors import TaxesError
from taxes.sanitize import printable

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
CONNECT_TIMEOUT_S = 30


def jobs_for(jobs: int | None, n: int) -> int:
    """Worker processes: as asked, else one per core; never more than there are ranks."""
    return max(1, min(jobs or os.cpu_count() or 1, n))


class LocalRanks:
    """The ranks on this machine: results come back here; heavy steps run in a process pool."""

    def __init__(self, jobs: int):
        self.jobs = jobs

    def start(self, fn, args: list[tuple]) -> list:
        return self._map(fn, args, heavy=True)

    def each(self, fn, handles: list, args: list[tuple] | None = None, heavy: bool = False) -> list:
        return self._map(fn, [(h, *a) for h, a in zip(handles, args or [()] * len(handles))], heavy)

    def then(self, fn, handles: list, args: list[tuple] | None = None) -> list:
        return self.each(fn, handles, args)

    def _map(self, fn, args: list[tuple], heavy: bool) -> list:
        if not heavy or self.jobs <= 1 or len(args) <= 1:
            return [fn(*a) for a in args]
        with ProcessPoolExecutor(max_workers=min(self.jobs, len(args))) as pool:
            return list(pool.map(_call, [(fn, a) for a in args]))

    def close(self) -> None:
        pass


def _call(fa):
    fn, a = fa
    return fn(*a)


class DaskRanks:
    """The ranks on a Dask cluster's workers: each rank's record stays on the worker that read it."""

    def __init__(self, address: str):
        try:
            from distributed import Client
        except ImportError:
            raise TaxesError("--scheduler needs Dask's distributed scheduler: pip install 'taxes[dask]'") from None
        shown = printable(address, 120)
        try:
            self.client = Client(address, timeout=f"{CONNECT_TIMEOUT_S}s", set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise TaxesError(f"--scheduler {shown}: cannot reach a Dask scheduler there ({printable(str(e), 160)})") from None
        self.held: list = []

    def start(self, fn, args: list[tuple]) -> list:
        futures = [self.client.submit(fn, *a, pure=False) for a in args]
        self.held += futures
        return futures

    def each(self, fn, handles: list, args: list[tuple] | None = None, heavy: bool = False) -> list:
        futures = [self.client.submit(fn, h, *a, pure=False) for h, a in zip(handles, args or [()] * len(handles))]
        try:
            return self.client.gather(futures)
        finally:
            for f in futures:
                f.release()

    def then(self, fn, handles: list, args: list[tuple] | None = None) -> list:
        futures = [self.client.submit(fn, h, *a, pure=False) for h, a in zip(handles, args or [()] * len(handles))]
        self.held += futures
        for h in handles:  # the new results depend on them; once made, the old ones are not needed
            self.held.remove(h)
            h.release()
        return futures

    def close(self) -> None:
        for f in self.held:
            f.release()
        self.client.close()


@contextlib.contextmanager
def runner(scheduler: str | None, jobs: int | None, n: int):
    """The place the ranks run for one analysis: a Dask cluster when `scheduler` (an address) is given,
    else a local pool of jobs_for(jobs, n) workers."""
    run = DaskRanks(scheduler) if scheduler else LocalRanks(jobs_for(jobs, n))
    try:
        yield run
    finally:
        run.close()
