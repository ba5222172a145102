"""The errors pdjit raises, and how they name the op or variable at fault.

Every error about an op says which op (type, block, index) and where the user created it (the
last frame of its ``op_callstack`` outside pdjit); every error about a variable names it; and
both say what was expected and what was got.
"""
from __future__ import annotations

import os
import sys

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PdjitError(Exception):
    """Base class of pdjit's own errors."""


class ProgramError(PdjitError, ValueError):
    """A program is malformed: refused while it is built, loaded or verified."""


class OpError(PdjitError):
    """An op failed (while its shape was inferred or while it ran).

    ``op_type``, ``block_idx``, ``op_idx`` and ``location`` identify it; ``reason`` is the
    message without the op's description.
    """

    def __init__(self, reason: str, op_type: str, block_idx: int | None, op_idx: int | None,
                 location: str | None):
        self.reason, self.op_type = reason, op_type
        self.block_idx, self.op_idx, self.location = block_idx, op_idx, location
        super().__init__(f"{describe_op(op_type, block_idx, op_idx, location)}: {reason}")


class OpShapeError(OpError, ProgramError):
    """An op's inputs do not fit it (raised at build time by infer_shape)."""


class OpRunError(OpError, RuntimeError):
    """An op failed while it ran."""


class LoopLimitError(OpRunError):
    """A ``while`` op ran more iterations than ``PDJIT_MAX_LOOP_ITERATIONS`` allows (the
    message names the loop: op, block, index)."""


class FallbackError(OpRunError):
    """Strict mode (``Executor(strict=True)``, ``PDJIT_STRICT=1``): native code gave up on
    valid input and the op's NumPy reference computed the result instead."""


class FallbackWarning(UserWarning):
    """Native code fell back to the NumPy references (once per plan step)."""


class ReferenceStepWarning(UserWarning):
    """A compiled plan runs an op with its NumPy reference: the op has no lowering for these
    dtypes, ranks or attributes (once per op type and reason)."""


class FeedError(PdjitError, ValueError):
    """A feed does not match the variable it feeds (name, dtype or shape)."""


class LayerInputError(ProgramError):
    """A layer function (``fluid.layers.conv2d(...)``) refused its arguments before appending
    any op: the message names the layer and the argument, what was expected and what was got,
    and ``location``, the user's line that called the layer."""

    def __init__(self, message: str, location: str | None = None):
        self.location = location
        super().__init__(f"{message} (layer called at {location})" if location else message)


class LayerTypeError(LayerInputError, TypeError):
    """A :class:`LayerInputError` about an argument's type (a ``TypeError`` too)."""


class FetchError(FeedError):
    """A fetch names a variable the program does not have (a :class:`FeedError` too, so that
    code catching feed and fetch mistakes together keeps working)."""


class ModelFileError(PdjitError, ValueError):
    """A model or parameter file is missing, damaged, or does not belong to its program."""


class ProgramLimitError(ProgramError):
    """A program exceeds one of pdjit's size bounds (ops in a block, nesting depth, blocks,
    generated code): refused before it allocates or compiles. The message says which bound and
    the environment variable that raises it."""


class UnregisteredOpError(ProgramError, NotImplementedError):
    """A program uses an op type that pdjit does not know."""


class AotError(PdjitError):
    """A model that cannot be compiled ahead of time (``pdjit.aot.compile_model``; the message
    names the op or the value), or a toolchain that is missing or failed."""


class ShapeMismatch(ValueError):
    """Raised by op definitions (infer_shape, reference) for input that does not fit the op.

    The framework adds the op's description; the message says what was expected vs got.
    """


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the user's line (the first frame
    outside pdjit), as ``warnings.warn`` called from the caller of this function counts."""
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def describe_op(op_type: str, block_idx, op_idx, location) -> str:
    where = []
    if block_idx is not None:
        where.append(f"block {block_idx}")
    if op_idx is not None:
        where.append(f"op #{op_idx}")
    text = f"op '{op_type}'"
    if where:
        text += f" ({', '.join(where)})"
    if location:
        text += f", created at {location}"
    return text


class EOFException(PdjitError):
    """A started reader (``py_reader``, a non-iterable ``DataLoader``) has no more batches:
    ``reset()`` it and ``start()`` again for the next pass (``fluid.core.EOFException``)."""


class NanInfError(OpRunError):
    """NaN/Inf checking (``PDJIT_CHECK_NAN_INF=1``, ``FLAGS_check_nan_inf=1``): an op's output
    holds NaN or Inf. ``var_name``, ``nan_count`` and ``inf_count`` say which and how many."""

    def __init__(self, reason: str, op_type: str, block_idx, op_idx, location, *,
                 var_name: str = "", nan_count: int = 0, inf_count: int = 0):
        self.var_name, self.nan_count, self.inf_count = var_name, nan_count, inf_count
        super().__init__(reason, op_type, block_idx, op_idx, location)


class AllocationLimitError(OpRunError, MemoryError):
    """An op's output would take more bytes than the limit (``PDJIT_MAX_ALLOC_BYTES``, by
    default the machine's available memory): refused before allocating. ``var_name``,
    ``shape``, ``nbytes`` and ``limit`` say which output, how big, and the limit."""

    def __init__(self, reason: str, op_type: str, block_idx, op_idx, location, *,
                 var_name: str = "", shape: tuple = (), nbytes: int = 0, limit: int = 0):
        self.var_name, self.shape, self.nbytes, self.limit = var_name, shape, nbytes, limit
        super().__init__(reason, op_type, block_idx, op_idx, location)


class InternalError(PdjitError, RuntimeError):
    """An error that escaped pdjit without a name of its own (a bug, or input no check
    caught): raised by the public entry points (``load_*``, ``verify``, ``Executor.run``, the
    Predictor, the CLI) with the original exception as ``__cause__``. Each is also an instance
    of the original exception's class (see :func:`as_pdjit_error`)."""


_WRAPPED: dict = {}


def _wrapped_class(cls):
    """``InternalError`` that is also a ``cls`` (so ``except ValueError`` still sees a wrapped
    ValueError), or ``InternalError`` itself when the two cannot be combined."""
    got = _WRAPPED.get(cls)
    if got is None:
        try:
            got = type(cls.__name__, (InternalError, cls), {
                "__module__": __name__, "__doc__": InternalError.__doc__,
                "__str__": lambda self: str(self.args[0]) if self.args else ""})
        except TypeError:  # a layout that does not combine
            got = InternalError
        _WRAPPED[cls] = got
    return got


def as_pdjit_error(e: BaseException, where: str) -> PdjitError:
    """``e`` itself when it is a :class:`PdjitError`, else an :class:`InternalError` (also of
    ``e``'s class) saying where it escaped, what it was, with ``e`` to chain as its cause."""
    if isinstance(e, PdjitError):
        return e
    if isinstance(e, RecursionError):
        text = (f"{where}: the program is nested too deeply for Python's recursion limit "
                f"({sys.getrecursionlimit()}): {e}")
    else:
        text = f"{where}: {type(e).__name__}: {e}"
    cls = _wrapped_class(type(e))
    try:
        new = cls(text)
    except Exception:  # noqa: BLE001 - a class whose constructor wants other arguments
        new = InternalError(text)
    return new


def named_errors(where: str):
    """Decorator of a public entry point: every exception (not ``BaseException``s such as
    ``KeyboardInterrupt``) leaves it as a :class:`PdjitError`, the original chained."""
    import functools

    def wrap(fn):
        @functools.wraps(fn)
        def entry(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except PdjitError:
                raise
            except Exception as e:
                raise as_pdjit_error(e, where) from e
        return entry
    return wrap
