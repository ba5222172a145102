"""The layer functions' argument checks as pdjit errors that name the user's line.

A layer checks its arguments with plain ``ValueError``/``TypeError`` raises (in its module or
in what it builds with, e.g. ``ParamAttr``);
:func:`with_user_line` wraps each public layer function so that such an error, raised by the
code of this package, reaches the user as a :class:`~pdjit.framework.errors.LayerInputError`
(or :class:`~pdjit.framework.errors.LayerTypeError`) carrying the same message and the file and
line of the user's call. Errors raised outside pdjit (NumPy, the user's own callbacks) and
pdjit's own errors pass through unchanged.
"""
from __future__ import annotations

import functools
import os
import sys

from pdjit.framework.errors import LayerInputError, LayerTypeError, PdjitError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _raised_here(tb) -> bool:
    """Whether the innermost frame of ``tb`` (where the error was raised) is pdjit's (a layer,
    or what it builds with: ``ParamAttr``, initializers)."""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE + os.sep)


def _user_location() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_PACKAGE + os.sep):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def with_user_line(fn):
    """``fn``, whose argument checks raise pdjit errors naming the caller's line."""

    @functools.wraps(fn)
    def layer(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as e:
            if isinstance(e, PdjitError) or e.__traceback__ is None \
                    or not _raised_here(e.__traceback__):
                raise
            cls = LayerTypeError if isinstance(e, TypeError) else LayerInputError
            raise cls(str(e), _user_location()).with_traceback(e.__traceback__) from None

    return layer


def wrap_all(namespace: dict, names) -> None:
    """Wrap the functions among ``names`` in ``namespace`` (a module's globals) in place, and
    in the module that defines each (``layers.nn.fc is layers.fc`` stays true)."""
    for name in names:
        fn = namespace.get(name)
        module = getattr(fn, "__module__", None) or ""
        if not (module.startswith("pdjit.layers") and type(fn).__name__ == "function") \
                or hasattr(fn, "__wrapped__"):
            continue
        wrapped = namespace[name] = with_user_line(fn)
        home = sys.modules.get(module)
        if home is not None and getattr(home, name, None) is fn:
            setattr(home, name, wrapped)
