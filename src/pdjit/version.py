"""pdjit's version, the Fluid version whose API pdjit follows, and ``fluid.require_version``:
a leaf module (every layer may read the version without importing the others).

pdjit implements the user API of PaddlePaddle Fluid 1.8 (``fluid.layers``, ``fluid.Executor``,
the 1.x module paths and shapes). :data:`fluid_version` is that version: scripts that check the
installed Fluid version (the models repository's ``check_version()`` calls
``fluid.require_version('1.6.0')``) compare against it.
"""
from __future__ import annotations

import re

from pdjit.framework.errors import PdjitError

#: pdjit's own version
__version__ = "0.1.0"

#: the PaddlePaddle Fluid release whose API pdjit follows
fluid_version = "1.8.5"
major, minor, patch = (int(p) for p in fluid_version.split("."))
rc = 0
full_version = fluid_version
istaged = True

__all__ = ["require_version", "fluid_version", "VersionError"]

_FORMAT = re.compile(r"\d+(\.\d+){0,3}")


class VersionError(PdjitError):
    """The version a script requires is not the Fluid version pdjit follows."""


def _parts(version: str, arg: str) -> tuple:
    if not isinstance(version, str):
        raise TypeError(f"require_version: {arg} must be a str such as '1.8.0', got "
                        f"{type(version).__name__}")
    if not _FORMAT.fullmatch(version):
        raise ValueError(f"require_version: {arg} must be like '1.8', '1.8.0' or '1.8.0.0' "
                         f"(up to four numbers), got {version!r}")
    nums = [int(p) for p in version.split(".")]
    return tuple(nums + [0] * (4 - len(nums)))


def require_version(min_version, max_version=None) -> None:
    """Check that the Fluid API pdjit follows (:data:`fluid_version`) is at least
    ``min_version`` and, when given, at most ``max_version``; :class:`VersionError` if not."""
    low = _parts(min_version, "min_version")
    high = _parts(max_version, "max_version") if max_version is not None else None
    have = (major, minor, patch, rc)
    if high is not None and high < low:
        raise ValueError(f"require_version: max_version {max_version!r} is below min_version "
                         f"{min_version!r}")
    if have < low or (high is not None and have > high):
        want = f"in [{min_version}, {max_version}]" if high is not None else \
            f"{min_version} or higher"
        raise VersionError(f"VersionError: PaddlePaddle Fluid version {want} is required; "
                           f"pdjit follows the Fluid {fluid_version} API")
