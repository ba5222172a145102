"""The disk cache of compiled code under stress (issue 20): processes that compile the same
kernels at the same moment, a cache directory that is read-only or full, and a damaged entry of
every kind of file the cache holds.

Every case runs a fresh Python process (``SCRIPT``) on its own ``PDJIT_CACHE_DIR`` and
``NUMBA_CACHE_DIR`` (and ``XDG_CACHE_HOME``, so nothing reaches the user's own caches), in
strict mode: a kernel falling back to its NumPy reference fails the run. Its output is checked
against NumPy written here. Faults are injected in the child before pdjit is imported: every
open for writing under the cache root raises ``OSError(EROFS)`` ("read-only") or writes raise
``OSError(ENOSPC)`` ("full"), as a read-only mount or a full disk would.
"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

# one worker runs the module (xdist_group): the cache two processes fill at once is made
# once, not per worker
pytestmark = pytest.mark.xdist_group("cache_stress")

SCRIPT = textwrap.dedent("""
    import builtins, errno, json, os, sys, time, warnings
    root, fault = os.environ["TEST_CACHE_ROOT"], os.environ.get("TEST_FAULT", "")

    def _under(p):
        try:
            return os.path.abspath(os.fsdecode(p)).startswith(root)
        except TypeError:
            return False

    if fault:
        code = errno.EROFS if fault == "readonly" else errno.ENOSPC
        _open, _os_open, _fdopen, _mkdir = builtins.open, os.open, os.fdopen, os.mkdir
        faulty_fds = set()

        class _Full:  # a file on a full disk: every write fails
            def __init__(self, f):
                self._f = f
            def write(self, data):
                raise OSError(code, os.strerror(code))
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                self._f.close()
            def __getattr__(self, name):
                return getattr(self._f, name)

        def _fail(path):
            raise OSError(code, os.strerror(code), os.fsdecode(path))

        def fake_open(file, mode="r", *a, **k):
            writes = any(c in mode for c in "wax+")
            if writes and not isinstance(file, int) and _under(file):
                if fault == "readonly":
                    _fail(file)
                return _Full(_open(file, mode, *a, **k))
            return _open(file, mode, *a, **k)

        def fake_os_open(path, flags, *a, **k):
            writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writes and _under(path) and fault == "readonly":
                _fail(path)
            fd = _os_open(path, flags, *a, **k)
            if writes and _under(path):
                faulty_fds.add(fd)
            return fd

        def fake_fdopen(fd, mode="r", *a, **k):
            f = _fdopen(fd, mode, *a, **k)
            return _Full(f) if fd in faulty_fds and any(c in mode for c in "wa+") else f

        def fake_mkdir(path, *a, **k):
            if fault == "readonly" and _under(path):
                _fail(path)
            return _mkdir(path, *a, **k)

        builtins.open, os.open, os.fdopen, os.mkdir = fake_open, fake_os_open, fake_fdopen, \\
            fake_mkdir

    import numpy as np
    import pdjit as fluid
    from pdjit.codegen import compiler

    go = os.environ.get("TEST_GO")
    if go:  # start compiling at the same moment as the other process
        open(go + "." + str(os.getpid()), "w").close()
        t0 = time.time()
        while not os.path.exists(go) and time.time() - t0 < 60:
            time.sleep(0.005)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[6], dtype="float32")
        h = fluid.layers.scale(x, scale=0.5) * fluid.layers.exp(x)
        y = fluid.layers.reduce_sum(h, dim=1)
        z = fluid.layers.reduce_max(fluid.layers.abs(y) * y, dim=0)
        w = fluid.layers.reduce_mean(fluid.layers.square(x) + z)   # three kernels in all
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", compiler.CacheWarning)
        exe = fluid.Executor(strict=True)
        x_np = np.linspace(-1, 1, 18, dtype=np.float32).reshape(3, 6)
        outs = [exe.run(main, feed={"x": x_np[:n]}, fetch_list=[y, z, w], scope=fluid.Scope())
                for n in (3, 2)]
        # then signatures added to one function's index: the two racing processes add four
        # each (a slow index write widening the read-modify-write window), the third loads all
        sigs = os.environ.get("TEST_SIGS")
        if sigs:
            src = ("def twice(x, out):\\n    for i in range(x.size):\\n"
                   "        out[i] = x[i] * 2\\n    return out\\n")
            c = compiler.compile_function(src, "twice")
            cache_file = c.fn._cache._cache_file
            save_index = cache_file._save_index

            def slow_save_index(overloads):
                time.sleep(0.05)
                save_index(overloads)

            cache_file._save_index = slow_save_index
            dtypes = ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16"]
            for d in {"first": dtypes[:4], "second": dtypes[4:], "all": dtypes}[sigs]:
                v = np.arange(7, dtype=d)
                assert (c.fn(v, np.empty_like(v)) == v * 2).all()
            sigs = {"compiled": sum(c.fn.stats.cache_misses.values()),
                    "loaded": sum(c.fn.stats.cache_hits.values())}
    print(json.dumps({
        "sigs": sigs,
        "out": [[o.tolist() for o in out] for out in outs], "stats": compiler.kernel_stats(),
        "problems": compiler.disk_cache_problems(),
        "warnings": [str(w.message) for w in caught
                     if issubclass(w.category, compiler.CacheWarning)]}))
