"""``fluid.core``: the names Fluid scripts reach through its core module."""
from __future__ import annotations

from pdjit.framework.errors import EOFException
from pdjit.runtime.place import CPUPlace, CUDAPinnedPlace, CUDAPlace, is_compiled_with_cuda
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor

__all__ = ["EOFException", "CPUPlace", "CUDAPlace", "CUDAPinnedPlace", "Scope", "LoDTensor",
           "is_compiled_with_cuda"]
