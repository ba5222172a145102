"""Convolutional networks: pdjit side by side with what a user would otherwise pick.

    python benchmarks/bench_cnn.py [--quick] [--repeat N] [--rounds R] [--only lenet,resnet,cold]

1. lenet: LeNet-5 inference on [B, 1, 28, 28] float32, B = 1 and 64: conv 6@5x5 + relu,
   max-pool 2, conv 16@5x5 + relu, max-pool 2, fc 120 + relu, fc 84 + relu, fc 10 (logits).
   Contenders, all with the same weights (drawn here in NumPy and written into every one) and
   their outputs checked against pdjit's: pdjit's Executor.run of the forward program as it
   serves a model run often ("pdjit": timed after ``tiers.HOT_RUNS`` runs, once the step's
   native driver was compiled on its thread and tried against the host driver and, at B = 64,
   against itself on two halves of the batch at once, one per core; see ``settle_pdjit``) and
   as it runs a program's first runs ("pdjit, first runs": an Executor
   with ``native_drivers=False``, its host drivers: what the first 100 runs get); ONNX
   Runtime (the model built with ``onnx.helper``) with 1 and 2 intra-op threads, the best of
   the two reported as "ORT best"; PaddlePaddle's legacy static executor (FLAGS_enable_pir_api=0,
   ``paddle.enable_static()``, the same ops: conv2d, pool2d, mul, ...); ``jax.jit`` of the
   network in ``jax.lax`` (device arrays in, ``block_until_ready``).
2. resnet: one training step of a small ResNet on [32, 3, 32, 32] with 10 classes. Four
   residual blocks of 16, 32, 64, 128 channels; block k computes
       y = relu(bn(conv3x3(x, stride s_k)));  y = bn(conv3x3(y));  out = relu(y + proj(x))
   with s_1 = 1 and s_2..s_4 = 2 (8 conv-bn 3x3 layers). proj is a 1x1 convolution with the
   block's stride (no bias, no bn); every block needs it here because every block changes the
   channel count (3 -> 16 in the first). Convolutions have no bias (bn's shift is one); bn
   uses the batch's statistics (training mode, momentum 0.9, epsilon 1e-5). Then global average
   pooling, fc 10 (with bias), softmax cross entropy, mean; Momentum(lr 0.01, momentum 0.9) on
   every parameter. pdjit vs PaddlePaddle's legacy executor vs jax.jit (the same network in
   ``jax.lax.conv_general_dilated`` and a hand-written bn, ``value_and_grad``, the momentum
   update as Paddle's ``momentum`` op does it). The same weights and batch everywhere; the
   losses of the first two steps are checked to agree (the second shows the gradients and the
   update agree too). Reported: ms per step (feed, step, fetch of the loss).
3. cold: the first training step of that ResNet in a fresh process with empty caches (new
   temporary PDJIT_CACHE_DIR and NUMBA_CACHE_DIR, so pdjit's generated kernels and its numba
   ``cache=True`` library kernels in ``pdjit.codegen.cpu.lib`` all compile), against jax's first
   call of the jitted step (trace + XLA compile) in a fresh process (JAX_PLATFORMS=cpu, no
   persistent compilation cache). Also the same pdjit process run again on the now-warm caches.

Timing: every contender runs in its own process (``--child``), one after another, ``--rounds``
times (the order reversed every other round); each process warms up, then times ``--repeat``
calls (x10 at B = 1, x2 at B = 64); the table shows the median of all timed calls. Separate
processes because libraries sharing one process disturbed each other: pdjit's LeNet at B = 64
went from 1.8 ms to 2.9-4.2 ms in a process where an ONNX Runtime session had run. Peers are
optional: a peer that is not installed (``onnx`` + ``onnxruntime``, ``paddlepaddle``, ``jax``:
the ``compare`` extra) is skipped with a note. Every library runs at its own default threads
(pdjit: its defaults; Paddle: its defaults; XLA: every core).
``--quick`` is a smoke run: few repeats, one round, no cold-compile processes unless ``--only``
names ``cold``.
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
import time
import warnings

import numpy as np
from _common import have, ms, ort_session, settle_pdjit, table, time_calls  # noqa: E402

logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU" notices

RESNET_CHANNELS = (16, 32, 64, 128)
RESNET_STRIDES = (1, 2, 2, 2)
RESNET_BATCH, CLASSES = 32, 10
BN_MOMENTUM, BN_EPS, LR, MOMENTUM = 0.9, 1e-5, 0.01, 0.9


# ---------------------------------------------------------------- timing and reporting
def interleaved_children(bench: str, names: list, args) -> dict:
    """name -> the results of ``--rounds`` child processes, one per contender and round (the
    order reversed every other round), each running ``child_<bench>(name, repeat)``."""
    runs = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out = spawn(f"{bench}:{name}", dict(os.environ), args.timeout, args.repeat)
            if "error" in out:
                raise SystemExit(out["error"])
            runs[name].append(out)
    return runs


def agree(name: str, got, want, tol: float) -> float:
    """Max abs difference of ``got`` from ``want``; fails the benchmark above ``tol``."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs {want.shape}"
    diff = float(np.max(np.abs(got - want)))
    assert diff <= tol, f"{name} disagrees with pdjit: max abs diff {diff:.3g} > {tol:.3g}"
    return diff


