"""Every fused kernel at world 4 and 8 under Triton's interpreter with emulated ranks: the same
float32 references as at world 2, outputs poisoned first, two or three calls in a row (epochs, inbox
parities and the device-side epoch all move)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from rank_jobs import SMALL, ag_gemm_job, flash_decode_job

from taxes.kernels import ag_gemm as ag
from taxes.kernels.device import interpreting
from taxes.kernels.runtime import launch

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")]


@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("variant,cfg", [("fused-pull", SMALL), ("fused-push", SMALL), ("fused-push-graph", SMALL),
                                         ("fused-push", ag.replace(SMALL, producer="copy-engine"))],
                         ids=["pull", "push", "push-graph", "push-copy-engine"])
def test_ag_gemm_fused_at_world(variant, cfg, world):
    M, N, K = 16 * world, 8 * world, 32  # 16 rows per rank: one tile row and two flag chunks each
    errors = launch(ag_gemm_job, world, variant, cfg, M, N, K, "fp16", world, timeout_s=600)
    assert len(errors) == world
    for rank_errors in errors:
        assert len(rank_errors) == 2 and all(e < 1e-2 for e in rank_errors), rank_errors


@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("variant", ["fused-push", "fused-push-graph", "bsp"])
def test_flash_decode_at_world(variant, world):
    results = launch(flash_decode_job, world, variant, "flag", 1, 8, 2, 64, 24, "bf16", timeout_s=600)
    assert len(results) == world
    for errors, _ in results:
        assert len(errors) == 3 and all(e < 1e-2 for e in errors), errors
