"""CTC (``pdjit.ops.ctc``): ``warpctc``'s loss against a brute-force sum over every alignment
written here, its gradient against finite differences; ``ctc_align`` and the
``ctc_greedy_decoder`` / ``warpctc`` layers in a program."""
import itertools

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerInputError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor
from pdjit.testing import check_output
from pdjit.testing.grad_check import check_grad

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(4)


def collapse(path, blank):
    out, prev = [], None
    for c in path:
        if c != prev and c != blank:
            out.append(c)
        prev = c
    return out


def brute_nll(logits, label, blank):
    """-log of the summed probability of every path that collapses to label."""
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    total = 0.0
    for path in itertools.product(range(logits.shape[1]), repeat=logits.shape[0]):
        if collapse(path, blank) == list(label):
            total += np.prod([p[t, c] for t, c in enumerate(path)])
    return -np.log(total) if total > 0 else np.inf


def test_warpctc_loss_against_brute_force_and_grad():
    x = RNG.normal(size=(9, 3))
    xl = [[0, 4, 5, 9]]                          # steps 4, 1, 4
    lab = np.array([[1], [1], [2], [1], [2]], np.int32)
    ll = [[0, 2, 3, 5]]                          # labels [1 1], [2], [1 2]
    want = np.array([[brute_nll(x[a:b], lab[c:d, 0], 0)] for a, b, c, d in
                     zip(xl[0], xl[0][1:], ll[0], ll[0][1:])])
    check_output("warpctc", {"Logits": (x, xl), "Label": (lab, ll)}, expected={"Loss": want})
    check_grad("warpctc", {"Logits": (x, xl), "Label": (lab, ll)}, inputs_to_check=("Logits",),
               output_name="Loss", max_relative_error=1e-5)
    # blank 2, and a label the steps cannot fit: infinite loss, no gradient
    want2 = np.array([[brute_nll(x[:4], [0, 1], 2)], [np.inf]])
    got = check_output("warpctc", {"Logits": (x[:5], [[0, 4, 5]]),
                                   "Label": (np.array([[0], [1], [0], [0]], np.int32),
                                             [[0, 2, 4]])},
                       {"blank": 2}, expected={"Loss": want2})
    assert np.isinf(got["Loss"][1, 0])


def test_ctc_align():
    ids = np.array([[0], [2], [2], [0], [2], [1], [1], [3], [3]], np.int64)
    lod = [[0, 5, 5, 9]]
    check_output("ctc_align", {"Input": (ids, lod)}, {"blank": 0},
                 {"Output": (np.array([[2], [2], [1], [3]], np.int64), [[0, 2, 2, 4]])})
    check_output("ctc_align", {"Input": (ids, lod)}, {"blank": 0, "merge_repeated": False},
                 {"Output": (np.array([[2], [2], [2], [1], [1], [3], [3]], np.int64),
                             [[0, 3, 3, 7]])})


def test_ctc_layers_in_a_program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 4], "float32", lod_level=1)
        y = fluid.data("y", [-1, 1], "int32", lod_level=1)
        x.stop_gradient = False
        decoded = fluid.layers.ctc_greedy_decoder(fluid.layers.softmax(x), blank=0)
        loss = fluid.layers.warpctc(x, y, norm_by_times=True)
        grad, = fluid.gradients([fluid.layers.reduce_sum(loss)], [x])
        with pytest.raises(LayerInputError, match=r"warpctc: the padded form \(input_length"):
            fluid.layers.warpctc(x, y, input_length=x)
    scores = np.array([[.6, .1, .3, .1], [.3, .2, .4, .1], [.1, .5, .1, .3], [.5, .1, .3, .1],
                       [.5, .1, .3, .1], [.2, .2, .2, .4], [.2, .2, .1, .5], [.5, .1, .3, .1]],
                      np.float32)
    feed = {"x": LoDTensor(np.log(scores), [[0, 4, 8]]),
            "y": LoDTensor(np.array([[2], [1], [3]], np.int32), [[0, 2, 3]])}
    d, l_, g = Executor().run(main, feed=feed, fetch_list=[decoded, loss, grad], scope=Scope(),
                              return_numpy=False)
    np.testing.assert_array_equal(np.asarray(d), [[2], [1], [3]])   # Fluid's documented example
    assert d.lod() == [[0, 2, 3]]
    logits = np.log(scores.astype(np.float64))
    want = [brute_nll(logits[:4], [2, 1], 0), brute_nll(logits[4:], [3], 0)]
    np.testing.assert_allclose(np.asarray(l_).reshape(-1), want, rtol=1e-5)
    # norm_by_times: each sequence's gradient rows sum to 0 and scale with 1 / length
    np.testing.assert_allclose(np.asarray(g).sum(1), 0, atol=1e-6)
