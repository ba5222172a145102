"""Sequence models: pdjit side by side with what a user would otherwise pick.

    python benchmarks/bench_sequence_models.py [--quick] [--repeat N] [--rounds R]
                                               [--only transformer,lstm]

1. transformer: one transformer encoder layer forward, inference (dropout off), float32,
   batch 8, sequence 128, hidden 256, 4 heads, feed-forward 1024, post-norm as Paddle's
   ``TransformerEncoderLayer`` computes it:
       a = softmax(q k^T / sqrt(64)) v over 4 heads (q, k, v, out: 256 x 256 projections)
       x = layer_norm(x + a W_o + b_o);  out = layer_norm(x + gelu(x W_1 + b_1) W_2 + b_2)
   (gelu exact, erf; layer_norm epsilon 1e-5). Contenders: pdjit's ``Executor.run`` of the
   Fluid program (fc with num_flatten_dims=2, reshape + transpose, matmul with alpha, softmax,
   dropout, layer_norm, gelu; the ``clone(for_test=True)`` of it) at pdjit's default threads;
   ONNX Runtime (the same layer built with ``onnx.helper``: MatMul, Softmax,
   LayerNormalization, Erf, ...; every graph optimisation on) at 1 and 2 intra-op threads;
   ``jax.jit`` of the layer in ``jax.numpy`` at 1 and 2 threads (XLA's Eigen pool; the 1-thread
   process is pinned to one core). Each peer's best thread count is its row in the summary.
2. lstm: LSTM forward + backward, batch 32, 50 steps, 128 inputs, 128 hidden, one layer, zero
   initial state; loss = mean of every output; the step computes the loss and the gradients
   of the four weights (W_ih [512, 128], W_hh [512, 128], b_ih, b_hh; gates i, f, c, o as in
   Paddle's ``rnn`` op) and fetches all five. Contenders: pdjit (``fluid.layers.lstm``, which
   appends the ``rnn`` op, then ``append_backward``); PaddlePaddle's legacy executor
   (``FLAGS_enable_pir_api=0``: ``paddle.nn.LSTM(time_major=True)`` appends the ``rnn`` op,
   ``paddle.static.append_backward``) at its default threads; ``jax.jit`` of
   ``value_and_grad`` of the LSTM written with ``lax.scan`` (the input projection of every
   step hoisted out of the scan as one GEMM) at 1 and 2 threads.

The row "pdjit 1 thread" (``PDJIT_NUM_THREADS=1``) is for information: the ratios are of
pdjit at its default threads. The same weights and inputs everywhere (drawn here in NumPy and
written into every contender); every peer's outputs (and pdjit's at one thread) are checked
against pdjit's. Timing: every contender runs in its own process (``--child``), one after
another, ``--rounds`` times (the order reversed every other round); each process warms up,
then times ``--repeat`` calls; the tables show the median of all timed calls. pdjit's processes
list the plan steps that run an op's NumPy reference and any native step that fell back. Peers
are optional (``onnx`` + ``onnxruntime``, ``paddlepaddle``, ``jax``): a peer that is not
installed is skipped with a note. ``--quick`` is a smoke run: 3 calls, one round.
"""
from __future__ import annotations

import os

# PaddlePaddle's legacy ProgramDesc executor (read when paddle is imported) and quiet glog.
os.environ.setdefault("FLAGS_enable_pir_api", "0")
os.environ.setdefault("GLOG_minloglevel", "2")

import argparse  # noqa: E402
import atexit
import importlib.metadata
import importlib.util
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import warnings

import numpy as np
from _common import have, ms, ort_session, table, time_calls  # noqa: E402

logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU" notices

BATCH, SEQ, HIDDEN, HEADS, FFN, LN_EPS = 8, 128, 256, 4, 1024, 1e-5
LSTM_BATCH, LSTM_STEPS, LSTM_IN, LSTM_HIDDEN = 32, 50, 128, 128


