"""``fluid.name_scope``: a prefix for the names of the ops appended inside it.

``with fluid.name_scope("encoder"):`` records ``/encoder/`` in the ``op_namescope`` attribute
(one of the framework attributes every op may carry) of each op appended inside it, to any
program; scopes nest (``/encoder/layer/``), and reusing a prefix in the same parent scope
numbers it as Fluid does (``/encoder_1/``). Ops appended outside every scope carry no
``op_namescope`` (Fluid writes ``/``, the attribute's default), so programs built without scopes
serialise as before. The scope names ops for people and tools reading the program; it changes
nothing that runs.
"""
from __future__ import annotations

import contextlib
import threading

__all__ = ["name_scope"]


class _Scope:
    def __init__(self, name: str = "", parent: "_Scope | None" = None):
        self.name, self.parent = name, parent
        self._children: dict = {}
        parts, s = [], self
        while s is not None:
            parts.append(s.name)
            s = s.parent
        self.full_name = "/".join(reversed(parts)) + "/"

    def child(self, prefix: str) -> "_Scope":
        n = self._children.get(prefix, 0)
        self._children[prefix] = n + 1
        return _Scope(prefix if n == 0 else f"{prefix}_{n}", self)


_root = _Scope()
_state = threading.local()  # each thread builds programs in its own scopes


def _current() -> _Scope:
    return getattr(_state, "scope", _root)


def current() -> str | None:
    """The ``op_namescope`` of an op appended now: None outside every scope."""
    scope = _current()
    return None if scope is _root else scope.full_name


@contextlib.contextmanager
def name_scope(prefix=None):
    """Name the ops appended inside the ``with`` block ``/<outer scopes>/<prefix>/`` (their
    ``op_namescope`` attribute). ``prefix`` must be a non-empty string."""
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"name_scope: prefix must be a non-empty string, got {prefix!r}")
    if "/" in prefix:
        raise ValueError(f"name_scope: prefix must not contain '/', got {prefix!r} (nest "
                         f"name_scope blocks instead)")
    outer = _current()
    _state.scope = outer.child(prefix)
    try:
        yield
    finally:
        _state.scope = outer
