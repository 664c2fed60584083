"""CuPy-only fast paths (fused elementwise kernels and the like); see numpy_fast for the rules."""

from __future__ import annotations