def quiet_paddle():
    warnings.filterwarnings("ignore", message=r"(?s).*(deprecated|No ccache found)")
    import paddle

    paddle.enable_static()
    return paddle


def set_paddle_params(paddle, scope, params: dict) -> None:
    for name, value in params.items():
        scope.var(name).get_tensor().set(value, paddle.CPUPlace())


# ---------------------------------------------------------------- 1. LeNet-5 inference
def lenet_params(seed: int = 0) -> dict:
    """He-scaled uniform weights, Fluid layouts: conv [out, in, kh, kw], fc [in, out]."""
    rng = np.random.default_rng(seed)

    def u(shape, fan_in):
        return (rng.uniform(-1, 1, shape) * np.sqrt(6.0 / fan_in)).astype(np.float32)

    return {"c1.w": u((6, 1, 5, 5), 25), "c1.b": u((6,), 25) * 0.1,
            "c2.w": u((16, 6, 5, 5), 150), "c2.b": u((16,), 150) * 0.1,
            "f1.w": u((256, 120), 256), "f1.b": u((120,), 256) * 0.1,
            "f2.w": u((120, 84), 120), "f2.b": u((84,), 120) * 0.1,
            "f3.w": u((84, 10), 84), "f3.b": u((10,), 84) * 0.1}


def lenet_pdjit(params: dict, native_drivers="auto"):
    """A runner ``x -> logits`` of the Fluid program in pdjit (``native_drivers``: the
    Executor's; ``"auto"``, its default, gives a plan run often its native driver)."""
    import pdjit as fluid

    main, startup = fluid.Program(), fluid.Program()
    pa = fluid.ParamAttr
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[1, 28, 28], dtype="float32")
        h = fluid.layers.conv2d(x, 6, 5, act="relu", param_attr=pa(name="c1.w"),
                                bias_attr=pa(name="c1.b"))
        h = fluid.layers.pool2d(h, pool_size=2, pool_type="max", pool_stride=2)
        h = fluid.layers.conv2d(h, 16, 5, act="relu", param_attr=pa(name="c2.w"),
                                bias_attr=pa(name="c2.b"))
        h = fluid.layers.pool2d(h, pool_size=2, pool_type="max", pool_stride=2)
        h = fluid.layers.fc(h, 120, act="relu", param_attr=pa(name="f1.w"),
                            bias_attr=pa(name="f1.b"))
        h = fluid.layers.fc(h, 84, act="relu", param_attr=pa(name="f2.w"),
                            bias_attr=pa(name="f2.b"))
        out = fluid.layers.fc(h, 10, param_attr=pa(name="f3.w"), bias_attr=pa(name="f3.b"))
    infer = main.clone(for_test=True)
    exe, scope = fluid.Executor(fluid.CPUPlace(), native_drivers=native_drivers), fluid.Scope()
    exe.run(startup, scope=scope)
    for name, value in params.items():
        scope.var(name).get_tensor().set(value, fluid.CPUPlace())
    def run(xv):
        return exe.run(infer, feed={"x": xv}, fetch_list=[out], scope=scope)[0]

    # the driver serving each batch size, per native step
    run.drivers = lambda: [s.tiers.drivers() for _, plan in exe._plans.values()
                           for s in plan.steps if s.kind == "native" and s.tiers is not None]
    # runs that went on slices of the batch so far (a split driver runs unsplit while
    # another process keeps a core busy: ``threads.free_cores``)
    run.split_runs = lambda: sum(sp.runs for _, plan in exe._plans.values()
                                 for s in plan.steps if s.kind == "native" and s.tiers
                                 and s.tiers._split for sp in s.tiers._split[1])
    return run


