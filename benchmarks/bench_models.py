"""Real models, side by side with ONNX Runtime and Paddle Inference, at 1 and 2 threads.

    python benchmarks/bench_models.py [--quick] [--models resnet50,mobilenetv2,bert,gru,lstm]
        [--batch 1,16] [--threads 1,2] [--rounds R] [--repeat N] [--busy]
        [--no-convs | --convs-only] [--conv-batch 16] [--fma-units U] [--ghz G] [--json FILE]

Models, built with pdjit's Fluid API at their real layer sizes, weights drawn from a fixed seed
(convolutions He-normal, fully connected layers uniform +-1/sqrt(fan in), batch norms with
statistics near 0 / 1, layer norms near 1 / 0), saved with ``save_inference_model``:

- ``resnet50``: ResNet-50 (bottlenecks 3, 4, 6, 3; batch norm; fc 1000), x [B, 3, 224, 224]
  (``bench_compile._resnet50``, its logits fetched);
- ``mobilenetv2``: MobileNetV2 (width 1.0: a 3x3/2 stem of 32, 17 inverted residual blocks of
  expansion 6 with depthwise 3x3 convolutions and relu6, a 1x1 of 1280, global pooling, fc
  1000: the logits), x [B, 3, 224, 224];
- ``bert``: a BERT-like encoder, 6 post-norm layers of d 256, 4 heads, feed-forward 1024
  (exact gelu), over x [B, 128, 256] (the embeddings' output; no dropout);
- ``gru`` (not in the default set): a GRU classifier, one layer of 128 hidden over 32 steps
  of 64 inputs (the ``rnn`` op), fc 10 on the last step;
- ``lstm`` (not in the default set): a 2-layer bidirectional LSTM classifier, 256 hidden over
  64 steps of 128 inputs, fc 10 on the last step;
- ``densenet121``, ``shufflenetv2`` (not in the default set): DenseNet-121 (dense blocks of 6,
  12, 24, 16 layers of growth 32, each layer batch norm - relu - 1x1 of 128 - batch norm -
  relu - 3x3 of 32 joined to its input by a concat) and ShuffleNetV2 x1.0 (units of split,
  1x1 - depthwise 3x3 - 1x1, concat, channel shuffle), fc 1000, x [B, 3, 224, 224].

Contenders, each in a process of its own for each thread count: pdjit's Predictor
(``pdjit.inference``, ir optim on, ``set_cpu_math_library_num_threads``); ONNX Runtime on the
model exported by ``pdjit.io.onnx_export`` (the same weights; intra-op threads, sequential,
every graph optimisation); Paddle Inference (ir optim on) where ``paddle`` is importable
(otherwise skipped with a note). For each model and batch every process runs once (pdjit
compiles or loads its kernels), warms up (about 3 s of runs, 2 to 300), then the timed runs go
in ``--rounds`` rounds, each
round every process in turn (the order rotated), so that the machine's load hits them alike;
the tables show the median of all timed runs of each. Every one-thread process runs on the
same core (:func:`one_core`: a core of a virtual machine may be slowed for minutes while the
other is not). Outputs are checked against pdjit's 1-thread run (max abs error). ``--busy``:
a Python busy loop keeps the other core busy while every run is timed (the threads target: 2
threads within 1.2x of 1 thread). Before each round a
probe times how fast one core reads what the other has just written (``handoff_probe``: on
some machines this changes within minutes, and two-thread runs with it); the table shows its
range beside the figures.

The convolution table times each distinct convolution of ResNet-50 (input, filters, stride;
batch ``--conv-batch``) as a one-op program, pdjit and ONNX Runtime at one thread, and shows
the GFLOP/s reached (2 * N * M * OH * OW * C/groups * KH * KW flops) against one core's FP32
FMA peak: clock (measured on a chain of dependent integer additions, one a cycle: the busy
core's turbo clock, not ``/proc/cpuinfo``'s nominal ``cpu MHz``; or ``--ghz``) x fp32 lanes of
the widest vector unit (16 with AVX-512, 8 with AVX2/FMA, 4 otherwise; from the CPU flags) x
FMA units per core x 2 flops per FMA. The CPU does not report its FMA units, and they differ
where the flags agree (two 512-bit units on most Xeon Scalable processors with AVX-512, one on
AMD's Zen 4, which runs a 512-bit FMA on its two 256-bit units), so ``fma_throughput`` measures
them: 16 independent chains of FMAs on vectors of that width, in LLVM IR compiled for this CPU
(its throughput, not its latency, bounds the loop), the units the rate / (clock x lanes x 2),
rounded to a half (``--fma-units`` gives them instead).

``--quick``: batch 1, 2 rounds of 2 timed runs, the convolutions at batch 1. Print: markdown
tables; ``--json`` writes every number.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import pathlib
import pickle
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_MODELS = ("resnet50", "mobilenetv2", "bert")
ALL_MODELS = DEFAULT_MODELS + ("gru", "lstm", "densenet121", "shufflenetv2")
SEED = 0
# a pause before each process's round: the last one's idle threads stop, and it is longer than
# pdjit's ``threads.IDLE_S`` (0.25 s), after which a process that was idle drops the load window
# in which the last contender ran: after shorter pauses pdjit's first runs took that burst for a
# busy core and ran on one thread (MobileNetV2 at batch 1 on two threads, rounds of 20 runs
# right after another process's: 5.9-6.1 ms against 3.6-3.9 when it ran first)
_SETTLE_S = 0.3
_REWARM = 2         # untimed runs before each round's timed runs


# ---- models ---------------------------------------------------------------------------------
def _resnet50(fluid):
    sys.path.insert(0, str(HERE))
    import bench_compile

    main, startup, out = bench_compile._resnet50(fluid)
    # the logits are fetched (the softmax of random weights' logits is one-hot: no check)
    (soft,) = [op for op in main.global_block().ops if op.type == "softmax"]
    logits = main.global_block().var(soft.input("X")[0])
    return main, startup, ["x"], [logits], {"x": (3, 224, 224)}


def _conv_bn(L, x, c, k, stride=1, groups=1, act="relu"):
    """A convolution of ``c`` k x k filters ("same" padding, no bias), then a batch norm and
    ``act``."""
    x = L.conv2d(x, num_filters=c, filter_size=k, stride=stride, padding=(k - 1) // 2,
                 groups=groups, bias_attr=False)
    return L.batch_norm(x, act=act, is_test=True)


def _mobilenetv2(fluid):
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1

    conv_bn = functools.partial(_conv_bn, L, act="relu6")

    def inverted(x, cin, cout, stride, t):
        h = conv_bn(x, cin * t, 1) if t != 1 else x
        h = conv_bn(h, cin * t, 3, stride, groups=cin * t)
        h = conv_bn(h, cout, 1, act=None)
        return L.elementwise_add(x, h) if stride == 1 and cin == cout else h

    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[3, 224, 224], dtype="float32")
        h = conv_bn(x, 32, 3, 2)
        cin = 32
        for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                           (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
            for i in range(n):
                h = inverted(h, cin, c, s if i == 0 else 1, t)
                cin = c
        h = conv_bn(h, 1280, 1)
        h = L.pool2d(h, pool_type="avg", global_pooling=True)
        out = L.fc(h, 1000)
    return main, startup, ["x"], [out], {"x": (3, 224, 224)}


SEQ, D_MODEL, HEADS, FFN, LAYERS = 128, 256, 4, 1024, 6


def _bert(fluid):
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    d_head = D_MODEL // HEADS

    def fc(x, size):
        return L.fc(x, size, num_flatten_dims=2)

    def heads(t):
        return L.transpose(L.reshape(t, [0, 0, HEADS, d_head]), [0, 2, 1, 3])

    def ln(t):
        return L.layer_norm(t, begin_norm_axis=2, epsilon=1e-5)

    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[SEQ, D_MODEL], dtype="float32")
        h = x
        for _ in range(LAYERS):
            q, k, v = heads(fc(h, D_MODEL)), heads(fc(h, D_MODEL)), heads(fc(h, D_MODEL))
            w = L.softmax(L.matmul(q, k, transpose_y=True, alpha=d_head ** -0.5))
            ctx = L.reshape(L.transpose(L.matmul(w, v), [0, 2, 1, 3]), [0, 0, D_MODEL])
            h = ln(L.elementwise_add(h, fc(ctx, D_MODEL)))
            f = fc(L.gelu(fc(h, FFN), approximate=False), D_MODEL)
            h = ln(L.elementwise_add(h, f))
    return main, startup, ["x"], [h], {"x": (SEQ, D_MODEL)}


def _rnn_classifier(fluid, mode, steps, inputs, hidden, layers, bidirec, classes=10):
    """``x [B, steps, inputs]`` -> the ``rnn`` op (Paddle's layout: weights ``w_ih``, ``w_hh``
    per layer and direction, then the biases) -> the last step -> fc ``classes``."""
    from pdjit.initializer import Uniform
    from pdjit.layers.layer_helper import LayerHelper
    from pdjit.param_attr import ParamAttr

    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[steps, inputs], dtype="float32")
        d, g = (2 if bidirec else 1), {"LSTM": 4, "GRU": 3}[mode]
        helper = LayerHelper(mode.lower())
        init = Uniform(-hidden ** -0.5, hidden ** -0.5)
        ws, bs = [], []
        for k in range(layers * d):
            for cols in (inputs if k < d else d * hidden, hidden):
                ws.append(helper.create_parameter(ParamAttr(), [g * hidden, cols], "float32",
                                                  default_initializer=init))
        for _ in range(2 * layers * d):
            bs.append(helper.create_parameter(ParamAttr(), [g * hidden], "float32",
                                              is_bias=True, default_initializer=init))
        xt = L.transpose(x, [1, 0, 2])
        h0 = L.fill_constant_batch_size_like(x, [layers * d, -1, hidden], "float32", 0.0,
                                             input_dim_idx=0, output_dim_idx=1)
        pre = [h0, h0] if mode == "LSTM" else [h0]
        out = helper.create_variable_for_type_inference("float32")
        states = [helper.create_variable_for_type_inference("float32") for _ in pre]
        reserve = helper.create_variable_for_type_inference("float32", stop_gradient=True)
        drop = helper.create_variable_for_type_inference("uint8", stop_gradient=True)
        helper.append_op(
            "rnn", inputs={"Input": [xt], "PreState": pre, "WeightList": ws + bs},
            outputs={"Out": [out], "State": states, "Reserve": [reserve],
                     "DropoutState": [drop]},
            attrs={"dropout_prob": 0.0, "is_bidirec": bidirec, "input_size": inputs,
                   "hidden_size": hidden, "num_layers": layers, "mode": mode, "seed": 0,
                   "is_test": True})
        last = L.reshape(L.slice(out, axes=[0], starts=[steps - 1], ends=[steps]),
                         [-1, d * hidden])
        y = L.fc(last, classes)
    return main, startup, ["x"], [y], {"x": (steps, inputs)}


def _densenet121(fluid):
    """DenseNet-121 (growth 32, blocks of 6, 12, 24, 16 layers, bottlenecks of 4 x 32, each
    transition halving the channels): batch norm and relu before each convolution."""
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1

    def bn_relu_conv(x, c, k, stride=1):
        x = L.batch_norm(x, act="relu", is_test=True)
        return L.conv2d(x, num_filters=c, filter_size=k, stride=stride, padding=(k - 1) // 2,
                        bias_attr=False)

    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[3, 224, 224], dtype="float32")
        h = L.conv2d(x, num_filters=64, filter_size=7, stride=2, padding=3, bias_attr=False)
        h = L.batch_norm(h, act="relu", is_test=True)
        h = L.pool2d(h, pool_size=3, pool_stride=2, pool_padding=1, pool_type="max")
        c = 64
        for b, layers in enumerate((6, 12, 24, 16)):
            for _ in range(layers):
                new = bn_relu_conv(bn_relu_conv(h, 4 * 32, 1), 32, 3)
                h = L.concat([h, new], axis=1)
                c += 32
            if b < 3:
                c //= 2
                h = L.pool2d(bn_relu_conv(h, c, 1), pool_size=2, pool_stride=2,
                             pool_type="avg")
        h = L.batch_norm(h, act="relu", is_test=True)
        h = L.pool2d(h, pool_type="avg", global_pooling=True)
        out = L.fc(h, 1000)
    return main, startup, ["x"], [out], {"x": (3, 224, 224)}


def _shufflenetv2(fluid):
    """ShuffleNetV2 x1.0 (stages of 4, 8, 4 units onto 116, 232, 464 channels): each unit's
    halves split, one through 1x1 - depthwise 3x3 - 1x1, joined by concat and a channel
    shuffle (reshape, transpose, reshape)."""
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1

    conv_bn = functools.partial(_conv_bn, L)

    def branch(x, c, stride):
        h = conv_bn(x, c, 1)
        h = conv_bn(h, c, 3, stride, groups=c, act=None)
        return conv_bn(h, c, 1)

    def shuffle(x, c, hw):
        x = L.reshape(x, [-1, 2, c // 2, hw, hw])
        return L.reshape(L.transpose(x, [0, 2, 1, 3, 4]), [-1, c, hw, hw])

    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[3, 224, 224], dtype="float32")
        h = conv_bn(x, 24, 3, 2)
        h = L.pool2d(h, pool_size=3, pool_stride=2, pool_padding=1, pool_type="max")
        cin, hw = 24, 56
        for c, units in ((116, 4), (232, 8), (464, 4)):
            hw //= 2
            left = conv_bn(conv_bn(h, cin, 3, 2, groups=cin, act=None), c // 2, 1)
            h = shuffle(L.concat([left, branch(h, c // 2, 2)], axis=1), c, hw)
            for _ in range(units - 1):
                a, b = L.split(h, 2, dim=1)
                h = shuffle(L.concat([a, branch(b, c // 2, 1)], axis=1), c, hw)
            cin = c
        h = conv_bn(h, 1024, 1)
        h = L.pool2d(h, pool_type="avg", global_pooling=True)
        out = L.fc(h, 1000)
    return main, startup, ["x"], [out], {"x": (3, 224, 224)}


BUILDERS = {
    "resnet50": _resnet50,
    "mobilenetv2": _mobilenetv2,
    "bert": _bert,
    "gru": lambda fluid: _rnn_classifier(fluid, "GRU", 32, 64, 128, 1, False),
    "lstm": lambda fluid: _rnn_classifier(fluid, "LSTM", 64, 128, 256, 2, True),
    "densenet121": _densenet121,
    "shufflenetv2": _shufflenetv2,
}


def _randomize(fluid, program, scope, seed: int) -> None:
    """Every parameter drawn from ``seed``: 4-D filters He-normal, 2-D weights uniform
    +-1/sqrt(fan in), batch norm scale ~1, bias ~0, mean ~0, variance ~1 (``w_0``, ``b_0``,
    ``w_1``, ``w_2``: Fluid's names), other 1-D parameters (biases; layer norm scales are 1 +
    noise) small."""
    rng = np.random.default_rng(seed)
    for v in sorted(program.global_block().all_parameters(), key=lambda p: p.name):
        t = scope.find_var(v.name).get_tensor()
        shape = tuple(np.asarray(t).shape)
        if len(shape) == 4:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif len(shape) == 2:
            a = rng.uniform(-1, 1, shape) / np.sqrt(shape[0])
        elif v.name.startswith("batch_norm") and v.name.endswith(".w_0"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        elif v.name.startswith("batch_norm") and v.name.endswith(".w_2"):
            a = rng.uniform(0.8, 1.2, shape)
        elif v.name.startswith("layer_norm") and v.name.endswith(".w_0"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        else:
            a = 0.05 * rng.standard_normal(shape)
        t.set(a.astype(np.float32), fluid.CPUPlace())
    # batch norm statistics are persistables, not parameters
    for v in program.global_block().vars.values():
        if v.persistable and v.name.startswith("batch_norm") and v.name.endswith(".w_1"):
            t = scope.find_var(v.name).get_tensor()
            shape = tuple(np.asarray(t).shape)
            t.set((0.05 * rng.standard_normal(shape)).astype(np.float32), fluid.CPUPlace())


def save_model(name: str, path: str) -> dict:
    """Build model ``name``, draw its weights, save it at ``path``; its input shapes."""
    import pdjit as fluid

    main, startup, feeds, fetches, shapes = BUILDERS[name](fluid)
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=scope)
    _randomize(fluid, main, scope, SEED)
    fluid.io.save_inference_model(path, feeds, fetches, exe, main_program=main, scope=scope)
    return shapes


def model_inputs(shapes: dict, batch: int) -> dict:
    rng = np.random.default_rng(SEED + batch)
    return {n: rng.standard_normal((batch, *s)).astype(np.float32) for n, s in shapes.items()}


# ---- the pdjit worker (a process per thread count; the protocol of pdjit.tools._peer_worker)
def worker() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    state = {}
    while True:
        try:
            req = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        try:
            reply = _handle(state, req)
            reply["ok"] = True
        except BaseException as e:  # noqa: BLE001 - reported to the benchmark
            msg = str(e).strip().splitlines()
            reply = {"ok": False, "error": f"{type(e).__name__}: {msg[-1] if msg else ''}"}
        pickle.dump(reply, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()


def _handle(state, req):
    cmd = req["cmd"]
    if cmd == "load":
        from pdjit.tools.run import make_predictor
        t0 = time.perf_counter()
        state["pred"] = make_predictor(req["model"], True, int(req["threads"]))
        return {"seconds": time.perf_counter() - t0,
                "info": f"pdjit.inference, ir optim on, threads {req['threads']}"}
    pred = state["pred"]
    if cmd == "set":
        state["inputs"] = [req["inputs"][n] for n in pred.get_input_names()]
        return {}
    if cmd == "first":
        t0 = time.perf_counter()
        outs = pred.run(state["inputs"])
        return {"seconds": time.perf_counter() - t0, "outputs": [np.asarray(o) for o in outs]}
    if cmd == "time":
        # a native driver compiling in the background (the Predictor's) is waited for: the
        # timed runs are the served model's
        for t in threading.enumerate():
            if t.name == "pdjit-tier-up":
                t.join()
        run, inputs, clock, times = pred.run, state["inputs"], time.perf_counter, []
        for _ in range(int(req["n"])):
            t0 = clock()
            run(inputs)
            times.append(clock() - t0)
        return {"times": times}
    if cmd == "waiting":
        # the parallel loops of one sample that were asked for and are not compiled (a
        # library changed since `pdjit warmup`): their splits ran on helper threads instead
        from pdjit.codegen.cpu.lib import team
        return {"loops": sorted({loop.py_func.__name__ for (loop, _), state
                                 in team._READY.items() if state is not True})}
    raise ValueError(f"unknown request {cmd!r}")


def one_core():
    """The core every one-thread contender runs on, all on the same one (None: one core
    allowed). A virtual machine's core can be slowed for minutes at a time while the other is
    not (on the 2-vCPU AMD EPYC, a 3x3 convolution alone took 2.92 ms pinned to one core and
    1.34 ms on the other, in the same minute), and a one-thread process stays on the core it
    started on: unpinned, two contenders' one-thread runs could each meet a different core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return cores[-1] if len(cores) > 1 else None


