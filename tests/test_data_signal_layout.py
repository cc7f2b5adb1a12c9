"""The fused combine's data-signal poll compiled for Hopper (no GPU needed): every tile it polls must hold
no value in two threads. A reduction over a tile with copies counts one copy per group of threads, so a
copy that still held the sentinel went on into the merge as NaN (benchmarks/data_signal_stress.py on one
H100: 4 to 57 calls in 1000 before, none in 3000 after; kernels/flash_decode.py, poll_rows)."""

import json
import re

import pytest
from _util import compiled_for_hopper

from taxes.kernels.flash_decode import COMBINE_WARPS, poll_rows

# Compiled in a child process: the tests run under TRITON_INTERPRET, whose kernels cannot be compiled.
COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from taxes.kernels import flash_decode as fd
G, D, rows, warps = (int(a) for a in sys.argv[1:5])
sig = {"inbox_ptr": "*fp32", "out_ptr": "*bf16", "flags_ptr": "*i32", "err_ptr": "*i32", "state_ptr": "*i32",
       "trace_ptr": "*i64", "rank": "i32", "R": "i32", "n_blocks": "i32", "budget": "i64"}
cx = {"WORLD": 2, "D": D, "G": G, "G_POW2": rows, "DATA_SIGNAL": True, "SENTINEL": fd.SENTINEL_BITS, "TRACE": False,
      "INTERPRET": False}
sig.update({k: "constexpr" for k in cx})
src = triton.compiler.ASTSource(fn=fd.fused_combine_kernel, signature=sig, constexprs=cx)
try:
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
except Exception as e:
    print("CANNOT", str(e).splitlines()[0][:120])
    sys.exit(0)
sys.stdout.write(k.asm["ttgir"])
"""

BLOCKED = re.compile(r"^(#blocked\d*) = #ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], threadsPerWarp = \[([\d, ]+)\], "
                     r"warpsPerCTA = \[([\d, ]+)\]", re.M)
VOLATILE_LOAD = re.compile(r"tt\.load [^\n]*\{isVolatile = true\} : tensor<([\dx]+)x!tt\.ptr<\w+>, (#blocked\d*|#ttg\.slice"
                           r"<\{dim = (\d+), parent = (#blocked\d*)\}>)>")


def _ttgir(G: int, D: int, rows: int, warps: int = COMBINE_WARPS) -> str:
    return compiled_for_hopper(COMPILE, G, D, rows, warps)


def polled_tiles_with_copies(ttgir: str) -> tuple[int, list[str]]:
    """(volatile tensor loads, those whose layout gives some value to more than one thread)."""
    layouts = {m[1]: [[int(x) for x in m[i].split(",")] for i in (2, 3, 4)] for m in BLOCKED.finditer(ttgir)}
    loads = VOLATILE_LOAD.findall(ttgir)
    bad = []
    for shape_s, layout, sliced, parent in loads:
        shape = [int(x) for x in shape_s.split("x")]
        spt, tpw, wpc = layouts[parent or layout]
        dims = list(range(len(spt)))
        if sliced:
            k = int(sliced)
            if tpw[k] * wpc[k] > 1:  # the threads along the sliced dimension hold the same values
                bad.append(f"{shape_s} {layout}")
                continue
            dims.remove(k)
        if any(spt[i] * tpw[i] * wpc[i] > n for i, n in zip(dims, shape)):  # the layout wraps: copies
            bad.append(f"{shape_s} {layout}")
    return len(loads), bad


@pytest.mark.parametrize("G,D", [(8, 64), (8, 128), (4, 64), (1, 64), (1, 128)])
def test_data_signal_polls_tiles_without_copies(G, D):
    n, bad = polled_tiles_with_copies(_ttgir(G, D, poll_rows(G, D, COMBINE_WARPS)))
    assert n >= 4, "the poll's volatile loads (values and log-sum-exps, before and inside the loop) not found"
    assert not bad, f"polled with copies: {json.dumps(bad)}"


def test_the_check_sees_copies_in_a_tile_of_one_row():
    # one query head per group in a one-row tile (the rows before poll_rows): 64 values for 128 threads
    n, bad = polled_tiles_with_copies(_ttgir(1, 64, 1))
    assert n >= 4 and bad

