"""Which device activities are communication, and by which rule.

A kernel is communication when it moves data between GPUs, whatever library launched it. Each rule has a
name, which the timeline's `comm` column holds for every activity it classified (compute keeps ""), so a
report can say why a kernel counted as communication. Rules are tried in order; the first that matches wins:

    nccl          NCCL and RCCL kernels (ncclKernel_*, ncclDevKernel_*: every NCCL version's names)
    symm-mem      symmetric-memory and multimem kernels: PyTorch's symm_mem kernels (multimem_all_reduce,
                  one_shot / two_shot all-reduce, ...), the custom all-reduce kernels of vLLM / SGLang
                  (cross_device_reduce) and TensorRT-LLM (allreduce_fusion)
    symm-mem-op   any kernel launched inside a PyTorch symmetric-memory op (cpu op symm_mem::*)
    deepep        DeepEP's expert-parallel dispatch / combine kernels (deep_ep::*, notify_dispatch, ...)
    peer-copy     copy-engine copies between GPUs (Kineto's "Memcpy PtoP")
    pattern:REGEX a user's pattern (--comm-pattern, or a patterns file): a kernel whose name it searches
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from taxes.errors import TaxesError

MAX_PATTERNS_BYTES = 1 << 20


@dataclass(frozen=True)
class Rule:
    name: str
    kernel: re.Pattern | None = None  # searched in the activity's name
    op: re.Pattern | None = None  # searched in the name of a cpu op that holds the activity's launch
    kinds: tuple = ("kernel",)  # activity kinds the kernel pattern applies to


BUILTIN_RULES = (
    Rule("nccl", kernel=re.compile(r"nccl(Dev)?Kernel|^rccl|ncclDevFunc")),
    Rule("symm-mem", kernel=re.compile(r"multimem_|one_shot_(all_)?reduce|two_shot_(all_)?reduce|symm_mem|"
                                       r"cross_device_reduce|allreduce_fusion")),
    Rule("symm-mem-op", op=re.compile(r"^symm_mem::")),
    Rule("deepep", kernel=re.compile(r"deep_ep::|\b(cached_)?notify_(dispatch|combine)\b")),
    Rule("peer-copy", kernel=re.compile(r"Memcpy PtoP|Memcpy Peer"), kinds=("memcpy",)),
)


MAX_PATTERN_CHARS = 1000
MATCH_BUDGET_S = 5.0  # all kernel names of a rank against one user pattern, where a timer can interrupt


def user_rule(pattern: str) -> Rule:
    """A rule from a user's regular expression; a bad or dangerous one is one line (guard)."""
    text = pattern.strip()
    if not text:
        raise TaxesError("--comm-pattern: an empty pattern would match every kernel")
    if len(text) > MAX_PATTERN_CHARS:
        raise TaxesError(f"--comm-pattern {text[:40]!r}...: longer than {MAX_PATTERN_CHARS} characters")
    try:
        rx = re.compile(text)
    except (re.error, RecursionError, OverflowError) as e:
        raise TaxesError(f"--comm-pattern {text[:80]!r}: not a regular expression ({e})") from None
    why = backtracking_risk(text)
    if why:
        raise TaxesError(f"--comm-pattern {text[:80]!r}: {why}, which can take exponential time on a long kernel "
                         "name; write it without that (e.g. 'a+' for '(a+)+')")
    return Rule(f"pattern:{text}", kernel=rx, kinds=("kernel", "memcpy", "memset"))


def backtracking_risk(pattern: str) -> str | None:
    """Why a pattern's backtracking can blow up, or None: a repeat inside a repeat ('(a+)+', '(a*)*'), a
    repeated alternation whose branches can start alike ('(a|ab)*'), or a back-reference. Read off the
    parse tree of Python's own regular expression parser."""
    try:
        from re import _parser as parser  # Python 3.11+
    except ImportError:  # pragma: no cover - older Pythons
        import sre_parse as parser
    try:
        tree = parser.parse(pattern)
    except Exception:  # compile() already accepted it; leave the judgement to the timer
        return None
    c = parser  # the op codes live beside the parser
    repeats = {c.MAX_REPEAT, c.MIN_REPEAT} | ({c.POSSESSIVE_REPEAT} if hasattr(c, "POSSESSIVE_REPEAT") else set())

    def walk(items, inside_repeat: bool) -> str | None:
        for op, av in items:
            if op in repeats:
                lo, hi, body = av
                many = hi is c.MAXREPEAT or hi > 1  # the body is tried more than once
                if inside_repeat and (hi is c.MAXREPEAT or hi > lo):  # a repeat of variable length in one
                    return "a repeat inside a repeat"
                if many and _starts_alike(body, c):
                    return "a repeated alternation whose branches can start alike"
                found = walk(body, inside_repeat or many)
            elif op is c.SUBPATTERN:
                found = walk(av[-1], inside_repeat)
            elif op is c.BRANCH:
                found = next((w for b in av[1] if (w := walk(b, inside_repeat))), None)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                found = walk(av[1], inside_repeat)
            elif op is c.GROUPREF or op is getattr(c, "GROUPREF_EXISTS", None):
                found = "a back-reference"
            else:
                found = None
            if found:
                return found
        return None

    return walk(tree, False)


