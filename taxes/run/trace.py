"""`taxes trace -- COMMAND ...`: run any program with the profiler switched on from outside, then analyze it.

The program (also `torchrun ...`, one trace per rank) starts with taxes.run.trace_hook loaded through a
sitecustomize.py on PYTHONPATH, which finds its steps (optimizer.step(), taxes.step(), or an NVTX range),
times some without the profiler and profiles the next ones (see taxes.run.trace_hook). When the program has
ended, every rank's trace and plain step times are in OUT, and `taxes analyze` reads them, the profiler's
own cost shown as `measurement cost` (profiled step - plain step).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from signal import SIGINT, SIGKILL, SIGTERM

from taxes.errors import TaxesError

RECORDS = ("auto", "full", "timing")  # what the profiled steps record (taxes.run.trace_hook says what each costs)


def launches_ranks(command: list[str]) -> bool:
    """Does the command start several ranks (torchrun, or python -m torch.distributed.run / .launch)?"""
    head = [os.path.basename(a) for a in command[:1]] + command[1:4]
    return "torchrun" in head[:1] or any(a in ("torch.distributed.run", "torch.distributed.launch") for a in head)


def choose_record(command: list[str], record: str) -> tuple[str, str]:
    """`auto` -> (record, why): under torchrun the timing record (cupti-python), where it can record; otherwise
    the full one. On a host-bound DDP step the full record multiplied the step about 5x and its waits described
    the profiler; the timing record cost 15-31% (reports/known_answer/ddp-h100-x2.json), so the ranks' order at
    collectives stays the job's. Explicit choices pass through."""
    if record != "auto":
        return record, ""
    if not launches_ranks(command):
        return "full", ""  # one process: the full record (op names, shapes, locality)
    from taxes.run.cupti import available

    why = available()
    if why:
        return "full", f"several ranks, but the timing record cannot record here ({why}): the full record"
    return "timing", "several ranks: the timing record (cupti-python), whose cost leaves the ranks' order at collectives to the job"

SITECUSTOMIZE = """# written by taxes trace: load its step hook, then whatever sitecustomize this one hides
import importlib.util as _u, os as _os, sys as _sys
try:
    import taxes.run.trace_hook as _h
    _h.install()
except Exception as _e:  # never stop the user's program
    print(f"[taxes trace] hook not loaded: {type(_e).__name__}: {_e}", file=_sys.stderr)
_here = _os.path.dirname(_os.path.abspath(__file__))
_rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_spec = None
for _p in _rest:
    _f = _os.path.join(_p or ".", "sitecustomize.py")
    if _os.path.isfile(_f):
        _spec = _u.spec_from_file_location("_taxes_hidden_sitecustomize", _f)
        break
if _spec is not None:
    _spec.loader.exec_module(_u.module_from_spec(_spec))
"""


