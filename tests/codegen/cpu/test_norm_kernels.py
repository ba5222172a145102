"""The batch/instance/group norm entry points of ``pdjit.codegen.cpu.lib.norm`` on (A, P, C, R)
views: host (NumPy bookkeeping around the kernels) and native (compiled callers: the entries'
overloads) against NumPy written here, channel-last data on the kernels' 3-D path."""
import numpy as np
import pytest

from pdjit.codegen.cpu import lib as nnlib
from pdjit.codegen.cpu.lib import norm as nk
from pdjit.codegen.cpu.lib._jit import caller

RNG = np.random.default_rng(17)
EPS = 1e-5


def np_norm(x, dy, scale, bias, per_sample, cpg, batch_stats):
    """mean, var (K, G), y (with relu), dx, dscale, dbias in float64 by the textbook formulas."""
    a, p, c, r = x.shape
    g = c // cpg
    axes = (2,) if per_sample else (0, 2)
    k = a if per_sample else 1

    def groups(v):  # (A, P, C, R) -> (A, G, cpg * P * R)
        return np.moveaxis(v, 2, 1).reshape(a, g, cpg, p, r).reshape(a, g, -1)

    def back(v):  # (A, G, cpg * P * R) -> (A, P, C, R)
        return np.moveaxis(v.reshape(a, g, cpg, p, r).reshape(a, c, p, r), 1, 2)
    xg = groups(x.astype(np.float64))
    mean = xg.mean(axes, keepdims=True)
    var = xg.var(axes, keepdims=True)
    inv = 1 / np.sqrt(var + EPS)
    xhat = back((xg - mean) * inv)
    sc, bi = scale[None, None, :, None], bias[None, None, :, None]
    y = np.maximum(xhat * sc + bi, 0)
    gg = groups(dy * sc)
    xh = groups(xhat)
    if batch_stats:
        dx = back(inv * (gg - gg.mean(axes, keepdims=True) -
                         xh * (gg * xh).mean(axes, keepdims=True)))
    else:
        dx = back(inv * gg)
    return (mean.reshape(k, g), var.reshape(k, g), y, dx, (dy * xhat).sum((0, 1, 3)),
            dy.astype(np.float64).sum((0, 1, 3)))


@caller
def _native(x, dy, scale, bias, per_sample, cpg, batch_stats, mean, var, y, dx, ds, db):
    nnlib.norm_stats(x, per_sample, cpg, mean, var)
    inv = 1.0 / np.sqrt(var + 1e-5)
    nnlib.norm_apply(x, mean, inv, scale, bias, per_sample, cpg, True, y)
    nnlib.norm_grad(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, ds, db)


def _host(x, dy, scale, bias, per_sample, cpg, batch_stats, mean, var, y, dx, ds, db):
    nnlib.norm_stats(x, per_sample, cpg, mean, var)
    inv = 1.0 / np.sqrt(var + EPS)
    nnlib.norm_apply(x, mean, inv, scale, bias, per_sample, cpg, True, y)
    nnlib.norm_grad(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, ds, db)


# (view, per_sample, cpg, batch_stats): batch norm NCHW / channel-last, instance norm, group norm
CASES = [((5, 1, 6, 7), False, 1, True), ((4, 6, 5, 1), False, 1, True),
         ((4, 6, 5, 1), False, 1, False), ((4, 1, 6, 5), True, 1, True),
         ((4, 1, 6, 5), True, 2, True), ((3, 4, 6, 1), True, 3, True)]


@pytest.mark.parametrize("view,per_sample,cpg,batch_stats", CASES)
def test_host_and_native_entries_match_numpy(view, per_sample, cpg, batch_stats):
    a, p, c, r = view
    x = RNG.normal(3.0, 2.0, view).astype(np.float32)
    dy = RNG.normal(size=view).astype(np.float32)
    scale = RNG.uniform(0.5, 1.5, c).astype(np.float32)
    bias = RNG.normal(size=c).astype(np.float32)
    k, g = (a if per_sample else 1), c // cpg
    got = {}
    for name, run in (("host", _host), ("native", _native)):
        out = (np.empty((k, g)), np.empty((k, g)), np.empty_like(x), np.empty_like(x),
               np.empty(c, np.float32), np.empty(c, np.float32))
        run(x, dy, scale, bias, per_sample, cpg, batch_stats, *out)
        got[name] = out
    want = np_norm(x, dy, scale, bias, per_sample, cpg, batch_stats)
    for i, (h, n, w) in enumerate(zip(got["host"], got["native"], want)):
        np.testing.assert_allclose(h, n, rtol=1e-6, atol=1e-6, err_msg=f"output {i}")
        tol = 1e-12 if i < 2 else 1e-4  # float64 statistics; float32 outputs
        np.testing.assert_allclose(h, w, rtol=tol, atol=tol, err_msg=f"output {i}")
    if r == 1:  # channel-last data ran the kernels' 3-D (inner loop over channels) path
        for kernel in (nk._stats_k, nk._apply_k, nk._grad_k):
            assert any(sig[0].ndim == 3 for sig in kernel.signatures), kernel


def test_statistics_of_a_large_mean_keep_float64_precision():
    """Two passes in float64: the variance of values far from 0 is not lost to cancellation."""
    x = (1e4 + RNG.normal(size=(8, 1, 3, 50))).astype(np.float32)
    mean, var = np.empty((1, 3)), np.empty((1, 3))
    nnlib.norm_stats(x, False, 1, mean, var)
    xd = np.moveaxis(x.astype(np.float64), 2, 0).reshape(3, -1)
    np.testing.assert_allclose(mean[0], xd.mean(1), rtol=1e-14)
    np.testing.assert_allclose(var[0], xd.var(1), rtol=1e-10)


def test_empty_data_and_misfits():
    x = np.zeros((0, 1, 4, 3), np.float32)
    mean, var = np.full((1, 4), 7.0), np.full((1, 4), 7.0)
    nnlib.norm_stats(x, False, 1, mean, var)
    assert not mean.any() and not var.any()
    ds, db = np.full(4, 7, np.float32), np.full(4, 7, np.float32)
    nnlib.norm_grad(x, x, mean, var, np.ones(4, np.float32), False, 1, True, x.copy(), ds, db)
    assert not ds.any() and not db.any()
    x = np.zeros((2, 1, 4, 3), np.float32)
    with pytest.raises(ValueError, match="statistics do not fit"):
        _native(x, x, np.ones(4, np.float32), np.zeros(4, np.float32), False, 3, True,
                np.empty((1, 1)), np.empty((1, 1)), np.empty_like(x), np.empty_like(x),
                np.empty(4, np.float32), np.empty(4, np.float32))
    with pytest.raises(ValueError, match="norm_apply: Scale, Bias or Y do not fit X"):
        _native(x, x, np.ones(3, np.float32), np.zeros(4, np.float32), False, 1, True,
                np.empty((1, 4)), np.empty((1, 4)), np.empty_like(x), np.empty_like(x),
                np.empty(4, np.float32), np.empty(4, np.float32))
    with pytest.raises(ValueError, match="norm_grad: Scale, Y@GRAD or the gradients"):
        _native(x, x[:1], np.ones(4, np.float32), np.zeros(4, np.float32), False, 1, True,
                np.empty((1, 4)), np.empty((1, 4)), np.empty_like(x), np.empty_like(x),
                np.empty(4, np.float32), np.empty(4, np.float32))
    with pytest.raises(ValueError, match="statistics do not fit"):  # a kernel called wrongly
        nk._stats_k(x, x, np.zeros((1, 4)), np.zeros((3, 4)), np.zeros((3, 4)), 0, 0, 2)
