"""LoD tensors from the user's side: the LoDTensor API, create_lod_tensor, feeding and fetching
with LoD (both executors), saving and loading with LoD (Paddle's bytes), and the errors."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import FeedError
from pdjit.io.tensor_stream import _Reader, read_tensor, write_tensor

MODES = ("reference", "compiled")

# Written by PaddlePaddle 3.3.1 (core.save_dense_tensor_to_memory): float32 arange(15)/4 as
# [5, 3] with LoD [[0, 2, 5]]; int64 [[7], [-1], [3], [2**40]] with LoD [[0, 1, 3], [0, 2, 3, 4]].
PADDLE_LOD1 = bytes.fromhex(
    "000000000100000000000000180000000000000000000000000000000200000000000000050000000000000000"
    "00000006000000080510051003000000000000803e0000003f0000403f0000803f0000a03f0000c03f0000e03f"
    "00000040000010400000204000003040000040400000504000006040")
PADDLE_LOD2 = bytes.fromhex(
    "000000000200000000000000180000000000000000000000000000000100000000000000030000000000000020"
    "000000000000000000000000000000020000000000000003000000000000000400000000000000000000000600"
    "00000803100410010700000000000000ffffffffffffffff03000000000000000000000000010000")


# ---- the LoDTensor API -------------------------------------------------------------------------
def test_lodtensor_api_round_trip():
    t = fluid.LoDTensor()
    data = np.arange(10, dtype=np.float32).reshape(5, 2)
    t.set(data, fluid.CPUPlace())
    data[0, 0] = 99  # set copies
    t.set_recursive_sequence_lengths([[2, 0, 3]])
    assert t.lod() == [[0, 2, 2, 5]]
    assert t.recursive_sequence_lengths() == [[2, 0, 3]]
    assert t.has_valid_recursive_sequence_lengths()
    assert np.array(t)[0, 0] == 0 and np.array(t).shape == (5, 2)
    assert t.shape() == [5, 2]
    t.set_lod([[0, 1, 3], [0, 2, 3, 5]])
    assert t.recursive_sequence_lengths() == [[1, 2], [2, 1, 2]]
    assert t.has_valid_recursive_sequence_lengths()


def test_lod_that_does_not_fit_the_rows_is_not_valid():
    t = fluid.LoDTensor()
    t.set(np.zeros((5, 1), np.float32))
    t.set_recursive_sequence_lengths([[2, 2]])  # Fluid accepts it; the check says it is bad
    assert not t.has_valid_recursive_sequence_lengths()
    t.set_lod([[0, 5]])
    assert t.has_valid_recursive_sequence_lengths()
    u = fluid.LoDTensor()  # LoD first, data later, as Fluid allows
    u.set_lod([[0, 1, 4]])
    u.set(np.ones((4, 2), np.int64))
    assert u.has_valid_recursive_sequence_lengths()


@pytest.mark.parametrize("lod, words", [
    ([[1, 2]], "start at 0"),
    ([[0, 3, 2]], "must not decrease"),
    ([[0, 1, 3], [0, 2, 3]], "level 1 has 2 sequences"),
    ([[]], "start at 0"),
    ([[0, "a"]], "list of ints"),
])
def test_malformed_offsets_are_refused(lod, words):
    t = fluid.LoDTensor()
    with pytest.raises(ValueError, match=words):
        t.set_lod(lod)
    with pytest.raises(ValueError):
        fluid.LoDTensor(np.zeros((3, 1)), lod)


def test_negative_lengths_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        fluid.LoDTensor().set_recursive_sequence_lengths([[2, -1]])


def test_create_lod_tensor_from_array_list_and_lodtensor():
    data = np.random.rand(6, 3).astype(np.float32)
    t = fluid.create_lod_tensor(data, [[4, 2]], fluid.CPUPlace())
    assert t.lod() == [[0, 4, 6]]
    np.testing.assert_array_equal(np.array(t), data)
    # a list of sequences of ints: one level, int64 rows [N, 1] (Fluid's convention)
    s = fluid.create_lod_tensor([[1, 2], [3], [], [4, 5, 6]], [[2, 1, 0, 3]], fluid.CPUPlace())
    assert s.lod() == [[0, 2, 3, 3, 6]]
    assert np.array(s).dtype == np.int64 and np.array(s).shape == (6, 1)
    np.testing.assert_array_equal(np.array(s).ravel(), [1, 2, 3, 4, 5, 6])
    u = fluid.create_lod_tensor(t, [[1, 5]], fluid.CPUPlace())
    assert u.lod() == [[0, 1, 6]] and t.lod() == [[0, 4, 6]]
    two = fluid.create_lod_tensor(data, [[1, 1], [2, 4]], fluid.CPUPlace())
    assert two.lod() == [[0, 1, 2], [0, 2, 6]]
    r = fluid.create_random_int_lodtensor([[2, 3]], [4], fluid.CPUPlace(), low=1, high=3)
    assert np.array(r).shape == (5, 4) and r.lod() == [[0, 2, 5]]
    assert np.array(r).min() >= 1 and np.array(r).max() <= 3


def test_create_lod_tensor_errors():
    with pytest.raises(ValueError, match="do not fit"):
        fluid.create_lod_tensor(np.zeros((5, 1)), [[2, 2]], fluid.CPUPlace())
    with pytest.raises(ValueError, match="differ"):
        fluid.create_lod_tensor([[1, 2], [3]], [[1, 2]], fluid.CPUPlace())
    with pytest.raises(ValueError, match="one LoD level"):
        fluid.create_lod_tensor([[1, 2], [3]], [[1], [2, 1]], fluid.CPUPlace())
    with pytest.raises(TypeError, match="numpy array"):
        fluid.create_lod_tensor("abc", [[3]], fluid.CPUPlace())


# ---- feed and fetch ------------------------------------------------------------------------------
def _scaled_program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data(name="x", shape=[None, 3], dtype="float32", lod_level=1)
        y = fluid.layers.scale(x, scale=2.0, bias=1.0)
        z = fluid.layers.reduce_sum(y)
    return main, x, y, z


@pytest.mark.parametrize("mode", MODES)
def test_feed_and_fetch_keep_the_lod(mode):
    main, x, y, z = _scaled_program()
    data = np.random.rand(5, 3).astype(np.float32)
    t = fluid.create_lod_tensor(data, [[3, 0, 2]], fluid.CPUPlace())
    exe = fluid.Executor(fluid.CPUPlace(), mode=mode)
    for _ in range(2):  # the second run reuses the compiled plan
        got_y, got_z = exe.run(main, feed={"x": t}, fetch_list=[y, z], scope=fluid.Scope(),
                               return_numpy=False)
        assert isinstance(got_y, fluid.LoDTensor) and got_y.lod() == [[0, 3, 3, 5]]
        np.testing.assert_allclose(np.array(got_y), data * 2 + 1, rtol=1e-6)
        # a dense value fetched with return_numpy=False: a LoDTensor with an empty LoD
        assert isinstance(got_z, fluid.LoDTensor) and got_z.lod() == []
        np.testing.assert_allclose(np.array(got_z), (data * 2 + 1).sum(), rtol=1e-5)
    arr_y, = exe.run(main, feed={"x": t}, fetch_list=[y], scope=fluid.Scope())
    assert type(arr_y) is np.ndarray
    # the fetched LoDTensor is a copy: changing it changes nothing the executor holds
    got_y.set_lod([[0, 5]])
    again, = exe.run(main, feed={"x": t}, fetch_list=[y], scope=fluid.Scope(),
                     return_numpy=False)
    assert again.lod() == [[0, 3, 3, 5]] and t.lod() == [[0, 3, 3, 5]]


@pytest.mark.parametrize("mode", MODES)
def test_plain_array_feeds_a_lod_variable(mode):
    main, x, y, z = _scaled_program()
    exe = fluid.Executor(fluid.CPUPlace(), mode=mode)
    got, = exe.run(main, feed={"x": np.ones((2, 3), np.float32)}, fetch_list=[y],
                   scope=fluid.Scope(), return_numpy=False)
    assert got.lod() == []
    np.testing.assert_array_equal(np.array(got), np.full((2, 3), 3, np.float32))


def test_feed_errors_name_the_variable():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        dense = fluid.data(name="dense", shape=[None, 2], dtype="float32")
        seq = fluid.data(name="seq", shape=[None, 2], dtype="float32", lod_level=1)
        out = fluid.layers.elementwise_add(seq, dense)
    exe = fluid.Executor(fluid.CPUPlace())
    ok = np.zeros((3, 2), np.float32)
    one = fluid.create_lod_tensor(ok, [[1, 2]], fluid.CPUPlace())
    two = fluid.create_lod_tensor(ok, [[1, 1], [1, 2]], fluid.CPUPlace())
    # a LoDTensor fed to a lod_level=0 variable gives its data, as in Fluid
    got, = exe.run(main, feed={"dense": one, "seq": one}, fetch_list=[out], return_numpy=False)
    assert got.lod() == [[0, 1, 3]] and not np.any(np.array(got))
    with pytest.raises(FeedError, match=r"'seq' expects a LoD of 1 level.*got 2"):
        exe.run(main, feed={"dense": ok, "seq": two}, fetch_list=[out])
    bad = fluid.LoDTensor()
    bad.set(ok)
    bad.set_lod([[0, 1, 4]])  # ends past the 3 rows
    with pytest.raises(FeedError, match=r"'seq'.*ends at 4, expected the number of rows 3"):
        exe.run(main, feed={"dense": ok, "seq": bad}, fetch_list=[out])
    with pytest.raises(FeedError, match="'seq': the LoDTensor holds no data"):
        exe.run(main, feed={"dense": ok, "seq": fluid.LoDTensor()}, fetch_list=[out])
    got, = exe.run(main, feed={"dense": ok, "seq": one}, fetch_list=[out], return_numpy=False)
    assert got.lod() == [[0, 1, 3]]


# ---- the tensor stream: Paddle's bytes -----------------------------------------------------------
def test_lod_tensor_bytes_match_paddle():
    t1 = fluid.create_lod_tensor(np.arange(15, dtype=np.float32).reshape(5, 3) / 4, [[2, 3]])
    assert write_tensor(t1) == PADDLE_LOD1
    t2 = fluid.LoDTensor(np.array([[7], [-1], [3], [2 ** 40]], np.int64),
                         [[0, 1, 3], [0, 2, 3, 4]])
    assert write_tensor(t2) == PADDLE_LOD2
    for raw, want in ((PADDLE_LOD1, t1), (PADDLE_LOD2, t2)):
        got = read_tensor(_Reader(raw, "paddle bytes"))
        assert isinstance(got, fluid.LoDTensor) and got.lod() == want.lod()
        np.testing.assert_array_equal(np.array(got), np.array(want))
        assert np.array(got).dtype == np.array(want).dtype


def test_bad_lod_in_a_file_is_a_clear_error():
    raw = bytearray(PADDLE_LOD1)
    raw[28:36] = (7).to_bytes(8, "little")  # the middle offset 2 -> 7: decreasing
    with pytest.raises(ValueError, match="must not decrease"):
        read_tensor(_Reader(bytes(raw), "bad file"))
    raw = bytearray(PADDLE_LOD1)
    raw[36:44] = (4).to_bytes(8, "little")  # ends at 4, the data has 5 rows
    with pytest.raises(ValueError, match="rows 5"):
        read_tensor(_Reader(bytes(raw), "bad file"))
    with pytest.raises(ValueError, match="truncated"):
        read_tensor(_Reader(PADDLE_LOD1[:30], "short file"))


def _params_program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data(name="x", shape=[None, 3], dtype="float32", lod_level=1)
        fluid.layers.fc(x, 2)
        seq = main.global_block().create_var(name="seq_state", shape=[-1, 3], dtype="float32",
                                             lod_level=1, persistable=True)
    return main, startup, seq


@pytest.mark.parametrize("filename", [None, "params.pdiparams"])
def test_save_and_load_vars_keep_the_lod(tmp_path, filename):
    main, startup, seq = _params_program()
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=scope)
    value = fluid.create_lod_tensor(np.random.rand(4, 3).astype(np.float32), [[1, 0, 3]])
    scope.var("seq_state").value = value
    fluid.io.save_persistables(exe, str(tmp_path), main, filename=filename, scope=scope)
    if filename:  # one combined file: the tensors of the sorted names, nothing else
        names = sorted(v.name for v in main.list_vars() if fluid.io.is_persistable(v))
        data = (tmp_path / filename).read_bytes()
        assert data == b"".join(write_tensor(scope.find_var(n).value) for n in names)
    fresh = fluid.Scope()
    fluid.io.load_persistables(exe, str(tmp_path), main, filename=filename, scope=fresh)
    got = fresh.find_var("seq_state").value
    assert isinstance(got, fluid.LoDTensor) and got.lod() == [[0, 1, 1, 4]]
    np.testing.assert_array_equal(np.array(got), np.array(value))
    for v in main.list_vars():
        if fluid.io.is_persistable(v) and v.name != "seq_state":
            np.testing.assert_array_equal(fresh.find_var(v.name).value,
                                          scope.find_var(v.name).value)


def test_failed_load_leaves_the_scope_alone(tmp_path):
    main, startup, seq = _params_program()
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=scope)
    scope.var("seq_state").value = fluid.create_lod_tensor(np.ones((2, 3), np.float32), [[2]])
    fluid.io.save_persistables(exe, str(tmp_path), main, filename="p", scope=scope)
    data = (tmp_path / "p").read_bytes()
    (tmp_path / "p").write_bytes(data[:-2])
    target = fluid.Scope()
    target.var("seq_state").value = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="truncated"):
        fluid.io.load_persistables(exe, str(tmp_path), main, filename="p", scope=target)
    np.testing.assert_array_equal(target.find_var("seq_state").value, np.zeros(1, np.float32))
    assert target.find_var("seq_state").value.shape == (1,)
    (tmp_path / "p").write_bytes(data + b"\0")
    with pytest.raises(ValueError, match="bytes left"):
        fluid.io.load_persistables(exe, str(tmp_path), main, filename="p", scope=target)
    with pytest.raises(ValueError, match="no value in the scope"):
        fluid.io.save_persistables(exe, str(tmp_path), main, filename="q", scope=fluid.Scope())