def run(command: list[str], out_dir: str, steps: int = 5, plain: int = 5, skip: int = 3, signal: str = "auto",
        timeout_s: float | None = None, record: str = "auto", block: int = 2) -> dict:
    """Run `command` with the hook; returns {"returncode", "traces": [paths], "plain": {rank: [us]},
    "steps_seen": {rank: n}}. Raises TaxesError (one line) when nothing usable was recorded."""
    if not command:
        raise TaxesError("trace: give the program to run after --, e.g. taxes trace -- python train.py")
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise TaxesError(f"trace: {command[0]!r}: no such program")
    if record not in RECORDS:
        raise TaxesError(f"trace: --record {record!r}: use {', '.join(RECORDS)}")
    record, why_record = choose_record(command, record)
    if why_record:
        from taxes.console import say

        say(f"taxes trace: --record auto: {why_record}")
    if record == "timing":
        from taxes.run.cupti import available

        why = available()
        if why:
            raise TaxesError(f"trace: --record timing records with cupti-python on a CUDA machine: {why}")
    if steps < 1 or plain < 0 or skip < 0 or block < 0:
        raise TaxesError("trace: --steps must be at least 1, --plain, --skip and --block at least 0")
    if signal != "auto" and signal != "optimizer" and signal != "taxes" and not signal.startswith("nvtx:"):
        raise TaxesError(f"trace: --step {signal!r}: use optimizer, taxes or nvtx:RANGE_NAME")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("rank*.json.gz")) + list(out.glob("plain_rank*.json")):  # traces and their .et.json.gz
        old.unlink()  # a trace of an earlier run must not pass for this one's
    with tempfile.TemporaryDirectory(prefix="taxes-trace-") as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = dict(os.environ)
        env["PYTHONPATH"] = hook_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.update(TAXES_TRACE_DIR=str(out.resolve()), TAXES_TRACE_STEPS=str(steps), TAXES_TRACE_PLAIN=str(plain),
                   TAXES_TRACE_SKIP=str(skip), TAXES_TRACE_STEP=signal, TAXES_TRACE_RECORD=record,
                   TAXES_TRACE_BLOCK=str(block))
        returncode = run_in_own_group(command, env, timeout_s)
    plain_by_rank, seen = {}, {}
    for f in sorted(out.glob("plain_rank*.json")):
        d = json.loads(f.read_text())
        plain_by_rank[int(d["rank"])] = [float(x) for x in d["plain_step_us"]]
        seen[int(d["rank"])] = int(d["steps_seen"])
    traces = sorted(str(p) for p in out.glob("rank*.json.gz") if not p.name.endswith(".et.json.gz"))
    if not traces:
        n = max(seen.values(), default=0)
        why = ("the step hook never loaded (is taxes installed in the program's Python?)" if not seen else
               f"it saw {n} step(s), too few to reach a profiled step after --skip {skip} and --plain {plain}; lower them, "
               "or mark steps with taxes.step() / --step nvtx:NAME")
        raise TaxesError(f"trace: no profiled steps ({why}); the program exited with {returncode}")
    return {"returncode": returncode, "traces": traces, "plain": plain_by_rank, "steps_seen": seen}


def run_in_own_group(command: list[str], env: dict, timeout_s: float | None) -> int:
    """Run the program in a process group of its own and return its exit code. Past timeout_s, or when this
    process is interrupted (Ctrl-C) or stopped (SIGTERM, SIGHUP: BaseExceptions from the command line's
    handlers), the whole group is ended, the program's own children too (torchrun's workers, a data
    loader's processes): SIGINT for Ctrl-C (which no longer reaches a group of its own from the terminal),
    SIGTERM otherwise, then SIGKILL to whatever is left after END_GRACE_S."""
    # a group of its own, still on the terminal (process_group keeps the session; Python 3.10 has setsid only)
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    try:
        proc = subprocess.Popen(command, env=env, **group)
    except OSError as e:
        raise TaxesError(f"trace: cannot run {command[0]!r}: {e.strerror or e}") from None
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(proc, SIGTERM)
        raise TaxesError(f"trace: the program ran past --timeout-s {timeout_s:g}; it was stopped with every "
                         "process it started") from None
    except BaseException as e:
        end_group(proc, SIGINT if isinstance(e, KeyboardInterrupt) else SIGTERM)
        raise


END_GRACE_S = 10.0  # how long the program's processes get to exit on their own before SIGKILL


def end_group(proc: subprocess.Popen, first: int) -> None:
    """Send `first` to the program's whole process group, then SIGKILL to the group after END_GRACE_S
    (at once if the program itself has exited but left processes behind); reap the program."""
    import time

    def signal_group(sig: int) -> bool:
        try:
            os.killpg(proc.pid, sig)  # the group's id is the program's pid
            return True
        except (ProcessLookupError, PermissionError):  # nobody left in the group
            return False

    if signal_group(first):
        deadline = time.monotonic() + END_GRACE_S
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        signal_group(SIGKILL)
    try:
        proc.wait(timeout=END_GRACE_S)
    except subprocess.TimeoutExpired:
        pass


def python_module_command(argv: list[str]) -> list[str]:
    """`taxes trace -- script.py args` runs the script with this Python."""
    if argv and argv[0].endswith(".py"):
        return [sys.executable] + argv
    return argv


def plain_for_analysis(plain_by_rank: dict) -> dict | None:
    """The plain step times to hand the analysis: None when no rank timed any (--plain 0), so the analysis
    runs without a measurement cost instead of refusing empty lists; otherwise as recorded."""
    return plain_by_rank if any(plain_by_rank.values()) else None
