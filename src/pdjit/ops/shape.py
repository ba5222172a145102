"""Layout ops: reshape(2), transpose(2), squeeze2, unsqueeze2 — same data, new shape or order.

Semantics follow PaddlePaddle 3.3.1's legacy ops (checked against it while writing). Build-time
shapes keep ``-1`` for dims unknown until run time; where an unknown dim only passes through
(``reshape2`` of ``[-1, 3, 4]`` to ``[0, -1]``) the other dims are still worked out.

``XShape`` (of the ``*2`` variants) exists for the backward pass only: like Paddle it has shape
``[0] + X.shape``, and its value is an empty array of that shape.

Ops reading tensor-valued attributes (``Shape``/``ShapeTensor``, ``AxesTensor``...) give ``-1``
for the dims those values decide; the reference reads the values at run time.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    VIEW,
    Bool,
    Ints,
    Opaque,
    default_grad,
    register_op,
)
from pdjit.ops._common import int_values, norm_axis, prod_known


def _xshape(X):
    """XShape's value: an empty array of shape [0] + X.shape (it only carries X's shape)."""
    return np.empty((0,) + X.shape, X.dtype)



# ---- reshape / reshape2 ----------------------------------------------------------------------
def reshape_target(in_shape, shape) -> tuple:
    """Fluid's reshape rule: ``0`` copies the input dim at that index, one ``-1`` is inferred.

    Works on build-time shapes (``-1`` = unknown input dims) and on run-time ones alike.
    """
    in_shape, shape = tuple(in_shape), [int(s) for s in shape]
    bad = f"reshape of X {list(in_shape)} to shape {shape}"
    out, infer_at, copied = [], None, set()
    for i, s in enumerate(shape):
        if s == -1:
            if infer_at is not None:
                raise ShapeMismatch(f"{bad}: expected at most one -1 in shape, got two")
            infer_at = i
            out.append(-1)
        elif s == 0:
            if i >= len(in_shape):
                raise ShapeMismatch(f"{bad}: shape[{i}] = 0 copies X's dim {i}, but X has rank "
                                    f"{len(in_shape)}: expected 0 only below index "
                                    f"{len(in_shape)}")
            copied.add(i)
            out.append(in_shape[i])
        elif s > 0:
            out.append(s)
        else:
            raise ShapeMismatch(f"{bad}: expected dims > 0, 0 (copy) or -1 (infer), got {s}")
    # copied dims cancel out, so the rest of X must hold as many elements as the rest of Out
    in_rest = prod_known(d for j, d in enumerate(in_shape) if j not in copied)
    out_rest = prod_known(d for j, d in enumerate(out) if j not in copied and j != infer_at)
    if infer_at is not None:
        if in_rest >= 0:
            if out_rest == 0 or in_rest % out_rest:
                raise ShapeMismatch(f"{bad}: expected X's {in_rest} elements (beyond copied "
                                    f"dims) to divide by {out_rest}, got a remainder")
            out[infer_at] = in_rest // out_rest
    elif in_rest >= 0 and out_rest >= 0 and in_rest != out_rest:
        raise ShapeMismatch(f"{bad}: expected as many elements as X ({in_rest}), got {out_rest}")
    return tuple(out)


def _xshape_line(ctx, X) -> list:
    if not ctx.has_output("XShape"):
        return []
    dims = ["0"] + [f"{X}.shape[{i}]" for i in range(ctx.rank("X"))]
    return [f"{ctx.out('XShape')} = np.empty({ctx.tuple_src(dims)}, {ctx.T('X')})"]


def _view_lines(ctx, dims) -> list:
    """Out = X viewed with ``dims`` (source expressions), checked to hold X's elements."""
    X = ctx.inp("X")
    lines = _xshape_line(ctx, X)
    total = " * ".join(f"({d})" for d in dims) or "1"
    lines.append(f"_rt.check({total} == {X}.size)")
    lines.append(f"{ctx.out('Out')} = {X}.reshape({ctx.tuple_src(dims)})")
    return lines


