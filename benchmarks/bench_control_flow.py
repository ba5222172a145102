"""Control flow: a ``while_loop`` run natively, side by side with what a user would otherwise pick.

    python benchmarks/bench_control_flow.py [--repeat N] [--iters N] [--size N]

A ``while_loop`` of ``--iters`` (1,000) iterations of a small elementwise body
(``i = i + 1; x = x * 0.5 + 1`` on a [``--size``] = [16] float32, condition ``i < n``), timed
through a whole ``Executor.run`` and reported per iteration:

- pdjit compiled: the loop runs as one native function (no Python per iteration);
- pdjit reference: the interpreter, one NumPy reference call per op per iteration;
- PaddlePaddle's legacy executor (``FLAGS_enable_pir_api=0``, ``paddle.static.nn.while_loop``);
  skipped when paddle is not installed;
- jax: ``jax.lax.while_loop`` under ``jax.jit``; skipped when jax is not installed;
- plain Python/NumPy: the same loop written by hand on NumPy arrays.

Every contender runs in this one process, interleaved, and the medians are reported with their
ratio to the native loop. Each contender's result is checked against the NumPy loop first.
"""
from __future__ import annotations

import os

os.environ.setdefault("FLAGS_enable_pir_api", "0")   # Paddle's legacy ProgramDesc executor
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from _common import interleaved, private_cache  # noqa: E402


def numpy_loop(xv: np.ndarray, iters: int):
    i, n, x = np.zeros(1, np.int64), np.full(1, iters, np.int64), xv
    while (i < n)[0]:
        i = i + 1
        x = x * np.float32(0.5) + np.float32(1.0)
    return i, x


def pdjit_contenders(xv: np.ndarray, iters: int) -> dict:
    import pdjit as fluid

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x0 = fluid.layers.data(name="x", shape=[xv.size], dtype="float32",
                               append_batch_size=False)
        i0 = fluid.layers.fill_constant(shape=[1], dtype="int64", value=0)
        n = fluid.layers.fill_constant(shape=[1], dtype="int64", value=iters)
        i_out, x_out = fluid.layers.while_loop(
            lambda i, x: fluid.layers.less_than(i, n),
            lambda i, x: [i + 1, x * 0.5 + 1.0], [i0, x0])
    out = {}
    for mode in ("compiled", "reference"):
        exe, scope = fluid.Executor(mode=mode), fluid.Scope()
        exe.run(startup, scope=scope)

        def run(exe=exe, scope=scope):
            return exe.run(main, feed={"x": xv}, fetch_list=[i_out, x_out], scope=scope)

        out[f"pdjit {mode}"] = run
    exe = fluid.Executor()
    exe.run(main, feed={"x": xv}, fetch_list=[i_out, x_out], scope=fluid.Scope())
    (plan, ) = [p for _, p in exe._plans.values()]
    kinds = [s.kind for s in plan.steps]
    print(f"pdjit compiled plan steps: {kinds}")
    if "native_loop" not in kinds:
        print("WARNING: the loop did not compile to a native loop:")
        print("\n".join(f"  {s.describe()}" for s in plan.steps))
    return out, "native_loop" in kinds


def paddle_contender(xv: np.ndarray, iters: int):
    try:
        import paddle
    except ImportError:
        return None
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x0 = paddle.static.data("x", [xv.size], "float32")
        i0 = paddle.full([1], 0, "int64")
        n = paddle.full([1], iters, "int64")
        i_out, x_out = paddle.static.nn.while_loop(
            lambda i, x: i < n, lambda i, x: [i + 1, x * 0.5 + 1.0], [i0, x0])
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    return lambda: exe.run(main, feed={"x": xv}, fetch_list=[i_out, x_out])


def jax_contender(xv: np.ndarray, iters: int):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None

    @jax.jit
    def loop(x):
        def body(c):
            i, x = c
            return i + 1, x * jnp.float32(0.5) + jnp.float32(1.0)
        return jax.lax.while_loop(lambda c: c[0] < iters, body, (jnp.int32(0), x))

    jx = jax.device_put(xv)

    def run():
        i, x = loop(jx)
        return [np.asarray(i), np.asarray(x)]
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--size", type=int, default=16)
    args = ap.parse_args()
    private_cache()
    xv = np.random.default_rng(0).standard_normal(args.size).astype(np.float32)
    want_i, want_x = numpy_loop(xv, args.iters)

    contenders, native = pdjit_contenders(xv, args.iters)
    for name, make in (("PaddlePaddle legacy executor", paddle_contender),
                       ("jax.jit lax.while_loop", jax_contender)):
        fn = make(xv, args.iters)
        if fn is None:
            print(f"{name}: not installed, skipped")
        else:
            contenders[name] = fn
    contenders["Python loop on NumPy"] = lambda: numpy_loop(xv, args.iters)
    for name, fn in contenders.items():
        i, x = fn()
        assert int(np.asarray(i).reshape(-1)[0]) == args.iters, (name, i)
        np.testing.assert_allclose(np.asarray(x), want_x, rtol=1e-5, err_msg=name)

    res = {k: v / 1e3 for k, v in interleaved(contenders, args.repeat, warmup=1).items()}
    base = res["pdjit compiled"]
    print(f"\n## while_loop: {args.iters} iterations of i += 1; x = x*0.5 + 1 on "
          f"[{args.size}] float32 (whole Executor.run, per iteration)")
    print("| contender | µs per iteration | ms per run | vs pdjit compiled |")
    print("|---|---|---|---|")
    for k, v in res.items():
        print(f"| {k} | {v / args.iters * 1e6:.3f} | {v * 1e3:.3f} | {v / base:.2f}x |")
    goal = "meets" if base / args.iters < 1e-6 else "MISSES"
    how = "a native loop" if native else "NOT a native loop"
    print(f"\npdjit compiled ({how}): {base / args.iters * 1e6:.3f} µs per iteration ({goal} "
          f"the < 1 µs goal)")


if __name__ == "__main__":
    main()