def lenet_onnx(params: dict) -> bytes:
    """The same network as an ONNX model (opset 13), batch dimension symbolic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["c1"], kernel_shape=[5, 5]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2.w", "c2.b"], ["c2"], kernel_shape=[5, 5]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "f1.w", "f1.b"], ["g1"]),
        helper.make_node("Relu", ["g1"], ["h1"]),
        helper.make_node("Gemm", ["h1", "f2.w", "f2.b"], ["g2"]),
        helper.make_node("Relu", ["g2"], ["h2"]),
        helper.make_node("Gemm", ["h2", "f3.w", "f3.b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "lenet5",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(v, name=k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def lenet_ort(model: bytes, threads: int):
    sess = ort_session(model, threads)
    return lambda xv: sess.run(["logits"], {"x": xv})[0]


def lenet_paddle(params: dict):
    paddle = quiet_paddle()
    import paddle.nn.functional as F

    main, startup = paddle.static.Program(), paddle.static.Program()
    pa = paddle.ParamAttr
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 1, 28, 28], "float32")
        h = paddle.static.nn.conv2d(x, 6, 5, act="relu", param_attr=pa(name="c1.w"),
                                    bias_attr=pa(name="c1.b"))
        h = F.max_pool2d(h, 2, 2)
        h = paddle.static.nn.conv2d(h, 16, 5, act="relu", param_attr=pa(name="c2.w"),
                                    bias_attr=pa(name="c2.b"))
        h = F.max_pool2d(h, 2, 2)
        h = paddle.static.nn.fc(h, 120, activation="relu", weight_attr=pa(name="f1.w"),
                                bias_attr=pa(name="f1.b"))
        h = paddle.static.nn.fc(h, 84, activation="relu", weight_attr=pa(name="f2.w"),
                                bias_attr=pa(name="f2.b"))
        out = paddle.static.nn.fc(h, 10, weight_attr=pa(name="f3.w"), bias_attr=pa(name="f3.b"))
    infer = main.clone(for_test=True)
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
    set_paddle_params(paddle, scope, params)
    return lambda xv: exe.run(infer, feed={"x": xv}, fetch_list=[out], scope=scope)[0]


def lenet_jax(params: dict):
    import jax
    import jax.numpy as jnp
    from jax import lax

    dn = ("NCHW", "OIHW", "NCHW")

    def conv(x, w, b):
        y = lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=dn)
        return y + b[None, :, None, None]

    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    @jax.jit
    def net(p, x):
        h = pool(jax.nn.relu(conv(x, p["c1.w"], p["c1.b"])))
        h = pool(jax.nn.relu(conv(h, p["c2.w"], p["c2.b"])))
        h = h.reshape(h.shape[0], -1)
        h = jax.nn.relu(h @ p["f1.w"] + p["f1.b"])
        h = jax.nn.relu(h @ p["f2.w"] + p["f2.b"])
        return h @ p["f3.w"] + p["f3.b"]

    dev = {k: jax.device_put(v) for k, v in params.items()}
    return lambda xv: net(dev, xv).block_until_ready()


LENET_BATCHES = (1, 64)


def lenet_contenders() -> tuple[dict, list]:
    """name -> builder ``params -> runner``, and notes on the peers that are not installed."""
    found, notes = {"pdjit": lenet_pdjit,
                    "pdjit, first runs": lambda p: lenet_pdjit(p, native_drivers=False)}, []
    if have("onnx", "onnxruntime"):
        found["ORT 1 thread"] = lambda p: lenet_ort(lenet_onnx(p), 1)
        found["ORT 2 threads"] = lambda p: lenet_ort(lenet_onnx(p), 2)
    else:
        notes.append("onnx/onnxruntime not installed: ORT skipped")
    if have("paddle"):
        found["Paddle legacy"] = lenet_paddle
    else:
        notes.append("paddlepaddle not installed: Paddle skipped")
    if have("jax"):
        found["jax.jit"] = lenet_jax
    else:
        notes.append("jax not installed: jax skipped")
    return found, notes


def lenet_input(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 1, 28, 28)).astype(np.float32)


def child_lenet(name: str, repeat: int) -> dict:
    """One contender in this process: its outputs and timed calls (seconds) per batch."""
    fn = lenet_contenders()[0][name](lenet_params())
    result = {}
    for batch in LENET_BATCHES:
        arg = lenet_input(batch)
        if name == "jax.jit":  # a jax user holds device arrays
            import jax

            arg = jax.device_put(arg)
        out = np.asarray(fn(arg))
        calls = repeat * (10 if batch == 1 else 2)
        warmup = 5
        if name == "pdjit":  # timed as it serves: hot, its native driver ready and tried
            warmup = settle_pdjit(lambda a=arg: fn(a))
        time_calls(lambda a=arg: fn(a), 0, warmup=warmup)
        split_before = fn.split_runs() if name == "pdjit" else 0
        result[str(batch)] = {"out": out.tolist(),
                              "s": time_calls(lambda a=arg: fn(a), calls, warmup=0)}
        if name == "pdjit":
            result[str(batch)]["driver"] = sorted({d[batch] for d in fn.drivers()
                                                   if batch in d})
            result[str(batch)]["split"] = fn.split_runs() - split_before
    return result


def split_share(res: dict) -> str:
    """How many of a pdjit process's timed calls at one batch size ran split."""
    split = "split" in res and any("split" in d for d in res.get("driver", ()))
    return f", {res['split']} of {len(res['s'])} runs split" if split else ""