def _pinned(core):
    """A ``preexec_fn`` that keeps the child (and every thread it starts) on ``core``."""
    return None if core is None else (lambda: os.sched_setaffinity(0, {core}))


class Engine:
    """A contender in its process: pdjit (this script as a worker) or a peer
    (``pdjit.tools._peer_worker``); a one-thread contender pinned to :func:`one_core`."""

    def __init__(self, name: str, threads: int):
        from pdjit.tools import bench as tb

        self.name, self.threads, self.label = name, threads, f"{name} {threads}t"
        env = dict(os.environ, PDJIT_NUM_THREADS=str(threads), FLAGS_enable_pir_api="0",
                   GLOG_minloglevel="2", OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
        if name == "pdjit":
            cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker"]
            env.pop("OMP_NUM_THREADS")  # (pdjit sets its own threads)
        else:
            cmd = [sys.executable, tb._WORKER]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env,
                                     preexec_fn=_pinned(one_core() if threads == 1 else None))
        self._tb = tb

    def ask(self, req: dict) -> dict:
        try:
            pickle.dump(req, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
            reply = pickle.load(self.proc.stdout)
        except (BrokenPipeError, EOFError, pickle.UnpicklingError, OSError):
            self.log.seek(0)
            tail = self.log.read().decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"{self.label}: its process exited: {tail}") from None
        if not reply.get("ok"):
            raise RuntimeError(f"{self.label}: {reply.get('error')}")
        return reply

    def load(self, path: str, tmp: str) -> str:
        if self.name == "pdjit":
            return self.ask({"cmd": "load", "model": path, "threads": self.threads})["info"]
        from pdjit.io.inference_model import load_model
        model = load_model(path)
        try:
            req = self._tb._peer_request(self.name, model, tmp)
        except self._tb.EngineFailed as e:
            raise RuntimeError(f"{self.label}: {e}") from None
        return self.ask(dict(req, cmd="load", peer=self.name, threads=self.threads))["info"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def start_busy():
    """A Python busy loop (one core kept busy: not the one-thread contenders' own, which
    would slow them and not the two-thread ones), or None."""
    core = one_core()
    other = None if core is None else min(os.sched_getaffinity(0) - {core})
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_pinned(other))


