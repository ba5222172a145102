"""A small CNN on scikit-learn's bundled 8x8 handwritten digits (real data, offline).

Two conv-batch_norm-relu-pool stages and an fc classifier, trained with Adam on a fixed-seed
80/20 split; the test accuracy comes from a test clone of the program
(``clone(for_test=True)``: batch_norm then normalises with its moving statistics). Shows a
progress bar with the running loss and accuracy and, with ``--plot FILE.png`` (needs
matplotlib; the path is checked before training), saves a figure of the loss and accuracy.

    python examples/digits_cnn.py [--epochs 15] [--plot curves.png]
"""
import argparse

from _training import Progress, add_plot_argument, check_plot_path, save_plot


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32)
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
    """Images as [N, 1, 8, 8] float32 in [0, 1], labels as [N, 1] int64; train, test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64).reshape(-1, 1)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def conv_bn_relu_pool(x, channels):
    """3x3 convolution (no bias: batch_norm's shift is one), batch_norm + relu, 2x2 max-pool."""
    x = fluid.layers.conv2d(input=x, num_filters=channels, filter_size=3, padding=1,
                            bias_attr=False)
    x = fluid.layers.batch_norm(input=x, act="relu")
    return fluid.layers.pool2d(input=x, pool_size=2, pool_type="max", pool_stride=2)


def build(learning_rate=0.005):
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        image = fluid.layers.data(name="image", shape=[1, 8, 8], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        hidden = conv_bn_relu_pool(image, 16)    # [N, 16, 4, 4]
        hidden = conv_bn_relu_pool(hidden, 32)   # [N, 32, 2, 2]
        prediction = fluid.layers.fc(input=hidden, size=10, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(input=prediction, label=label))
        accuracy = fluid.layers.accuracy(input=prediction, label=label)
        test_program = main.clone(for_test=True)
        fluid.optimizer.Adam(learning_rate=learning_rate).minimize(loss)
    return main, startup, test_program, loss, accuracy


def main(args):
    (x_train, y_train), (x_test, y_test) = load()
    main_prog, startup, test_prog, loss, accuracy = build()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(0)
    steps_per_epoch = -(-len(x_train) // args.batch_size)
    progress = Progress(args.epochs * steps_per_epoch, "digits CNN")
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
        save_plot(args.plot, [progress], "A CNN (conv, batch norm, pool) on the 8x8 digits")


if __name__ == "__main__":
    main(ARGS)
