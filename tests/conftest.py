"""Test configuration: Hypothesis profiles and shared fixtures.

Profiles: ``ci`` (the default: bounded, derandomised, no deadline because first calls compile)
and ``dev`` (many more examples, for deep local runs: ``HYPOTHESIS_PROFILE=dev pytest``).
"""
import os
import pathlib
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=25, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=400, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "paddle"

# Python threads take turns of the GIL of 0.5 ms, not the default 5 ms: a thread that polls
# in a loop kept it for whole turns while the thread a test waits on queued (the CUDA
# simulator's block manager polls a block's threads, each a Python thread). Measured in one
# process, tests/codegen/cuda 75.7 -> 32.8 s; the tests that run threads of their own beside
# the test's (background compiles, readers, helpers; two workers: tests/runtime, tests/io,
# tests/distributed and test_run_threads) 87-94 -> 73-77 s.
sys.setswitchinterval(0.0005)

# The cuda target's tests (tests/codegen/cuda) run on Numba's CUDA simulator where there is no GPU
# (no /dev/nvidiactl); chosen before numba is imported; it changes nothing for the cpu target.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# Compiled kernels of the test session go to one per-user directory (warm on later runs of the
# same machine, cold on a new one), not into the user's own pdjit cache.
os.environ.setdefault("PDJIT_CACHE_DIR", os.path.join(tempfile.gettempdir(),
                                                      f"pdjit-test-cache-{os.getuid()}"))
# No background warmup of the library (a detached process compiling every library kernel for a
# minute beside the tests): the tests that need it start it themselves.
os.environ.setdefault("PDJIT_AUTO_WARMUP", "0")
# Native code that falls back to the references fails the test (a lowering bug would otherwise
# hide behind the right answer); tests of fallbacks ask for Executor(strict=False).
os.environ.setdefault("PDJIT_STRICT", "1")
# A compiled-mode executor runs its compiled plan from the first run (not the references while
# a cold cache's kernels compile): tests/runtime/test_cold_runs.py tests the other setting.
os.environ.setdefault("PDJIT_COLD_RUNS", "compile")
# The Predictor's native drivers (one compiled function per plan step, seconds of compile time
# per model) only where a test asks for them: the suite's other tests run the host drivers.
os.environ.setdefault("PDJIT_NATIVE_DRIVERS", "0")
# Under pytest-xdist every core already runs a test process: no compile workers beside them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("PDJIT_COMPILE_WORKERS", "0")


@pytest.fixture(autouse=True)
def _thread_count_restored():
    """The process's thread setting as it was before each test: a test that asks for a count
    (``set_num_threads``, or ``PDJIT_NUM_THREADS`` read again) leaves the next ones in its
    worker to build plans for the count it left (no parallel variants after a
    ``set_num_threads(1)``), not for every core as a process that never asked does."""
    import sys

    mod = sys.modules.get("pdjit.codegen.cpu.threads")
    before = mod._applied if mod is not None else None
    # (PDJIT_NUM_THREADS as last read and whether it was set: a test that monkeypatches
    # ``_default_threads`` to read the variable again restores the first, not the second)
    env = (mod._default_threads, mod._env_asked) if mod is not None else (None, False)
    yield
    mod = sys.modules.get("pdjit.codegen.cpu.threads")
    if mod is not None and (mod._default_threads, mod._env_asked) != env:
        mod._default_threads, mod._env_asked = env
        mod._default_applied = False  # (the defaults applied again before the next run)
    if mod is None or mod._applied == before:
        return
    if before is not None:
        mod.set_num_threads(before)
        return
    mod._applied = None  # never asked: the defaults again, applied before the next run
    mod._default_applied = False
    mod._run_blas[0] = mod._run_local.loops = mod._run_local.key = None


@pytest.fixture
def fresh_programs():
    """A fresh (main, startup) pair installed as the defaults, with fresh unique names."""
    import pdjit as fluid

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        yield main, startup


@pytest.fixture
def fixtures_dir():
    return FIXTURES


