"""Bag-of-embeddings text classification on variable-length sequences (LoD tensors).

Synthetic, learnable data: each class has a few "topic" words it uses often; a document is
1-40 token ids drawn from its class's topic words and a shared background vocabulary (a few
training documents are empty). A batch is one LoDTensor of all its token ids with the document
lengths as its LoD:

    words (int64 [tokens, 1], lod_level=1) -> embedding -> sequence_pool(average)
      -> fc(softmax) -> cross_entropy -> Adam

The compiled executor runs sequence_pool as a native loop over the LoD offsets. Shows a
progress bar with the running loss and accuracy; ``--plot FILE.png`` saves the curves.

    python examples/text_classification.py [--epochs 4] [--pool average|sum|sqrt|max]
                                           [--plot curves.png]
"""
import argparse
import time

from _training import Progress, add_plot_argument, check_plot_path, save_plot


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-size", type=int, default=4000)
    ap.add_argument("--pool", default="average", choices=["average", "sum", "sqrt", "max"])
    add_plot_argument(ap)
    args = ap.parse_args(argv)
    if args.plot:
        check_plot_path(ap, args.plot)  # before any training
    return args


if __name__ == "__main__":
    ARGS = parse_args()  # --help answers here, before numpy and pdjit are imported

import numpy as np  # noqa: E402

import pdjit as fluid  # noqa: E402

VOCAB, CLASSES, TOPIC_WORDS, EMBED = 2000, 4, 30, 32


def make_data(n, rng, empty_fraction=0.0):
    """``n`` documents: (list of token-id lists, labels)."""
    topics = np.arange(CLASSES * TOPIC_WORDS).reshape(CLASSES, TOPIC_WORDS) + 1
    docs, labels = [], rng.integers(0, CLASSES, n)
    for label in labels:
        length = int(rng.integers(1, 41))
        if rng.random() < empty_fraction:
            length = 0
        topical = rng.random(length) < 0.3
        words = np.where(topical, rng.choice(topics[label], length),
                         rng.integers(CLASSES * TOPIC_WORDS + 1, VOCAB, length))
        docs.append(words.tolist())
    return docs, labels.astype(np.int64).reshape(-1, 1)


def to_lod_tensor(docs):
    return fluid.create_lod_tensor(docs, [[len(d) for d in docs]], fluid.CPUPlace())


def build(pool):
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        words = fluid.data(name="words", shape=[None, 1], dtype="int64", lod_level=1)
        label = fluid.data(name="label", shape=[None, 1], dtype="int64")
        emb = fluid.layers.embedding(input=words, size=[VOCAB, EMBED])
        bag = fluid.layers.sequence_pool(input=emb, pool_type=pool)
        prediction = fluid.layers.fc(input=bag, size=CLASSES, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(input=prediction, label=label))
        accuracy = fluid.layers.accuracy(input=prediction, label=label)
        test_program = main.clone(for_test=True)
        fluid.optimizer.Adam(learning_rate=0.02).minimize(loss)
    return main, startup, test_program, loss, accuracy


def main(args):
    rng = np.random.default_rng(0)
    train_docs, train_labels = make_data(args.train_size, rng, empty_fraction=0.01)
    test_docs, test_labels = make_data(1000, rng)
    main_prog, startup, test_prog, loss, accuracy = build(args.pool)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    t0 = time.perf_counter()
    steps_per_epoch = -(-len(train_docs) // args.batch_size)
    progress = Progress(args.epochs * steps_per_epoch, "text classification")
    for epoch in range(args.epochs):
        order = rng.permutation(len(train_docs))
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            feed = {"words": to_lod_tensor([train_docs[j] for j in idx]),
                    "label": train_labels[idx]}
            value, acc = exe.run(main_prog, feed=feed, fetch_list=[loss, accuracy])
            progress.step(value[0], acc[0])
        epoch_losses = progress.losses[progress.epoch_ends[-1] if progress.epoch_ends else 0:]
        progress.end_epoch()
        print(f"epoch {epoch} train loss {np.mean(epoch_losses):.4f}")
    progress.close()
    seconds = time.perf_counter() - t0
    (acc,) = exe.run(test_prog, feed={"words": to_lod_tensor(test_docs), "label": test_labels},
                     fetch_list=[accuracy])
    progress.test_accuracy = float(acc[0])
    print(f"trained {args.epochs} epochs in {seconds:.1f} s")
    print(f"test accuracy: {float(acc[0]):.4f}")
    if args.plot:
        save_plot(args.plot, [progress], f"Bag-of-embeddings text classification "
                                         f"({args.pool} pooling)")


if __name__ == "__main__":
    main(ARGS)
