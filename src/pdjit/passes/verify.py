"""The program verifier: a program is checked before it is planned or after it is parsed.

(Being written: see issue 20.)
"""
from __future__ import annotations

__all__ = ["verify", "verify_for_run"]


def verify(program) -> None:
    """Check ``program``; raise :class:`pdjit.ProgramError` naming what is malformed."""
    return None


def verify_for_run(program) -> None:
    """Check ``program`` before the executor builds a run of it (once per program content)."""
    return None
