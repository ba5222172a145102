"""Matrix products: ``mul`` (Fluid's flatten-then-multiply), ``matmul`` (legacy) and ``matmul_v2``.

Semantics follow PaddlePaddle 3.3.1's legacy ops (measured against PaddlePaddle itself):

- ``mul`` flattens X to 2-D at ``x_num_col_dims`` and Y at ``y_num_col_dims``; the result has
  shape ``X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:]``.
- ``matmul`` / ``matmul_v2`` multiply over the last two dims with NumPy broadcasting of the batch
  dims. A 1-D X is a row vector and a 1-D Y a column vector whatever the transpose flags say
  (Paddle ignores the flag for a vector), and the added dim is dropped from the result, so
  ``[K] x [K]`` gives a 0-d result. The legacy ``matmul`` also insists, as Paddle's InferShape
  does, that the batch sizes (products of the batch dims) be equal unless one operand has no
  batch dims: ``[1, 3, 4] x [2, 4, 5]`` is refused there, accepted by ``matmul_v2``.

- ``bmm`` multiplies 3-D operands batch by batch: ``X [B, M, K] x Y [B, K, N] -> [B, M, N]``
  (equal batch sizes, no broadcasting, no attributes), as Paddle's ``bmm``.

All four are OPAQUE library calls. Their gradients (``mul_grad``, ``matmul_grad``,
``matmul_v2_grad``: ``X, Y, Out@GRAD -> X@GRAD?, Y@GRAD?``, Paddle's slots) are products too:
for ``Out = op(X) @ op(Y)``, ``d op(X) = dOut @ op(Y)^T`` and ``d op(Y) = op(X)^T @ dOut``,
transposed back where the forward transposed, and summed over the batch dims the forward
broadcast. Rank-2 float operands lower to one ``_rt.gemm`` (the driver's GEMM: BLAS on the
CPU, a tiled kernel on a device) per product; every other rank (and ``bmm``; vectors, a vector
times a vector giving a 0-d result) to one ``batched_gemm`` call per product from the target's
library (``ctx.lib``: the same arguments on every target), one function for every rank,
broadcast and transpose; on a device target a scaled product (``alpha``) takes the batched
kernel, which scales. These lines are the ops' generic rule; a target's table may add to them
(the CPU's computes a product followed by an elementwise chain by blocks of samples:
``codegen/cpu/lowerings/matmul.py``). Integer operands run the reference.
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
    Product,
    RowWise,
    default_grad,
    register_op,
    scaled_weight,
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

        def scale_weight(w, a, out=None):
            if w.ndim != 2:
                return None
            return scaled_weight(w, a.reshape(-1, 1) if trans else a.reshape(1, -1), out)
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


def _alpha(ctx, alpha_attr) -> float:
    return float(ctx.attrs[alpha_attr]) if alpha_attr else 1.0


def _lib(ctx) -> str:
    """Where the batched GEMM of the lines' target lives: its library (every target's
    ``batched_gemm`` takes the same arguments)."""
    return ctx.lib


def _device_scaled(ctx, alpha_attr) -> bool:
    """A scaled product on a device target: the batched kernel scales (a rank-2 product's
    ``_rt.gemm(...) * alpha`` would scale on the host)."""
    return ctx.device and bool(alpha_attr) and ctx.attrs[alpha_attr] != 1.0


def _rows_of_x(ctx, tx_attr) -> bool:
    """Whether X's batch dims can fold into its rows: X of rank > 2, not transposed, times a
    matrix Y (a projection ``[B, S, H] x [H, F]``): one GEMM over all rows, not one per batch,
    and Y's gradient needs no sum over batches."""
    return ctx.rank("X") > 2 and ctx.rank("Y") == 2 and not ctx.attrs[tx_attr]


