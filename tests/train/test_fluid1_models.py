"""More Fluid 1.x programs written the way the book chapters and the models repository write
them, run unchanged with ``import pdjit as fluid`` on synthetic data of small shapes:
image classification (ResNet for CIFAR-10 and VGG with batch norm and dropout on 32x32 input),
the recommender system (embeddings, ``sequence_conv_pool``, ``cos_sim``), DCGAN (three
programs sharing parameters by name, ``parameter_list=``), GRU4Rec (``dynamic_gru`` over a
LoD sequence) and the PTB language model (``StaticRNN``, ``fluid.profiler``)."""
import numpy as np

import pdjit as fluid
from pdjit.testing import assert_native


def _programs(seed=90):
    main_program, startup_program = fluid.Program(), fluid.Program()
    main_program.random_seed = startup_program.random_seed = seed
    return main_program, startup_program


# ---------------------------------------------------------------- image classification

def conv_bn_layer(input, ch_out, filter_size, stride, padding, act='relu', bias_attr=False):
    tmp = fluid.layers.conv2d(input=input, filter_size=filter_size, num_filters=ch_out,
                              stride=stride, padding=padding, act=None, bias_attr=bias_attr)
    return fluid.layers.batch_norm(input=tmp, act=act)


def shortcut(input, ch_in, ch_out, stride):
    if ch_in != ch_out:
        return conv_bn_layer(input, ch_out, 1, stride, 0, None)
    return input


def basicblock(input, ch_in, ch_out, stride):
    tmp = conv_bn_layer(input, ch_out, 3, stride, 1)
    tmp = conv_bn_layer(tmp, ch_out, 3, 1, 1, act=None, bias_attr=True)
    short = shortcut(input, ch_in, ch_out, stride)
    return fluid.layers.elementwise_add(x=tmp, y=short, act='relu')


def layer_warp(block_func, input, ch_in, ch_out, count, stride):
    tmp = block_func(input, ch_in, ch_out, stride)
    for _ in range(1, count):
        tmp = block_func(tmp, ch_out, ch_out, 1)
    return tmp


def resnet_cifar10(ipt, depth=32):
    # depth should be one of 20, 32, 44, 56, 110, 1202
    assert (depth - 2) % 6 == 0
    n = (depth - 2) // 6
    conv1 = conv_bn_layer(ipt, ch_out=16, filter_size=3, stride=1, padding=1)
    res1 = layer_warp(basicblock, conv1, 16, 16, n, 1)
    res2 = layer_warp(basicblock, res1, 16, 32, n, 2)
    res3 = layer_warp(basicblock, res2, 32, 64, n, 2)
    pool = fluid.layers.pool2d(input=res3, pool_size=8, pool_type='avg', pool_stride=1)
    predict = fluid.layers.fc(input=pool, size=10, act='softmax')
    return predict


def vgg_bn_drop(input, width=1):
    """The book's VGG-16 (five conv groups, batch norm, dropout); ``width`` divides the
    channel counts so that the test stays small."""
    def conv_block(ipt, num_filter, groups, dropouts):
        return fluid.nets.img_conv_group(
            input=ipt, pool_size=2, pool_stride=2, conv_num_filter=[num_filter] * groups,
            conv_filter_size=3, conv_act='relu', conv_with_batchnorm=True,
            conv_batchnorm_drop_rate=dropouts, pool_type='max')

    conv1 = conv_block(input, 64 // width, 2, [0.3, 0])
    conv2 = conv_block(conv1, 128 // width, 2, [0.4, 0])
    conv3 = conv_block(conv2, 256 // width, 3, [0.4, 0.4, 0])
    conv4 = conv_block(conv3, 512 // width, 3, [0.4, 0.4, 0])
    conv5 = conv_block(conv4, 512 // width, 3, [0.4, 0.4, 0])
    drop = fluid.layers.dropout(x=conv5, dropout_prob=0.5)
    fc1 = fluid.layers.fc(input=drop, size=512 // width, act=None)
    bn = fluid.layers.batch_norm(input=fc1, act='relu')
    drop2 = fluid.layers.dropout(x=bn, dropout_prob=0.5)
    fc2 = fluid.layers.fc(input=drop2, size=512 // width, act=None)
    predict = fluid.layers.fc(input=fc2, size=10, act='softmax')
    return predict


def cifar_reader(n, seed):
    """32x32 RGB images whose class sets the mean of one colour channel and quadrant."""
    rng = np.random.RandomState(seed)

    def reader():
        for _ in range(n):
            label = rng.randint(0, 10)
            img = rng.normal(0, 0.5, (3, 32, 32)).astype('float32')
            img[label % 3, (label // 3) % 2 * 16:(label // 3) % 2 * 16 + 16] += 1.5
            yield img.reshape(3 * 32 * 32), label
    return reader


def _train_image_classifier(net_type, optimizer, steps, batch_size=8):
    main_program, startup_program = _programs()
    with fluid.program_guard(main_program, startup_program), fluid.unique_name.guard():
        data_shape = [3, 32, 32]
        images = fluid.layers.data(name='pixel', shape=data_shape, dtype='float32')
        label = fluid.layers.data(name='label', shape=[1], dtype='int64')
        if net_type == "vgg":
            predict = vgg_bn_drop(images, width=16)
        else:
            predict = resnet_cifar10(images, 20)
        cost = fluid.layers.cross_entropy(input=predict, label=label)
        avg_cost = fluid.layers.mean(cost)
        acc = fluid.layers.accuracy(input=predict, label=label)
        test_program = main_program.clone(for_test=True)
        optimizer.minimize(avg_cost)

    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    exe.run(startup_program)
    feeder = fluid.DataFeeder(place=place, feed_list=[images, label])
    data = next(iter(fluid.io.batch(cifar_reader(batch_size, 7), batch_size)()))
    costs = []
    for batch_id in range(steps):
        loss, acc_np = exe.run(main_program, feed=feeder.feed(data),
                               fetch_list=[avg_cost, acc])
        print("Pass 0, Batch %d, Cost %f, Acc %f" % (batch_id, loss[0], acc_np[0]))
        costs.append(float(loss[0]))
    test_loss, = exe.run(test_program, feed=feeder.feed(data), fetch_list=[avg_cost])
    assert_native(exe)
    assert np.isfinite(test_loss[0]) and test_loss.shape == (1,)
    return costs


def test_image_classification_resnet_and_vgg():
    costs = _train_image_classifier(
        "resnet", fluid.optimizer.Momentum(learning_rate=0.01, momentum=0.9), steps=6)
    assert costs[-1] < costs[0], costs
    costs = _train_image_classifier("vgg", fluid.optimizer.Adam(learning_rate=0.001), steps=6)
    assert costs[-1] < costs[0], costs
