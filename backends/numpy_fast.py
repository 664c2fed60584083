"""NumPy-only fast paths. Each function mirrors a generic Array API implementation elsewhere,
which stays the reference; layers reach these through ``backend.fast`` and fall back when absent.
"""

from __future__ import annotations

import numpy as np  # noqa: F401