# ---------------------------------------------------------------- shared helpers
def max_rel_diff(name: str, got, want, tol: float) -> float:
    """Max abs difference of ``got`` from ``want`` relative to ``want``'s largest magnitude;
    fails the benchmark above ``tol``."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.size == want.size == 1:  # (a scalar loss: Fluid 1.x's mean is [1], Paddle 3's [])
        got, want = got.reshape(1), want.reshape(1)
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs pdjit's {want.shape}"
    diff = float(np.max(np.abs(got - want))) / max(1e-12, float(np.max(np.abs(want))))
    assert diff <= tol, f"{name} disagrees with pdjit: max relative diff {diff:.3g} > {tol:.3g}"
    return diff


def pin_threads(name: str, threads: int) -> None:
    """Before pdjit or jax is imported: one thread for a contender that asks for it (pdjit:
    ``PDJIT_NUM_THREADS=1``; jax: XLA's Eigen pool off and the process pinned to one core)."""
    if threads == 1 and name.startswith("pdjit"):
        os.environ["PDJIT_NUM_THREADS"] = "1"
    elif threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false"
                                   " intra_op_parallelism_threads=1").strip()
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def pdjit_reference_steps(exe, program, feed: dict, fetch: list) -> list:
    """The steps of pdjit's plan for this run that run an op's NumPy reference (from
    ``Executor.explain``: ``reference <op>#<index> (<why>)``)."""
    text = exe.explain(program, feed=feed, fetch_list=fetch)
    return [ln.strip() for ln in text.split("== generated source")[0].splitlines()
            if ln.strip().startswith("reference ")]


def fallbacks(record: list) -> list:
    """The FallbackWarnings among the ``record``ed warnings: native code that gave up."""
    from pdjit.framework.errors import FallbackWarning

    return sorted({str(w.message) for w in record if issubclass(w.category, FallbackWarning)})


