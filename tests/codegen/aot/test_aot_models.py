"""Ahead-of-time compiled corpus models (``pdjit.aot``) against the JIT executor and Paddle.

Each model is compiled once per module (``artifacts``: seconds each). Oracles: the outputs
PaddlePaddle computed from the saved files (``tests/fixtures/paddle/models/<name>_io.npz``) and
the JIT executor in strict mode (every step native: a fallback fails); the artifact links the
BLAS the JIT executor calls (NumPy's OpenBLAS), so its outputs must be bit-identical. The
library runs without Python in its path: it has no undefined Python or Numba symbol.
"""
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

# one worker runs every AOT test (xdist_group): a second build in a process reuses the library
# kernels Numba compiled for the first (LeNet: seconds instead of tens of seconds cold)
pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'"),
              pytest.mark.xdist_group("aot")]

MODELS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "paddle" / "models"
NAMES = ["mlp", "lenet"]


def _import_artifact(path, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[str(path)])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from pdjit.aot import compile_model

    out = {}
    for name in NAMES:
        d = tmp_path_factory.mktemp(f"aot_{name}")
        # mlp for a portable CPU, lenet for this one
        spec = compile_model(str(MODELS / name), str(d), batch=2,
                             cpu="generic" if name == "mlp" else "host")
        out[name] = (d, spec, _import_artifact(d, f"aot_{name}_artifact"))
    return out


@pytest.fixture(scope="module")
def jit():
    """``run(name, feed) -> outputs`` through the JIT executor, strict (native steps only)."""
    import pdjit as fluid
    from pdjit.static import load_inference_model

    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    loaded = {}

    def run(name, feed):
        if name not in loaded:
            loaded[name] = load_inference_model(str(MODELS / name), exe)
        prog, _, fetches = loaded[name]
        return exe.run(prog, feed=feed, fetch_list=fetches)
    return run


def _same(name, got, want, blas_same):
    """Bit-identical to the JIT for this machine's CPU (the same vector code; the same BLAS,
    where it sums the parts of a product as the whole: ``blas_same``); for a generic CPU
    (other vector widths: other summation orders) within 1e-6 relative."""
    if name == "mlp":   # compiled for cpu="generic"
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    else:
        blas_same(got, want, msg=(name, np.abs(got - want).max()))


def _cases(name):
    with np.load(MODELS / f"{name}_io.npz") as z:
        data = dict(z)
    cases = sorted({k.split("/")[0] for k in data})
    return [({k.split("/")[2]: v for k, v in data.items() if k.startswith(f"{c}/feed/")},
             {k.split("/")[2]: v for k, v in data.items() if k.startswith(f"{c}/fetch/")})
            for c in cases]


