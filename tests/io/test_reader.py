"""Feeding programs from Python generators: DataLoader.from_generator (iterable and not),
PyReader, layers.py_reader / read_file, and the reader decorators of fluid.io.

Oracles: the arrays the generators yield (fetched back as fed) and NumPy formulas of what the
program computes on them; compiled runs are strict and their plans asserted native.
"""
import gc
import random
import threading

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import FeedError
from pdjit.io.reader import ComposeNotAligned, ReaderError
from pdjit.runtime import generator_loader as rt_reader
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(3)
BATCHES = [RNG.standard_normal((n, 3)).astype(np.float32) for n in (4, 4, 2)]


READER_THREADS = ("pdjit-reader-", "pdjit-buffered", "pdjit-xmap-", "pdjit-multi-")


def reader_threads():
    """The readers' producer threads (not the split helpers, ``pdjit-split``, which
    lives as long as the process)."""
    return [t for t in threading.enumerate() if t.name.startswith(READER_THREADS)]


@pytest.fixture(autouse=True)
def no_dangling_threads():
    yield
    for t in reader_threads():  # producers are stopped when a pass ends or is left
        t.join(5)
    assert not reader_threads(), f"reader threads left running: {reader_threads()}"


@pytest.fixture(scope="module")
def exe():
    return fluid.Executor(fluid.CPUPlace(), strict=True)