def stop(proc) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def rel_err(a: list, b: list):
    """max abs difference / max abs value of ``a``."""
    d = max_abs(a, b)
    top = max((float(np.max(np.abs(x))) for x in a if np.size(x)), default=0.0)
    return None if d is None else d / top if top else d


def max_abs(a: list, b: list):
    if len(a) != len(b) or any(np.shape(x) != np.shape(y) for x, y in zip(a, b)):
        return None
    return max((float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                for x, y in zip(a, b) if np.size(x)), default=0.0)


def timed_rounds(engines: list, rounds: int, repeat: int, probes: list | None = None,
                 runs: dict | None = None) -> dict:
    """Median seconds of each engine's ``rounds * repeat`` timed runs, interleaved; with
    ``probes``, :func:`handoff_probe` appended before each round; with ``runs``, every timed
    run's milliseconds, in order, by engine (``--json``: the spread of the runs behind each
    median, which a virtual machine's slowed core widens)."""
    times = {e.label: [] for e in engines}
    for r in range(rounds):
        if probes is not None:
            probes.append(handoff_probe())
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for e in order:
            time.sleep(_SETTLE_S)
            e.ask({"cmd": "time", "n": _REWARM})
            times[e.label] += e.ask({"cmd": "time", "n": repeat})["times"]
    if runs is not None:
        runs.update({k: [round(t * 1e3, 4) for t in v] for k, v in times.items()})
    return {k: float(np.median(v)) for k, v in times.items() if v}


