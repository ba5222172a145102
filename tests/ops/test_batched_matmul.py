"""Batched matmul / matmul_v2 / bmm in native code: forward and gradients against NumPy.

The oracle is written here with ``np.einsum`` over explicitly broadcast operands, the gradients
summed back over the batch dims the forward broadcast; every program runs with
``Executor(strict=True)`` and every step of its plan must be native (no reference step). The
finite-difference checks (``check_grad``) cover the same configurations in float64.
"""
import numpy as np
import pytest

from pdjit.framework.program import Program
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.grad_check import check_grad

RNG = np.random.default_rng(16)


def _tr(a, flag):
    return np.swapaxes(a, -1, -2) if flag and a.ndim > 1 else a


def _np_matmul_grads(x, y, w, tx, ty, alpha):
    """(out, dX, dY) of ``sum(w * alpha * op(x) @ op(y))``, by einsum on broadcast operands."""
    xe = _tr(x, tx)
    ye = _tr(y, ty)
    xe = xe[None, :] if x.ndim == 1 else xe
    ye = ye[:, None] if y.ndim == 1 else ye
    batch = np.broadcast_shapes(xe.shape[:-2], ye.shape[:-2])
    xb = np.broadcast_to(xe, batch + xe.shape[-2:])
    yb = np.broadcast_to(ye, batch + ye.shape[-2:])
    out = alpha * np.einsum("...ik,...kj->...ij", xb, yb)
    w2 = w.reshape(out.shape)
    dxe = alpha * np.einsum("...ij,...kj->...ik", w2, yb)
    dye = alpha * np.einsum("...ik,...ij->...kj", xb, w2)

    def back(d, own, flag):
        want = own.shape if own.ndim > 1 else None
        if own.ndim == 1:  # a vector: drop the added axis, sum every batch dim
            d = d.sum(axis=tuple(range(d.ndim - 2)))
            return d.reshape(-1)
        d = _tr(d, flag)
        lead = d.ndim - own.ndim
        d = d.sum(axis=tuple(range(lead))) if lead else d
        axes = tuple(i for i in range(own.ndim - 2) if own.shape[i] == 1 and d.shape[i] != 1)
        return d.sum(axis=axes, keepdims=True).reshape(want)

    return out.reshape(w.shape), back(dxe, x, tx), back(dye, y, ty)


def _run_native(prog, feed, fetch):
    """Run ``prog`` with a strict executor; every step of every plan must be native."""
    exe = Executor(strict=True)
    got = exe.run(prog, feed=feed, fetch_list=fetch, scope=Scope())
    steps = [s for _, plan in exe._plans.values() for s in plan.walk()]
    assert steps and all(s.kind.startswith("native") for s in steps), \
        [s.describe() for s in steps]
    return got


def _program(op, x, y, attrs, out_shape):
    prog = Program()
    block = prog.global_block()
    xv = block.create_var(name="x", shape=list(x.shape), dtype=x.dtype)
    yv = block.create_var(name="y", shape=list(y.shape), dtype=y.dtype)
    xv.stop_gradient = yv.stop_gradient = False
    out = block.create_var(name="out")
    block.append_op(op, inputs={"X": [xv], "Y": [yv]}, outputs={"Out": [out]}, attrs=attrs)
    w = block.create_var(name="w", shape=list(out_shape), dtype=x.dtype)
    dx, dy = gradients([out], [xv, yv], target_gradients=[w])
    return prog, [out, dx, dy]


CASES = [  # op, X shape, Y shape, transposes, alpha
    ("matmul_v2", (2, 3, 4), (2, 4, 5), (False, False), 1.0),
    ("matmul_v2", (2, 1, 3, 4), (3, 5, 4), (False, True), 1.0),      # broadcast both ways
    ("matmul_v2", (1, 4, 3), (2, 2, 4, 5), (True, False), 1.0),
    ("matmul_v2", (2, 3, 4, 3), (2, 3, 5, 4), (True, True), 1.0),
    ("matmul", (2, 3, 4), (4, 5), (False, False), 0.5),              # rank 3 x rank 2, alpha
    ("matmul", (3, 4), (2, 5, 4), (False, True), -1.5),
    ("matmul", (2, 2, 4, 3), (2, 2, 4, 5), (True, False), 0.125),
    ("matmul_v2", (4,), (2, 4, 5), (False, False), 1.0),             # vectors
    ("matmul_v2", (2, 3, 4), (4,), (False, False), 1.0),
    ("matmul", (3, 4), (4,), (False, True), 2.0),
    ("matmul", (4,), (4, 5), (True, False), 1.0),
    ("matmul_v2", (4,), (4,), (False, False), 1.0),                 # a 0-d result
    ("matmul", (4,), (4,), (True, True), 3.0),
]


def _attrs(op, t, alpha):
    if op == "matmul":
        return {"transpose_X": t[0], "transpose_Y": t[1], "alpha": alpha}
    return {"trans_x": t[0], "trans_y": t[1]}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op,xs,ys,t,alpha", CASES)
