"""Run-time checks: NaN/Inf in op outputs (``PDJIT_CHECK_NAN_INF``), allocation limits
(``PDJIT_MAX_ALLOC_BYTES``).

(Being written: see issue 20.)
"""
from __future__ import annotations