# ---------------------------------------------------------------- 1. transformer encoder layer
def transformer_params(seed: int = 0) -> dict:
    """Fluid layouts (fc weights [in, out]); uniform(+-1/sqrt(fan_in)) weights, small biases,
    layer_norm scales near 1."""
    rng = np.random.default_rng(seed)

    def u(shape, fan_in):
        return rng.uniform(-1, 1, shape).astype(np.float32) / np.float32(np.sqrt(fan_in))

    p = {}
    for name in ("q", "k", "v", "o"):
        p[f"w{name}"], p[f"b{name}"] = u((HIDDEN, HIDDEN), HIDDEN), u((HIDDEN,), HIDDEN)
    p["w1"], p["b1"] = u((HIDDEN, FFN), HIDDEN), u((FFN,), HIDDEN)
    p["w2"], p["b2"] = u((FFN, HIDDEN), FFN), u((HIDDEN,), FFN)
    for ln in ("ln1", "ln2"):
        p[f"{ln}.scale"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        p[f"{ln}.bias"] = (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    return p


def transformer_input(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)


def transformer_pdjit(params: dict):
    """A runner ``x -> out`` of the Fluid program's test clone in pdjit."""
    import pdjit as fluid

    L, pa = fluid.layers, fluid.ParamAttr
    d_head = HIDDEN // HEADS

    def fc(x, size, name):
        return L.fc(x, size, num_flatten_dims=2, param_attr=pa(name=f"w{name}"),
                    bias_attr=pa(name=f"b{name}"))

    def heads(t):
        return L.transpose(L.reshape(t, [0, 0, HEADS, d_head]), [0, 2, 1, 3])

    def ln(t, name):
        return L.layer_norm(t, begin_norm_axis=2, epsilon=LN_EPS,
                            param_attr=pa(name=f"{name}.scale"), bias_attr=pa(name=f"{name}.bias"))

    def drop(t):
        return L.dropout(t, 0.1, dropout_implementation="upscale_in_train")

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[SEQ, HIDDEN], dtype="float32")
        q, k, v = heads(fc(x, HIDDEN, "q")), heads(fc(x, HIDDEN, "k")), heads(fc(x, HIDDEN, "v"))
        weights = drop(L.softmax(L.matmul(q, k, transpose_y=True, alpha=d_head ** -0.5)))
        context = L.reshape(L.transpose(L.matmul(weights, v), [0, 2, 1, 3]), [0, 0, HIDDEN])
        x = ln(L.elementwise_add(x, drop(fc(context, HIDDEN, "o"))), "ln1")
        hidden = L.gelu(fc(x, FFN, "1"), approximate=False)
        out = ln(L.elementwise_add(x, drop(fc(hidden, HIDDEN, "2"))), "ln2")
    infer = main.clone(for_test=True)
    exe, scope = fluid.Executor(fluid.CPUPlace()), fluid.Scope()
    exe.run(startup, scope=scope)
    for name, value in params.items():
        scope.var(name).get_tensor().set(value, fluid.CPUPlace())

    def run(xv):
        return exe.run(infer, feed={"x": xv}, fetch_list=[out], scope=scope)[0]
    run.reference_steps = lambda xv: pdjit_reference_steps(exe, infer, {"x": xv}, [out])
    return run


def transformer_onnx(params: dict) -> bytes:
    """The same layer as an ONNX model (opset 17), batch and sequence symbolic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    d_head = HIDDEN // HEADS
    consts = {"split_shape": np.array([0, 0, HEADS, d_head], np.int64),
              "merge_shape": np.array([0, 0, HIDDEN], np.int64),
              "scale": np.array(d_head ** -0.5, np.float32),
              "half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32),
              "inv_sqrt2": np.array(2 ** -0.5, np.float32)}
    n = helper.make_node
    nodes = []

    def linear(x, name, out):
        nodes.extend([n("MatMul", [x, f"w{name}"], [f"{out}.mm"]),
                      n("Add", [f"{out}.mm", f"b{name}"], [out])])

    for name in "qkv":
        linear("x", name, name)
        nodes.extend([n("Reshape", [name, "split_shape"], [f"{name}.4d"]),
                      n("Transpose", [f"{name}.4d"], [f"{name}.h"],
                        perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])])
    nodes.extend([
        n("MatMul", ["q.h", "k.h"], ["scores"]),
        n("Mul", ["scores", "scale"], ["scaled"]),
        n("Softmax", ["scaled"], ["probs"], axis=-1),
        n("MatMul", ["probs", "v.h"], ["ctx.h"]),
        n("Transpose", ["ctx.h"], ["ctx.4d"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx.4d", "merge_shape"], ["ctx"])])
    linear("ctx", "o", "attn")
    nodes.extend([n("Add", ["x", "attn"], ["res1"]),
                  n("LayerNormalization", ["res1", "ln1.scale", "ln1.bias"], ["x1"], axis=-1,
                    epsilon=LN_EPS)])
    linear("x1", "1", "f1")
    nodes.extend([n("Mul", ["f1", "inv_sqrt2"], ["g.s"]), n("Erf", ["g.s"], ["g.erf"]),
                  n("Add", ["g.erf", "one"], ["g.1p"]), n("Mul", ["f1", "g.1p"], ["g.x"]),
                  n("Mul", ["g.x", "half"], ["gelu"])])
    linear("gelu", "2", "f2")
    nodes.extend([n("Add", ["x1", "f2"], ["res2"]),
                  n("LayerNormalization", ["res2", "ln2.scale", "ln2.bias"], ["out"], axis=-1,
                    epsilon=LN_EPS)])
    inits = {**params, **consts}
    graph = helper.make_graph(
        nodes, "transformer_encoder_layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", HIDDEN])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "S", HIDDEN])],
        initializer=[numpy_helper.from_array(v, name=k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def transformer_ort(params: dict, threads: int):
    sess = ort_session(transformer_onnx(params), threads)
    return lambda xv: sess.run(["out"], {"x": xv})[0]


def transformer_jax(params: dict):
    import jax
    import jax.numpy as jnp

    d_head = HIDDEN // HEADS

    def ln(t, p, name):
        mean = t.mean(-1, keepdims=True)
        var = jnp.square(t - mean).mean(-1, keepdims=True)
        return (t - mean) * jax.lax.rsqrt(var + LN_EPS) * p[f"{name}.scale"] + p[f"{name}.bias"]

    @jax.jit
    def layer(p, x):
        b, s, _ = x.shape

        def heads(t):
            return t.reshape(b, s, HEADS, d_head).transpose(0, 2, 1, 3)

        q, k, v = (heads(x @ p[f"w{c}"] + p[f"b{c}"]) for c in "qkv")
        probs = jax.nn.softmax((q @ k.swapaxes(-1, -2)) * d_head ** -0.5, axis=-1)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, HIDDEN)
        x = ln(x + ctx @ p["wo"] + p["bo"], p, "ln1")
        hidden = jax.nn.gelu(x @ p["w1"] + p["b1"], approximate=False)
        return ln(x + hidden @ p["w2"] + p["b2"], p, "ln2")

    dev = {k: jax.device_put(v) for k, v in params.items()}
    return lambda xv: layer(dev, xv).block_until_ready()


def transformer_contenders() -> tuple[dict, list]:
    """name -> (builder ``params -> runner``, threads for jax's process); notes on peers."""
    found = {"pdjit": (transformer_pdjit, 0), "pdjit 1 thread": (transformer_pdjit, 1)}
    notes = []
    if have("onnx", "onnxruntime"):
        found["ORT 1 thread"] = (lambda p: transformer_ort(p, 1), 0)
        found["ORT 2 threads"] = (lambda p: transformer_ort(p, 2), 0)
    else:
        notes.append("onnx/onnxruntime not installed: ORT skipped")
    if have("jax"):
        found["jax.jit 1 thread"] = (transformer_jax, 1)
        found["jax.jit 2 threads"] = (transformer_jax, 2)
    else:
        notes.append("jax not installed: jax skipped")
    return found, notes


def child_transformer(name: str, repeat: int, out_dir: str) -> dict:
    builder, threads = transformer_contenders()[0][name]
    pin_threads(name, threads)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = builder(transformer_params())
        arg = transformer_input()
        if name.startswith("jax"):  # a jax user holds device arrays
            import jax

            arg = jax.device_put(arg)
        out = np.asarray(fn(arg))
        times = time_calls(lambda: fn(arg), repeat)
    np.save(os.path.join(out_dir, f"transformer-{name}.npy"), out)
    result = {"s": times}
    if name.startswith("pdjit"):
        result["reference_steps"] = fn.reference_steps(arg)
        result["fallbacks"] = fallbacks(record)
    return result


def best(res: dict, prefix: str):
    """(name, ms) of the fastest contender whose name starts with ``prefix``; None if none."""
    cands = [(k, v) for k, v in res.items() if k.startswith(prefix)]
    return min(cands, key=lambda kv: kv[1]) if cands else None


def bench_transformer(args) -> None:
    names, notes = transformer_contenders()
    runs = interleaved_children("transformer", list(names), args)
    want = np.load(os.path.join(args.out_dir, "transformer-pdjit.npy"))
    res, checks = {}, []
    for name, parts in runs.items():
        if name != "pdjit":
            got = np.load(os.path.join(args.out_dir, f"transformer-{name}.npy"))
            checks.append(f"{name}: {max_rel_diff(name, got, want, 1e-3):.1e}")
        res[name] = statistics.median(t for part in parts for t in part["s"]) * 1e3
    rows = [[k, ms(v), f"{v / res['pdjit']:.2f}x"] for k, v in res.items()]
    table(f"transformer encoder layer forward, batch {BATCH}, sequence {SEQ}, hidden {HIDDEN}, "
          f"{HEADS} heads, ffn {FFN}, float32, median ms per call (outputs checked)",
          ["contender", "ms / call", "vs pdjit"], rows)
    summary = [("pdjit (default threads)", res["pdjit"])]
    for prefix, label in (("ORT", "ORT best"), ("jax", "jax.jit best")):
        b = best(res, prefix)
        if b:
            summary.append((f"{label} ({b[0]})", b[1]))
    if len(summary) > 1:
        fastest = min(v for _, v in summary[1:])
        print(f"pdjit / the faster peer: {res['pdjit'] / fastest:.2f}x  "
              f"(" + "; ".join(f"{k} {ms(v)} ms" for k, v in summary) + ")")
    print("max relative diff vs pdjit: " + ("; ".join(checks) or "-"))
    report_reference_steps(runs["pdjit"])
    for n in notes:
        print(f"note: {n}")


def report_reference_steps(parts: list) -> None:
    steps = sorted({s for part in parts for s in part.get("reference_steps", [])})
    print("pdjit plan steps that run an op's NumPy reference: " + ("; ".join(steps) or "none"))
    falls = sorted({s for part in parts for s in part.get("fallbacks", [])})
    print("pdjit native steps that fell back to the references: " + ("; ".join(falls) or "none"))


# ---------------------------------------------------------------- 2. LSTM forward + backward
LSTM_WEIGHTS = ("w_ih", "w_hh", "b_ih", "b_hh")


def lstm_params(seed: int = 0) -> dict:
    """Paddle's layouts: W_ih [4H, I], W_hh [4H, H], b_ih, b_hh [4H]; uniform(+-1/sqrt(H))."""
    rng = np.random.default_rng(seed)
    k = 1.0 / np.sqrt(LSTM_HIDDEN)
    shapes = {"w_ih": (4 * LSTM_HIDDEN, LSTM_IN), "w_hh": (4 * LSTM_HIDDEN, LSTM_HIDDEN),
              "b_ih": (4 * LSTM_HIDDEN,), "b_hh": (4 * LSTM_HIDDEN,)}
    return {n: rng.uniform(-k, k, s).astype(np.float32) for n, s in shapes.items()}


def lstm_input(seed: int = 1) -> np.ndarray:
    shape = (LSTM_STEPS, LSTM_BATCH, LSTM_IN)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def lstm_pdjit(params: dict):
    """A runner ``x -> [loss, dW_ih, dW_hh, db_ih, db_hh]`` in pdjit. ``fluid.layers.lstm``
    takes batch-major input (``run.prepare`` transposes the time-major batch once, untimed)."""
    import pdjit as fluid

    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[LSTM_BATCH, LSTM_STEPS, LSTM_IN], dtype="float32",
                   append_batch_size=False)
        init = [L.fill_constant([1, LSTM_BATCH, LSTM_HIDDEN], "float32", 0.0) for _ in "hc"]
        out, _, _ = L.lstm(x, init[0], init[1], max_len=LSTM_STEPS, hidden_size=LSTM_HIDDEN,
                           num_layers=1)
        loss = L.reduce_mean(out)
        fluid.backward.append_backward(loss)
    (rnn,) = [op for op in main.global_block().ops if op.type == "rnn"]
    names = rnn.input("WeightList")  # Paddle's order: W_ih, W_hh, then b_ih, b_hh
    assert len(names) == 4, f"pdjit's rnn op: expected 4 weights, got {names}"
    exe, scope = fluid.Executor(fluid.CPUPlace()), fluid.Scope()
    exe.run(startup, scope=scope)
    for name, key in zip(names, LSTM_WEIGHTS):
        want = params[key]
        have_shape = tuple(np.asarray(scope.find_var(name).get_tensor()).shape)
        assert have_shape == want.shape, f"pdjit {name}: shape {have_shape} vs {want.shape}"
        scope.var(name).get_tensor().set(want, fluid.CPUPlace())
    fetch = [loss] + [f"{n}@GRAD" for n in names]

    def run(xv):
        return exe.run(main, feed={"x": xv}, fetch_list=fetch, scope=scope)
    run.reference_steps = lambda xv: pdjit_reference_steps(exe, main, {"x": xv}, fetch)
    run.prepare = lambda xv: np.ascontiguousarray(xv.transpose(1, 0, 2))
    return run


def lstm_paddle(params: dict):
    import paddle

    warnings.filterwarnings("ignore", message=r"(?s).*(deprecated|No ccache found)")
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [LSTM_STEPS, LSTM_BATCH, LSTM_IN], "float32")
        lstm = paddle.nn.LSTM(LSTM_IN, LSTM_HIDDEN, time_major=True)
        out, _ = lstm(x)
        loss = paddle.mean(out)
        grads = dict((p.name, g) for p, g in paddle.static.append_backward(loss))
    names = [lstm.weight_ih_l0.name, lstm.weight_hh_l0.name, lstm.bias_ih_l0.name,
             lstm.bias_hh_l0.name]
    assert "rnn" in [op.type for op in main.global_block().ops], "paddle: no rnn op"
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
    for name, key in zip(names, LSTM_WEIGHTS):
        scope.var(name).get_tensor().set(params[key], paddle.CPUPlace())
    fetch = [loss] + [grads[n] for n in names]
    return lambda xv: exe.run(main, feed={"x": xv}, fetch_list=fetch, scope=scope)