def _starts_alike(items, c) -> bool:
    """Whether a repeated body holds (directly or in groups) an alternation two of whose branches can match
    alike: both empty, the same first literal, or a first item that is not a plain literal."""
    for op, av in items:
        if op is c.SUBPATTERN and _starts_alike(av[-1], c):
            return True
        if op is c.BRANCH:
            firsts = []
            for b in av[1]:
                if not len(b):
                    firsts.append(None)
                elif b[0][0] is not c.LITERAL:
                    return True
                else:
                    firsts.append(b[0][1])
            if len(set(firsts)) < len(firsts):
                return True
    return False


def read_patterns_file(path, special: bool = False) -> list[str]:
    """A patterns file: one regular expression per line; blank lines and lines starting with # are skipped.
    At most MAX_PATTERNS_BYTES are read; FIFOs and devices only when `special`."""
    from taxes.traces.stream import read_side_file

    data = read_side_file(path, "patterns", MAX_PATTERNS_BYTES, special)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TaxesError(f"{path}: not a patterns file (not UTF-8 text)") from None
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def rules(patterns=()) -> tuple[Rule, ...]:
    return BUILTIN_RULES + tuple(user_rule(p) for p in patterns)


def classify(names, kinds, in_op: dict | None = None, rule_set: tuple[Rule, ...] = BUILTIN_RULES) -> np.ndarray:
    """The rule name per activity ("" for compute). names, kinds: arrays per activity; in_op: {rule name:
    boolean array}, True where the activity's launch lies inside a cpu op that rule's op pattern matches.
    Kernel patterns are tried once per distinct (name, kind)."""
    names = np.asarray(names, dtype=object)
    kinds = np.asarray(kinds, dtype=object)
    out = np.full(len(names), "", dtype=object)
    if not len(names):
        return out
    inverse, pairs = pd.MultiIndex.from_arrays([names.astype(str), kinds.astype(str)]).factorize()
    per_pair = np.full(len(pairs), "", dtype=object)
    with _time_limit(MATCH_BUDGET_S, rule_set):
        for i, pair in enumerate(pairs):
            name, kind = pair
            for r in rule_set:
                if r.kernel is not None and kind in r.kinds and r.kernel.search(name):
                    per_pair[i] = r.name
                    break
    by_name = per_pair[inverse]
    # op rules apply where no earlier kernel rule matched, in rule order
    order = {r.name: k for k, r in enumerate(rule_set)}
    best = np.array([order.get(x, len(rule_set)) if x else len(rule_set) for x in by_name])
    out[:] = by_name
    for r in rule_set:
        if r.op is None or not in_op or r.name not in in_op:
            continue
        hit = np.asarray(in_op[r.name], dtype=bool) & (best > order[r.name])
        out[hit] = r.name
        best[hit] = order[r.name]
    return out


class _PatternTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float, rule_set):
    """Stop the matching of user patterns after `seconds` with a one-line error. Python's matcher checks for
    signals as it runs, so a timer interrupts even a runaway backtrack; only the main thread of a process
    can take the timer (elsewhere backtracking_risk alone guards)."""
    users = [r.name for r in rule_set if r.name.startswith("pattern:")]
    if not users or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def stop(signum, frame):
        raise _PatternTimeout()

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _PatternTimeout:
        raise TaxesError(f"--comm-pattern: matching the kernel names took more than {seconds:.0f} s "
                         f"({', '.join(u[8:][:60] for u in users)}); simplify the pattern") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
