"""Binary elementwise ops with Fluid's ``axis`` broadcasting, comparisons and logical ops."""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    ADDITION,
    BROADCAST,
    ELEMENTWISE,
    EMPTY_VAR_NAME,
    MULTIPLICATION,
    OPAQUE,
    ZEROS_LIKE,
    Bool,
    ChannelAffine,
    Int,
    Opaque,
    default_grad,
    register_op,
)
from pdjit.ops._common import (
    NUMERIC,
    align_for_axis,
    aligned_arrays,
    broadcast_shapes,
    check_dtype,
    reduce_to_shape,
)

_AXIS = {"axis": Int(-1, low=-1, high=4, at_least=-1, axis_of=("X", "Y"))}
BOOL = np.dtype(np.bool_)


def _binary_infer(out_dtype=None, allowed=NUMERIC):
    def infer(X, Y, *, axis):
        check_dtype(X, allowed, "input X")
        if X.dtype != Y.dtype:
            raise ShapeMismatch(f"X and Y must have one dtype: expected Y {X.dtype}, got "
                                f"{Y.dtype}")
        shape = broadcast_shapes(X.shape, Y.shape, axis)
        return {"Out": X.with_(shape=shape, dtype=out_dtype or X.dtype)}
    return infer


def _binary_ref(fn, out_dtype=None):
    def ref(X, Y, *, axis):
        x, y = aligned_arrays(X, Y, axis)
        out = np.asarray(fn(x, y))
        return {"Out": out.astype(out_dtype or X.dtype, copy=False)}
    return ref


def _int_div(x, y):
    if x.dtype.kind in "iu":
        if np.any(y == 0):
            raise ZeroDivisionError("integer division by zero")
        q = np.abs(x) // np.abs(y)
        return np.where((x < 0) ^ (y < 0), -q, q)  # C semantics: truncate toward zero
    return x / y


def _floordiv(x, y):
    if x.dtype.kind in "iu" and np.any(y == 0):
        raise ZeroDivisionError("integer division by zero")
    return np.floor_divide(x, y)


def _mod(x, y):
    if x.dtype.kind in "iu" and np.any(y == 0):
        raise ZeroDivisionError("integer modulo by zero")
    return np.mod(x, y)


# name, NumPy semantics, scalar template for the code generator
_ARITH = [
    ("elementwise_add", np.add, "{X} + {Y}"),
    ("elementwise_sub", np.subtract, "{X} - {Y}"),
    ("elementwise_mul", np.multiply, "{X} * {Y}"),
    ("elementwise_div", _int_div, "{X} / {Y}"),
    ("elementwise_max", np.maximum, "np.maximum({X}, {Y})"),
    ("elementwise_min", np.minimum, "np.minimum({X}, {Y})"),
    ("elementwise_pow", np.power, "{X} ** {Y}"),
    ("elementwise_mod", _mod, "{X} % {Y}"),
    ("elementwise_floordiv", _floordiv, "{X} // {Y}"),
]
_NON_DIFFERENTIABLE = {"elementwise_mod", "elementwise_floordiv"}
# Integer division, modulo and power raise on a zero divisor or a negative exponent in the
# reference; the generated code would not, so for integers these ops run their reference.
_FLOAT_ONLY_EMIT = {"elementwise_div", "elementwise_mod", "elementwise_floordiv",
                    "elementwise_pow"}


_DOMAINS = {"elementwise_div": {"Y": "nonzero"}, "elementwise_mod": {"Y": "nonzero"},
            "elementwise_floordiv": {"Y": "nonzero"}, "elementwise_pow": {"X": "positive"}}


_DECLARED = {"elementwise_add": [ADDITION], "elementwise_mul": [MULTIPLICATION]}


def _emit_for(name, template):
    if name not in _FLOAT_ONLY_EMIT:
        return template
    return lambda dtypes_, **_: template if np.dtype(dtypes_["X"]).kind == "f" else None


def _channel_axis(op, axis: int) -> int | None:
    """For a Y of more than one dim that varies along one of them (a bias of shape
    ``[1, C, 1, 1]``, as PaddlePaddle 2.x saves a convolution's): the dim of X it varies
    along, by Fluid's ``axis`` rule; None for any other Y (and where the shapes are unknown)."""
    ys = [n for n in op.input("Y") if n != EMPTY_VAR_NAME]
    xs = [n for n in op.input("X") if n != EMPTY_VAR_NAME]
    yv = op.block._find_var_recursive(ys[0]) if len(ys) == 1 else None
    xv = op.block._find_var_recursive(xs[0]) if len(xs) == 1 else None
    if yv is None or xv is None or not 1 < len(yv.shape) <= len(xv.shape):
        return None
    try:
        _, ya = align_for_axis(tuple(xv.shape), tuple(yv.shape), axis)
    except ShapeMismatch:
        return None
    varying = [i for i, d in enumerate(ya) if d != 1]
    return varying[0] if len(varying) == 1 else None


