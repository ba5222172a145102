"""The disk cache of optimized inference models (``pdjit.io.optimized_cache``).

Oracle: the model (fc, then batch norm with running statistics, then relu) written in NumPy
from the values in the scope it was saved from. A Predictor built from a cache entry must give
what one built by the passes gives; a damaged, stale or cleared entry is built again.
"""
import os
import time

import numpy as np
import pytest

import pdjit as fluid
import pdjit.inference as inference
import pdjit.static as static
from pdjit.io import optimized_cache
from pdjit.passes import inference as passes


@pytest.fixture
def model(fresh_programs, tmp_path, monkeypatch):
    """An fc + batch norm + relu model saved with non-trivial statistics, its files dated
    back (a file changed within ``RACY_SECONDS`` is not cached), and a cache directory of
    its own."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    x = fluid.layers.data("x", [6])
    y = fluid.layers.relu(fluid.layers.batch_norm(fluid.layers.fc(x, 5)))
    scope = fluid.Scope()
    rng = np.random.default_rng(3)
    with fluid.scope_guard(scope):
        exe = fluid.Executor()
        exe.run(startup)
        for n in ("batch_norm_0.w_0", "batch_norm_0.b_0", "batch_norm_0.w_1", "fc_0.b_0"):
            scope.find_var(n).value = rng.standard_normal(5).astype("float32")
        scope.find_var("batch_norm_0.w_2").value = rng.uniform(0.5, 2, 5).astype("float32")
        static.save_inference_model(str(tmp_path / "m"), [x], [y], exe,
                                    program=main.clone(for_test=True))
    old = time.time() - 60
    for f in ("m.pdmodel", "m.pdiparams"):
        os.utime(tmp_path / f, (old, old))
    v = {n: np.asarray(scope.find_var(n).value, np.float64) for n in (
        "fc_0.w_0", "fc_0.b_0", "batch_norm_0.w_0", "batch_norm_0.b_0", "batch_norm_0.w_1",
        "batch_norm_0.w_2")}

    def forward(xv):
        t = xv @ v["fc_0.w_0"] + v["fc_0.b_0"]
        t = (t - v["batch_norm_0.w_1"]) / np.sqrt(v["batch_norm_0.w_2"] + 1e-5) * \
            v["batch_norm_0.w_0"] + v["batch_norm_0.b_0"]
        return np.maximum(t, 0)
    forward.values = v
    return tmp_path, forward


def _predictor(d):
    return inference.create_predictor(
        inference.Config(str(d / "m.pdmodel"), str(d / "m.pdiparams")))


def _entries(d):
    folder = d / "cache" / optimized_cache.SUBDIR
    return sorted(folder.glob("*.pdopt")) if folder.exists() else []


def test_a_cache_hit_gives_the_built_predictor_and_skips_the_passes(model, monkeypatch):
    d, forward = model
    xv = np.random.default_rng(0).standard_normal((3, 6)).astype("float32")
    pred = _predictor(d)  # built by the passes, and kept
    (built,) = pred.run([xv])
    np.testing.assert_allclose(built, forward(xv), rtol=1e-5, atol=1e-5)
    assert "batch_norm" not in [op.type for op in pred.program().global_block().ops]
    (entry,) = _entries(d)

    calls = []
    real = passes.optimize
    monkeypatch.setattr(passes, "optimize", lambda *a, **k: calls.append(1) or real(*a, **k))
    hit = _predictor(d)
    (again,) = hit.run([xv])
    assert calls == []  # the optimized model came from the cache
    np.testing.assert_array_equal(again, built)
    assert [op.type for op in hit.program().global_block().ops] == \
        [op.type for op in pred.program().global_block().ops]
    assert hit.get_input_names() == ["x"] and hit.get_output_names() == pred.get_output_names()
    assert hit.program()._is_test
    # stored as the check left it (defaults filled in): not checked again
    assert hit.program().__dict__["_verified_version"] == hit.program().version

    # a damaged entry (a header byte, then a truncated file) is ignored and written again
    for damage in (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], lambda b: b[:-7]):
        entry.write_bytes(damage(entry.read_bytes()))
        (out,) = _predictor(d).run([xv])
        np.testing.assert_array_equal(out, built)
        assert optimized_cache.load(optimized_cache.model_key(
            (d / "m.pdmodel").read_bytes(), str(d), "m.pdiparams",
            [n for n, _ in passes.INFERENCE_PASSES])) is not None
    assert len(calls) == 2

    # other passes, another key, whose entry replaces the model location's older one (one
    # copy of the weights per location); switched off: none read nor kept
    before = _entries(d)
    config = inference.Config(str(d / "m.pdmodel"), str(d / "m.pdiparams"))
    config.delete_pass("fold_batch_norm")
    (out,) = inference.create_predictor(config).run([xv])
    np.testing.assert_allclose(out, forward(xv), rtol=1e-5, atol=1e-5)
    assert len(_entries(d)) == 1 and _entries(d) != before
    config = inference.Config(str(d / "m.pdmodel"), str(d / "m.pdiparams"))
    config.switch_optimized_cache(False)
    assert not config.optimized_cache_enabled()
    inference.create_predictor(config)
    assert len(calls) == 4 and len(_entries(d)) == 1

    # clear_cache() removes every entry
    fluid.clear_cache()
    assert _entries(d) == []


def test_a_changed_parameter_file_is_a_new_entry_checked_while_racy(model):
    d, forward = model
    xv = np.random.default_rng(1).standard_normal((2, 6)).astype("float32")
    _predictor(d).run([xv])
    assert len(_entries(d)) == 1
    # the same size, other values, just now: a new key, and an entry holding the bytes' digest
    params = d / "m.pdiparams"
    good = bytearray(params.read_bytes())
    good[-4:] = np.float32(7.5).tobytes()  # the last value of the last tensor (fc_0.w_0)
    params.write_bytes(bytes(good))
    forward.values["fc_0.w_0"][-1, -1] = 7.5
    (fresh,) = _predictor(d).run([xv])
    np.testing.assert_allclose(fresh, forward(xv), rtol=1e-5, atol=1e-5)
    assert len(_entries(d)) == 1  # (the new entry replaced the old one)
    names = [n for n, _ in passes.INFERENCE_PASSES]
    mk = optimized_cache.model_key((d / "m.pdmodel").read_bytes(), str(d), "m.pdiparams", names)
    assert mk.racy and optimized_cache.load(mk) is not None
    (hit,) = _predictor(d).run([xv])
    np.testing.assert_array_equal(hit, fresh)

    # a write within the same tick of the clock (the times say nothing): the bytes do
    bad = bytearray(good)
    bad[-4:] = np.float32(-1.0).tobytes()
    params.write_bytes(bytes(bad))
    assert optimized_cache.load(mk) is None
    params.write_bytes(bytes(good))
    assert optimized_cache.load(mk) is not None
    # once no longer racy, a match is recorded and the bytes are not read again
    settled = optimized_cache.ModelKey(mk.key, mk.files, False, mk.where)
    assert optimized_cache.load(settled) is not None
    assert list((d / "cache" / optimized_cache.SUBDIR).glob("*.checked"))


def test_entries_are_told_apart_and_a_crafted_one_is_rebuilt(model, tmp_path):
    """A copy of the model in another directory (the same bytes and sizes; a coarse clock
    could give its files the same times) has a key of its own; an entry whose header is
    well formed but not an object, or whose parameters overlap, is no hit; a program with an
    op a user defined is not kept."""
    import shutil

    d, forward = model
    names = [n for n, _ in passes.INFERENCE_PASSES]
    other = tmp_path / "copy"
    other.mkdir()
    for f in ("m.pdmodel", "m.pdiparams"):
        shutil.copy2(d / f, other / f)
    keys = [optimized_cache.model_key((p / "m.pdmodel").read_bytes(), str(p), "m.pdiparams",
                                      names) for p in (d, other)]
    assert keys[0].key != keys[1].key and keys[0].where != keys[1].where
    xv = np.random.default_rng(4).standard_normal((2, 6)).astype("float32")
    (out,) = _predictor(d).run([xv])
    np.testing.assert_allclose(out, forward(xv), rtol=1e-5, atol=1e-5)
    (entry,) = _entries(d)
    blob = entry.read_bytes()
    magic = optimized_cache.MAGIC
    for header in (b"[1, 2]", b"[" * 100000 + b"]" * 100000):
        import hashlib
        import struct

        entry.write_bytes(magic + struct.pack("<Q", len(header)) + header
                          + hashlib.sha256(header).digest() + b"\0" * 64)
        assert optimized_cache.load(keys[0]) is None
    entry.write_bytes(blob)
    assert optimized_cache.load(keys[0]) is not None

    from pdjit.framework import registry

    program = optimized_cache.load(keys[0])[0]
    assert optimized_cache.builtin_only(program)
    op_type = program.global_block().ops[-1].type
    saved = registry.lookup(op_type)
    registry.register_op(op_type, inputs=saved.inputs, outputs=saved.outputs,
                         attrs=saved.attrs, traits=saved.traits, infer_shape=saved.infer_shape,
                         reference=saved.reference, emit=saved.emit, grad=saved.grad,
                         replace=True)
    try:  # a user's definition now: the entry is not served, and none is written
        assert not registry.is_builtin(op_type)
        assert optimized_cache.load(keys[0]) is None
        assert optimized_cache.store(keys[0], program, {}, [], []) is None
    finally:
        registry._REGISTRY[op_type] = saved
        registry._BUILTIN.add(op_type)
        registry._HAVING.clear()


@pytest.fixture
def conv_model(fresh_programs, tmp_path, monkeypatch):
    """A 1x1 convolution (32 -> 48, relu), a 3x3 one (48 -> 40, padded) and an fc, whose
    filters the CPU kernels pack, saved with its files dated back, a cache directory of its
    own, and the model in NumPy."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    x = fluid.layers.data("x", [32, 6, 6])
    y = fluid.layers.conv2d(x, 48, 1, act="relu")
    z = fluid.layers.conv2d(y, 40, 3, padding=1)
    out = fluid.layers.fc(z, 7)
    scope = fluid.Scope()
    with fluid.scope_guard(scope):
        exe = fluid.Executor()
        exe.run(startup)
        static.save_inference_model(str(tmp_path / "m"), [x], [out], exe,
                                    program=main.clone(for_test=True))
        v = {n: np.asarray(scope.find_var(n).value, np.float64) for n in (
            "conv2d_0.w_0", "conv2d_0.b_0", "conv2d_1.w_0", "conv2d_1.b_0", "fc_0.w_0",
            "fc_0.b_0")}
    old = time.time() - 60
    for f in ("m.pdmodel", "m.pdiparams"):
        os.utime(tmp_path / f, (old, old))

    def conv(t, w, b, pad):
        t = np.pad(t, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        kh, kw = w.shape[2:]
        h, wd = t.shape[2] - kh + 1, t.shape[3] - kw + 1
        o = sum(np.einsum("nchw,mc->nmhw", t[:, :, i:i + h, j:j + wd], w[:, :, i, j])
                for i in range(kh) for j in range(kw))
        return o + b[None, :, None, None]

    def forward(xv, w1=None):
        t = np.maximum(conv(xv, v["conv2d_0.w_0"] if w1 is None else w1, v["conv2d_0.b_0"],
                            0), 0)
        t = conv(t, v["conv2d_1.w_0"], v["conv2d_1.b_0"], 1)
        return t.reshape(len(xv), -1) @ v["fc_0.w_0"] + v["fc_0.b_0"]
    forward.values = v
    return tmp_path, forward


def test_the_entries_of_models_from_many_directories_stay_within_a_bound(model, tmp_path,
                                                                         monkeypatch):
    """Models loaded from ever new directories (each a location of its own, whose entries no
    later one replaces) keep at most ``MAX_BYTES`` of entries: after each is written the least
    recently used others go, a load counting as a use; each copy's Predictor still gives the
    model's results, from an entry or made again."""
    import shutil

    d, forward = model
    xv = np.random.default_rng(5).standard_normal((3, 6)).astype("float32")
    (out,) = _predictor(d).run([xv])
    (first,) = _entries(d)
    size = sum(p.stat().st_size for p in first.parent.iterdir() if not p.name.startswith("."))
    monkeypatch.setattr(optimized_cache, "MAX_BYTES", int(2.5 * size))  # (two entries fit)
    copies = []
    for i in range(4):
        c = tmp_path / f"copy{i}"
        c.mkdir()
        for f in ("m.pdmodel", "m.pdiparams"):
            shutil.copy2(d / f, c / f)
        copies.append(c)

    def key(p):
        return optimized_cache.model_key((p / "m.pdmodel").read_bytes(), str(p), "m.pdiparams",
                                         [n for n, _ in passes.INFERENCE_PASSES])

    def where(p):
        return key(p).where

    def held():
        return {e.name.split("-", 1)[0] for e in _entries(d)}

    (got,) = _predictor(copies[0]).run([xv])
    assert held() == {where(d), where(copies[0])}
    time.sleep(0.02)
    assert optimized_cache.load(key(d)) is not None    # d's entry used again
    time.sleep(0.02)
    for i, c in enumerate(copies[1:], 1):
        (got,) = _predictor(c).run([xv])
        np.testing.assert_array_equal(got, out)
        # each write left its own entry and the most recently used other one: copy0's went
        # first (d's was loaded after it was written)
        assert held() == {where(c), where(d) if i == 1 else where(copies[i - 1])}
        time.sleep(0.02)
    total = sum(p.stat().st_size for p in first.parent.iterdir() if not p.name.startswith("."))
    assert total <= optimized_cache.MAX_BYTES
    (again,) = _predictor(d).run([xv])   # gone: made again, the same results
    np.testing.assert_allclose(again, forward(xv), rtol=1e-5, atol=1e-5)
    assert where(d) in held() and len(held()) == 2


def _written():
    """Wait for the threads writing derived values."""
    import threading

    for t in threading.enumerate():
        if t.name == "pdjit-derived-values":
            t.join()


def _derived_of(pred):
    from pdjit.codegen import params

    return {n: params.of(pred._scope.find_var(n).value)
            for n in ("conv2d_0.w_0", "conv2d_1.w_0")}


def test_values_derived_from_the_parameters_are_kept_beside_the_entry(conv_model,
                                                                       monkeypatch):
    """The packed filters a first process made are read by the next (nothing derived
    again, the same outputs); a value derived from an array that replaced a parameter is
    never kept for it; another library stamp or a damaged file: made again, written again."""
    from pdjit.codegen import params

    d, forward = conv_model
    xv = np.random.default_rng(5).standard_normal((4, 32, 6, 6)).astype("float32")
    first = _predictor(d)
    (out,) = first.run([xv])
    np.testing.assert_allclose(out, forward(xv), rtol=1e-4, atol=1e-4)
    made = _derived_of(first)
    assert made["conv2d_0.w_0"] and made["conv2d_1.w_0"]  # (the kernels packed both)
    _written()
    (kept,) = (d / "cache" / optimized_cache.SUBDIR).glob("*-derived.pdvals")

    # a parameter given another array: what is derived from it is not kept for the entry
    w1 = forward.values["conv2d_0.w_0"] * 2
    first._scope.find_var("conv2d_0.w_0").value = w1.astype("float32")
    (doubled,) = first.run([xv])
    np.testing.assert_allclose(doubled, forward(xv, w1), rtol=1e-4, atol=1e-4)
    _written()

    count = params.made()
    second = _predictor(d)
    found = _derived_of(second)  # read from the file before any run
    for name, values in made.items():
        assert found[name].keys() == values.keys()
        for key, value in values.items():
            np.testing.assert_array_equal(found[name][key], value)
    (again,) = second.run([xv])
    np.testing.assert_array_equal(again, out)
    assert params.made() == count  # nothing derived again

    # the library's kernels changed (another stamp): nothing read, all made and written again
    monkeypatch.setattr(optimized_cache, "_library", lambda: "another library")
    third = _predictor(d)
    assert not any(_derived_of(third).values())
    (out3,) = third.run([xv])
    np.testing.assert_array_equal(out3, out)
    assert params.made() > count
    _written()
    assert b'"library":"another library"' in kept.read_bytes()[:4096]
    # a damaged file (cut short) is not read, and is written again
    kept.write_bytes(kept.read_bytes()[:-9])
    fourth = _predictor(d)
    assert not any(_derived_of(fourth).values())
    (out4,) = fourth.run([xv])
    np.testing.assert_array_equal(out4, out)
    _written()
    assert _derived_of(_predictor(d))["conv2d_0.w_0"]
    fluid.clear_cache()
    assert not kept.exists()