def _reshape_lower(ctx):
    if ctx.has_input("Shape") or ctx.has_input("ShapeTensor"):
        return None  # the target shape is a run-time value
    X, shape = ctx.inp("X"), [int(s) for s in ctx.attrs["shape"]]
    if shape.count(-1) > 1 or any(s < -1 for s in shape) or \
            any(s == 0 and i >= ctx.rank("X") for i, s in enumerate(shape)):
        return None  # an error the reference reports
    dims = [f"{X}.shape[{i}]" if s == 0 else str(s) for i, s in enumerate(shape)]
    if -1 in shape:
        at = shape.index(-1)
        rest = " * ".join(f"({d})" for i, d in enumerate(dims) if i != at) or "1"
        dims[at] = f"({X}.size // ({rest}) if ({rest}) > 0 else -1)"
    return _view_lines(ctx, dims)


def _reshape_infer(X, Shape=None, ShapeTensor=None, *, shape, **_):
    if ShapeTensor:
        out = (-1,) * len(ShapeTensor)
    elif Shape is not None:
        if Shape.ndim != 1 or (Shape.shape[0] < 0 and not shape):
            raise ShapeMismatch(f"reshape: expected Shape to be a 1-D tensor of known length, "
                                f"got shape {list(Shape.shape)}")
        out = (-1,) * (Shape.shape[0] if Shape.shape[0] >= 0 else len(shape))
    else:
        out = reshape_target(X.shape, shape)
    return {"Out": X.with_(shape=out), "XShape": X.with_(shape=(0,) + X.shape)}


def _reshape_ref(X, Shape=None, ShapeTensor=None, *, shape, **_):
    if ShapeTensor:
        shape = int_values(ShapeTensor)
    elif Shape is not None:
        shape = int_values(Shape)
    return {"Out": X.reshape(reshape_target(X.shape, shape)), "XShape": _xshape(X)}


_SHAPE_IN = ["X", "Shape?", "ShapeTensor*?"]
register_op(
    "reshape2", inputs=_SHAPE_IN, outputs=["Out", "XShape~"],
    attrs={"shape": Ints([]), "use_quantizer": Bool(False)}, traits=[VIEW],
    infer_shape=_reshape_infer, reference=_reshape_ref, emit=Opaque(_reshape_lower, host=True),
    grad=default_grad("reshape2_grad", fwd_inputs=(), fwd_outputs=("XShape",)),
    doc="Out = X with a new shape: 0 copies X's dim, -1 is inferred; ShapeTensor (a list of "
        "1-element tensors) or Shape (a 1-D tensor) override the shape attribute.")
# the old ops without XShape share the functions: results for undeclared slots are ignored
register_op(
    "reshape", inputs=_SHAPE_IN, outputs=["Out"], attrs={"shape": Ints([])}, traits=[VIEW],
    infer_shape=_reshape_infer, reference=_reshape_ref, emit=Opaque(_reshape_lower, host=True),
    grad=default_grad("reshape_grad"),
    doc="reshape2 without XShape (the old op).")


# ---- transpose / transpose2 ------------------------------------------------------------------
def _perm(axis, rank) -> list:
    perm = [norm_axis(int(a), rank, "axis") for a in axis]
    if len(perm) != rank or sorted(perm) != list(range(rank)):
        raise ShapeMismatch(f"transpose: expected axis to be a permutation of 0..{rank - 1} for X "
                            f"of rank {rank}, got {list(axis)}")
    return perm


def _transpose_infer(X, *, axis):
    perm = _perm(axis, X.ndim)
    return {"Out": X.with_(shape=tuple(X.shape[p] for p in perm)),
            "XShape": X.with_(shape=(0,) + X.shape)}


def _transpose_ref(X, *, axis):
    # a copy: transposed data is laid out anew, as Paddle's kernel does
    return {"Out": np.transpose(X, _perm(axis, X.ndim)).copy(),
            "XShape": _xshape(X)}


_AXIS_PERM = {"axis": Ints(REQUIRED, choices=([1, 0], [0, 2, 1], [2, 0, 1]))}
def _transpose_lower(ctx):
    X, r = ctx.inp("X"), ctx.rank("X")
    perm = [int(a) % max(r, 1) for a in ctx.attrs["axis"]]
    if sorted(perm) != list(range(r)):
        return None  # an error the reference reports
    return _xshape_line(ctx, X) + [
        f"{ctx.out('Out')} = {X}.transpose({ctx.tuple_src(perm)}).copy()"]


