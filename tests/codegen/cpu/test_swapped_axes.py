"""Transposes that swap two groups of axes (NCHW <-> NHWC images, a matrix's ``.T``, a
channel shuffle): the kernel that moves blocks of one vector register's lanes square through
registers, or copies the runs of the axes after the groups (``indexing._swapped_parts``),
against NumPy's transpose, over sizes that are not multiples of the block, several batches,
every split of the output's rows; ``_nn.permute_into``'s choice
between that loop and NumPy's copy; a channels-last model's boundary transposes recorded by a
host replay as the parallel loop (native code), the model's values against NumPy."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu.lib import indexing, team

RNG = np.random.default_rng(61)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,perm", [
    ((1, 144, 28, 28), (0, 2, 3, 1)),  # NCHW -> NHWC, whole blocks but the plane's last
    ((3, 37, 5, 7), (0, 2, 3, 1)),     # three samples, 37 channels: blocks and edges
    ((2, 7, 7, 40), (0, 3, 1, 2)),     # NHWC -> NCHW
    ((33, 17), (1, 0)),                # a matrix
    ((4, 16, 32), (0, 2, 1)),          # whole blocks only
    ((1, 5, 3, 2), (0, 2, 3, 1)),      # smaller than one block
    ((2, 2, 29, 5, 3), (0, 2, 1, 3, 4)),  # a channel shuffle: runs of 15 values
    ((3, 7, 4, 16), (0, 2, 1, 3)),     # attention's heads
])
def test_swapped_parts_against_numpy(dtype, shape, perm):
    x = RNG.standard_normal(shape).astype(dtype)
    want = np.ascontiguousarray(np.transpose(x, perm))
    nb, r, s, e = indexing._swapped_groups(shape, perm)
    assert nb * r * s * e == x.size
    for parts in (1, 2, 3):
        got = np.full(want.shape, np.nan, dtype)
        indexing._swapped_parts(x.reshape(x.size), got.reshape(got.size), nb, r, s, e, parts)
        np.testing.assert_array_equal(got, want, err_msg=f"{shape} {perm} in {parts}")


def test_swapped_groups_of_axes():
    assert indexing._swapped_groups((2, 3, 4, 5), (0, 2, 3, 1)) == (2, 3, 20, 1)
    assert indexing._swapped_groups((2, 3, 4, 5), (0, 3, 1, 2)) == (2, 12, 5, 1)
    assert indexing._swapped_groups((2, 3, 4, 5), (2, 3, 0, 1)) == (1, 6, 20, 1)
    assert indexing._swapped_groups((2, 3, 4, 5), (0, 1, 3, 2)) == (6, 4, 5, 1)
    assert indexing._swapped_groups((2, 3, 4, 5), (0, 2, 1, 3)) == (2, 3, 4, 5)
    assert indexing._swapped_groups((2, 3, 4, 5), (1, 2, 0, 3)) == (1, 2, 12, 5)
    for perm in ((0, 1, 2, 3), (3, 2, 1, 0), (2, 0, 3, 1), (1, 0, 3, 2)):
        assert indexing._swapped_groups((2, 3, 4, 5), perm) is None, perm


def test_permute_into_on_the_team_or_numpy(monkeypatch, team_loops):
    """A float swap of enough values runs the parallel loop once it is ready (by ranges of
    the output's rows over the loop threads), a smaller one only while the team polls; an
    integer array, a permutation of another kind, a small one or a loop not ready yet take
    NumPy's copy: each against NumPy."""
    ran = team_loops
    monkeypatch.setattr(indexing, "loop_threads", lambda: 2)
    x = RNG.standard_normal((1, 192, 14, 14)).astype(np.float32)   # (over SWAP_MIN)
    out = np.full((1, 14, 14, 192), np.nan, np.float32)
    indexing.permute_into(x, (0, 2, 3, 1), out)
    assert ran == [(indexing._swapped_parts, 2, True)]
    np.testing.assert_array_equal(out, x.transpose(0, 2, 3, 1))
    small = x[:, :2, :4, :4].copy()
    for xs, perm in ((x.astype(np.int32), (0, 2, 3, 1)), (x, (2, 1, 3, 0)),
                     (small, (0, 2, 3, 1))):
        ran.clear()
        got = np.empty(np.transpose(xs, perm).shape, xs.dtype)
        indexing.permute_into(xs, perm, got)
        assert ran == [], (xs.shape, xs.dtype, perm)
        np.testing.assert_array_equal(got, np.transpose(xs, perm))
    # between SWAP_POLLING and SWAP_MIN values: the loop only while the team still polls
    # (a loop ran moments ago), else NumPy's copy (its sleeping thread's wake-up not repaid)
    mid = x[:, :96].copy()
    assert indexing.SWAP_POLLING <= mid.size < indexing.SWAP_MIN
    for ended, loop in ((float("inf"), True), (-1.0, False)):  # (just now; long ago)
        ran.clear()
        monkeypatch.setattr(team, "_ended", [ended])
        assert team.polling() is loop
        got = np.full((1, 14, 14, 96), np.nan, np.float32)
        indexing.permute_into(mid, (0, 2, 3, 1), got)
        assert bool(ran) is loop, ran
        np.testing.assert_array_equal(got, mid.transpose(0, 2, 3, 1))
    monkeypatch.setattr(indexing.team, "run", lambda loop, call: False)  # not ready
    got = np.full(out.shape, np.nan, np.float32)
    indexing.permute_into(x, (0, 2, 3, 1), got)
    np.testing.assert_array_equal(got, out)


def test_transposes_replayed_as_the_loop(monkeypatch, team_loops):
    """A transpose into NHWC, one back (an image, a relu and a scale between) and a channel
    shuffle: a host replay records each as the parallel loop (its native chain calls it), not
    as a call from Python; NumPy's values, at every run."""
    monkeypatch.setattr(indexing, "SWAP_MIN", 1)
    monkeypatch.setattr(indexing, "SWAP_POLLING", 1)
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = L.data("img", [24, 9, 7])
        last = L.transpose(L.relu(img), [0, 2, 3, 1])
        first = L.transpose(L.scale(last, 2.0), [0, 3, 1, 2])
        shuffled = L.reshape(L.transpose(L.reshape(first, [-1, 2, 12, 9, 7]),
                                         [0, 2, 1, 3, 4]), [-1, 24, 9, 7])
    main = main.clone(for_test=True)
    exe, scope = fluid.Executor(native_drivers="auto"), fluid.Scope()
    exe.run(startup, scope=scope)
    replays = []
    for _ in range(40):
        x = RNG.standard_normal((1, 24, 9, 7)).astype(np.float32)
        got_last, got_first, got_shuffled = exe.run(
            main, feed={"img": x}, fetch_list=[last, first, shuffled], scope=scope)
        np.testing.assert_array_equal(got_last, np.maximum(x, 0).transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(got_first, 2 * np.maximum(x, 0))
        np.testing.assert_array_equal(got_shuffled, 2 * np.maximum(x, 0).reshape(
            1, 2, 12, 9, 7).transpose(0, 2, 1, 3, 4).reshape(1, 24, 9, 7))
        replays = [s.tiers.replay for _, plan in exe._plans.values() for s in plan.walk()
                   if getattr(s, "tiers", None) is not None and s.tiers.replay is not None]
        if any(r.replays for r in replays):
            break
    (rp,) = replays
    assert rp.replays, rp.why
    (rec,) = rp.recordings.values()
    loops = [k for k, (fn, *_) in enumerate(rec.ops) if fn is indexing._swapped_parts]
    assert len(loops) == 3 and set(loops) <= rec.teams, rec.ops
    assert not any(fn is indexing._copy_permuted for fn, *_ in rec.ops)
