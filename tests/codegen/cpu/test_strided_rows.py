"""The strided loop form's contiguous inner loop (``pdjit.codegen.sequential._strided``): an
elementwise group whose broadcast is known only at run time (a squeeze-and-excitation scale:
``[N, 1, 1, C]`` times ``[N, H, W, C]``, or ``[N, C, 1, 1]`` times ``[N, C, H, W]``, the batch
unknown when the program is built) runs its innermost loop contiguously where every leaf steps
by one along the last dim or (its build-time shape 1 there) by none, and the general nest
otherwise; every case against NumPy, in native code."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen import sequential
from pdjit.codegen.kernel import Leaf, LoopKernel
from pdjit.testing import assert_native

RNG = np.random.default_rng(71)


def _kernel(xs, ys):
    return LoopKernel(rank=len(xs), leaves=[Leaf(len(xs), 0, xs, "strided"),
                                            Leaf(len(ys), 0, ys, "strided")],
                      body=["e0 = x0 * x1"], stores=[("e0", "np.float32", frozenset({0, 1}))],
                      nparams=0, form="strided")


def test_the_inner_loop_is_contiguous_where_the_leaves_allow():
    # channels last: both leaves step by one along C
    src = sequential.render(_kernel((-1, 7, 7, 96), (-1, 1, 1, 96)))
    assert "fast = st0_3 == np.uint64(1) and st1_3 == np.uint64(1)" in src
    assert "x1 = F1[b1_2 + j]" in src
    # channels first: the scale's value loaded once a row (its build-time shape is 1 there)
    src = sequential.render(_kernel((-1, 96, 7, 7), (-1, 96, 1, 1)))
    assert "fast = st0_3 == np.uint64(1) and st1_3 == np.uint64(0)" in src
    assert "x1 = F1[b1_2]" in src and "x0 = F0[b0_2 + j]" in src
    # a reduction keeps the general nest alone
    k = _kernel((-1, 96, 7, 7), (-1, 96, 1, 1))
    from pdjit.codegen.kernel import ReduceSpec
    k.reduce = ReduceSpec("0", "{acc} + x0", "{acc}", (2, 3), False, "np.float32", "x0")
    k.form = "reduce_strided"
    assert "fast" not in sequential.render(k)


@pytest.mark.parametrize("xshape,yshape,xs,ys", [
    ([-1, 4, 5, -1], [-1, 1, 1, -1], (3, 4, 5, 6), (3, 1, 1, 6)),   # contiguous rows
    ([-1, 4, 5, -1], [-1, 1, 1, -1], (3, 4, 5, 6), (1, 1, 1, 6)),   # the scale's batch of 1
    ([-1, 4, 5, -1], [-1, 1, 1, -1], (3, 4, 5, 1), (3, 1, 1, 6)),   # x broadcast on the last
    ([-1, 4, 5, -1], [-1, 1, 1, -1], (2, 4, 5, 6), (2, 1, 1, 1)),   # ... and y: the nest
    ([-1, 6, 4, 5], [-1, 6, 1, 1], (3, 6, 4, 5), (3, 6, 1, 1)),     # channels first
    ([-1, 6, 4, 5], [-1, 6, 1, 1], (3, 6, 4, 5), (1, 6, 1, 1)),
])
def test_scale_matches_numpy_in_native_code(fresh_programs, xshape, yshape, xs, ys):
    x = fluid.data("x", xshape, "float32")
    y = fluid.data("y", yshape, "float32")
    out = fluid.layers.relu(fluid.layers.elementwise_mul(x, y) + 1.0)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    xv = RNG.standard_normal(xs).astype(np.float32)
    yv = RNG.standard_normal(ys).astype(np.float32)
    got, = exe.run(fluid.default_main_program(), feed={"x": xv, "y": yv}, fetch_list=[out])
    assert_native(exe)
    np.testing.assert_array_equal(got, np.maximum(xv * yv + np.float32(1.0), 0))
    report = exe.explain(fluid.default_main_program(), feed={"x": xv, "y": yv},
                         fetch_list=[out])
    assert "# form strided" in report and "if fast:" in report, report
