"""Make this checkout importable as `taxes`, with kernels/ serving as taxes.kernels, without installing
it (the GPU machine gets a bare copy of the working tree). Benchmarks import this first."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import taxes  # noqa: E402

try:
    import taxes.kernels  # noqa: F401
except ModuleNotFoundError:
    taxes.__path__.append(str(ROOT))
