"""``fluid.name_scope``: a prefix for the names of the ops appended inside it.

``with fluid.name_scope("encoder"):`` records ``/encoder/`` in the ``op_namescope`` attribute
(one of the framework attributes every op may carry) of each op appended inside it to the
default main and startup programs; scopes nest (``/encoder/layer/``), and reusing a prefix in
the same parent scope numbers it as Fluid does (``/encoder_1/``). Ops appended outside every
scope carry no ``op_namescope`` (Fluid writes ``/``, the attribute's default), so programs
built without scopes serialise as before.

The scope is written when the ``with`` block exits, on the ops added inside it to the programs
that were the defaults when it was entered (a program guarded and left again inside the block
is not seen). It names ops for people and tools reading the program; it
changes nothing that runs.
"""
from __future__ import annotations

import contextlib

__all__ = ["name_scope"]

_ATTR = "op_namescope"


class _Scope:
    def __init__(self, name: str = "", parent: "_Scope | None" = None):
        self.name, self.parent = name, parent
        self._children: dict = {}

    def child(self, prefix: str) -> "_Scope":
        n = self._children.get(prefix, 0)
        self._children[prefix] = n + 1
        return _Scope(prefix if n == 0 else f"{prefix}_{n}", self)

    def full_name(self) -> str:
        parts, s = [], self
        while s is not None:
            parts.append(s.name)
            s = s.parent
        return "/".join(reversed(parts)) + "/"


_root = _Scope()
_current = _root


def _full_name_scope() -> str:
    """The current scope as ``op_namescope`` spells it: ``/`` outside every scope, else
    ``/outer/inner/``."""
    return _current.full_name()


def _default_programs() -> list:
    from pdjit.framework.program import default_main_program, default_startup_program

    return [default_main_program(), default_startup_program()]


def _op_ids(program) -> dict:
    # the ops themselves are kept, so that no op appended later can reuse a seen id
    return {id(op): op for block in program.blocks for op in block.ops}


@contextlib.contextmanager
def name_scope(prefix=None):
    """Name the ops appended inside the ``with`` block ``/<outer scopes>/<prefix>/`` (their
    ``op_namescope`` attribute). ``prefix`` must be a non-empty string."""
    global _current
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"name_scope: prefix must be a non-empty string, got {prefix!r}")
    if "/" in prefix:
        raise ValueError(f"name_scope: prefix must not contain '/', got {prefix!r} (nest "
                         f"name_scope blocks instead)")
    scope = _current.child(prefix)
    programs = _default_programs()
    before = {id(p): _op_ids(p) for p in programs}
    _current = scope
    try:
        yield
    finally:
        _current = scope.parent
        name = scope.full_name()
        for p in programs:
            seen = before[id(p)]
            for block in p.blocks:
                for op in block.ops:
                    # ops of an inner scope were named when it exited
                    if id(op) not in seen and (not op.has_attr(_ATTR) or op.attr(_ATTR) == "/"):
                        op._set_attr(_ATTR, name)
