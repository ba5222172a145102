"""Utility ops: ``norm`` (behind ``l2_normalize``), ``log_softmax``, ``linspace``, Fluid 1.x's
``isfinite`` / ``isnan`` / ``isinf`` and ``print``, with the gradients that flow through them.

Types, slots and attributes are PaddlePaddle 3.3.1's legacy ops, compared with Paddle while
writing them, except the three checks (see below):

- ``norm`` (X, ``axis``, ``epsilon`` default 1e-10, ``is_test``): ``Norm = sqrt(sum(X^2 along
  axis) + epsilon)`` with the axis kept as size 1 (an intermediate output), ``Out = X / Norm``.
  ``norm_grad`` reads X, Norm and Out@GRAD: ``(dOut - Out * sum(dOut * Out, axis)) / Norm``.
- ``log_softmax`` (X, ``axis`` default -1): ``X - max - log(sum(exp(X - max)))`` along the
  axis; ``log_softmax_grad`` reads Out and Out@GRAD: ``dOut - exp(Out) * sum(dOut, axis)``.
- ``linspace`` (Start, Stop: one value each, cast to ``dtype``; Num: one int32 value): Num
  values, the first half ``Start + step * i`` and the rest ``Stop - step * (Num - 1 - i)`` with
  ``step = (Stop - Start) / (Num - 1)`` in float64, converted to ``dtype`` (integers truncate);
  ``Num = 1`` gives Start, 0 nothing, a negative Num is an error.
- ``isfinite`` / ``isnan`` / ``isinf``: Fluid 1.x's reductions to one bool (shape ``[1]``):
  every element finite / any NaN / any infinity (integers are finite). Paddle 3.3.1 registers
  only the elementwise ``isfinite_v2`` / ``isnan_v2`` / ``isinf_v2``; the 1.x type names used
  here do not clash with those, and programs written by Fluid 1.x load with their meaning.
- ``print`` (In -> Out, the same value: Out aliases In): prints In to standard output in
  Paddle's format (``Variable: name``, ``- message``, ``- lod``, ``- place``, ``- shape``,
  ``- layout``, ``- dtype``, ``- data`` with at most ``summarize`` values, -1: all, each as
  ``%f``), each line enabled by its ``print_tensor_*`` attribute, the first ``first_n`` times
  the op runs (-1: every time). ``print_phase`` (FORWARD, BACKWARD or BOTH) says whether the
  forward op (``is_forward``) or its gradient (another ``print`` of Out@GRAD with
  ``is_forward`` false) prints. It is a step of its own in compiled programs too (a
  side effect: never pruned, never fused).

Natively (float32/float64): norm, log_softmax, their gradients, linspace and the checks are
host lines of NumPy array expressions (no compilation); print runs its reference.
"""
from __future__ import annotations

import sys
import threading
import weakref

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    SIDE_EFFECT,
    Bool,
    Float,
    GradOpSpec,
    Int,
    Opaque,
    RowWise,
    Str,
    VarMeta,
    default_grad,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, NUMERIC, check_dtype, norm_axis

_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
F64 = np.float64
BOOL = np.dtype(np.bool_)


def _f32(value) -> str:
    return repr(float(np.float32(value)))


def _view3(ctx, local: str, rank: int, axis: int) -> str:
    return f"{local}.reshape(({ctx.prod(local, 0, axis)}, {local}.shape[{axis}], " \
           f"{ctx.prod(local, axis + 1, rank)}))"


def _native_slots(ctx, *slots) -> bool:
    return all(ctx.dtype(s) in _NATIVE for s in slots if ctx.has_input(s) or ctx.has_output(s))


# ---- norm ------------------------------------------------------------------------------------
_NORM_ATTRS = {"axis": Int(1, low=-1, high=1), "epsilon": Float(1e-10, low=1e-12, high=1e-6),
               "is_test": Bool(False)}


def _norm_infer(X, *, axis, **_):
    check_dtype(X, FLOATS, "norm: input X")
    a = norm_axis(axis, X.ndim, "norm: axis")
    shape = list(X.shape)
    if shape:
        shape[a] = 1
    return {"Out": X, "Norm": X.with_(shape=tuple(shape))}


def _norm_ref(X, *, axis, epsilon, **_):
    a = norm_axis(axis, X.ndim, "norm: axis") if X.ndim else 0
    x = X.astype(F64)
    n = np.sqrt(np.sum(x * x, axis=a, keepdims=True) + float(np.float32(epsilon))) \
        if X.ndim else np.sqrt(x * x + float(np.float32(epsilon)))
    return {"Out": (x / n).astype(X.dtype), "Norm": n.astype(X.dtype)}


