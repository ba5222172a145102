"""A user's review of ``pdjit compile``: a model saved with ``fluid.io.save_inference_model``
(two inputs of different dtypes, float32/int64/bool outputs), compiled by the command line
with two threads, used from Python and from a C program of its own, and abused.

Oracles: the JIT executor in strict mode on the same saved model (every step native), the
model's own declared shapes, and the errors a user must be able to read (what is wrong,
expected vs got). One build for the module (the two-input model); the LoD and file-output
refusals stop before any code is compiled.
"""
import contextlib
import io
import os
import shutil
import subprocess
import threading
import time
import warnings

import numpy as np
import pytest
from test_aot_models import _import_artifact

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'"),
              pytest.mark.xdist_group("aot")]


def _save(path, build):
    import pdjit as fluid

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        feeds, fetches = build(fluid)
    exe = fluid.Executor(fluid.CPUPlace())
    with fluid.scope_guard(fluid.Scope()):
        exe.run(startup)
        fluid.io.save_inference_model(str(path), feeds, fetches, exe, main_program=main)
    return str(path)


def _two_inputs(fluid):
    """x float32 [4] and ids int64 [3] (an embedding of 10 rows), an fc over both; outputs the
    fc (float32), its sign (bool) and its value x10 as int64."""
    x = fluid.layers.data("x", [4], dtype="float32")
    ids = fluid.layers.data("ids", [3], dtype="int64")
    e = fluid.layers.reduce_sum(fluid.layers.embedding(ids, size=[10, 4]), dim=1)
    h = fluid.layers.fc(fluid.layers.concat([x, e], axis=1), 3)
    pos = fluid.layers.greater_than(h, fluid.layers.zeros_like(h))
    r = fluid.layers.cast(fluid.layers.scale(h, 10.0), "int64")
    return ["x", "ids"], [h, pos, r]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from pdjit.aot.__main__ import main

    d = tmp_path_factory.mktemp("review")
    model = _save(d / "two", _two_inputs)
    out = d / "art"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["compile", model, "-o", str(out), "--threads", "2"]) == 0
    return model, out, buf.getvalue(), _import_artifact(out, "review_artifact")


def _feed(rng, b, vocab=10):
    return {"x": rng.standard_normal((b, 4)).astype(np.float32),
            "ids": rng.integers(0, vocab, (b, 3)).astype(np.int64)}


def test_outputs_equal_jit_bit_for_bit_inputs_untouched(built):
    import pdjit as fluid

    model, _, printed, mod = built
    assert "threads: 2: a run splits its batch" in printed
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    with fluid.scope_guard(fluid.Scope()):
        prog, _, fetches = fluid.io.load_inference_model(model, exe)
        m, rng = mod.load(), np.random.default_rng(0)
        assert m.input_dtypes == [np.dtype("float32"), np.dtype("int64")]
        assert m.output_dtypes == [np.dtype("float32"), np.dtype("bool"), np.dtype("int64")]
        for b in (1, 5):
            feed = _feed(rng, b)
            want = exe.run(prog, feed=feed, fetch_list=fetches)
            # a read-only, Fortran-ordered x: taken as its values, and left as it was
            x = np.asfortranarray(feed["x"])
            x.setflags(write=False)
            keep = x.copy()
            got = m.run({"x": x, "ids": feed["ids"]})
            assert np.array_equal(x, keep)
            for w, g in zip(want, got):
                assert g.dtype == np.asarray(w).dtype and np.array_equal(g, w)


def test_native_failure_says_what_went_wrong(built):
    """An id outside the embedding and inputs that disagree on the batch fail in native code;
    the error carries the exception's type and message (was: "status 1", nothing more), and
    the instance works after it."""
    _, _, _, mod = built
    m = mod.load()
    rng = np.random.default_rng(1)
    feed = _feed(rng, 3)
    ok = m.run(feed)
    for ids in (np.array([[0, 1, 10]] * 3), np.array([[0, -1, 2]] * 3)):
        with pytest.raises(mod.ModelError) as info:
            m.run({"x": feed["x"], "ids": ids})
        assert info.value.code == 7 and "IndexError" in str(info.value), info.value
        assert "out of range" in str(info.value)
    big = _feed(rng, 8)   # split across the 2 threads: a failed slice, then one thread
    big["ids"][6, 1] = 99
    assert m.threads_used == "batch" and m.threads == 2
    with pytest.raises(mod.ModelError, match="IndexError: .*out of range"):
        m.run(big)
    with pytest.raises(mod.ModelError) as info:
        m.run({"x": feed["x"], "ids": feed["ids"][:2]})
    assert info.value.code == 7 and "ValueError" in str(info.value), info.value
    assert all(np.array_equal(a, b) for a, b in zip(m.run(feed), ok))