def bench_lenet(args) -> None:
    names, notes = lenet_contenders()
    runs = interleaved_children("lenet", list(names), args)
    rows, checks = [], []
    for batch in map(str, LENET_BATCHES):
        want = np.asarray(runs["pdjit"][0][batch]["out"])
        tol = 1e-4 * max(1.0, float(np.max(np.abs(want))))
        res = {}
        for name, parts in runs.items():
            for part in parts:
                if name != "pdjit":
                    diff = agree(f"{name} B={batch}", part[batch]["out"], want, tol)
            if name != "pdjit":
                checks.append(f"{name} B={batch}: {diff:.1e}")
            res[name] = statistics.median(t for part in parts for t in part[batch]["s"]) * 1e3
        ort = [res[k] for k in ("ORT 1 thread", "ORT 2 threads") if k in res]
        best = min(ort) if ort else None
        rows.append([batch, ms(res["pdjit"]), ms(res.get("pdjit, first runs")),
                     ms(res.get("ORT 1 thread")),
                     ms(res.get("ORT 2 threads")), ms(best), ms(res.get("Paddle legacy")),
                     ms(res.get("jax.jit")),
                     f"{res['pdjit'] / best:.2f}x" if best else "-"])
    table("LeNet-5 inference, float32, median ms per call (outputs checked against pdjit's)",
          ["B", "pdjit", "pdjit, first runs", "ORT 1 thread", "ORT 2 threads", "ORT best",
           "Paddle legacy", "jax.jit", "pdjit / ORT best"], rows)
    print("max abs diff vs pdjit: " + ("; ".join(checks) or "-"))
    print("pdjit's driver: " + "; ".join(
        f"B={b}: " + ", ".join(sorted({d for part in runs["pdjit"] for d in part[b]["driver"]}))
        for b in map(str, LENET_BATCHES)))
    # each pdjit process apart: one that kept another driver shows here, not in the median
    print("pdjit per process (median ms, driver): " + "; ".join(
        f"B={b}: " + ", ".join(f"{statistics.median(part[b]['s']) * 1e3:.3f} "
                               f"({'/'.join(part[b]['driver'])}"
                               f"{split_share(part[b])})" for part in runs["pdjit"])
        for b in map(str, LENET_BATCHES)))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for n in notes:
        print(f"note: {n}")


