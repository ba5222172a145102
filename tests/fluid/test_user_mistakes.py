"""What a new user meets first: the sub-packages as attributes of ``pdjit``, and the errors of
typical mistakes (a feed left out, a misspelt fetch, a layer given an input of the wrong rank or
type), each naming the variable or layer and the user's own line, before any op runs.

Oracles: the names and line numbers written in this file; ``sys.modules`` of a fresh process.
"""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import (
    FeedError,
    FetchError,
    LayerInputError,
    LayerTypeError,
    PdjitError,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = os.path.basename(__file__)


def test_subpackages_are_attributes_imported_on_first_use():
    code = ("import sys, pdjit as paddle\n"
            "names = ('static', 'inference', 'io', 'distributed')\n"
            "lazy = [n for n in names if 'pdjit.' + n not in sys.modules]\n"
            "assert {'static', 'inference', 'distributed'} <= set(lazy), lazy\n"
            "assert 'mpi4py' not in sys.modules\n"
            "assert callable(paddle.static.save_inference_model)\n"
            "assert callable(paddle.inference.create_predictor)\n"
            "assert callable(paddle.io.save_inference_model)\n"
            "assert paddle.distributed.fleet is sys.modules['pdjit.distributed.fleet']\n"
            "assert set(names) <= set(dir(paddle))\n"
            "try:\n"
            "    paddle.no_such_thing\n"
            "except AttributeError as e:\n"
            "    assert 'no_such_thing' in str(e)\n"
            "else:\n"
            "    raise SystemExit('no AttributeError')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def regression():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [3], dtype="float32")
        label = fluid.layers.data("label", [1], dtype="float32")
        pred = fluid.layers.fc(x, 1, name="pred")
        loss = fluid.layers.mean(fluid.layers.square_error_cost(pred, label))
    scope, exe = fluid.Scope(), fluid.Executor()
    exe.run(startup, scope=scope)
    return main, exe, scope, loss, pred


def test_a_missing_feed_is_named_before_any_op_runs(regression):
    main, exe, scope, loss, pred = regression
    x = np.ones((2, 3), np.float32)
    before = {n: np.array(scope.find_var(n).value) for n in ("pred.w_0", "pred.b_0")}
    with pytest.raises(FeedError) as e:
        exe.run(main, feed={"x": x}, fetch_list=[loss], scope=scope)
    msg = str(e.value)
    assert "reads 'label', which is not fed" in msg and "fed: 'x'" in msg
    assert "can be fed: 'x', 'label'" in msg
    for n, v in before.items():
        np.testing.assert_array_equal(scope.find_var(n).value, v)
    # fed: it runs (the loss by hand from the parameters)
    y = np.full((2, 1), 2.0, np.float32)
    (got,) = exe.run(main, feed={"x": x, "label": y}, fetch_list=[loss], scope=scope)
    want = np.mean((x @ before["pred.w_0"] + before["pred.b_0"] - y) ** 2)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_unknown_fetch_lists_near_names(regression):
    main, exe, scope, loss, pred = regression
    feed = {"x": np.ones((1, 3), np.float32), "label": np.ones((1, 1), np.float32)}
    with pytest.raises(FetchError, match=r"fetch: variable 'pred.w0' is not in the program; "
                                         r"did you mean 'pred.w_0'") as e:
        exe.run(main, feed=feed, fetch_list=["pred.w0"], scope=scope)
    assert isinstance(e.value, FeedError)  # code catching feed mistakes catches it too
    with pytest.raises(FetchError, match="no variable has a similar name"):
        exe.run(main, feed=feed, fetch_list=["zzzzzzzz"], scope=scope)


def test_layer_input_checks_name_the_users_line():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        flat = fluid.layers.data("flat", [8], dtype="float32")
        line = sys._getframe().f_lineno + 2
        with pytest.raises(LayerInputError) as e:
            fluid.layers.conv2d(flat, num_filters=4, filter_size=3)
        assert isinstance(e.value, ValueError) and isinstance(e.value, PdjitError)
        assert "conv2d: expected a 4-D input, got 'flat'" in str(e.value)
        assert e.value.location.endswith(f"{HERE}:{line}") and f"{HERE}:{line}" in str(e.value)
        line = sys._getframe().f_lineno + 2
        with pytest.raises(LayerTypeError) as e:
            fluid.layers.fc(np.ones((2, 8)), size=3)
        assert isinstance(e.value, TypeError) and "fc: argument 'input'" in str(e.value)
        assert e.value.location.endswith(f"{HERE}:{line}")
        line = sys._getframe().f_lineno + 2
        with pytest.raises(LayerInputError) as e:  # through a composite network (fluid.nets)
            fluid.nets.simple_img_conv_pool(flat, 4, 3, 2, 2)
        assert e.value.location.endswith(f"{HERE}:{line}")
        line = sys._getframe().f_lineno + 2
        with pytest.raises(LayerTypeError) as e:  # fluid.data, beside fluid.layers
            fluid.data("bad", shape=[None, "8"])
        assert "dims must be ints" in str(e.value) and e.value.location.endswith(f"{HERE}:{line}")
    assert not main.global_block().ops  # refused before any op was appended