def test_loader_messages_and_closed_instance(built):
    _, _, _, mod = built
    m = mod.load()
    feed = _feed(np.random.default_rng(2), 2)
    with pytest.raises(mod.ModelError, match=r"input 'x': expected dtype float32, got "
                                             r"unknown dtype '>f4'"):
        m.run({"x": feed["x"].astype(">f4"), "ids": feed["ids"]})
    for bad in (2 ** 70, 2.5, "3", True):
        with pytest.raises(mod.ModelError, match="max_batch: expected an int"):
            mod.load(max_batch=bad)
    with pytest.raises(mod.ModelError, match="threads: expected 1 to 64, got 100000000000"):
        m.set_threads(10 ** 11)
    m.close()
    m.close()
    for call in (lambda: m.run(feed), m.memory, lambda: m.set_threads(1)):
        with pytest.raises(mod.ModelError, match="the model was closed"):
            call()


def test_one_instance_shared_by_threads_waits(built):
    """Calls on one instance from several Python threads run one at a time (the C instance
    is not reentrant; without the loader's lock concurrent runs on it gave wrong outputs)."""
    _, _, _, mod = built
    m = mod.load()
    rng = np.random.default_rng(3)
    feeds = [_feed(rng, b) for b in (1, 6, 33)]
    want = [m.run(f) for f in feeds]
    started, done = threading.Event(), threading.Event()

    def one():
        started.set()
        m.run(feeds[0])
        done.set()

    with m._lock:   # a run in progress: another thread's call waits for it
        t = threading.Thread(target=one)
        t.start()
        started.wait(10)
        time.sleep(0.05)
        assert not done.is_set()
    t.join(10)
    assert done.is_set()
    bad = []

    def work(k):
        for i in range(60):
            j = (i + k) % 3
            if not all(np.array_equal(a, b) for a, b in zip(m.run(feeds[j]), want[j])):
                bad.append((k, i))

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not bad


C_PROGRAM = r"""
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "model.h"

static int fails = 0;
#define CHECK(c) do { if (!(c)) { printf("FAIL %d: %s\n", __LINE__, #c); fails++; } } while (0)

static float X[6 * 4];
static int64_t IDS[6 * 3];
static float REF[6 * 3];

static int run(pdjit_model *m, int64_t b, const int64_t *ids) {
    int64_t sx[2] = {b, 4}, si[2] = {b, 3};
    const int64_t *shapes[2] = {sx, si};
    const void *data[2] = {X, ids};
    int dt[2] = {PDJIT_FLOAT32, PDJIT_INT64}, nd[2] = {2, 2};
    return pdjit_model_run(m, 2, data, dt, nd, shapes);
}

static void *worker(void *arg) {
    (void)arg;
    pdjit_model *m = NULL;
    long bad = 0;
    if (pdjit_model_create(NULL, 6, &m, NULL, 0) != PDJIT_OK) return (void *)1;
    for (int it = 0; it < 100; it++) {
        const void *o;
        const int64_t *s;
        if (run(m, 6, IDS) != PDJIT_OK || pdjit_model_output(m, 0, &o, &s) != PDJIT_OK ||
                s[0] != 6 || memcmp(o, REF, sizeof REF) != 0)
            bad++;
    }
    pdjit_model_destroy(m);
    return (void *)bad;
}

int main(void) {
    char err[256];
    pdjit_model *m = NULL;
    for (int i = 0; i < 24; i++) X[i] = (float)(i %% 7) / 7.0f - 0.5f;
    for (int i = 0; i < 18; i++) IDS[i] = i %% 10;
    CHECK(pdjit_num_inputs() == 2 && pdjit_num_outputs() == 3);
    CHECK(strcmp(pdjit_input_name(1), "ids") == 0 && pdjit_input_dtype(1) == PDJIT_INT64);
    CHECK(pdjit_input_ndim(0) == 2 && pdjit_input_shape(0)[0] == -1 &&
          pdjit_input_shape(0)[1] == 4);
    CHECK(pdjit_output_dtype(1) == PDJIT_BOOL && pdjit_output_dtype(2) == PDJIT_INT64);
    CHECK(pdjit_output_name(3) == NULL && pdjit_input_shape(-1) == NULL);
    CHECK(pdjit_model_create(NULL, 1, NULL, err, sizeof err) == PDJIT_ERR_ARGS);
    CHECK(pdjit_model_create("/nonexistent/p", 1, &m, err, sizeof err) == PDJIT_ERR_PARAMS &&
          m == NULL && strstr(err, "/nonexistent/p: cannot open") != NULL);
    CHECK(pdjit_model_create("/nonexistent/p", 1, &m, NULL, 0) == PDJIT_ERR_PARAMS);
    /* a max_batch whose inputs' sizes overflow: an error naming the input, no crash */
    CHECK(pdjit_model_create(NULL, (int64_t)1 << 62, &m, err, sizeof err) ==
          PDJIT_ERR_MEMORY && strstr(err, "out of memory for input 'x'") != NULL);
    printf("huge: %%s\n", err);
    CHECK(pdjit_model_create(NULL, 2, &m, err, sizeof err) == PDJIT_OK);
    int64_t bad_ids[3] = {0, 1, 12};
    CHECK(run(m, 1, bad_ids) == PDJIT_ERR_NATIVE);
    printf("native: %%s\n", pdjit_model_error(m));
    CHECK(strstr(pdjit_model_error(m), "IndexError") != NULL);
    const void *o;
    const int64_t *s;
    CHECK(pdjit_model_output(m, 0, &o, &s) == PDJIT_ERR_ARGS);   /* after a failed run */
    CHECK(run(m, 6, IDS) == PDJIT_OK);                           /* usable after it */
    CHECK(pdjit_model_output(m, 0, &o, &s) == PDJIT_OK && s[0] == 6 && s[1] == 3);
    memcpy(REF, o, sizeof REF);
    CHECK(pdjit_model_output(m, 1, &o, &s) == PDJIT_OK);
    for (int k = 0; k < 18; k++) CHECK(((const unsigned char *)o)[k] == (REF[k] > 0));
    int dt[2] = {PDJIT_FLOAT32, PDJIT_INT32}, nd[2] = {2, 2};
    int64_t sx[2] = {1, 4}, si[2] = {1, 3};
    const int64_t *shapes[2] = {sx, si};
    const void *data[2] = {X, IDS};
    CHECK(pdjit_model_run(m, 2, data, dt, nd, shapes) == PDJIT_ERR_DTYPE &&
          strcmp(pdjit_model_error(m), "input 'ids': expected dtype int64, got int32") == 0);
    CHECK(pdjit_model_run(m, 1, data, dt, nd, shapes) == PDJIT_ERR_COUNT);
    CHECK(pdjit_model_run(m, 2, NULL, dt, nd, shapes) == PDJIT_ERR_ARGS);
    CHECK(pdjit_model_memory(m, NULL, NULL) == PDJIT_OK);
    pdjit_model_destroy(m);
    pdjit_model_destroy(NULL);
    pthread_t t[6];
    for (int k = 0; k < 6; k++) CHECK(pthread_create(&t[k], NULL, worker, NULL) == 0);
    for (int k = 0; k < 6; k++) {
        void *b;
        pthread_join(t[k], &b);
        CHECK(b == NULL);
    }
    printf("%%s\n", fails ? "FAILED" : "OK");
    return fails != 0;
}
"""