def _norm_lower(ctx):
    r = ctx.rank("X")
    if r == 0 or not _native_slots(ctx, "X"):
        return None
    X, T = ctx.inp("X"), ctx.T("X")
    a = ctx.attrs["axis"] % r
    x3, n3 = ctx.tmp("x"), ctx.tmp("n")
    lines = [f"{x3} = {_view3(ctx, X, r, a)}",
             f"{n3} = np.sqrt(({x3} * {x3}).sum(axis=1) + {T}({_f32(ctx.attrs['epsilon'])}))"
             f".reshape(({x3}.shape[0], 1, {x3}.shape[2]))",
             f"{ctx.out('Out')} = ({x3} / {n3}).reshape({X}.shape)"]
    if ctx.has_output("Norm"):
        shape = ctx.tuple_src(("1" if d == a else f"{X}.shape[{d}]") for d in range(r))
        lines.append(f"{ctx.out('Norm')} = {n3}.reshape({shape})")
    return lines


def _norm_grad_ref(X, Norm, *, axis, **kw):
    g = kw["Out@GRAD"]
    if g.shape != X.shape:
        raise ShapeMismatch(f"norm_grad: expected Out@GRAD of X's shape {list(X.shape)}, got "
                            f"{list(g.shape)}")
    a = norm_axis(axis, X.ndim, "norm: axis") if X.ndim else 0
    n = Norm.astype(F64).reshape([1 if d == a else s for d, s in enumerate(X.shape)])
    y, dy = X.astype(F64) / n, g.astype(F64)
    s = np.sum(dy * y, axis=a, keepdims=True) if X.ndim else dy * y
    return {"X@GRAD": ((dy - y * s) / n).astype(X.dtype)}


def _norm_grad_lower(ctx):
    r = ctx.rank("X")
    if r == 0 or not _native_slots(ctx, "X", "Norm", "Out@GRAD"):
        return None
    X, N, G = ctx.inp("X"), ctx.inp("Norm"), ctx.inp("Out@GRAD")
    a = ctx.attrs["axis"] % r
    x3, n3, g3, y3 = (ctx.tmp(h) for h in ("x", "n", "g", "y"))
    return [f"{x3} = {_view3(ctx, X, r, a)}",
            f"{n3} = {N}.reshape(({x3}.shape[0], 1, {x3}.shape[2]))",
            f"{g3} = {G}.reshape({x3}.shape)", f"{y3} = {x3} / {n3}",
            f"{ctx.out('X@GRAD')} = (({g3} - {y3} * ({g3} * {y3}).sum(axis=1)"
            f".reshape({n3}.shape)) / {n3}).reshape({X}.shape)"]


register_op(
    "norm", inputs=["X"], outputs=["Out", "Norm~"], attrs=_NORM_ATTRS, traits=[OPAQUE],
    row_wise=RowWise(axes=("axis",)),
    infer_shape=_norm_infer, reference=_norm_ref, emit=Opaque(_norm_lower, host=True),
    grad=default_grad("norm_grad", fwd_inputs=("X",), fwd_outputs=("Norm",)),
    doc="Norm = sqrt(sum(X^2, axis) + epsilon) (axis kept); Out = X / Norm.")

register_op(
    "norm_grad", inputs=["X", "Norm", "Out@GRAD"], outputs=["X@GRAD?"], attrs=_NORM_ATTRS,
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_norm_grad_ref,
    emit=Opaque(_norm_grad_lower, host=True), grad=None,
    doc="X@GRAD = (Out@GRAD - Out * sum(Out@GRAD * Out, axis)) / Norm.")


# ---- log_softmax -------------------------------------------------------------------------------
_LS_ATTRS = {"axis": Int(-1, low=-1, high=1, axis_of=("X", "Out"))}


def _ls_infer(X, *, axis):
    check_dtype(X, FLOATS, "log_softmax: input X")
    norm_axis(axis, X.ndim, "log_softmax: axis")
    return {"Out": X}


def _ls_ref(X, *, axis):
    if X.ndim == 0:
        return {"Out": np.zeros_like(X)}
    a = norm_axis(axis, X.ndim, "log_softmax: axis")
    x = X.astype(F64)
    shifted = x - np.max(x, axis=a, keepdims=True) if x.size else x
    return {"Out": (shifted - np.log(np.sum(np.exp(shifted), axis=a, keepdims=True)))
            .astype(X.dtype)}


