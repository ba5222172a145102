"""The run path of an AOT artifact: the loader's outputs are written by the library straight into
the arrays it returns (or into the caller's, ``run(feed, out=...)``), through
``pdjit_model_run_into``; outputs whose shapes the loader cannot foresee still come back right.

Oracles: the JIT executor in strict mode on the same saved model (every step native; the
artifact links the same BLAS, so bit-identical), and the library's own ``pdjit_model_output``
pointer, which says where the outputs of the last run are (the caller's arrays, not a copy).
"""
import ctypes
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from test_aot_models import _import_artifact
from test_aot_review import _feed, _save, _two_inputs

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'"),
              pytest.mark.xdist_group("aot")]


def _flat(fluid):
    """x float32 [4] -> x * 2 + 1 flattened to [-1] (batch * 4 values: a -1 that is not the
    batch) and the row sums [-1, 1]."""
    x = fluid.layers.data("x", [4], dtype="float32")
    y = fluid.layers.scale(x, 2.0, bias=1.0)
    return ["x"], [fluid.layers.reshape(y, [-1]), fluid.layers.reduce_sum(y, dim=1,
                                                                           keep_dim=True)]


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    from pdjit.aot import compile_model

    d = tmp_path_factory.mktemp("run_path")
    out = {}
    # "flat" with the C ABI's names prefixed (flat_model_create, libflat.so, flat.h)
    for name, build, threads, prefix in (("two", _two_inputs, 2, "pdjit"),
                                         ("flat", _flat, 1, "flat")):
        model = _save(d / name, build)
        compile_model(model, str(d / f"{name}_art"), batch=2, threads=threads, prefix=prefix)
        out[name] = (model, _import_artifact(d / f"{name}_art", f"run_path_{name}"))
    return out


def _jit(model, feeds):
    import pdjit as fluid

    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    with fluid.scope_guard(fluid.Scope()):
        prog, _, fetches = fluid.io.load_inference_model(model, exe)
        return [exe.run(prog, feed=f, fetch_list=fetches) for f in feeds]


def _where(m, i):
    """The address of output ``i`` of the instance's last run, as the library reports it."""
    p, s = ctypes.c_void_p(), ctypes.POINTER(ctypes.c_int64)()
    assert m._lib.pdjit_model_output(m._h, i, ctypes.byref(p), ctypes.byref(s)) == 0
    return p.value


def test_outputs_written_in_place_equal_jit(arts):
    model, mod = arts["two"]
    rng = np.random.default_rng(1)
    feeds = [_feed(rng, b) for b in (1, 5, 2, 8, 8)]
    refs = _jit(model, feeds)
    for threads in (1, 2):
        m = mod.load(threads=threads)
        assert m.batch_split and m.threads == threads
        prev = None
        for feed, ref in zip(feeds, refs):
            got = m.run(feed)
            for i, (g, r) in enumerate(zip(got, ref)):
                assert g.dtype == r.dtype and g.shape == r.shape
                assert np.array_equal(g, r), (threads, i)
                assert _where(m, i) == g.ctypes.data        # written there, not copied
            if prev is not None:                             # each run: arrays of its own
                assert not any(np.shares_memory(a, b) for a, b in zip(got, prev))
            prev = got
        # the caller's arrays: filled and returned as they are
        bufs = [np.full(r.shape, 7, r.dtype) for r in refs[-1]]
        got = m.run(feeds[-1], out=bufs)
        assert all(g is b for g, b in zip(got, bufs))
        assert all(np.array_equal(b, r) for b, r in zip(bufs, refs[-1]))
        assert all(_where(m, i) == b.ctypes.data for i, b in enumerate(bufs))
        m.close()


