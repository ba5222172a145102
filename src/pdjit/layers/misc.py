"""(Being written: see issue 22.)"""
from __future__ import annotations

__all__: list = []
