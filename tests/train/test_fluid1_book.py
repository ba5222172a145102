"""The remaining book chapters as Fluid 1.x programs, written the way their authors wrote them
and run unchanged with ``import pdjit as fluid`` on synthetic data of small shapes:
recognize_digits with LeNet (``nets.simple_img_conv_pool``), understand_sentiment (the
convolution net with ``nets.sequence_conv_pool`` and the stacked ``dynamic_lstm`` net),
label_semantic_roles (stacked bidirectional ``dynamic_lstm``, ``linear_chain_crf`` and
``crf_decoding`` sharing a named transition parameter, SGD with ``exponential_decay``) and
machine_translation's training part (an LSTM encoder, a ``DynamicRNN`` decoder with attention
over ``static_input``s). They index ``loss[0]``, print with ``%f``, and the loss falls."""
import math

import numpy

import pdjit as fluid
from pdjit.testing import assert_native


def batch(reader, batch_size):
    """``paddle.batch``: a reader of lists of ``batch_size`` samples."""
    def batched():
        b = []
        for sample in reader():
            b.append(sample)
            if len(b) == batch_size:
                yield b
                b = []
        if b:
            yield b
    return batched


# ---------------------------------------------------------------- recognize_digits: LeNet

def mnist_reader(n, seed):
    """28x28 digits: each class lights its own 7x7 block of a 4x4 grid, plus noise."""
    rng = numpy.random.RandomState(seed)

    def reader():
        for _ in range(n):
            label = rng.randint(0, 10)
            img = rng.normal(0, 0.3, (28, 28)).astype("float32")
            r, c = divmod(label, 4)
            img[r * 7:r * 7 + 7, c * 7:c * 7 + 7] += 1.0
            yield img.reshape(1, 28, 28), label
    return reader


def loss_net(hidden, label):
    prediction = fluid.layers.fc(input=hidden, size=10, act='softmax')
    loss = fluid.layers.cross_entropy(input=prediction, label=label)
    avg_loss = fluid.layers.mean(loss)
    acc = fluid.layers.accuracy(input=prediction, label=label)
    return prediction, avg_loss, acc


def convolutional_neural_network(img, label):
    conv_pool_1 = fluid.nets.simple_img_conv_pool(
        input=img, filter_size=5, num_filters=20, pool_size=2, pool_stride=2, act="relu")
    conv_pool_1_bn = fluid.layers.batch_norm(conv_pool_1)
    conv_pool_2 = fluid.nets.simple_img_conv_pool(
        input=conv_pool_1_bn, filter_size=5, num_filters=50, pool_size=2, pool_stride=2,
        act="relu")
    return loss_net(conv_pool_2, label) + (conv_pool_1,)


def _numpy_conv_relu_pool(img, w, b):
    """conv2d (no padding, stride 1), bias, relu, 2x2 max pool with stride 2."""
    n, c, h, wd = img.shape
    f, _, k, _ = w.shape
    oh, ow = h - k + 1, wd - k + 1
    cols = numpy.stack([img[:, :, i:i + oh, j:j + ow] for i in range(k) for j in range(k)],
                       axis=2)                               # n, c, k*k, oh, ow
    out = numpy.einsum('nckhw,fck->nfhw', cols, w.reshape(f, c, k * k)) + b.reshape(1, f, 1, 1)
    out = numpy.maximum(out, 0)
    return out.reshape(n, f, oh // 2, 2, ow // 2, 2).max(axis=(3, 5))


def test_recognize_digits_lenet(fresh_programs, capsys):
    main_program, startup_program = fresh_programs
    main_program.random_seed = startup_program.random_seed = 90
    BATCH_SIZE, PASS_NUM = 8, 2
    img = fluid.layers.data(name='img', shape=[1, 28, 28], dtype='float32')
    label = fluid.layers.data(name='label', shape=[1], dtype='int64')
    prediction, avg_loss, acc, conv_pool_1 = convolutional_neural_network(img, label)
    test_program = main_program.clone(for_test=True)
    optimizer = fluid.optimizer.Adam(learning_rate=0.001)
    optimizer.minimize(avg_loss)

    train_reader = batch(mnist_reader(48, seed=1), batch_size=BATCH_SIZE)
    test_reader = batch(mnist_reader(16, seed=2), batch_size=BATCH_SIZE)
    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    feeder = fluid.DataFeeder(feed_list=[img, label], place=place)
    exe.run(fluid.default_startup_program())

    losses = []
    for pass_id in range(PASS_NUM):
        for batch_id, data in enumerate(train_reader()):
            loss_np, acc_np = exe.run(main_program, feed=feeder.feed(data),
                                      fetch_list=[avg_loss, acc])
            print("Pass %d, Batch %d, Cost %f, Acc %f" % (pass_id, batch_id, loss_np[0],
                                                          acc_np[0]))
            losses.append(float(loss_np[0]))
        acc_set, avg_loss_set = [], []
        for test_data in test_reader():
            acc_np, avg_loss_np, pred_np, conv_np = exe.run(
                program=test_program, feed=feeder.feed(test_data),
                fetch_list=[acc, avg_loss, prediction, conv_pool_1])
            acc_set.append(float(acc_np[0]))      # NumPy 2.4 refuses float() of a [1] array
            avg_loss_set.append(float(avg_loss_np[0]))
        acc_val = numpy.array(acc_set).mean()
        avg_loss_val = numpy.array(avg_loss_set).mean()
        print('PassID {0:1}, Test Loss {1:2.2}, Acc {2:2.2}'.format(
            pass_id, float(avg_loss_val), float(acc_val)))
        if math.isnan(float(avg_loss_val)):
            raise AssertionError("got NaN loss, training failed.")
    assert_native(exe)
    assert acc_np.shape == (1,) and avg_loss_np.shape == (1,)
    assert numpy.mean(losses[-3:]) < 0.6 * numpy.mean(losses[:3]), losses
    assert "Pass 0, Batch 0, Cost" in capsys.readouterr().out

    # oracles: the first conv-pool block and the accuracy, in NumPy from the fetched values
    params = [p.name for p in main_program.global_block().all_parameters()]
    scope = fluid.global_scope()
    w = numpy.array(scope.find_var(params[0]).value)
    b = numpy.array(scope.find_var(params[1]).value)
    assert w.shape == (20, 1, 5, 5) and b.size == 20
    images = numpy.stack([d[0] for d in test_data])
    labels = numpy.array([d[1] for d in test_data])
    numpy.testing.assert_allclose(conv_np, _numpy_conv_relu_pool(images, w, b),
                                  rtol=1e-4, atol=1e-4)
    numpy.testing.assert_allclose(acc_np[0], numpy.mean(pred_np.argmax(1) == labels),
                                  rtol=1e-6)
