"""A 1x1 convolution on the packed row tiles reads its image through the per-channel product,
sum and clamp before it (declared ``ChannelAffine`` and ``Clamp``: an inference program's batch
norm and relu, as DenseNet and pre-activation ResNets place them) when nothing else reads the
values they compute: no elementwise kernel runs for them, the tiles apply them as they pack the
image's panels. Against NumPy written here; the kernels, the native drivers called directly
and the executor's host driver (strict), one and two threads."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu.lib import conv, pgemm, pointwise
from pdjit.runtime.plan import build_plan
from pdjit.testing import assert_native

RNG = np.random.default_rng(23)
NONE = np.empty(0, np.float32)


def _want(x, w, bias, scale, shift, plo, phi, lo=-np.inf, hi=np.inf, res=None):
    """``clamp(W @ clamp(x * scale + shift, plo, phi) + bias + res, lo, hi)``, float64."""
    v = x.astype(np.float64)
    if scale.size:
        v = v * scale[None, :, None, None]
    if shift.size:
        v = v + shift[None, :, None, None]
    v = np.minimum(np.maximum(v, plo), phi)
    y = np.einsum("mc,nchw->nmhw", w.astype(np.float64), v)
    if bias.size:
        y = y + bias[None, :, None, None]
    if res is not None:
        y = y + res
    return np.minimum(np.maximum(y, lo), hi)


def _packed(w):
    ap = np.empty(pgemm.packed_rows_size(*w.shape), np.float32)
    pgemm.pack_a(w, ap)
    return ap


# (input channels, output channels, plane): few tiles (one panel at a time) and many (blocks
# of pixels); channels that are no multiple of a vector; planes whose last panel is short
SHAPES = [(37, 13, (5, 7)), (20, 50, (9, 9)), (130, 33, (14, 14)), (96, 128, (17, 19)),
          (64, 40, (12, 11))]
PROLOGUES = {"affine relu": (True, True, 0.0, np.inf), "shift relu6": (False, True, 0.0, 6.0),
             "scale": (True, False, -np.inf, np.inf), "clamp": (False, False, -1.0, 1.0)}


@pytest.mark.parametrize("c, m, plane", SHAPES)
@pytest.mark.parametrize("kind", list(PROLOGUES))
def test_the_row_tiles_apply_the_prologue_as_they_pack(c, m, plane, kind):
    """``pointwise_rows_prologue`` at batch 2 with a bias, an epilogue clamp and a residual;
    ``rows_by_pixels_prologue`` over two and three ranges of pixels gives the same bits."""
    has_scale, has_shift, plo, phi = PROLOGUES[kind]
    x = RNG.normal(size=(2, c) + plane).astype(np.float32)
    w = RNG.normal(size=(m, c)).astype(np.float32)
    scale = RNG.uniform(0.5, 1.5, c).astype(np.float32) if has_scale else NONE
    shift = RNG.normal(size=c).astype(np.float32) if has_shift else NONE
    bias = RNG.normal(size=m).astype(np.float32)
    res = RNG.normal(size=(2, m) + plane).astype(np.float32)
    y = np.full((2, m) + plane, np.nan, np.float32)
    pgemm.pointwise_rows_prologue(x, _packed(w), y, 0, 2, bias, -2.0, 5.0, res.reshape(-1),
                                  scale, shift, plo, phi)
    want = _want(x, w, bias, scale, shift, plo, phi, -2.0, 5.0, res)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
    p = plane[0] * plane[1]
    for parts in (2, 3):
        bounds = np.array([p * k // parts // 64 * 64 for k in range(parts)] + [p], np.int64)
        split = np.full((1, m) + plane, np.nan, np.float32)
        pgemm.rows_by_pixels_prologue(x[:1], _packed(w), split, bounds, bias, -2.0, 5.0,
                                      res[:1].reshape(-1), scale, shift, plo, phi)
        assert np.array_equal(split, y[:1])


def test_a_nan_stays_nan_through_the_prologue():
    """relu of NaN is NaN (NumPy's ``maximum``), as the elementwise ops compute it."""
    x = np.ones((1, 16, 8, 8), np.float32)
    x[0, 3, 2, 5] = np.nan
    w = np.ones((16, 16), np.float32)
    y = np.zeros((1, 16, 8, 8), np.float32)
    pgemm.pointwise_rows_prologue(x, _packed(w), y, 0, 1, NONE, -np.inf, np.inf, NONE, NONE,
                                  NONE, 0.0, np.inf)
    assert np.isnan(y[0, :, 2, 5]).all() and not np.isnan(np.delete(y.reshape(16, 64), 21,
                                                                       axis=1)).any()


@pytest.mark.parametrize("plane", [(14, 14), (7, 7)])
def test_the_entry_serves_any_plane(plane):
    """``pointwise_range_prologue`` on the row tiles where the plane takes them (14x14), else
    through ``prologue_into``'s copy and the kernel that serves (7x7: the transposed tiles);
    samples 1..3 of 3 only. (Its compiled form runs in the native drivers below: the same
    calls, typed for both.)"""
    c, m = 48, 32
    x = RNG.normal(size=(3, c) + plane).astype(np.float32)
    w = RNG.normal(size=(m, c, 1, 1)).astype(np.float32)
    scale = RNG.uniform(0.5, 1.5, c).astype(np.float32)
    shift = RNG.normal(size=c).astype(np.float32)
    bias = RNG.normal(size=m).astype(np.float32)
    ap = pointwise.pointwise_weight(w, plane[0] * plane[1], 3)
    want = _want(x, w[:, :, 0, 0], bias, scale, shift, 0.0, 6.0, 0.0, np.inf)
    y = np.full((3, m) + plane, np.nan, np.float32)
    pointwise.pointwise_range_prologue(x, w, ap, y, 1, 3, 1, 1, 0, 0, 1, 1, 1, bias, 0.0,
                                       np.inf, NONE, scale, shift, 0.0, 6.0)
    assert np.isnan(y[0]).all()  # (sample 0 not computed)
    np.testing.assert_allclose(y[1:], want[1:], rtol=1e-5, atol=1e-4)


C, M, H = 40, 48, 15  # (a sample's 1x1 convolution large enough to split over threads)


def _program(fetch_between: bool = False, act=None):
    """x -> x * scale + shift (per channel, parameters) -> relu -> 1x1 convolution of ``M``
    channels onto ``H x H`` (the row tiles) with ``act``; the outputs."""
    x = fluid.layers.data("x", [C, H, H])
    scale = fluid.layers.create_parameter(
        [C], "float32", name="bn.scale",
        default_initializer=fluid.initializer.Uniform(0.5, 1.5))
    shift = fluid.layers.create_parameter(
        [C], "float32", name="bn.shift", default_initializer=fluid.initializer.Normal())
    a = fluid.layers.relu(fluid.layers.elementwise_add(
        fluid.layers.elementwise_mul(x, scale, axis=1), shift, axis=1))
    y = fluid.layers.conv2d(a, M, 1, act=act)
    return [y, a] if fetch_between else [y]


def _values(scope):
    get = lambda n: np.asarray(scope.find_var(n).get_tensor())  # noqa: E731
    return (get("bn.scale"), get("bn.shift"), get("conv2d_0.w_0")[:, :, 0, 0],
            get("conv2d_0.b_0"))


@pytest.mark.parametrize("act", [None, "relu"])
def test_the_convolution_reads_through_the_ops_before_it(fresh_programs, monkeypatch,
                                                        team_loops, act):
    """The product, sum and relu before the convolution taken as its prologue (no kernel of
    their own, the entry ``pointwise_range_prologue`` with the vectors and bounds), with the
    bias and relu after it taken as its epilogue or nothing after it: in the native driver
    and in the executor's host driver at batch 3 and 1, a sample split by pixels over two
    threads (the parallel loop ran)."""
    main, startup = fresh_programs
    (y,) = _program(act=act)
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup, scope=scope)
    scale, shift, w, b = _values(scope)
    plan = build_plan(main, [y.name], native_drivers=True)
    (step,) = plan.steps
    text = step.native.text
    assert "# (read through by the conv2d after it" in text
    assert "pointwise_range_prologue(" in text
    assert not any(ln.strip().startswith("K") for ln in text.splitlines())  # no loop kernel
    monkeypatch.setattr(conv, "loop_threads", lambda: 2)
    for batch in (3, 1):
        xv = RNG.normal(size=(batch, C, H, H)).astype(np.float32)
        want = _want(xv, w, b, scale, shift, 0.0, np.inf,
                     *((0.0, np.inf) if act else (-np.inf, np.inf)))
        args = [xv if n == "x" else np.asarray(scope.find_var(n).get_tensor())
                for n in step.args]
        (got,) = step.native.fn(*args)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        assert_native(exe)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert (pgemm.rows_by_pixels_prologue, np.inf, True) in team_loops  # (batch 1: split)
    assert step.native.fn.signatures  # the native driver compiled and ran
    texts = [s.compiled.text for _, p in exe._plans.values() for s in p.walk()
             if s.kind == "native"]
    assert any("_nn.split_work(_nn.pointwise_range_prologue," in t for t in texts)