_PROBE: list = []  # the probe's parallel loop, compiled at the first probe


def handoff_probe():
    """Milliseconds for a two-part parallel loop (pdjit's team, its thread kept off this
    thread's core) to sum a 1 MB array that this thread has just written, a half on each core
    (the median of 20; None with fewer than two cores). On the 2-vCPU AMD EPYC this took
    0.12 ms in some periods and 0.30 ms in others, changing within minutes (one thread: 0.13
    either way): in the second, what one core writes reaches the other slowly, and every
    engine's two-thread runs were slower (ResNet-50 at batch 1: pdjit +18 %, ONNX Runtime
    +12 %; one-thread runs unchanged). The report shows it beside the two-thread figures."""
    if (os.cpu_count() or 1) < 2:
        return None
    import numba

    from pdjit.codegen.cpu import threads
    from pdjit.codegen.cpu.lib import team  # noqa: F401 - names the team for place_team

    if not _PROBE:
        @numba.njit(parallel=True)
        def halves(a, out):
            m = a.shape[0] // 2
            for p in numba.prange(2):
                s = 0.0
                for i in range(p * m, (p + 1) * m):
                    s += a[i]
                out[p] = s
        _PROBE.append(halves)
    halves = _PROBE[0]
    a, out = np.ones(1 << 17), np.zeros(2)
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        threads.place_team()
        times = []
        for i in range(23):
            t = time.perf_counter()
            a.fill(float(i))
            halves(a, out)
            times.append(time.perf_counter() - t)
    finally:
        numba.set_num_threads(before)
    return float(np.median(times[3:])) * 1e3


