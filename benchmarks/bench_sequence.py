"""sequence_pool over a LoD batch: pdjit's compiled loop over offsets side by side with NumPy,
PaddlePaddle's legacy executor and the memory-bandwidth bound.

    python benchmarks/bench_sequence.py [--repeat N] [--sequences 10000] [--threads T]

The batch: ``--sequences`` sequences of random length 1-100 (seed 0) of 64 float32 features
(~129 MB for 10,000). Contenders, measured interleaved in this one process, medians reported:

- pdjit: ``Executor.run`` of a program ``data(lod_level=1) -> sequence_pool(average)`` fed a
  LoDTensor, fetching the pooled [sequences, 64] array (feed checks and fetch included);
- NumPy: ``np.add.reduceat(x, starts, axis=0) / lengths``;
- PaddlePaddle's legacy executor (``FLAGS_enable_pir_api=0``, a ``sequence_pool`` op appended
  with ``LayerHelper``), fed a ``LoDTensor``; skipped when paddle is not installed;
- the bound: a numba loop that only sums every row of the batch into one row (reads the data
  once, writes nothing), with as many threads as pdjit uses.
"""
from __future__ import annotations

import os

os.environ.setdefault("FLAGS_enable_pir_api", "0")  # Paddle's legacy ProgramDesc executor
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from _common import interleaved, private_cache, report  # noqa: E402

FEATURES = 64


def make_batch(sequences: int):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 101, sequences)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    x = rng.standard_normal((int(offsets[-1]), FEATURES)).astype(np.float32)
    return x, lengths, offsets


def paddle_contender(x, offsets):
    """A callable running Paddle's legacy sequence_pool, and its result; None if no paddle."""
    try:
        import paddle
        from paddle.base import core
        from paddle.base.layer_helper import LayerHelper
    except ImportError:
        return None, None
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        xv = paddle.static.data("x", [-1, FEATURES], "float32", lod_level=1)
        helper = LayerHelper("sequence_pool")
        out = helper.create_variable_for_type_inference("float32")
        index = helper.create_variable_for_type_inference("int32", stop_gradient=True)
        helper.append_op(type="sequence_pool", inputs={"X": [xv]},
                         outputs={"Out": [out], "MaxIndex": [index]},
                         attrs={"pooltype": "AVERAGE", "is_test": True, "pad_value": 0.0})
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    t = core.LoDTensor()
    t.set(x, paddle.CPUPlace())
    t.set_lod([offsets.tolist()])

    def run():
        return exe.run(main, feed={"x": t}, fetch_list=[out])[0]
    return run, run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--sequences", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=0,
                    help="pdjit's (and the bound's) thread count; 0: pdjit's default")
    args = ap.parse_args()
    private_cache()

    import numba

    import pdjit as fluid

    if args.threads:
        fluid.set_num_threads(args.threads)
    threads = fluid.get_num_threads()
    x, lengths, offsets = make_batch(args.sequences)
    starts = offsets[:-1]

    prog = fluid.Program()
    with fluid.program_guard(prog, fluid.Program()):
        xv = fluid.data(name="x", shape=[None, FEATURES], dtype="float32", lod_level=1)
        pooled = fluid.layers.sequence_pool(xv, "average")
    exe, scope = fluid.Executor(fluid.CPUPlace()), fluid.Scope()
    feed = {"x": fluid.create_lod_tensor(x, [lengths.tolist()])}

    def pdjit_run():
        return exe.run(prog, feed=feed, fetch_list=[pooled], scope=scope)[0]

    def numpy_run():
        return np.add.reduceat(x, starts, axis=0) / lengths[:, None].astype(np.float32)

    numba.set_num_threads(threads)

    @numba.njit(parallel=True, error_model="numpy")
    def bound(x):
        rows, width = x.shape
        chunks = numba.get_num_threads()
        part = np.zeros((chunks, width), np.float32)
        step = (rows + chunks - 1) // chunks
        for c in numba.prange(chunks):
            for i in range(c * step, min(rows, (c + 1) * step)):
                for k in range(width):
                    part[c, k] += x[i, k]
        return part

    want = numpy_run()
    np.testing.assert_allclose(pdjit_run(), want, rtol=1e-4, atol=1e-5)
    steps = [s for _, plan in exe._plans.values() for s in plan.steps]
    assert all(getattr(s, "fallbacks", 1) == 0 for s in steps), "pdjit did not run natively"
    contenders = {
        "pdjit Executor.run (compiled)": pdjit_run,
        "NumPy add.reduceat / lengths": numpy_run,
        f"bound: numba sum of all rows ({threads} thread(s))": lambda: bound(x),
    }
    paddle_run, paddle_out = paddle_contender(x, offsets)
    if paddle_run is not None:
        np.testing.assert_allclose(np.asarray(paddle_out), want, rtol=1e-4, atol=1e-5)
        contenders["PaddlePaddle legacy executor"] = paddle_run
    else:
        print("paddlepaddle is not installed: its contender is skipped")
    res = interleaved(contenders, args.repeat)
    mb = x.nbytes / 1e6
    report(f"sequence_pool(average), {args.sequences} sequences of length 1-100, "
           f"{FEATURES} float32 features ({mb:.0f} MB), pdjit threads {threads}", res,
           "NumPy add.reduceat / lengths", digits=3)
    ms = res["pdjit Executor.run (compiled)"]
    print(f"pdjit: {mb / ms:.1f} GB/s effective; "
          f"{res['NumPy add.reduceat / lengths'] / ms:.2f}x faster than NumPy")


if __name__ == "__main__":
    main()
