"""The build options of ``pdjit compile``: ``--batch N`` / ``--dynamic-batch``, ``--threads N``
(batch split across threads, or OpenBLAS threads when the model is not batch-separable) and
``--embed-params``, end to end through the loader and the C example.

Oracles: PaddlePaddle's outputs stored with the corpus models (``_cases``), NumPy for a model
built here, and the same artifact on one thread (a split run must give, bit for bit, what one
thread gives on each slice). Builds are shared per module: LeNet (2 threads, parameters
embedded), the MLP through the command line (``--batch 4``), a model with a batch reduction.
"""
import ctypes
import os
import pathlib
import shutil
import subprocess
import threading

import numpy as np
import pytest
from test_aot_models import MODELS, _cases, _import_artifact

# one worker runs every AOT test (xdist_group): a second build in a process reuses the library
# kernels Numba compiled for the first (LeNet: seconds instead of tens of seconds cold)
pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'"),
              pytest.mark.xdist_group("aot")]


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    from pdjit.aot import compile_model

    d = tmp_path_factory.mktemp("opt_lenet")
    spec = compile_model(str(MODELS / "lenet"), str(d), batch=8, threads=2, embed_params=True)
    return d, spec, _import_artifact(d, "opt_lenet_artifact")


@pytest.fixture(scope="module")
def mlp_fixed(tmp_path_factory):
    """The MLP through the command line, for batches of at most 4, 2 threads."""
    from pdjit.aot.__main__ import main

    d = tmp_path_factory.mktemp("opt_mlp")
    out = d / "art"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["compile", str(MODELS / "mlp"), "-o", str(out), "--batch", "4",
                     "--threads", "2"]) == 0
    return out, buf.getvalue(), _import_artifact(out, "opt_mlp_artifact")


@pytest.fixture(scope="module")
def centred(tmp_path_factory):
    """``fc(x - reduce_mean(x, dim=0))``: row i depends on every row (not separable); saved
    with ``fluid.io.save_inference_model``, compiled by the command line with 2 threads."""
    import contextlib
    import io

    import pdjit as fluid
    from pdjit.aot.__main__ import main

    d = tmp_path_factory.mktemp("opt_centred")
    main_p, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main_p, startup):
        x = fluid.layers.data("x", [8], dtype="float32")
        c = fluid.layers.elementwise_sub(x, fluid.layers.reduce_mean(x, dim=0))
        y = fluid.layers.fc(c, 4)
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.global_scope()
    exe.run(startup)
    fluid.io.save_inference_model(str(d / "model"), ["x"], [y], exe, main_program=main_p)
    params = [p.name for p in main_p.global_block().all_parameters()]
    values = {n: np.array(scope.find_var(n).get_tensor()) for n in params}
    w = next(v for v in values.values() if v.ndim == 2)
    b = next(v for v in values.values() if v.ndim == 1)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["compile", str(d / "model"), "-o", str(d / "art"), "--threads", "2"]) == 0
    return d / "art", buf.getvalue(), _import_artifact(d / "art", "opt_centred_artifact"), w, b


def _blas_threads(d):
    """(get, set) of the process's OpenBLAS thread count: the library the artifact links,
    found by its soname (NumPy's, loaded once; a path would load a second copy)."""
    blas = next(f for f in os.listdir(d) if "openblas" in f)
    lib = ctypes.CDLL(blas)
    return lib.scipy_openblas_get_num_threads64_, lib.scipy_openblas_set_num_threads64_


