"""The plane kernels (``tile.plane_kernel``: depthwise filters; ``tile.pool_plane_kernel``: 3x3
max pools) in vectors of every width a CPU may give them (``PLANE_BYTES`` 16, 32, 64, set
while each kernel compiles), against loops written here: planes narrower than a vector, one
vector wide, a vector and a bit (the last column of vectors overlaps the one before), several
vectors with columns inside the image (loaded and stored without masks) and at its edges,
every padding the filter allows, strides 1 and 2. Each output sums its taps in the same order
at every width, so all widths give the same bits."""
import functools
import re

import numpy as np
import pytest

from pdjit.codegen.cpu.lib import tile
from pdjit.codegen.cpu.lib._jit import caller

RNG = np.random.default_rng(11)
WIDTHS = (16, 32, 64)


def _at_width(nbytes, run):
    """``run`` with :data:`tile.PLANE_BYTES` at ``nbytes`` for each call: the plane kernels
    read it when a caller of theirs compiles, which a Numba function does at its first call
    for each argument types, not when it is defined."""
    def call(*args):
        before = tile.PLANE_BYTES
        tile.PLANE_BYTES = nbytes
        try:
            return run(*args)
        finally:
            tile.PLANE_BYTES = before

    call.dispatcher = run
    return call


@functools.cache
def _plane(nbytes, k, stride):
    kernel = tile.plane_kernel(k, k, stride)

    @caller
    def run(wf, xs, h, w, df, oh, ow, pt, pl, bias, ep, lo, hi):
        for m in range(bias.size):
            kernel(wf, m * k * k, xs, m * h * w, h, w, df, m * oh * ow, oh, ow, pt, pl, bias,
                   m, ep, True, lo, hi)

    return _at_width(nbytes, run)


@functools.cache
def _pool(nbytes, stride):
    kernel = tile.pool_plane_kernel(3, stride)

    @caller
    def run(xs, c, h, w, df, oh, ow, pt, pl):
        for m in range(c):
            kernel(xs, m * h * w, h, w, df, m * oh * ow, oh, ow, pt, pl)

    return _at_width(nbytes, run)


def _lanes(call, dtype) -> set:
    """The vector lengths (lanes) of the code of ``call``'s function compiled for ``dtype``
    data."""
    return {int(n) for sig, ir in call.dispatcher.inspect_llvm().items()
            if str(sig[0].dtype) == np.dtype(dtype).name
            for n in re.findall(r"<(\d+) x (?:float|double)>", ir)}


def _depthwise(x, w, s, p, bias, lo, hi):
    """The depthwise convolution by loops over the taps, in float64."""
    c, h, wd = x.shape
    k = w.shape[1]
    oh, ow = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (p, p), (p, p)))
    y = np.zeros((c, oh, ow))
    for i in range(k):
        for j in range(k):
            y += w[:, i, j, None, None] * xp[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s]
    return np.clip(y + bias[:, None, None], lo, hi)


# (rows, columns): narrower than 4 lanes (float64 at 32 bytes), than 8, as wide as 8, a
# vector and a bit, several vectors, a long row ending part-way
PLANES = [(5, 3), (6, 7), (9, 8), (7, 9), (12, 17), (10, 40), (4, 71)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k,stride", [(3, 1), (3, 2), (5, 1), (5, 2)])
def test_depthwise_planes_at_every_vector_width(dtype, k, stride):
    runs = {nb: _plane(nb, k, stride) for nb in WIDTHS}
    c = 3
    for h, wd in PLANES:
        for p in range(max(0, (k - min(h, wd) + 1) // 2), k // 2 + 1):
            oh, ow = (h + 2 * p - k) // stride + 1, (wd + 2 * p - k) // stride + 1
            x = RNG.standard_normal((c, h, wd)).astype(dtype)
            w = RNG.standard_normal((c, k, k)).astype(dtype)
            bias = RNG.standard_normal(c).astype(dtype)
            got = {}
            for ep, lo, hi in ((False, -np.inf, np.inf), (True, 0.0, 1.5)):
                want = _depthwise(x, w, stride, p, bias if ep else 0 * bias, lo, hi)
                for nb, run in runs.items():
                    y = np.full(c * oh * ow + 5, np.nan, dtype)
                    run(w.reshape(-1), x.reshape(-1), h, wd, y, oh, ow, p, p, bias, ep, lo, hi)
                    where = f"k {k} s {stride} plane {h}x{wd} pad {p} bytes {nb} ep {ep}"
                    np.testing.assert_allclose(y[:-5].reshape(want.shape), want, rtol=1e-5,
                                               atol=1e-5 * max(1, np.abs(want).max()),
                                               err_msg=where)
                    assert np.isnan(y[-5:]).all(), where  # nothing past the planes
                    got[nb, ep] = y
            for nb in WIDTHS:
                for ep in (False, True):
                    assert np.array_equal(got[nb, ep], got[64, ep], equal_nan=True)
    for nb, run in runs.items():  # each width's code in vectors of its width
        assert nb // np.dtype(dtype).itemsize in _lanes(run, dtype), (nb, _lanes(run, dtype))


@pytest.mark.parametrize("stride", [1, 2])
def test_max_pool_planes_at_every_vector_width(stride):
    runs = {nb: _pool(nb, stride) for nb in WIDTHS}
    c = 2
    for h, wd in PLANES:
        for p in (0, 1):
            if h + 2 * p < 3 or wd + 2 * p < 3:
                continue
            oh, ow = (h + 2 * p - 3) // stride + 1, (wd + 2 * p - 3) // stride + 1
            x = RNG.standard_normal((c, h, wd)).astype(np.float32)
            xp = np.pad(x, ((0, 0), (p, p), (p, p)), constant_values=-np.inf)
            want = np.empty((c, oh, ow), np.float32)
            for i in range(oh):
                for j in range(ow):
                    s0, s1 = i * stride, j * stride
                    want[:, i, j] = xp[:, s0:s0 + 3, s1:s1 + 3].max(axis=(1, 2))
            for nb, run in runs.items():
                y = np.full(c * oh * ow + 3, np.nan, np.float32)
                run(x.reshape(-1), c, h, wd, y, oh, ow, p, p)
                np.testing.assert_array_equal(y[:-3].reshape(want.shape), want,
                                              err_msg=f"s {stride} {h}x{wd} pad {p} bytes {nb}")
                assert np.isnan(y[-3:]).all()
    for nb, run in runs.items():
        assert nb // 4 in _lanes(run, np.float32), (nb, _lanes(run, np.float32))


@pytest.mark.parametrize("stride", [1, 2])
def test_a_plane_of_no_rows_reads_nothing(stride):
    """An image of no rows, padded into output rows: every output is the bias alone (no row
    read, not even row 0's in place of one outside the image)."""
    c, wd, p = 2, 20, 2
    for nb in WIDTHS:
        run = _plane(nb, 3, stride)
        oh, ow = (2 * p - 3) // stride + 1, (wd + 2 * p - 3) // stride + 1
        x = np.empty(0, np.float32)
        w = RNG.standard_normal(c * 9).astype(np.float32)
        bias = RNG.standard_normal(c).astype(np.float32)
        y = np.full(c * oh * ow, np.nan, np.float32)
        run(w, x, 0, wd, y, oh, ow, p, p, bias, True, -np.inf, np.inf)
        np.testing.assert_array_equal(y.reshape(c, oh, ow),
                                      np.broadcast_to(bias[:, None, None], (c, oh, ow)))
