"""Export public models with PaddlePaddle for ``bench_coldstart.py --paddle-models DIR``.

    FLAGS_enable_pir_api=0 python benchmarks/export_paddle_models.py DIR [--models a,b]

Run with a Python that has ``paddlepaddle`` (3.3.1, CPU wheel); pdjit is not imported. Each
model is a ``paddle.vision.models`` network with Paddle's random initial weights, in eval mode
(224x224 images; Inception-v3's 299x299),
saved by ``paddle.jit.save`` in the legacy format (``FLAGS_enable_pir_api=0``), or a classifier
of two ``paddle.nn.GRU`` layers built in static mode and saved by ``save_inference_model``:
``DIR/<name>.pdmodel`` + ``DIR/<name>.pdiparams``, and ``DIR/<name>_io.npz`` with one input
(``x``, batch 1) and Paddle's output for it (``y``) computed from the saved files. Model files
are not for committing.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("FLAGS_enable_pir_api", "0")  # before ``import paddle``

import numpy as np  # noqa: E402


def _export_gru(paddle, prefix, seed):
    """A 2-layer GRU classifier over [B, 32, 64] (fc on the last step), built in static mode
    (``paddle.jit.save`` of ``nn.GRU`` fails in legacy mode) and saved with
    ``save_inference_model``; returns (x, Paddle's output from the saved files)."""
    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        main.random_seed = startup.random_seed = seed
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [-1, 32, 64], "float32")
            y, _ = paddle.nn.GRU(64, 128, num_layers=2)(x)
            out = paddle.static.nn.fc(y[:, -1, :], 10)
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(startup)
            paddle.static.save_inference_model(prefix, [x], [out], exe, program=main)
        xv = np.random.default_rng(seed).standard_normal((1, 32, 64)).astype(np.float32)
        with paddle.static.scope_guard(paddle.static.Scope()):
            prog, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
            (yv,) = exe.run(prog, feed={feeds[0]: xv}, fetch_list=fetches)
        return xv, np.asarray(yv)
    finally:
        paddle.disable_static()


def models(paddle):
    vm = paddle.vision.models
    img = [1, 3, 224, 224]
    return {
        "squeezenet": lambda: (vm.squeezenet1_1(), img),
        "mobilenetv3_small": lambda: (vm.mobilenet_v3_small(), img),
        "vgg11": lambda: (vm.vgg11(), img),
        "resnet50": lambda: (vm.resnet50(), img),
        "resnet18": lambda: (vm.resnet18(), img),
        "gru": None,  # static mode: _export_gru
        "mobilenetv2": lambda: (vm.mobilenet_v2(), img),
        "shufflenetv2": lambda: (vm.shufflenet_v2_x1_0(), img),
        "densenet121": lambda: (vm.densenet121(), img),
        "googlenet": lambda: (vm.googlenet(), img),
        "inceptionv3": lambda: (vm.inception_v3(), [1, 3, 299, 299]),
        "mobilenetv1": lambda: (vm.mobilenet_v1(), img),
        "mobilenetv3_large": lambda: (vm.mobilenet_v3_large(), img),
        "resnext50": lambda: (vm.resnext50_32x4d(), img),
        "alexnet": lambda: (vm.alexnet(), img),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--models", default="", help="comma-separated (default: all)")
    args = ap.parse_args(argv)
    import paddle

    table = models(paddle)
    names = [m for m in args.models.split(",") if m] or list(table)
    os.makedirs(args.out, exist_ok=True)
    for i, name in enumerate(names):
        paddle.seed(i)
        prefix = os.path.join(args.out, name)
        if table[name] is None:
            x, y = _export_gru(paddle, prefix, i)
            np.savez(prefix + "_io.npz", x=x, y=y)
            print(f"{name}: {list(x.shape)} -> {list(y.shape)}", flush=True)
            continue
        net, shape = table[name]()
        net.eval()
        spec = [paddle.static.InputSpec([None, *shape[1:]], "float32", "x")]
        paddle.jit.save(net, prefix, input_spec=spec)
        x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
        loaded = paddle.jit.load(prefix)
        loaded.eval()
        y = loaded(paddle.to_tensor(x))
        y = (y[0] if isinstance(y, (list, tuple)) else y).numpy()
        np.savez(prefix + "_io.npz", x=x, y=y)
        size = os.path.getsize(prefix + ".pdiparams") / 2**20
        print(f"{name}: {shape} -> {list(y.shape)}, {size:.1f} MiB of parameters", flush=True)


if __name__ == "__main__":
    sys.exit(main())
