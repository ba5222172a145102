"""A new plan's compile worker compiles the library kernels its host lines will call: the
predicted signatures must be the ones the calls really use (else the worker's work is lost).
The generator predicts them from the library functions the lowerings named
(``LowerContext.lib_fn``); these tests read the calls from the drivers' text, as an oracle."""
import re

import numpy as np

import pdjit as fluid
from pdjit.codegen import compiler
from pdjit.codegen.cpu import lib as nnlib
from pdjit.testing import assert_native


def _trained_lines(main, startup, loss, shape, monkeypatch):
    """The entry points the native steps of ``main`` call after one training step (native
    asserted), read from their drivers' lines; checked to be those whose jobs the generator
    predicted (float32)."""
    from pdjit.codegen import pipeline as pipeline_mod

    predicted = []
    real = pipeline_mod.precompile
    monkeypatch.setattr(pipeline_mod, "precompile",
                        lambda js: (predicted.extend(js), real(js))[1])
    fluid.optimizer.SGD(0.1).minimize(loss)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    exe.run(main, feed={"x": np.random.rand(*shape).astype(np.float32)}, fetch_list=[loss])
    assert_native(exe)
    text = "\n".join(step.compiled.source for _, plan in exe._plans.values()
                     for step in plan.walk() if step.kind.startswith("native"))
    called = list(dict.fromkeys(re.findall(r"_nn\.(\w+(?:\.\w+)*)\(", text)))
    want = {(fn, tuple(t)) for fn, t in nnlib.library_jobs(called, np.float32)}
    got = {(c.fn, tuple(t)) for c, t in predicted if isinstance(c, compiler.LibraryKernel)}
    assert want <= got, want - got
    return called


def _assert_used(jobs):
    """Each predicted signature is one its kernel was compiled for."""
    for fn, types in jobs:
        sig = tuple(compiler._numba_type(t) for t in types)
        assert sig in fn.overloads, (fn.py_func.__name__, sig, list(fn.overloads))


def test_predicted_library_signatures_are_the_ones_the_calls_use(fresh_programs, monkeypatch):
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 8, 8])
    h = fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False)
    h = fluid.layers.batch_norm(h, act="relu")
    # its input gradient: bwd_data's im2col + BLAS + col2im (stride 2; a stride-1 one runs
    # as the forward kernel over dy, which the first convolution compiles)
    h = fluid.layers.conv2d(h, 4, 3, padding=1, stride=2)
    h = fluid.layers.pool2d(h, 3, "max", 1, pool_padding=1)  # the 3x3 max pools' kernel
    h = fluid.layers.pool2d(h, 2, "max", 2)  # the 2x2 one's
    lines = _trained_lines(main, startup, fluid.layers.mean(h), (2, 3, 8, 8), monkeypatch)
    jobs = nnlib.library_jobs(lines, np.float32)
    names = {fn.py_func.__name__ for fn, _ in jobs}
    assert {"_taps_range", "_bwd_data_range", "_bwd_filter_range", "_max33", "_max22",
            "pool2d_bwd", "_stats_k", "_apply_k", "_grad_k"} <= names  # (norm_* run these)
    assert "_fwd_planes" not in names  # (the general pooling kernel: no pool here takes it)
    _assert_used(jobs)
    for fn, types in jobs:
        # and the disk cache knows the signature, so a worker's compilation is found
        sig = tuple(compiler._numba_type(t) for t in types)
        assert compiler._is_cached(compiler.LibraryKernel(fn), sig)
    assert nnlib.library_jobs(lines, np.int64) == []


def test_a_global_average_pool_predicts_its_own_kernels(fresh_programs, monkeypatch):
    """A global average pool's lowering calls the library's whole-plane average and its
    gradient, so the compile jobs name those and not the windows kernels (which a ResNet
    would compile for nothing); the predictions are the signatures the calls use."""
    main, startup = fresh_programs
    # (planes of 8x8: the convolution's filter gradient goes by taps, the kernel its job
    # predicts; smaller planes take the im2col + BLAS one)
    x = fluid.layers.data("x", [3, 8, 8])
    h = fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False)
    h = fluid.layers.pool2d(h, pool_type="avg", global_pooling=True)
    lines = _trained_lines(main, startup, fluid.layers.mean(h), (2, 3, 8, 8), monkeypatch)
    jobs = nnlib.library_jobs(lines, np.float32)
    names = {fn.py_func.__name__ for fn, _ in jobs}
    assert {"_mean_planes", "pool2d_mean_bwd"} <= names
    assert not {"_fwd_planes", "pool2d_bwd"} & names
    _assert_used(jobs)


