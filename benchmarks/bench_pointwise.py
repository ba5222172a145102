"""Pointwise (1x1, stride 1) convolutions of ResNet-50 and MobileNetV2: pdjit's kernels side by
side, one thread, float32, NCHW.

    python benchmarks/bench_pointwise.py [--batches 1,16] [--repeat N] [--only SHAPES]
        [--contenders pdjit,current,numpy,ort] [--rounds R]

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
- ``ort``: ONNX Runtime, one ``Conv`` + ``Relu`` node pair (fused by its optimiser), one
  intra-op thread.

Each shape is warmed up, then timed ``--repeat`` times (fewer for large shapes); the table
shows medians of thread (CPU) time, so that other processes on the machine count less (ms),
and GFLOP/s (2 * N * M * C * H * W / time), with the load average (``uptime``) before each
process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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
        s = ort.InferenceSession(model.SerializeToString(), so,
                                 providers=["CPUExecutionProvider"])
        onnx.checker.check_model(model)
        return lambda: s.run(None, {"x": x})
    raise SystemExit(f"unknown contender {kind}")


def child(kind, batches, shapes, repeat):
    out = {}
    for n in batches:
        for name, c, m, h in shapes:
            x, w, b = _operands(n, c, m, h)
            fn = _runner(kind, x, w, b)
            fn()
            flops = 2.0 * n * m * c * h * h
            reps = max(3, min(repeat, int(2e10 / flops)))
            ts = []
            for _ in range(reps):
                t = time.thread_time()
                fn()
                ts.append(time.thread_time() - t)
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
    ap.add_argument("--child", default="")
    a = ap.parse_args()
    batches = [int(v) for v in a.batches.split(",")]
    shapes = [s for s in SHAPES if not a.only or any(o in s[0] for o in a.only.split(","))]
    if a.child:
        child(a.child, batches, shapes, a.repeat)
        return
    runs, loads = {}, {}
    for _ in range(a.rounds):
        for kind in a.contenders.split(","):
            loads.setdefault(kind, []).append(os.getloadavg()[0])
            r = subprocess.run([sys.executable, __file__, "--child", kind, "--batches",
                                a.batches, "--repeat", str(a.repeat), "--only", a.only],
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