def warm(e, seconds: float = 3.0, least: int = 30, most: int = 300,
         longest: float = 60.0) -> None:
    """Untimed runs, about ``seconds`` of them and no fewer than ``least`` (2 at the least; at
    most ``most`` runs or about ``longest`` seconds), the same for every engine: pdjit's plans
    try their drivers and measure their threads in their first runs (a BERT-like encoder at
    batch 1 needed more than 30 runs of 10 ms for both, and its 2-thread runs were timed
    while they still tried; DenseNet-121 at batch 16 on two threads, ~0.3 s a run, had ten
    runs in its 3 s and timed four runs at one thread's speed, 0.64-0.77 s each, in its first
    two rounds: none with 30 runs of warm-up). The runs go by batches sized by the fastest run
    so far (a count from the first run alone, one that still records, gave ResNet-50 at batch
    1 about 12 runs of warm-up, and its two-thread runs were timed in their thread trial)."""
    spent, runs, fastest = 0.0, 0, float("inf")
    while runs < 2 or ((spent < seconds or runs < least) and runs < most and spent < longest):
        if runs == 0:
            n = 1
        else:
            by_time = int((seconds - spent) / fastest / 2)
            n = max(1, min(most - runs, max(least - runs, by_time),
                           int((longest - spent) / fastest)))
        times = e.ask({"cmd": "time", "n": n})["times"]
        spent, runs, fastest = spent + sum(times), runs + len(times), min(fastest, *times)


def peers_available(notes: list) -> list:
    peers = []
    for name, mod, pip in (("onnxruntime", "onnxruntime", "onnxruntime onnx"),
                           ("paddle", "paddle", "paddlepaddle")):
        if importlib.util.find_spec(mod) is None:
            notes.append(f"{name}: not installed (pip install {pip}), skipped")
        else:
            peers.append(name)
    return peers


