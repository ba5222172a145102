"""reduce_sum/mean/max/min/prod gradient ops natively (issue 16), against NumPy oracles written
here; each run is compiled strictly (``Executor(strict=True)``) with no reference step in its
plan. Paddle 3.3.1's rules: Out@GRAD has the forward's output shape (keep_dim or not); the
mean's gradient is Out@GRAD / n; max/min share it equally among the positions equal to the
extreme; prod's is the product of the other elements (exact where X holds zeros).
"""
import numpy as np
import pytest

from pdjit.framework.errors import OpRunError
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(1616)


def run_native(op_type, inputs, attrs):
    prog, feed, outs = build_op_program(op_type, inputs, attrs, outputs={"X@GRAD": 1})
    exe = Executor(strict=True)
    got = exe.run(prog, feed=feed, fetch_list=outs["X@GRAD"], scope=Scope())[0]
    steps = [s for _, plan in exe._plans.values() for s in plan.walk()]
    assert not [s.describe() for s in steps if s.kind == "reference"]
    assert_native(exe, op_type)
    return got


def np_axes(shape, dim, reduce_all):
    if reduce_all or not dim or len(dim) >= len(shape):
        return tuple(range(len(shape)))
    return tuple(sorted(d % len(shape) for d in dim))


def oracle(op, x, g, axes):
    """X@GRAD from Out@GRAD ``g`` given with the reduced axes kept (size 1)."""
    if op == "reduce_sum":
        return np.broadcast_to(g, x.shape).copy()
    if op == "reduce_mean":
        n = int(np.prod([x.shape[a] for a in axes]))
        return np.broadcast_to(g / n, x.shape).copy()
    if op == "reduce_prod":  # each element's group product with that element set to 1
        dx = np.empty_like(x)
        for i in np.ndindex(x.shape):
            y = x.copy()
            y[i] = 1
            dx[i] = np.prod(y, axis=axes, keepdims=True)[tuple(
                0 if a in axes else i[a] for a in range(x.ndim))] * \
                g[tuple(0 if a in axes else i[a] for a in range(x.ndim))]
        return dx
    ext = x.max(axis=axes, keepdims=True) if op == "reduce_max" else \
        x.min(axis=axes, keepdims=True)
    hit = (x == ext)
    return np.where(hit, g / hit.sum(axis=axes, keepdims=True), 0)


CASES = [  # (dim, keep_dim, reduce_all)
    ([1], False, False), ([0, 2], True, False), ([-1], False, False), ([0], False, True),
]


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
                                "reduce_prod"])
@pytest.mark.parametrize("dim,keep_dim,reduce_all", CASES)
def test_reduce_grad_native(op, dim, keep_dim, reduce_all):
    # few distinct values: ties in the max/min groups share the gradient, prod meets zeros
    # (groups with none, one and several)
    x = RNG.integers(0, 3, size=(3, 4, 5)).astype(np.float64)
    if op == "reduce_prod":
        x = np.where(RNG.random(x.shape) < 0.9, RNG.uniform(0.5, 1.5, x.shape), 0.0)
    axes = np_axes(x.shape, dim, reduce_all)
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    g = RNG.normal(size=kept)
    out_shape = kept if keep_dim else tuple(d for i, d in enumerate(x.shape) if i not in axes)
    attrs = {"dim": dim, "keep_dim": keep_dim, "reduce_all": reduce_all}
    inputs = {"X": x, "Out@GRAD": g.reshape(out_shape)}
    if op in ("reduce_max", "reduce_min"):
        ext = x.max(axis=axes) if op == "reduce_max" else x.min(axis=axes)
        inputs["Out"] = ext.reshape(out_shape)
    got = run_native(f"{op}_grad", inputs, attrs)
    np.testing.assert_allclose(got, oracle(op, x, g, axes), rtol=1e-13, atol=1e-15)
    assert got.dtype == np.float64 and got.shape == x.shape