# ---------------------------------------------------------------- 2. ResNet training step
def resnet_params(seed: int = 0) -> dict:
    """Conv weights He-normal, bn scale 1 / shift 0 / moving mean 0 / moving var 1, fc uniform."""
    rng = np.random.default_rng(seed)
    p, cin = {}, 3

    def he(shape):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    for k, c in enumerate(RESNET_CHANNELS):
        for j, ci in ((1, cin), (2, c)):
            name = f"b{k}.{j}"
            p[f"{name}.w"] = he((c, ci, 3, 3))
            p[f"{name}.scale"] = np.ones(c, np.float32)
            p[f"{name}.shift"] = np.zeros(c, np.float32)
            p[f"{name}.mean"] = np.zeros(c, np.float32)
            p[f"{name}.var"] = np.ones(c, np.float32)
        p[f"b{k}.proj.w"] = he((c, cin, 1, 1))
        cin = c
    bound = 1.0 / np.sqrt(cin)
    p["fc.w"] = rng.uniform(-bound, bound, (cin, CLASSES)).astype(np.float32)
    p["fc.b"] = np.zeros(CLASSES, np.float32)
    return p


def resnet_batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((RESNET_BATCH, 3, 32, 32)).astype(np.float32),
            rng.integers(0, CLASSES, (RESNET_BATCH, 1)).astype(np.int64))


def resnet_pdjit(params: dict):
    """A runner ``(x, label) -> loss`` of one Momentum step of the Fluid program in pdjit."""
    import pdjit as fluid

    L, pa = fluid.layers, fluid.ParamAttr

    def conv_bn(x, c, stride, name, act):
        y = L.conv2d(x, c, 3, stride=stride, padding=1, param_attr=pa(name=f"{name}.w"),
                     bias_attr=False)
        return L.batch_norm(y, act=act, momentum=BN_MOMENTUM, epsilon=BN_EPS,
                            param_attr=pa(name=f"{name}.scale"),
                            bias_attr=pa(name=f"{name}.shift"),
                            moving_mean_name=f"{name}.mean", moving_variance_name=f"{name}.var")

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        h = L.data(name="x", shape=[3, 32, 32], dtype="float32")
        label = L.data(name="label", shape=[1], dtype="int64")
        for k, (c, s) in enumerate(zip(RESNET_CHANNELS, RESNET_STRIDES)):
            y = conv_bn(h, c, s, f"b{k}.1", "relu")
            y = conv_bn(y, c, 1, f"b{k}.2", None)
            short = L.conv2d(h, c, 1, stride=s, param_attr=pa(name=f"b{k}.proj.w"),
                             bias_attr=False)
            h = L.relu(L.elementwise_add(y, short))
        h = L.pool2d(h, pool_type="avg", global_pooling=True)
        logits = L.fc(h, CLASSES, param_attr=pa(name="fc.w"), bias_attr=pa(name="fc.b"))
        loss = L.mean(L.softmax_with_cross_entropy(logits, label))
        fluid.optimizer.Momentum(learning_rate=LR, momentum=MOMENTUM).minimize(loss)
    exe, scope = fluid.Executor(fluid.CPUPlace()), fluid.Scope()
    exe.run(startup, scope=scope)
    for name, value in params.items():
        scope.var(name).get_tensor().set(value, fluid.CPUPlace())

    def step(xv, yv):
        return exe.run(main, feed={"x": xv, "label": yv}, fetch_list=[loss],
                       scope=scope)[0].item()   # (the mean: [1] as Fluid 1.x declares it)
    return step