register_op("transpose2", inputs=["X"], outputs=["Out", "XShape~"], attrs=dict(_AXIS_PERM),
            traits=[OPAQUE], infer_shape=_transpose_infer, reference=_transpose_ref,
            emit=Opaque(_transpose_lower, host=True),
            grad=default_grad("transpose2_grad", fwd_inputs=(), fwd_outputs=("XShape",)),
            doc="Out = X with its dims permuted: Out.dim[i] = X.dim[axis[i]].")
register_op("transpose", inputs=["X"], outputs=["Out"], attrs=dict(_AXIS_PERM), traits=[OPAQUE],
            infer_shape=_transpose_infer, reference=_transpose_ref,
            emit=Opaque(_transpose_lower, host=True), grad=default_grad("transpose_grad"),
            doc="transpose2 without XShape (the old op).")


# ---- squeeze2 / unsqueeze2 -------------------------------------------------------------------
def squeeze_shape(shape, axes, runtime) -> tuple:
    """Drop size-1 dims: those in ``axes`` (others are left), or every one when axes is empty.

    At build time an unknown dim named in ``axes`` is assumed to be 1, as Paddle does.
    """
    rank = len(shape)
    if rank == 0:
        return ()
    named = {norm_axis(int(a), rank, "axes") for a in axes}
    drop = {i for i in (named or range(rank))
            if shape[i] == 1 or (named and not runtime and shape[i] == -1)}
    return tuple(d for i, d in enumerate(shape) if i not in drop)


def unsqueeze_shape(shape, axes) -> tuple:
    """Insert size-1 dims one axis at a time; a negative axis counts in the shape so far."""
    out = list(shape)
    for a in axes:
        cur = int(a) + len(out) + 1 if a < 0 else int(a)
        if not 0 <= cur <= len(out):
            raise ShapeMismatch(f"unsqueeze: axis {a} is out of range for a tensor of rank "
                                f"{len(out)}: expected {-len(out) - 1}..{len(out)}")
        out.insert(cur, 1)
    return tuple(out)


def _squeeze_lower(ctx):
    """The dims to drop are fixed at build time; each must be 1 at run time (else the
    reference, which keeps a non-1 dim named in axes, decides)."""
    X, r = ctx.inp("X"), ctx.rank("X")
    out_rank = ctx.rank("Out")
    build = ctx._var(ctx.op.input("X")[0]).shape
    named = {int(a) % max(r, 1) for a in ctx.attrs["axes"]}
    drop = [i for i in range(r) if (i in named if named else build[i] == 1)]
    keep = [i for i in range(r) if i not in drop]
    if len(keep) != out_rank:
        return None
    checks = [f"_rt.check({X}.shape[{i}] == 1)" for i in drop]
    return checks + _view_lines(ctx, [f"{X}.shape[{i}]" for i in keep])


register_op(
    "squeeze2", inputs=["X"], outputs=["Out", "XShape~"], attrs={"axes": Ints([])},
    traits=[VIEW],
    infer_shape=lambda X, *, axes: {"Out": X.with_(shape=squeeze_shape(X.shape, axes, False)),
                                    "XShape": X.with_(shape=(0,) + X.shape)},
    reference=lambda X, *, axes: {"Out": X.reshape(squeeze_shape(X.shape, axes, True)),
                                  "XShape": _xshape(X)},
    emit=Opaque(lambda ctx: _squeeze_lower(ctx), host=True),
    grad=default_grad("squeeze2_grad", fwd_inputs=(), fwd_outputs=("XShape",)),
    doc="Out = X without its size-1 dims among axes (every size-1 dim when axes is empty); "
        "dims of other sizes are left in place.")


