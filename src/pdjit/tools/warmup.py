"""``pdjit warmup``'s second part: the generated kernels of common small programs.

A generated kernel's key is its content (op types, dtypes, ranks, loop forms; never sizes,
names or numeric attributes), so the kernels of a tiny program serve every program made of
the same layers at any size. :func:`warm_programs` runs one training step of a few tiny
programs as users write them (fully connected layers with ``relu``/``tanh``/``sigmoid``/
``softmax``, ``softmax_with_cross_entropy`` and ``cross_entropy``, ``mean``; SGD, Momentum and
Adam; a convolutional network with ``batch_norm`` and pooling) and the first result of a
residual convolution block and of a classifier through the Predictor, so that their kernels
are in the cache directory before a user's first program needs them. Uses the public API only.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

#: float data, 4 samples of 8 features / one 8x8 channel, 3 classes
_BATCH, _WIDTH, _CLASSES = 4, 8, 3


def _mlp(fluid, softmax_fc: bool):
    x = fluid.layers.data(name="x", shape=[_WIDTH], dtype="float32")
    label = fluid.layers.data(name="label", shape=[1], dtype="int64")
    h = x
    for act in ("relu", "tanh", "sigmoid"):
        h = fluid.layers.fc(h, _WIDTH, act=act)
    if softmax_fc:  # the Fluid book's classifier: softmax, then cross_entropy
        prob = fluid.layers.fc(h, _CLASSES, act="softmax")
        return fluid.layers.mean(fluid.layers.cross_entropy(prob, label)), prob
    logits = fluid.layers.fc(h, _CLASSES)
    return fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, label)), logits


def _cnn(fluid):
    x = fluid.layers.data(name="x", shape=[1, _WIDTH, _WIDTH], dtype="float32")
    label = fluid.layers.data(name="label", shape=[1], dtype="int64")
    h = fluid.layers.conv2d(x, num_filters=2, filter_size=3, padding=1, bias_attr=False)
    h = fluid.layers.batch_norm(h, act="relu")
    h = fluid.layers.pool2d(h, pool_size=2, pool_type="max", pool_stride=2)
    h = fluid.layers.conv2d(h, num_filters=2, filter_size=3, padding=1, act="relu")
    h = fluid.layers.pool2d(h, pool_size=2, pool_type="max", pool_stride=2)
    logits = fluid.layers.fc(h, _CLASSES)
    return fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, label)), logits


def _residual(fluid):
    """A ResNet's stem and one bottleneck block, inference (``batch_norm`` with ``is_test``)."""
    x = fluid.layers.data(name="x", shape=[3, 16, 16], dtype="float32")

    def conv_bn(h, c, k, stride=1, act=None):
        h = fluid.layers.conv2d(h, num_filters=c, filter_size=k, stride=stride,
                                padding=(k - 1) // 2, bias_attr=False)
        return fluid.layers.batch_norm(h, act=act, is_test=True)

    h = conv_bn(x, 4, 7, 2, "relu")
    h = fluid.layers.pool2d(h, pool_size=3, pool_type="max", pool_stride=2, pool_padding=1)
    short = conv_bn(h, 4, 1)
    h = conv_bn(conv_bn(h, 4, 3, 1, "relu"), 4, 1)
    h = fluid.layers.relu(fluid.layers.elementwise_add(h, short))
    h = fluid.layers.pool2d(h, pool_type="avg", global_pooling=True)
    return x, fluid.layers.fc(h, _CLASSES, act="softmax")


def warm_programs() -> list:
    """Run the programs of the module's docstring once each (in fresh programs and scopes,
    not the user's defaults); returns ``(name, result)`` per program: its loss or output."""
    import pdjit as fluid
    from pdjit import inference, static

    rng = np.random.default_rng(0)
    feeds = {"mlp": {"x": rng.standard_normal((_BATCH, _WIDTH)).astype(np.float32)},
             "cnn": {"x": rng.standard_normal((_BATCH, 1, _WIDTH, _WIDTH)).astype(np.float32)}}
    for f in feeds.values():
        f["label"] = rng.integers(0, _CLASSES, (_BATCH, 1)).astype(np.int64)
    optimizers = {"sgd": lambda: fluid.optimizer.SGD(learning_rate=1e-3),
                  "momentum": lambda: fluid.optimizer.Momentum(learning_rate=1e-3,
                                                               momentum=0.9),
                  "adam": lambda: fluid.optimizer.Adam(learning_rate=1e-3)}
    runs = [(f"mlp-{o}", "mlp", lambda: _mlp(fluid, False), o) for o in optimizers]
    runs += [("mlp-softmax-adam", "mlp", lambda: _mlp(fluid, True), "adam"),
             ("cnn-adam", "cnn", lambda: _cnn(fluid), "adam")]
    results = []
    with tempfile.TemporaryDirectory(prefix="pdjit-warmup-") as tmp:
        for name, data, build, opt in runs:
            main, startup = fluid.Program(), fluid.Program()
            with fluid.program_guard(main, startup), fluid.unique_name.guard():
                loss, out = build()
                infer = main.clone(for_test=True)
                optimizers[opt]().minimize(loss)
            exe, scope = fluid.Executor(fluid.CPUPlace(), cold_runs="compile"), fluid.Scope()
            exe.run(startup, scope=scope)
            (value,) = exe.run(main, feed=feeds[data], fetch_list=[loss], scope=scope)
            results.append((name, value))
            if opt == "adam":  # the trained model's inference, as a Predictor runs it
                x = infer.global_block().var("x")
                path = os.path.join(tmp, name)
                static.save_inference_model(path, [x], [infer.global_block().var(out.name)],
                                            exe, program=infer, scope=scope)
                results.append((f"{name}-predictor", _predict(inference, path,
                                                              feeds[data]["x"][:1])))
        main, startup = fluid.Program(), fluid.Program()
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            x, out = _residual(fluid)
        exe, scope = fluid.Executor(fluid.CPUPlace(), cold_runs="compile"), fluid.Scope()
        exe.run(startup, scope=scope)
        path = os.path.join(tmp, "residual")
        static.save_inference_model(path, [x], [out], exe, program=main, scope=scope)
        xv = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        results.append(("residual-predictor", _predict(inference, path, xv)))
    return results


def _predict(inference, path: str, x: np.ndarray):
    config = inference.Config(path + ".pdmodel", path + ".pdiparams")
    config.switch_native_drivers(False)  # a model's own driver serves no other model
    (out,) = inference.create_predictor(config).run([x])
    return out