def _matmul_2d_lower(tx_attr, ty_attr, alpha_attr=None):
    """Rank-2 matmul (or X's batch dims folded into its rows, see ``_rows_of_x``) as one BLAS
    call; every other rank (vectors, batches) as a batched GEMM."""
    def lower(ctx):
        if not _blas_ok(ctx):
            return None
        rows = _rows_of_x(ctx, tx_attr)
        if (not rows and (ctx.rank("X") != 2 or ctx.rank("Y") != 2)) or \
                _device_scaled(ctx, alpha_attr):
            return _batched_lines(ctx, tx_attr, ty_attr, alpha_attr)
        X, Y = ctx.inp("X"), ctx.inp("Y")
        rx = ctx.rank("X")
        lines, x2 = _as_matrix(ctx, X, rx, rx - 1)
        a = f"{x2}.T" if ctx.attrs[tx_attr] else x2
        b = f"{Y}.T" if ctx.attrs[ty_attr] else Y
        scale = ""
        if alpha_attr and ctx.attrs[alpha_attr] != 1.0:
            scale = f" * {ctx.T('X')}({float(ctx.attrs[alpha_attr])!r})"
        prod = f"_rt.gemm({a}, {b}){scale}"
        if rows:  # back to X's batch dims and rows, Y's columns
            n = f"{Y}.shape[{0 if ctx.attrs[ty_attr] else 1}]"
            dims = [f"{X}.shape[{i}]" for i in range(rx - 1)] + [n]
            prod = f"({prod}).reshape({ctx.tuple_src(dims)})"
        return lines + [f"{ctx.out('Out')} = {prod}"]
    return lower


class _Batched:
    """Host lines viewing both operands of a (batched) matmul as 3-D ``(batch, rows, cols)``
    arrays (a vector X as ``(1, 1, K)``, a vector Y as ``(1, K, 1)``), with their batch dims
    aligned (padded with 1s to at least one dim) as ``int64`` vectors and the broadcast batch
    dims of the product: what a library's ``batched_gemm`` takes."""

    def __init__(self, ctx, tx_attr, ty_attr):
        X, Y = ctx.inp("X"), ctx.inp("Y")
        rx, ry = ctx.rank("X"), ctx.rank("Y")
        self.vx, self.vy = rx == 1, ry == 1
        # a vector ignores its transpose flag
        self.tx = bool(ctx.attrs[tx_attr]) and not self.vx
        self.ty = bool(ctx.attrs[ty_attr]) and not self.vy
        xb = [f"{X}.shape[{i}]" for i in range(rx - 2)]
        yb = [f"{Y}.shape[{i}]" for i in range(ry - 2)]
        self.nb = max(len(xb), len(yb))
        n = max(self.nb, 1)
        xd = ["1"] * (n - len(xb)) + xb
        yd = ["1"] * (n - len(yb)) + yb
        self.x3, self.y3 = ctx.tmp("x"), ctx.tmp("y")
        self.xd, self.yd, self.od = ctx.tmp("xd"), ctx.tmp("yd"), ctx.tmp("od")
        # the product's batch dims as expressions over the inputs (the driver allocates the
        # output before these lines run)
        ob = [f"_rt.bdim({a}, {c})" if a != "1" else c for a, c in zip(xd, yd)]
        x_rows = f"(1, 1, {X}.shape[0])" if self.vx else \
            f"({' * '.join(xb) or '1'}, {X}.shape[{rx - 2}], {X}.shape[{rx - 1}])"
        y_rows = f"(1, {Y}.shape[0], 1)" if self.vy else \
            f"({' * '.join(yb) or '1'}, {Y}.shape[{ry - 2}], {Y}.shape[{ry - 1}])"
        self.lines = [f"{self.x3} = {X}.reshape({x_rows})",
                      f"{self.y3} = {Y}.reshape({y_rows})",
                      f"{self.xd} = np.array({ctx.tuple_src(xd)}, np.int64)",
                      f"{self.yd} = np.array({ctx.tuple_src(yd)}, np.int64)",
                      f"{self.od} = np.array({ctx.tuple_src(ob)}, np.int64)"]
        self.m = "1" if self.vx else f"{X}.shape[{rx - 1 if self.tx else rx - 2}]"
        self.n = "1" if self.vy else f"{Y}.shape[{ry - 2 if self.ty else ry - 1}]"
        self.count = f"{self.od}.prod()"
        # the product's shape: batch dims (none padded), then M unless X is a vector, N unless
        # Y is one
        self.out_shape = ctx.tuple_src(ob[n - self.nb:] + ([] if self.vx else [self.m])
                                       + ([] if self.vy else [self.n]))


