"""Data loading, the Fluid way: ``DataLoader.from_generator``, ``PyReader`` and the reader
decorators ``batch``, ``shuffle``, ``buffered``.

(Being written: see issue 22.)
"""
from __future__ import annotations

__all__: list = []