def bench_model(name: str, args, tmp: str, peers: list, notes: list) -> list:
    path = os.path.join(tmp, name)
    shapes = save_model(name, path)
    engines = []
    for eng in ("pdjit", *peers):
        for t in args.threads:
            e = Engine(eng, t)
            try:
                info = e.load(path, tmp)
                engines.append(e)
                if t == args.threads[0]:
                    notes.append(f"{name}: {info}")
            except RuntimeError as err:
                notes.append(f"{name}: {err}")
                e.close()
    rows = []
    try:
        for batch in args.batch:
            inputs = model_inputs(shapes, batch)
            live, firsts = [], {}
            busy = start_busy() if args.busy else None  # (busy while served: warm-up too)
            load0 = os.getloadavg()[0]
            try:
                for e in engines:
                    try:
                        e.ask({"cmd": "set", "inputs": inputs})
                        r = e.ask({"cmd": "first"})
                        firsts[e.label] = (r["seconds"], r["outputs"])
                        warm(e)
                        live.append(e)
                    except RuntimeError as err:
                        notes.append(f"{name} batch {batch}: {err}")
                probes: list = []
                runs: dict = {}
                med = timed_rounds(live, args.rounds, args.repeat,
                                   probes if max(args.threads) > 1 else None, runs)
                for e in live:
                    if e.name == "pdjit" and e.threads > 1:
                        loops = e.ask({"cmd": "waiting"})["loops"]
                        if loops:
                            notes.append(f"{name} batch {batch}: {e.label}: the parallel loops "
                                         f"{', '.join(loops)} were not compiled (`pdjit "
                                         f"warmup` compiles them): those splits ran on helper "
                                         f"threads, slower")
            finally:
                stop(busy)
            ref = firsts.get(f"pdjit {args.threads[0]}t")
            row = {"model": name, "batch": batch, "busy": bool(args.busy), "load1": load0,
                   "handoff_ms": [p for p in probes if p is not None],
                   "ms": {k: v * 1e3 for k, v in med.items()}, "runs_ms": runs,
                   "first_s": {k: v[0] for k, v in firsts.items()},
                   "max_abs_err": {k: (max_abs(ref[1], v[1]) if ref else None)
                                   for k, v in firsts.items()},
                   "rel_err": {k: (rel_err(ref[1], v[1]) if ref else None)
                               for k, v in firsts.items()}}
            rows.append(row)
            print_row_progress(row)
    finally:
        for e in engines:
            e.close()
    return rows


def print_row_progress(row) -> None:
    parts = ", ".join(f"{k} {v:.2f} ms" for k, v in row["ms"].items())
    print(f"# {row['model']} batch {row['batch']}: {parts}", file=sys.stderr, flush=True)


def report(rows: list, args, peers: list) -> None:
    th = args.threads
    engines = ["pdjit", *peers]
    head = ["model", "batch"]
    for e in engines:
        head += [f"{e} {t}t ms" for t in th]
    if len(th) > 1:
        head.append(f"pdjit {th[-1]}t / {th[0]}t")
    if "onnxruntime" in peers:
        head.append("pdjit / ORT (best threads each)")
    if "paddle" in peers:
        head.append("pdjit / Paddle (best)")
    head.append(f"max abs err vs pdjit {th[0]}t (/ max abs value)")
    if len(th) > 1:
        head.append("cross-core probe ms")
    print("\n## Models" + (" (a busy loop keeps one core busy)" if args.busy else ""))
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        ms = r["ms"]
        cells = [r["model"], str(r["batch"])]
        for e in engines:
            cells += [_ms(ms.get(f"{e} {t}t")) for t in th]

        def best(e, ms=ms):
            v = [ms[f"{e} {t}t"] for t in th if f"{e} {t}t" in ms]
            return min(v) if v else None
        if len(th) > 1:
            a, b = ms.get(f"pdjit {th[-1]}t"), ms.get(f"pdjit {th[0]}t")
            cells.append(f"{a / b:.2f}x" if a and b else "-")
        for p in ("onnxruntime", "paddle"):
            if p in peers:
                a, b = best("pdjit"), best(p)
                cells.append(f"{a / b:.2f}x" if a and b else "-")
        errs = [f"{k} {v:.1e} ({r['rel_err'][k]:.1e})" for k, v in r["max_abs_err"].items()
                if v is not None and k != f"pdjit {th[0]}t"]
        cells.append(", ".join(errs) or "-")
        if len(th) > 1:
            hs = r.get("handoff_ms") or []
            cells.append(f"{min(hs):.2f}-{max(hs):.2f}" if hs else "-")
        print("| " + " | ".join(cells) + " |")
    if len(th) > 1:
        print("\n(cross-core probe: ms for two threads to read a 1 MB array one of them has just "
              "written, before each round (`handoff_probe`); where it is about twice one "
              "thread's, every engine's two-thread runs are slower)")


