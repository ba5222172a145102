"""The backward pass as a program rewrite: naming, summing, pruning, seeds — against NumPy."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import ProgramError


def _run(main, feed, fetch, mode="compiled"):
    return fluid.Executor(mode=mode).run(main, feed=feed, fetch_list=fetch, scope=fluid.Scope())


@pytest.mark.parametrize("mode", ["compiled", "reference"])
def test_gradient_with_several_producers_is_summed(fresh_programs, mode):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float64", append_batch_size=False)
    y = x * x + fluid.layers.tanh(x) + x          # x feeds three ops
    (gx,) = fluid.gradients([y], [x])
    types = [op.type for op in main.global_block().ops]
    assert "sum" in types                           # the three contributions are added
    assert gx.name == "x@GRAD" and gx.shape == x.shape and gx.dtype == np.float64
    xv = np.array([-1.0, 0.5, 2.0])
    (g,) = _run(main, {"x": xv}, [gx], mode)
    np.testing.assert_allclose(g, 2 * xv + (1 - np.tanh(xv) ** 2) + 1, rtol=1e-12)


def test_stop_gradient_and_no_grad_set_prune_the_backward_pass(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data(name="x", shape=[4], dtype="float32")
    h = fluid.layers.fc(x, 3, name="first")
    h2 = fluid.layers.fc(fluid.layers.relu(h), 2, name="second")
    loss = fluid.layers.mean(h2)
    params_grads = fluid.append_backward(loss, no_grad_set={"first.w_0"})
    names = {p.name for p, _ in params_grads}
    assert names == {"first.b_0", "second.w_0", "second.b_0"}
    grad_ops = [op for op in main.global_block().ops if op.attr("op_role") & 1]
    outputs = {n for op in grad_ops for n in op.output_arg_names}
    assert "first.w_0@GRAD" not in outputs and "x@GRAD" not in outputs  # x: stop_gradient
    # the op producing a parameter's gradient records it in op_role_var, as Paddle does
    mul_grad = next(op for op in grad_ops if "second.w_0@GRAD" in op.output_arg_names)
    assert mul_grad.attr("op_role_var") == ["second.w_0", "second.w_0@GRAD"]
    seed = next(op for op in main.global_block().ops if op.type == "fill_constant"
                and op.output_arg_names == [loss.name + "@GRAD"])
    assert seed.attr("op_role") == 257 and loss.op.attr("op_role") == 256


def test_parameter_list_and_untrainable_parameters(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[4], dtype="float32")
    frozen = fluid.ParamAttr(name="frozen_w", trainable=False)
    h = fluid.layers.fc(fluid.layers.fc(x, 3, param_attr=frozen), 2)
    loss = fluid.layers.mean(h)
    pg = fluid.append_backward(loss, parameter_list=["fc_1.w_0"])
    assert [p.name for p, _ in pg] == ["fc_1.w_0"]
    assert not any("frozen_w@GRAD" in op.output_arg_names for op in main.global_block().ops)


def test_matmul_chain_gradients_match_numpy(fresh_programs):
    main, _ = fresh_programs
    a = fluid.layers.data(name="a", shape=[3, 4], dtype="float64", append_batch_size=False)
    b = fluid.layers.data(name="b", shape=[4, 2], dtype="float64", append_batch_size=False)
    a.stop_gradient = b.stop_gradient = False
    s = fluid.layers.softmax(fluid.layers.matmul(a, b))
    loss = fluid.layers.reduce_sum(fluid.layers.elementwise_mul(s, s))
    ga, gb = fluid.gradients([loss], [a, b])
    rng = np.random.default_rng(1)
    av, bv = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    got_a, got_b = _run(main, {"a": av, "b": bv}, [ga, gb])
    z = av @ bv
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dp = 2 * p
    dz = p * (dp - (dp * p).sum(1, keepdims=True))
    np.testing.assert_allclose(got_a, dz @ bv.T, rtol=1e-10)
    np.testing.assert_allclose(got_b, av.T @ dz, rtol=1e-10)


def test_target_gradients_seed_the_backward_pass(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[2, 2], dtype="float64", append_batch_size=False)
    seed = fluid.layers.data(name="seed", shape=[2, 2], dtype="float64",
                             append_batch_size=False)
    y = fluid.layers.exp(x)
    (gx,) = fluid.gradients([y], [x], target_gradients=[seed])
    xv, sv = np.array([[0.0, 1.0], [2.0, -1.0]]), np.array([[1.0, 2.0], [3.0, 4.0]])
    (g,) = _run(main, {"x": xv, "seed": sv}, [gx])
    np.testing.assert_allclose(g, sv * np.exp(xv), rtol=1e-12)


def test_a_loss_of_unknown_shape_needs_a_seed(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.relu(x)
    with pytest.raises(ProgramError, match="unknown dims"):
        fluid.append_backward(y)
