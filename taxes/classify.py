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

import re
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


def user_rule(pattern: str) -> Rule:
    """A rule from a user's regular expression; a bad one is one line."""
    text = pattern.strip()
    if not text:
        raise TaxesError("--comm-pattern: an empty pattern would match every kernel")
    try:
        rx = re.compile(text)
    except re.error as e:
        raise TaxesError(f"--comm-pattern {text[:80]!r}: not a regular expression ({e})") from None
    return Rule(f"pattern:{text}", kernel=rx, kinds=("kernel", "memcpy", "memset"))


def read_patterns_file(path) -> list[str]:
    """A patterns file: one regular expression per line; blank lines and lines starting with # are skipped."""
    p = Path(path)
    try:
        data = p.read_bytes()[: MAX_PATTERNS_BYTES + 1]
    except OSError as e:
        raise TaxesError(f"{path}: cannot read the patterns file ({e.strerror or e})") from None
    if len(data) > MAX_PATTERNS_BYTES:
        raise TaxesError(f"{path}: larger than 1 MiB; not a patterns file")
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