def test_c_program_of_its_own_and_example(built):
    """A C program against ``model.h``: queries, create errors (a max_batch that overflows),
    a run the native code refuses (with the exception's message), the instance after it,
    dtype/count/NULL errors, six threads with an instance each (2 slice threads each); and
    ``example.c``, which prints the bool and int64 outputs' first values too."""
    _, out, _, mod = built
    (out / "review.c").write_text(C_PROGRAM.replace("%%", "%"))
    subprocess.run("cc -O2 -Wall -Werror -I. review.c -L. -lmodel -lpthread "
                   "-Wl,-rpath,'$ORIGIN' -o review", shell=True, cwd=out, check=True,
                   capture_output=True, timeout=60)
    r = subprocess.run([str(out / "review")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout + r.stderr
    # the outputs the C program's threads compared against are the loader's
    subprocess.run("cc -O2 -I. example.c -L. -lmodel -Wl,-rpath,'$ORIGIN' -o example",
                   shell=True, cwd=out, check=True, capture_output=True, timeout=60)
    r = subprocess.run([str(out / "example")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = {ln.split(":")[0]: ln for ln in r.stdout.splitlines() if ln.startswith("output ")}
    m = mod.load()
    x = ((np.arange(8) * 7919) % 2001 / 1000.0 - 1.0).astype(np.float32).reshape(2, 4)
    ids = np.array([[0, 1, 0], [1, 0, 1]], np.int64)   # what example.c generates (k % 2)
    want = m.run({"x": x, "ids": ids})
    for name, w in zip(m.output_names, want):
        got = lines[f"output {name}"].split(":")[-1].split()
        assert len(got) == 5, lines
        assert np.allclose(np.array(got, float), w.ravel()[:5].astype(float), rtol=1e-5,
                           atol=1e-6), (name, got, w.ravel()[:5])


def test_cli_refusals_name_the_input_and_the_path(tmp_path, capsys):
    from pdjit.aot import AotError, compile_model
    from pdjit.aot.__main__ import main

    def lod(fluid):
        x = fluid.layers.data("x", [4], dtype="float32", lod_level=1)
        return ["x"], [fluid.layers.sequence_pool(fluid.layers.fc(x, 3), "sum")]

    model = _save(tmp_path / "lod", lod)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing but the refusal
        assert main(["compile", model, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "input 'x' is a LoD tensor (lod_level 1)" in err, err
    (tmp_path / "afile").write_text("")
    with pytest.raises(AotError, match="output '.*afile': expected a directory, got a file"):
        compile_model(model, str(tmp_path / "afile"))
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    help_text = capsys.readouterr().out
    assert "libmodel.so" in help_text and "example.c" in help_text


def test_rank_above_eight_refused_by_name(tmp_path):
    from pdjit.aot import AotError, compile_model

    def deep(fluid):
        x = fluid.layers.data("x", [1] * 8, dtype="float32")
        return ["x"], [fluid.layers.relu(x)]

    with pytest.raises(AotError, match="input 'x': rank 9 is not supported"):
        compile_model(_save(tmp_path / "deep", deep), str(tmp_path / "o"))
    assert not os.path.exists(tmp_path / "o" / "libmodel.so")


def test_training_mode_dropout_0d_input_and_a_loop_that_never_ends_on_zeros(tmp_path):
    """``h = |dropout(fc(x)) * t|; while sum(h) < 100: h = 2 h`` with ``t`` a 0-d input, saved
    with the dropout in training mode (``is_test`` set back to False in the saved program).

    - the inference passes make the dropout a scale by 1 - p, as the predictor runs it; the
      command line now says so (it was silent: the artifact was deterministic where
      ``Executor.run`` on the same file draws a mask);
    - on the zeros creation ran the model on to size its memory the loop never ends, and
      ``load()`` hung: a model with a loop is not run at creation now (its first runs size the
      memory);
    - the loader passes a 0-d array or a NumPy scalar as rank 0 (it made them rank 1, refused).

    The artifact runs in a subprocess with a timeout (a hang fails the test, not the suite).
    Oracle: NumPy on the saved parameters, the loop in NumPy."""
    import json
    import sys

    import pdjit as fluid
    from pdjit.aot.__main__ import main
    from pdjit.io.inference_model import load_model

    def model(fluid):
        x = fluid.layers.data("x", [4], dtype="float32")
        t = fluid.layers.data("t", [], dtype="float32", append_batch_size=False)
        h0 = fluid.layers.abs(fluid.layers.elementwise_mul(
            fluid.layers.dropout(fluid.layers.fc(x, 3), 0.25), t))
        lim = fluid.layers.fill_constant([1], "float32", 100.0)
        (h,) = fluid.layers.while_loop(
            lambda h: fluid.layers.less_than(fluid.layers.reduce_sum(h), lim),
            lambda h: [fluid.layers.scale(h, 2.0)], [h0])
        return ["x", "t"], [h]

    path = _save(tmp_path / "m", model)
    prog = fluid.Program.parse_from_string(open(os.path.join(path, "__model__"), "rb").read())
    drops = [i for i, op in enumerate(prog.global_block().ops) if op.type == "dropout"]
    for i in drops:
        prog.global_block().ops[i]._set_attr("is_test", False)
    with open(os.path.join(path, "__model__"), "wb") as f:
        f.write(prog.desc.SerializeToString())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["compile", path, "-o", str(tmp_path / "art"), "--batch", "8"]) == 0
    assert f"note: op 'dropout' (#{drops[0]}, block 0) was saved in training mode" in \
        buf.getvalue()
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    code = f"""
import json, sys
import numpy as np
sys.path.insert(0, {str(tmp_path)!r})
import art
m = art.load()
assert m.input_shapes == [(-1, 4), ()], m.input_shapes
x = np.array({x.tolist()!r}, np.float32)
outs = [m.run({{"x": x, "t": t}})[0].tolist() for t in (np.array(2.0, np.float32),
                                                       np.float32(-0.5))]
try:
    m.run({{"x": x, "t": np.array([2.0], np.float32)}})
    err = None
except art.ModelError as e:
    err = str(e)
print(json.dumps([outs, err]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    outs, err = json.loads(r.stdout)
    assert err == "input 't': expected rank 0, got 1"
    params = load_model(path).params
    w = next(v for v in params.values() if np.ndim(v) == 2)
    b = next(v for v in params.values() if np.ndim(v) == 1)
    for t, got in zip((2.0, -0.5), outs):
        h = np.abs((x @ w + b) * np.float32(0.75) * np.float32(t))
        while h.sum() < 100:
            h = h * np.float32(2)
        np.testing.assert_allclose(np.array(got, np.float32), h, rtol=1e-6)
