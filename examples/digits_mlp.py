"""An MLP on scikit-learn's bundled handwritten digits (real data, offline).

A fixed-seed 80/20 split, mini-batches, Adam, and the test accuracy of the trained model
evaluated with a test clone of the program. Shows a progress bar with the running loss and
accuracy and, with ``--plot FILE.png`` (needs matplotlib; the path is checked before training),
saves a figure of the loss and accuracy curves.

    python examples/digits_mlp.py [--epochs 25] [--plot curves.png]
"""
import argparse

from _training import Progress, add_plot_argument, check_plot_path, save_plot


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=25)
    ap.add_argument("--batch-size", type=int, default=64)
    add_plot_argument(ap)
    args = ap.parse_args(argv)
    if args.plot:
        check_plot_path(ap, args.plot)  # before any training
    return args


if __name__ == "__main__":
    ARGS = parse_args()  # --help answers here, before numpy and pdjit are imported

import numpy as np  # noqa: E402

import pdjit as fluid  # noqa: E402


def load(seed=0):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64).reshape(-1, 1)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def build():
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        image = fluid.layers.data(name="image", shape=[64], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        hidden = fluid.layers.fc(input=image, size=128, act="relu")
        hidden = fluid.layers.fc(input=hidden, size=64, act="relu")
        prediction = fluid.layers.fc(input=hidden, size=10, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(input=prediction, label=label))
        accuracy = fluid.layers.accuracy(input=prediction, label=label)
        test_program = main.clone(for_test=True)
        fluid.optimizer.Adam(learning_rate=0.01).minimize(loss)
    return main, startup, test_program, loss, accuracy


def main(args):
    (x_train, y_train), (x_test, y_test) = load()
    main_prog, startup, test_prog, loss, accuracy = build()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(0)
    steps_per_epoch = -(-len(x_train) // args.batch_size)
    progress = Progress(args.epochs * steps_per_epoch, "digits MLP")
    for _ in range(args.epochs):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            value, acc = exe.run(main_prog, feed={"image": x_train[idx], "label": y_train[idx]},
                                 fetch_list=[loss, accuracy])
            progress.step(value[0], acc[0])
        progress.end_epoch()
    progress.close()
    (acc,) = exe.run(test_prog, feed={"image": x_test, "label": y_test}, fetch_list=[accuracy])
    progress.test_accuracy = float(acc[0])
    print(f"final training loss: {np.mean(progress.losses[-10:]):.4f}")
    print(f"test accuracy: {float(acc[0]):.4f}")
    if args.plot:
        save_plot(args.plot, [progress], "An MLP on the 8x8 digits")


if __name__ == "__main__":
    main(ARGS)
