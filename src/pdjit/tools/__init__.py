"""What the ``pdjit`` command line does, one module per command (``pdjit.cli`` parses the
arguments): ``run`` and ``bench`` run a saved inference model through ``pdjit.inference``,
``inspect`` and ``graph`` describe a program. They use pdjit's public API only.

Every bad input (a missing or damaged file, a wrong input name, dtype or shape) is a
:class:`CliError` or one of pdjit's own errors; the command line prints it as one line naming the
file or variable and exits with status 2.
"""
from __future__ import annotations


class CliError(Exception):
    """Bad input to a command: printed as ``pdjit <command>: <message>``, exit status 2."""


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"1 op"``, ``"3 ops"``, ``"1,024 elements"``: ``n`` and ``word`` in agreement
    (``many``: the plural when it is not ``word + "s"``)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