def _batched_lines(ctx, tx_attr, ty_attr, alpha_attr):
    """``Out = alpha * op(X) @ op(Y)`` for any ranks (vector x vector: a 0-d result)."""
    b = _Batched(ctx, tx_attr, ty_attr)
    out = ctx.out("Out", shape=b.out_shape)
    o3 = ctx.tmp("o")
    return b.lines + [
        f"{o3} = {out}.reshape(({b.count}, {b.m}, {b.n}))",
        f"{_lib(ctx)}.batched_gemm({b.x3}, {b.y3}, {b.tx}, {b.ty}, "
        f"{_alpha(ctx, alpha_attr)!r}, "
        f"{b.od}, {b.xd}, {b.yd}, {b.od}, {o3})"]


def _matmul_rows(v):
    """A product keeps batch rows apart when its right operand is a constant of rank <= 2 and
    X's rows are not transposed, or when both carry the batch of a batched product (attention:
    the product over the last two axes)."""
    if (v.attr("head_number") or 1) != 1:
        return "head_number != 1"
    rx, ry = v.rank("X"), v.rank("Y")
    if v.carries("Y"):
        return None if v.carries("X") and rx == ry >= 3 else (
            f"X of rank {rx} times Y of rank {ry}, Y carrying the batch: expected both to "
            "carry it, with equal ranks >= 3")
    trans = bool(v.attr("trans_x") or v.attr("transpose_X"))
    if ry <= 2 and (rx >= 3 or (rx == 2 and not trans)):
        return None
    return f"X of rank {rx} (transposed: {trans}) times Y of rank {ry} mixes rows"


_MATMUL_ROWS = RowWise(batch=("X", "Y"), check=_matmul_rows)


def _product_form(tx_attr, ty_attr, alpha_attr=None):
    """``OpDef.form`` of a matmul: a :class:`Product` (``head_number`` other than 1: none)."""
    def form(op):
        a = op.all_attrs()
        if int(a.get("head_number", 1) or 1) != 1:
            return None
        return Product("X", "Y", "Out", bool(a.get(tx_attr, False)), bool(a.get(ty_attr, False)),
                       float(a.get(alpha_attr, 1.0)) if alpha_attr else 1.0)
    return form


# num_col_dims: how many leading dims form the rows, so 1 .. rank - 1 of its input
_MUL_ATTRS = {"x_num_col_dims": Int(1, low=1, high=3, at_least=1, axis_of="X"),
              "y_num_col_dims": Int(1, low=1, high=3, at_least=1, axis_of="Y")}


register_op(
    "mul", inputs=["X", "Y"], outputs=["Out"], row_wise=RowWise(const=("Y",)),
    attrs=_MUL_ATTRS,
    traits=[OPAQUE], infer_shape=_mul_infer, reference=_mul_ref,
    emit=Opaque(_mul_lower, host=True, blas=True),
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
    "matmul", inputs=["X", "Y"], outputs=["Out"], row_wise=_MATMUL_ROWS,
    attrs={"transpose_X": Bool(False), "transpose_Y": Bool(False),
           "alpha": Float(1.0, low=-2.0, high=2.0), "head_number": Int(1, choices=(1,))},
    traits=[OPAQUE], infer_shape=_matmul_infer, reference=_matmul_ref,
    emit=Opaque(_matmul_2d_lower("transpose_X", "transpose_Y", "alpha"), host=True,
                blas=True),
    inference=_channel_linear("transpose_Y"),
    form=_product_form("transpose_X", "transpose_Y", "alpha"),
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
    "matmul_v2", inputs=["X", "Y"], outputs=["Out"], row_wise=_MATMUL_ROWS,
    attrs={"trans_x": Bool(False), "trans_y": Bool(False)},
    traits=[OPAQUE], infer_shape=_matmul_v2_infer, reference=_matmul_v2_ref,
    emit=Opaque(_matmul_2d_lower("trans_x", "trans_y"), host=True, blas=True),
    inference=_channel_linear("trans_y"), form=_product_form("trans_x", "trans_y"),
    grad=default_grad("matmul_v2_grad", fwd_inputs=("X", "Y"), wrt=("X", "Y")),
    doc="Out = op(X) @ op(Y) with NumPy batch broadcasting; 1-D X is a row, 1-D Y a column.")


