"""Layout ops: reshape(2), transpose(2), squeeze2, unsqueeze2 — same data, new shape or order;
and the tiling ops expand (v1), tile, expand_v2, expand_as_v2 — X repeated or broadcast.

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
    Permute,
    RowWise,
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


def _permute_form(op):
    return Permute("X", "Out", tuple(int(a) for a in op.all_attrs()["axis"]))


def _keeps_batch_axis(v):
    perm = list(v.attr("axis") or [])
    return None if perm and int(perm[0]) == 0 else f"axis={perm} moves the batch axis"
def _numpy_permuted(ctx, X, perm, slot) -> list:
    """The lines binding output ``slot`` to ``X`` permuted by ``perm`` as a new array (NumPy's
    copy)."""
    return [f"{ctx.out(slot)} = {X}.transpose({ctx.tuple_src(perm)}).copy()"]


def _transpose_lower(ctx, permuted=_numpy_permuted):
    """``Out`` = ``X`` permuted, by the lines ``permuted(ctx, X, perm, "Out")`` (a target may
    copy otherwise); a view of ``X`` where the permutation moves only axes of size 1 (known
    when lowering) among the others, whose order it keeps: the values then lie in the same
    order (a channels-last ``[N, 1, 1, C]`` after a global pool back to ``[N, C, 1, 1]``)."""
    X, r = ctx.inp("X"), ctx.rank("X")
    perm = [int(a) % max(r, 1) for a in ctx.attrs["axis"]]
    if sorted(perm) != list(range(r)):
        return None  # an error the reference reports
    shape = ctx.shape("X")
    kept = [p for p in perm if shape[p] != 1]
    if kept == sorted(kept):
        return _view_lines(ctx, [f"{X}.shape[{p}]" for p in perm])
    return _xshape_line(ctx, X) + permuted(ctx, X, perm, "Out")


register_op("transpose2", inputs=["X"], outputs=["Out", "XShape~"], attrs=dict(_AXIS_PERM),
            row_wise=RowWise(drop=("XShape",), check=_keeps_batch_axis),
            traits=[OPAQUE], infer_shape=_transpose_infer, reference=_transpose_ref,
            emit=Opaque(_transpose_lower, host=True),
            grad=default_grad("transpose2_grad", fwd_inputs=(), fwd_outputs=("XShape",)),
            form=_permute_form,
            doc="Out = X with its dims permuted: Out.dim[i] = X.dim[axis[i]].")
register_op("transpose", inputs=["X"], outputs=["Out"], attrs=dict(_AXIS_PERM), traits=[OPAQUE],
            row_wise=RowWise(check=_keeps_batch_axis),
            infer_shape=_transpose_infer, reference=_transpose_ref,
            emit=Opaque(_transpose_lower, host=True), grad=default_grad("transpose_grad"),
            form=_permute_form, doc="transpose2 without XShape (the old op).")


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
    traits=[VIEW], row_wise=RowWise(axes=("axes",), drop=("XShape",), check=lambda v: None
                                    if v.attr("axes") else "no axes: squeezes a batch of 1 too"),
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


def _transpose_grad_lower(ctx, permuted=_numpy_permuted):
    if not ctx.has_output("X@GRAD"):
        return []
    r = ctx.rank("Out@GRAD")
    perm = [int(a) % max(r, 1) for a in ctx.attrs["axis"]]
    if sorted(perm) != list(range(r)):
        return None  # an error the reference reports
    inv = [perm.index(i) for i in range(r)]
    return permuted(ctx, ctx.inp("Out@GRAD"), inv, "X@GRAD")


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


# ---- tiling and broadcasting: expand (v1), tile, expand_v2, expand_as_v2 -----------------------
# Out repeats X: ``tile``/``expand`` (Fluid 1.x's tiling) repeat whole copies of X along each
# dim; ``expand_v2``/``expand_as_v2`` broadcast dims of size 1. Both are ``Out[c] =
# X[c % X.dims]`` with X padded with leading 1s to Out's rank, so all four lower to one kernel
# (``_nn.tile_nd``) and their gradients to its adjoint (``_nn.untile_nd``: the sum over the
# copies). Repeat counts and shapes given as tensors are read at run time, natively too.
_TILE_MAX_RANK = 6


def _tensor_count(meta, what: str) -> int:
    """How many values a 1-D shape tensor holds (must be known at build time: it is a rank)."""
    n = meta.shape[0] if meta.shape else 1
    if n < 0:
        raise ShapeMismatch(f"{what}: its length decides Out's rank, so it must be known when "
                            f"the program is built: expected shape [k], got {list(meta.shape)}")
    return n


def _given_values(tensor, tensor_list, attr):
    """The repeat counts or target dims: from the tensor input, the list of 1-element tensors,
    or the attribute (run time)."""
    if tensor is not None:
        return int_values(tensor)
    if tensor_list:
        return int_values(tensor_list)
    return [int(v) for v in attr]


def _tiled_dims(x_shape, reps, op: str) -> tuple:
    """(X's dims padded to Out's rank, Out's dims) of tiling X ``reps`` times."""
    r = max(len(x_shape), len(reps))
    if r > _TILE_MAX_RANK:
        raise ShapeMismatch(f"{op}: expected a rank <= {_TILE_MAX_RANK}, got X "
                            f"{list(x_shape)} repeated {list(reps)}")
    xd = (1,) * (r - len(x_shape)) + tuple(x_shape)
    rp = (1,) * (r - len(reps)) + tuple(int(t) for t in reps)
    for t in rp:
        if t < 1 and t != -1:
            raise ShapeMismatch(f"{op}: expected repeat counts >= 1, got {list(reps)}")
    return xd, tuple(-1 if d < 0 or t < 0 else d * t for d, t in zip(xd, rp))


def _broadcast_dims(x_shape, shape, op: str, keep=True) -> tuple:
    """(X's dims padded to Out's rank, Out's dims) of broadcasting X to ``shape`` (-1 keeps X's
    dim with ``keep``)."""
    r = len(shape)
    if r < len(x_shape) or r > _TILE_MAX_RANK:
        raise ShapeMismatch(f"{op}: expected a target shape of rank {len(x_shape)}.."
                            f"{_TILE_MAX_RANK} (X is {list(x_shape)}), got {list(shape)}")
    xd = (1,) * (r - len(x_shape)) + tuple(x_shape)
    out = []
    for i, (d, s) in enumerate(zip(xd, shape)):
        s = int(s)
        if s == -1 and keep:
            if i < r - len(x_shape):
                raise ShapeMismatch(f"{op}: a new leading dim cannot be -1: expected a size "
                                    f"at index {i} of shape {list(shape)}")
            out.append(d)
        elif s < 1 and s != -1:
            raise ShapeMismatch(f"{op}: expected target dims >= 1, got {list(shape)}")
        elif d in (1, -1) or s == -1 or d == s:
            out.append(s)
        else:
            raise ShapeMismatch(f"{op}: X's dim {i - (r - len(x_shape))} of size {d} can only "
                                f"be broadcast from 1: expected {d} or a dim of size 1, got "
                                f"target {s} (X {list(x_shape)}, shape {list(shape)})")
    return xd, tuple(out)


def _tile_array(x, xd, od) -> np.ndarray:
    reps = tuple(o // d if d else 0 for d, o in zip(xd, od))
    return np.tile(x.reshape(xd), reps) if x.size else np.zeros(od, x.dtype)


def _untile_array(g, xd, od, x_shape, op: str) -> np.ndarray:
    if tuple(g.shape) != tuple(od):
        raise ShapeMismatch(f"{op}: expected Out@GRAD of shape {list(od)} (Out's), got "
                            f"{list(g.shape)}")
    inter = []
    for d, o in zip(xd, od):
        inter += [o // d if d else 0, d]
    axes = tuple(range(0, 2 * len(xd), 2))
    return g.reshape(inter).sum(axis=axes).reshape(x_shape).astype(g.dtype)


# the four ops: (tensor slot, list slot, attribute, broadcast?)
_TILING = {
    "expand": ("ExpandTimes", "expand_times_tensor", "expand_times", False),
    "tile": ("RepeatTimes", "repeat_times_tensor", "repeat_times", False),
    "expand_v2": ("Shape", "expand_shapes_tensor", "shape", True),
    "expand_as_v2": (None, None, "target_shape", True),
}


def _tiling_dims(op, x_shape, values, Y=None):
    """(padded X dims, Out dims) of op ``op`` given the run-time or build-time ``values``."""
    if op == "expand":
        if len(values) != len(x_shape):
            raise ShapeMismatch(f"expand: expected expand_times with one count per dim of X "
                                f"{list(x_shape)}, got {list(values)}")
        return _tiled_dims(x_shape, values, op)
    if op == "tile":
        return _tiled_dims(x_shape, values, op)
    if op == "expand_as_v2" and not values:
        if Y is None:
            raise ShapeMismatch("expand_as_v2: expected target_shape or an input Y, got "
                                "neither")
        values = list(Y)
    return _broadcast_dims(x_shape, values, op, keep=op == "expand_v2")


def _make_tiling(op):
    t_slot, l_slot, attr, _ = _TILING[op]

    def infer(X, Y=None, **kw):
        tensor, tlist = kw.get(t_slot) if t_slot else None, kw.get(l_slot) if l_slot else None
        if X.ndim == 0 and op == "expand":
            raise ShapeMismatch("expand: expected X of rank >= 1, got a 0-d tensor")
        if tensor is not None or tlist:
            n = _tensor_count(tensor, t_slot) if tensor is not None else len(tlist)
            r = max(n, X.ndim) if op == "tile" else n
            return {"Out": X.with_(shape=(-1,) * r)}
        _, od = _tiling_dims(op, X.shape, [int(v) for v in kw[attr]],
                             Y.shape if Y is not None else None)
        return {"Out": X.with_(shape=od)}

    def ref(X, Y=None, **kw):
        tensor, tlist = kw.get(t_slot) if t_slot else None, kw.get(l_slot) if l_slot else None
        values = _given_values(tensor, tlist, kw[attr])
        xd, od = _tiling_dims(op, X.shape, values, Y.shape if Y is not None else None)
        return {"Out": _tile_array(X, xd, od)}

    return infer, ref


def _make_untile_ref(op):
    t_slot, l_slot, attr, _ = _TILING[op]

    def ref(X, **kw):
        g = kw["Out@GRAD"]
        tensor, tlist = kw.get(t_slot) if t_slot else None, kw.get(l_slot) if l_slot else None
        values = _given_values(tensor, tlist, kw[attr])
        if op == "expand_as_v2" and not values:
            values = list(g.shape)  # Y is not an input of the grad op: Out@GRAD has Out's shape
        xd, od = _tiling_dims(op, X.shape, values)
        return {"X@GRAD": _untile_array(g, xd, od, X.shape, f"{op}_grad")}
    return ref


_TILING_DOCS = {
    "expand": "Out = X tiled expand_times[i] times along each dim i (Fluid 1.x's expand; "
              "ExpandTimes or expand_times_tensor override the attribute).",
    "tile": "Out = X tiled repeat_times[i] times along each dim i (X or repeat_times padded "
            "with leading 1s to one rank; RepeatTimes or repeat_times_tensor override).",
    "expand_v2": "Out = X broadcast to shape (X padded with leading 1s; -1 keeps X's dim; "
                 "Shape or expand_shapes_tensor override).",
    "expand_as_v2": "Out = X broadcast to target_shape (or Y's shape when target_shape is "
                    "empty).",
}

for _op, (_t, _l, _attr, _bcast) in _TILING.items():
    _ins = ["X"] + ([f"{_t}?", f"{_l}*?"] if _t else ["Y?"])
    _infer, _ref = _make_tiling(_op)
    _fwd = ("X", _t, _l) if _t else ("X",)
    register_op(
        _op, inputs=_ins, outputs=["Out"], attrs={_attr: Ints([])}, traits=[OPAQUE],
        infer_shape=_infer, reference=_ref, emit=Opaque(),
        grad=default_grad(f"{_op}_grad", fwd_inputs=_fwd), doc=_TILING_DOCS[_op])
    register_op(
        f"{_op}_grad", inputs=[i for i in _ins if i != "Y?"] + ["Out@GRAD"], outputs=["X@GRAD?"],
        attrs={_attr: Ints([])}, traits=[OPAQUE], infer_shape=_grad_meta_from_x,
        reference=_make_untile_ref(_op), emit=Opaque(), grad=None,
        doc=f"X@GRAD = the sum of Out@GRAD over the copies of X; the gradient of {_op}.")
