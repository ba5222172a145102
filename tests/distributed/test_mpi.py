"""Data-parallel training on 2 and 3 MPI processes of this machine (MPICH, yielding wait), each
run bounded in time: N ranks, each fed its part of every global batch, reach the parameters one
process reaches on the whole batches (5 Adam steps, with and without clipping by global norm);
a rank that raises or dies ends the job with its error; ranks whose programs differ, or a rank
that stops taking part, stop with a clear error. Skipped, with the reason, without mpi4py or
MPICH's ``mpiexec``."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = pathlib.Path(__file__).parent
SCRIPT = HERE / "_train.py"

def _find_mpiexec():
    """MPICH's mpiexec next to this Python, else on PATH (found without importing
    pdjit.distributed, which registers the collective ops: collection must not)."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


try:
    import mpi4py  # noqa: F401
    MPIEXEC = _find_mpiexec()
    WHY = "" if MPIEXEC else "MPICH's mpiexec is not installed: pip install mpich"
except ImportError as e:
    MPIEXEC, WHY = None, f"no MPI here ({e}): pip install mpi4py mpich"

pytestmark = [pytest.mark.skipif(MPIEXEC is None, reason=WHY or "no MPI"),
              pytest.mark.xdist_group("mpi")]


def _env(**extra):
    from pdjit.distributed.launch import yielding_env

    env = yielding_env(threads=1)
    env.update(extra)
    return env


def _run(n, *args, timeout=90, env=None):
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(SCRIPT), *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=env or _env(), cwd=HERE)
    return p, time.monotonic() - t0


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process on the whole batches, run here (the kernels it compiles are the ranks')."""
    import runpy

    d = tmp_path_factory.mktemp("single")
    out = {}
    argv = sys.argv
    try:
        for clip in (False, True):
            path = d / f"single{'_clip' if clip else ''}.npz"
            sys.argv = [str(SCRIPT), "--mode", "single", "--out", str(path),
                        *(["--clip"] if clip else [])]
            runpy.run_path(str(SCRIPT), run_name="__main__")
            out[clip] = dict(np.load(path))
    finally:
        sys.argv = argv
    # clipping is active at this norm: the two runs end apart
    assert max(np.abs(out[True][k] - out[False][k]).max() for k in out[True]) > 1e-3
    return out


@pytest.mark.parametrize("n, clip, extra", [
    (2, False, []),                          # fused buckets (fleet's default), one bucket
    (3, True, ["--fuse-num", "2"]),          # three ranks, three buckets
], ids=["2ranks-fused", "3ranks-clip-3buckets"])  # (unfused, clipping: test_layout.py)
def test_n_ranks_reach_the_parameters_of_one_process(single, tmp_path, n, clip, extra):
    out = tmp_path / "dist.npz"
    p, _ = _run(n, "--out", str(out), "--save", str(tmp_path / "saved"),
                *(["--clip"] if clip else []), *extra)
    assert p.returncode == 0, p.stderr[-3000:]
    steps = re.findall(r"rank (\d) step (\d)", p.stdout)  # (lines of ranks may interleave)
    assert sorted(steps) == sorted((str(r), str(s)) for r in range(n) for s in range(5))
    got, want = dict(np.load(out)), single[clip]
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    # rank 0 alone saved; what it saved is the trained parameters, and the inference model has
    # no collective op left
    assert "rank 0 saved True True" in p.stdout
    assert all(f"rank {r} saved False False" in p.stdout for r in range(1, n))
    import pdjit as fluid
    from pdjit.io import load_inference_model

    for k in want:
        saved = np.fromfile(tmp_path / "saved" / "persist" / k, np.uint8)
        assert saved.size > got[k].nbytes
    exe = fluid.Executor(strict=True)
    with fluid.scope_guard(fluid.Scope()):
        prog, feeds, fetches = load_inference_model(str(tmp_path / "saved" / "infer"), exe)
        assert feeds == ["x"]
        assert not {op.type for op in prog.global_block().ops} & \
            {"all_reduce", "broadcast", "coalesce_tensor", "c_sync_calc_stream"}
        x = np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)
        (pred,) = exe.run(prog, feed={"x": x}, fetch_list=fetches)
    h = np.tanh(x @ got["fc_0.w_0"] + got["fc_0.b_0"])
    h = np.maximum(h @ got["fc_1.w_0"] + got["fc_1.b_0"], 0)
    np.testing.assert_allclose(pred, h @ got["fc_2.w_0"] + got["fc_2.b_0"], rtol=1e-4,
                               atol=1e-5)


def test_a_rank_that_raises_ends_the_job_with_its_error():
    """Through the launcher: rank 1 raises at step 1; the job ends (rank 0 does not wait for
    the timeout) with rank 1's traceback and a line naming it."""
    cmd = [sys.executable, "-m", "pdjit.distributed.launch", "--nproc_per_node", "2",
           "--threads", "1", "--timeout", "60", str(SCRIPT), "--fail-rank", "1",
           "--fail-step", "1", "--steps", "3"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=_env(), cwd=HERE)
    took = time.monotonic() - t0
    assert p.returncode != 0
    assert "rank 1 fails on purpose at step 1" in p.stderr
    assert "pdjit.distributed: rank 1 of 2 failed (RuntimeError" in p.stderr
    assert "pdjit.distributed.launch: the job ended with status" in p.stderr
    assert took < 45, took


def test_a_rank_that_dies_ends_the_job():
    """Rank 0 exits without a word at step 1: the job ends with its status, well before the
    collectives' timeout. Rank 0's step 0 ended (its all-reduce had rank 1's part); rank 1's
    line of step 0 is not asserted: rank 1 may still be in that step when it is ended."""
    p, took = _run(2, "--fail-rank", "0", "--fail-step", "1", "--die",
                   env=_env(PDJIT_DIST_TIMEOUT="60"))
    assert p.returncode != 0
    assert "rank 0 step 0" in p.stdout and "step 1" not in p.stdout, p.stdout
    assert took < 45, took


def test_ranks_with_different_programs_stop_at_their_first_run():
    """The last rank builds a wider model, and the programs are transpiled directly (no
    fleet.minimize, which compares them too): the startup program's first broadcast compares
    the programs and both ranks stop with the error."""
    p, took = _run(2, "--other-program", "--transpile", env=_env(PDJIT_DIST_TIMEOUT="60"))
    assert p.returncode != 0
    assert "the ranks run different programs" in p.stderr, p.stderr[-2000:]
    assert "every rank must build the same program" in p.stderr
    assert "step 0" not in p.stdout
    assert took < 45, took


def test_a_rank_that_stops_taking_part_times_out_with_a_clear_error():
    """Rank 1 sleeps 30 s: rank 0 waits PDJIT_DIST_TIMEOUT (2 s) in the all-reduce, then fails
    with an error naming the collective and the timeout, which ends the job."""
    p, took = _run(2, "--stall", env=_env(PDJIT_DIST_TIMEOUT="2"))
    assert p.returncode != 0
    assert "all_reduce (sum) of" in p.stderr and "waited" in p.stderr, p.stderr[-2000:]
    assert "timeout 2 s, PDJIT_DIST_TIMEOUT" in p.stderr
    assert took < 25, took