# ---- bmm ------------------------------------------------------------------------------------
def _bmm_check(xs: tuple, ys: tuple) -> None:
    if len(xs) != 3 or len(ys) != 3:
        raise ShapeMismatch(f"bmm: X and Y must be 3-D [batch, rows, cols]: got X {list(xs)} "
                            f"and Y {list(ys)}")
    if not _dims_agree(xs[0], ys[0]):
        raise ShapeMismatch(f"bmm: the batch sizes of X {list(xs)} and Y {list(ys)} differ: "
                            f"expected equal, got {xs[0]} and {ys[0]}")
    if not _dims_agree(xs[2], ys[1]):
        raise ShapeMismatch(f"bmm: X's columns must equal Y's rows: expected {xs[2]}, got "
                            f"{ys[1]} (X {list(xs)}, Y {list(ys)})")


def _bmm_infer(X, Y):
    check_dtype(X, FLOATS, "input X")
    _same_dtype(X, Y, "bmm")
    _bmm_check(X.shape, Y.shape)
    b = X.shape[0] if X.shape[0] >= 0 else Y.shape[0]
    return {"Out": X.with_(shape=(b, X.shape[1], Y.shape[2]))}


def _bmm_ref(X, Y):
    _bmm_check(X.shape, Y.shape)
    return {"Out": np.matmul(X, Y).astype(X.dtype, copy=False)}


def _bmm_lower(ctx):
    if not _blas_ok(ctx):
        return None
    X, Y = ctx.inp("X"), ctx.inp("Y")
    out = ctx.out("Out", shape=f"({X}.shape[0], {X}.shape[1], {Y}.shape[2])")
    d = ctx.tmp("bd")
    return [f"_rt.check({X}.shape[0] == {Y}.shape[0])",
            f"{d} = np.array(({X}.shape[0], ), np.int64)",
            f"{_lib(ctx)}.batched_gemm({X}, {Y}, False, False, 1.0, {d}, {d}, {d}, {d}, "
            f"{out})"]


