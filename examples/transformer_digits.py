"""A 2-layer transformer encoder on scikit-learn's 8x8 handwritten digits (real data, offline).

Each image is read as a sequence of its 8 rows (8 pixels each). The model, written with the
Fluid 1.x API as a Fluid user writes a transformer:

    rows [N, 8, 8] -> fc(num_flatten_dims=2) to d_model + a learned position embedding
    2 x encoder layer (post-norm, as in BERT):
        multi-head self-attention: q, k, v = fc(x); split heads by reshape + transpose;
            softmax(matmul(q, k^T, alpha=1/sqrt(d_head))) -> dropout -> matmul(., v);
            heads merged back by transpose + reshape; fc
        x = layer_norm(x + dropout(attention))
        x = layer_norm(x + dropout(fc(gelu(fc(x)))))
    reduce_mean over the rows -> fc(softmax) -> cross_entropy; Adam

trained on a fixed-seed 80/20 split; the test accuracy comes from a test clone of the program
(``clone(for_test=True)``: dropout off). Shows a progress bar with the running loss and
accuracy; ``--plot FILE.png`` saves the curves.

    python examples/transformer_digits.py [--epochs 12] [--batch-size 32] [--plot curves.png]
"""
import argparse
import time

from _training import Progress, add_plot_argument, check_plot_path, save_plot


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12)
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

ROWS, PIXELS, CLASSES = 8, 8, 10


def load(seed=0):
    """Images as [N, 8, 8] float32 in [0, 1] (a sequence of 8 rows), labels as [N, 1] int64."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64).reshape(-1, 1)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def multi_head_attention(x, d_model, heads, dropout):
    """Self-attention over ``x`` [N, S, d_model] with ``heads`` heads."""
    L = fluid.layers
    d_head = d_model // heads

    def split_heads(t):  # [N, S, d_model] -> [N, heads, S, d_head]
        t = L.reshape(t, [0, 0, heads, d_head])
        return L.transpose(t, [0, 2, 1, 3])

    q = split_heads(L.fc(x, d_model, num_flatten_dims=2))
    k = split_heads(L.fc(x, d_model, num_flatten_dims=2))
    v = split_heads(L.fc(x, d_model, num_flatten_dims=2))
    scores = L.matmul(q, k, transpose_y=True, alpha=d_head ** -0.5)  # [N, heads, S, S]
    weights = L.softmax(scores)
    if dropout:
        weights = L.dropout(weights, dropout, dropout_implementation="upscale_in_train")
    context = L.matmul(weights, v)                                    # [N, heads, S, d_head]
    context = L.reshape(L.transpose(context, [0, 2, 1, 3]), [0, 0, d_model])
    return L.fc(context, d_model, num_flatten_dims=2)


def encoder_layer(x, d_model, heads, d_ffn, dropout):
    L = fluid.layers

    def drop(t):
        return L.dropout(t, dropout, dropout_implementation="upscale_in_train") if dropout else t

    attention = multi_head_attention(x, d_model, heads, dropout)
    x = L.layer_norm(L.elementwise_add(x, drop(attention)), begin_norm_axis=2)
    hidden = L.gelu(L.fc(x, d_ffn, num_flatten_dims=2))
    ffn = L.fc(drop(hidden), d_model, num_flatten_dims=2)
    return L.layer_norm(L.elementwise_add(x, drop(ffn)), begin_norm_axis=2)


def build(d_model=64, heads=4, d_ffn=128, layers=2, dropout=0.1, learning_rate=0.002):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 1
    L = fluid.layers
    with fluid.program_guard(main, startup):
        rows = L.data(name="rows", shape=[ROWS, PIXELS], dtype="float32")   # [N, 8, 8]
        label = L.data(name="label", shape=[1], dtype="int64")
        x = L.fc(rows, d_model, num_flatten_dims=2)
        position = L.create_parameter(
            [ROWS, d_model], "float32", name="position_embedding",
            default_initializer=fluid.initializer.Normal(0.0, 0.02))
        x = L.elementwise_add(x, position, axis=1)
        for _ in range(layers):
            x = encoder_layer(x, d_model, heads, d_ffn, dropout)
        pooled = L.reduce_mean(x, dim=1)                                    # [N, d_model]
        prediction = L.fc(pooled, CLASSES, act="softmax")
        loss = L.mean(L.cross_entropy(input=prediction, label=label))
        accuracy = L.accuracy(input=prediction, label=label)
        test_program = main.clone(for_test=True)
        fluid.optimizer.Adam(learning_rate=learning_rate).minimize(loss)
    return main, startup, test_program, loss, accuracy


def main(args):
    (x_train, y_train), (x_test, y_test) = load()
    main_prog, startup, test_prog, loss, accuracy = build()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    steps_per_epoch = -(-len(x_train) // args.batch_size)
    progress = Progress(args.epochs * steps_per_epoch, "transformer")
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            value, acc = exe.run(main_prog, feed={"rows": x_train[idx], "label": y_train[idx]},
                                 fetch_list=[loss, accuracy])
            progress.step(value[0], acc[0])
        epoch_losses = progress.losses[progress.epoch_ends[-1] if progress.epoch_ends else 0:]
        progress.end_epoch()
        print(f"epoch {epoch} train loss {np.mean(epoch_losses):.4f}")
    progress.close()
    seconds = time.perf_counter() - t0
    (acc,) = exe.run(test_prog, feed={"rows": x_test, "label": y_test}, fetch_list=[accuracy])
    progress.test_accuracy = float(acc[0])
    print(f"trained {args.epochs} epochs in {seconds:.1f} s")
    print(f"test accuracy: {float(acc[0]):.4f}")
    if args.plot:
        save_plot(args.plot, [progress], "A 2-layer transformer encoder on the 8x8 digits")


if __name__ == "__main__":
    main(ARGS)