def test_reduce_grads_float32_through_the_backward_pass():
    """A program differentiated here: every reduce_*_grad but prod's natively, float32."""
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    x[0, 1, 2] = x[0, 1, 3]  # a tie
    prog, feed, outs = build_op_program("reduce_max", {"X": x}, {"dim": [1, 2]})
    block = prog.global_block()
    xv = block.var("x_0")
    ys = [outs["Out"][0]]
    for op in ("reduce_sum", "reduce_mean", "reduce_min"):
        y = block.create_var(name=f"{op}_out", shape=[2, 3], dtype=np.float32)
        block.append_op(type=op, inputs={"X": [xv]}, outputs={"Out": [y]},
                        attrs={"dim": [-1], "keep_dim": False, "reduce_all": False})
        ys.append(y)
    ws = [RNG.uniform(0.5, 1.5, size=y.shape).astype(np.float32) for y in ys]
    wvars = [block.create_var(name=f"w{i}", shape=list(y.shape), dtype=np.float32,
                              need_check_feed=True) for i, y in enumerate(ys)]
    grads = gradients(ys, [xv], target_gradients=wvars)
    feed = dict(feed, **{f"w{i}": w for i, w in enumerate(ws)})
    exe = Executor(strict=True)
    got = exe.run(prog, feed=feed, fetch_list=grads, scope=Scope())[0]
    assert not [s.describe() for _, p in exe._plans.values() for s in p.walk()
                if s.kind == "reference"]
    assert_native(exe, "reduce grads")
    want = oracle("reduce_max", x, ws[0].reshape(2, 1, 1), (1, 2)) \
        + np.broadcast_to(ws[1][..., None], x.shape) + ws[2][..., None] / 4 \
        + oracle("reduce_min", x, ws[3][..., None], (2,))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.dtype == np.float32


def test_bad_out_grad_is_named():
    with pytest.raises(OpRunError, match=r"reduce_sum_grad.*expected Out@GRAD of shape \[3\]"):
        run_native("reduce_sum_grad", {"X": np.ones((3, 4)), "Out@GRAD": np.ones((4,))},
                   {"dim": [1]})


def test_host_lines_compile_in_a_native_loop(fresh_programs):
    """reduce_mean/max_grad (a 0-d Out@GRAD too), lookup_table_v2 (+grad) and assign_value
    inside a While body: their host lines compile into the native loop's driver."""
    from pdjit import layers

    main, _ = fresh_programs
    x = layers.data("x", [2, 3], dtype="float64", append_batch_size=False)
    ids = layers.data("ids", [3], dtype="int64", append_batch_size=False)
    i, n = layers.fill_constant([1], "int64", 0), layers.fill_constant([1], "int64", 2)
    h = layers.scale(x, scale=1.0)
    cond = layers.less_than(i, n)
    loop = layers.While(cond, is_test=True)
    consts = [0.5, -1.0, 2.0, 0.25, 0.0, 1.5]
    with loop.block():
        blk = main.current_block()
        layers.increment(i, value=1.0, in_place=True)

        def op(type_, ins, vshape, **attrs):
            v = blk.create_var(name=f"{type_}_{len(blk.ops)}", shape=vshape, dtype="float64")
            slot = ("W@GRAD" if type_.startswith("lookup") else "X@GRAD") \
                if type_.endswith("_grad") else "Out"
            blk.append_op(type=type_, inputs=ins, outputs={slot: [v]}, attrs=attrs)
            return v

        m = op("reduce_max", {"X": [h]}, [2], dim=[1])
        dmax = op("reduce_max_grad", {"X": [h], "Out": [m], "Out@GRAD": [m]}, [2, 3], dim=[1])
        s = op("reduce_sum", {"X": [h]}, [], reduce_all=True, dim=[])
        dmean = op("reduce_mean_grad", {"X": [h], "Out@GRAD": [s]}, [2, 3], reduce_all=True,
                   dim=[])
        c = op("assign_value", {}, [2, 3], shape=[2, 3], dtype=6, values=consts)
        e = op("lookup_table_v2", {"Ids": [ids], "W": [h]}, [3, 3], padding_idx=1)
        dw = op("lookup_table_v2_grad", {"W": [h], "Ids": [ids], "Out@GRAD": [e]}, [2, 3],
                padding_idx=1)
        layers.assign(dmax + dmean + c + dw, h)
        layers.less_than(i, n, cond=cond)
    xv = RNG.normal(size=(2, 3))  # float64: the kernels compiled by the tests above serve
    idv = np.array([0, 1, 0], np.int64)
    exe = Executor(strict=True)
    (got,) = exe.run(main, feed={"x": xv, "ids": idv}, fetch_list=[h], scope=Scope())
    assert "native_loop" in [s.kind for _, plan in exe._plans.values() for s in plan.steps]
    assert not [s.describe() for _, p in exe._plans.values() for s in p.walk()
                if s.kind == "reference"]
    assert_native(exe)
    want = xv.copy()
    for _ in range(2):
        mx = want.max(axis=1, keepdims=True)
        hit = want == mx
        dmax = np.where(hit, mx / hit.sum(axis=1, keepdims=True), 0)
        dw = np.zeros_like(want)
        dw[0] = 2 * want[0]  # row 0 looked up twice, row 1 is padding
        want = dmax + want.sum() / 6 + np.reshape(consts, (2, 3)) + dw
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
