"""A Fluid 1.x training script as a user ports it, run by ``test_fluid_script.py``.

``python fluid1x_train.py OUT_DIR EPOCHS [--resume]``: trains an MLP on scikit-learn's digits
for EPOCHS epochs, fed by a ``DataLoader`` from a sample generator, evaluates with
``metrics.Accuracy`` on a ``clone(for_test=True)``, saves a checkpoint with ``fluid.save``
(``--resume`` first loads the last one with ``fluid.load``) and writes what it saw to
``OUT_DIR/result.npz``: the training losses, the test predictions and the accuracy.
"""
import argparse
import os

import numpy as np
from sklearn.datasets import load_digits

import pdjit as fluid

BATCH = 64


def samples(x, y):
    def reader():
        for i in range(len(x)):
            yield x[i], y[i:i + 1]
    return reader


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("epochs", type=int)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    order = np.random.RandomState(0).permutation(len(x))
    train, test = order[:1400], order[1400:]

    main_prog, startup = fluid.Program(), fluid.Program()
    main_prog.random_seed = startup.random_seed = 1
    with fluid.program_guard(main_prog, startup):
        img = fluid.layers.data(name="img", shape=[64], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        loader = fluid.io.DataLoader.from_generator(feed_list=[img, label], capacity=8,
                                                    iterable=True)
        hidden = fluid.layers.fc(input=img, size=64, act="relu")
        prediction = fluid.layers.fc(input=hidden, size=10, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(input=prediction, label=label))
        acc = fluid.layers.accuracy(input=prediction, label=label)
        test_prog = main_prog.clone(for_test=True)
        fluid.optimizer.Adam(learning_rate=0.01).minimize(loss)
    loader.set_sample_generator(samples(x[train], y[train]), batch_size=BATCH, drop_last=False)

    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    ckpt = os.path.join(args.out, "ckpt")
    if args.resume:
        fluid.load(main_prog, ckpt, exe)

    losses = []
    for _ in range(args.epochs):
        for data in loader():
            (lv,) = exe.run(main_prog, feed=data, fetch_list=[loss])
            losses.append(float(lv[0]))
    fluid.save(main_prog, ckpt)

    metric = fluid.metrics.Accuracy()
    preds = []
    for start in range(0, len(test), BATCH):
        idx = test[start:start + BATCH]
        p, a = exe.run(test_prog, feed={"img": x[idx], "label": y[idx, None]},
                       fetch_list=[prediction, acc])
        metric.update(value=a, weight=len(idx))
        preds.append(p)
    np.savez(os.path.join(args.out, "result.npz"), losses=np.array(losses),
             preds=np.concatenate(preds), labels=y[test], accuracy=metric.eval())


if __name__ == "__main__":
    main()
