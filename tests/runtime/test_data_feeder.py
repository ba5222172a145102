"""fluid.DataFeeder: minibatches of samples -> feed dicts, against arrays built by hand here.

Fluid 1.x's rules: one field per feed variable in each sample; a field's examples are stacked in
the variable's dtype and reshaped to its shape when the ranks differ (at most one -1 dim);
variables with lod_level > 0 take nested sequences and get their LoD from the lengths.
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import FeedError
from pdjit.runtime.tensor import LoDTensor
from pdjit.testing.op_test import assert_native


@pytest.fixture
def prog():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = fluid.layers.data("img", [1, 2, 2])                     # [-1, 1, 2, 2] float32
        label = fluid.layers.data("label", [1], dtype="int64")        # [-1, 1]
        words = fluid.layers.data("words", [1], dtype="int64", lod_level=1)
        para = fluid.layers.data("para", [2], dtype="float32", lod_level=2)
    return main, (img, label, words, para)


def test_dense_fields_are_stacked_converted_and_reshaped(prog):
    main, (img, label, _, _) = prog
    feeder = fluid.DataFeeder(feed_list=[img, label], place=fluid.CPUPlace(), program=main)
    batch = [([1, 2, 3, 4], [7]), (np.array([5, 6, 7, 8], np.float64), [9]),
             (range(9, 13), np.int32(3).reshape(1))]
    out = feeder.feed(batch)
    assert set(out) == {"img", "label"}
    want_img = np.array([[[[1, 2], [3, 4]]], [[[5, 6], [7, 8]]], [[[9, 10], [11, 12]]]],
                        dtype=np.float32)
    assert out["img"].dtype == np.float32 and out["img"].shape == (3, 1, 2, 2)
    np.testing.assert_array_equal(out["img"], want_img)
    assert out["label"].dtype == np.int64
    np.testing.assert_array_equal(out["label"], np.array([[7], [9], [3]], np.int64))
    # names instead of Variables
    by_name = fluid.DataFeeder(["img", "label"], fluid.CPUPlace(), program=main).feed(batch)
    np.testing.assert_array_equal(by_name["img"], want_img)


def test_lod_fields_give_lod_tensors(prog):
    main, (_, label, words, para) = prog
    feeder = fluid.DataFeeder([words, label, para], fluid.CPUPlace(), program=main)
    batch = [
        ([3, 1, 4], [0], [[[1, 2]], [[3, 4], [5, 6]]]),
        ([1], [1], [[[7, 8], [9, 10], [11, 12]]]),
    ]
    out = feeder.feed(batch)
    w = out["words"]
    assert isinstance(w, LoDTensor) and w.lod() == [[0, 3, 4]]
    assert np.asarray(w).dtype == np.int64
    np.testing.assert_array_equal(np.asarray(w), np.array([[3], [1], [4], [1]]))
    p = out["para"]
    # level 0: samples -> sentences (2, 1); level 1: sentences -> rows (1, 2, 3)
    assert p.lod() == [[0, 2, 3], [0, 1, 3, 6]]
    np.testing.assert_array_equal(np.asarray(p), np.arange(1, 13, dtype=np.float32).reshape(6, 2))
    assert type(out["label"]) is np.ndarray


def test_feeder_output_runs_natively(prog):
    main, (img, label, words, _) = prog
    with fluid.program_guard(main):
        pooled = fluid.layers.sequence_pool(fluid.layers.cast(words, "float32"), "sum")
        s = fluid.layers.reduce_sum(img)
    feeder = fluid.DataFeeder([img, words], fluid.CPUPlace(), program=main)
    batch = [([1, 2, 3, 4], [5, 6]), ([0.5, 0, 0, 0], [7])]
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    pv, sv = exe.run(main, feed=feeder.feed(batch), fetch_list=[pooled, s])
    np.testing.assert_allclose(np.asarray(pv).ravel(), [11.0, 7.0])
    np.testing.assert_allclose(sv, 10.5)
    assert_native(exe)


def test_errors_name_the_variable_and_sample(prog):
    main, (img, label, words, _) = prog
    feeder = fluid.DataFeeder([img, label], fluid.CPUPlace(), program=main)
    with pytest.raises(FeedError, match=r"'img': sample 2 has shape \[3\] but sample 0 has \[4\]"):
        feeder.feed([([1, 2, 3, 4], [0]), ([1, 2, 3, 4], [0]), ([1, 2, 3], [0])])
    with pytest.raises(FeedError, match=r"'label': sample 1 cannot be converted to int64"):
        feeder.feed([([1, 2, 3, 4], [0]), ([1, 2, 3, 4], ["cat"])])
    with pytest.raises(FeedError, match=r"sample 1 has 1 field\(s\), expected 2"):
        feeder.feed([([1, 2, 3, 4], [0]), ([1, 2, 3, 4],)])
    with pytest.raises(FeedError, match=r"'img' is declared with shape \[-1, 1, 2, 2\].*\[2, 3\]"):
        feeder.feed([([1, 2, 3], [0]), ([1, 2, 3], [0])])
    with pytest.raises(FeedError, match=r"'label' is declared with shape \[-1, 1\].*\[1, 2\]"):
        feeder.feed([([1, 2, 3, 4], [0, 1])])
    with pytest.raises(FeedError, match="is empty"):
        feeder.feed([])
    seq = fluid.DataFeeder([words], fluid.CPUPlace(), program=main)
    with pytest.raises(FeedError, match=r"'words' has lod_level=1: sample 0 .*got int 5"):
        seq.feed([(5,)])
    with pytest.raises(FeedError, match="'nope', which is not a variable"):
        fluid.DataFeeder(["nope"], fluid.CPUPlace(), program=main)
    with pytest.raises(TypeError, match=r"feed_list\[0\] must be a Variable or a name"):
        fluid.DataFeeder([3], fluid.CPUPlace(), program=main)


def test_decorate_reader(prog, monkeypatch):
    main, (img, label, _, _) = prog
    feeder = fluid.DataFeeder([img, label], fluid.CPUPlace(), program=main)

    def batches():
        for k in range(3):
            yield [([k] * 4, [k]), ([k + 1] * 4, [k])]
    feeds = list(feeder.decorate_reader(batches, multi_devices=False)())
    assert len(feeds) == 3
    np.testing.assert_array_equal(feeds[2]["label"], [[2], [2]])
    groups = list(feeder.decorate_reader(batches, multi_devices=True, num_places=2)())
    assert len(groups) == 1 and len(groups[0]) == 2  # the third batch has no partner
    np.testing.assert_array_equal(groups[0][1]["img"].ravel(), [1] * 4 + [2] * 4)
    # without num_places, one dict per place of CPU_NUM, as Fluid
    monkeypatch.setenv("CPU_NUM", "3")
    groups = list(feeder.decorate_reader(batches, multi_devices=True)())
    assert len(groups) == 1 and len(groups[0]) == 3
    with pytest.raises(FeedError, match="1 minibatch\\(es\\) left over for 2 places"):
        list(feeder.decorate_reader(batches, True, num_places=2, drop_last=False)())


def test_cpu_places(monkeypatch):
    monkeypatch.delenv("CPU_NUM", raising=False)
    assert fluid.cpu_places() == [fluid.CPUPlace()]
    monkeypatch.setenv("CPU_NUM", "3")
    assert fluid.cpu_places() == [fluid.CPUPlace()] * 3
    assert len(fluid.cpu_places(2)) == 2
    with pytest.raises(ValueError, match="device_count must be a positive int"):
        fluid.cpu_places(0)