def test_out_refused_with_the_output_named(arts):
    _, mod = arts["two"]
    m = mod.load()
    feed = _feed(np.random.default_rng(2), 3)
    good = [o.copy() for o in m.run(feed)]
    ro = good[0].copy()
    ro.flags.writeable = False
    cases = [
        ([good[0], good[1]], r"out: expected a list of 3 array\(s\).* got list of 2"),
        (good[0], r"out: expected a list of 3 array\(s\).* got ndarray"),
        ([good[0].astype(np.float64), good[1], good[2]],
         r"out\[0\] \(output '.*'\): expected a writeable C-contiguous float32 array of shape "
         r"\(3, 3\), got float64 \(3, 3\)"),
        ([good[0], good[1], np.zeros((4, 3), np.int64)],
         r"out\[2\] .*int64 array of shape \(3, 3\), got int64 \(4, 3\)"),
        ([ro, good[1], good[2]], r"out\[0\] .* got float32 \(3, 3\), read-only"),
        ([np.zeros((3, 6), np.float32)[:, ::2], good[1], good[2]],
         r"out\[0\] .* got float32 \(3, 3\), not C-contiguous"),
        ([[0.0] * 3] * 3, r"out\[0\] .* got list"),
    ]
    cases[-1] = ([cases[-1][0], good[1], good[2]], cases[-1][1])
    for out, msg in cases:
        with pytest.raises(mod.ModelError, match=msg):
            m.run(feed, out=out)
    base = np.zeros(21, np.float32)       # x and out[0] overlap in base[9:12]
    with pytest.raises(mod.ModelError, match="shares memory with an input"):
        m.run({"x": base[:12].reshape(3, 4), "ids": feed["ids"]},
              out=[base[9:18].reshape(3, 3), good[1], good[2]])
    for a, b in zip(m.run(feed), good):   # still usable, same outputs
        assert np.array_equal(a, b)


def test_shapes_the_loader_cannot_foresee(arts):
    model, mod = arts["flat"]
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((b, 4)).astype(np.float32)} for b in (3, 3, 1, 6)]
    refs = _jit(model, feeds)
    m = mod.load()
    for feed, ref in zip(feeds, refs):
        got = m.run(feed)          # [b * 4] where the loader expected [b]: the library's own
        assert got[0].shape == (feed["x"].shape[0] * 4,)
        for g, r in zip(got, ref):
            assert np.array_equal(g, r)
    with pytest.raises(mod.ModelError, match=r"this run's outputs have shapes \[\(24,\), "
                                             r"\(6, 1\)\], the arrays given \[\(6,\), \(6, 1\)\]"):
        m.run(feeds[-1], out=[np.empty(6, np.float32), np.empty((6, 1), np.float32)])
    bufs = [np.empty(24, np.float32), np.empty((6, 1), np.float32)]
    got = m.run(feeds[-1], out=bufs)
    assert got[0] is bufs[0] and np.array_equal(bufs[0], refs[-1][0])


def test_c_run_into_small_buffers_and_bad_arguments(arts):
    _, mod = arts["two"]
    m = mod.load()
    lib, h = m._lib, m._h
    feed = _feed(np.random.default_rng(4), 4)
    want = m.run(feed)
    xs = [feed["x"], feed["ids"]]
    i64p = ctypes.POINTER(ctypes.c_int64)
    data = (ctypes.c_void_p * 2)(*[a.ctypes.data for a in xs])
    codes = (ctypes.c_int * 2)(0, 3)
    ndims = (ctypes.c_int * 2)(2, 2)
    dims = [(ctypes.c_int64 * 2)(*a.shape) for a in xs]
    shapes = (i64p * 2)(*[ctypes.cast(d, i64p) for d in dims])
    small = [np.zeros((2, 3), o.dtype) for o in want]     # half of what a batch of 4 needs
    optr = (ctypes.c_void_p * 3)(*[o.ctypes.data for o in small])
    nbytes = (ctypes.c_int64 * 3)(*[o.nbytes for o in small])
    odims = (ctypes.c_int64 * 6)()
    run = lib.pdjit_model_run_into
    assert run(h, 2, data, codes, ndims, shapes, 3, optr, nbytes, odims) == 0
    assert list(odims) == [4, 3] * 3
    for i, w in enumerate(want):           # the instance's buffers, the same outputs
        assert _where(m, i) not in (o.ctypes.data for o in small)
        got = np.ctypeslib.as_array(ctypes.cast(_where(m, i), ctypes.POINTER(
            np.ctypeslib.as_ctypes_type(w.dtype))), shape=w.shape)
        assert np.array_equal(got, w)
    assert run(h, 2, data, codes, ndims, shapes, 2, optr, nbytes, odims) == 2
    assert b"expected 3 output buffer(s), got 2" in lib.pdjit_model_error(h)
    assert run(h, 2, data, codes, ndims, shapes, 3, optr, None, odims) == 1
    assert run(h, 2, data, codes, ndims, shapes, 3, None, None, None) == 0
    codes[1] = 2
    assert run(h, 2, data, codes, ndims, shapes, 3, optr, nbytes, odims) == 3
    assert b"input 'ids': expected dtype int64, got int32" in lib.pdjit_model_error(h)


