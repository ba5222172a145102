"""``fluid.name_scope``: a prefix for the names of the ops appended inside it.

(Being written: see issue 22.)
"""
from __future__ import annotations

__all__: list = []