def resnet_paddle(params: dict):
    paddle = quiet_paddle()
    import paddle.nn.functional as F

    pa = paddle.ParamAttr

    def conv_bn(x, c, stride, name, act):
        y = paddle.static.nn.conv2d(x, c, 3, stride=stride, padding=1,
                                    param_attr=pa(name=f"{name}.w"), bias_attr=False)
        return paddle.static.nn.batch_norm(
            y, act=act, momentum=BN_MOMENTUM, epsilon=BN_EPS, param_attr=pa(name=f"{name}.scale"),
            bias_attr=pa(name=f"{name}.shift"), moving_mean_name=f"{name}.mean",
            moving_variance_name=f"{name}.var")

    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        h = paddle.static.data("x", [-1, 3, 32, 32], "float32")
        label = paddle.static.data("label", [-1, 1], "int64")
        for k, (c, s) in enumerate(zip(RESNET_CHANNELS, RESNET_STRIDES)):
            y = conv_bn(h, c, s, f"b{k}.1", "relu")
            y = conv_bn(y, c, 1, f"b{k}.2", None)
            short = paddle.static.nn.conv2d(h, c, 1, stride=s, param_attr=pa(name=f"b{k}.proj.w"),
                                            bias_attr=False)
            h = F.relu(y + short)
        h = F.adaptive_avg_pool2d(h, 1)
        logits = paddle.static.nn.fc(h, CLASSES, weight_attr=pa(name="fc.w"),
                                     bias_attr=pa(name="fc.b"))
        loss = paddle.mean(F.softmax_with_cross_entropy(logits, label))
        paddle.optimizer.Momentum(learning_rate=LR, momentum=MOMENTUM).minimize(loss)
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
    set_paddle_params(paddle, scope, params)

    def step(xv, yv):
        return float(exe.run(main, feed={"x": xv, "label": yv}, fetch_list=[loss],
                             scope=scope)[0])
    return step


def resnet_jax(params: dict):
    import jax
    import jax.numpy as jnp

    step = make_resnet_jax()
    trained = {k: v for k, v in params.items() if not k.endswith((".mean", ".var"))}
    state = {"p": {k: jax.device_put(v) for k, v in trained.items()},
             "s": {k: jax.device_put(v) for k, v in params.items()
                   if k.endswith((".mean", ".var"))},
             "v": {k: jnp.zeros_like(v) for k, v in trained.items()}}

    def run(x, y):
        state["p"], state["s"], state["v"], loss = step(state["p"], state["s"], state["v"], x, y)
        return float(loss)
    return run


