"""Matrix products: ``mul`` (Fluid's flatten-then-multiply), ``matmul`` (legacy) and ``matmul_v2``.

Semantics follow PaddlePaddle 3.3.1's legacy ops (measured, see /tmp/paddle_notes.md):

- ``mul`` flattens X to 2-D at ``x_num_col_dims`` and Y at ``y_num_col_dims``; the result has
  shape ``X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:]``.
- ``matmul`` / ``matmul_v2`` multiply over the last two dims with NumPy broadcasting of the batch
  dims. A 1-D X is a row vector and a 1-D Y a column vector whatever the transpose flags say
  (Paddle ignores the flag for a vector), and the added dim is dropped from the result, so
  ``[K] x [K]`` gives a 0-d result. The legacy ``matmul`` also insists, as Paddle's InferShape
  does, that the batch sizes (products of the batch dims) be equal unless one operand has no
  batch dims: ``[1, 3, 4] x [2, 4, 5]`` is refused there, accepted by ``matmul_v2``.

All three are OPAQUE library calls. Their gradients (``mul_grad``, ``matmul_grad``,
``matmul_v2_grad``: ``X, Y, Out@GRAD -> X@GRAD?, Y@GRAD?``, Paddle's slots) are products too:
for ``Out = op(X) @ op(Y)``, ``d op(X) = dOut @ op(Y)^T`` and ``d op(Y) = op(X)^T @ dOut``,
transposed back where the forward transposed, and summed over the batch dims the forward
broadcast. Rank-2 float operands lower to one ``np.dot`` per gradient.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    Bool,
    ChannelLinear,
    Float,
    Int,
    Opaque,
    default_grad,
    register_op,
)
from pdjit.ops._common import FLOATS, broadcast_dim, check_dtype, prod_known

_INT_MATMUL = (np.dtype(np.int32), np.dtype(np.int64))


def _same_dtype(X, Y, op):
    if X.dtype != Y.dtype:
        raise ShapeMismatch(f"{op}: X and Y must have one dtype: expected Y {X.dtype}, got "
                            f"{Y.dtype}")


def _prod(dims) -> int:
    return int(np.prod(dims, dtype=np.int64))


def _dims_agree(a: int, b: int) -> bool:
    return a == b or a < 0 or b < 0


def _channel_linear(trans_attr):
    """Out's last axis is Y's columns (rows when transposed): what inference passes scale."""
    def inference(op):
        trans = bool(op.all_attrs().get(trans_attr, False)) if trans_attr else False

        def scale_weight(w, a):
            if w.ndim != 2:
                return None
            return w * (a.reshape(-1, 1) if trans else a.reshape(1, -1))
        return ChannelLinear("Y", "Out", -1, scale_weight)
    return inference


# ---- mul -----------------------------------------------------------------------------------
def _mul_infer(X, Y, *, x_num_col_dims, y_num_col_dims):
    check_dtype(X, FLOATS, "input X")
    _same_dtype(X, Y, "mul")
    for name, meta, n in (("x", X, x_num_col_dims), ("y", Y, y_num_col_dims)):
        if not 1 <= n < max(meta.ndim, 1) or meta.ndim < 2:
            raise ShapeMismatch(f"{name}_num_col_dims={n} does not fit {name.upper()} of shape "
                                f"{list(meta.shape)}: expected 1 <= {name}_num_col_dims < rank "
                                f"(and rank >= 2)")
    k_x = prod_known(X.shape[x_num_col_dims:])
    k_y = prod_known(Y.shape[:y_num_col_dims])
    if not _dims_agree(k_x, k_y):
        raise ShapeMismatch(
            f"X flattened at x_num_col_dims={x_num_col_dims} has width {k_x} and Y flattened at "
            f"y_num_col_dims={y_num_col_dims} has height {k_y}: expected them equal, got X "
            f"{list(X.shape)} and Y {list(Y.shape)}")
    return {"Out": X.with_(shape=X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:])}


def _mul_ref(X, Y, *, x_num_col_dims, y_num_col_dims):
    xs, ys = X.shape, Y.shape
    x2 = X.reshape(_prod(xs[:x_num_col_dims]), _prod(xs[x_num_col_dims:]))
    y2 = Y.reshape(_prod(ys[:y_num_col_dims]), _prod(ys[y_num_col_dims:]))
    if x2.shape[1] != y2.shape[0]:
        raise ShapeMismatch(f"X flattened to {list(x2.shape)} and Y flattened to "
                            f"{list(y2.shape)}: expected X's width equal to Y's height")
    out = x2 @ y2
    return {"Out": out.reshape(xs[:x_num_col_dims] + ys[y_num_col_dims:]).astype(X.dtype,
                                                                                   copy=False)}


def _blas_ok(ctx) -> bool:
    """np.dot inside generated code is BLAS: float32/float64 only."""
    return ctx.dtype("X").kind == "f" and ctx.dtype("X") == ctx.dtype("Y")


def _mul_lower(ctx):
    if not _blas_ok(ctx):
        return None
    xn, yn = ctx.attrs["x_num_col_dims"], ctx.attrs["y_num_col_dims"]
    rx, ry = ctx.rank("X"), ctx.rank("Y")
    X, Y = ctx.inp("X"), ctx.inp("Y")
    dims = [f"{X}.shape[{i}]" for i in range(xn)] + [f"{Y}.shape[{i}]" for i in range(yn, ry)]
    lx, x2 = _as_matrix(ctx, X, rx, xn)
    ly, y2 = _as_matrix(ctx, Y, ry, yn)
    lines = lx + ly
    out = f"_rt.gemm({x2}, {y2})"
    if len(dims) != 2:
        out += f".reshape({ctx.tuple_src(dims)})"
    return lines + [f"{ctx.out('Out')} = {out}"]


def _as_matrix(ctx, local: str, rank: int, split: int):
    """(lines, name) of ``local`` viewed as a matrix of its dims before and after ``split``
    (no line when it is one already)."""
    if rank == 2 and split == 1:
        return [], local
    m = ctx.tmp("m")
    return [f"{m} = {local}.reshape(({ctx.prod(local, 0, split)}, "
            f"{ctx.prod(local, split, rank)}))"], m


def _matmul_2d_lower(tx_attr, ty_attr, alpha_attr=None):
    """Rank-2 matmul as one BLAS call (other ranks run the reference)."""
    def lower(ctx):
        if not _blas_ok(ctx) or ctx.rank("X") != 2 or ctx.rank("Y") != 2:
            return None
        X, Y = ctx.inp("X"), ctx.inp("Y")
        a = f"{X}.T" if ctx.attrs[tx_attr] else X
        b = f"{Y}.T" if ctx.attrs[ty_attr] else Y
        scale = ""
        if alpha_attr and ctx.attrs[alpha_attr] != 1.0:
            scale = f" * {ctx.T('X')}({float(ctx.attrs[alpha_attr])!r})"
        return [f"{ctx.out('Out')} = _rt.gemm({a}, {b}){scale}"]
    return lower


register_op(
    "mul", inputs=["X", "Y"], outputs=["Out"],
    attrs={"x_num_col_dims": Int(1, low=1, high=3), "y_num_col_dims": Int(1, low=1, high=3)},
    traits=[OPAQUE], infer_shape=_mul_infer, reference=_mul_ref, emit=Opaque(_mul_lower, host=True),
    inference=_channel_linear(None),
    grad=default_grad("mul_grad", fwd_inputs=("X", "Y"), wrt=("X", "Y")),
    doc="Out = flatten(X, x_num_col_dims) @ flatten(Y, y_num_col_dims), reshaped to "
        "X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:].")


# ---- matmul / matmul_v2 ----------------------------------------------------------------------
def _matmul_shape(xs: tuple, ys: tuple, tx: bool, ty: bool, legacy: bool) -> tuple:
    """Output shape of a (batched) matmul; ``-1`` dims stay unknown."""
    if not xs or not ys:
        raise ShapeMismatch(f"matmul operands must have rank >= 1, got X {list(xs)} and Y "
                            f"{list(ys)}")
    # A vector ignores its transpose flag: X is a row, Y a column.
    x2 = (1,) + xs if len(xs) == 1 else xs
    y2 = ys + (1,) if len(ys) == 1 else ys
    if len(xs) > 1 and tx:
        x2 = x2[:-2] + (x2[-1], x2[-2])
    if len(ys) > 1 and ty:
        y2 = y2[:-2] + (y2[-1], y2[-2])
    m, k_x = x2[-2:]
    k_y, n = y2[-2:]
    if not _dims_agree(k_x, k_y):
        raise ShapeMismatch(
            f"the inner dims of X {list(xs)} (transpose={tx}) and Y {list(ys)} "
            f"(transpose={ty}) differ: expected X's {k_x} columns to equal Y's rows, got "
            f"{k_y}")
    bx, by = x2[:-2], y2[:-2]
    if legacy and bx and by:
        px, py = prod_known(bx), prod_known(by)
        if px >= 0 and py >= 0 and px != py:
            raise ShapeMismatch(
                f"the batch sizes of X {list(xs)} and Y {list(ys)} differ: expected equal "
                f"batch sizes (or one operand without batch dims), got {px} and {py}")
    nb = max(len(bx), len(by))
    bx, by = (1,) * (nb - len(bx)) + bx, (1,) * (nb - len(by)) + by
    msg = (f"the batch dims of X {list(xs)} and Y {list(ys)} do not broadcast: expected each "
           f"aligned pair equal or 1")
    batch = tuple(broadcast_dim(a, b, msg) for a, b in zip(bx, by))
    out = batch + (m, n)
    if len(ys) == 1:
        out = out[:-1]
    if len(xs) == 1:
        out = out[:-2] + out[-1:] if len(ys) > 1 else out[:-1]
    return out


def _matmul_np(x, y, tx, ty):
    if x.ndim > 1 and tx:
        x = np.swapaxes(x, -1, -2)
    if y.ndim > 1 and ty:
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


def _matmul_infer(X, Y, *, transpose_X, transpose_Y, head_number=1, **_):
    check_dtype(X, FLOATS, "input X")
    _same_dtype(X, Y, "matmul")
    if head_number != 1:
        raise ShapeMismatch(f"matmul: head_number={head_number} is not supported (it is a "
                            f"oneDNN/CUDA-only fusion attribute): expected 1")
    return {"Out": X.with_(shape=_matmul_shape(X.shape, Y.shape, transpose_X, transpose_Y,
                                               legacy=True))}


def _matmul_ref(X, Y, *, transpose_X, transpose_Y, alpha, **_):
    _matmul_shape(X.shape, Y.shape, transpose_X, transpose_Y, legacy=True)  # clear errors
    out = _matmul_np(X, Y, transpose_X, transpose_Y)
    if alpha != 1.0:
        out = out * np.asarray(alpha, X.dtype)
    return {"Out": np.asarray(out).astype(X.dtype, copy=False)}


register_op(
    "matmul", inputs=["X", "Y"], outputs=["Out"],
    attrs={"transpose_X": Bool(False), "transpose_Y": Bool(False),
           "alpha": Float(1.0, low=-2.0, high=2.0), "head_number": Int(1, choices=(1,))},
    traits=[OPAQUE], infer_shape=_matmul_infer, reference=_matmul_ref,
    emit=Opaque(_matmul_2d_lower("transpose_X", "transpose_Y", "alpha"), host=True),
    inference=_channel_linear("transpose_Y"),
    grad=default_grad("matmul_grad", fwd_inputs=("X", "Y"), wrt=("X", "Y")),
    doc="Out = alpha * op(X) @ op(Y) over the last two dims (op transposes when asked), batch "
        "dims broadcast; 1-D X is a row, 1-D Y a column.")


def _matmul_v2_infer(X, Y, *, trans_x, trans_y):
    check_dtype(X, FLOATS + _INT_MATMUL, "input X")
    _same_dtype(X, Y, "matmul_v2")
    return {"Out": X.with_(shape=_matmul_shape(X.shape, Y.shape, trans_x, trans_y,
                                               legacy=False))}


def _matmul_v2_ref(X, Y, *, trans_x, trans_y):
    _matmul_shape(X.shape, Y.shape, trans_x, trans_y, legacy=False)
    return {"Out": np.asarray(_matmul_np(X, Y, trans_x, trans_y)).astype(X.dtype, copy=False)}


register_op(
    "matmul_v2", inputs=["X", "Y"], outputs=["Out"],
    attrs={"trans_x": Bool(False), "trans_y": Bool(False)},
    traits=[OPAQUE], infer_shape=_matmul_v2_infer, reference=_matmul_v2_ref,
    emit=Opaque(_matmul_2d_lower("trans_x", "trans_y"), host=True),
    inference=_channel_linear("trans_y"),
    grad=default_grad("matmul_v2_grad", fwd_inputs=("X", "Y"), wrt=("X", "Y")),
    doc="Out = op(X) @ op(Y) with NumPy batch broadcasting; 1-D X is a row, 1-D Y a column.")


# ---- gradients ---------------------------------------------------------------------------------
def _grad_infer(X, Y, **_):
    """Each gradient has its forward operand's shape and dtype."""
    return {"X@GRAD": X, "Y@GRAD": Y}