""")

X = np.linspace(-1, 1, 18, dtype=np.float32).reshape(3, 6)


def _expected(x):
    y = (0.5 * x * np.exp(x)).sum(axis=1)
    z = (np.abs(y) * y).max()
    return y, z, (x * x + z).mean()


def _env(root: pathlib.Path, **extra) -> dict:
    env = dict(os.environ, TEST_CACHE_ROOT=str(root), PDJIT_CACHE_DIR=str(root / "pdjit"),
               NUMBA_CACHE_DIR=str(root / "numba"), XDG_CACHE_HOME=str(root / "xdg"),
               PDJIT_STRICT="1", PDJIT_COMPILE_WORKERS="0", **extra)
    env.pop("TEST_FAULT", None)
    env.update(extra)
    return env


def _start(root, **extra):
    return subprocess.Popen([sys.executable, "-c", SCRIPT], env=_env(root, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    for out, n in zip(got["out"], (3, 2)):   # the batches of 3 and 2 rows
        for o, want in zip(out, _expected(X[:n])):
            np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
    assert got["stats"]["kernels"] >= 1    # native code ran (strict: no reference fallback)
    return got


def _run(root, **extra) -> dict:
    return _finish(_start(root, **extra))


def _cache_files(root: pathlib.Path) -> list:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _assert_whole(root: pathlib.Path) -> None:
    """No temporary file left behind, and every module file holds the text its name hashes."""
    files = _cache_files(root)
    assert not [p for p in files if ".tmp" in p.name], files
    modules = [p for p in files if p.name.startswith("pdjit_gen_") and p.suffix == ".py"]
    assert modules
    for p in modules:
        assert p.stem == "pdjit_gen_" + hashlib.sha256(p.read_bytes() + b"\0").hexdigest()[:32]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache two processes filled at the same moment, checked whole."""
    root = tmp_path_factory.mktemp("race")
    go = root / "go"
    procs = [_start(root, TEST_GO=str(go), TEST_SIGS=half) for half in ("first", "second")]
    t0 = time.time()
    while len(list(root.glob("go.*"))) < 2 and time.time() - t0 < 120:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.touch()   # both have imported pdjit: they build and compile the same kernels now
    first, second = (_finish(p) for p in procs)
    return root, first, second


def test_two_processes_compile_the_same_kernels_at_once_then_a_third_loads_all(warm_cache):
    root, first, second = warm_cache
    assert first["out"] == second["out"]
    assert first["stats"]["kernels"] == second["stats"]["kernels"]
    assert not first["warnings"] and not second["warnings"]
    assert first["sigs"] == second["sigs"] == {"compiled": 4, "loaded": 0}
    _assert_whole(root)
    third = _run(root, TEST_SIGS="all")
    # Numba reads, extends and rewrites a function's index for each new signature: the two
    # processes doing so at once dropped none of each other's entries (pdjit serialises it;
    # without that, 4 or 5 of the 8 compiled again here)
    assert third["sigs"] == {"compiled": 0, "loaded": 8}, third["sigs"]
    assert third["out"] == first["out"]
    assert third["stats"]["compiled"] == 0, third        # all from the disk cache
    assert third["stats"]["loaded"] == third["stats"]["kernels"] - 1 + 8  # twice: 8 loads
    assert not third["warnings"]


def _damage(path: pathlib.Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[:len(data) // 3])
    elif how == "garbage":
        path.write_bytes(os.urandom(len(data)))
    else:   # one flipped byte in the middle: only a checksum notices
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:])