def _unsqueeze_infer(X, AxesTensor=None, AxesTensorList=None, *, axes):
    if AxesTensorList:
        out = (-1,) * (X.ndim + len(AxesTensorList))
    elif AxesTensor is not None:
        if AxesTensor.ndim != 1 or AxesTensor.shape[0] < 0:
            raise ShapeMismatch(f"unsqueeze2: expected AxesTensor 1-D of known length, got "
                                f"shape {list(AxesTensor.shape)}")
        out = (-1,) * (X.ndim + AxesTensor.shape[0])
    else:
        out = unsqueeze_shape(X.shape, axes)
    return {"Out": X.with_(shape=out), "XShape": X.with_(shape=(0,) + X.shape)}


def _unsqueeze_ref(X, AxesTensor=None, AxesTensorList=None, *, axes):
    if AxesTensorList:
        axes = int_values(AxesTensorList)
    elif AxesTensor is not None:
        axes = int_values(AxesTensor)
    return {"Out": X.reshape(unsqueeze_shape(X.shape, axes)), "XShape": _xshape(X)}


register_op(
    "unsqueeze2", inputs=["X", "AxesTensor?", "AxesTensorList*?"], outputs=["Out", "XShape~"],
    attrs={"axes": Ints([])}, traits=[VIEW], infer_shape=_unsqueeze_infer,
    reference=_unsqueeze_ref, emit=Opaque(lambda ctx: _unsqueeze_lower(ctx), host=True),
    grad=default_grad("unsqueeze2_grad", fwd_inputs=("AxesTensor", "AxesTensorList"),
                      fwd_outputs=("XShape",)),
    doc="Out = X with size-1 dims inserted at axes, in order.")



def _unsqueeze_lower(ctx):
    if ctx.has_input("AxesTensor") or ctx.has_input("AxesTensorList"):
        return None
    X, r = ctx.inp("X"), ctx.rank("X")
    marks = tuple(range(2, r + 2))  # stand-ins for X's dims (never 1)
    try:
        placed = unsqueeze_shape(marks, ctx.attrs["axes"])
    except ShapeMismatch:
        return None
    return _view_lines(ctx, [f"{X}.shape[{d - 2}]" if d != 1 else "1" for d in placed])


# ---- gradients ---------------------------------------------------------------------------------
# A layout op moves elements without arithmetic, so its gradient moves Out@GRAD back: a view
# with X's shape (reshape, squeeze, unsqueeze) or the inverse permutation (transpose). The *2
# grad ops learn X's shape from XShape (shape [0] + X.shape), as Paddle's do, so X itself need
# not stay alive for the backward pass; the old ops read X.
def _shape_from_xshape(XShape) -> tuple:
    """X's shape, as carried by XShape ([0] + X.shape)."""
    if XShape.ndim == 0 or XShape.shape[0] != 0:
        raise ShapeMismatch(f"expected XShape of shape [0] + X.shape, got {list(XShape.shape)}")
    return XShape.shape[1:]


def _grad_meta_from_xshape(XShape, **_):
    return {"X@GRAD": XShape.with_(shape=_shape_from_xshape(XShape))}


def _grad_meta_from_x(X, **_):
    return {"X@GRAD": X}


def _regrow(target_shape, **kw):
    """X@GRAD = Out@GRAD with X's shape (the views' gradient), checked to hold X's elements."""
    g = kw["Out@GRAD"]
    if g.size != int(np.prod(target_shape)):
        raise ShapeMismatch(f"expected Out@GRAD with {int(np.prod(target_shape))} elements (X's "
                            f"shape {list(target_shape)}), got shape {list(g.shape)}")
    return {"X@GRAD": g.reshape(target_shape)}


def _view_grad_lower(shape_slot):
    """Lowering of a view's gradient: Out@GRAD reshaped to X's shape, read at run time from
    ``shape_slot`` (XShape: its dims 1..; X: its dims)."""
    def lower(ctx):
        if not ctx.has_output("X@GRAD"):
            return []
        src = ctx.inp(shape_slot)
        skip = 1 if shape_slot == "XShape" else 0
        rank = ctx.rank(shape_slot) - skip
        dims = [f"{src}.shape[{i + skip}]" for i in range(rank)]
        g = ctx.inp("Out@GRAD")
        total = " * ".join(f"({d})" for d in dims) or "1"
        return [f"_rt.check({total} == {g}.size)",
                f"{ctx.out('X@GRAD')} = {g}.reshape({ctx.tuple_src(dims)})"]
    return Opaque(lower, host=True)


