"""``fluid.install_check.run_check()``: a short self-test of an installation.

(Being written: see issue 22.)
"""
from __future__ import annotations
