"""Random ops inside ``while``: a fresh draw in every iteration (as Fluid), the same numbers from
the reference interpreter and the native loop, a fixed ``seed`` repeating.

The loop body drops out a tensor of ones (``upscale_in_train``, p = 0.5: each element is 0 or
2) and shifts the result into an accumulator, ``acc = acc * 2 + d``: after ``n`` iterations
``acc / 2`` holds iteration ``k``'s mask as bit ``n - 1 - k`` of each element (exact in
float32), so one fetched tensor tells every iteration's mask.
"""
import numpy as np

import pdjit as fluid
from pdjit.framework import dtypes

N_ITER, SIZE = 4, 256


def _block():
    return fluid.default_main_program().current_block()


def _set(dst, src):
    code = dtypes.to_code(src.dtype)
    _block().append_op("cast", inputs={"X": [src.name]}, outputs={"Out": [dst.name]},
                       attrs={"in_dtype": code, "out_dtype": code})


def _program(seed=None, nested_cond=False):
    """(acc, i) of the dropout loop; ``seed``: dropout's fixed seed."""
    ones = fluid.layers.data(name="ones", shape=[SIZE], dtype="float32",
                             append_batch_size=False)
    i = fluid.layers.fill_constant(shape=[1], dtype="int64", value=0)
    n = fluid.layers.fill_constant(shape=[1], dtype="int64", value=N_ITER)
    acc = fluid.layers.scale(ones, scale=0.0)
    cond = fluid.layers.less_than(i, n)
    loop = fluid.layers.While(cond, is_test=True)
    with loop.block():
        d = fluid.layers.dropout(ones, 0.5, seed=seed,
                                 dropout_implementation="upscale_in_train")
        _set(acc, acc * 2.0 + d)
        fluid.layers.increment(i, value=1.0, in_place=True)
        fluid.layers.less_than(x=i, y=n, cond=cond)
    return acc, i


def _masks(acc):
    """Iteration k's keep mask (bool [N_ITER, SIZE]) from the accumulator."""
    bits = np.asarray(acc) / 2.0
    assert np.array_equal(bits, np.round(bits)) and bits.min() >= 0 and bits.max() < 2 ** N_ITER
    b = bits.astype(np.int64)
    return np.stack([(b >> (N_ITER - 1 - k)) & 1 for k in range(N_ITER)]).astype(bool)


def _run(main, acc, exe):
    (got,) = exe.run(main, feed={"ones": np.ones(SIZE, np.float32)}, fetch_list=[acc],
                     scope=fluid.Scope())
    return np.asarray(got)


def _loop_step(exe):
    (_, plan), = exe._plans.values()
    steps = [s for s in plan.steps if s.kind == "native_loop"]
    assert len(steps) == 1, plan.report()
    return steps[0]


def test_dropout_draws_anew_each_iteration_natively_as_the_reference(fresh_programs):
    main, _ = fresh_programs
    acc, _ = _program()
    exe = fluid.Executor(strict=True)
    native = _run(main, acc, exe)
    step = _loop_step(exe)
    assert step.fallbacks == 0 and step.retired is None
    assert len(step.rng_ops) == 1 and step.rng_ops[0][0].type == "dropout"
    reference = _run(main, acc, fluid.Executor(mode="reference"))
    np.testing.assert_array_equal(native, reference)   # bit-identical, every iteration
    masks = _masks(native)
    for k in range(N_ITER):
        assert 0.3 < masks[k].mean() < 0.7            # p = 0.5
        for j in range(k):
            # independent masks agree on about half the elements, equal ones on all
            assert (masks[k] == masks[j]).mean() < 0.7, (j, k)
    # the next run of the same executor draws other masks, still those of the reference's
    # second run
    again = _run(main, acc, exe)
    assert step.fallbacks == 0
    assert (_masks(again) == masks).mean() < 0.7
    ref_exe = fluid.Executor(mode="reference")
    _run(main, acc, ref_exe)
    np.testing.assert_array_equal(again, _run(main, acc, ref_exe))


def test_fixed_seed_repeats_the_mask_in_every_iteration(fresh_programs):
    main, _ = fresh_programs
    acc, _ = _program(seed=7)
    exe = fluid.Executor(strict=True)
    native = _run(main, acc, exe)
    assert _loop_step(exe).fallbacks == 0
    np.testing.assert_array_equal(native, _run(main, acc, fluid.Executor(mode="reference")))
    masks = _masks(native)
    assert 0.3 < masks[0].mean() < 0.7
    for k in range(1, N_ITER):
        np.testing.assert_array_equal(masks[k], masks[0])
    # and in every run
    np.testing.assert_array_equal(_run(main, acc, exe), native)


def test_body_plan_per_iteration_draws_the_same_numbers(fresh_programs):
    """With native loops off the body's own compiled plan runs once per iteration (its
    native step binds the key of that iteration): the same numbers again."""
    main, _ = fresh_programs
    acc, _ = _program()
    exe = fluid.Executor(strict=True, native_loops=False)
    got = _run(main, acc, exe)
    (_, plan), = exe._plans.values()
    assert not [s for s in plan.walk() if s.kind == "native_loop"]
    assert any(s.kind == "native" and s.rng_ops for s in plan.walk())
    np.testing.assert_array_equal(got, _run(main, acc, fluid.Executor(mode="reference")))
    masks = _masks(got)
    assert (masks[0] == masks[1]).mean() < 0.7


def test_nested_loops_draw_anew_in_every_inner_and_outer_iteration(fresh_programs):
    """A while in a while (2 x 2 iterations): the inner loop runs natively inside the outer
    loop's body plan, its key argument carrying the outer iteration; four distinct masks, the
    reference's."""
    main, _ = fresh_programs
    ones = fluid.layers.data(name="ones", shape=[SIZE], dtype="float32",
                             append_batch_size=False)
    i = fluid.layers.fill_constant(shape=[1], dtype="int64", value=0)
    j = fluid.layers.fill_constant(shape=[1], dtype="int64", value=0)
    two = fluid.layers.fill_constant(shape=[1], dtype="int64", value=2)
    zero = fluid.layers.fill_constant(shape=[1], dtype="int64", value=0)
    acc = fluid.layers.scale(ones, scale=0.0)
    outer_cond = fluid.layers.less_than(i, two)
    inner_cond = fluid.layers.less_than(j, two)
    outer = fluid.layers.While(outer_cond, is_test=True)
    with outer.block():
        _set(j, zero)
        fluid.layers.less_than(x=j, y=two, cond=inner_cond)
        inner = fluid.layers.While(inner_cond, is_test=True)
        with inner.block():
            d = fluid.layers.dropout(ones, 0.5, dropout_implementation="upscale_in_train")
            _set(acc, acc * 2.0 + d)
            fluid.layers.increment(j, value=1.0, in_place=True)
            fluid.layers.less_than(x=j, y=two, cond=inner_cond)
        fluid.layers.increment(i, value=1.0, in_place=True)
        fluid.layers.less_than(x=i, y=two, cond=outer_cond)
    exe = fluid.Executor(strict=True)
    got = _run(main, acc, exe)
    (_, plan), = exe._plans.values()
    loops = [s for s in plan.walk() if s.kind == "native_loop"]
    assert len(loops) == 1 and loops[0].rng_ops and loops[0].fallbacks == 0, plan.report()
    np.testing.assert_array_equal(got, _run(main, acc, fluid.Executor(mode="reference")))
    masks = _masks(got)
    for k in range(N_ITER):
        for m in range(k):
            assert (masks[k] == masks[m]).mean() < 0.7, (m, k)
