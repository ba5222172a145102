"""Fluid 1.8's ``sequence_enumerate``, ``sequence_reshape``, ``sequence_slice`` and
``sequence_scatter`` (``pdjit.ops.sequence_fluid``): outputs and LoDs against NumPy written
here (loops over the sequences), gradients against finite differences, and the layers."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerInputError, PdjitError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor
from pdjit.testing import check_output
from pdjit.testing.grad_check import check_grad

RNG = np.random.default_rng(9)
LOD = [[0, 3, 3, 7]]          # three sequences, the middle one empty


def test_sequence_enumerate():
    ids = np.array([[5], [6], [7], [1], [2], [3], [4]], np.int64)
    want = []
    for s, e in zip(LOD[0], LOD[0][1:]):
        for t in range(s, e):
            want.append([ids[t + k, 0] if t + k < e else -1 for k in range(3)])
    check_output("sequence_enumerate", {"X": (ids, LOD)}, {"win_size": 3, "pad_value": -1},
                 {"Out": (np.array(want, np.int64), LOD)})


def test_sequence_reshape_and_grad():
    x = RNG.normal(size=(7, 2))
    lod = [[0, 2, 2, 7]]       # lengths 2, 0, 5: 4, 0, 10 values
    want = np.concatenate([x[s:e].reshape(-1, 1) for s, e in zip(lod[0], lod[0][1:])])
    check_output("sequence_reshape", {"X": (x, lod)}, {"new_dim": 1},
                 {"Out": (want, [[0, 4, 4, 14]])})
    check_grad("sequence_reshape", {"X": (x, lod)}, {"new_dim": 1})
    x4 = RNG.normal(size=(4, 3))
    check_output("sequence_reshape", {"X": (x4, [[0, 2, 4]])}, {"new_dim": 6},
                 {"Out": (x4.reshape(2, 6), [[0, 1, 2]])})
    with pytest.raises(PdjitError, match=r"sequence 0 holds 3 values: expected a multiple "
                                         r"of new_dim 2"):
        check_output("sequence_reshape", {"X": (x4, [[0, 1, 4]])}, {"new_dim": 2},
                     modes=["reference"])


def test_sequence_slice_and_grad():
    x = RNG.normal(size=(7, 2))
    off = np.array([[1], [0], [2]], np.int64)
    length = np.array([[2], [0], [2]], np.int64)
    rows = [r for i, (s, e) in enumerate(zip(LOD[0], LOD[0][1:]))
            for r in range(s + off[i, 0], s + off[i, 0] + length[i, 0])]
    check_output("sequence_slice", {"X": (x, LOD), "Offset": off, "Length": length},
                 expected={"Out": (x[rows], [[0, 2, 2, 4]])})
    check_grad("sequence_slice", {"X": (x, LOD), "Offset": off, "Length": length})
    with pytest.raises(PdjitError, match=r"sequence 0 \(length 3\): expected 0 <= offset"):
        check_output("sequence_slice", {"X": (x, LOD), "Offset": off, "Length": length + 2},
                     modes=["reference"])


def test_sequence_scatter_and_grad():
    x = RNG.normal(size=(3, 4))
    ids = np.array([[0], [2], [0], [3], [1], [3]], np.int64)
    upd = RNG.normal(size=(6, 1))
    lod = [[0, 3, 4, 6]]
    want = x.copy()
    for i, (s, e) in enumerate(zip(lod[0], lod[0][1:])):
        for j in range(s, e):
            want[i, ids[j, 0]] += upd[j, 0]
    check_output("sequence_scatter", {"X": x, "Ids": (ids, lod), "Updates": (upd, lod)},
                 expected={"Out": want})
    check_grad("sequence_scatter", {"X": x, "Ids": (ids, lod), "Updates": (upd, lod)},
               inputs_to_check=("X", "Updates"))


def test_sequence_lod_layers_in_a_program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        words = fluid.data("words", [-1, 1], "int64", lod_level=1)
        feats = fluid.data("feats", [-1, 2], "float32", lod_level=1)
        grams = fluid.layers.sequence_enumerate(words, win_size=2)
        flat = fluid.layers.sequence_reshape(feats, new_dim=1)
        pooled = fluid.layers.sequence_pool(flat, "sum")
        with pytest.raises(LayerInputError, match=r"sequence_enumerate: argument 'win_size'"):
            fluid.layers.sequence_enumerate(words, win_size=0)
    w = LoDTensor(np.array([[1], [2], [3], [4]], np.int64), [[0, 1, 4]])
    f = LoDTensor(np.arange(8, dtype=np.float32).reshape(4, 2), [[0, 1, 4]])
    g, p = Executor().run(main, feed={"words": w, "feats": f}, fetch_list=[grams, pooled],
                          scope=Scope())
    np.testing.assert_array_equal(g, [[1, 0], [2, 3], [3, 4], [4, 0]])
    np.testing.assert_allclose(p, [[0 + 1], [sum(range(2, 8))]])
