"""The bounded wait compiled for Hopper (PTX, no GPU needed): every branch of its loop must be taken by
the whole CTA (kernels/sync.py says why). A per-thread clock read or a per-thread volatile load of the
error word, followed by a branch, hung an 8-warp kernel on the GPU when a peer stayed silent."""

import re

import pytest
from _util import compiled_for_hopper

# Compiled in a child process: the tests run under TRITON_INTERPRET, whose kernels cannot be compiled.
COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from taxes.kernels import sync
sig = {"flags_ptr": "*i32", "index": "i32", "target": "i32", "err_ptr": "*i32", "budget": "i64",
       "SCOPE": "constexpr", "INTERPRET": "constexpr"}
src = triton.compiler.ASTSource(fn=sync.wait_flag_kernel, signature=sig, constexprs={"SCOPE": "sys", "INTERPRET": False})
try:
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": int(sys.argv[1])})
except Exception as e:
    print("CANNOT", str(e).splitlines()[0][:120])
    sys.exit(0)
sys.stdout.write(k.asm["ptx"])
"""


def _wait_kernel_ptx(num_warps: int) -> str:
    return compiled_for_hopper(COMPILE, num_warps)


@pytest.mark.parametrize("num_warps", [1, 4, 8])
def test_wait_loop_branches_only_on_cta_uniform_values(num_warps):
    ptx = _wait_kernel_ptx(num_warps)
    # the error word is read with a scalar atomic (broadcast to the CTA), never a per-thread load
    assert "ld.volatile" not in ptx
    # every clock read is one of cta_clock_ns's lanes: 1024 lanes over 32 * num_warps threads, two call
    # sites (the start of the wait and the check in the loop), each followed by the cross-warp reduction
    reads = ptx.count("%globaltimer")
    assert reads == 2 * 1024 // (32 * num_warps), reads
    for m in re.finditer(r"%globaltimer", ptx):
        after = ptx[m.end():]
        branch = re.search(r"@%p\d+ bra|bra\.uni", after)
        # across warps the reduction needs shared memory and a CTA barrier; one warp reduces with shuffles
        combine = after.find("bar.sync" if num_warps > 1 else "shfl.sync")
        assert combine != -1 and (branch is None or combine < branch.start()), "a branch follows a raw clock read"