def _blas_splits_exactly() -> bool:
    """Whether NumPy's BLAS gives the rows and the columns of a float32 product bit for bit
    whatever part of it is computed: not every OpenBLAS kernel does (its Haswell kernel sums
    a row's terms in another order for another shape), so results that one thread computes
    by a whole product and two by its parts may differ in the last bits there."""
    import numpy as np

    rng = np.random.default_rng(0)
    for m, k, n in ((64, 32, 64), (70, 35, 49), (16, 288, 100)):
        w, x = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
        whole = w @ x
        if not (np.array_equal(w[m // 2:] @ x, whole[m // 2:]) and
                np.array_equal(w @ np.ascontiguousarray(x[:, n // 2:]), whole[:, n // 2:])):
            return False
    return True


@pytest.fixture(scope="session")
def blas_same():
    """``same(got, want)``: bit for bit (NaNs in the same places) where this machine's BLAS
    sums a product's parts as the whole, else within float32 rounding (``rtol``, ``atol``):
    for results that went through BLAS on a different split of the work."""
    import numpy as np

    exact = _blas_splits_exactly()

    def same(got, want, rtol=1e-5, atol=1e-5, msg=""):
        if exact:
            assert np.array_equal(got, want, equal_nan=True), msg
        else:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=str(msg))
    same.exact = exact
    return same


def pytest_configure(config):
    # An op declared with no emit rule runs its NumPy reference in compiled plans by design,
    # and a plan says so once per process (ReferenceStepWarning): which test file sees it
    # first depends on the order xdist gives, so it is not shown. A reference step for any
    # other reason (a lowering that declines what it got) still warns where it happens.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:op '[^']*' runs its NumPy reference in compiled plans. no emit rule"
        ":pdjit.framework.errors.ReferenceStepWarning")


@pytest.fixture
def counted_trials(monkeypatch):
    """Driver and thread trials of the lengths a test counts (``_WARM + _TIMED`` runs of each
    candidate): runs of microseconds are otherwise timed ``threads.SHORT_TRIAL_RUNS`` times
    as often (tested on its own in ``tests/codegen/cpu/test_run_threads.py``), and a driver
    trial's runs in which a kernel was loaded or a host replay recorded, or (short ones) in
    which a host replay was still warming up, are otherwise run again
    (``tiers.UNSETTLED_REDOS``, ``threads.WARMING_REDOS``, tested in
    ``tests/runtime/test_split_trials.py`` and ``tests/codegen/cpu/test_run_threads.py``); one size
    of call for the host driver's slices (each size is a candidate of the trial: tested in
    ``tests/runtime/test_batch_split_drivers.py``)."""
    from pdjit.codegen.cpu import threads, tiers

    monkeypatch.setattr(threads, "SHORT_TRIAL_RUNS", 1)
    monkeypatch.setattr(tiers, "UNSETTLED_REDOS", 0)
    monkeypatch.setattr(threads, "WARMING_REDOS", 0)
    monkeypatch.setattr(tiers, "HOST_CHUNK_ROWS", tiers.HOST_CHUNK_ROWS[:1])


@pytest.fixture
def background_compiles(monkeypatch):
    """The compiles of the test run as work beside the runs (``threads.background``): the
    list of what ``threads.BACKGROUND`` was within each."""
    import contextlib

    from pdjit.codegen.cpu import threads

    seen, real = [], threads.background

    @contextlib.contextmanager
    def recorded():
        with real():
            seen.append(threads.BACKGROUND[0])
            yield

    monkeypatch.setattr(threads, "background", recorded)
    return seen


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (--dist loadgroup) a module's tests run on one worker: they share
    # what they compile (library kernels for their types, test-local compiled callers) and
    # their module-scoped fixtures, which two workers would each compile and build at once.
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    result = yield
    # pytest-xdist groups a worker's tests by an "@group" suffix its own hook writes into each
    # node id; from pytest 9.2 (node ids kept as structured ``_id``) that write has no effect
    # and every test is scheduled on its own: the suffix written here where it is missing.
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if "@" not in item.nodeid:
                _suffix_group(item)
    return result


def _suffix_group(item):
    """``item``'s node id with ``@group`` appended, as pytest-xdist's loadgroup reads it."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    nodeid = f"{item.nodeid}@{'_'.join(names)}"
    try:
        item._id = type(item._id).parse(nodeid)  # (pytest >= 9.2)
    except AttributeError:
        item._nodeid = nodeid