def lstm_jax(params: dict):
    import jax
    import jax.numpy as jnp
    from jax import lax

    def loss_fn(w_ih, w_hh, b_ih, b_hh, x):
        xw = x @ w_ih.T + (b_ih + b_hh)  # every step's input projection: one GEMM

        def step(carry, xw_t):
            h, c = carry
            i, f, g, o = jnp.split(xw_t + h @ w_hh.T, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zero = jnp.zeros((x.shape[1], LSTM_HIDDEN), x.dtype)
        _, out = lax.scan(step, (zero, zero), xw)
        return out.mean()

    grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3)))
    dev = [jax.device_put(params[k]) for k in LSTM_WEIGHTS]

    def run(xv):
        loss, g = grad(*dev, xv)
        loss.block_until_ready()
        for t in g:
            t.block_until_ready()
        return [loss, *g]
    return run


def lstm_contenders() -> tuple[dict, list]:
    found, notes = {"pdjit": (lstm_pdjit, 0), "pdjit 1 thread": (lstm_pdjit, 1)}, []
    if have("paddle"):
        found["Paddle legacy"] = (lstm_paddle, 0)
    else:
        notes.append("paddlepaddle not installed: Paddle skipped")
    if have("jax"):
        found["jax.jit 1 thread"] = (lstm_jax, 1)
        found["jax.jit 2 threads"] = (lstm_jax, 2)
    else:
        notes.append("jax not installed: jax skipped")
    return found, notes