def test_values_read_elsewhere_keep_their_kernel(fresh_programs):
    """The relu's output fetched too: the ops before the convolution run as their own kernel,
    the convolution reads their result; the values right."""
    main, startup = fresh_programs
    y, a = _program(fetch_between=True)
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup, scope=scope)
    scale, shift, w, b = _values(scope)
    xv = RNG.normal(size=(2, C, H, H)).astype(np.float32)
    got_y, got_a = exe.run(main, feed={"x": xv}, fetch_list=[y, a], scope=scope)
    assert_native(exe)
    np.testing.assert_allclose(got_a, np.maximum(xv * scale[:, None, None] +
                                                 shift[:, None, None], 0), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(got_y, _want(xv, w, b, scale, shift, 0.0, np.inf), rtol=1e-4,
                               atol=1e-4)
    texts = [s.compiled.text for _, p in exe._plans.values() for s in p.walk()
             if s.kind == "native"]
    assert not any("read through" in t or "pointwise_range_prologue" in t for t in texts)


# (the ops before the convolution, each (kind, argument); whether the convolution takes them)
CHAINS = {
    "shift relu6": ([("add", "[C]"), ("relu6", None)], True),
    "scale": ([("mul", "[C]")], True),
    "scale of [1, C, 1, 1] then relu": ([("mul", "[1,C,1,1]"), ("relu", None)], True),
    "relu alone": ([("relu", None)], True),
    "relu then scale": ([("relu", None), ("mul", "[C]")], False),
    "shift then scale": ([("add", "[C]"), ("mul", "[C]")], False),
    "a scale per pixel": ([("mul", "[H]")], False),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_which_chains_the_convolution_takes(fresh_programs, name):
    """A product by a vector per channel, then a sum of one, then a clamp, each optional, in
    that order, is taken; any other chain runs as its own kernel before the convolution. The
    values against NumPy either way (host driver, strict)."""
    ops, taken = CHAINS[name]
    main, startup = fresh_programs
    x = fluid.layers.data("x", [C, H, H])
    cur, steps = x, []
    for k, (kind, arg) in enumerate(ops):
        if kind in ("relu", "relu6"):
            cur = getattr(fluid.layers, kind)(cur)
            steps.append(lambda v, kind=kind: np.minimum(np.maximum(v, 0), 6 if kind == "relu6"
                                                         else np.inf))
            continue
        shape = {"[C]": [C], "[1,C,1,1]": [1, C, 1, 1], "[H]": [H]}[arg]
        p = fluid.layers.create_parameter(shape, "float32", name=f"p{k}",
                                          default_initializer=fluid.initializer.Uniform(0.5, 1.5))
        op = fluid.layers.elementwise_mul if kind == "mul" else fluid.layers.elementwise_add
        cur = op(cur, p, axis=-1 if arg != "[C]" else 1)
        steps.append((kind, f"p{k}", shape))
    y = fluid.layers.conv2d(cur, M, 1)
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup, scope=scope)
    xv = RNG.normal(size=(2, C, H, H)).astype(np.float32)
    (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
    assert_native(exe)
    v = xv.astype(np.float64)
    for s in steps:
        if callable(s):
            v = s(v)
            continue
        kind, pname, shape = s
        pv = np.asarray(scope.find_var(pname).get_tensor()).astype(np.float64)
        pv = pv[:, None, None] if shape == [C] else pv
        v = v * pv if kind == "mul" else v + pv
    w = np.asarray(scope.find_var("conv2d_0.w_0").get_tensor())[:, :, 0, 0]
    b = np.asarray(scope.find_var("conv2d_0.b_0").get_tensor())
    np.testing.assert_allclose(got, _want(v, w, b, NONE, NONE, -np.inf, np.inf), rtol=1e-4,
                               atol=1e-4)
    texts = "\n".join(s.compiled.text for _, p in exe._plans.values() for s in p.walk()
                      if s.kind == "native")
    assert ("pointwise_range_prologue" in texts) == taken