def _ls_lower(ctx):
    """The 3-D view ``(pre, n, post)``; the max along n gathered through ``np.argmax`` (NumPy
    and Numba both take its ``axis``, unlike ``max``'s), then the shifted log-sum-exp."""
    r = ctx.rank("X")
    if r == 0 or not _native_slots(ctx, "X"):
        return None
    X = ctx.inp("X")
    a = ctx.attrs["axis"] % r
    x3, s3, i, k, p = (ctx.tmp(h) for h in ("x", "s", "i", "k", "p"))
    keep = f"({x3}.shape[0], 1, {x3}.shape[2])"
    return [f"{x3} = {_view3(ctx, X, r, a)}",
            f"{p} = {x3}.shape[0] * {x3}.shape[2]",
            f"{i} = np.arange({p})",
            f"{k} = (({i} // max({x3}.shape[2], 1)) * {x3}.shape[1] + np.argmax({x3}, axis=1)"
            f".reshape({p})) * {x3}.shape[2] + {i} % max({x3}.shape[2], 1)",
            f"{s3} = {x3} - {x3}.reshape({x3}.size)[{k}].reshape({keep})",
            f"{ctx.out('Out')} = ({s3} - np.log(np.exp({s3}).sum(axis=1)).reshape({keep}))"
            f".reshape({X}.shape)"]


def _ls_grad_ref(Out, *, axis, **kw):
    g = kw["Out@GRAD"]
    if g.shape != Out.shape:
        raise ShapeMismatch(f"log_softmax_grad: expected Out@GRAD of Out's shape "
                            f"{list(Out.shape)}, got {list(g.shape)}")
    if Out.ndim == 0:
        return {"X@GRAD": np.zeros_like(g)}
    a = norm_axis(axis, Out.ndim, "log_softmax: axis")
    dy = g.astype(F64)
    return {"X@GRAD": (dy - np.exp(Out.astype(F64)) * dy.sum(axis=a, keepdims=True))
            .astype(Out.dtype)}


def _ls_grad_lower(ctx):
    r = ctx.rank("Out")
    if r == 0 or not _native_slots(ctx, "Out", "Out@GRAD"):
        return None
    O, G = ctx.inp("Out"), ctx.inp("Out@GRAD")
    a = ctx.attrs["axis"] % r
    o3, g3 = ctx.tmp("o"), ctx.tmp("g")
    return [f"{o3} = {_view3(ctx, O, r, a)}", f"{g3} = {G}.reshape({o3}.shape)",
            f"{ctx.out('X@GRAD')} = ({g3} - np.exp({o3}) * {g3}.sum(axis=1)"
            f".reshape(({o3}.shape[0], 1, {o3}.shape[2]))).reshape({O}.shape)"]


register_op(
    "log_softmax", inputs=["X"], outputs=["Out"], attrs=_LS_ATTRS, traits=[OPAQUE],
    row_wise=RowWise(axes=("axis",)),
    infer_shape=_ls_infer, reference=_ls_ref, emit=Opaque(_ls_lower, host=True),
    grad=default_grad("log_softmax_grad", fwd_inputs=(), fwd_outputs=("Out",)),
    doc="Out = log(softmax(X)) along axis, from the shifted logits.")

register_op(
    "log_softmax_grad", inputs=["Out", "Out@GRAD"], outputs=["X@GRAD?"], attrs=_LS_ATTRS,
    traits=[OPAQUE], infer_shape=lambda Out, **_: {"X@GRAD": Out}, reference=_ls_grad_ref,
    emit=Opaque(_ls_grad_lower, host=True), grad=None,
    doc="X@GRAD = Out@GRAD - exp(Out) * sum(Out@GRAD, axis).")


# ---- linspace --------------------------------------------------------------------------------
_LINSPACE_CODES = tuple(dtypes.to_code(d) for d in ("int32", "int64", "float32", "float64"))


def _one_value(meta, name: str) -> None:
    if meta.shape not in ((), (1,), (-1,)):
        raise ShapeMismatch(f"linspace: expected {name} holding one value (shape [1]), got "
                            f"shape {list(meta.shape)}")