def _check_out_grad(g: np.ndarray, want: tuple, op: str) -> None:
    if g.size != _prod(want):
        raise ShapeMismatch(f"{op}: Out@GRAD must have the forward output's shape: expected "
                            f"{list(want)}, got {list(g.shape)}")


def _sum_to(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a gradient computed on broadcast batch dims back to an operand of ``shape``."""
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a == 1 and b != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _swap(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


def _matmul_grads(x, y, g, tx: bool, ty: bool, alpha: float, op: str):
    """(dX, dY) of ``Out = alpha * op(X) @ op(Y)`` with the forward's vector and batch rules."""
    # Work on the operands as the forward saw them: a vector X is a row [1, K], a vector Y a
    # column [K, 1], and a vector ignores its transpose flag.
    x2 = x.reshape((1,) + x.shape) if x.ndim == 1 else x
    y2 = y.reshape(y.shape + (1,)) if y.ndim == 1 else y
    tx, ty = tx and x.ndim > 1, ty and y.ndim > 1
    xe = _swap(x2) if tx else x2
    ye = _swap(y2) if ty else y2
    batch = np.broadcast_shapes(xe.shape[:-2], ye.shape[:-2])
    out2 = batch + (xe.shape[-2], ye.shape[-1])
    _check_out_grad(g, out2, op)
    g2 = g.reshape(out2)
    if alpha != 1.0:
        g2 = g2 * np.asarray(alpha, g.dtype)
    dxe = np.matmul(g2, _swap(ye))      # d op(X) = dOut @ op(Y)^T
    dye = np.matmul(_swap(xe), g2)      # d op(Y) = op(X)^T @ dOut
    dx = _sum_to(_swap(dxe) if tx else dxe, x2.shape).reshape(x.shape)
    dy = _sum_to(_swap(dye) if ty else dye, y2.shape).reshape(y.shape)
    return dx.astype(x.dtype, copy=False), dy.astype(y.dtype, copy=False)


def _mul_grad_ref(X, Y, *, x_num_col_dims, y_num_col_dims, **kw):
    g = kw["Out@GRAD"]
    xs, ys = X.shape, Y.shape
    x2 = X.reshape(_prod(xs[:x_num_col_dims]), _prod(xs[x_num_col_dims:]))
    y2 = Y.reshape(_prod(ys[:y_num_col_dims]), _prod(ys[y_num_col_dims:]))
    _check_out_grad(g, (x2.shape[0], y2.shape[1]), "mul_grad")
    g2 = g.reshape(x2.shape[0], y2.shape[1])
    return {"X@GRAD": (g2 @ y2.T).reshape(xs).astype(X.dtype, copy=False),
            "Y@GRAD": (x2.T @ g2).reshape(ys).astype(Y.dtype, copy=False)}


def _grad_blas_ok(ctx) -> bool:
    return _blas_ok(ctx) and ctx.dtype("Out@GRAD") == ctx.dtype("X")


def _mul_grad_lower(ctx):
    """Flatten as the forward does, then one np.dot per wanted gradient."""
    if not _grad_blas_ok(ctx):
        return None
    xn, yn = ctx.attrs["x_num_col_dims"], ctx.attrs["y_num_col_dims"]
    rx, ry = ctx.rank("X"), ctx.rank("Y")
    X, Y, G = ctx.inp("X"), ctx.inp("Y"), ctx.inp("Out@GRAD")
    lx, x2 = _as_matrix(ctx, X, rx, xn)
    ly, y2 = _as_matrix(ctx, Y, ry, yn)
    lines = lx + ly
    g2 = G
    if ctx.rank("Out@GRAD") != 2:
        g2 = ctx.tmp("g")
        lines.append(f"{g2} = {G}.reshape(({x2}.shape[0], {y2}.shape[1]))")
    if ctx.has_output("X@GRAD"):
        back = f".reshape({X}.shape)" if x2 != X else ""
        lines.append(f"{ctx.out('X@GRAD')} = _rt.gemm({g2}, {y2}.T){back}")
    if ctx.has_output("Y@GRAD"):
        back = f".reshape({Y}.shape)" if y2 != Y else ""
        lines.append(f"{ctx.out('Y@GRAD')} = _rt.gemm({x2}.T, {g2}){back}")
    return lines


def _matmul_grad_2d_lower(tx_attr, ty_attr, alpha_attr=None):
    """Rank-2 gradients as BLAS calls on (possibly transposed) views; other ranks decline.

    With ``Out = op(X) @ op(Y)``: ``dX = dOut @ op(Y)^T`` (transposed back if X was), and
    ``dY = op(X)^T @ dOut`` (likewise); each case below is that product with the transposes
    folded into the operands so the result comes out of np.dot C-contiguous.
    """
    def lower(ctx):
        if not _grad_blas_ok(ctx) or ctx.rank("X") != 2 or ctx.rank("Y") != 2 or \
                ctx.rank("Out@GRAD") != 2:
            return None
        X, Y, G = ctx.inp("X"), ctx.inp("Y"), ctx.inp("Out@GRAD")
        tx, ty = bool(ctx.attrs[tx_attr]), bool(ctx.attrs[ty_attr])
        scale = ""
        if alpha_attr and ctx.attrs[alpha_attr] != 1.0:
            scale = f" * {ctx.T('X')}({float(ctx.attrs[alpha_attr])!r})"
        dx = {(False, False): (G, f"{Y}.T"), (False, True): (G, Y),
              (True, False): (Y, f"{G}.T"), (True, True): (f"{Y}.T", f"{G}.T")}[tx, ty]
        dy = {(False, False): (f"{X}.T", G), (False, True): (f"{G}.T", X),
              (True, False): (X, G), (True, True): (f"{G}.T", f"{X}.T")}[tx, ty]
        lines = []
        if ctx.has_output("X@GRAD"):
            lines.append(f"{ctx.out('X@GRAD')} = _rt.gemm({dx[0]}, {dx[1]}){scale}")
        if ctx.has_output("Y@GRAD"):
            lines.append(f"{ctx.out('Y@GRAD')} = _rt.gemm({dy[0]}, {dy[1]}){scale}")
        return lines
    return lower


register_op(
    "mul_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs={"x_num_col_dims": Int(1, low=1, high=3), "y_num_col_dims": Int(1, low=1, high=3)},
    traits=[OPAQUE], infer_shape=_grad_infer, reference=_mul_grad_ref,
    emit=Opaque(_mul_grad_lower, host=True), grad=None,
    doc="dX = dOut2 @ Y2^T and dY = X2^T @ dOut2 on the flattened operands, reshaped back.")


def _matmul_grad_ref(X, Y, *, transpose_X, transpose_Y, alpha, **kw):
    dx, dy = _matmul_grads(X, Y, kw["Out@GRAD"], transpose_X, transpose_Y, alpha, "matmul_grad")
    return {"X@GRAD": dx, "Y@GRAD": dy}


register_op(
    "matmul_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs={"transpose_X": Bool(False), "transpose_Y": Bool(False),
           "alpha": Float(1.0, low=-2.0, high=2.0), "head_number": Int(1, choices=(1,))},
    traits=[OPAQUE], infer_shape=_grad_infer, reference=_matmul_grad_ref,
    emit=Opaque(_matmul_grad_2d_lower("transpose_X", "transpose_Y", "alpha"), host=True), grad=None,
    doc="Gradients of matmul: alpha * dOut @ op(Y)^T and alpha * op(X)^T @ dOut, transposed "
        "back where the forward transposed, summed over broadcast batch dims.")


def _matmul_v2_grad_ref(X, Y, *, trans_x, trans_y, **kw):
    dx, dy = _matmul_grads(X, Y, kw["Out@GRAD"], trans_x, trans_y, 1.0, "matmul_v2_grad")
    return {"X@GRAD": dx, "Y@GRAD": dy}


register_op(
    "matmul_v2_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs={"trans_x": Bool(False), "trans_y": Bool(False)},
    traits=[OPAQUE], infer_shape=_grad_infer, reference=_matmul_v2_grad_ref,
    emit=Opaque(_matmul_grad_2d_lower("trans_x", "trans_y"), host=True), grad=None,
    doc="Gradients of matmul_v2: dOut @ op(Y)^T and op(X)^T @ dOut, transposed back where the "
        "forward transposed, summed over broadcast batch dims.")
