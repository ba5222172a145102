"""Checkpoints, the Fluid way: ``save``/``load`` (``.pdparams``, ``.pdopt``, ``.pdmodel``),
``load_program_state``/``set_program_state``.

(Being written: see issue 22.)
"""
from __future__ import annotations

__all__: list = []
