"""LSTMs on scikit-learn's 8x8 handwritten digits (real data, offline), two ways.

1. ``fluid.layers.lstm`` (Fluid 1.8's signature; pdjit appends the ``rnn`` op, as Paddle 2.x+
   writes ``nn.LSTM``): each image is a dense sequence of its 8 rows (8 pixels each):

       rows [N, 8, 8] -> lstm(hidden) -> last hidden state [1, N, hidden] -> [N, hidden]
         -> fc(softmax) -> cross_entropy; Adam

2. ``fluid.layers.dynamic_lstm`` on variable-length LoD sequences. No image of the data set
   ends in an all-zero row, but most end in all-zero columns, so this model reads each image
   column by column and drops its trailing all-zero columns: a batch is one LoDTensor of all
   its images' columns [sum of lengths, 8] with the lengths (5 to 8) as its LoD:

       columns (lod_level=1) -> fc(4 * hidden) -> dynamic_lstm -> sequence_last_step
         -> fc(softmax) -> cross_entropy; Adam

Both train on the same fixed-seed 80/20 split, each with a progress bar of the running loss
and accuracy, and print their test accuracy; ``--plot FILE.png`` saves both models' curves.

    python examples/lstm_digits.py [--epochs 10] [--hidden 64] [--only rnn|dynamic_lstm]
                                   [--plot curves.png]
"""
import argparse
import time

from _training import Progress, add_plot_argument, check_plot_path, save_plot


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--only", choices=["rnn", "dynamic_lstm"], help="train one of the two")
    add_plot_argument(ap)
    args = ap.parse_args(argv)
    if args.plot:
        check_plot_path(ap, args.plot)  # before any training
    return args


if __name__ == "__main__":
    ARGS = parse_args()  # --help answers here, before numpy and pdjit are imported

import numpy as np  # noqa: E402

import pdjit as fluid  # noqa: E402

ROWS, PIXELS, CLASSES = 8, 8, 10


def load(seed=0):
    """Images as [N, 8, 8] float32 in [0, 1], labels as [N, 1] int64; train, test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64).reshape(-1, 1)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def column_sequences(images):
    """Each image's columns without its trailing all-zero ones: a list of [length, 8] arrays."""
    seqs = []
    for image in images:
        columns = image.T                              # column j is step j
        alive = np.flatnonzero(columns.max(axis=1) > 0)
        seqs.append(columns[:alive[-1] + 1] if len(alive) else columns[:1])
    return seqs


def to_lod_tensor(seqs):
    return fluid.create_lod_tensor(np.concatenate(seqs), [[len(s) for s in seqs]],
                                   fluid.CPUPlace())


def classifier(features, label, learning_rate):
    L = fluid.layers
    prediction = L.fc(features, CLASSES, act="softmax")
    loss = L.mean(L.cross_entropy(input=prediction, label=label))
    accuracy = L.accuracy(input=prediction, label=label)
    test_program = fluid.default_main_program().clone(for_test=True)
    fluid.optimizer.Adam(learning_rate=learning_rate).minimize(loss)
    return test_program, loss, accuracy


def build_rnn(hidden, learning_rate=0.01):
    """The ``fluid.layers.lstm`` model; feeds ``rows`` [N, 8, 8] and ``label``."""
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    L = fluid.layers
    with fluid.program_guard(main, startup):
        rows = L.data(name="rows", shape=[ROWS, PIXELS], dtype="float32")
        label = L.data(name="label", shape=[1], dtype="int64")
        init_h = L.fill_constant_batch_size_like(rows, [1, -1, hidden], "float32", 0.0,
                                                 input_dim_idx=0, output_dim_idx=1)
        init_c = L.fill_constant_batch_size_like(rows, [1, -1, hidden], "float32", 0.0,
                                                 input_dim_idx=0, output_dim_idx=1)
        _, last_h, _ = L.lstm(rows, init_h, init_c, max_len=ROWS, hidden_size=hidden,
                              num_layers=1)
        features = L.reshape(last_h, [-1, hidden])             # [1, N, hidden] -> [N, hidden]
        test_program, loss, accuracy = classifier(features, label, learning_rate)
    return main, startup, test_program, loss, accuracy


def build_dynamic_lstm(hidden, learning_rate=0.01):
    """The ``fluid.layers.dynamic_lstm`` model; feeds ``columns`` (LoD) and ``label``."""
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    L = fluid.layers
    with fluid.program_guard(main, startup):
        columns = L.data(name="columns", shape=[PIXELS], dtype="float32", lod_level=1)
        label = L.data(name="label", shape=[1], dtype="int64")
        gates = L.fc(columns, 4 * hidden)
        states, _ = L.dynamic_lstm(gates, size=4 * hidden)
        features = L.sequence_last_step(states)                # [N, hidden]
        test_program, loss, accuracy = classifier(features, label, learning_rate)
    return main, startup, test_program, loss, accuracy


def train(name, built, batches, steps_per_epoch, test_feed, epochs, rng):
    """Adam over ``batches(order)`` for ``epochs``; prints the loss per epoch and the test
    accuracy; returns the :class:`Progress` that recorded it."""
    main_prog, startup, test_prog, loss, accuracy = built
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    t0 = time.perf_counter()
    progress = Progress(epochs * steps_per_epoch, name)
    for epoch in range(epochs):
        first = len(progress.losses)
        for feed in batches(rng):
            value, acc = exe.run(main_prog, feed=feed, fetch_list=[loss, accuracy], scope=scope)
            progress.step(value[0], acc[0])
        progress.end_epoch()
        print(f"{name} epoch {epoch} train loss {np.mean(progress.losses[first:]):.4f}")
    progress.close()
    seconds = time.perf_counter() - t0
    (acc,) = exe.run(test_prog, feed=test_feed, fetch_list=[accuracy], scope=scope)
    progress.test_accuracy = float(acc[0])
    print(f"{name} trained {epochs} epochs in {seconds:.1f} s")
    print(f"{name} test accuracy: {float(acc[0]):.4f}")
    return progress


def main(args):
    (x_train, y_train), (x_test, y_test) = load()
    bs = args.batch_size
    steps = -(-len(x_train) // bs)
    runs = []

    if args.only in (None, "rnn"):
        def rnn_batches(rng):
            order = rng.permutation(len(x_train))
            for i in range(0, len(order), bs):
                idx = order[i:i + bs]
                yield {"rows": x_train[idx], "label": y_train[idx]}

        runs.append(train("rnn", build_rnn(args.hidden), rnn_batches, steps,
                          {"rows": x_test, "label": y_test}, args.epochs,
                          np.random.default_rng(0)))

    if args.only in (None, "dynamic_lstm"):
        train_seqs, test_seqs = column_sequences(x_train), column_sequences(x_test)

        def lod_batches(rng):
            order = rng.permutation(len(train_seqs))
            for i in range(0, len(order), bs):
                idx = order[i:i + bs]
                yield {"columns": to_lod_tensor([train_seqs[j] for j in idx]),
                       "label": y_train[idx]}

        runs.append(train("dynamic_lstm", build_dynamic_lstm(args.hidden), lod_batches, steps,
                          {"columns": to_lod_tensor(test_seqs), "label": y_test}, args.epochs,
                          np.random.default_rng(0)))
    if args.plot:
        save_plot(args.plot, runs, "LSTMs on the 8x8 digits: the rnn op (rows) and "
                                   "dynamic_lstm (LoD columns)")


if __name__ == "__main__":
    main(ARGS)
