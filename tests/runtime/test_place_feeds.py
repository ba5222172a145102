"""Feed lists with one dict per place (what a DataLoader given ``places`` yields)."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import assert_native


def _program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[3], dtype="float32")
        y = fluid.layers.scale(fluid.layers.relu(x), scale=2.0)
    return main, y


def test_a_list_of_one_dict_feeds_a_plain_program():
    main, y = _program()
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    (out,) = exe.run(main, feed=[{"x": x}], fetch_list=[y])
    np.testing.assert_array_equal(out, 2 * np.maximum(x, 0))
    assert_native(exe)


def test_several_places_need_a_data_parallel_program():
    main, y = _program()
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    a, b = np.ones((2, 3), np.float32), -np.ones((1, 3), np.float32)
    with pytest.raises(fluid.FeedError, match="with_data_parallel"):
        exe.run(main, feed=[{"x": a}, {"x": b}], fetch_list=[y])
    compiled = fluid.CompiledProgram(main).with_data_parallel()
    with pytest.warns(UserWarning):
        (out,) = exe.run(compiled, feed=[{"x": a}, {"x": b}], fetch_list=[y])
    np.testing.assert_array_equal(out, 2 * np.maximum(np.concatenate([a, b]), 0))
    with pytest.raises(fluid.FeedError, match="place 1 feeds"):
        exe.run(compiled, feed=[{"x": a}, {"y": b}], fetch_list=[y])
    with pytest.raises(TypeError, match="one such dict per place"):
        exe.run(main, feed=[a], fetch_list=[y])