def _tasks():
    """The split runs' worker threads in this process (named ``pdjit-slice``; a test runner's
    or a library's own threads come and go beside them)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == "pdjit-slice"
        except OSError:                  # a thread that ended while we looked
            pass
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc/self/task")
def test_split_threads_started_once_and_parked(arts):
    """A split run's threads are started with the instance (``set_threads``), reused by every
    run, and ended by ``close`` / ``set_threads(1)``; runs equal the one-thread run bit for
    bit (each slice on its own thread, the rows in place)."""
    _, mod = arts["two"]
    one = mod.load(threads=1)
    feed = _feed(np.random.default_rng(5), 9)
    want = one.run(feed)
    base = _tasks()
    m = mod.load(threads=3)
    assert _tasks() == base + 2
    for b in (9, 4, 2, 9):                 # 3, 2, 1 (no split) and 3 slices
        rows = {k: v[:b] for k, v in feed.items()}
        for g, w in zip(m.run(rows), one.run(rows)):
            assert np.array_equal(g, w)
        assert _tasks() == base + 2
    m.set_threads(2)
    assert _tasks() == base + 1
    assert all(np.array_equal(g, w) for g, w in zip(m.run(feed), want))
    m.set_threads(1)
    assert _tasks() == base
    m.set_threads(4)
    assert _tasks() == base + 3
    m.close()
    assert _tasks() == base
    one.close()


def test_outputs_of_many_runs_stay_their_own(arts):
    """Small outputs are rows of blocks the loader allocates for 64 runs: the arrays of 70 runs
    (two blocks) are each their own memory and keep their values; an output over 1 KiB is an
    array of its own."""
    model, mod = arts["two"]
    m = mod.load(threads=1)
    rng = np.random.default_rng(6)
    feeds = [_feed(rng, 2) for _ in range(70)] + [_feed(rng, 200)]
    refs = _jit(model, feeds)
    kept = [m.run(f) for f in feeds]
    for got, ref in zip(kept, refs):
        for g, r in zip(got, ref):
            assert g.shape == r.shape and np.array_equal(g, r)
    for i in range(3):
        outs = [k[i] for k in kept]
        assert not any(np.shares_memory(a, b) for a, b in zip(outs, outs[1:]))
    assert kept[-1][0].nbytes > 1024 and kept[-1][0].base is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_split_run_in_a_forked_child(arts, tmp_path):
    """The workers of an instance do not survive fork(): the child's first split run starts its
    own (it neither waits for the parent's forever nor runs fewer slices); the child's outputs
    equal the parent's."""
    import subprocess
    import sys

    art = pathlib.Path(arts["two"][1].__file__).parent
    script = tmp_path / "fork.py"
    script.write_text(f"""
import os, signal, sys
import numpy as np
sys.path.insert(0, {str(art.parent)!r})
import {art.name} as mod
rng = np.random.default_rng(7)
feed = {{"x": rng.standard_normal((8, 4)).astype(np.float32),
         "ids": rng.integers(0, 10, (8, 3)).astype(np.int64)}}
m = mod.load(threads=2)
want = m.run(feed)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    signal.alarm(20)   # a child waiting for the parent's threads would hang
    got = m.run(feed)
    os.write(w, b"same" if all(np.array_equal(a, b) for a, b in zip(got, want)) else b"diff")
    os._exit(0)
os.close(w)
msg = os.read(r, 16).decode()
_, status = os.waitpid(pid, 0)
print(msg, status, all(np.array_equal(a, b) for a, b in zip(m.run(feed), want)))
""")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["same", "0", "True"], (r.stdout, r.stderr[-2000:])


def test_a_batch_of_no_rows_gives_empty_outputs_as_the_jit(arts):
    """A batch of 0 rows runs (as the JIT runs it): outputs of 0 rows, of the JIT's dtypes and
    other dims, on one thread and split across two (no slice to run), into new arrays and into
    the caller's; the instance runs full batches as before after it."""
    for name in ("two", "flat"):
        model, mod = arts[name]
        rng = np.random.default_rng(8)
        empty = _feed(rng, 0) if name == "two" else {"x": np.zeros((0, 4), np.float32)}
        full = _feed(rng, 5) if name == "two" else {"x": rng.standard_normal((5, 4)).astype(
            np.float32)}
        ref0, ref5 = _jit(model, [empty, full])
        assert all(r.shape[0] == 0 for r in ref0)   # the oracle: the JIT's empty outputs
        for threads in (1, 2):
            m = mod.load(threads=threads)
            before = [a.copy() for a in m.run(full)]
            for out in (None, [np.empty(r.shape, r.dtype) for r in ref0]):
                got = m.run(empty, out=out)
                assert [(g.shape, g.dtype) for g in got] == [(r.shape, r.dtype) for r in ref0]
                if out is not None:
                    assert all(g is o for g, o in zip(got, out))
            for a, b, r in zip(m.run(full), before, ref5):
                assert np.array_equal(a, b) and np.array_equal(a, r)
            m.close()


def test_c_batch_of_no_rows_null_data_and_negative_dims(arts):
    """Through the C ABI: a 0-row input may come as NULL data (no elements) and gives 0-row
    outputs; NULL data with elements, and a negative dim, are errors naming the input."""
    _, mod = arts["two"]
    m = mod.load()
    lib, h = m._lib, m._h
    i64p = ctypes.POINTER(ctypes.c_int64)
    codes = (ctypes.c_int * 2)(0, 3)
    ndims = (ctypes.c_int * 2)(2, 2)
    dims = [(ctypes.c_int64 * 2)(0, 4), (ctypes.c_int64 * 2)(0, 3)]
    shapes = (i64p * 2)(*[ctypes.cast(d, i64p) for d in dims])
    data = (ctypes.c_void_p * 2)(None, None)
    odims = (ctypes.c_int64 * 6)()
    run = lib.pdjit_model_run_into
    assert run(h, 2, data, codes, ndims, shapes, 3, None, None, odims) == 0
    assert list(odims) == [0, 3] * 3
    assert lib.pdjit_model_run(h, 2, data, codes, ndims, shapes) == 0
    dims[0][0] = dims[1][0] = 2                    # rows, and no data
    assert run(h, 2, data, codes, ndims, shapes, 3, None, None, odims) == 1
    assert b"input 'x': data or shape is NULL" in lib.pdjit_model_error(h)
    x, ids = np.zeros((2, 4), np.float32), np.zeros((2, 3), np.int64)
    data[0], data[1] = x.ctypes.data, ids.ctypes.data
    dims[1][0] = -2
    assert run(h, 2, data, codes, ndims, shapes, 3, None, None, odims) == 4
    assert b"input 'ids': dim 0 expected >= 0, got -2" in lib.pdjit_model_error(h)
    dims[1][0] = 2
    assert run(h, 2, data, codes, ndims, shapes, 3, None, None, odims) == 0
    assert list(odims) == [2, 3] * 3


TWO_MODELS_C = r"""
#include <stdio.h>
#include "model.h"
#include "flat.h"
/* two artifacts in one program: "two" with the default names, "flat" built with --prefix flat;
   each runs on its inputs and prints its first output's values */
int main(void) {
    pdjit_model *a;
    flat_model *b;
    char err[256];
    if (pdjit_model_create(NULL, 2, &a, err, sizeof err) != PDJIT_OK) { puts(err); return 1; }
    if (flat_model_create(NULL, 2, &b, err, sizeof err) != PDJIT_OK) { puts(err); return 1; }
    float x[8] = {1, -2, 3, -4, 5, 6, -7, 8};
    int64_t ids[6] = {1, 2, 3, 9, 0, 4}, xs[2] = {2, 4}, is[2] = {2, 3};
    const void *da[2] = {x, ids};
    const int64_t *sa[2] = {xs, is};
    int dta[2] = {PDJIT_FLOAT32, PDJIT_INT64}, nda[2] = {2, 2};
    if (pdjit_model_run(a, 2, da, dta, nda, sa) != PDJIT_OK) {
        puts(pdjit_model_error(a));
        return 1;
    }
    if (flat_model_run(b, 1, da, dta, nda, sa) != PDJIT_OK) {
        puts(flat_model_error(b));
        return 1;
    }
    const void *p;
    const int64_t *shape;
    pdjit_model_output(a, 0, &p, &shape);
    printf("two %s %lld %lld:", pdjit_output_name(0), (long long)shape[0], (long long)shape[1]);
    for (int k = 0; k < shape[0] * shape[1]; k++) printf(" %.9g", ((const float *)p)[k]);
    flat_model_output(b, 0, &p, &shape);
    printf("\nflat %s %lld:", flat_output_name(0), (long long)shape[0]);
    for (int k = 0; k < shape[0]; k++) printf(" %.9g", ((const float *)p)[k]);
    printf("\n");
    flat_model_destroy(b);
    pdjit_model_destroy(a);
    return 0;
}
"""


def _exports(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return sorted(ln.split()[-1] for ln in out.splitlines() if ln.strip())


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_two_artifacts_linked_into_one_c_program(arts, tmp_path):
    """``--prefix flat``: the library exports only flat_* (libflat.so, flat.h), the default
    build only pdjit_* (the entry and Numba's symbols stay local: neither library binds the
    other's); one C program includes both headers, links both libraries and runs both models,
    each giving the outputs its own loader gives; the prefixed loader works as the default."""
    from pdjit.aot import csource

    two = pathlib.Path(arts["two"][1].__file__).parent
    flat = pathlib.Path(arts["flat"][1].__file__).parent
    assert (flat / "libflat.so").exists() and (flat / "flat.h").exists()
    assert not (flat / "libmodel.so").exists() and not (flat / "model.h").exists()
    assert _exports(two / "libmodel.so") == sorted(csource.exported())
    assert _exports(flat / "libflat.so") == sorted(csource.exported("flat"))
    assert all(n.startswith("flat_") for n in _exports(flat / "libflat.so"))
    header = (flat / "flat.h").read_text()
    assert "flat_model_create(" in header and "pdjit_" not in header.replace("PDJIT_", "")
    src = tmp_path / "both.c"
    src.write_text(TWO_MODELS_C)
    exe = tmp_path / "both"
    cmd = ["cc", "-O2", "-Wall", "-Werror", f"-I{two}", f"-I{flat}", str(src), f"-L{two}",
           f"-L{flat}", "-lmodel", "-lflat", f"-Wl,-rpath,{two}:{flat}", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    x = np.array([[1, -2, 3, -4], [5, 6, -7, 8]], np.float32)
    ids = np.array([[1, 2, 3], [9, 0, 4]], np.int64)
    want_two = arts["two"][1].load().run({"x": x, "ids": ids})[0]
    want_flat = arts["flat"][1].load().run({"x": x})[0]
    np.testing.assert_array_equal(want_flat, (x * 2 + 1).ravel())   # NumPy, the oracle
    lines = dict(ln.split(":") for ln in r.stdout.strip().splitlines())
    got_two = [k for k in lines if k.startswith("two ")][0]
    got_flat = [k for k in lines if k.startswith("flat ")][0]
    assert got_two.split()[2:] == ["2", "3"] and got_flat.split()[2:] == ["8"]
    np.testing.assert_array_equal(np.array(lines[got_two].split(), np.float32),
                                  want_two.ravel())
    np.testing.assert_array_equal(np.array(lines[got_flat].split(), np.float32), want_flat)
    # the prefixed artifact's example builds as its comment says
    r = subprocess.run("cc -O2 -I. example.c -L. -lflat -Wl,-rpath,'$ORIGIN' -o example",
                       shell=True, cwd=flat, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "-lflat" in (flat / "example.c").read_text()
    r = subprocess.run([str(flat / "example")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "output " in r.stdout, r.stderr


def test_prefix_refused_unless_a_c_identifier(tmp_path, capsys):
    from pdjit.aot import AotError, compile_model
    from pdjit.aot.__main__ import main

    for bad in ("1abc", "a-b", "", "x" * 65):
        with pytest.raises(AotError, match="prefix: expected a C identifier"):
            compile_model(str(tmp_path / "nope"), str(tmp_path / "out"), prefix=bad)
    with pytest.raises(SystemExit):
        main(["compile", str(tmp_path / "nope"), "-o", str(tmp_path / "out"), "--prefix",
              "a.b"])
    assert "prefix: expected a C identifier" in capsys.readouterr().err


def test_loader_bytecode_shipped_hash_checked(arts):
    """The loader's bytecode for this Python is written beside it at build time, checked by the
    source's hash (valid in a copy; an edited source is compiled anew): a process that writes no
    bytecode does not compile the loader at every start."""
    import importlib.util
    import sys

    art = pathlib.Path(arts["flat"][1].__file__).parent
    src = art / "__init__.py"
    pyc = pathlib.Path(importlib.util.cache_from_source(str(src)))
    data = pyc.read_bytes()
    assert data[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(data[4:8], "little") == 0b11          # hash-based, checked
    assert data[8:16] == importlib.util.source_hash(src.read_bytes())
    script = (  # what the loader imports first; then no source may be compiled
        "import ctypes, os, sys, threading, numpy\n"
        "import importlib._bootstrap_external as b\n"
        "def compiled(*a, **k):\n"
        "    raise AssertionError('the loader was compiled from source')\n"
        "b.SourceLoader.source_to_code = compiled\n"
        f"sys.path.insert(0, {str(art.parent)!r})\n"
        f"import {art.name} as m\n"
        "print(m.load().output_names)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert r.returncode == 0 and "reshape" in r.stdout, r.stderr[-2000:]