def make_resnet_jax():
    """The jitted step ``(params, moving stats, velocity, x, y) -> (..., loss)``: bn in
    training mode updates the moving statistics as Paddle's batch_norm does."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    dn = ("NCHW", "OIHW", "NCHW")

    def conv(x, w, stride, pad):
        return lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad), (pad, pad)],
                                        dimension_numbers=dn)

    def bn(x, p, name):
        mean = x.mean(axis=(0, 2, 3))
        var = jnp.mean(jnp.square(x - mean[None, :, None, None]), axis=(0, 2, 3))
        inv = lax.rsqrt(var + BN_EPS) * p[f"{name}.scale"]
        y = (x - mean[None, :, None, None]) * inv[None, :, None, None]
        return y + p[f"{name}.shift"][None, :, None, None], (mean, var)

    def forward(p, x, y):
        h, batch_stats = x, {}
        for k, s in enumerate(RESNET_STRIDES):
            z, batch_stats[f"b{k}.1"] = bn(conv(h, p[f"b{k}.1.w"], s, 1), p, f"b{k}.1")
            z, batch_stats[f"b{k}.2"] = bn(conv(jax.nn.relu(z), p[f"b{k}.2.w"], 1, 1), p,
                                           f"b{k}.2")
            h = jax.nn.relu(z + conv(h, p[f"b{k}.proj.w"], s, 0))
        logits = h.mean(axis=(2, 3)) @ p["fc.w"] + p["fc.b"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, y, axis=1)), batch_stats

    @jax.jit
    def step(p, stats, vel, x, y):
        (loss, batch_stats), g = jax.value_and_grad(forward, has_aux=True)(p, x, y)
        vel = {k: MOMENTUM * vel[k] + g[k] for k in p}
        p = {k: p[k] - LR * vel[k] for k in p}
        new = {}
        for name, (m, v) in batch_stats.items():
            new[f"{name}.mean"] = BN_MOMENTUM * stats[f"{name}.mean"] + (1 - BN_MOMENTUM) * m
            new[f"{name}.var"] = BN_MOMENTUM * stats[f"{name}.var"] + (1 - BN_MOMENTUM) * v
        return p, new, vel, loss

    return step


def resnet_contenders() -> tuple[dict, list]:
    found, notes = {"pdjit": resnet_pdjit}, []
    if have("paddle"):
        found["Paddle legacy"] = resnet_paddle
    else:
        notes.append("paddlepaddle not installed: Paddle skipped")
    if have("jax"):
        found["jax.jit"] = resnet_jax
    else:
        notes.append("jax not installed: jax skipped")
    return found, notes


def child_resnet(name: str, repeat: int) -> dict:
    """One contender in this process: the losses of its first two steps from the shared
    weights, then timed steps (seconds)."""
    step = resnet_contenders()[0][name](resnet_params())
    xv, yv = resnet_batch()
    feed = (xv, yv)
    if name == "jax.jit":
        import jax

        feed = (jax.device_put(xv), jax.device_put(yv.astype(np.int32)))
    losses = [step(*feed), step(*feed)]
    return {"losses": losses, "s": time_calls(lambda: step(*feed), repeat, warmup=2)}


def bench_resnet(args) -> None:
    names, notes = resnet_contenders()
    runs = interleaved_children("resnet", list(names), args)
    want = runs["pdjit"][0]["losses"]
    res, checks = {}, []
    for name, parts in runs.items():
        for part in parts:
            diff = agree(name, part["losses"], want, 2e-3)
        if name != "pdjit":
            checks.append(f"{name}: {diff:.1e}")
        res[name] = statistics.median(t for part in parts for t in part["s"]) * 1e3
    table(f"ResNet-style training step, batch {RESNET_BATCH} x 3 x 32 x 32, Momentum, "
          "median ms per step (feed, step, fetch the loss)",
          ["contender", "ms / step", "vs pdjit"],
          [[k, ms(v), f"{v / res['pdjit']:.2f}x"] for k, v in res.items()])
    print("first two losses: " + "; ".join(f"{k} {v[0]['losses'][0]:.5f} "
                                           f"{v[0]['losses'][1]:.5f}" for k, v in runs.items()))
    print("max abs diff of those vs pdjit: " + ("; ".join(checks) or "-"))
    for n in notes:
        print(f"note: {n}")


# ---------------------------------------------------------------- 3. cold compile
def child_cold_pdjit() -> dict:
    t = time.perf_counter()
    import pdjit  # noqa: F401
    t_import = time.perf_counter() - t
    params = resnet_params()
    xv, yv = resnet_batch()
    t = time.perf_counter()
    step = resnet_pdjit(params)  # builds the program, runs the startup program
    t_build = time.perf_counter() - t
    times = []
    for _ in range(3):
        t = time.perf_counter()
        step(xv, yv)
        times.append(time.perf_counter() - t)
    return {"import_s": t_import, "build_startup_s": t_build, "first_s": times[0],
            "next_ms": min(times[1:]) * 1e3, "compiles": compile_counts()}


def compile_counts() -> str:
    """Numba compilations made / loaded from disk in this process: pdjit's generated kernels
    (``compiler.kernel_stats``) and its library kernels (the dispatchers of ``nnlib``)."""
    from numba.core.dispatcher import Dispatcher

    from pdjit.codegen import compiler

    gen = compiler.kernel_stats()
    made = loaded = 0
    seen = set()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("pdjit.codegen.cpu.lib"):
            continue
        for fn in vars(mod).values():
            if isinstance(fn, Dispatcher) and id(fn) not in seen:
                seen.add(id(fn))
                made += sum(fn.stats.cache_misses.values())
                loaded += sum(fn.stats.cache_hits.values())
    return (f"generated: {gen['kernels']} kernels, {gen['compiled']} compiled, "
            f"{gen['loaded']} loaded; library: {made} compiled, {loaded} loaded")


def child_cold_jax() -> dict:
    t = time.perf_counter()
    import jax
    t_import = time.perf_counter() - t
    xv, yv = resnet_batch()
    x, y = jax.device_put(xv), jax.device_put(yv.astype(np.int32))
    t = time.perf_counter()
    step = resnet_jax(resnet_params())
    t_build = time.perf_counter() - t
    times = []
    for _ in range(3):
        t = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t)
    return {"import_s": t_import, "build_startup_s": t_build, "first_s": times[0],
            "next_ms": min(times[1:]) * 1e3}


def spawn(kind: str, env: dict, timeout: float, repeat: int = 0) -> dict:
    """Run ``--child kind`` in a fresh process; its last JSON line, or {"error": ...}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--repeat", str(repeat)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{kind}: > {timeout:g} s timeout"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        return {"error": f"{kind} exited {p.returncode}:\n{tail}"}
    return json.loads(lines[-1])


