"""Fluid 1.x programs written as the book chapters write them (fit_a_line, recognize_digits'
MLP with ``accuracy``, word2vec's N-gram model with one embedding table shared by four
words), with only the import changed and the datasets replaced by synthetic readers of small
shapes: they index ``loss[0]``, print with ``%f``, save and load an inference model, and the
loss falls."""
import numpy

import pdjit as fluid
from pdjit.testing import assert_native

batch = fluid.io.batch  # (``paddle.batch`` in the chapters: a reader of lists of samples)


def housing_reader(n=64, seed=0):
    rng = numpy.random.RandomState(seed)
    w = rng.uniform(-1, 1, 13).astype("float32")

    def reader():
        for _ in range(n):
            x = rng.uniform(-1, 1, 13).astype("float32")
            yield x, numpy.array([x @ w + 0.5], "float32")
    return reader


def test_fit_a_line(tmp_path, capsys):
    with fluid.program_guard(fluid.Program(), fluid.Program()), fluid.unique_name.guard():
        _fit_a_line(tmp_path, capsys)


def _fit_a_line(tmp_path, capsys):
    main_program = fluid.default_main_program()
    startup_program = fluid.default_startup_program()
    main_program.random_seed = startup_program.random_seed = 90
    x = fluid.layers.data(name='x', shape=[13], dtype='float32')
    y = fluid.layers.data(name='y', shape=[1], dtype='float32')
    y_predict = fluid.layers.fc(input=x, size=1, act=None)
    cost = fluid.layers.square_error_cost(input=y_predict, label=y)
    avg_loss = fluid.layers.mean(cost)
    test_program = main_program.clone(for_test=True)
    sgd_optimizer = fluid.optimizer.SGD(learning_rate=0.1)
    sgd_optimizer.minimize(avg_loss)

    train_reader = batch(housing_reader(), batch_size=16)
    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    feeder = fluid.DataFeeder(place=place, feed_list=[x, y])
    exe.run(startup_program)
    params_dirname = str(tmp_path / "fit_a_line.inference.model")
    step, costs = 0, []
    for pass_id in range(5):
        for data_train in train_reader():
            avg_loss_value, = exe.run(main_program, feed=feeder.feed(data_train),
                                      fetch_list=[avg_loss])
            if step % 4 == 0:
                print("%s, Pass %d, Step %d, Cost %f" % ("Train cost", pass_id, step,
                                                         avg_loss_value[0]))
            costs.append(float(avg_loss_value[0]))
            step += 1
        test_metics = exe.run(test_program, feed=feeder.feed(data_train),
                              fetch_list=[avg_loss])
        print("Test cost, Step %d, Cost %f" % (step, test_metics[0][0]))
    fluid.io.save_inference_model(params_dirname, ['x'], [y_predict], exe)
    assert_native(exe)
    assert costs[-1] < 0.2 * costs[0], costs
    assert "Train cost, Pass 0, Step 0, Cost" in capsys.readouterr().out

    infer_exe = fluid.Executor(place)
    inference_scope = fluid.core.Scope()
    with fluid.scope_guard(inference_scope):
        [inference_program, feed_target_names,
         fetch_targets] = fluid.io.load_inference_model(params_dirname, infer_exe)
        infer_feat = numpy.array([d[0] for d in data_train[:3]]).astype("float32")
        results = infer_exe.run(inference_program,
                                feed={feed_target_names[0]: numpy.array(infer_feat)},
                                fetch_list=fetch_targets)
        print("infer results: (House Price)")
        for idx, val in enumerate(results[0]):
            print("%d: %.2f" % (idx, val[0]))
    w = numpy.array(fluid.global_scope().find_var("fc_0.w_0").value)
    b = numpy.array(fluid.global_scope().find_var("fc_0.b_0").value)
    numpy.testing.assert_allclose(results[0], infer_feat @ w + b, rtol=1e-5, atol=1e-6)


def digits_reader(n=96, seed=1):
    """Ten classes of 8x8 images: each class lights its own pixels, plus noise."""
    masks = numpy.random.RandomState(0).rand(10, 64) > 0.6
    rng = numpy.random.RandomState(seed)

    def reader():
        for _ in range(n):
            label = rng.randint(0, 10)
            img = masks[label] * 1.0 + rng.normal(0, 0.3, 64)
            yield img.astype("float32").reshape(1, 8, 8), label
    return reader


def multilayer_perceptron(img, label):
    img = fluid.layers.fc(input=img, size=32, act='tanh')
    hidden = fluid.layers.fc(input=img, size=32, act='tanh')
    prediction = fluid.layers.fc(input=hidden, size=10, act='softmax')
    loss = fluid.layers.cross_entropy(input=prediction, label=label)
    avg_loss = fluid.layers.mean(loss)
    acc = fluid.layers.accuracy(input=prediction, label=label)
    return prediction, avg_loss, acc


