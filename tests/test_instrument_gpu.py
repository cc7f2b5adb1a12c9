"""On one GPU under the cupti-python clock: a fused variant's recorded block, then a CUDA graph variant's.

The fused kernels' per-call stamps are kept on the device between iterations (taxes.run.instrument). Kept
with a device-to-device copy_, the graph replays of the block after ended in "unspecified launch failure"
every time (one H200, flash decode at B=1, 2 and 4, S=4K to 32K); with an elementwise copy they run. The
failing pair takes about 20 s."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
                       reason="needs a CUDA GPU and TRITON_INTERPRET unset"),
]


def test_a_graph_variant_after_a_fused_one_under_the_cupti_clock():
    pytest.importorskip("cupti")
    import taxes

    res = taxes.profile("flash-decode", "B=2,S=4096", gpus=1, variants=["fused-push", "bsp-graph"], iters=20,
                        rounds=2, clock="cupti", timeout_s=120)
    doc = res.document
    cases = doc["cases"]
    assert len(cases) == 1
    by_variant = {v["variant"]: v for v in cases[0]["variants"]}
    assert set(by_variant) == {"fused-push", "bsp-graph"}
    for name, v in by_variant.items():
        assert v["correctness"]["passed"], name
        assert v["samples_us"] and v["attribution"], name