def child_lstm(name: str, repeat: int, out_dir: str) -> dict:
    builder, threads = lstm_contenders()[0][name]
    pin_threads(name, threads)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = builder(lstm_params())
        arg = getattr(fn, "prepare", lambda a: a)(lstm_input())
        if name.startswith("jax"):
            import jax

            arg = jax.device_put(arg)
        outs = [np.asarray(o) for o in fn(arg)]
        times = time_calls(lambda: fn(arg), repeat)
    np.savez(os.path.join(out_dir, f"lstm-{name}.npz"), *outs)
    result = {"s": times}
    if name.startswith("pdjit"):
        result["reference_steps"] = fn.reference_steps(arg)
        result["fallbacks"] = fallbacks(record)
    return result


def bench_lstm(args) -> None:
    names, notes = lstm_contenders()
    runs = interleaved_children("lstm", list(names), args)

    def outputs(name):
        with np.load(os.path.join(args.out_dir, f"lstm-{name}.npz")) as z:
            return [z[f"arr_{i}"] for i in range(len(z.files))]

    want = outputs("pdjit")
    res, checks = {}, []
    for name, parts in runs.items():
        if name != "pdjit":
            got = outputs(name)
            diffs = [max_rel_diff(f"{name} {what}", g, w, 2e-3)
                     for what, g, w in zip(("loss",) + LSTM_WEIGHTS, got, want)]
            checks.append(f"{name}: {max(diffs):.1e}")
        res[name] = statistics.median(t for part in parts for t in part["s"]) * 1e3
    rows = [[k, ms(v), f"{v / res['pdjit']:.2f}x"] for k, v in res.items()]
    table(f"LSTM forward + backward, batch {LSTM_BATCH}, {LSTM_STEPS} steps, {LSTM_IN} inputs, "
          f"{LSTM_HIDDEN} hidden, float32, median ms per step (loss and 4 weight gradients "
          "fetched and checked)", ["contender", "ms / step", "vs pdjit"], rows)
    peers = [v for k, v in res.items() if not k.startswith("pdjit")]
    if peers:
        print(f"pdjit / the fastest peer: {res['pdjit'] / min(peers):.2f}x")
    print(f"loss: {float(np.asarray(want[0]).reshape(-1)[0]):.6f}; max relative diff of loss "
          "and gradients vs pdjit: "
          + ("; ".join(checks) or "-"))
    report_reference_steps(runs["pdjit"])
    for n in notes:
        print(f"note: {n}")