register_op(
    "bmm", inputs=["X", "Y"], outputs=["Out"], traits=[OPAQUE], infer_shape=_bmm_infer,
    reference=_bmm_ref, emit=Opaque(_bmm_lower, host=True, blas=True),
    grad=default_grad("bmm_grad", fwd_inputs=("X", "Y"), wrt=("X", "Y")),
    doc="Out[b] = X[b] @ Y[b] for 3-D X [B, M, K] and Y [B, K, N].")


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
    """Rank-2 gradients as BLAS calls on (possibly transposed) views; other ranks as
    batched GEMMs (``_batched_grad_lines``).

    With ``Out = op(X) @ op(Y)``: ``dX = dOut @ op(Y)^T`` (transposed back if X was), and
    ``dY = op(X)^T @ dOut`` (likewise); each case below is that product with the transposes
    folded into the operands so the result comes out of np.dot C-contiguous.
    """
    def lower(ctx):
        if not _grad_blas_ok(ctx):
            return None
        rows = _rows_of_x(ctx, tx_attr)
        if (not rows and (ctx.rank("X") != 2 or ctx.rank("Y") != 2 or
                          ctx.rank("Out@GRAD") != 2)) or _device_scaled(ctx, alpha_attr):
            return _batched_grad_lines(ctx, tx_attr, ty_attr, alpha_attr)
        X0, Y, G0 = ctx.inp("X"), ctx.inp("Y"), ctx.inp("Out@GRAD")
        rx = ctx.rank("X")
        tx, ty = bool(ctx.attrs[tx_attr]), bool(ctx.attrs[ty_attr])
        lines, X = _as_matrix(ctx, X0, rx, rx - 1)
        G = G0
        if rows or ctx.rank("Out@GRAD") != 2:  # dOut as X's rows by Y's columns
            G = ctx.tmp("g")
            n = f"{Y}.shape[{0 if ty else 1}]"
            lines.append(f"{G} = {G0}.reshape(({X}.shape[0], {n}))")
        scale = ""
        if alpha_attr and ctx.attrs[alpha_attr] != 1.0:
            scale = f" * {ctx.T('X')}({float(ctx.attrs[alpha_attr])!r})"
        dx = {(False, False): (G, f"{Y}.T"), (False, True): (G, Y),
              (True, False): (Y, f"{G}.T"), (True, True): (f"{Y}.T", f"{G}.T")}[tx, ty]
        dy = {(False, False): (f"{X}.T", G), (False, True): (f"{G}.T", X),
              (True, False): (X, G), (True, True): (f"{G}.T", f"{X}.T")}[tx, ty]
        if ctx.has_output("X@GRAD"):
            d = f"_rt.gemm({dx[0]}, {dx[1]}){scale}"
            lines.append(f"{ctx.out('X@GRAD')} = " + (f"({d}).reshape({X0}.shape)" if rows else d))
        if ctx.has_output("Y@GRAD"):
            lines.append(f"{ctx.out('Y@GRAD')} = _rt.gemm({dy[0]}, {dy[1]}){scale}")
        return lines
    return lower


def _batched_grad_lines(ctx, tx_attr, ty_attr, alpha_attr):
    """The batched gradients: each one batched GEMM over the product's batch dims, summed into
    the operand's own batches where the forward broadcast them (``Out@GRAD`` viewed as
    ``(batch, M, N)``); the same operand pairs as the rank-2 case."""
    b = _Batched(ctx, tx_attr, ty_attr)
    X, Y, G = ctx.inp("X"), ctx.inp("Y"), ctx.inp("Out@GRAD")
    g3 = ctx.tmp("g")
    lines = b.lines + [f"{g3} = {G}.reshape(({b.count}, {b.m}, {b.n}))"]
    alpha = repr(_alpha(ctx, alpha_attr))
    tx, ty = b.tx, b.ty
    gx = (g3, b.od)
    xx, yy = (b.x3, b.xd), (b.y3, b.yd)
    # (a, op(a) transposed, b, op(b) transposed) per case, as in the rank-2 table
    dx = {(False, False): (gx, False, yy, True), (False, True): (gx, False, yy, False),
          (True, False): (yy, False, gx, True), (True, True): (yy, True, gx, True)}[tx, ty]
    dy = {(False, False): (xx, True, gx, False), (False, True): (gx, True, xx, False),
          (True, False): (xx, False, gx, False), (True, True): (gx, True, xx, True)}[tx, ty]
    for slot, src, own, case in (("X@GRAD", X, b.xd, dx), ("Y@GRAD", Y, b.yd, dy)):
        if not ctx.has_output(slot):
            continue
        d = ctx.out(slot, shape=f"{src}.shape")
        (a, da), ta, (c, dc), tc = case
        view = b.x3 if slot == "X@GRAD" else b.y3
        d3 = ctx.tmp("d")
        lines += [f"{d3} = {d}.reshape({view}.shape)",
                  f"{_lib(ctx)}.batched_gemm({a}, {c}, {ta}, {tc}, {alpha}, {b.od}, {da}, {dc}, "
                  f"{own}, {d3})"]
    return lines


register_op(
    "mul_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs=_MUL_ATTRS,
    traits=[OPAQUE], infer_shape=_grad_infer, reference=_mul_grad_ref,
    emit=Opaque(_mul_grad_lower, host=True, blas=True), grad=None,
    doc="dX = dOut2 @ Y2^T and dY = X2^T @ dOut2 on the flattened operands, reshaped back.")


