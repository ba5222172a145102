"""The one-op runner of the test helpers: built once, each run reads the inputs as they are then
(what finite differences rely on), the same values as a fresh run_op."""
import numpy as np

from pdjit.testing.grad_check import numeric_grad
from pdjit.testing.op_test import OpRun, run_op


def test_a_run_sees_inputs_changed_in_place():
    x = np.array([[0.5, -1.0, 2.0]])
    run = OpRun("tanh", {"X": x})
    np.testing.assert_array_equal(run()["Out"], np.tanh(x))
    x[0, 1] = 3.0
    np.testing.assert_array_equal(run(check=False)["Out"], np.tanh(x))
    np.testing.assert_array_equal(run()["Out"], run_op("tanh", {"X": x})["Out"])


def test_finite_differences_of_a_lod_input_match_the_derivative():
    x = np.array([[0.5], [-1.0], [2.0], [0.25]])
    lod = [[0, 1, 4]]
    w = np.array([[1.0], [2.0]])
    got = numeric_grad("sequence_pool", {"X": (x, lod)}, {"pooltype": "SQRT"}, "Out", "X", w)
    want = np.array([[1.0], [2.0 / np.sqrt(3)], [2.0 / np.sqrt(3)], [2.0 / np.sqrt(3)]])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_finite_differences_of_a_random_op_see_the_same_draws():
    """dropout without a fixed seed: a fresh program's first run draws the same mask each time
    (a rerun of one executor would draw a new one and the differences would be noise)."""
    x = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    mask = run_op("dropout", {"X": x}, {"dropout_prob": 0.5})["Mask"]
    w = np.linspace(0.5, 1.5, 12).reshape(3, 4)
    got = numeric_grad("dropout", {"X": x}, {"dropout_prob": 0.5}, "Out", "X", w)
    np.testing.assert_allclose(got, w * mask, rtol=1e-6, atol=1e-9)