# ---------------------------------------------------------------- processes
def spawn(kind: str, args) -> dict:
    """Run ``--child kind`` in a fresh process; its last JSON line, or {"error": ...}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--repeat",
           str(args.repeat), "--out-dir", args.out_dir]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{kind}: > {args.timeout:g} s timeout"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        return {"error": f"{kind} exited {p.returncode}:\n{tail}"}
    return json.loads(lines[-1])


def interleaved_children(bench: str, names: list, args) -> dict:
    """name -> the results of ``--rounds`` child processes, one per contender and round (the
    order reversed every other round)."""
    runs = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out = spawn(f"{bench}:{name}", args)
            if "error" in out:
                raise SystemExit(out["error"])
            runs[name].append(out)
    return runs


BENCHES = {"transformer": bench_transformer, "lstm": bench_lstm}
CHILDREN = {"transformer": child_transformer, "lstm": child_lstm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 calls, one round")
    ap.add_argument("--repeat", type=int, help="timed calls per process (default 20; quick 3)")
    ap.add_argument("--rounds", type=int, help="passes over the contenders (default 3; quick 1)")
    ap.add_argument("--only", help="comma-separated: transformer,lstm (default both)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, _, name = args.child.partition(":")
        print(json.dumps(CHILDREN[kind](name, args.repeat, args.out_dir)), flush=True)
        return
    args.repeat = args.repeat or (3 if args.quick else 20)
    args.rounds = args.rounds or (1 if args.quick else 3)
    only = (args.only or ",".join(BENCHES)).split(",")
    for name in only:
        if name not in BENCHES:
            raise SystemExit(f"--only: unknown benchmark {name!r}; expected some of "
                             f"{','.join(BENCHES)}")
    args.out_dir = tempfile.mkdtemp(prefix="pdjit-bench-seq-")
    atexit.register(shutil.rmtree, args.out_dir, True)
    if "PDJIT_CACHE_DIR" not in os.environ:  # one kernel cache for every child
        os.environ["PDJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdjit-bench-seq-cache-")
        atexit.register(shutil.rmtree, os.environ["PDJIT_CACHE_DIR"], True)
    versions = []
    for dist in ("numba", "onnxruntime", "paddlepaddle", "jax"):
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist} not installed")
    print(", ".join(versions) + f"; {os.cpu_count()} CPUs")
    for name in only:
        BENCHES[name](args)


if __name__ == "__main__":
    main()
