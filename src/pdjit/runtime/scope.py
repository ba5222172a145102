"""Scopes: where variable values live at run time (seed 004: one Scope per block, nested).

A ``Scope`` maps names to :class:`ScopeVar` holders; lookups fall back to the parent scope.
Values are NumPy arrays, :class:`LoDTensor`, or lists (tensor arrays, step scopes).
"""
from __future__ import annotations

import contextlib

import numpy as np

from pdjit.runtime.tensor import LoDTensor


class ScopeVar:
    """A named slot in a scope; ``value`` is ``None`` until something is written."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value=None):
        self.name, self.value = name, value

    def get_tensor(self) -> "_BoundTensor":
        """A tensor view whose ``set`` writes into this variable (Fluid's API)."""
        return _BoundTensor(self)

    def is_initialized(self) -> bool:
        return self.value is not None

    def __repr__(self):
        v = self.value
        desc = "empty" if v is None else (f"{v.dtype}{list(v.shape)}" if isinstance(v, np.ndarray)
                                          else repr(v))
        return f"ScopeVar({self.name!r}: {desc})"


class _BoundTensor(LoDTensor):
    def __init__(self, holder: ScopeVar):
        v = holder.value
        super().__init__(v._array if isinstance(v, LoDTensor) else v,
                         v.lod() if isinstance(v, LoDTensor) else None)
        self._holder = holder

    def _on_set(self):
        self._holder.value = LoDTensor(self._array, self._lod) if self._lod else self._array


#: bumped whenever a scope gains or loses a variable: while it is unchanged, the ScopeVar a
#: lookup found is the one it would find again (a step keeps its parameters' ScopeVars:
#: ``pdjit.runtime.steps.NativeStep``)
LAYOUT = [0]


class Scope:
    def __init__(self, parent: "Scope | None" = None):
        self.parent = parent
        self._vars: dict[str, ScopeVar] = {}
        self._kids: list[Scope] = []

    def var(self, name: str) -> ScopeVar:
        """The variable ``name`` of this scope, created empty if needed."""
        v = self._vars.get(name)
        if v is None:
            v = self._vars[name] = ScopeVar(name)
            LAYOUT[0] += 1
        return v

    def find_var(self, name: str) -> ScopeVar | None:
        s = self
        while s is not None:
            v = s._vars.get(name)
            if v is not None:
                return v
            s = s.parent
        return None

    def find_local_var(self, name: str) -> ScopeVar | None:
        return self._vars.get(name)

    def local_var_names(self) -> list:
        return list(self._vars)

    def erase(self, names) -> None:
        for n in names:
            self._vars.pop(n, None)
        LAYOUT[0] += 1

    def new_scope(self) -> "Scope":
        kid = Scope(self)
        self._kids.append(kid)
        return kid

    def drop_kids(self) -> None:
        self._kids.clear()

    def kids(self) -> list:
        return list(self._kids)

    def __contains__(self, name: str) -> bool:
        return self.find_var(name) is not None

    def __repr__(self):
        return f"Scope({len(self._vars)} vars, {len(self._kids)} kids)"


_global_scope = Scope()


def global_scope() -> Scope:
    return _global_scope


@contextlib.contextmanager
def scope_guard(scope: Scope):
    """Within the guard, ``global_scope()`` is ``scope``."""
    global _global_scope
    if not isinstance(scope, Scope):
        raise TypeError(f"scope_guard: expected a Scope, got {type(scope).__name__}")
    old, _global_scope = _global_scope, scope
    try:
        yield
    finally:
        _global_scope = old
