"""Reductions: ``reduce_sum/mean/max/min/prod``, ``mean``, ``sum`` (add_n), ``arg_max/arg_min``
and ``top_k``/``top_k_v2``.

Semantics follow PaddlePaddle 3.3.1's legacy ops (checked against it while writing):

- ``dim`` is normalised (negative counts from the end) and must hold no duplicates; an empty
  ``dim``, ``reduce_all`` or a ``dim`` naming every axis reduces everything, giving a 0-d result
  (shape ``()``) unless ``keep_dim``.
- Output dtypes: ``out_dtype`` when given (not -1); otherwise ``reduce_sum`` of bool or int32
  gives int64 (as Paddle's sum does), and every other reduction keeps X's dtype. The integer mean
  truncates toward zero, as Paddle's integer kernel does.
- ``reduce_max``/``reduce_min`` over an axis of size 0 is an error (there is no identity).
- ``arg_max``/``arg_min`` return the first index of the extreme value; ``top_k*`` order ties by
  index (lowest first). Paddle's tie order is its partial sort's and is not specified, so equal
  values may come back in another order there.

Gradients (Paddle's grad ops and slots; all ``OPAQUE``): ``reduce_<op>_grad`` and
``mean_grad`` natively (float32/float64, through each target's lowerings:
``codegen/<target>/lowerings/reduce.py``);
``top_k*_grad`` run their references.

- ``reduce_<op>_grad`` reads ``X`` (for its shape), ``Out`` (max/min/prod) and ``Out@GRAD``,
  with the forward attributes, and writes ``X@GRAD``; ``mean_grad`` reads ``X`` and ``Out@GRAD``.
- ``reduce_max``/``reduce_min``: Paddle 3.3.1 splits the gradient equally among the positions
  equal to the extreme (``[1, 3, 3]`` gets ``[0, .5, .5]``), which is what is done here.
- ``reduce_prod``: the gradient is the product of the other elements, computed without
  dividing; Paddle computes ``Out / X`` and gives NaN where X is 0.
- ``sum`` (add_n): one ``scale`` (factor 1) of ``Out@GRAD`` per input, as Paddle emits; an
  input listed twice gets two, which the backward pass sums.
- ``top_k``/``top_k_v2``: ``top_k*_grad`` reads ``X``, ``K``, ``Indices`` and ``Out@GRAD`` and
  scatters the gradient to the selected positions (zero elsewhere); indices get none.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    EMPTY_VAR_NAME,
    OPAQUE,
    REDUCTION,
    REQUIRED,
    SUMS,
    Bool,
    GradOpSpec,
    Int,
    Ints,
    Long,
    Opaque,
    Reduce,
    RowWise,
    default_grad,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, INDEX, NUMERIC, check_dtype, norm_axis
from pdjit.proto import framework_pb2 as pb

BOOL = np.dtype(np.bool_)
INT64 = np.dtype(np.int64)
def _dtype_code_problem(code) -> str | None:
    """Why ``code`` is neither -1 (none) nor a data type pdjit computes with, or None."""
    if code == -1:
        return None
    try:
        dtypes.to_numpy(code)
    except (TypeError, ValueError, KeyError):
        return f"expected -1 or a data type code, got {code!r}"
    return None


_REDUCE_ATTRS = {
    "dim": Ints([0], doc="axes to reduce; empty means all", axis_of="X"),
    "keep_dim": Bool(False),
    "reduce_all": Bool(False),
    "in_dtype": Int(-1, choices=(-1,), valid=_dtype_code_problem),
    "out_dtype": Int(-1, choices=(-1,), valid=_dtype_code_problem),
}


# ---- reduce_* --------------------------------------------------------------------------------
def _reduce_axes(shape, dim, reduce_all) -> tuple:
    """The normalised, sorted axes a reduction removes (all of them for an empty ``dim``)."""
    rank = len(shape)
    axes = []
    for d in dim:
        a = norm_axis(int(d), rank, "dim")
        if a in axes:
            raise ShapeMismatch(f"dim {list(dim)} names axis {a} twice: expected distinct axes")
        axes.append(a)
    if reduce_all or not axes or len(axes) >= rank:
        return tuple(range(rank))
    return tuple(sorted(axes))


def _reduced_shape(shape, axes, keep_dim) -> tuple:
    if keep_dim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _out_dtype(op_type, x_dtype, out_dtype) -> np.dtype:
    if out_dtype not in (-1, None):
        try:
            return dtypes.to_numpy(out_dtype)
        except TypeError as e:
            raise ShapeMismatch(f"out_dtype: {e}") from None
    if op_type == "reduce_sum" and x_dtype in (BOOL, np.dtype(np.int32)):
        return INT64
    return x_dtype


def _mean(x, axes, keepdims, out):
    if out.kind in "iu":  # Paddle's integer mean: exact integer sum, quotient truncated to zero
        n = max(int(np.prod([x.shape[a] for a in axes])), 1)
        s = np.sum(x, axis=axes, keepdims=keepdims, dtype=np.int64)
        return np.where(s >= 0, s // n, -((-s) // n))
    acc = np.float64 if out == np.float64 else np.float32  # float16 accumulates in float32
    return np.mean(x, axis=axes, keepdims=keepdims, dtype=acc)


_NP = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min, "reduce_prod": np.prod}
_NO_IDENTITY = {"reduce_max", "reduce_min"}


def _make_reduce(op_type):
    allowed = NUMERIC + (BOOL,) if op_type == "reduce_sum" else NUMERIC

    def infer(X, *, dim, keep_dim, reduce_all, in_dtype, out_dtype):
        check_dtype(X, allowed, "input X")
        if in_dtype not in (-1, None):  # X is cast to it first, as the reference does
            try:
                X = X.with_(dtype=dtypes.to_numpy(in_dtype))
            except (TypeError, ValueError, KeyError) as e:
                raise ShapeMismatch(f"in_dtype: {e}") from None
        axes = _reduce_axes(X.shape, dim, reduce_all)
        if op_type in _NO_IDENTITY and any(X.shape[a] == 0 for a in axes):
            raise ShapeMismatch(f"{op_type} of X of shape {list(X.shape)} over axes {list(axes)}: "
                                f"expected every reduced dim to be non-empty, got a 0")
        return {"Out": X.with_(shape=_reduced_shape(X.shape, axes, keep_dim),
                               dtype=_out_dtype(op_type, X.dtype, out_dtype))}

    def ref(X, *, dim, keep_dim, reduce_all, in_dtype, out_dtype):
        if in_dtype not in (-1, None):
            X = X.astype(dtypes.to_numpy(in_dtype), copy=False)
        axes = _reduce_axes(X.shape, dim, reduce_all)
        out = _out_dtype(op_type, X.dtype, out_dtype)
        if op_type in _NO_IDENTITY and any(X.shape[a] == 0 for a in axes):
            raise ShapeMismatch(f"{op_type} of X of shape {list(X.shape)} over axes "
                                f"{list(axes)}: expected non-empty reduced dims, got a 0")
        if op_type == "reduce_mean":
            r = _mean(X, axes, keep_dim, out)
        elif op_type in ("reduce_sum", "reduce_prod"):
            # accumulate in the output type (int64 for int sums), as Paddle's kernels do
            acc = out if out.kind != "f" or out.itemsize >= 4 else np.float32
            r = _NP[op_type](X, axis=axes, keepdims=keep_dim, dtype=acc)
        else:
            r = _NP[op_type](X, axis=axes, keepdims=keep_dim)
        return {"Out": np.asarray(r).astype(out, copy=False)}

    return infer, ref


def _init_max(dt, sign):
    if dt.kind == "f":
        return f"{{T}}({'-' if sign < 0 else ''}math.inf)"
    info = np.iinfo(dt)
    return f"{{T}}({info.min if sign < 0 else info.max})"


def _reduce_emit(op_type):
    """``emit(dtypes, **attrs) -> Reduce``: the templates depend on the output dtype."""
    def emit(dtypes_, dim=None, keep_dim=False, reduce_all=False, **_):
        dt = np.dtype(dtypes_.get("Out", dtypes_.get("X")))
        axes = None if reduce_all or not dim else tuple(dim)
        if op_type == "reduce_sum":
            r = Reduce("{T}(0)", "{acc} + {T}({x})")
        elif op_type == "reduce_prod":
            r = Reduce("{T}(1)", "{acc} * {T}({x})")
        elif op_type == "reduce_max":  # np.maximum propagates NaN as NumPy's max does
            r = Reduce(_init_max(dt, -1), "np.maximum({acc}, {x})")
        elif op_type == "reduce_min":
            r = Reduce(_init_max(dt, +1), "np.minimum({acc}, {x})")
        elif dt.kind in "iu":  # reduce_mean: truncate toward zero like Paddle's integer mean
            r = Reduce("{T}(0)", "{acc} + {T}({x})",
                       "({acc} // {n} if {acc} >= 0 else -((-{acc}) // {n}))")
        else:
            r = Reduce("{T}(0)", "{acc} + {T}({x})", "{acc} / {T}({n})")
        return Reduce(r.init, r.combine, r.finalize, axes, bool(keep_dim),
                      identity=op_type not in ("reduce_max", "reduce_min"))
    return emit


# ---- reduce_*_grad -----------------------------------------------------------------------------
def _others_product(x, axes):
    """For every element, the product of the other elements of its reduced group.

    Exclusive prefix and suffix products over the flattened reduced axes: exact where X holds
    zeros (dividing Out by X, as Paddle does, gives NaN there).
    """
    rest = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, rest + list(axes))
    lead = moved.shape[:len(rest)]
    flat = moved.reshape(lead + (-1,))
    ones = np.ones(lead + (1,), x.dtype)
    before = np.cumprod(np.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
    after = np.flip(np.cumprod(np.flip(np.concatenate([flat[..., 1:], ones], axis=-1), -1),
                               axis=-1), -1)
    prod = (before * after).reshape(moved.shape)
    return np.transpose(prod, np.argsort(rest + list(axes)))


def _make_reduce_grad(op_type):
    def infer(X, *, dim, keep_dim, reduce_all, in_dtype, out_dtype, **_):
        return {"X@GRAD": X}

    def ref(X, Out=None, *, dim, keep_dim, reduce_all, in_dtype, out_dtype, **kw):
        g = kw["Out@GRAD"]
        x = X.astype(dtypes.to_numpy(in_dtype), copy=False) if in_dtype not in (-1, None) else X
        axes = _reduce_axes(X.shape, dim, reduce_all)
        kept = _reduced_shape(X.shape, axes, True)
        want = _reduced_shape(X.shape, axes, keep_dim)
        if g.shape != want and not (want == () and g.shape == (1,)):  # [1]: Fluid 1.x's
            raise ShapeMismatch(f"{op_type}_grad: expected Out@GRAD of shape {list(want)} (X "
                                f"{list(X.shape)} reduced over {list(axes)}), got "
                                f"{list(g.shape)}")
        g = g.reshape(kept)  # the reduced axes back as 1s, to broadcast against X
        if op_type == "reduce_sum":
            dx = np.broadcast_to(g, X.shape)
        elif op_type == "reduce_mean":
            n = max(int(np.prod([X.shape[a] for a in axes])), 1)
            dx = np.broadcast_to(g / n, X.shape)
        elif op_type == "reduce_prod":
            dx = g * _others_product(x, axes)
        else:  # max / min: shared equally by every position equal to the extreme (Paddle's rule)
            if Out is None:
                raise ShapeMismatch(f"{op_type}_grad: expected input Out (the forward result), "
                                    f"got none")
            hit = x == Out.reshape(kept)
            dx = g * hit / np.sum(hit, axis=axes, keepdims=True)
        return {"X@GRAD": np.array(dx, dtype=X.dtype)}

    return infer, ref


def reduce_grad_axes(ctx):
    """The reduced axes of a ``reduce_<op>_grad`` lowerable natively (float32 or float64, X of
    rank >= 1, X@GRAD wanted); ``None`` otherwise."""
    ft = (np.dtype(np.float32), np.dtype(np.float64))
    if (ctx.dtype("X") not in ft or ctx.dtype("Out@GRAD") != ctx.dtype("X")
            or not ctx.has_output("X@GRAD")):
        return None
    a = ctx.attrs
    r = ctx.rank("X")
    if r == 0:
        return None
    return _reduce_axes((0,) * r, a["dim"], a["reduce_all"])


for _t in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"):
    _infer, _ref = _make_reduce(_t)
    _reads_out = ("Out",) if _t in ("reduce_max", "reduce_min", "reduce_prod") else ()
    register_op(_t, inputs=["X"], outputs=["Out"], attrs=dict(_REDUCE_ATTRS), traits=[REDUCTION],
                infer_shape=_infer, reference=_ref, emit=_reduce_emit(_t),
                grad=default_grad(f"{_t}_grad", fwd_outputs=_reads_out),
                doc=f"Out = {_t[7:]} of X over the axes in dim (all axes when dim is empty or "
                    f"reduce_all); keep_dim keeps them as size 1.")
    _infer, _ref = _make_reduce_grad(_t)
    register_op(f"{_t}_grad", inputs=["X", "Out?", "Out@GRAD"], outputs=["X@GRAD?"],
                attrs=dict(_REDUCE_ATTRS), traits=[OPAQUE], infer_shape=_infer, reference=_ref,
                emit=Opaque(),
                grad=None,
                doc=f"X@GRAD = the gradient of {_t}: Out@GRAD spread back over the reduced "
                    f"axes of X.")


# ---- mean: the mean of every element, a 0-d result --------------------------------------------
def _mean_infer(X):
    check_dtype(X, FLOATS, "input X")
    return {"Out": X.with_(shape=())}


register_op(
    "mean", inputs=["X"], outputs=["Out"], traits=[REDUCTION], infer_shape=_mean_infer,
    reference=lambda X: {"Out": np.asarray(_mean(X, tuple(range(X.ndim)), False, X.dtype))
                         .astype(X.dtype)},
    emit=_reduce_emit("reduce_mean"), grad=default_grad("mean_grad"),
    doc="Out = the mean of every element of X (a 0-d tensor).")


def _mean_grad_ref(X, **kw):
    g = kw["Out@GRAD"]
    if g.size != 1:
        raise ShapeMismatch(f"mean_grad: expected a one-element Out@GRAD, got shape "
                            f"{list(g.shape)}")
    return {"X@GRAD": np.full(X.shape, g.reshape(-1)[0] / max(X.size, 1), dtype=X.dtype)}


def _mean_grad_lower(ctx):
    if ctx.dtype("X").kind != "f" or not ctx.has_output("X@GRAD"):
        return None
    X, g, T = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.T("X")
    out = ctx.out("X@GRAD", shape=f"{X}.shape")
    return [f"_rt.check({g}.size == 1)",
            f"{out}.reshape({out}.size)[:] = {g}.reshape(1)[0] / {T}({X}.size)"]


register_op(
    "mean_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD?"], traits=[OPAQUE],
    infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_mean_grad_ref,
    emit=Opaque(_mean_grad_lower, host=True), grad=None,
    doc="X@GRAD = Out@GRAD / X.size everywhere (gradient of mean).")


# ---- sum: X[0] + X[1] + ... (Paddle's add_n) --------------------------------------------------
def _sum_infer(X):
    if not X:
        raise ShapeMismatch("sum: expected at least one input in X, got none")
    first = X[0]
    check_dtype(first, NUMERIC, "input X[0]")
    shape = list(first.shape)
    for i, m in enumerate(X[1:], 1):
        if m.dtype != first.dtype or m.ndim != first.ndim:
            raise ShapeMismatch(f"sum: every X must match X[0] ({first.dtype}{list(first.shape)}): "
                                f"expected X[{i}] alike, got {m.dtype}{list(m.shape)}")
        for j, d in enumerate(m.shape):
            if -1 not in (d, shape[j]) and d != shape[j]:
                raise ShapeMismatch(f"sum: expected X[{i}] of shape {list(first.shape)}, got "
                                    f"{list(m.shape)}")
            if shape[j] == -1:
                shape[j] = d
    return {"Out": first.with_(shape=tuple(shape))}


def _sum_ref(X):
    out = np.array(X[0], copy=True)
    for i, x in enumerate(X[1:], 1):
        if x.shape != out.shape:
            raise ShapeMismatch(f"sum: expected X[{i}] of shape {list(out.shape)}, got "
                                f"{list(x.shape)}")
        out += x
    return {"Out": out}


def sum_operands(ctx):
    """``(inputs, output, check lines)`` of a ``sum`` of dense inputs of one shape, the output
    allocated by the driver; ``None`` for tensor arrays or shapes that may differ."""
    names = ctx.op.input("X")
    n = len(names)
    if n < 1 or EMPTY_VAR_NAME in names or len({ctx.shape("X", i) for i in range(n)}) > 1 or \
            any(ctx.dtype("X", i) != ctx.dtype("X") for i in range(n)) or \
            any(ctx._var(a).type != pb.VarType.LOD_TENSOR for a in names):
        return None  # tensor arrays, or shapes that may differ: the reference
    xs = [ctx.inp("X", i) for i in range(n)]
    out = ctx.out("Out", shape=f"{xs[0]}.shape")
    return xs, out, [f"_rt.check({x}.shape == {xs[0]}.shape)" for x in xs[1:]]


def _sum_lower(ctx):
    """Dense inputs of one shape: the first copied into the output, the others added in place
    (``np.add`` with ``out``, a library loop, valid in the driver and in native loops)."""
    operands = sum_operands(ctx)
    if operands is None:
        return None
    xs, out, lines = operands
    n = len(xs)
    if n == 1:
        return lines + [f"{out}.reshape({out}.size)[:] = {xs[0]}.reshape({xs[0]}.size)"]
    return lines + [f"np.add({xs[0]}, {xs[1]}, {out})"] + \
        [f"np.add({out}, {x}, {out})" for x in xs[2:]]


def _sum_grad(op):
    """Paddle's grad of add_n: ``X[i]@GRAD = scale(Out@GRAD, 1)`` for each input, one op each.

    A copy per input rather than sharing Out@GRAD: every gradient variable stays written once
    (the backward pass renames and sums an input listed twice). Paddle 3.3.1 emits exactly
    these ``scale`` ops, with only ``scale`` set.
    """
    (out,) = op.output("Out")
    return [GradOpSpec("scale", {"X": [grad_var_name(out)]}, {"Out": [grad_var_name(n)]},
                       {"scale": 1.0})
            for n in op.input("X")]


register_op(
    "sum", inputs=["X*"], outputs=["Out"], traits=[OPAQUE, SUMS], infer_shape=_sum_infer,
    reference=_sum_ref, emit=Opaque(_sum_lower, host=True),
    grad=_sum_grad,
    doc="Out = X[0] + X[1] + ..., inputs of one shape and dtype.")


# ---- arg_max / arg_min -------------------------------------------------------------------------
_INDEX_CODES = {-1: INT64, 2: np.dtype(np.int32), 3: INT64}  # Paddle: dtype -1 means int64


def _arg_shape(shape, axis, keepdims, flatten):
    rank = len(shape)
    a = norm_axis(int(axis), rank, "axis")
    if flatten:
        return (1,) * rank if keepdims else (), None
    if rank == 0:
        return (), None
    return _reduced_shape(shape, (a,), keepdims), a


def _unflattened(v):
    return "flatten" if v.attr("flatten") else None


def _make_arg(op_type, fn):
    def infer(X, *, axis, keepdims, flatten, dtype):
        check_dtype(X, NUMERIC, "input X")
        if dtype not in _INDEX_CODES:
            raise ShapeMismatch(f"{op_type}: expected dtype 2 (int32), 3 (int64) or -1, got "
                                f"{dtype}")
        shape, a = _arg_shape(X.shape, axis, keepdims, flatten)
        if X.ndim and 0 in (X.shape if flatten else (X.shape[a],)):
            raise ShapeMismatch(f"{op_type} of X of shape {list(X.shape)}: expected a non-empty "
                                f"reduced axis, got size 0")
        return {"Out": X.with_(shape=shape, dtype=_INDEX_CODES[dtype])}

    def ref(X, *, axis, keepdims, flatten, dtype):
        shape, a = _arg_shape(X.shape, axis, keepdims, flatten)
        if X.size == 0:
            raise ShapeMismatch(f"{op_type} of X of shape {list(X.shape)}: expected a non-empty "
                                f"tensor")
        if flatten or X.ndim == 0:
            r = fn(X.reshape(-1))
        else:
            r = fn(X, axis=a)
        return {"Out": np.asarray(r).reshape(shape).astype(_INDEX_CODES[dtype])}

    def lower(ctx):
        """X viewed as ``(pre, n, post)`` around the reduced axis (the whole of X with
        ``flatten``); one pass over ``n`` per output element keeps the first extreme, and the
        first NaN as NumPy does (a NaN is never replaced)."""
        if ctx.dtype("X") == np.float16:   # no float16 arithmetic in native code
            return None
        rank, a = ctx.rank("X"), ctx.attrs["axis"]
        flatten, keep = ctx.attrs["flatten"], ctx.attrs["keepdims"]
        x = ctx.inp("X")
        if flatten or rank == 0:
            shape = (1,) * rank if keep else ()
            pre, n, post = "1", f"{x}.size", "1"
        else:
            a = int(a) % rank
            shape = [f"{x}.shape[{i}]" if i != a else "1" for i in range(rank)
                     if i != a or keep]
            pre, n, post = ctx.prod(x, 0, a), f"{x}.shape[{a}]", ctx.prod(x, a + 1, rank)
        out = ctx.out("Out", shape=ctx.tuple_src(shape))
        x3, o, p, q, j, best, at, v, m = (ctx.tmp(h) for h in
                                          ("x3", "o", "p", "q", "j", "b", "at", "v", "n"))
        beats = ">" if op_type == "arg_max" else "<"
        return [f"{m} = {n}",
                f"if {m} == 0: raise ValueError('pdjit: {op_type} over an empty axis')",
                f"{x3} = {x}.reshape(({pre}, {m}, {post}))",
                f"{o} = {out}.reshape({out}.size)",
                f"for {p} in range({x3}.shape[0]):",
                f"    for {q} in range({x3}.shape[2]):",
                f"        {best} = {x3}[{p}, 0, {q}]",
                f"        {at} = 0",
                f"        for {j} in range(1, {m}):",
                f"            {v} = {x3}[{p}, {j}, {q}]",
                f"            if {v} {beats} {best} or ({v} != {v} and {best} == {best}):",
                f"                {best} = {v}",
                f"                {at} = {j}",
                f"        {o}[{p} * {x3}.shape[2] + {q}] = {at}"]

    register_op(op_type, inputs=["X"], outputs=["Out"],
                attrs={"axis": Long(REQUIRED, low=-3, high=3, axis_of="X"), "keepdims": Bool(False),
                       "flatten": Bool(False), "dtype": Int(3, choices=(2, 3))},
                traits=[OPAQUE], infer_shape=infer, reference=ref, emit=Opaque(lower),
                grad=None, row_wise=RowWise(axes=("axis",), check=_unflattened),
                doc=f"Out = the index of the {op_type[4:]}imum of X along axis (of the "
                    f"flattened X with flatten); the first one on ties.")


_make_arg("arg_max", np.argmax)
_make_arg("arg_min", np.argmin)


# ---- top_k / top_k_v2 ------------------------------------------------------------------------
def _topk_infer(X, K, k, axis, op_type):
    check_dtype(X, NUMERIC, "input X")
    if K is not None:
        check_dtype(K, INDEX, "input K")
    a = norm_axis(axis, X.ndim, "axis")
    if X.ndim == 0:
        if K is None and k != 1:
            raise ShapeMismatch(f"{op_type} of a 0-d X: expected k = 1, got k={k}")
        shape = ()
    else:
        d = X.shape[a]
        if K is None and (k < 1 or (d >= 0 and k > d)):
            raise ShapeMismatch(f"{op_type}: expected 1 <= k <= {d if d >= 0 else 'dim'} (the "
                                f"size of axis {a} of X {list(X.shape)}), got k={k}")
        shape = tuple((-1 if K is not None else k) if i == a else s for i, s in enumerate(X.shape))
    return {"Out": X.with_(shape=shape), "Indices": X.with_(shape=shape, dtype=INT64)}


def _topk_ref(X, K, k, axis, largest, op_type):
    if K is not None:
        k = int(np.asarray(K).reshape(-1)[0])
    if X.ndim == 0:
        if k != 1:
            raise ShapeMismatch(f"{op_type} of a 0-d X: expected k = 1, got k={k}")
        return {"Out": X.copy(), "Indices": np.zeros((), INT64)}
    a = norm_axis(axis, X.ndim, "axis")
    n = X.shape[a]
    if not 1 <= k <= n:
        raise ShapeMismatch(f"{op_type}: expected 1 <= k <= {n} (the size of axis {a} of X "
                            f"{list(X.shape)}), got k={k}")
    if largest:
        # a stable ascending sort of the reversed axis, read backwards: values descend and
        # equal values keep ascending indices (no negation, so unsigned and INT_MIN are safe)
        rev = np.flip(X, axis=a)
        order = np.flip(np.argsort(rev, axis=a, kind="stable"), axis=a)
        order = n - 1 - order
    else:
        order = np.argsort(X, axis=a, kind="stable")
    idx = np.take(order, np.arange(k), axis=a)
    return {"Out": np.take_along_axis(X, idx, axis=a), "Indices": idx.astype(INT64)}


def _make_topk_grad(op_type, axis_of):
    """``top_k*_grad``: Out@GRAD scattered into zeros of X's shape at Indices along the axis."""
    def infer(X, K=None, Indices=None, **_):
        return {"X@GRAD": X}

    def ref(X, K=None, Indices=None, **kw):
        g = kw["Out@GRAD"]
        if Indices is None or Indices.shape != g.shape:
            raise ShapeMismatch(f"{op_type}_grad: expected Indices of Out@GRAD's shape "
                                f"{list(g.shape)}, got "
                                f"{None if Indices is None else list(Indices.shape)}")
        dx = np.zeros(X.shape, X.dtype)
        if X.ndim == 0:
            dx[()] = g
            return {"X@GRAD": dx}
        a = norm_axis(axis_of(kw), X.ndim, "axis")
        n = X.shape[a]
        if Indices.size and (Indices.min() < 0 or Indices.max() >= n):
            raise IndexError(f"{op_type}_grad: expected Indices in [0, {n}), got values in "
                             f"[{Indices.min()}, {Indices.max()}]")
        # add, not assign: right even if an index were repeated
        where = list(np.indices(g.shape, sparse=True))
        where[a] = Indices
        np.add.at(dx, tuple(where), g.astype(X.dtype, copy=False))
        return {"X@GRAD": dx}

    return infer, ref