def test_batched_matmul_native_forward_and_grads(op, xs, ys, t, alpha, dtype):
    x = RNG.uniform(-1, 1, xs).astype(dtype)
    y = RNG.uniform(-1, 1, ys).astype(dtype)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    out_shape = np.matmul(_tr(x64, t[0]), _tr(y64, t[1])).shape  # the values: einsum below
    w = RNG.uniform(0.5, 1.5, out_shape)
    want_out, want_dx, want_dy = _np_matmul_grads(x64, y64, w, t[0], t[1], alpha)
    prog, fetch = _program(op, x, y, _attrs(op, t, alpha), out_shape)
    got = _run_native(prog, {"x": x, "y": y, "w": w.astype(dtype)}, fetch)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for g, want, what in zip(got, (want_out, want_dx, want_dy), ("Out", "X@GRAD", "Y@GRAD")):
        assert g.dtype == np.dtype(dtype), what
        np.testing.assert_allclose(g, want, rtol=tol, atol=tol, err_msg=f"{op} {xs}x{ys} {what}")


def test_projection_is_one_gemm_over_all_rows():
    """X [B, S, H] x Y [H, F]: X's batch dims fold into its rows, one BLAS call per product
    (forward and both gradients), no batched call."""
    x = RNG.uniform(-1, 1, (2, 3, 4)).astype("float32")
    y = RNG.uniform(-1, 1, (5, 4)).astype("float32")
    prog, fetch = _program("matmul_v2", x, y, {"trans_y": True}, (2, 3, 5))
    exe = Executor(strict=True)
    exe.run(prog, feed={"x": x, "y": y, "w": np.ones((2, 3, 5), "float32")}, fetch_list=fetch,
            scope=Scope())
    source = "\n".join(src for _, plan in exe._plans.values() for _, src in plan.sources)
    assert source.count("_rt.gemm(") == 3 and "batched_gemm" not in source, source


def test_bmm_native_forward_and_grads():
    x = RNG.uniform(-1, 1, (3, 4, 5)).astype("float32")
    y = RNG.uniform(-1, 1, (3, 5, 2)).astype("float32")
    w = RNG.uniform(0.5, 1.5, (3, 4, 2))
    prog, fetch = _program("bmm", x, y, {}, (3, 4, 2))
    got = _run_native(prog, {"x": x, "y": y, "w": w.astype("float32")}, fetch)
    want_out = np.einsum("bik,bkj->bij", x.astype(np.float64), y)
    want_dx = np.einsum("bij,bkj->bik", w, y.astype(np.float64))
    want_dy = np.einsum("bik,bij->bkj", x.astype(np.float64), w)
    for g, want in zip(got, (want_out, want_dx, want_dy)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,xs,ys,t,alpha", [CASES[1], CASES[3], CASES[5], CASES[7]])
def test_batched_matmul_finite_differences(op, xs, ys, t, alpha):
    check_grad(op, {"X": RNG.normal(size=xs), "Y": RNG.normal(size=ys)}, _attrs(op, t, alpha),
               ["X", "Y"])


def test_bmm_finite_differences_and_errors():
    check_grad("bmm", {"X": RNG.normal(size=(2, 3, 4)), "Y": RNG.normal(size=(2, 4, 2))}, {},
               ["X", "Y"])
    from pdjit.framework.errors import OpShapeError
    from pdjit.testing import build_op_program

    with pytest.raises(OpShapeError, match=r"op 'bmm'.*batch sizes .* differ: expected equal, "
                                           r"got 2 and 3"):
        build_op_program("bmm", {"X": np.ones((2, 3, 4), "float32"),
                                 "Y": np.ones((3, 4, 2), "float32")})
    with pytest.raises(OpShapeError, match=r"op 'bmm'.*must be 3-D"):
        build_op_program("bmm", {"X": np.ones((3, 4), "float32"),
                                 "Y": np.ones((4, 2), "float32")})
    with pytest.raises(OpShapeError, match=r"X's columns must equal Y's rows: expected 4, "
                                           r"got 5"):
        build_op_program("bmm", {"X": np.ones((2, 3, 4), "float32"),
                                 "Y": np.ones((2, 5, 2), "float32")})


def test_compiled_batched_gemm_matches_numpy():
    """Compiled code (a native driver, a native loop) calls ``_batched_gemm_native``, a loop of
    one BLAS call per 2-D slice compiled once per dtype: against NumPy on broadcast batch dims,
    both transposes, alpha, and a product summed into fewer output batches (a gradient)."""
    from pdjit.codegen.cpu.lib import gemm

    a = RNG.uniform(-1, 1, (2 * 1, 4, 3)).astype("float32")  # batch dims [2, 1], transposed
    b = RNG.uniform(-1, 1, (1 * 3, 5, 4)).astype("float32")  # batch dims [1, 3], transposed
    it = np.array((2, 3), np.int64)
    da, db = np.array((2, 1), np.int64), np.array((1, 3), np.int64)
    full = np.einsum("xkm,ynk->xymn", a.reshape(2, 4, 3).astype(np.float64),
                     b.reshape(3, 5, 4)) * 0.5
    for dc, want in ((it, full.reshape(6, 3, 5)), (np.array((1, 3), np.int64),
                                                    full.sum(axis=0))):
        for fn in (gemm._batched_gemm_native, gemm.batched_gemm):
            c = np.full((int(dc.prod()), 3, 5), np.nan, np.float32)
            fn(a, b, True, True, 0.5, it, da, db, dc, c)
            np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-6, err_msg=str(fn))
    with pytest.raises(ValueError, match="batch dims do not broadcast"):
        gemm._batched_gemm_native(a, b, True, True, 1.0, np.array((2, 2), np.int64), da, db,
                                  it, np.empty((4, 3, 5), np.float32))
    sigs = [sg for sg in gemm._batched_gemm_native.signatures if sg[0].dtype.name == "float32"]
    assert len(sigs) == 1, sigs