def test_a_filter_gradient_predicts_the_kernel_its_sizes_take(fresh_programs, monkeypatch):
    """On 4x4 planes a convolution's filter gradient runs by im2col + BLAS (too few outputs
    for the taps kernel): the compile jobs name that kernel and not the taps one, and the
    predicted signatures are the ones the calls use."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 4, 4])
    h = fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False)
    lines = _trained_lines(main, startup, fluid.layers.mean(h), (2, 3, 4, 4), monkeypatch)
    jobs = nnlib.library_jobs(lines, np.float32)
    names = {fn.py_func.__name__ for fn, _ in jobs}
    assert "_bwd_filter_blas" in names and "_bwd_filter_range" not in names
    _assert_used(jobs)


def test_a_blocked_convolution_with_an_epilogue_predicts_its_kernels(fresh_programs,
                                                                     monkeypatch):
    """A convolution computed by blocks of samples with its bias and relu fused (the call of
    ``_nn.conv._fwd_range`` in a host function, not in the driver's lines) declares the
    kernels it runs as compile jobs: the taps kernel (3x3) and the packed GEMM's transposed
    tiles (1x1 of 32 channels on a weight, a plane of 20 pixels: ``_nn.pointwise_range_cols``,
    which names that kernel alone); the predictions are the signatures the calls use, and the
    outputs are NumPy's."""
    from pdjit.codegen import pipeline as pipeline_mod
    from pdjit.codegen.cpu.lib import conv, pgemm, pointwise

    jobs = []
    real = pipeline_mod.precompile
    monkeypatch.setattr(pipeline_mod, "precompile", lambda js: (jobs.extend(js), real(js))[1])
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 5, 4])
    h = fluid.layers.conv2d(x, 32, 3, padding=1, act="relu")
    h = fluid.layers.conv2d(h, 32, 1, act="relu")
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    xv = np.random.default_rng(4).standard_normal((2, 3, 5, 4)).astype(np.float32)
    (got,) = exe.run(main, feed={"x": xv}, fetch_list=[h])
    assert_native(exe)
    scope = fluid.global_scope()
    w0, b0, w1, b1 = (np.asarray(scope.find_var(n).get_tensor()).astype(np.float64) for n in
                      ("conv2d_0.w_0", "conv2d_0.b_0", "conv2d_1.w_0", "conv2d_1.b_0"))
    xp = np.pad(xv.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    a = sum(np.einsum("nchw,mc->nmhw", xp[:, :, i:i + 5, j:j + 4], w0[:, :, i, j])
            for i in range(3) for j in range(3))
    a = np.maximum(a + b0[:, None, None], 0)
    want = np.maximum(np.einsum("nchw,mc->nmhw", a, w1[:, :, 0, 0]) + b1[:, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    lib = [(c.fn, types) for c, types in jobs if isinstance(c, compiler.LibraryKernel)]
    names = {fn.py_func.__name__ for fn, _ in lib}
    assert {"_taps_range", "pointwise_cols"} <= names and "pointwise_rows" not in names, names
    _assert_used([(fn, types) for fn, types in lib
                  if fn in (conv._taps_range, pointwise.pointwise_cols, pgemm.pack_scaled)])


def test_a_stride_1_input_gradient_predicts_the_taps_kernel_alone(fresh_programs,
                                                                  monkeypatch):
    """The input gradient of a stride-1 3x3 convolution whose sizes the lowering knows runs as
    the taps kernel over dy: the lowering calls the entry whose jobs name that kernel alone (no
    ``_bwd_data_range``, ~1 s of compile for nothing), the same function as
    ``conv2d_bwd_data``; the prediction is the signature the call uses."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 8, 8])
    h = fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False)
    h = fluid.layers.conv2d(h, 8, 3, padding=1, bias_attr=False)
    lines = _trained_lines(main, startup, fluid.layers.mean(h), (2, 3, 8, 8), monkeypatch)
    assert "conv2d_bwd_data_by_taps" in lines
    assert nnlib.conv2d_bwd_data_by_taps is nnlib.conv2d_bwd_data
    jobs = nnlib.library_jobs(lines, np.float32)
    names = {fn.py_func.__name__ for fn, _ in jobs}
    assert "_taps_range" in names and "_bwd_data_range" not in names, names
    _assert_used(jobs)


def test_lowerings_name_library_functions_through_lib_fn():
    """No CPU lowering writes ``_nn.<function>`` into its lines itself: named through
    ``ctx.lib_fn``, every call is recorded, so its compile jobs are predicted (docstrings may
    mention the functions)."""
    import ast
    import pathlib

    from pdjit.codegen.cpu import lowerings

    bad = []
    for path in sorted(pathlib.Path(lowerings.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        bad += [f"{path.name}:{n.lineno}" for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                and re.search(r"\b_nn\.\w", n.value)]
    assert not bad, f"library calls written as text (use ctx.lib_fn): {bad}"


def test_every_declared_job_has_types_precompile_knows():
    """Each entry point's jobs give argument types the compile worker can turn into a Numba
    signature (a job it cannot is skipped, and its kernel compiles at its first call)."""
    for dt in (np.float32, np.float64):
        for maker in nnlib.JOBS.values():
            for _, types in maker(np.dtype(dt)):
                tuple(compiler._numba_type(t) for t in types)  # raises on an unknown type


def test_an_embedding_predicts_its_row_kernels(fresh_programs, monkeypatch):
    """An embedding's lookup and its gradient call the row gather and scatter kernels: the
    predicted signatures are the ones the calls use; the gradient step is NumPy's."""
    main, startup = fresh_programs
    ids = fluid.layers.data("ids", [1], dtype="int64")
    e = fluid.layers.embedding(ids, size=[7, 3])
    loss = fluid.layers.mean(fluid.layers.square(e))
    fluid.optimizer.SGD(0.5).minimize(loss)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    scope = fluid.global_scope()
    w0 = np.array(scope.find_var("embedding_0.w_0").get_tensor())
    iv = np.array([[1], [4], [1]], dtype=np.int64)
    exe.run(main, feed={"ids": iv}, fetch_list=[loss])
    assert_native(exe)
    want = w0.copy()
    np.add.at(want, iv[:, 0], -0.5 * 2 * w0[iv[:, 0]] / w0[iv[:, 0]].size)
    np.testing.assert_allclose(np.array(scope.find_var("embedding_0.w_0").get_tensor()), want,
                               rtol=1e-5)
    jobs = nnlib.library_jobs(["take_rows", "scatter_rows"], np.float32)
    assert {fn.py_func.__name__ for fn, _ in jobs} == {"take_rows", "scatter_rows"}
    _assert_used(jobs)
