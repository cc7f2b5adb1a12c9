"""The mark for tests that need ranks emulated under Triton's interpreter."""

from __future__ import annotations

import pytest

from taxes.kernels.device import interpreting


emulated = pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")