def test_a_damaged_entry_of_each_kind_is_recompiled_not_a_crash(warm_cache):
    # in place (the test ends with the cache healed)
    root = warm_cache[0]
    files = _cache_files(root / "pdjit") + _cache_files(root / "numba")
    modules = [p for p in files if p.name.startswith("pdjit_gen_") and p.suffix == ".py"
               and "def twice" not in p.read_text()]    # the program's kernels
    kinds = {".py": modules,
             ".nbi": [p for p in files if p.suffix == ".nbi" and "pdjit_gen_" in p.name],
             ".nbc": [p for p in files if p.suffix == ".nbc" and "pdjit_gen_" in p.name],
             "library .nbc": [p for p in files if p.suffix == ".nbc" and "mathfuncs" in p.name]}
    assert all(kinds.values()), kinds
    assert len(modules) >= 3, modules
    # the kernel that calls the library's exp gets its data flipped (compiling it again reads
    # the library's damaged entries); the module names are hashes, so their order is arbitrary
    modules.sort(key=lambda p: "exp" in p.read_text())
    assert "exp" in modules[-1].read_text() and "exp" not in modules[0].read_text()
    modules[2], modules[-1] = modules[-1], modules[2]
    # a different module damaged in each kind of file where the kernels allow it
    by_module = {m.stem: i for i, m in enumerate(modules)}

    def pick(paths, k):
        own = [p for p in paths if by_module.get(p.name.split(".")[0]) == k % len(modules)]
        return (own or paths)[0]

    _damage(pick(kinds[".py"], 0), "garbage")
    _damage(pick(kinds[".nbi"], 1), "truncate")
    _damage(pick(kinds[".nbc"], 2), "flip")
    for p in kinds["library .nbc"]:
        _damage(p, "garbage")
    locks = list((root / "pdjit").rglob(".pdjit-cache.lock"))     # any other file: the locks
    assert locks
    for lock in locks:
        lock.write_bytes(os.urandom(64))
    damaged = _run(root)
    assert damaged["out"] == warm_cache[1]["out"]
    # the module file is written again (its name is its text's hash: Numba's code for it still
    # holds); the kernels whose index or data was damaged compile again, no other
    assert damaged["stats"]["compiled"] == 2, damaged
    text = "\n".join(damaged["warnings"])
    assert "does not hold its text (damaged)" in text                  # the module file
    assert "EOFError" in text or "UnpicklingError" in text              # the truncated index
    assert "does not match its SHA-256" in text                         # the flipped byte
    assert "pdjit.codegen.cpu.mathfuncs._exp" in text                       # the library's data
    assert not damaged["problems"]
    _assert_whole(root)
    healed = _run(root)                                   # what was compiled again is on disk
    assert healed["stats"]["compiled"] == 0 and not healed["warnings"], healed


def test_a_cache_directory_that_cannot_be_written_warns_once_and_runs_natively(tmp_path):
    faults = ("readonly", "full")
    for fault in faults:
        (tmp_path / fault / "pdjit").mkdir(parents=True)
    procs = [_start(tmp_path / fault, TEST_FAULT=fault) for fault in faults]   # side by side
    for fault, proc in zip(faults, procs):
        root, got = tmp_path / fault, _finish(proc)
        directory = os.path.abspath(root / "pdjit")
        about_dir = [w for w in got["warnings"] if "cannot be written" in w]
        assert len(about_dir) >= 1 and directory in about_dir[0], got["warnings"]
        # once per directory: the compile cache's own, and Numba's where its saves failed
        assert len(about_dir) == len(got["problems"]) == len(set(got["problems"]))
        assert directory in got["problems"]
        reason = "Read-only file system" if fault == "readonly" else "No space left on device"
        assert reason in got["problems"][directory], (fault, got["problems"])
        assert got["stats"]["compiled"] == got["stats"]["kernels"]     # compiled, in memory
        assert not [p for p in _cache_files(root) if ".tmp" in p.name]  # no torn files


def test_a_read_only_cache_that_is_already_warm_still_serves(warm_cache):
    got = _run(warm_cache[0], TEST_FAULT="readonly")
    assert got["out"] == warm_cache[1]["out"]
    assert got["stats"]["compiled"] == 0, got       # loaded: reading needs no writes
    assert got["stats"]["loaded"] == got["stats"]["kernels"]
    assert not got["warnings"], got["warnings"]   # nothing had to be written: nothing to say