def _example(d, *args, env=None):
    if not (d / "example").exists():
        subprocess.run("cc -O2 -I. example.c -L. -lmodel -Wl,-rpath,'$ORIGIN' -o example",
                       shell=True, cwd=d, check=True, capture_output=True)
    return subprocess.run([str(d / "example"), *map(str, args)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def _first_values(stdout):
    line = next(ln for ln in stdout.splitlines() if ln.startswith("output "))
    return line, np.array([float(v) for v in line.split(":")[-1].split()])


def test_threads_split_the_batch_and_equal_one_thread(lenet):
    _, spec, mod = lenet
    assert spec.options["batch_split"] is True and spec.options["batch_split_why_not"] == ""
    m2, m1 = mod.load(max_batch=64), mod.load(max_batch=64, threads=1)
    assert (m2.threads, m2.threads_used, m2.batch_split) == (2, "batch", True)
    assert m1.threads == 1
    rng = np.random.default_rng(0)
    for b in (1, 3, 8, 64):
        x = rng.standard_normal((b, 1, 28, 28)).astype(np.float32)
        got, one = m2.run({"x": x})[0], m1.run({"x": x})[0]
        assert got.shape == (b, 10)
        # each slice is what one thread computes on it (halves; fewer than 2 rows a thread:
        # one thread), bit for bit
        h = b // 2 if b >= 4 else b
        parts = [m1.run({"x": x[:h]})[0]] + ([m1.run({"x": x[h:]})[0]] if h < b else [])
        assert np.array_equal(got, np.concatenate(parts))
        # the whole batch on one thread: OpenBLAS's GEMM may sum a row differently for
        # another row count (LeNet's 120x84 product does at 100 rows vs 50)
        np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-6)
    assert m2.memory()[1] == 0            # sized at creation for 64 rows on both threads
    for feed, want in _cases("lenet"):    # Paddle's outputs
        np.testing.assert_allclose(m2.run(feed)[0], want["softmax_0.tmp_0"], rtol=1e-5,
                                   atol=1e-5)
    m2.set_threads(3)
    assert m2.threads == 3 and m2.memory()[1] == 0
    x = rng.standard_normal((9, 1, 28, 28)).astype(np.float32)
    parts = [m1.run({"x": x[i:i + 3]})[0] for i in (0, 3, 6)]
    assert np.array_equal(m2.run({"x": x})[0], np.concatenate(parts))
    for bad in (0, 65):
        with pytest.raises(mod.ModelError, match="threads: expected 1 to 64") as info:
            m2.set_threads(bad)
        assert info.value.code == 1
    with pytest.raises(mod.ModelError, match="expected an int"):
        m2.set_threads(2.0)
    assert m2.threads == 3


def test_not_separable_names_the_op_and_gives_blas_the_threads(centred):
    d, printed, mod, w, b = centred
    assert "given to OpenBLAS" in printed and "'reduce_mean'" in printed
    get, set_ = _blas_threads(d)
    before = get()
    try:
        m = mod.load(max_batch=16)
        assert m.batch_split is False and m.threads_used == "blas" and m.threads == 2
        assert "op 'reduce_mean'" in m.batch_split_why_not
        assert "dim=[0]" in m.batch_split_why_not
        assert get() == 2                 # --threads 2 went to OpenBLAS
        rng = np.random.default_rng(2)
        for n in (1, 5, 64):
            x = rng.standard_normal((n, 8)).astype(np.float32)
            want = (x - x.mean(axis=0)) @ w + b
            np.testing.assert_allclose(m.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)
        m.set_threads(1)
        assert get() == 1 and m.threads == 1
    finally:
        set_(before)


def test_fixed_batch_from_the_command_line(mlp_fixed):
    d, printed, mod = mlp_fixed
    assert "batch: at most 4 (fixed)" in printed and "threads: 2" in printed
    m = mod.load()
    assert m.fixed_batch == 4 and m.threads == 2 and not m.params_embedded
    arena = m.memory()[0]
    assert arena > 0
    cases = _cases("mlp")
    rng = np.random.default_rng(4)
    for n in (4, 2, 1, 3):                 # smaller batches are taken too
        x = rng.standard_normal((n, 16)).astype(np.float32)
        got = m.run({"x": x})[0]
        assert got.shape == (n, 10) and np.allclose(got.sum(axis=1), 1, atol=1e-5)
        assert m.memory() == (arena, 0)    # never on the heap, never grown
    for feed, want in cases:
        if feed["x"].shape[0] <= 4:
            np.testing.assert_allclose(m.run(feed)[0], want["softmax_0.tmp_0"], rtol=1e-5,
                                       atol=1e-5)
    with pytest.raises(mod.ModelError) as info:
        m.run({"x": np.ones((5, 16), np.float32)})
    assert info.value.code == 4
    assert "input 'x': dim 0 (the batch) expected at most 4" in str(info.value)
    assert "got 5" in str(info.value)
    assert m.memory() == (arena, 0)
    assert m.run({"x": np.ones((2, 16), np.float32)})[0].shape == (2, 10)   # still usable
    with pytest.raises(mod.ModelError, match=r"max_batch 5: .* at most 4"):
        mod.load(max_batch=5)
    assert mod.load(max_batch=1).memory()[0] == arena      # sized for 4 all the same
    # through C: a .npy of 5 rows is an error (exit 1, the message), not a crash
    np.save(d / "x5.npy", np.ones((5, 16), np.float32))
    np.save(d / "x3.npy", np.ones((3, 16), np.float32))
    r = _example(d, d / "x5.npy")
    assert r.returncode == 1 and "dim 0 (the batch) expected at most 4" in r.stderr, r.stderr
    r = _example(d, d / "x3.npy")
    assert r.returncode == 0 and "[3, 10]" in r.stdout, r.stderr


def test_embedded_params_run_without_the_file(lenet, tmp_path):
    d, spec, mod = lenet
    assert spec.options["embed_params"] is True
    assert (d / "libmodel.so").stat().st_size > spec.params_bytes
    # NumPy's BLAS beside the library is NumPy's file itself where a hard link is possible
    # (28 MB an artifact otherwise: the suite's artifacts took ~700 MB of copies)
    blas = next(d.glob("*openblas*"))
    src = pathlib.Path(np.__file__).parent.parent / "numpy.libs" / blas.name
    if src.stat().st_dev == blas.stat().st_dev:
        assert os.path.samefile(src, blas)
    moved = tmp_path / "lenet_no_params"

    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(d, moved, ignore=shutil.ignore_patterns("model.params", "example",
                                                            "__pycache__"), copy_function=link)
    assert not (moved / "model.params").exists()
    art = _import_artifact(moved, "opt_lenet_moved")
    m = art.load()
    assert m.params_embedded
    feed, want = _cases("lenet")[0]
    np.testing.assert_allclose(m.run(feed)[0], want["softmax_0.tmp_0"], rtol=1e-5, atol=1e-5)
    # a parameters file given by path is still read (and checked)
    m2 = art.load(params=str(d / "model.params"), threads=1)
    assert np.array_equal(m2.run(feed)[0], m.run(feed)[0])
    bad = tmp_path / "bad.params"
    blob = (d / "model.params").read_bytes()
    bad.write_bytes(blob[:-4] + b"\x01\x02\x03\x04")
    with pytest.raises(art.ModelError, match="not this model's"):
        art.load(params=str(bad))
    # C, with no model.params anywhere beside it, on 2 threads
    r = _example(moved, env={"PDJIT_NUM_THREADS": "2"})
    assert r.returncode == 0, r.stderr
    assert "threads: 2 (slices of the batch)" in r.stdout
    _, first = _first_values(r.stdout)
    k = np.arange(2 * 28 * 28, dtype=np.int64)
    x = (((k * 7919) % 2001) / 1000.0 - 1.0).astype(np.float32).reshape(2, 1, 28, 28)
    np.testing.assert_allclose(first, m.run({"x": x})[0].ravel()[:5], rtol=1e-5)
    r = _example(moved, env={"PDJIT_NUM_THREADS": "0"})
    assert r.returncode == 2 and "threads: expected 1 to 64, got 0" in r.stderr


def test_two_instances_two_threads_each_in_two_threads(lenet):
    _, _, mod = lenet
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((b, 1, 28, 28)).astype(np.float32) for b in (8, 5)]
    ref = mod.load(threads=2)
    want = [ref.run({"x": x})[0] for x in xs]
    errors, results = [], [[], []]

    def work(k):
        try:
            model = mod.load(max_batch=2, threads=2)   # grows on its first run
            for _ in range(15):
                results[k].append(model.run({"x": xs[k]})[0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in (0, 1):
        assert len(results[k]) == 15 and all(np.array_equal(r, want[k]) for r in results[k])


def test_command_line_refuses_bad_combinations(capsys):
    from pdjit.aot.__main__ import main
    from pdjit.cli import build_parser

    m = str(MODELS / "mlp")
    for bad in (["--batch", "4", "--dynamic-batch"], ["--threads", "0"], ["--threads", "65"],
                ["--batch", "0"], ["--batch", "two"]):
        with pytest.raises(SystemExit):
            main(["compile", m, "-o", "/tmp/pdjit-never-written", *bad])
    err = capsys.readouterr().err
    assert "not allowed with argument" in err and "expected an integer >= 1" in err
    args = build_parser().parse_args(["compile", m, "-o", "o", "--dynamic-batch",
                                      "--threads", "3", "--embed-params"])
    assert (args.batch, args.dynamic_batch, args.threads, args.embed_params) == \
        (None, True, 3, True)
    text = build_parser()._subparsers._group_actions[0].choices["compile"].format_help()
    for option in ("--batch N", "--dynamic-batch", "--threads N", "--embed-params"):
        assert option in text


# ---- the analysis itself, on programs built here (no compilation) --------------------------
def _analyse(build, shape=(8,)):
    import pdjit as fluid
    from pdjit.aot.batch_split import analyse

    main_p, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main_p, startup):
        x = fluid.layers.data("x", list(shape), dtype="float32")
        y = build(fluid.layers, x)
    return analyse(main_p, None, ["x"], [y.name])


@pytest.mark.parametrize("build, ok, named", [
    (lambda L, x: L.softmax(L.fc(x, 4)), True, ""),
    (lambda L, x: L.reshape(L.relu(x), [-1, 2, 4]), True, ""),
    (lambda L, x: L.reduce_sum(x, dim=1), True, ""),
    (lambda L, x: L.elementwise_add(x, L.reduce_mean(x, dim=0)), False, "'reduce_mean'"),
    (lambda L, x: L.reshape(x, [2, -1]), False, "'reshape2'"),
    (lambda L, x: L.softmax(x, axis=0), False, "'softmax'"),
    (lambda L, x: L.transpose(x, [1, 0]), False, "'transpose2'"),
    (lambda L, x: L.elementwise_add(x, L.create_parameter([3, 8], "float32")), False,
     "constant, has 3 rows"),
    (lambda L, x: L.mean(x), False, "'mean'"),
    (lambda L, x: L.shape(x), False, "'shape'"),
])
def test_analysis(build, ok, named):
    got, why = _analyse(build)
    assert got is ok and named in why, why


def test_analysis_of_the_corpus():
    from pdjit.aot.batch_split import analyse
    from pdjit.io.inference_model import load_model
    from pdjit.passes.inference import optimize

    for name, ok, named in (("lenet", True, ""), ("transformer", True, ""),
                            ("gru", False, "op 'shape'"), ("cond_while", False, "op 'while'")):
        model = load_model(str(MODELS / name))
        program, _ = optimize(model.program, model.params)
        got, why = analyse(program, None, model.feed_names, model.fetch_names)
        assert got is ok and named in why, (name, why)


def test_split_falls_back_to_one_thread_when_the_inputs_disagree(tmp_path):
    """Two batch inputs on 2 threads: equal batches are split (against NumPy); batches that
    differ run on one thread, which gives the native code's error (as a one-thread instance
    does), and the instance stays usable."""
    import pdjit as fluid
    from pdjit.aot import compile_model
    from pdjit.static import save_inference_model

    main_p, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main_p, startup):
        x = fluid.layers.data("x", [4], dtype="float64")
        y = fluid.layers.data("y", [4], dtype="float64")
        r = fluid.layers.scale(fluid.layers.relu(fluid.layers.elementwise_add(x, y)), scale=2.0)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    save_inference_model(str(tmp_path / "m" / "m"), [x, y], [r], exe, program=main_p)
    spec = compile_model(str(tmp_path / "m" / "m"), str(tmp_path / "two"), threads=2)
    assert spec.options["batch_split"] is True
    model = _import_artifact(tmp_path / "two", "opt_two_artifact").load(max_batch=6)
    assert model.threads == 2
    rng = np.random.default_rng(6)
    xv, yv = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    assert np.array_equal(model.run({"x": xv, "y": yv})[0], np.maximum(xv + yv, 0) * 2)
    assert model.memory()[1] == 0
    one = _import_artifact(tmp_path / "two", "opt_two_artifact").load(threads=1)
    for rows in (1, 4):
        for m in (model, one):
            with pytest.raises(Exception, match="native code failed") as info:
                m.run({"x": xv, "y": yv[:rows]})
            assert info.value.code == 7
    assert np.array_equal(model.run({"x": xv[:5], "y": yv[:5]})[0],
                          np.maximum(xv[:5] + yv[:5], 0) * 2)