for _t, _axis_of, _attrs in (
        ("top_k", lambda kw: -1, {"k": Int(1, low=1, high=3)}),
        ("top_k_v2", lambda kw: kw["axis"],
         {"k": Int(1, low=1, high=3), "axis": Int(-1, low=-1, high=3, axis_of="X"),
          "largest": Bool(True), "sorted": Bool(True)})):
    _infer, _ref = _make_topk_grad(_t, _axis_of)
    register_op(f"{_t}_grad", inputs=["X", "K?", "Indices", "Out@GRAD"], outputs=["X@GRAD?"],
                attrs=_attrs, traits=[OPAQUE], infer_shape=_infer, reference=_ref, emit=None,
                grad=None,
                doc=f"X@GRAD = zeros of X's shape with Out@GRAD added at Indices (gradient of "
                    f"{_t}).")

def _topk_lower(ctx):
    """The k largest (smallest) of each row of the last axis by k passes of selection (the
    first of equal values wins, as in the reference's stable order); small k only. A NaN
    raises: the reference then orders it."""
    r, k = ctx.rank("X"), int(ctx.attrs["k"])
    axis = ctx.attrs.get("axis", -1)
    if r < 1 or ctx.has_input("K") or axis not in (-1, r - 1) or not 1 <= k <= 64 or \
            ctx.dtype("X").kind not in "fiu":
        return None
    X = ctx.inp("X")
    shape = ctx.tuple_src([f"{X}.shape[{d}]" for d in range(r - 1)] + [str(k)])
    out, ind = ctx.out("Out", shape=shape), ctx.out("Indices", shape=shape)
    better = ">" if ctx.attrs.get("largest", True) else "<"
    x2, o2, i2, taken, i, j, d, b, bv, v = (ctx.tmp(h) for h in "xoitrjdbwv")
    return [
        f"{x2} = {ctx.as_rows(X, r)}",
        f"_rt.check({x2}.shape[1] >= {k})",
        f"{o2} = {out}.reshape(({x2}.shape[0], {k}))",
        f"{i2} = {ind}.reshape(({x2}.shape[0], {k}))",
        f"{taken} = np.zeros({x2}.shape[1], np.bool_)",
        f"for {i} in range({x2}.shape[0]):",
        f"    for {d} in range({x2}.shape[1]):",
        f"        {taken}[{d}] = False",
        f"    for {j} in range({k}):",
        f"        {b} = -1",
        f"        {bv} = {x2}[{i}, 0]",
        f"        for {d} in range({x2}.shape[1]):",
        f"            {v} = {x2}[{i}, {d}]",
        f"            _rt.check({v} == {v})",
        f"            if not {taken}[{d}] and ({b} < 0 or {v} {better} {bv}):",
        f"                {b} = {d}",
        f"                {bv} = {v}",
        f"        {taken}[{b}] = True",
        f"        {o2}[{i}, {j}] = {bv}",
        f"        {i2}[{i}, {j}] = {b}",
    ]


