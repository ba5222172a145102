"""Fluid's ``backward`` module: ``append_backward`` and ``gradients`` (pdjit.passes.backward)."""
from pdjit.passes.backward import append_backward, gradients

__all__ = ["append_backward", "gradients"]