def bench_cold(args) -> None:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("JAX_COMPILATION", "PDJIT_CACHE", "NUMBA_CACHE"))}
    tmp = tempfile.mkdtemp(prefix="pdjit-bench-cnn-")
    try:
        caches = {"PDJIT_CACHE_DIR": os.path.join(tmp, "pdjit"),
                  "NUMBA_CACHE_DIR": os.path.join(tmp, "numba")}
        for d in caches.values():
            os.makedirs(d)
        runs = {"pdjit, empty caches": spawn("cold-pdjit", {**base, **caches}, args.timeout),
                "pdjit, the caches that run left": spawn("cold-pdjit", {**base, **caches},
                                                         args.timeout)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if have("jax"):
        runs["jax.jit, fresh process"] = spawn("cold-jax", {**base, "JAX_PLATFORMS": "cpu"},
                                               args.timeout)
    else:
        print("note: jax not installed: jax skipped")
    rows, errors = [], []
    for k, r in runs.items():
        if "error" in r:
            errors.append(r["error"])
            rows.append([k, "error", "-", "-", "-"])
            continue
        rows.append([k, f"{r['first_s']:.2f}", f"{r['import_s']:.2f}",
                     f"{r['build_startup_s']:.2f}", ms(r["next_ms"])])
    table("cold start of the ResNet training step: fresh processes",
          ["run", "first step s", "import s", "build + startup s", "next step ms"], rows)
    for k, r in runs.items():
        if "compiles" in r:
            print(f"{k}: numba compilations: {r['compiles']}")
    for e in errors:
        print(f"\n{e}")


BENCHES = {"lenet": bench_lenet, "resnet": bench_resnet, "cold": bench_cold}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: few repeats, no cold")
    ap.add_argument("--repeat", type=int, help="timed calls per round (default 30; quick 5)")
    ap.add_argument("--rounds", type=int, help="passes over the contenders (default 3; quick 1)")
    ap.add_argument("--only", help="comma-separated: lenet,resnet,cold (quick: lenet,resnet)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per cold process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, _, name = args.child.partition(":")
        fn = {"cold-pdjit": child_cold_pdjit, "cold-jax": child_cold_jax,
              "lenet": lambda: child_lenet(name, args.repeat),
              "resnet": lambda: child_resnet(name, args.repeat)}[kind]
        print(json.dumps(fn()), flush=True)
        return
    args.repeat = args.repeat or (5 if args.quick else 30)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if "PDJIT_CACHE_DIR" not in os.environ:  # one kernel cache for every child (cold: its own)
        os.environ["PDJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdjit-bench-cnn-")
        atexit.register(shutil.rmtree, os.environ["PDJIT_CACHE_DIR"], True)
    only = args.only or ("lenet,resnet" if args.quick else ",".join(BENCHES))
    versions = []
    for dist in ("numba", "onnxruntime", "paddlepaddle", "jax"):
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist} not installed")
    print(", ".join(versions) + f"; {os.cpu_count()} CPUs")
    for name in only.split(","):
        BENCHES[name](args)


if __name__ == "__main__":
    main()