_TOPK_GRAD = dict(fwd_inputs=("X", "K"), fwd_outputs=("Indices",), grad_outputs=("Out",))

register_op(
    "top_k", inputs=["X", "K?"], outputs=["Out", "Indices"],
    row_wise=RowWise(check=lambda v: "a rank-1 input: top k over the batch"
                     if v.rank("X") < 2 else None),
    attrs={"k": Int(1, low=1, high=3)}, traits=[OPAQUE],
    infer_shape=lambda X, K=None, *, k: _topk_infer(X, K, k, -1, "top_k"),
    reference=lambda X, K=None, *, k: _topk_ref(X, K, k, -1, True, "top_k"),
    emit=Opaque(_topk_lower), grad=default_grad("top_k_grad", **_TOPK_GRAD),
    doc="Out, Indices = the k largest values of X along its last axis (descending), and their "
        "int64 indices; K (a 1-element tensor) overrides k.")

register_op(
    "top_k_v2", inputs=["X", "K?"], outputs=["Out", "Indices"], row_wise=RowWise(axes=("axis",)),
    attrs={"k": Int(1, low=1, high=3), "axis": Int(-1, low=-1, high=3, axis_of="X"),
           "largest": Bool(True), "sorted": Bool(True)},
    traits=[OPAQUE],
    infer_shape=lambda X, K=None, *, k, axis, largest, sorted: _topk_infer(X, K, k, axis,
                                                                          "top_k_v2"),
    # sorted=False leaves the order unspecified in Paddle; returning it sorted is one valid order
    reference=lambda X, K=None, *, k, axis, largest, sorted: _topk_ref(X, K, k, axis, largest,
                                                                      "top_k_v2"),
    emit=Opaque(_topk_lower), grad=default_grad("top_k_v2_grad", **_TOPK_GRAD),
    doc="Out, Indices = the k largest (or smallest) values of X along axis, sorted, and their "
        "int64 indices; ties keep the lower index first.")
