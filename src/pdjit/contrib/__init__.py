"""``fluid.contrib``: the Fluid 1.x contributed APIs that pdjit has (``contrib.layers``)."""
from pdjit.contrib import layers

__all__ = ["layers"]
