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

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

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


def np_im2sequence(x, k, s, p):
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    oh = (h + p[0] + p[2] - k[0]) // s[0] + 1
    ow = (w + p[1] + p[3] - k[1]) // s[1] + 1
    rows = []
    for img in range(n):
        for i in range(oh):
            for j in range(ow):
                rows.append(xp[img, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
                            .reshape(-1))
    return np.array(rows), oh * ow


def test_im2sequence_and_grad():
    x = RNG.normal(size=(2, 2, 3, 4))
    attrs = {"kernels": [2, 2], "strides": [1, 2], "paddings": [1, 0, 0, 1]}
    want, per = np_im2sequence(x, [2, 2], [1, 2], [1, 0, 0, 1])
    check_output("im2sequence", {"X": x}, attrs, {"Out": (want, [[0, per, 2 * per]])})
    check_grad("im2sequence", {"X": x}, attrs)


def test_row_conv_and_grad():
    x = RNG.normal(size=(7, 3))
    w = RNG.normal(size=(3, 3))          # future context 2
    want = np.zeros_like(x)
    for s, e in zip(LOD[0], LOD[0][1:]):
        for t in range(s, e):
            for k in range(3):
                if t + k < e:
                    want[t] += x[t + k] * w[k]
    check_output("row_conv", {"X": (x, LOD), "Filter": w}, expected={"Out": (want, LOD)})
    check_grad("row_conv", {"X": (x, LOD), "Filter": w}, inputs_to_check=("X", "Filter"))


def np_position_encoding(length, d):
    half = d // 2
    pe = np.zeros((length, d))
    for pos in range(length):
        for k in range(half):
            v = pos / 10000 ** (k / (half - 1))
            pe[pos, k], pe[pos, half + k] = np.sin(v), np.cos(v)
    return pe


def test_add_position_encoding_dense_lod_and_grad():
    x = RNG.normal(size=(2, 3, 4))
    want = 0.5 * x + 2.0 * np_position_encoding(3, 4)[None]
    attrs = {"alpha": 0.5, "beta": 2.0}
    check_output("add_position_encoding", {"X": x}, attrs, {"Out": want})
    xl = RNG.normal(size=(7, 4))
    pe = np_position_encoding(4, 4)
    want_l = 0.5 * xl + 2.0 * np.concatenate([pe[:3], pe[:4]])
    check_output("add_position_encoding", {"X": (xl, LOD)}, attrs, {"Out": (want_l, LOD)})
    check_grad("add_position_encoding", {"X": (xl, LOD)}, attrs)


def test_row_conv_im2sequence_layers_train():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = fluid.data("img", [-1, 1, 4, 4], "float32")
        seq = fluid.layers.im2sequence(img, filter_size=2, stride=2)       # 4 rows of 4 each
        seq = fluid.layers.row_conv(seq, future_context_size=1)
        seq = fluid.layers.add_position_encoding(seq, alpha=1.0, beta=0.1)
        loss = fluid.layers.mean(fluid.layers.square(fluid.layers.sequence_pool(seq, "sum")))
        fluid.optimizer.SGD(0.05).minimize(loss)
    exe = Executor()
    scope = Scope()
    exe.run(startup, scope=scope)
    feed = {"img": RNG.normal(size=(3, 1, 4, 4)).astype(np.float32)}
    losses = [float(np.asarray(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0])
                    .reshape(-1)[0]) for _ in range(4)]
    assert losses[-1] < losses[0]