def dense_program(lod=False):
    """x: [-1, 3] float32 -> s = reduce_sum(x * 2) (and, with ``lod``, a LoD input w pooled
    by sum per sequence)."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [None, 3], "float32")
        s = fluid.layers.reduce_sum(fluid.layers.scale(x, scale=2.0))
        outs = [x, s]
        if lod:
            w = fluid.data("w", [None, 1], "float32", lod_level=1)
            outs += [w, fluid.layers.sequence_pool(w, "sum")]
    return main, outs


def batch_gen():
    def gen():
        for b in BATCHES:
            yield [b]
    return gen


# -- iterable mode -------------------------------------------------------------------------------
def test_iterable_batches_dicts_and_lists(exe):
    main, (x, s) = dense_program()
    loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=2)
    assert loader.iterable
    loader.set_batch_generator(batch_gen())
    got = []
    for feed in loader():
        assert isinstance(feed, dict) and list(feed) == ["x"]
        got.append(exe.run(main, feed=feed, fetch_list=[x, s]))
    assert len(got) == len(BATCHES)
    for (xv, sv), b in zip(got, BATCHES):
        np.testing.assert_array_equal(xv, b)
        np.testing.assert_allclose(sv, (b.astype(np.float64) * 2).sum(), rtol=1e-5)
    assert_native(exe)
    # return_list: lists in feed_list order; a second pass calls the generator again
    listed = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=1, return_list=True)
    listed.set_batch_generator(batch_gen(), places=fluid.CPUPlace())
    for _ in range(2):
        items = list(listed())
        assert [type(i) for i in items] == [list] * 3
        for item, b in zip(items, BATCHES):
            np.testing.assert_array_equal(item[0], b)


def test_places_list_gives_one_feed_per_place():
    main, (x, _) = dense_program()
    loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=4)
    loader.set_batch_generator(batch_gen(), places=[fluid.CPUPlace(), fluid.CPUPlace()])
    groups = list(loader())  # drop_last: the third batch has no partner and is dropped
    assert len(groups) == 1 and len(groups[0]) == 2
    for feed, b in zip(groups[0], BATCHES):
        np.testing.assert_array_equal(feed["x"], b)
    keep = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=4, drop_last=False)
    keep.set_batch_generator(batch_gen(), places=[fluid.CPUPlace(), fluid.CPUPlace()])
    assert [len(g) for g in keep()] == [2, 1]


def test_sample_generator_batches_and_drop_last():
    main, (x, _) = dense_program()
    samples = [np.arange(3, dtype=np.float32) + 10 * i for i in range(7)]

    def sample_gen():
        for smp in samples:
            yield (smp,)
    for drop_last, sizes in ((True, [3, 3]), (False, [3, 3, 1])):
        loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=2)
        loader.set_sample_generator(sample_gen, batch_size=3, drop_last=drop_last)
        feeds = [f["x"] for f in loader()]
        assert [len(f) for f in feeds] == sizes
        np.testing.assert_array_equal(np.concatenate(feeds), np.stack(samples[:sum(sizes)]))
        assert all(f.dtype == np.float32 for f in feeds)


def test_dense_and_lod_from_sample_lists(exe):
    main, (x, s, w, pooled) = dense_program(lod=True)
    # two batches of (x row, w sequence) samples; sequence lengths 2,1,3 then 1,1
    seqs = [[[[1.0], [2.0]], [[3.0]], [[4.0], [5.0], [6.0]]], [[[7.0]], [[-1.0]]]]
    rows = [RNG.standard_normal((len(b), 3)).astype(np.float32) for b in seqs]

    def sample_lists():
        for r, b in zip(rows, seqs):
            yield [(row, seq) for row, seq in zip(r, b)]
    loader = fluid.io.DataLoader.from_generator(feed_list=[x, w], capacity=2)
    loader.set_sample_list_generator(sample_lists)
    n = 0
    for feed, r, b in zip(loader(), rows, seqs):
        assert feed["w"].lod() == [list(np.cumsum([0] + [len(q) for q in b]))]
        xv, sv, pv = exe.run(main, feed=feed, fetch_list=[x, s, pooled])
        np.testing.assert_array_equal(xv, r)
        np.testing.assert_allclose(sv, (r.astype(np.float64) * 2).sum(), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(pv).ravel(), [np.sum(q) for q in b], rtol=1e-6)
        n += 1
    assert n == 2
    assert_native(exe)


# -- non-iterable mode ---------------------------------------------------------------------------
def run_epoch(exe, main, fetch):
    out = []
    with pytest.raises(fluid.core.EOFException, match="reset"):
        while True:
            out.append(exe.run(main, fetch_list=fetch)[0])
    return out


def test_non_iterable_eof_reset_start_repeats_the_epoch(exe):
    main, (x, s) = dense_program()
    loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=2, iterable=False)
    loader.set_batch_generator(batch_gen())
    with pytest.raises(ReaderError, match="not started.*start()"):
        exe.run(main, fetch_list=[s])
    loader.start()
    with pytest.raises(ReaderError, match="already started"):
        loader.start()
    first = run_epoch(exe, main, [x])
    with pytest.raises(fluid.core.EOFException):  # exhausted until reset
        exe.run(main, fetch_list=[x])
    loader.reset()
    loader.start()
    second = run_epoch(exe, main, [x])
    loader.reset()
    assert len(first) == len(second) == len(BATCHES)
    for a, b, want in zip(first, second, BATCHES):
        np.testing.assert_array_equal(a, want)
        np.testing.assert_array_equal(b, want)
    # feeding the variables explicitly needs no started reader
    np.testing.assert_array_equal(exe.run(main, feed={"x": BATCHES[2]}, fetch_list=[x])[0],
                                  BATCHES[2])
    with pytest.raises(ReaderError, match="not iterable"):
        iter(loader)


def test_reset_mid_epoch_stops_the_producer(exe):
    main, (x, s) = dense_program()
    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield [np.full((2, 3), i, np.float32)]
                i += 1
        finally:
            closed.set()
    loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=2, iterable=False)
    loader.set_batch_generator(endless)
    loader.start()
    for i in range(3):
        np.testing.assert_array_equal(exe.run(main, fetch_list=[x])[0], np.full((2, 3), i))
    loader.reset()
    assert closed.is_set() and not reader_threads()
    loader.start()  # a new pass starts from the beginning
    np.testing.assert_array_equal(exe.run(main, fetch_list=[x])[0], np.zeros((2, 3)))
    loader.reset()
    # leaving an iterable pass early and starting another stops the first producer
    closed.clear()
    it_loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=2)
    it_loader.set_batch_generator(endless)
    for i, _feed in enumerate(it_loader()):
        if i == 1:
            break
    first = [f["x"][0, 0] for _, f in zip(range(2), it_loader())]
    assert closed.is_set() and first == [0, 1]
    # a loader left in mid-pass and dropped stops its producer (checked by the fixture)
    del it_loader
    gc.collect()


def test_prefetch_produces_the_next_batch_while_the_run_holds_this_one(exe):
    """The generator runs ahead in the background: batch k+1 gets produced while the consumer
    still holds batch k, before its run. Produced on demand, it never would be, and the wait
    (a deadlock guard, not a timing threshold) would fail."""
    main, (x, s) = dense_program()
    made = [threading.Event() for _ in range(4)]
    log = []

    def gen():
        for k in range(4):
            log.append(("produce", k))
            made[k].set()
            yield [np.full((2, 3), k, np.float32)]
    loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=2)
    loader.set_batch_generator(gen)
    for k, feed in enumerate(loader()):
        if k + 1 < 4:
            assert made[k + 1].wait(10), f"batch {k + 1} was not prefetched during batch {k}"
        log.append(("run", k))
        np.testing.assert_array_equal(exe.run(main, feed=feed, fetch_list=[x])[0],
                                      np.full((2, 3), k))
    for k in range(3):
        assert log.index(("produce", k + 1)) < log.index(("run", k))


# -- errors --------------------------------------------------------------------------------------
def test_generator_exception_reaches_the_user():
    main, (x, _) = dense_program()

    def broken():
        yield [BATCHES[0]]
        raise KeyError("label file missing")
    loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=2)
    loader.set_batch_generator(broken)
    it = iter(loader)
    np.testing.assert_array_equal(next(it)["x"], BATCHES[0])
    with pytest.raises(ReaderError, match=r"'x'.*KeyError.*label file missing.*batch 1") as e:
        next(it)
    assert isinstance(e.value.__cause__, KeyError)


def test_bad_batches_name_the_variable_and_batch():
    main, (x, _) = dense_program()
    cases = [
        ([np.zeros((2, 3), np.float64)],
         r"DataLoader feeding 'x', batch 0:.*'x'.*float32.*float64"),
        ([np.zeros((2, 4), np.float32)], r"batch 0:.*'x'.*shape \[-1, 3\].*\[2, 4\]"),
        ([BATCHES[0], BATCHES[0]], r"batch 0: the batch has 2 value\(s\), expected 1"),
    ]
    for batch, message in cases:
        loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=1)
        loader.set_batch_generator(lambda b=batch: iter([b]))
        with pytest.raises(FeedError, match=message):
            next(iter(loader))
    loader = fluid.io.DataLoader.from_generator(feed_list=[x], capacity=1)
    with pytest.raises(TypeError, match="generator function itself"):
        loader.set_batch_generator(batch_gen()())
    with pytest.raises(ReaderError, match="no generator is set"):
        iter(loader)
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        fluid.io.DataLoader.from_generator(feed_list=[x], capacity=0)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        loader.set_sample_generator(lambda: iter([]), batch_size=0)


def test_pending_feed_is_the_feed_itself_without_readers():
    main, _ = dense_program()
    feed = {"x": BATCHES[0]}
    assert rt_reader.pending_feed(main, feed) is feed


# -- py_reader, PyReader -------------------------------------------------------------------------
def test_py_reader_read_file_and_decorators(exe):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        r = fluid.layers.py_reader(capacity=4, shapes=[(-1, 3), (-1, 1)],
                                   dtypes=["float32", "int64"], name="train_reader")
        assert fluid.layers.double_buffer(r) is r
        img, label = fluid.layers.read_file(r)
        s = fluid.layers.reduce_sum(fluid.layers.scale(img, scale=2.0))
    assert (img.shape, label.shape, label.dtype) == ((-1, 3), (-1, 1), np.dtype(np.int64))
    labels = [np.arange(len(b), dtype=np.int64).reshape(-1, 1) for b in BATCHES]

    def sample_lists():
        for b, lab in zip(BATCHES, labels):
            yield [(row, lv) for row, lv in zip(b, lab)]
    r.decorate_sample_list_generator(sample_lists)
    for _ in range(2):
        r.start()
        got = run_epoch(exe, main, [s])
        r.reset()
        np.testing.assert_allclose(np.ravel(got),  # each sum Fluid 1.x's [1]
                                   [(b.astype(np.float64) * 2).sum() for b in BATCHES], rtol=1e-5)
    r.decorate_batch_generator(lambda: zip(BATCHES, labels))
    r.start()
    np.testing.assert_array_equal(exe.run(main, fetch_list=[label])[0], labels[0])
    # a clone reads from the same reader, as a Fluid clone reads the same reader variable
    test_prog = main.clone(for_test=True)
    np.testing.assert_array_equal(exe.run(test_prog, fetch_list=[label])[0], labels[1])
    r.reset()
    assert_native(exe)
    # create_py_reader_by_data feeds the given variables
    main2, (x, _) = dense_program()
    with fluid.program_guard(main2):
        r2 = fluid.layers.create_py_reader_by_data(capacity=2, feed_list=[x])
    assert fluid.layers.read_file(r2) is x
    r2.decorate_sample_generator(lambda: iter([(row,) for row in BATCHES[0]]), batch_size=2)
    r2.start()
    got = run_epoch(exe, main2, [x])
    r2.reset()
    np.testing.assert_array_equal(np.concatenate(got), BATCHES[0])


def test_pyreader_iterable():
    main, (x, _) = dense_program()
    r = fluid.io.PyReader(feed_list=[x], capacity=2, return_list=True)
    r.decorate_batch_generator(batch_gen())
    got = [item[0] for item in r()]
    for a, b in zip(got, BATCHES):
        np.testing.assert_array_equal(a, b)


# -- reader decorators ---------------------------------------------------------------------------
def numbers(n):
    return lambda: iter(range(n))


def test_batch_and_shuffle():
    assert list(fluid.io.batch(numbers(7), 3)()) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(fluid.io.batch(numbers(7), 3, drop_last=True)()) == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="batch_size"):
        fluid.io.batch(numbers(3), -1)
    random.seed(5)
    out = list(fluid.io.shuffle(numbers(10), 4)())
    # shuffled within windows of 4: [0..3], [4..7], [8, 9]
    assert sorted(out[:4]) == [0, 1, 2, 3] and sorted(out[4:8]) == [4, 5, 6, 7]
    assert sorted(out[8:]) == [8, 9] and out != list(range(10))


def test_buffered_and_xmap_readers():
    assert list(fluid.io.buffered(numbers(50), 4)()) == list(range(50))
    ordered = fluid.io.xmap_readers(lambda v: v * v, numbers(40), 3, 4, order=True)
    assert list(ordered()) == [v * v for v in range(40)]
    unordered = fluid.io.xmap_readers(lambda v: v * v, numbers(40), 3, 4)
    assert sorted(unordered()) == [v * v for v in range(40)]

    def broken():
        yield 1
        raise OSError("disk gone")
    with pytest.raises(ReaderError, match="OSError: disk gone"):
        list(fluid.io.buffered(broken, 2)())
    with pytest.raises(ReaderError, match="ZeroDivisionError"):
        list(fluid.io.xmap_readers(lambda v: 1 // (v - 3), numbers(10), 2, 2)())


def test_multiprocess_reader_merges_every_reader():
    merged = fluid.io.multiprocess_reader([numbers(30), lambda: iter(range(100, 120))],
                                          use_pipe=False, queue_size=4)
    for _ in range(2):  # a reader creator: each call reads everything again
        out = list(merged())
        assert sorted(out) == list(range(30)) + list(range(100, 120))
        assert [v for v in out if v < 100] == list(range(30))   # each reader keeps its order

    def broken():
        yield 1
        raise OSError("disk gone")
    with pytest.raises(ReaderError, match="multiprocess_reader.*OSError: disk gone"):
        list(fluid.io.multiprocess_reader([numbers(5), broken])())
    with pytest.raises(ValueError, match="readers is empty"):
        fluid.io.multiprocess_reader([])


def test_small_decorators():
    assert list(fluid.io.chain(numbers(2), numbers(3))()) == [0, 1, 0, 1, 2]
    assert list(fluid.io.map_readers(lambda a, b: a + b, numbers(3), numbers(5))()) == [0, 2, 4]
    assert list(fluid.io.compose(numbers(2), lambda: iter([(5, 6), (7, 8)]))()) == \
        [(0, 5, 6), (1, 7, 8)]
    with pytest.raises(ComposeNotAligned):
        list(fluid.io.compose(numbers(2), numbers(3))())
    assert list(fluid.io.compose(numbers(2), numbers(3), check_alignment=False)()) == \
        [(0, 0), (1, 1)]
    assert list(fluid.io.firstn(numbers(10), 3)()) == [0, 1, 2]
    calls = []

    def once():
        calls.append(1)
        yield from range(3)
    cached = fluid.io.cache(once)
    assert list(cached()) == list(cached()) == [0, 1, 2] and len(calls) == 1


# -- training from a non-iterable loader ---------------------------------------------------------
def test_training_from_a_started_loader_matches_numpy_sgd():
    """Two passes of SGD on a linear model, fed by a non-iterable DataLoader (start, run until
    EOFException, reset): losses and weights against the same updates written in NumPy."""
    xs = [RNG.standard_normal((4, 2)).astype(np.float32) for _ in range(3)]
    ys = [(x @ np.array([[1.5], [-2.0]], np.float32) + 0.25).astype(np.float32) for x in xs]
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [None, 2], "float32")
        y = fluid.data("y", [None, 1], "float32")
        const = fluid.initializer.Constant(0.5)
        pred = fluid.layers.fc(x, 1, param_attr=fluid.ParamAttr(name="w", initializer=const),
                               bias_attr=fluid.ParamAttr(name="b", initializer=const))
        loss = fluid.layers.mean(fluid.layers.square_error_cost(pred, y))
        fluid.optimizer.SGD(learning_rate=0.1).minimize(loss)
        loader = fluid.io.DataLoader.from_generator(feed_list=[x, y], capacity=2,
                                                    iterable=False)
    loader.set_batch_generator(lambda: zip(xs, ys))
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    losses = []
    for _ in range(2):
        loader.start()
        with pytest.raises(fluid.core.EOFException):
            while True:
                losses.append(float(exe.run(main, fetch_list=[loss], scope=scope)[0][0]))
        loader.reset()
    assert_native(exe)
    w, b = np.full((2, 1), 0.5), 0.5
    want = []
    for _ in range(2):
        for xb, yb in zip(xs, ys):
            xb, yb = xb.astype(np.float64), yb.astype(np.float64)
            err = xb @ w + b - yb
            want.append(float(np.mean(err ** 2)))
            g = 2 * err / len(xb)
            w, b = w - 0.1 * xb.T @ g, b - 0.1 * g.sum()
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(scope.find_var("w").get_tensor()), w, rtol=1e-5)