def test_recognize_digits_mlp(capsys):
    main_program, startup_program = fluid.Program(), fluid.Program()
    main_program.random_seed = startup_program.random_seed = 90
    with fluid.program_guard(main_program, startup_program), fluid.unique_name.guard():
        img = fluid.layers.data(name='img', shape=[1, 8, 8], dtype='float32')
        label = fluid.layers.data(name='label', shape=[1], dtype='int64')
        prediction, avg_loss, acc = multilayer_perceptron(img, label)
        test_program = main_program.clone(for_test=True)
        optimizer = fluid.optimizer.Adam(learning_rate=0.01)
        optimizer.minimize(avg_loss)

    train_reader = batch(digits_reader(), batch_size=32)
    test_reader = batch(digits_reader(64, seed=2), batch_size=32)
    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    feeder = fluid.DataFeeder(feed_list=[img, label], place=place)
    exe.run(startup_program)

    def train_test(train_test_program, train_test_feed, train_test_reader):
        acc_set = []
        avg_loss_set = []
        for test_data in train_test_reader():
            acc_np, avg_loss_np = exe.run(program=train_test_program,
                                          feed=train_test_feed.feed(test_data),
                                          fetch_list=[acc, avg_loss])
            acc_set.append(float(acc_np[0]))
            avg_loss_set.append(float(avg_loss_np[0]))
        acc_val_mean = numpy.array(acc_set).mean()
        avg_loss_val_mean = numpy.array(avg_loss_set).mean()
        return avg_loss_val_mean, acc_val_mean

    lists, losses, step = [], [], 0
    for epoch_id in range(6):
        for step_id, data in enumerate(train_reader()):
            metrics = exe.run(main_program, feed=feeder.feed(data), fetch_list=[avg_loss, acc])
            if step % 3 == 0:
                print("Pass %d, Batch %d, Cost %f" % (epoch_id, step_id, metrics[0][0]))
            losses.append(metrics[0][0])
            step += 1
        avg_loss_val, acc_val = train_test(train_test_program=test_program,
                                           train_test_reader=test_reader,
                                           train_test_feed=feeder)
        print("Test with Epoch %d, avg_cost: %s, acc: %s" % (epoch_id, avg_loss_val, acc_val))
        lists.append((epoch_id, avg_loss_val, acc_val))
    assert_native(exe)
    best = sorted(lists, key=lambda list: float(list[1]))[0]
    print('Best pass is %s, testing Avgcost is %s' % (best[0], best[1]))
    print('The classification accuracy is %.2f%%' % (float(best[2]) * 100))
    assert losses[-1] < 0.3 * losses[0], losses
    assert best[2] > 0.9 and "Pass 0, Batch 0, Cost" in capsys.readouterr().out


def ngram_reader(dict_size, n=128, seed=3):
    """Five-word windows whose fifth word follows from the first."""
    rng = numpy.random.RandomState(seed)

    def reader():
        for _ in range(n):
            w = rng.randint(0, dict_size, 4)
            yield tuple(int(v) for v in w) + (int((w[0] + 1) % dict_size),)
    return reader


def test_word2vec_with_a_shared_embedding():
    EMBED_SIZE, HIDDEN_SIZE, dict_size = 8, 32, 12
    main_program, startup_program = fluid.Program(), fluid.Program()
    main_program.random_seed = startup_program.random_seed = 90
    with fluid.program_guard(main_program, startup_program), fluid.unique_name.guard():
        first_word = fluid.layers.data(name='firstw', shape=[1], dtype='int64')
        second_word = fluid.layers.data(name='secondw', shape=[1], dtype='int64')
        third_word = fluid.layers.data(name='thirdw', shape=[1], dtype='int64')
        forth_word = fluid.layers.data(name='forthw', shape=[1], dtype='int64')
        next_word = fluid.layers.data(name='nextw', shape=[1], dtype='int64')

        def embed(word):
            return fluid.layers.embedding(input=word, size=[dict_size, EMBED_SIZE],
                                          dtype='float32', is_sparse=True,
                                          param_attr='shared_w')
        embed_first, embed_second, embed_third, embed_forth = (
            embed(w) for w in (first_word, second_word, third_word, forth_word))
        concat_embed = fluid.layers.concat(
            input=[embed_first, embed_second, embed_third, embed_forth], axis=1)
        hidden1 = fluid.layers.fc(input=concat_embed, size=HIDDEN_SIZE, act='sigmoid')
        predict_word = fluid.layers.fc(input=hidden1, size=dict_size, act='softmax')
        cost = fluid.layers.cross_entropy(input=predict_word, label=next_word)
        avg_cost = fluid.layers.mean(cost)
        sgd_optimizer = fluid.optimizer.SGD(learning_rate=2.0)
        sgd_optimizer.minimize(avg_cost)
    params = [p.name for p in main_program.global_block().all_parameters()]
    assert params.count('shared_w') == 1

    train_reader = batch(ngram_reader(dict_size), 64)
    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    feeder = fluid.DataFeeder(
        feed_list=[first_word, second_word, third_word, forth_word, next_word], place=place)
    exe.run(startup_program)
    before = numpy.array(fluid.global_scope().find_var('shared_w').value)
    costs = []
    for pass_id in range(30):
        for data in train_reader():
            avg_cost_np = exe.run(main_program, feed=feeder.feed(data), fetch_list=[avg_cost])
            costs.append(avg_cost_np[0][0])
        if pass_id % 5 == 0:
            print("Pass %d, Cost %f" % (pass_id, avg_cost_np[0][0]))
    assert_native(exe)
    after = numpy.array(fluid.global_scope().find_var('shared_w').value)
    assert not numpy.array_equal(before, after)               # the shared table learns
    assert costs[-1] < 0.5 * costs[0], costs