def _matmul_grad_ref(X, Y, *, transpose_X, transpose_Y, alpha, **kw):
    dx, dy = _matmul_grads(X, Y, kw["Out@GRAD"], transpose_X, transpose_Y, alpha, "matmul_grad")
    return {"X@GRAD": dx, "Y@GRAD": dy}


register_op(
    "matmul_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs={"transpose_X": Bool(False), "transpose_Y": Bool(False),
           "alpha": Float(1.0, low=-2.0, high=2.0), "head_number": Int(1, choices=(1,))},
    traits=[OPAQUE], infer_shape=_grad_infer, reference=_matmul_grad_ref,
    emit=Opaque(_matmul_grad_2d_lower("transpose_X", "transpose_Y", "alpha"), host=True,
                blas=True),
    grad=None,
    doc="Gradients of matmul: alpha * dOut @ op(Y)^T and alpha * op(X)^T @ dOut, transposed "
        "back where the forward transposed, summed over broadcast batch dims.")


def _matmul_v2_grad_ref(X, Y, *, trans_x, trans_y, **kw):
    dx, dy = _matmul_grads(X, Y, kw["Out@GRAD"], trans_x, trans_y, 1.0, "matmul_v2_grad")
    return {"X@GRAD": dx, "Y@GRAD": dy}


register_op(
    "matmul_v2_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs={"trans_x": Bool(False), "trans_y": Bool(False)},
    traits=[OPAQUE], infer_shape=_grad_infer, reference=_matmul_v2_grad_ref,
    emit=Opaque(_matmul_grad_2d_lower("trans_x", "trans_y"), host=True, blas=True),
    grad=None,
    doc="Gradients of matmul_v2: dOut @ op(Y)^T and op(X)^T @ dOut, transposed back where the "
        "forward transposed, summed over broadcast batch dims.")


def _bmm_grad_ref(X, Y, **kw):
    _bmm_check(X.shape, Y.shape)
    dx, dy = _matmul_grads(X, Y, kw["Out@GRAD"], False, False, 1.0, "bmm_grad")
    return {"X@GRAD": dx, "Y@GRAD": dy}


def _bmm_grad_lower(ctx):
    """dX[b] = dOut[b] @ Y[b]^T, dY[b] = X[b]^T @ dOut[b]: one batched GEMM each."""
    if not _grad_blas_ok(ctx):
        return None
    X, Y, G = ctx.inp("X"), ctx.inp("Y"), ctx.inp("Out@GRAD")
    d, g3 = ctx.tmp("bd"), ctx.tmp("g")
    lines = [f"_rt.check({X}.shape[0] == {Y}.shape[0])",
             f"{d} = np.array(({X}.shape[0], ), np.int64)",
             f"{g3} = {G}.reshape(({X}.shape[0], {X}.shape[1], {Y}.shape[2]))"]
    if ctx.has_output("X@GRAD"):
        dx = ctx.out("X@GRAD", shape=f"{X}.shape")
        lines.append(f"{_lib(ctx)}.batched_gemm({g3}, {Y}, False, True, 1.0, {d}, {d}, {d}, "
                     f"{d}, {dx})")
    if ctx.has_output("Y@GRAD"):
        dy = ctx.out("Y@GRAD", shape=f"{Y}.shape")
        lines.append(f"{_lib(ctx)}.batched_gemm({X}, {g3}, True, False, 1.0, {d}, {d}, {d}, "
                     f"{d}, {dy})")
    return lines


register_op(
    "bmm_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    traits=[OPAQUE], infer_shape=_grad_infer, reference=_bmm_grad_ref,
    emit=Opaque(_bmm_grad_lower, host=True, blas=True), grad=None,
    doc="Gradients of bmm: dX[b] = dOut[b] @ Y[b]^T and dY[b] = X[b]^T @ dOut[b].")