def _channel_affine(name):
    """A constant Y added or multiplied along X's dim ``axis`` (the last for -1), 1-D or of
    the shape :func:`_channel_axis` reads: per channel, what inference passes fold into a
    preceding convolution or product, and what a convolution's stores may apply."""
    if name not in ("elementwise_add", "elementwise_mul"):
        return None
    add = name == "elementwise_add"

    def inference(op):
        attr = int(op.all_attrs().get("axis", -1))
        axis = _channel_axis(op, attr)

        def coefficients(v):
            y = v["Y"]
            if y.ndim != 1:
                if axis is None or sum(d != 1 for d in y.shape) != 1:
                    return None
                y = y.reshape(y.size)
            return (None, y) if add else (y, None)
        return ChannelAffine("X", "Out", attr if axis is None else axis, ("Y",), coefficients)
    return inference


for _name, _fn, _emit in _ARITH:
    register_op(
        _name, inputs=["X", "Y"], outputs=["Out"], attrs=dict(_AXIS),
        traits=[BROADCAST] + _DECLARED.get(_name, []),
        infer_shape=_binary_infer(), reference=_binary_ref(_fn), emit=_emit_for(_name, _emit),
        domain=_DOMAINS.get(_name), inference=_channel_affine(_name),
        grad=None if _name in _NON_DIFFERENTIABLE else default_grad(
            f"{_name}_grad", fwd_inputs=("X", "Y"),
            fwd_outputs=("Out",) if _name == "elementwise_div" else (), wrt=("X", "Y")),
        doc=f"Out = {_emit.format(X='X', Y='Y')}, Y broadcast into X by Fluid's axis rule.")

_COMPARE = [
    ("less_than", np.less, "{X} < {Y}"),
    ("less_equal", np.less_equal, "{X} <= {Y}"),
    ("greater_than", np.greater, "{X} > {Y}"),
    ("greater_equal", np.greater_equal, "{X} >= {Y}"),
    ("equal", np.equal, "{X} == {Y}"),
    ("not_equal", np.not_equal, "{X} != {Y}"),
]
for _name, _fn, _emit in _COMPARE:
    register_op(
        _name, inputs=["X", "Y"], outputs=["Out"],
        attrs={**_AXIS, "force_cpu": Bool(False)},
        traits=[BROADCAST], infer_shape=_binary_infer(BOOL, NUMERIC + (BOOL,)),
        reference=_binary_ref(_fn, BOOL), emit=_emit, grad=None,
        doc=f"Out = {_emit.format(X='X', Y='Y')} elementwise (bool), with axis broadcasting.")

_LOGICAL = [
    ("logical_and", np.logical_and, "bool({X}) and bool({Y})"),
    ("logical_or", np.logical_or, "bool({X}) or bool({Y})"),
    ("logical_xor", np.logical_xor, "bool({X}) != bool({Y})"),
]


def _logical_infer(X, Y=None):
    if Y is None:
        return {"Out": X.with_(dtype=BOOL)}
    return {"Out": X.with_(shape=broadcast_shapes(X.shape, Y.shape, -1), dtype=BOOL)}


for _name, _fn, _emit in _LOGICAL:
    register_op(
        _name, inputs=["X", "Y"], outputs=["Out"], traits=[BROADCAST],
        infer_shape=_logical_infer,
        reference=lambda X, Y, _fn=_fn: {"Out": _fn(X.astype(bool), Y.astype(bool))},
        emit=_emit, grad=None,
        doc=f"Out = X {_name[8:]} Y elementwise, on truth values (NumPy broadcasting).")

register_op(
    "logical_not", inputs=["X"], outputs=["Out"], traits=[BROADCAST],
    infer_shape=_logical_infer, reference=lambda X: {"Out": np.logical_not(X.astype(bool))},
    emit="not bool({X})", grad=None, doc="Out = not X elementwise.")