def _linspace_infer(Start, Stop, Num, *, dtype):
    for name, m in (("Start", Start), ("Stop", Stop), ("Num", Num)):
        _one_value(m, name)
    if Num.dtype.kind not in "iu":
        raise ShapeMismatch(f"linspace: expected Num of an integer dtype (int32), got "
                            f"{Num.dtype}")
    if int(dtype) not in _LINSPACE_CODES:
        raise ShapeMismatch(f"linspace: expected dtype int32, int64, float32 or float64, got "
                            f"{dtype}")
    return {"Out": VarMeta((-1,), dtypes.to_numpy(dtype))}


def _scalar(v: np.ndarray, name: str):
    if v.size != 1:
        raise ShapeMismatch(f"linspace: expected {name} holding one value, got shape "
                            f"{list(v.shape)}")
    return v.reshape(-1)[0]


def _linspace_ref(Start, Stop, Num, *, dtype):
    dt = dtypes.to_numpy(dtype)
    s = float(dt.type(_scalar(Start, "Start")))
    e = float(dt.type(_scalar(Stop, "Stop")))
    n = int(_scalar(Num, "Num"))
    if n < 0:
        raise ShapeMismatch(f"linspace: expected Num >= 0, got {n}")
    step = (e - s) / (n - 1) if n > 1 else 0.0
    i = np.arange(n, dtype=F64)
    vals = np.where(i < (n // 2 if n > 1 else 1), s + step * i, e - step * (n - 1 - i))
    return {"Out": vals.astype(dt)}


def _linspace_lower(ctx):
    S, E, N = (ctx.inp(s) for s in ("Start", "Stop", "Num"))
    T = ctx.T("Out")
    s, e, n, st, i = (ctx.tmp(h) for h in ("s", "e", "n", "st", "i"))
    return [f"{s} = float({T}({S}.reshape({S}.size)[0]))",
            f"{e} = float({T}({E}.reshape({E}.size)[0]))",
            f"{n} = int({N}.reshape({N}.size)[0])",
            f"if {n} < 0: raise ValueError('linspace: expected Num >= 0')",
            f"{st} = ({e} - {s}) / ({n} - 1) if {n} > 1 else 0.0",
            f"{i} = np.arange({n}).astype(np.float64)",
            f"{ctx.out('Out')} = np.where({i} < ({n} // 2 if {n} > 1 else 1), {s} + {st} * {i}, "
            f"{e} - {st} * ({n} - 1 - {i})).astype({T})"]


register_op(
    "linspace", inputs=["Start", "Stop", "Num"], outputs=["Out"],
    attrs={"dtype": Int(dtypes.to_code("float32"), choices=_LINSPACE_CODES,
                       one_of=_LINSPACE_CODES)},
    traits=[OPAQUE], infer_shape=_linspace_infer, reference=_linspace_ref,
    emit=Opaque(_linspace_lower, host=True), grad=None,
    doc="Out = Num evenly spaced values from Start to Stop (both included), of dtype.")


# ---- isfinite / isnan / isinf (Fluid 1.x: one bool for the whole tensor) -------------------------
def _check_infer(op):
    def infer(X):
        check_dtype(X, NUMERIC, f"{op}: input X")
        return {"Out": VarMeta((1,), BOOL)}
    return infer


_CHECKS = {
    "isfinite": (lambda x: bool(np.all(np.isfinite(x))), "np.isfinite({X}).all()", "True",
                 "Out = [every element of X is finite] (one bool, Fluid 1.x)."),
    "isnan": (lambda x: bool(np.any(np.isnan(x))), "np.isnan({X}).any()", "False",
              "Out = [some element of X is NaN] (one bool, Fluid 1.x)."),
    "isinf": (lambda x: bool(np.any(np.isinf(x))), "np.isinf({X}).any()", "False",
              "Out = [some element of X is +-inf] (one bool, Fluid 1.x)."),
}


def _check_ref(fn):
    def ref(X):
        return {"Out": np.array([fn(X) if X.dtype.kind == "f" else fn(np.zeros(0))], BOOL)}
    return ref


def _check_lower(expr, for_ints):
    def lower(ctx):
        X = ctx.inp("X")
        out = ctx.out("Out", shape="(1,)")
        value = expr.format(X=X) if ctx.dtype("X").kind == "f" else for_ints
        return [f"{out}[0] = {value}"]
    return lower


for _op, (_fn, _expr, _ints, _doc) in _CHECKS.items():
    register_op(_op, inputs=["X"], outputs=["Out"], traits=[OPAQUE],
                infer_shape=_check_infer(_op), reference=_check_ref(_fn),
                emit=Opaque(_check_lower(_expr, _ints), host=True), grad=None, doc=_doc)


# ---- print -----------------------------------------------------------------------------------
_PHASES = ("FORWARD", "BACKWARD", "BOTH")
_PRINT_ATTRS = {
    "first_n": Int(-1, low=-1, high=3), "message": Str(""), "summarize": Int(20, low=-1, high=8),
    "print_tensor_name": Bool(True), "print_tensor_type": Bool(True),
    "print_tensor_shape": Bool(True), "print_tensor_layout": Bool(True),
    "print_tensor_lod": Bool(True), "print_phase": Str("BOTH", choices=_PHASES, one_of=_PHASES),
    "is_forward": Bool(True),
}
_PRINTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # op -> times printed
_PRINT_LOCK = threading.Lock()


def _print_infer(In, **_):
    return {"Out": In}


def format_tensor(value: np.ndarray, name: str, message: str, lod, *, summarize: int,
                  print_tensor_name: bool = True, print_tensor_type: bool = True,
                  print_tensor_shape: bool = True, print_tensor_layout: bool = True,
                  print_tensor_lod: bool = True, **_) -> str:
    """The text the ``print`` op writes for ``value`` (Paddle's layout)."""
    lines = []
    if print_tensor_name and name:
        lines.append(f"Variable: {name}")
    if message:
        lines.append(f"  - message: {message}")
    if print_tensor_lod:
        lines.append("  - lod: {" + "".join("{" + ", ".join(str(int(o)) for o in level) + "}"
                                            for level in (lod or [])) + "}")
    lines.append("  - place: Place(cpu)")
    if print_tensor_shape:
        lines.append(f"  - shape: [{', '.join(str(d) for d in value.shape)}]")
    if print_tensor_layout:
        lines.append("  - layout: NCHW")
    if print_tensor_type:
        lines.append(f"  - dtype: {value.dtype}")
    flat = value.reshape(-1)
    count = flat.size if summarize < 0 else min(int(summarize), flat.size)
    lines.append("  - data: [" + " ".join(f"{float(v):f}" for v in flat[:count]) + "]")
    return "\n".join(lines) + "\n"


def _print_ref(In, *, ctx=None, first_n, message, print_phase, is_forward, **attrs):
    phase = str(print_phase).upper()
    if phase not in _PHASES:
        raise ShapeMismatch(f"print: expected print_phase FORWARD, BACKWARD or BOTH, got "
                            f"{print_phase!r}")
    wanted = phase == "BOTH" or (phase == "FORWARD") == bool(is_forward)
    if wanted and ctx is not None:
        op = ctx.op
        with _PRINT_LOCK:
            times = _PRINTED.get(op, 0)
            wanted = first_n is None or int(first_n) <= 0 or times < int(first_n)
            if wanted:
                _PRINTED[op] = times + 1
    if wanted:
        name = ctx.op.input("In")[0] if ctx is not None else ""
        lod = ctx.input_lod("In") if ctx is not None else []
        text = format_tensor(np.asarray(In), name, message, lod, **attrs)
        sys.stdout.write(text)
        sys.stdout.flush()
    return {"Out": In}


def _print_grad(op):
    attrs = {k: v for k, v in op.all_attrs().items() if k in _PRINT_ATTRS}
    attrs["is_forward"] = False
    return [GradOpSpec("print", {"In": [grad_var_name(n) for n in op.output("Out")]},
                       {"Out": [grad_var_name(n) for n in op.input("In")]}, attrs)]


register_op(
    "print", inputs=["In"], outputs=["Out"], attrs=_PRINT_ATTRS, traits=[SIDE_EFFECT],
    infer_shape=_print_infer, reference=_print_ref, emit=None, grad=_print_grad,
    out_lod=lambda lods, **_: {"Out": lods.get("In", [])},
    doc="Out = In; prints In (name, LoD, shape, dtype, the first `summarize` values) the first "
        "`first_n` times it runs, in the phases print_phase names.")


# ---- is_empty ------------------------------------------------------------------------------------
def _is_empty_lower(ctx):
    """Host lines: a 0-d bool holding whether X has no element."""
    X, out = ctx.inp("X"), ctx.out("Out")
    return [f"{out} = np.empty((), np.bool_)", f"{out}[()] = {X}.size == 0"]


register_op(
    "is_empty", inputs=["X"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=lambda X: {"Out": VarMeta((), BOOL)},
    reference=lambda X: {"Out": np.asarray(X.size == 0)},
    emit=Opaque(_is_empty_lower, host=True), grad=None,
    doc="Out = whether X holds no element (a 0-d bool; [1] as Fluid 1.x declares it).")