def _ms(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


# ---- ResNet-50's convolutions against the core's peak ---------------------------------------
def measured_ghz() -> float:
    """The clock of a busy core, GHz: a chain of dependent 64-bit integer additions and
    exclusive ors (one cycle each on x86-64, two a step, which no compiler folds) timed over
    10^8 steps, the best of three (a turbo clock, unlike ``/proc/cpuinfo``'s nominal MHz)."""
    import numba

    @numba.njit
    def chain(n, x):
        y = x ^ 12345
        for _ in range(n):
            x = x + y
            y = y ^ x
        return x + y

    chain(10, 1)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        chain(10 ** 8, 7)
        best = min(best, time.perf_counter() - t)
    return 2e8 / best / 1e9


def fma_throughput(lanes: int, chains: int = 16, steps: int = 10 ** 7) -> float:
    """GFLOP/s of one core on FP32 fused multiply-adds of ``lanes``-wide vectors: ``chains``
    independent chains ``a = fma(a, 0.75, 0.75)`` (exact in binary, converging to 3: no
    overflow, no subnormals) in one loop of LLVM IR compiled for this CPU, ``steps`` steps, the
    best of three."""
    import ctypes

    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    vt = f"<{lanes} x float>"
    c = "<" + ", ".join(["float 0.75"] * lanes) + ">"
    phis = "\n".join(f"  %a{k} = phi {vt} [{c}, %entry], [%b{k}, %loop]" for k in range(chains))
    fmas = "\n".join(f"  %b{k} = call {vt} @llvm.fma.v{lanes}f32({vt} %a{k}, {vt} {c}, {vt} {c})"
                     for k in range(chains))
    sums = "\n".join(f"  %s{k} = fadd {vt} %s{k - 1}, %b{k}" for k in range(1, chains))
    ir = f"""
declare {vt} @llvm.fma.v{lanes}f32({vt}, {vt}, {vt})
define float @fmas(i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%j, %loop]
{phis}
{fmas}
  %j = add i64 %i, 1
  %more = icmp ult i64 %j, %n
  br i1 %more, label %loop, label %exit
exit:
  %s0 = fadd {vt} %b0, {c}
{sums}
  %r = extractelement {vt} %s{chains - 1}, i32 0
  ret float %r
}}
"""
    mod = llvm.parse_assembly(ir)
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    run = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(engine.get_function_address("fmas"))
    run(1000)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        run(steps)
        best = min(best, time.perf_counter() - t)
    return steps * chains * lanes * 2 / best / 1e9


def cpu_peak(fma_units: float | None, ghz: float | None) -> tuple:
    """(GFLOP/s of one core, clock GHz, fp32 lanes, how each was found)."""
    flags, mhz = set(), None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "flags" and not flags:
                    flags = set(v.split())
                elif k == "cpu MHz" and mhz is None:
                    mhz = float(v)
    except OSError:
        pass
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags or "fma" in flags else 4
    unit = "AVX-512" if lanes == 16 else "AVX2" if lanes == 8 else "SSE"
    if ghz:
        clock, where = ghz, "--ghz"
    else:
        clock = measured_ghz()
        where = ("measured: dependent integer adds, one a cycle"
                 + (f"; /proc/cpuinfo's nominal {mhz / 1000:.2f}" if mhz else ""))
    if fma_units:
        units, found = fma_units, "--fma-units"
    else:
        rate = fma_throughput(lanes)
        units = max(0.5, round(rate / (clock * lanes * 2) * 2) / 2)
        found = (f"measured: 16 independent chains of {lanes}-lane FMAs ran {rate:.1f} GFLOP/s, "
                 f"{rate / (clock * lanes * 2):.2f} units at this clock")
    peak = clock * lanes * units * 2
    how = (f"peak = {clock:.2f} GHz ({where}) x {lanes} fp32 lanes ({unit}, CPU flags) x "
           f"{units:g} FMA units ({found}) x 2 flops per FMA = {peak:.1f} GFLOP/s per core")
    return peak, clock, lanes, how


def resnet50_convs() -> list:
    """Distinct convolutions of ResNet-50: ((C, H, W), M, K, stride, pad), count."""
    import pdjit as fluid

    main, _, _, _, _ = _resnet50(fluid)
    gb, seen = main.global_block(), {}
    for op in gb.ops:
        if op.type != "conv2d":
            continue
        x = gb.var(op.input("Input")[0])
        w = gb.var(op.input("Filter")[0])
        key = (tuple(x.shape[1:]), w.shape[0], w.shape[2], op.attr("strides")[0],
               op.attr("paddings")[0])
        seen[key] = seen.get(key, 0) + 1
    return list(seen.items())


def save_conv(path: str, key) -> None:
    import pdjit as fluid

    (c, h, w), m, k, s, p = key
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[c, h, w], dtype="float32")
        # as ResNet-50 runs it: the bias of the batch norm folded into it, then relu
        y = fluid.layers.conv2d(x, num_filters=m, filter_size=k, stride=s, padding=p,
                                act="relu")
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=scope)
    _randomize(fluid, main, scope, SEED)
    fluid.io.save_inference_model(path, ["x"], [y], exe, main_program=main, scope=scope)


