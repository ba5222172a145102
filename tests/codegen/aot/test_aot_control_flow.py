"""Control flow compiled ahead of time (``pdjit.aot``): ``while`` and ``cond`` sub-blocks run as
native code driven from the artifact's entry.

Two models, each compiled once per module: the corpus's ``cond_while`` (a ``while`` that runs as
one native loop, then ``cond``: two ``conditional_block``s and a ``select_input``) and a model
built here with pdjit's Fluid API whose ``while_loop`` has a ``cond`` in its body (the loop is
driven by the entry itself: evaluate the condition, run the body's steps, repeat) and whose
trip count depends on the input. Oracles: the JIT executor in strict mode (bit-identical: the
artifact is built for this CPU and links the same BLAS), PaddlePaddle's stored outputs, and
NumPy written here for the branch each input takes and the trip count.
"""
import subprocess

import numpy as np
import pytest
from test_aot_models import MODELS, _cases, _import_artifact, pytestmark  # noqa: F401


def _cond_while_numpy(x, params):
    """cond_while's program in NumPy: three iterations of ``x = tanh(x @ w + b)``, then
    ``2x + 0.5`` if ``mean(x) > 0`` else ``relu(x) - 1``; fc and softmax. Returns (the branch
    taken, the probabilities)."""
    w, b = params["create_parameter_0.w_0"], params["create_parameter_1.b_0"]
    for _ in range(3):
        x = np.tanh(x @ w + b)
    taken = bool(x.mean() > 0)
    y = 2 * x + 0.5 if taken else np.maximum(x, 0) - 1
    z = y @ params["fc_0.w_0"] + params["fc_0.b_0"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return taken, e / e.sum(axis=1, keepdims=True)


def _build_nested(path):
    """A ``while_loop`` whose trip count depends on the input (halve-ish ``h`` while its mean
    absolute value exceeds 0.1, at most 12 times), with a ``cond`` in its body (the factor
    depends on the sign of ``sum(h)``), then fc and softmax. Fetches the probabilities and the
    trip count."""
    import pdjit as fluid
    from pdjit import layers as L

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = L.data("x", [4], dtype="float32")
        i = L.fill_constant([1], "int64", 0)
        cap = L.fill_constant([1], "int64", 12)
        thr = L.fill_constant([1], "float32", 0.1)
        zero = L.fill_constant([1], "float32", 0.0)

        def cond(i, h):
            return L.logical_and(L.less_than(i, cap),
                                 L.greater_than(L.reduce_mean(L.abs(h), dim=[0, 1],
                                                              keep_dim=False), thr))

        def body(i, h):
            s = L.reduce_sum(h, dim=[0, 1])
            h2 = L.cond(L.greater_than(s, zero), lambda: L.scale(h, 0.5),
                        lambda: L.scale(h, 0.75))
            return [L.increment(i, in_place=False), h2]

        n, h = L.while_loop(cond, body, [i, x])
        out = L.softmax(L.fc(h, 3))
        merged = _merges(x)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    fluid.io.save_inference_model(str(path), ["x"], [out, n, merged], exe, main_program=main)
    return main


def _merges(x):
    """``select_output`` then ``select_input`` by ``sum(x) > 0`` (each output of the first is
    written only on its side), a ``conditional_block`` on a non-scalar condition (runs when
    ``x`` is non-empty) and one that overwrites a value only when ``sum(x) > 0``:
    :func:`_merged_numpy` (``x`` as the loop left it). Above ``sum(x) > 1e4`` the second mask
    picks the output that ``select_output`` did not write: an error."""
    from pdjit import layers as L
    from pdjit.layers.control_flow import ConditionalBlock, select_input
    from pdjit.layers.layer_helper import LayerHelper

    block = x.block
    s = L.reduce_sum(x, dim=[0, 1])
    mask = L.cast(L.greater_than(s, L.fill_constant([1], "float32", 0.0)), "int32")
    huge = L.cast(L.greater_than(s, L.fill_constant([1], "float32", 1e4)), "int32")
    outs = [block.create_var(dtype=x.dtype, shape=x.shape) for _ in range(2)]
    LayerHelper("select_output").append_op("select_output", inputs={"X": [x], "Mask": [mask]},
                                           outputs={"Out": outs})
    y = select_input(outs, L.elementwise_sub(mask, huge))
    z = block.create_var(dtype=x.dtype, shape=x.shape)
    cb = ConditionalBlock([x], is_scalar_condition=False)
    with cb.block():
        L.assign(L.scale(x, 3.0, bias=1.0), z)
    w = L.scale(x, 1.0, bias=0.5)   # overwritten only when sum(x) > 0: else it keeps x + 0.5
    with ConditionalBlock([L.cast(mask, "bool")], is_scalar_condition=True).block():
        L.assign(L.scale(x, -1.0), w)
    return L.elementwise_add(L.elementwise_add(L.scale(y, 2.0), z), w)


def _nested_numpy(x, params):
    """The nested model in NumPy: (trip count, the sign of each iteration's sum, output, the
    loop's final ``h``: ``while_loop`` writes it into ``x``, which the merges read after)."""
    h, n, signs = x.astype(np.float32), 0, []
    while n < 12 and np.abs(h).mean() > np.float32(0.1):
        positive = bool(h.sum() > 0)
        signs.append(positive)
        h = h * np.float32(0.5 if positive else 0.75)
        n += 1
    (w,) = [v for k, v in params.items() if v.ndim == 2]
    (b,) = [v for k, v in params.items() if v.ndim == 1]
    z = h @ w + b
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return n, signs, e / e.sum(axis=1, keepdims=True), h


def _merged_numpy(h):
    """``2y + z + w`` of :func:`_merges`: ``y = h``, ``z = 3h + 1``, ``w = -h`` when
    ``sum(h) > 0`` else ``h + 0.5``."""
    w = -h if h.sum() > 0 else h + np.float32(0.5)
    return 2 * h + (3 * h + 1) + w


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: (artifact dir, loaded model module, the model's parameters)} for both models."""
    from pdjit.aot import compile_model
    from pdjit.io.inference_model import load_model

    out = {}
    d = tmp_path_factory.mktemp("aot_cond_while")
    compile_model(str(MODELS / "cond_while"), str(d), batch=2)
    out["cond_while"] = (d, _import_artifact(d, "aot_cond_while_artifact"),
                         load_model(str(MODELS / "cond_while")).params, str(MODELS / "cond_while"))
    src = tmp_path_factory.mktemp("nested_model") / "m"
    _build_nested(src)
    d = tmp_path_factory.mktemp("aot_nested")
    compile_model(str(src), str(d), batch=2)
    out["nested"] = (d, _import_artifact(d, "aot_nested_artifact"), load_model(str(src)).params,
                     str(src))
    return out


@pytest.fixture(scope="module")
def jit(built):
    """``run(name, feed) -> outputs`` through the JIT executor, strict (a native step that falls
    back to the references fails)."""
    import pdjit as fluid
    from pdjit.io.inference_model import load_inference_model as load_dir
    from pdjit.static import load_inference_model

    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    loaded = {}
    for name, (_, _, _, where) in built.items():   # a scope each: their parameters' names clash
        scope = fluid.Scope()
        load = load_dir if name == "nested" else load_inference_model
        loaded[name] = (load(where, exe, scope=scope), scope)

    def run(name, feed):
        (prog, _, fetches), scope = loaded[name]
        return exe.run(prog, feed=feed, fetch_list=fetches, scope=scope)
    return run


def test_libraries_need_no_python_or_numba(built):
    """The control flow is in the native library: nothing in it calls back into Python or
    Numba's runtime."""
    for d, _, _, _ in built.values():
        out = subprocess.run(["nm", "-D", "--undefined-only", str(d / "libmodel.so")],
                             capture_output=True, text=True, check=True).stdout
        names = [line.split()[-1] for line in out.splitlines() if line.strip()]
        assert not [n for n in names if n.startswith(("Py", "_Py", "numba_", "NRT_"))], names


def test_cond_while_equals_jit_paddle_and_numpy(built, jit):
    _, mod, params, _ = built["cond_while"]
    model = mod.load()
    taken = set()
    for feed, want in _cases("cond_while"):   # Paddle's inputs take both branches
        (got,) = model.run(feed)
        (ref,) = jit("cond_while", feed)
        branch, np_out = _cond_while_numpy(feed["x"], params)
        taken.add(branch)
        assert np.array_equal(got, ref)
        np.testing.assert_allclose(got, want["softmax_0.tmp_0"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, np_out, rtol=1e-5, atol=1e-6)
    assert taken == {True, False}
    rng = np.random.default_rng(0)
    for batch in (1, 7, 64):   # 64: larger than the arena was sized for
        taken = {}   # the first random input that takes each branch (by the NumPy oracle)
        while len(taken) < 2:
            x = (rng.standard_normal((batch, 4)) * 2).astype(np.float32)
            taken.setdefault(_cond_while_numpy(x, params)[0], x)
        for branch, x in taken.items():
            (got,) = model.run({"x": x})
            (ref,) = jit("cond_while", {"x": x})
            assert got.shape == (batch, 3) and np.array_equal(got, ref), (batch, branch)
            np.testing.assert_allclose(got, _cond_while_numpy(x, params)[1], rtol=1e-5,
                                       atol=1e-6)


def _nested_inputs():
    """Inputs with different trip counts and branch sequences (checked against NumPy)."""
    rng = np.random.default_rng(5)
    xs = [np.full((1, 4), 0.05, np.float32),                      # no iteration at all
          np.full((2, 4), 0.3, np.float32),                       # positive sums only
          np.full((3, 4), -0.3, np.float32),                      # negative sums only
          np.array([[4.0, -3.0, 0.5, -1.6]], np.float32),         # both, switching
          rng.standard_normal((5, 4)).astype(np.float32) * 8,     # hits the cap of 12
          rng.standard_normal((64, 4)).astype(np.float32)]
    return xs


def test_nested_while_cond_equals_jit_and_numpy(built, jit):
    _, mod, params, _ = built["nested"]
    model = mod.load()
    assert model.output_dtypes[1] == np.dtype("int64")
    trips, seen = set(), set()
    for x in _nested_inputs():
        got = model.run({"x": x})
        ref = jit("nested", {"x": x})
        n, signs, np_out, h = _nested_numpy(x, params)
        trips.add(n)
        seen.update(signs)
        assert int(got[1].reshape(-1)[0]) == n
        for g, r in zip(got, ref):
            assert g.dtype == r.dtype and np.array_equal(g, r), (x.shape, n)
        np.testing.assert_allclose(got[0], np_out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2], _merged_numpy(h), rtol=1e-6, atol=1e-6)
    assert {0, 12} <= trips and len(trips) >= 4 and seen == {True, False}


def test_example_c_takes_each_branch(built, jit):
    """``example.c`` built with the issue's command runs both artifacts on ``.npy`` inputs that
    take each branch; its printed values are the JIT's."""
    for name, xs in (("cond_while", [c[0]["x"] for c in _cases("cond_while")]),
                     ("nested", _nested_inputs()[:4])):
        d, _, _, _ = built[name]
        subprocess.run("cc -O2 -I. example.c -L. -lmodel -Wl,-rpath,'$ORIGIN' -o example",
                       shell=True, cwd=d, check=True, capture_output=True)
        r = subprocess.run([str(d / "example")], cwd="/", capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        for k, x in enumerate(xs):
            path = d / f"x{k}.npy"
            np.save(path, x)
            r = subprocess.run([str(d / "example"), str(path)], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, (name, k, r.stderr)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("output ")]
            ref = jit(name, {"x": x})
            assert len(lines) == len(ref)
            for line, want in zip(lines, ref):
                assert f"[{', '.join(str(s) for s in want.shape)}]" in line, line
                first = np.array([float(v) for v in line.split(":")[-1].split()])
                np.testing.assert_allclose(first, want.ravel()[:first.size], rtol=1e-5)


def test_bad_inputs_still_errors(built, jit):
    """A wrong input through the loader of a control-flow artifact, and an input for which the
    model selects a value no branch wrote: errors, and the instance keeps working."""
    _, mod, params, _ = built["nested"]
    model = mod.load()
    with pytest.raises(mod.ModelError, match="dim 1 expected 4, got 3"):
        model.run({"x": np.ones((2, 3), np.float32)})
    assert model.run({"x": np.full((2, 4), 0.3, np.float32)})[1].reshape(-1)[0] == 2
    # select_input picks a value select_output did not write: the native code's own check
    huge = np.full((1, 4), 1e8, np.float32)   # 12 trips leave each 24414: the sum is > 1e4
    with pytest.raises(mod.ModelError, match="native code failed") as info:
        model.run({"x": huge})
    assert info.value.code == 7
    with pytest.raises(Exception, match="holds no value"):   # the JIT says which value
        jit("nested", {"x": huge})
    x = np.full((2, 4), -0.3, np.float32)   # still usable
    h = _nested_numpy(x, params)[3]
    np.testing.assert_allclose(model.run({"x": x})[2], _merged_numpy(h), rtol=1e-6)


def test_driven_loop_stops_at_the_iteration_bound(tmp_path, monkeypatch):
    """A loop the entry drives counts its iterations: built with PDJIT_MAX_LOOP_ITERATIONS=3,
    the nested model runs an input that needs 2 trips and fails (the native code's error,
    the instance still usable) on one that needs 12."""
    from pdjit.aot import compile_model

    src = tmp_path / "m"
    _build_nested(src)
    monkeypatch.setenv("PDJIT_MAX_LOOP_ITERATIONS", "3")
    compile_model(str(src), str(tmp_path / "out"), batch=2)
    mod = _import_artifact(tmp_path / "out", "aot_bounded_artifact")
    model = mod.load()
    assert model.run({"x": np.full((2, 4), 0.3, np.float32)})[1].reshape(-1)[0] == 2
    with pytest.raises(mod.ModelError, match=r"native code failed: .*op while \(#\d+, block "
                                             r"0\): the loop still holds its condition after 3 "
                                             r"iterations, the bound PDJIT_MAX_LOOP_ITERATIONS=3"):
        model.run({"x": np.full((2, 4), 1e3, np.float32)})   # 12 trips wanted
    assert model.run({"x": np.full((2, 4), 0.3, np.float32)})[1].reshape(-1)[0] == 2


def test_still_refused_op_is_named(tmp_path):
    """An op in a branch that has no ahead-of-time code keeps the refusal naming it, and the
    block and control-flow op it sits in."""
    import pdjit as fluid
    from pdjit import layers as L
    from pdjit.aot import AotError, compile_model

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = L.data("x", [4], dtype="float32")
        pred = L.greater_than(L.reduce_sum(x, dim=[0, 1]), L.fill_constant([1], "float32", 0))
        out = L.cond(pred, lambda: L.elementwise_add(x, L.gaussian_random([4], seed=0)),
                     lambda: L.scale(x, 2.0))
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    fluid.io.save_inference_model(str(tmp_path / "m"), ["x"], [out], exe, main_program=main)
    with pytest.raises(AotError, match=r"op 'gaussian_random'.*in block \d+ of op "
                                       r"'conditional_block'"):
        compile_model(str(tmp_path / "m"), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "libmodel.so").exists()
    # a scalar condition that is not bool (the JIT's reference refuses it when it runs)
    from pdjit.layers.control_flow import ConditionalBlock

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = L.data("x", [4], dtype="float32")
        z = x.block.create_var(dtype=x.dtype, shape=x.shape)
        with ConditionalBlock([L.reduce_sum(x, dim=[0, 1])], is_scalar_condition=True).block():
            L.assign(L.scale(x, 2.0), z)
        out = L.scale(z, 1.0)
    fluid.io.save_inference_model(str(tmp_path / "f"), ["x"], [out], exe, main_program=main)
    with pytest.raises(AotError, match="op 'conditional_block'.* must be bool, got float32"):
        compile_model(str(tmp_path / "f"), str(tmp_path / "out"))


def test_the_plans_have_control_flow_and_only_native_code(built):
    """What the artifact is built from: cond_while's loop is one native function, its branches'
    plans are native steps, and the nested model's loop is driven (a body with a ``cond``)."""
    from pdjit.codegen.aot import entry
    from pdjit.io.inference_model import load_model
    from pdjit.passes.inference import optimize

    def plans(where):
        m = load_model(where)
        program, _ = optimize(m.program, m.params)
        return entry.build_plans(program, m.fetch_names)

    def kinds(plan):
        return [(s.kind, s.op.type if s.kind == "reference" else s.ops[0][0].type)
                for s in plan.steps]

    plan = plans(built["cond_while"][3])
    kinds, of = kinds(plan), kinds
    assert ("native_loop", "while") in kinds
    assert kinds.count(("reference", "conditional_block")) == 2
    assert ("reference", "select_input") in kinds
    subs = [sub for s in plan.steps if s.kind == "reference" for _, sub in plan.sub_plans(s)]
    assert len(subs) == 2 and all(t.kind == "native" and t.native is not None
                                  for sub in subs for t in sub.steps)
    assert all(entry.refuse_step(plan, s) is None for s in plan.steps)
    nested = plans(built["nested"][3])
    (loop,) = [s for s in nested.steps if s.kind == "reference" and s.op.type == "while"]
    (body,) = [sub for _, sub in nested.sub_plans(loop)]
    assert ("reference", "conditional_block") in of(body) and "native" in dict(of(body))
    assert ("reference", "select_output") in of(nested)
    assert all(entry.refuse_step(nested, s) is None for s in nested.steps)

    # a compile error's line names the group it is in: the native loop's body, a branch's
    # native driver (the group read here from each module's "# group" comments)
    (loop,) = [s for s in plan.steps if s.kind == "native_loop"]
    for code in (loop.compiled, subs[0].steps[0].native):
        lines = code.text.splitlines()
        comments = [k for k, line in enumerate(lines) if line.strip().startswith("# group ")]
        assert comments
        for at in comments:   # the line after each group's comment (1-based: at + 2)
            ops = lines[at].split("[", 1)[1].split("]", 1)[0]
            err = ValueError(f'Cannot type x\nFile "/cache/{code.name}.py", line {at + 2}:')
            assert entry.culprit(plan, err) == \
                f"op(s) [{ops}] have no code Numba compiles without Python (Cannot type x)"
    assert entry.culprit(plan, ValueError("x")).startswith("Numba could not compile")
    assert not any(s.native.parallel for sub in subs for s in sub.steps)  # (one thread)