# ---- gradients ---------------------------------------------------------------------------------
# d(op)/dX and d(op)/dY as NumPy functions of (x, y, out, dout) on the aligned operands; each
# result is summed back to its operand's shape where the forward op broadcast it.
_GRADS = {
    "elementwise_add": (lambda x, y, o, g: g, lambda x, y, o, g: g),
    "elementwise_sub": (lambda x, y, o, g: g, lambda x, y, o, g: -g),
    "elementwise_mul": (lambda x, y, o, g: g * y, lambda x, y, o, g: g * x),
    "elementwise_div": (lambda x, y, o, g: g / y, lambda x, y, o, g: -g * x / (y * y)),
    "elementwise_max": (lambda x, y, o, g: g * (x > y), lambda x, y, o, g: g * (x <= y)),
    "elementwise_min": (lambda x, y, o, g: g * (x < y), lambda x, y, o, g: g * (x >= y)),
    "elementwise_pow": (lambda x, y, o, g: g * y * np.power(x, y - 1),
                        lambda x, y, o, g: g * np.log(np.where(x > 0, x, 1)) * np.power(x, y)),
}


def _ew_grad_infer(X, Y, **_):
    return {"X@GRAD": X, "Y@GRAD": Y}


def _ew_grad_ref(dx, dy):
    def ref(X, Y, *, axis, **kw):
        g = kw["Out@GRAD"]
        x, y = aligned_arrays(X, Y, axis)
        out = kw.get("Out")
        return {"X@GRAD": reduce_to_shape(dx(x, y, out, g), X.shape, axis, g.shape)
                .astype(X.dtype, copy=False),
                "Y@GRAD": reduce_to_shape(dy(x, y, out, g), Y.shape, axis, g.shape)
                .astype(Y.dtype, copy=False)}
    return ref


def _fits(shape, target) -> bool:
    """Whether build-time ``shape`` can only be ``target`` (no 1 standing for a larger dim)."""
    return all(a == b or (a == -1 and b == -1) or (a == -1 and b != 1) or (b == -1 and a != 1)
               for a, b in zip(shape, target))


# d(op)/dX and d(op)/dY on flat arrays of Out's size ({g}: Out@GRAD, {x}/{y}: the operands
# broadcast to Out's shape, {T}: the dtype), in the reference's order of operations; the bool
# after a template: negate the summed result (sum(-g) == -sum(g) exactly).
_GRAD_SRC = {
    "elementwise_add": (("{g}", False), ("{g}", False)),
    "elementwise_sub": (("{g}", False), ("{g}", True)),
    "elementwise_mul": (("{g} * {y}", False), ("{g} * {x}", False)),
    "elementwise_div": (("{g} / {y}", False), ("-{g} * {x} / ({y} * {y})", False)),
    "elementwise_max": (("{g} * ({x} > {y}).astype({T})", False),
                        ("{g} * ({x} <= {y}).astype({T})", False)),
    "elementwise_min": (("{g} * ({x} < {y}).astype({T})", False),
                        ("{g} * ({x} >= {y}).astype({T})", False)),
    "elementwise_pow": (("{g} * {y} * np.power({x}, {y} - {T}(1))", False),
                        ("{g} * np.log(np.where({x} > 0, {x}, {T}(1))) * np.power({x}, {y})",
                         False)),
}


def _aligned_dims(ctx, slot, g_rank):
    """``slot``'s dims as source, padded with ``"1"`` to Out@GRAD's rank by Fluid's axis rule
    (``align_for_axis``), and the aligned build-time shape; ``None`` for an axis out of range."""
    name, shape, axis = ctx.inp(slot), ctx.shape(slot), ctx.attrs["axis"]
    r = len(shape)
    start = g_rank - r if axis == -1 or r == g_rank else axis
    if not 0 <= start <= g_rank - r:
        return None
    pad = g_rank - r - start
    dims = ["1"] * start + [f"{name}.shape[{j}]" for j in range(r)] + ["1"] * pad
    return dims, (1,) * start + tuple(shape) + (1,) * pad


for _name, (_dx, _dy) in _GRADS.items():
    register_op(
        f"{_name}_grad", inputs=["X", "Y", "Out?", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
        attrs=dict(_AXIS), traits=[OPAQUE], infer_shape=_ew_grad_infer,
        reference=_ew_grad_ref(_dx, _dy),
        emit=Opaque() if _name in _GRAD_SRC else None,
        grad=None,
        doc=f"Gradients of {_name} w.r.t. X and Y (summed over broadcast dims).")

register_op(
    "fill_zeros_like", inputs=["X"], outputs=["Out"], traits=[ELEMENTWISE, ZEROS_LIKE],
    infer_shape=lambda X: {"Out": X}, reference=lambda X: {"Out": np.zeros_like(X)},
    emit="{T}(0)", grad=None, doc="Out = zeros of X's shape and dtype.")