def bench_convs(args, tmp: str, peers: list, notes: list) -> list:
    peak, clock, lanes, how = cpu_peak(args.fma_units, args.ghz)
    n = args.conv_batch
    convs = resnet50_convs()
    names = ["pdjit"] + [p for p in peers if p == "onnxruntime"]
    engines = [Engine(e, 1) for e in names]
    rows = []
    busy = None
    try:
        for key, count in convs:
            (c, h, w), m, k, s, p = key
            path = os.path.join(tmp, f"conv_{c}_{h}_{m}_{k}_{s}")
            save_conv(path, key)
            oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            flops = 2 * n * m * oh * ow * c * k * k
            inputs = model_inputs({"x": (c, h, w)}, n)
            live, firsts = [], {}
            for e in engines:
                try:
                    e.load(path, tmp)
                    e.ask({"cmd": "set", "inputs": inputs})
                    firsts[e.name] = e.ask({"cmd": "first"})["outputs"]
                    warm(e)  # (as a model's engines are: pdjit's trials out of the timed runs)
                    live.append(e)
                except RuntimeError as err:
                    notes.append(f"conv {key}: {err}")
            busy = start_busy() if args.busy else None
            try:
                runs = {}
                med = timed_rounds(live, args.rounds, args.repeat, runs=runs)
            finally:
                stop(busy)
            row = {"conv": f"{c}x{h}x{w} -> {m}, {k}x{k}/{s}", "count": count,
                   "gflop": flops / 1e9,
                   "ms": {e.name: med[e.label] * 1e3 for e in live if e.label in med},
                   "runs_ms": {e.name: runs[e.label] for e in live if e.label in runs}}
            if "pdjit" in firsts and "onnxruntime" in firsts:
                row["max_abs_err"] = max_abs(firsts["pdjit"], firsts["onnxruntime"])
            rows.append(row)
            print(f"# conv {row['conv']}: " + ", ".join(f"{k} {v:.2f} ms"
                                                        for k, v in row["ms"].items()),
                  file=sys.stderr, flush=True)
    finally:
        for e in engines:
            e.close()
    print(f"\n## ResNet-50's convolutions, batch {n}, one thread")
    print(how)
    head = ["conv (C x H x W -> M, KxK/stride)", "in ResNet-50", "GFLOP"]
    for e in names:
        head += [f"{e} ms", f"{e} GFLOP/s", f"{e} % of peak"]
    head.append("max abs err")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    tot = {e: 0.0 for e in names}
    tot_flop = 0.0
    for r in rows:
        cells = [r["conv"], str(r["count"]), f"{r['gflop']:.3f}"]
        tot_flop += r["gflop"] * r["count"]
        for e in names:
            t = r["ms"].get(e)
            if t is None:
                cells += ["-", "-", "-"]
                continue
            tot[e] += t * r["count"]
            g = r["gflop"] / (t / 1e3)
            cells += [_ms(t), f"{g:.1f}", f"{100 * g / peak:.0f}%" if peak else "-"]
        err = r.get("max_abs_err")
        cells.append("-" if err is None else f"{err:.1e}")
        print("| " + " | ".join(cells) + " |")
    cells = ["all (each times its count)", str(sum(r["count"] for r in rows)), f"{tot_flop:.2f}"]
    for e in names:
        g = tot_flop / (tot[e] / 1e3) if tot[e] else None
        cells += [_ms(tot[e]), f"{g:.1f}" if g else "-",
                  f"{100 * g / peak:.0f}%" if g and peak else "-"]
    cells.append("")
    print("| " + " | ".join(cells) + " |")
    if peak and any(r["gflop"] / (t / 1e3) > peak for r in rows for t in r["ms"].values()):
        print("(above 100%: a 3x3 stride-1 layer that goes by Winograd's F(2x2, 3x3), which "
              "multiplies 2.25x fewer products than the direct flops counted here; else the "
              "core ran faster than the clock the peak assumes: give the sustained clock "
              "with --ghz)")
    return rows, how


def main() -> None:
    if "--worker" in sys.argv:
        return worker()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help=f"comma-separated, of {','.join(ALL_MODELS)}")
    ap.add_argument("--batch", default=None, help="comma-separated (default 1,16; quick: 1)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per round")
    ap.add_argument("--busy", action="store_true",
                    help="keep one core busy with a Python loop while timing")
    ap.add_argument("--no-convs", action="store_true")
    ap.add_argument("--convs-only", action="store_true")
    ap.add_argument("--conv-batch", type=int, default=None)
    ap.add_argument("--fma-units", type=float, default=None,
                    help="FMA units per core (default: measured)")
    ap.add_argument("--ghz", type=float, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in BUILDERS]
    if bad:
        ap.error(f"--models: unknown {bad} (known: {', '.join(ALL_MODELS)})")
    args.batch = [int(b) for b in (args.batch or ("1" if args.quick else "1,16")).split(",")]
    args.threads = [int(t) for t in args.threads.split(",")]
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.repeat = args.repeat or (2 if args.quick else 4)
    args.conv_batch = args.conv_batch or (1 if args.quick else 16)
    notes: list = []
    peers = peers_available(notes)
    up = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else "?"
    print(f"# bench_models: models {models}, batches {args.batch}, threads {args.threads}, "
          f"{args.rounds} rounds x {args.repeat} timed runs, busy loop {args.busy}; "
          f"load average at start {' '.join(up)}; {os.cpu_count()} cores")
    result = {"args": {k: v for k, v in vars(args).items()}, "rows": [], "convs": []}
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        if not args.convs_only:
            for m in models:
                result["rows"] += bench_model(m, args, tmp, peers, notes)
            report(result["rows"], args, peers)
        if not args.no_convs:
            result["convs"], result["peak"] = bench_convs(args, tmp, peers, notes)
    end = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else "?"
    print(f"\nload average at the end {' '.join(end)}")
    for n in notes:
        print(f"- {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
