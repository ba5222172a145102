"""Pointwise (1x1, stride 1) convolutions of ResNet-50 and MobileNetV2: pdjit's kernels side by
side, one thread, float32, NCHW (``nhwc``: channels-last).

    python benchmarks/bench_pointwise.py [--batches 1,16] [--repeat N] [--only SHAPES]
        [--contenders pdjit,current,numpy,ort] [--rounds R] [--cold MB]

Contenders, each in a process of its own (one after another), every shape with a bias and a
relu after the product (the epilogue of a convolution with its batch norm folded):

- ``pdjit``: ``pointwise.pointwise_range`` on the filter packed by ``pointwise_weight``, as
  the conv lowering calls them: the packed GEMM's kernel that ``pointwise._choice`` picks
  (the epilogue applied to each tile in registers), else ``conv._fwd_range``;
- ``rows``, ``cols``: ``pgemm.pointwise_rows`` / ``pointwise.pointwise_cols`` (panels of 64 output
  channels) on every shape;
- ``current``: ``conv._fwd_range``: the taps kernel or one OpenBLAS product per sample
  (``_use_gemm``), the epilogue after;
- ``numpy``: ``np.matmul(W, x.reshape(N, C, H*W))`` (OpenBLAS sgemm per sample, no epilogue);
- ``nhwc``: ``channels_last.pointwise_nhwc`` on the image channels-last (the kernel of a
  model's 1x1 layers on planes of at most 14x14, whose chains run channels-last);
- ``ort``: ONNX Runtime, one ``Conv`` + ``Relu`` node pair (fused by its optimiser), one
  intra-op thread, timed as its ``Conv`` node's kernel time in ONNX Runtime's own profile:
  around a lone convolution it converts the image into its blocked layout and the output
  back, which a model's run does once at its ends, not per convolution (the whole call,
  conversions included, took 1.4-1.7x the node's time on ResNet-50's 14x14 and 7x7 shapes).

Each shape is warmed up, then timed ``--repeat`` times (fewer for large shapes); the table
shows medians of thread (CPU) time (ONNX Runtime's: its node's), so that other processes on
the machine count less (ms), and GFLOP/s (2 * N * M * C * H * W / time), with the load
average (``uptime``) before each process.

``--cold MB`` writes an array of that many megabytes before each timed call (more than the
last-level cache: the weights then come from memory, as in a model's run, where the other
layers' weights pass through the caches between two runs of a layer), then writes the image
again (in a model the layer before has just written it). On a 2-vCPU Intel Xeon (300 MiB of
L3 shared with other guests; ``--contenders nhwc,ort --batches 1 --rounds 3``, load 1.3-1.6)
ResNet-50's channels-last 1x1 layers took 1.18-1.31x ONNX Runtime's node time with ``--cold
600`` (14x14 256 -> 1024 1.42 / 1.14 ms, 1024 -> 256 1.28 / 1.09; 7x7 512 -> 2048 1.62 /
1.24, 2048 -> 512 1.62 / 1.24) and 1.08-1.20x with ``--cold 16`` (the weights in L3: 1.13 /
1.00, 1.12 / 1.03, 1.29 / 1.08, 1.27 / 1.08): in ResNet-50's run, layer by layer, they take
1.12-1.25x ONNX Runtime's nodes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
           "PDJIT_NUM_THREADS"):
    os.environ[_v] = "1"

import numpy as np  # noqa: E402

#: (name, C, M, H): ResNet-50's and MobileNetV2's stride-1 pointwise convolutions (224x224)
SHAPES = [
    ("r50 64->64 56", 64, 64, 56), ("r50 64->256 56", 64, 256, 56),
    ("r50 256->64 56", 256, 64, 56), ("r50 256->128 56", 256, 128, 56),
    ("r50 128->512 28", 128, 512, 28), ("r50 512->128 28", 512, 128, 28),
    ("r50 256->1024 14", 256, 1024, 14), ("r50 1024->256 14", 1024, 256, 14),
    ("r50 512->2048 7", 512, 2048, 7), ("r50 2048->512 7", 2048, 512, 7),
    ("mv2 32->16 112", 32, 16, 112), ("mv2 16->96 112", 16, 96, 112),
    ("mv2 96->24 56", 96, 24, 56), ("mv2 24->144 56", 24, 144, 56),
    ("mv2 144->24 56", 144, 24, 56), ("mv2 192->32 28", 192, 32, 28),
    ("mv2 32->192 28", 32, 192, 28), ("mv2 64->384 14", 64, 384, 14),
    ("mv2 384->64 14", 384, 64, 14), ("mv2 96->576 14", 96, 576, 14),
    ("mv2 576->96 14", 576, 96, 14), ("mv2 160->960 7", 160, 960, 7),
    ("mv2 960->160 7", 960, 160, 7), ("mv2 320->1280 7", 320, 1280, 7),
]


def _operands(n, c, m, h):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    return x, w, b


def _runner(kind, x, w, b):
    n, m, h = x.shape[0], w.shape[0], x.shape[2]
    y = np.empty((n, m, h, h), np.float32)
    e = np.empty(0, np.float32)
    if kind == "pdjit":
        from pdjit.codegen.cpu.lib import pointwise
        ap = pointwise.pointwise_weight(w, h * h)
        return lambda: pointwise.pointwise_range(x, w, ap, y, 0, n, 1, 1, 0, 0, 1, 1, 1, b, 0.0,
                                                 np.inf, e)
    if kind == "rows":
        from pdjit.codegen.cpu.lib import pgemm
        ap = np.empty(pgemm.packed_rows_size(m, w.shape[1]), np.float32)
        pgemm.pack_a(w.reshape(m, -1), ap)
        return lambda: pgemm.pointwise_rows(x, ap, y, 0, n, b, 0.0, np.inf, e)
    if kind == "cols":
        from pdjit.codegen.cpu.lib import pointwise
        bp = pointwise._pack(w, pointwise._NR)
        return lambda: pointwise.pointwise_cols(x, bp, pointwise._NR, y, 0, n, b, 0.0, np.inf,
                                                e)
    if kind == "current":
        from pdjit.codegen.cpu.lib import conv
        return lambda: conv._fwd_range(x, w, y, 0, n, 1, 1, 0, 0, 1, 1, 1, b, 0.0, np.inf, e)
    if kind == "nhwc":
        from pdjit.codegen.cpu.lib import channels_last
        xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        yl = np.empty((n, h, h, m), np.float32)
        bp = channels_last.pointwise_nhwc_weight(w)
        fn = lambda: channels_last.pointwise_nhwc(xl, bp, yl, 0, n, b, 0.0, np.inf, e, e)  # noqa: E731
        fn.image = xl
        return fn
    if kind == "numpy":
        x3, w2, y3 = x.reshape(n, x.shape[1], -1), w.reshape(m, -1), y.reshape(n, m, -1)
        return lambda: np.matmul(w2, x3, out=y3)
    if kind == "ort":
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
        g = helper.make_graph(
            [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])], "pw",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y.shape))],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"bench_pw_{os.getpid()}")
        s = ort.InferenceSession(model.SerializeToString(), so,
                                 providers=["CPUExecutionProvider"])
        onnx.checker.check_model(model)
        fn = lambda: s.run(None, {"x": x})  # noqa: E731
        fn.node_times = lambda: _conv_node_times(s)
        return fn
    raise SystemExit(f"unknown contender {kind}")


def _conv_node_times(sess) -> list:
    """The ``Conv`` node's kernel times (s) in ONNX Runtime's profile of ``sess``, in order."""
    path = sess.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.remove(path)
    return [e["dur"] * 1e-6 for e in events if e.get("cat") == "Node" and
            e["name"].endswith("_kernel_time") and e.get("args", {}).get("op_name") == "Conv"]


def child(kind, batches, shapes, repeat, cold_mb=0):
    out = {}
    junk = np.ones(cold_mb << 18, np.float32)
    for n in batches:
        for name, c, m, h in shapes:
            x, w, b = _operands(n, c, m, h)
            fn = _runner(kind, x, w, b)
            image = getattr(fn, "image", x)
            fn()
            flops = 2.0 * n * m * c * h * h
            reps = max(3, min(repeat, int(2e10 / flops)))
            ts = []
            for _ in range(reps):
                if cold_mb:
                    junk += 1.0
                    np.add(image, 0.0, out=image)
                t = time.thread_time()
                fn()
                ts.append(time.thread_time() - t)
            if hasattr(fn, "node_times"):
                ts = fn.node_times()[-reps:]
            med = float(np.median(ts))
            out[f"{name} b{n}"] = (med * 1e3, flops / med / 1e9)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--only", default="", help="substrings of shape names, comma-separated")
    ap.add_argument("--contenders", default="pdjit,current,numpy,ort")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the contenders taking turns (the medians of the rounds)")
    ap.add_argument("--cold", type=int, default=0, metavar="MB",
                    help="write this many megabytes before each call (weights from memory)")
    ap.add_argument("--child", default="")
    a = ap.parse_args()
    batches = [int(v) for v in a.batches.split(",")]
    shapes = [s for s in SHAPES if not a.only or any(o in s[0] for o in a.only.split(","))]
    if a.child:
        child(a.child, batches, shapes, a.repeat, a.cold)
        return
    runs, loads = {}, {}
    for _ in range(a.rounds):
        for kind in a.contenders.split(","):
            loads.setdefault(kind, []).append(os.getloadavg()[0])
            r = subprocess.run([sys.executable, __file__, "--child", kind, "--batches",
                                a.batches, "--repeat", str(a.repeat), "--only", a.only,
                                "--cold", str(a.cold)],
                               capture_output=True, text=True)
            if r.returncode:
                print(f"{kind}: failed\n{r.stderr[-2000:]}")
                continue
            runs.setdefault(kind, []).append(json.loads(r.stdout.strip().splitlines()[-1]))
    results = {k: {key: tuple(np.median([run[key] for run in rs], axis=0)) for key in rs[0]}
               for k, rs in runs.items()}
    kinds = list(results)
    print("load before each contender: " + ", ".join(
        f"{k} " + "/".join(f"{v:.2f}" for v in vs) for k, vs in loads.items()))
    print(f"{'shape':24s}" + "".join(f"{k + ' ms':>11s}{'GF/s':>7s}" for k in kinds))
    for key in next(iter(results.values())) if results else []:
        print(f"{key:24s}" + "".join(f"{results[k][key][0]:11.3f}{results[k][key][1]:7.0f}"
                                     for k in kinds))


if __name__ == "__main__":
    main()
