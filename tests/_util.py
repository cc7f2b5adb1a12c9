"""Helpers shared by the test modules (not fixtures)."""

from __future__ import annotations

import base64
import io
import os
import random
import re
import struct
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_one_line(message: str) -> None:
    assert message, "empty error message"
    assert "\n" not in message and "\r" not in message, f"error message is not one line: {message!r}"


def compiled_for_hopper(script: str, *args) -> str:
    """What `script` writes when run in a child process without TRITON_INTERPRET (the tests run under the
    interpreter, whose kernels cannot be compiled): a kernel compiled for sm_90, or a line starting
    "CANNOT" when this Triton build has no CUDA toolchain, which skips the calling test."""
    import pytest

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.startswith("CANNOT"):  # no CUDA toolchain in this Triton build: nothing to check here
        pytest.skip(out.stdout.strip())
    return out.stdout


def png_header_size(data: bytes) -> tuple[int, int]:
    """(width, height) read straight from the PNG's IHDR chunk."""
    assert data[:8] == PNG_SIGNATURE, f"not a PNG: starts with {data[:8]!r}"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def assert_valid_png(data: bytes, min_px: int = 100, max_px: int = 10000) -> np.ndarray:
    """The bytes are a PNG that matplotlib reads back, of a plausible size, and not a blank canvas."""
    import matplotlib.image as mpimg

    width, height = png_header_size(data)
    assert min_px <= width <= max_px and min_px <= height <= max_px, (width, height)
    img = mpimg.imread(io.BytesIO(data), format="png")
    assert img.shape[:2] == (height, width)
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    colours = np.unique(img.reshape(-1, img.shape[2])[::7], axis=0)
    assert len(colours) > 10, "the image is (nearly) a single colour"
    return img


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI in-process through its own main() (which always ends in sys.exit)."""
    import pytest

    from taxes.cli.main import cli

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(list(args))
    out, err = capsys.readouterr()
    code = exc.value.code
    return (0 if code is None else code), out, err


def profile_doc(rng: random.Random, n_iter: int = 21):
    """A synthetic measured document: 2 cases x 2 variants, 2 ranks of samples each, per-rank rows that add up
    to each variant's attributed E2E (its plain E2E plus a measurement cost)."""
    from taxes.documents import results
    from taxes.attribution.attribute import ROWS as COMPONENTS
    from taxes.workloads import make_workload

    doc = results.new_document({"kind": "profile", "tool_version": "0.1.0", "world_size": 2,
                                "hardware_profile": "h200-sxm", "gpu_names": ["GPU0", "GPU1"]})
    for name in ("ag-gemm", "flash-decode"):
        variants = []
        for v in ("bsp", "fused-pull"):
            samples = [[rng.uniform(100, 200) for _ in range(n_iter)] for _ in range(2)]
            e2e = results.summarize_samples(samples)
            attributed = e2e["iqm"] * rng.uniform(1.0, 1.05)
            comps = []
            for r in (0, 1, None):
                share = [rng.uniform(0, 1) for _ in COMPONENTS]
                comps += [{"name": c, "rank": r, "value_us": attributed * x / sum(share), "label": "derived"}
                          for c, x in zip(COMPONENTS, share)]
            phases = [{"rank": r, "name": f"k{i}", "role": "compute", "start_us": 10.0 * i, "end_us": 10.0 * i + 5,
                       "label": "measured", "parts": {}} for r in (0, 1) for i in range(3)]
            variants.append({"variant": v, "config": {}, "samples_us": samples, "e2e_us": e2e,
                             "plain_e2e_us": e2e["iqm"], "attributed_e2e_us": attributed,
                             "measurement_cost_us": attributed - e2e["iqm"],
                             "attribution": {"available": True, "clock": "cupti"},
                             "correctness": {"checked": True, "passed": True, "rel_error": 1e-3, "tolerance": 1e-2,
                                             "reference": "fp32"},
                             "phases": phases, "components": comps})
        doc["cases"].append(results.case_entry(make_workload(name, {}, 2), variants))
    return results.validate(doc)


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def assert_valid_svg(data: bytes) -> None:
    """The bytes are an SVG document (XML with an svg root, a size) holding no script and no external
    reference."""
    from xml.etree import ElementTree as ET

    root = ET.fromstring(data)
    assert root.tag.endswith("svg"), root.tag
    assert root.get("width") and root.get("height")
    text = data.decode("utf-8")
    assert "<script" not in text.lower()
    # references stay inside the drawing (#id) or are data; namespace names are not fetched
    assert not re.search(r'(?:href|src)\s*=\s*"(?!#|data:)', text) and "url(http" not in text
    assert len(list(root.iter())) > 20, "an (almost) empty drawing"


def assert_self_contained_html(text: str, n_images: int) -> None:
    """No external resource: every image is an embedded SVG or PNG (data: URI) whose bytes are a real one."""
    assert text.lstrip().lower().startswith("<!doctype html>") and text.rstrip().endswith("</html>")
    parser = _Tags()
    parser.feed(text)
    for tag, attrs in parser.tags:
        for key in ("src", "href", "data"):
            val = (attrs.get(key) or "").strip().lower()
            assert not val.startswith(("http:", "https:", "//", "file:")), (tag, key, val[:60])
    assert not any(t == "script" for t, a in parser.tags)  # no script at all
    assert not any(t == "link" for t, a in parser.tags)  # no external stylesheet
    imgs = [a for t, a in parser.tags if t == "img"]
    assert len(imgs) == n_images
    for a in imgs:
        m = re.fullmatch(r"data:image/(png|svg\+xml);base64,([A-Za-z0-9+/=]+)", a["src"])
        assert m, a["src"][:60]
        data = base64.b64decode(m.group(2), validate=True)
        if m.group(1) == "png":
            assert data.startswith(PNG_SIGNATURE)
        else:
            assert_valid_svg(data)
        assert a.get("alt")
    assert len(re.findall(r'<img [^>]*src="data:image/(?:png|svg\+xml);base64,', text)) == n_images