_VIEW_GRADS = [
    # grad op, its inputs, its attrs (the forward op's: the grad maker copies them)
    ("reshape2_grad", ["XShape", "Out@GRAD"], {"shape": Ints([]), "use_quantizer": Bool(False)}),
    ("squeeze2_grad", ["XShape", "Out@GRAD"], {"axes": Ints([])}),
    ("unsqueeze2_grad", ["XShape", "AxesTensor?", "AxesTensorList*?", "Out@GRAD"],
     {"axes": Ints([])}),
]
for _name, _ins, _attrs in _VIEW_GRADS:
    register_op(
        _name, inputs=_ins, outputs=["X@GRAD?"], attrs=_attrs, traits=[VIEW],
        infer_shape=_grad_meta_from_xshape,
        reference=lambda XShape, **kw: _regrow(_shape_from_xshape(XShape), **kw),
        emit=_view_grad_lower("XShape"), grad=None,
        doc=f"X@GRAD = Out@GRAD viewed with X's shape (XShape's dims after the first); the "
            f"gradient of {_name[:-5]}.")

# Paddle's old reshape_grad also lists Out, Shape and ShapeTensor; they are accepted (so its
# programs load) but not needed: X carries the shape.
register_op(
    "reshape_grad", inputs=["X", "Out?", "Shape?", "ShapeTensor*?", "Out@GRAD"],
    outputs=["X@GRAD?"], attrs={"shape": Ints([])}, traits=[VIEW],
    infer_shape=_grad_meta_from_x, reference=lambda X, **kw: _regrow(X.shape, **kw),
    emit=_view_grad_lower("X"), grad=None,
    doc="X@GRAD = Out@GRAD viewed with X's shape; the gradient of the old reshape op.")


def _inverse_perm(axis, rank) -> list:
    perm = _perm(axis, rank)
    inv = [0] * rank
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _transpose_grad_ref(target_shape, axis, g):
    inv = _inverse_perm(axis, len(target_shape))
    out = np.transpose(g, inv)
    if out.shape != tuple(target_shape):
        raise ShapeMismatch(f"transpose grad: expected Out@GRAD of shape "
                            f"{[target_shape[p] for p in _perm(axis, len(target_shape))]}, "
                            f"got {list(g.shape)}")
    return {"X@GRAD": out.copy()}


def _transpose_grad_lower(ctx):
    if not ctx.has_output("X@GRAD"):
        return []
    r = ctx.rank("Out@GRAD")
    perm = [int(a) % max(r, 1) for a in ctx.attrs["axis"]]
    if sorted(perm) != list(range(r)):
        return None  # an error the reference reports
    inv = [perm.index(i) for i in range(r)]
    g = ctx.inp("Out@GRAD")
    return [f"{ctx.out('X@GRAD')} = {g}.transpose({ctx.tuple_src(inv)}).copy()"]


register_op(
    "transpose2_grad", inputs=["XShape", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_AXIS_PERM), traits=[OPAQUE], infer_shape=_grad_meta_from_xshape,
    reference=lambda XShape, *, axis, **kw: _transpose_grad_ref(_shape_from_xshape(XShape), axis,
                                                                kw["Out@GRAD"]),
    emit=Opaque(_transpose_grad_lower, host=True), grad=None,
    doc="X@GRAD = Out@GRAD permuted back (the inverse of axis); the gradient of transpose2.")
# Paddle's old transpose_grad also lists Out; accepted, not needed.
register_op(
    "transpose_grad", inputs=["X", "Out?", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_AXIS_PERM), traits=[OPAQUE], infer_shape=_grad_meta_from_x,
    reference=lambda X, *, axis, **kw: _transpose_grad_ref(X.shape, axis, kw["Out@GRAD"]),
    emit=Opaque(_transpose_grad_lower, host=True), grad=None,
    doc="X@GRAD = Out@GRAD permuted back (the inverse of axis); the gradient of transpose.")