@pytest.mark.parametrize("name", NAMES)
def test_outputs_equal_jit_and_paddle(artifacts, jit, name, blas_same):
    _, spec, mod = artifacts[name]
    model = mod.load()
    assert model.input_names == [n for n, _, _ in spec.inputs]
    for feed, want in _cases(name):
        got = model.run(feed)
        assert len(got) == len(model.output_names) == len(want)
        ref = jit(name, feed)
        for n, g, r in zip(model.output_names, got, ref):
            assert g.dtype == want[n].dtype and g.shape == want[n].shape
            np.testing.assert_allclose(g, want[n], rtol=1e-5, atol=1e-5)
            _same(name, g, r, blas_same)
    # a batch larger than the one the instance was sized for: the arena grows
    shape = [64 if d < 0 else d for d in model.input_shapes[0]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = model.run({model.input_names[0]: x})
    ref = jit(name, {model.input_names[0]: x})
    assert model.memory()[1] > 0          # the arena was sized for batch 2: heap blocks
    grown = model.memory()[0]
    for g, a, r in zip(got, model.run({model.input_names[0]: x}), ref):
        _same(name, g, r, blas_same)
        assert np.array_equal(a, g)   # the same instance again: the same bits
    assert model.memory() == (grown, 0)   # grown after the first run: no allocation now
    model.run(feed)                        # a smaller batch fits too
    assert model.memory() == (grown, 0)
    sized = mod.load(max_batch=64)         # sized at creation for 64: never on the heap
    assert sized.memory()[0] > 0 and sized.memory()[1] == 0
    sized.run({model.input_names[0]: x})
    assert sized.memory()[1] == 0


def test_library_needs_no_python_or_numba(artifacts):
    d, _, _ = artifacts["mlp"]
    out = subprocess.run(["nm", "-D", "--undefined-only", str(d / "libmodel.so")],
                         capture_output=True, text=True, check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert not [n for n in names if n.startswith(("Py", "_Py", "numba_", "NRT_"))], names
    exported = subprocess.run(["nm", "-D", "--defined-only", str(d / "libmodel.so")],
                              capture_output=True, text=True, check=True).stdout
    assert "pdjit_model_run" in exported and "numba_xxgemm" not in exported


def test_bad_inputs_give_errors(artifacts):
    d, _, mod = artifacts["mlp"]
    model = mod.load()
    x = np.ones((3, 16), np.float32)
    cases = [({"x": x.astype(np.float64)}, 3, "input 'x': expected dtype float32, got float64"),
             ({"x": x[0]}, 4, "input 'x': expected rank 2, got 1"),
             ({"x": np.ones((3, 15), np.float32)}, 4, "input 'x': dim 1 expected 16, got 15"),
             ({"x": x.astype(np.complex64)}, 3, "expected dtype float32, got unknown"),
             ({}, 2, "missing ['x']"),
             ({"x": x, "y": x}, 2, "unknown ['y']"),
             ([x, x], 2, "expected 1 input(s), got 2")]
    for feed, code, message in cases:
        with pytest.raises(mod.ModelError, match=None) as info:
            model.run(feed)
        assert info.value.code == code and message in str(info.value), (feed.keys()
                                                                         if isinstance(feed, dict)
                                                                         else len(feed), info)
    # the instance still works, and a strided input is taken as its values
    big = np.ones((3, 32), np.float32)
    assert np.array_equal(model.run({"x": big[:, ::2]})[0], model.run({"x": x})[0])
    # parameters: missing, truncated, another model's
    with pytest.raises(mod.ModelError, match="cannot open the parameters file"):
        mod.load(params=str(d / "nope.params"))
    blob = (d / "model.params").read_bytes()
    bad = d / "bad.params"
    bad.write_bytes(blob[:-8])
    with pytest.raises(mod.ModelError, match="expected .* bytes of parameters, got fewer"):
        mod.load(params=str(bad))
    bad.write_bytes(blob[:-4] + b"\x01\x02\x03\x04")
    with pytest.raises(mod.ModelError, match="not this model's"):
        mod.load(params=str(bad))
    other = artifacts["lenet"][0] / "model.params"
    with pytest.raises(mod.ModelError, match="parameters"):
        mod.load(params=str(other))
    with pytest.raises(mod.ModelError, match="max_batch must be >= 1"):
        mod.load(max_batch=0)


def test_batch_of_no_rows(artifacts, blas_same):
    """Each artifact runs a batch of 0 rows as the JIT does (its native code on empty inputs):
    empty outputs of the JIT's shapes and dtypes; the instance is unharmed."""
    import pdjit as fluid
    from pdjit.static import load_inference_model

    for name in NAMES:
        _, spec, mod = artifacts[name]
        shape = [0 if k < 0 else k for k in spec.inputs[0][2]]
        empty = {"x": np.zeros(shape, np.float32)}
        rows = {"x": np.random.default_rng(0).standard_normal([2] + shape[1:]).astype(
            np.float32)}
        exe = fluid.Executor(fluid.CPUPlace(), strict=True)
        with fluid.scope_guard(fluid.Scope()):   # the models' parameters share names
            prog, _, fetches = load_inference_model(str(MODELS / name), exe)
            want, want_rows = [exe.run(prog, feed=f, fetch_list=fetches) for f in (empty, rows)]
        model = mod.load()
        got = model.run(empty)
        assert [(g.shape, g.dtype) for g in got] == [(w.shape, w.dtype) for w in want]
        assert want[0].shape[0] == 0
        _same(name, model.run(rows)[0], want_rows[0], blas_same)


def test_two_instances_in_two_threads(artifacts, jit):
    _, _, mod = artifacts["lenet"]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((b, 1, 28, 28)).astype(np.float32) for b in (1, 5)]
    want = [jit("lenet", {"x": x})[0] for x in xs]
    errors, results = [], [[], []]

    def work(k):
        try:
            model = mod.load(max_batch=1)
            for _ in range(20):
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
        assert len(results[k]) == 20
        assert all(np.array_equal(r, want[k]) for r in results[k])


def test_example_c_builds_and_runs(artifacts):
    d, _, mod = artifacts["lenet"]
    subprocess.run("cc -O2 -I. example.c -L. -lmodel -Wl,-rpath,'$ORIGIN' -o example",
                   shell=True, cwd=d, check=True, capture_output=True)
    r = subprocess.run([str(d / "example")], cwd="/", capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "input x: float32 [2, 1, 28, 28]" in r.stdout
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("output "))
    assert line.startswith("output softmax_0.tmp_0: float32 [2, 10]:")
    first = np.array([float(v) for v in line.split(":")[-1].split()])
    # the same generated inputs through the loader (example.c's formula, in NumPy)
    k = np.arange(2 * 28 * 28, dtype=np.int64)
    x = (((k * 7919) % 2001) / 1000.0 - 1.0).astype(np.float32).reshape(2, 1, 28, 28)
    want = mod.load().run({"x": x})[0].ravel()[:5]
    np.testing.assert_allclose(first, want, rtol=1e-5)
    # inputs from .npy files; a wrong file is an error, not a crash
    x3 = np.random.default_rng(3).standard_normal((3, 1, 28, 28)).astype(np.float32)
    np.save(d / "x3.npy", x3)
    r = subprocess.run([str(d / "example"), str(d / "x3.npy")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("output "))
    assert "[3, 10]" in line
    first = np.array([float(v) for v in line.split(":")[-1].split()])
    np.testing.assert_allclose(first, mod.load().run({"x": x3})[0].ravel()[:5], rtol=1e-5)
    # a batch of no rows: outputs of no rows, as the loader and the JIT give them
    np.save(d / "x0.npy", x3[:0])
    r = subprocess.run([str(d / "example"), str(d / "x0.npy")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "input x: float32 [0, 1, 28, 28]" in r.stdout
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("output "))
    assert line == "output softmax_0.tmp_0: float32 [0, 10]:", line
    assert mod.load().run({"x": x3[:0]})[0].shape == (0, 10)
    np.save(d / "x64.npy", x3.astype(np.float64))
    np.save(d / "bad_shape.npy", x3[:, :, :27])
    for arg, message in (("x64.npy", "run: input 'x': expected dtype float32, got float64"),
                         ("bad_shape.npy", "run: input 'x': dim 2 expected 28, got 27"),
                         ("nope.npy", "nope.npy: cannot open")):
        r = subprocess.run([str(d / "example"), str(d / arg)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode in (1, 2) and message in r.stderr, (arg, r.stderr)


def _numpy_only_venv(tmp_path):
    """A plain virtual environment (no system site packages) holding only NumPy (this
    process's version, installed by pip from the registry or pip's cache); None when it cannot
    be built (no registry)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=60)
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--disable-pip-version-check", f"numpy=={np.__version__}"],
                       capture_output=True, text=True, timeout=120)
    return py if r.returncode == 0 else None


def test_loader_needs_only_numpy(artifacts, tmp_path):
    """The loader in a fresh virtual environment that has only NumPy installed; without a
    registry to install it from, in an isolated interpreter (``-I -S``) whose path holds only
    ``numpy`` and its libraries. Either way no pdjit, Numba or llvmlite can be imported."""
    d, _, _ = artifacts["mlp"]
    py = _numpy_only_venv(tmp_path)
    prefix = ""
    if py is None:
        site = pathlib.Path(np.__file__).parents[1]
        only = tmp_path / "only_numpy"
        only.mkdir()
        for n in ("numpy", "numpy.libs"):
            if (site / n).exists():
                (only / n).symlink_to(site / n)
        py, prefix = sys.executable, f"sys.path[:0] = [{str(only)!r}]\n"
    code = f"""
import sys
{prefix}sys.path.insert(0, {str(d.parent)!r})
import numpy as np
art = __import__({d.name!r})
m = art.load()
out = m.run({{"x": np.ones((2, 16), np.float32)}})
for banned in ("numba", "llvmlite", "pdjit"):
    assert banned not in sys.modules, banned
    try:
        __import__(banned)
    except ImportError:
        pass
    else:
        raise SystemExit(banned + " is importable")
print(m.input_names, m.output_names, out[0].shape, float(out[0].sum()))
"""
    args = [str(py), "-I", "-S", "-c", code] if prefix else [str(py), "-I", "-c", code]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "['x'] ['softmax_0.tmp_0'] (2, 10)" in r.stdout
    assert abs(float(r.stdout.split()[-1]) - 2.0) < 1e-5   # two rows of probabilities


def _refused_model(path):
    """A saved model with an op the route refuses (a random op: it draws from the run's random
    stream, which the artifact has not), written to ``path``; returns ``path``."""
    import pdjit as fluid

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data("x", [4], dtype="float32")
        out = fluid.layers.elementwise_add(x, fluid.layers.gaussian_random([4], seed=0))
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    fluid.io.save_inference_model(str(path), ["x"], [out], exe, main_program=main)
    return str(path)


def test_refuses_naming_the_op(tmp_path):
    from pdjit.aot import AotError, compile_model

    with pytest.raises(AotError, match="op 'gaussian_random'"):
        compile_model(_refused_model(tmp_path / "m"), str(tmp_path / "r"))
    assert not (tmp_path / "r" / "libmodel.so").exists()


def test_built_on_one_thread_whatever_the_process_asked(tmp_path, monkeypatch):
    """A process that asked pdjit for two threads (parallel drivers in its JIT plans) still
    gets one-thread code in the artifact, and keeps its setting."""
    from pdjit.aot import compile_model
    from pdjit.codegen.cpu import threads

    monkeypatch.setattr(threads, "_applied", 2)
    compile_model(str(MODELS / "mlp"), str(tmp_path / "mlp2"))
    assert threads._applied == 2
    model = _import_artifact(tmp_path / "mlp2", "aot_mlp2_artifact").load()
    assert model.run({"x": np.ones((1, 16), np.float32)})[0].shape == (1, 10)


def test_cli_entry(tmp_path):
    from pdjit.aot.__main__ import main

    assert main(["compile", _refused_model(tmp_path / "m"), "-o", str(tmp_path / "x")]) == 2
    with pytest.raises(SystemExit):
        main(["compile", str(MODELS / "mlp"), "-o", str(tmp_path / "x"), "--cpu", "arm"])


def test_c_abi_rejects_null_and_out_of_range(artifacts):
    """The C entry points with what a C caller can get wrong: NULL arrays, indices out of
    range, an output asked for before a run."""
    import ctypes

    d, _, mod = artifacts["mlp"]
    lib = ctypes.CDLL(str(d / "libmodel.so"))
    lib.pdjit_model_create.argtypes = [ctypes.c_char_p, ctypes.c_int64,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                       ctypes.c_size_t]
    lib.pdjit_model_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.pdjit_model_output.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_void_p]
    lib.pdjit_model_error.argtypes = [ctypes.c_void_p]
    lib.pdjit_model_error.restype = ctypes.c_char_p
    lib.pdjit_input_name.restype = ctypes.c_char_p
    lib.pdjit_model_destroy.argtypes = [ctypes.c_void_p]
    assert lib.pdjit_num_inputs() == 1 and lib.pdjit_num_outputs() == 1
    assert lib.pdjit_input_name(0) == b"x" and lib.pdjit_input_name(5) is None
    assert lib.pdjit_input_dtype(-1) == -1
    assert lib.pdjit_model_create(None, 1, None, None, 0) == 1
    h = ctypes.c_void_p()
    assert lib.pdjit_model_create(None, 1, ctypes.byref(h), None, 0) == 0 and h.value
    assert lib.pdjit_model_output(h, 0, None, None) == 1        # no run yet
    assert lib.pdjit_model_run(None, 1, None, None, None, None) == 1
    assert lib.pdjit_model_run(h, 1, None, None, None, None) == 1
    assert b"must not be NULL" in lib.pdjit_model_error(h)
    assert lib.pdjit_model_run(h, 0, None, None, None, None) == 2
    assert lib.pdjit_model_error(None) == b"no model instance"
    assert lib.pdjit_set_blas_threads(0) == 1
    lib.pdjit_model_destroy(h)
    lib.pdjit_model_destroy(None)


#: every model of the corpus the route compiles today (seconds each cold: opt in with
#: PDJIT_AOT_CORPUS=1), and those it refuses, with the op it names
CORPUS = ["mobilenet", "resnet_block", "transformer", "cond_while", "gru", "lstm"]
REFUSED: dict = {}


@pytest.mark.skipif(not os.environ.get("PDJIT_AOT_CORPUS"),
                    reason="the whole corpus ahead of time: set PDJIT_AOT_CORPUS=1")
@pytest.mark.parametrize("name", CORPUS + sorted(REFUSED))
def test_corpus(name, jit, tmp_path):
    """Outputs within 1e-6 relative of the JIT executor (its host drivers may take other
    kernels than the native drivers the artifact is built from) and 1e-5 of Paddle."""
    from pdjit.aot import AotError, compile_model

    if name in REFUSED:
        with pytest.raises(AotError, match=re.escape(REFUSED[name])):
            compile_model(str(MODELS / name), str(tmp_path / name))
        return
    compile_model(str(MODELS / name), str(tmp_path / name))
    model = _import_artifact(tmp_path / name, f"aot_{name}_corpus").load()
    for feed, want in _cases(name):
        ref = jit(name, feed)
        for n, g, r in zip(model.output_names, model.run(feed), ref):
            np.testing.assert_allclose(g, want[n], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6 * float(np.abs(r).max()))
    # the C example on the same inputs (.npy files in input order) prints each output's
    # shape and first values
    d = tmp_path / name
    subprocess.run("cc -O2 -I. example.c -L. -lmodel -Wl,-rpath,'$ORIGIN' -o example",
                   shell=True, cwd=d, check=True, capture_output=True)
    for c, (feed, _) in enumerate(_cases(name)):
        files = []
        for i, n in enumerate(model.input_names):
            files.append(str(d / f"case{c}_in{i}.npy"))
            np.save(files[-1], feed[n])
        r = subprocess.run([str(d / "example"), *files], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        printed = [ln for ln in r.stdout.splitlines() if ln.startswith("output ")]
        assert len(printed) == len(model.output_names), r.stdout
        for line, n, want in zip(printed, model.output_names, jit(name, feed)):
            assert line.startswith(f"output {n}: {want.dtype} {list(want.shape)}:"), line
            first = np.array([float(v) for v in line.split(":")[-1].split()])
            np.testing.assert_allclose(first, want.ravel()[:first.size], rtol=1e-5,
                                       atol=1e-6)


def test_two_inputs_two_outputs_float64_no_parameters(tmp_path):
    """Inputs bound by name in any dict order, outputs in fetch order, float64, a model with
    no parameters at all (an empty parameters file), against NumPy."""
    import pdjit as fluid
    from pdjit.aot import compile_model
    from pdjit.static import save_inference_model

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data("x", [4], dtype="float64")
        y = fluid.layers.data("y", [4], dtype="float64")
        r = fluid.layers.scale(fluid.layers.relu(fluid.layers.elementwise_add(x, y)),
                               scale=2.0, bias=1.0)
        d = fluid.layers.elementwise_sub(x, y)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    save_inference_model(str(tmp_path / "m" / "m"), [x, y], [r, d], exe, program=main)
    spec = compile_model(str(tmp_path / "m" / "m"), str(tmp_path / "two"))
    assert spec.param_names == [] and spec.params_bytes == 0
    model = _import_artifact(tmp_path / "two", "aot_two_artifact").load()
    assert model.input_names == ["x", "y"] and model.output_names == [r.name, d.name]
    assert model.input_dtypes == [np.dtype("float64")] * 2
    assert model.output_shapes == [(-1, 4), (-1, 4)]
    xv = np.arange(12.0).reshape(3, 4) - 5
    yv = np.linspace(-1, 1, 12).reshape(3, 4)
    got = model.run({"y": yv, "x": xv})
    assert [g.dtype for g in got] == [np.dtype("float64")] * 2
    assert np.array_equal(got[0], np.maximum(xv + yv, 0) * 2 + 1)
    assert np.array_equal(got[1], xv - yv)
    with pytest.raises(Exception, match="dim 1 expected 4, got 3"):
        model.run({"x": xv, "y": yv[:, :3]})
    # batches that disagree, one of 0 rows: the native code's check, as below
    with pytest.raises(Exception, match="native code failed") as info:
        model.run({"x": xv, "y": yv[:0]})
    assert info.value.code == 7
    # batches that do not broadcast: the native code's own check fails, a status, no crash
    with pytest.raises(Exception, match="native code failed") as info:
        model.run({"x": xv, "y": yv[:2]})
    assert info.value.code == 7
    assert np.array_equal(model.run({"x": xv, "y": yv})[1], xv - yv)   # still usable
