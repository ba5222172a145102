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


# ---------------------------------------------------------------- recommender system

USR_DICT_SIZE, MOV_DICT_SIZE, CATEGORY_DICT_SIZE, MOV_TITLE_DICT_SIZE = 12, 10, 5, 20
IS_SPARSE = True


def get_usr_combined_features():
    layers = fluid.layers
    uid = layers.data(name='user_id', shape=[1], dtype='int64')
    usr_emb = layers.embedding(input=uid, dtype='float32', size=[USR_DICT_SIZE, 8],
                               param_attr='user_table', is_sparse=IS_SPARSE)
    usr_fc = layers.fc(input=usr_emb, size=8)
    usr_gender_id = layers.data(name='gender_id', shape=[1], dtype='int64')
    usr_gender_emb = layers.embedding(input=usr_gender_id, size=[2, 4],
                                      param_attr='gender_table', is_sparse=IS_SPARSE)
    usr_gender_fc = layers.fc(input=usr_gender_emb, size=4)
    usr_age_id = layers.data(name='age_id', shape=[1], dtype="int64")
    usr_age_emb = layers.embedding(input=usr_age_id, size=[7, 4], is_sparse=IS_SPARSE,
                                   param_attr='age_table')
    usr_age_fc = layers.fc(input=usr_age_emb, size=4)
    usr_job_id = layers.data(name='job_id', shape=[1], dtype="int64")
    usr_job_emb = layers.embedding(input=usr_job_id, size=[21, 4], param_attr='job_table',
                                   is_sparse=IS_SPARSE)
    usr_job_fc = layers.fc(input=usr_job_emb, size=4)
    concat_embed = layers.concat(input=[usr_fc, usr_gender_fc, usr_age_fc, usr_job_fc],
                                 axis=1)
    usr_combined_features = layers.fc(input=concat_embed, size=16, act="tanh")
    return usr_combined_features


def get_mov_combined_features():
    layers = fluid.layers
    mov_id = layers.data(name='movie_id', shape=[1], dtype='int64')
    mov_emb = layers.embedding(input=mov_id, dtype='float32', size=[MOV_DICT_SIZE, 8],
                               param_attr='movie_table', is_sparse=IS_SPARSE)
    mov_fc = layers.fc(input=mov_emb, size=8)
    category_id = layers.data(name='category_id', shape=[1], dtype='int64', lod_level=1)
    mov_categories_emb = layers.embedding(input=category_id, size=[CATEGORY_DICT_SIZE, 8],
                                          is_sparse=IS_SPARSE)
    mov_categories_hidden = layers.sequence_pool(input=mov_categories_emb, pool_type="sum")
    mov_title_id = layers.data(name='movie_title', shape=[1], dtype='int64', lod_level=1)
    mov_title_emb = layers.embedding(input=mov_title_id, size=[MOV_TITLE_DICT_SIZE, 8],
                                     is_sparse=IS_SPARSE)
    mov_title_conv = fluid.nets.sequence_conv_pool(input=mov_title_emb, num_filters=8,
                                                   filter_size=3, act="tanh", pool_type="sum")
    concat_embed = layers.concat(input=[mov_fc, mov_categories_hidden, mov_title_conv], axis=1)
    mov_combined_features = layers.fc(input=concat_embed, size=16, act="tanh")
    return mov_combined_features


def recommender_inference_program():
    usr_combined_features = get_usr_combined_features()
    mov_combined_features = get_mov_combined_features()
    inference = fluid.layers.cos_sim(X=usr_combined_features, Y=mov_combined_features)
    scale_infer = fluid.layers.scale(x=inference, scale=5.0)
    return scale_infer, usr_combined_features, mov_combined_features


def movielens_reader(n, seed):
    """(user, gender, age, job, movie, categories, title words, score): the score follows the
    user's and the movie's parity."""
    rng = np.random.RandomState(seed)

    def reader():
        for _ in range(n):
            uid, mid = rng.randint(0, USR_DICT_SIZE), rng.randint(0, MOV_DICT_SIZE)
            cats = list(rng.randint(0, CATEGORY_DICT_SIZE, rng.randint(1, 3)))
            title = list(rng.randint(0, MOV_TITLE_DICT_SIZE, rng.randint(1, 5)))
            score = 4.5 if (uid + mid) % 2 == 0 else 1.0
            yield (uid, rng.randint(0, 2), rng.randint(0, 7), rng.randint(0, 21), mid, cats,
                   title, [score])
    return reader


def test_recommender_system(tmp_path):
    main_program, startup_program = _programs()
    with fluid.program_guard(main_program, startup_program), fluid.unique_name.guard():
        scale_infer, usr, mov = recommender_inference_program()
        label = fluid.layers.data(name='score', shape=[1], dtype='float32')
        square_cost = fluid.layers.square_error_cost(input=scale_infer, label=label)
        avg_cost = fluid.layers.mean(square_cost)
        test_program = main_program.clone(for_test=True)
        sgd_optimizer = fluid.optimizer.SGD(learning_rate=0.2)
        sgd_optimizer.minimize(avg_cost)

    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    exe.run(startup_program)
    feed_order = ['user_id', 'gender_id', 'age_id', 'job_id', 'movie_id', 'category_id',
                  'movie_title', 'score']
    feed_var_list_loop = [main_program.global_block().var(var_name) for var_name in feed_order]
    feeder = fluid.DataFeeder(feed_list=feed_var_list_loop, place=place)
    train_reader = fluid.io.batch(movielens_reader(64, 5), batch_size=16)
    costs = []
    for pass_id in range(8):
        for batch_id, data in enumerate(train_reader()):
            outs = exe.run(program=main_program, feed=feeder.feed(data),
                           fetch_list=[avg_cost])
            out = np.array(outs[0])
            costs.append(float(out[0]))
            if pass_id % 4 == 0 and batch_id == 0:
                print("Pass %d, Batch %d, Cost %f" % (pass_id, batch_id, out[0]))
    assert_native(exe)
    assert np.mean(costs[-4:]) < 0.7 * np.mean(costs[:4]), costs

    # cos_sim and scale against NumPy on the fetched features
    sample = next(iter(train_reader()))
    pred, u, m = exe.run(test_program, feed=feeder.feed(sample),
                         fetch_list=[scale_infer, usr, mov])
    cos = (u * m).sum(1) / np.linalg.norm(u, axis=1) / np.linalg.norm(m, axis=1)
    np.testing.assert_allclose(pred[:, 0], 5.0 * cos, rtol=1e-4, atol=1e-5)

    save_dirname = str(tmp_path / "recommender_system.inference.model")
    fluid.io.save_inference_model(save_dirname, feed_order[:-1], [scale_infer], exe,
                                  main_program=main_program)
    infer_exe = fluid.Executor(place)
    with fluid.scope_guard(fluid.core.Scope()):
        [inferencer, feed_target_names,
         fetch_targets] = fluid.io.load_inference_model(save_dirname, infer_exe)
        user_id = fluid.create_lod_tensor([[np.int64(1)]], [[1]], place)
        gender_id = fluid.create_lod_tensor([[np.int64(1)]], [[1]], place)
        age_id = fluid.create_lod_tensor([[np.int64(0)]], [[1]], place)
        job_id = fluid.create_lod_tensor([[np.int64(10)]], [[1]], place)
        movie_id = fluid.create_lod_tensor([[np.int64(7)]], [[1]], place)
        category_id = fluid.create_lod_tensor([np.array([1, 3], dtype='int64')], [[2]], place)
        movie_title = fluid.create_lod_tensor([np.array([5, 4, 3, 2, 1], dtype='int64')],
                                              [[5]], place)
        results = infer_exe.run(inferencer, feed={
            feed_target_names[0]: user_id, feed_target_names[1]: gender_id,
            feed_target_names[2]: age_id, feed_target_names[3]: job_id,
            feed_target_names[4]: movie_id, feed_target_names[5]: category_id,
            feed_target_names[6]: movie_title}, fetch_list=fetch_targets, return_numpy=False)
        predict_rating = np.array(results[0])
        print("Predict Rating of user id 1 on movie 7 is " + str(predict_rating[0][0]))
        assert predict_rating.shape == (1, 1) and abs(predict_rating[0][0]) <= 5.0 + 1e-5


# ---------------------------------------------------------------- DCGAN

NOISE_SIZE, IMG_DIM, GF_DIM, DF_DIM, GFC_DIM, DFC_DIM = 8, 16, 4, 4, 16, 8


def bn(x, name=None, act='relu'):
    return fluid.layers.batch_norm(x, param_attr=name + '1', bias_attr=name + '2',
                                   moving_mean_name=name + '3',
                                   moving_variance_name=name + '4', name=name, act=act)


def conv(x, num_filters, name=None, act=None):
    return fluid.nets.simple_img_conv_pool(input=x, filter_size=5, num_filters=num_filters,
                                           pool_size=2, pool_stride=2, param_attr=name + 'w',
                                           bias_attr=name + 'b', act=act)


def fc(x, num_filters, name=None, act=None):
    return fluid.layers.fc(input=x, size=num_filters, act=act, param_attr=name + 'w',
                           bias_attr=name + 'b')


def deconv(x, num_filters, name=None, filter_size=5, stride=2, dilation=1, padding=2,
           output_size=None, act=None):
    return fluid.layers.conv2d_transpose(input=x, param_attr=name + 'w', bias_attr=name + 'b',
                                         num_filters=num_filters, output_size=output_size,
                                         filter_size=filter_size, stride=stride,
                                         dilation=dilation, padding=padding, act=act)


def D(x):
    x = fluid.layers.reshape(x=x, shape=[-1, 1, IMG_DIM, IMG_DIM])
    x = conv(x, DF_DIM, act='leaky_relu', name='conv1')
    x = bn(conv(x, DF_DIM * 2, name='conv2'), act='leaky_relu', name='bn1')
    x = bn(fc(x, DFC_DIM, name='fc1'), act='leaky_relu', name='bn2')
    x = fc(x, 1, act=None, name='fc2')
    return x


def G(x):
    x = bn(fc(x, GFC_DIM, name='fc3'), name='bn3')
    x = bn(fc(x, GF_DIM * 2 * IMG_DIM // 4 * IMG_DIM // 4, name='fc4'), name='bn4')
    x = fluid.layers.reshape(x, [-1, GF_DIM * 2, IMG_DIM // 4, IMG_DIM // 4])
    x = deconv(x, GF_DIM * 2, act='relu', output_size=[IMG_DIM // 2, IMG_DIM // 2],
               name='deconv1')
    x = deconv(x, num_filters=1, filter_size=5, padding=2, act='tanh',
               output_size=[IMG_DIM, IMG_DIM], name='deconv2')
    x = fluid.layers.reshape(x, shape=[-1, IMG_DIM * IMG_DIM])
    return x


def gan_loss(x, label):
    return fluid.layers.mean(fluid.layers.sigmoid_cross_entropy_with_logits(x=x, label=label))


def test_dcgan_three_programs_sharing_parameters(fresh_programs):
    batch_size = 8
    d_program = fluid.Program()
    dg_program = fluid.Program()
    fluid.default_startup_program().random_seed = 1

    with fluid.program_guard(d_program):
        img = fluid.layers.data(name='img', shape=[IMG_DIM * IMG_DIM], dtype='float32')
        label = fluid.layers.data(name='label', shape=[1], dtype='float32')
        d_logit = D(img)
        d_loss = gan_loss(d_logit, label)

    with fluid.program_guard(dg_program):
        noise = fluid.layers.data(name='noise', shape=[NOISE_SIZE], dtype='float32')
        g_img = G(x=noise)
        g_program = dg_program.clone()
        g_program_test = dg_program.clone(for_test=True)
        dg_logit = D(g_img)
        dg_loss = gan_loss(dg_logit, fluid.layers.fill_constant_batch_size_like(
            input=noise, dtype='float32', shape=[-1, 1], value=1.0))

    opt = fluid.optimizer.Adam(learning_rate=2e-3)
    opt.minimize(loss=d_loss)
    parameters = [p.name for p in g_program.global_block().all_parameters()]
    opt.minimize(loss=dg_loss, parameter_list=parameters)

    d_params = {p.name for p in d_program.global_block().all_parameters()}
    assert d_params <= {p.name for p in dg_program.global_block().all_parameters()}
    assert not d_params & set(parameters) and "deconv2w" in parameters

    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fluid.default_startup_program())
    scope = fluid.global_scope()

    def value(name):
        return np.array(scope.find_var(name).get_tensor()).copy()

    rng = np.random.RandomState(0)
    # "real" images: a bright square in the middle
    real_image = -np.ones((batch_size, IMG_DIM, IMG_DIM), 'float32')
    real_image[:, 4:12, 4:12] = 1.0
    real_image = real_image.reshape(batch_size, -1)
    d_losses, dg_losses = [], []
    for batch_id in range(6):
        noise_data = rng.uniform(-1.0, 1.0, [batch_size, NOISE_SIZE]).astype('float32')
        generated_image = exe.run(g_program, feed={'noise': noise_data},
                                  fetch_list=[g_img])[0]
        total_images = np.concatenate([real_image, generated_image])
        total_label = np.concatenate([np.ones(shape=[real_image.shape[0], 1]),
                                      np.zeros(shape=[real_image.shape[0], 1])]
                                     ).astype('float32')
        d_before, g_before = value('fc2w'), value('deconv2w')
        d_loss_np = exe.run(d_program, feed={'img': total_images, 'label': total_label},
                            fetch_list=[d_loss])[0]
        # the discriminator's step moves D's parameters, not G's
        assert not np.array_equal(value('fc2w'), d_before)
        np.testing.assert_array_equal(value('deconv2w'), g_before)
        d_before = value('fc2w')
        dg_loss_np = exe.run(dg_program, feed={'noise': noise_data},
                             fetch_list=[dg_loss])[0]
        # the generator's step moves G's parameters only, through the shared D
        np.testing.assert_array_equal(value('fc2w'), d_before)
        assert not np.array_equal(value('deconv2w'), g_before)
        print("Batch ID={0}\n D-Loss={1}\n DG-Loss={2}\n".format(batch_id, d_loss_np[0],
                                                                 dg_loss_np[0]))
        d_losses.append(float(d_loss_np[0]))
        dg_losses.append(float(dg_loss_np[0]))
    assert d_losses[-1] < d_losses[0], d_losses
    generated = exe.run(g_program_test, feed={'noise': noise_data}, fetch_list=[g_img])[0]
    assert generated.shape == (batch_size, IMG_DIM * IMG_DIM)
    assert np.all(np.abs(generated) <= 1.0)
    assert_native(exe)


# ---------------------------------------------------------------- GRU4Rec

def gru4rec_network(vocab_size, hid_size=16, init_low_bound=-0.1, init_high_bound=0.1):
    """All-vocabulary GRU4Rec: embedding, fc, dynamic_gru, softmax over the items."""
    emb_lr_x = 10.0
    gru_lr_x = 1.0
    fc_lr_x = 1.0
    src_wordseq = fluid.data(name="src_wordseq", shape=[None, 1], dtype="int64", lod_level=1)
    dst_wordseq = fluid.data(name="dst_wordseq", shape=[None, 1], dtype="int64", lod_level=1)

    emb = fluid.embedding(
        input=src_wordseq, size=[vocab_size, hid_size],
        param_attr=fluid.ParamAttr(initializer=fluid.initializer.Uniform(
            low=init_low_bound, high=init_high_bound), learning_rate=emb_lr_x),
        is_sparse=True)
    fc0 = fluid.layers.fc(input=emb, size=hid_size * 3, param_attr=fluid.ParamAttr(
        initializer=fluid.initializer.Uniform(low=init_low_bound, high=init_high_bound),
        learning_rate=gru_lr_x))
    gru_h0 = fluid.layers.dynamic_gru(input=fc0, size=hid_size, param_attr=fluid.ParamAttr(
        initializer=fluid.initializer.Uniform(low=init_low_bound, high=init_high_bound),
        learning_rate=gru_lr_x))
    fc = fluid.layers.fc(input=gru_h0, size=vocab_size, act='softmax', param_attr=fluid.ParamAttr(
        initializer=fluid.initializer.Uniform(low=init_low_bound, high=init_high_bound),
        learning_rate=fc_lr_x))
    cost = fluid.layers.cross_entropy(input=fc, label=dst_wordseq)
    acc = fluid.layers.accuracy(input=fc, label=dst_wordseq, k=5)
    avg_cost = fluid.layers.mean(x=cost)
    return src_wordseq, dst_wordseq, avg_cost, acc, gru_h0, fc0


def to_lodtensor(data, place):
    """As the models repository's utils: a batch of sequences as one LoD tensor."""
    seq_lens = [len(seq) for seq in data]
    cur_len = 0
    lod = [cur_len]
    for l in seq_lens:
        cur_len += l
        lod.append(cur_len)
    flattened_data = np.concatenate(data, axis=0).astype("int64")
    flattened_data = flattened_data.reshape([len(flattened_data), 1])
    res = fluid.LoDTensor()
    res.set(flattened_data, place)
    res.set_lod([lod])
    return res


def session_reader(vocab_size, n, seed):
    """Click sessions in which the next item is the current one plus one."""
    rng = np.random.RandomState(seed)

    def reader():
        for _ in range(n):
            start, length = rng.randint(0, vocab_size), rng.randint(2, 6)
            items = [(start + i) % vocab_size for i in range(length + 1)]
            yield items[:-1], items[1:]
    return reader


def _np_gru(x, w, b, lod):
    """dynamic_gru's forward (origin_mode False: h = (1-u)*h_prev + u*c) in NumPy. Fluid
    stores the [D, 3D] weight as the [D, 2D] gate weights followed by the [D, D] candidate
    weights in one flat buffer."""
    d = w.shape[0]
    w_gate, w_cand = w.reshape(-1)[:2 * d * d].reshape(d, 2 * d), w.reshape(-1)[2 * d * d:]
    w_cand = w_cand.reshape(d, d)
    out = np.zeros((x.shape[0], d), 'float32')
    for s, e in zip(lod[:-1], lod[1:]):
        h = np.zeros(d, 'float32')
        for t in range(s, e):
            g = x[t] + b[0]
            ur = 1 / (1 + np.exp(-(g[:2 * d] + h @ w_gate)))
            u, r = ur[:d], ur[d:]
            c = np.tanh(g[2 * d:] + (r * h) @ w_cand)
            h = (1 - u) * h + u * c
            out[t] = h
    return out


def test_gru4rec(fresh_programs):
    vocab_size = 12
    main_program, startup_program = fresh_programs
    main_program.random_seed = startup_program.random_seed = 7
    src, dst, avg_cost, acc, gru_h0, fc0 = gru4rec_network(vocab_size)
    optimizer = fluid.optimizer.Adagrad(learning_rate=0.1)
    optimizer.minimize(avg_cost)

    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    exe.run(fluid.default_startup_program())
    train_reader = fluid.io.batch(session_reader(vocab_size, 64, 11), 16)
    costs = []
    for pass_idx in range(6):
        for data in train_reader():
            lod_src_wordseq = to_lodtensor([dat[0] for dat in data], place)
            lod_dst_wordseq = to_lodtensor([dat[1] for dat in data], place)
            ret_avg_cost, ret_acc = exe.run(fluid.default_main_program(),
                                            feed={"src_wordseq": lod_src_wordseq,
                                                  "dst_wordseq": lod_dst_wordseq},
                                            fetch_list=[avg_cost.name, acc.name])
            costs.append(float(np.array(ret_avg_cost)[0]))
        print("epoch_%d finished, avg_cost %f, acc %f" % (pass_idx, ret_avg_cost[0],
                                                          ret_acc[0]))
    assert_native(exe)
    assert np.mean(costs[-4:]) < 0.7 * np.mean(costs[:4]), costs

    # dynamic_gru against NumPy on the trained weights
    gru_params = [p for p in main_program.global_block().all_parameters()
                  if p.shape == (16, 48) or p.shape == (1, 48)]
    x_np, h_np = exe.run(main_program.clone(for_test=True),
                         feed={"src_wordseq": lod_src_wordseq,
                               "dst_wordseq": lod_dst_wordseq},
                         fetch_list=[fc0, gru_h0], return_numpy=True)
    scope = fluid.global_scope()
    w = [np.array(scope.find_var(p.name).get_tensor()) for p in gru_params]
    w = {a.shape: a for a in w}
    lod = lod_src_wordseq.lod()[0]
    np.testing.assert_allclose(h_np, _np_gru(x_np, w[(16, 48)], w[(1, 48)], lod),
                               rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- PTB language model

def lm_model(hidden_size, vocab_size, batch_size, num_layers=2, num_steps=20, init_scale=0.1,
             dropout=None):
    """The models repository's static-graph PTB LSTM: a StaticRNN over the time-major
    embedding, one matmul per layer for the four gates."""
    layers = fluid.layers

    def padding_rnn(input_embedding, len=3, init_hidden=None, init_cell=None):
        weight_1_arr = []
        bias_arr = []
        hidden_array = []
        cell_array = []
        for i in range(num_layers):
            weight_1 = layers.create_parameter(
                [hidden_size * 2, hidden_size * 4], dtype="float32",
                name="fc_weight1_" + str(i),
                default_initializer=fluid.initializer.UniformInitializer(
                    low=-init_scale, high=init_scale))
            weight_1_arr.append(weight_1)
            bias_1 = layers.create_parameter(
                [hidden_size * 4], dtype="float32", name="fc_bias1_" + str(i),
                default_initializer=fluid.initializer.Constant(0.0))
            bias_arr.append(bias_1)

            pre_hidden = layers.slice(init_hidden, axes=[0], starts=[i], ends=[i + 1])
            pre_cell = layers.slice(init_cell, axes=[0], starts=[i], ends=[i + 1])
            pre_hidden = layers.reshape(pre_hidden, shape=[-1, hidden_size])
            pre_cell = layers.reshape(pre_cell, shape=[-1, hidden_size])
            hidden_array.append(pre_hidden)
            cell_array.append(pre_cell)

        input_embedding = layers.transpose(input_embedding, perm=[1, 0, 2])
        rnn = fluid.layers.StaticRNN()

        with rnn.step():
            input = rnn.step_input(input_embedding)
            for k in range(num_layers):
                pre_hidden = rnn.memory(init=hidden_array[k])
                pre_cell = rnn.memory(init=cell_array[k])
                weight_1 = weight_1_arr[k]
                bias = bias_arr[k]

                nn = layers.concat([input, pre_hidden], 1)
                gate_input = layers.matmul(x=nn, y=weight_1)
                gate_input = layers.elementwise_add(gate_input, bias)
                i, j, f, o = layers.split(gate_input, num_or_sections=4, dim=-1)

                c = pre_cell * layers.sigmoid(f) + layers.sigmoid(i) * layers.tanh(j)
                m = layers.tanh(c) * layers.sigmoid(o)

                rnn.update_memory(pre_hidden, m)
                rnn.update_memory(pre_cell, c)

                rnn.step_output(m)
                rnn.step_output(c)

                input = m

                if dropout is not None and dropout > 0.0:
                    input = layers.dropout(input, dropout_prob=dropout,
                                           dropout_implementation='upscale_in_train')

            rnn.step_output(input)
        rnnout = rnn()

        last_hidden_array = []
        last_cell_array = []
        real_res = rnnout[-1]
        for i in range(num_layers):
            m = rnnout[i * 2]
            c = rnnout[i * 2 + 1]
            m.stop_gradient = True
            c.stop_gradient = True
            last_h = layers.slice(m, axes=[0], starts=[num_steps - 1], ends=[num_steps])
            last_hidden_array.append(last_h)
            last_c = layers.slice(c, axes=[0], starts=[num_steps - 1], ends=[num_steps])
            last_cell_array.append(last_c)
        real_res = layers.transpose(x=real_res, perm=[1, 0, 2])
        last_hidden = layers.concat(last_hidden_array, 0)
        last_cell = layers.concat(last_cell_array, 0)
        return real_res, last_hidden, last_cell

    x = layers.data(name="x", shape=[batch_size, num_steps, 1], dtype='int64',
                    append_batch_size=False)
    y = layers.data(name="y", shape=[batch_size * num_steps, 1], dtype='int64',
                    append_batch_size=False)
    init_hidden = layers.data(name="init_hidden", shape=[num_layers, batch_size, hidden_size],
                              dtype='float32', append_batch_size=False)
    init_cell = layers.data(name="init_cell", shape=[num_layers, batch_size, hidden_size],
                            dtype='float32', append_batch_size=False)
    init_cell.persistable = True
    init_hidden.persistable = True

    init_hidden_reshape = layers.reshape(init_hidden, shape=[num_layers, -1, hidden_size])
    init_cell_reshape = layers.reshape(init_cell, shape=[num_layers, -1, hidden_size])

    x_emb = layers.embedding(
        input=x, size=[vocab_size, hidden_size], dtype='float32', is_sparse=False,
        param_attr=fluid.ParamAttr(name='embedding_para',
                                   initializer=fluid.initializer.UniformInitializer(
                                       low=-init_scale, high=init_scale)))
    x_emb = layers.reshape(x_emb, shape=[-1, num_steps, hidden_size])
    if dropout is not None and dropout > 0.0:
        x_emb = layers.dropout(x_emb, dropout_prob=dropout,
                               dropout_implementation='upscale_in_train')

    rnn_out, last_hidden, last_cell = padding_rnn(x_emb, len=num_steps,
                                                  init_hidden=init_hidden_reshape,
                                                  init_cell=init_cell_reshape)
    rnn_out = layers.reshape(rnn_out, shape=[-1, num_steps, hidden_size])

    softmax_weight = layers.create_parameter(
        [hidden_size, vocab_size], dtype="float32", name="softmax_weight",
        default_initializer=fluid.initializer.UniformInitializer(low=-init_scale,
                                                                 high=init_scale))
    softmax_bias = layers.create_parameter(
        [vocab_size], dtype="float32", name='softmax_bias',
        default_initializer=fluid.initializer.UniformInitializer(low=-init_scale,
                                                                 high=init_scale))

    projection = layers.matmul(rnn_out, softmax_weight)
    projection = layers.elementwise_add(projection, softmax_bias)
    projection = layers.reshape(projection, shape=[-1, vocab_size])

    loss = layers.softmax_with_cross_entropy(logits=projection, label=y, soft_label=False)
    loss = layers.reshape(loss, shape=[-1, num_steps])
    loss = layers.reduce_mean(loss, dim=[0])
    loss = layers.reduce_sum(loss)

    loss.persistable = True
    last_cell.persistable = True
    last_hidden.persistable = True

    feeding_list = ['x', 'y', 'init_hidden', 'init_cell']
    return loss, last_hidden, last_cell, feeding_list


def _np_lm_loss(scope, x, y, h0, c0, num_layers):
    """The PTB model's loss in NumPy from the parameters in ``scope``."""
    def p(name):
        return np.array(scope.find_var(name).get_tensor()).astype('float64')

    def sig(v):
        return 1 / (1 + np.exp(-v))

    emb = p('embedding_para')[x[:, :, 0]]                      # [batch, steps, hidden]
    h, c = h0.astype('float64').copy(), c0.astype('float64').copy()
    outs = []
    for t in range(x.shape[1]):
        inp = emb[:, t]
        for k in range(num_layers):
            g = np.concatenate([inp, h[k]], 1) @ p('fc_weight1_%d' % k) + p('fc_bias1_%d' % k)
            i, j, f, o = np.split(g, 4, axis=1)
            c[k] = c[k] * sig(f) + sig(i) * np.tanh(j)
            h[k] = np.tanh(c[k]) * sig(o)
            inp = h[k]
        outs.append(inp)
    logits = np.stack(outs, 1) @ p('softmax_weight') + p('softmax_bias')
    logits = logits.reshape(-1, logits.shape[-1])
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    ce = -logp[np.arange(len(y)), y[:, 0]].reshape(x.shape[0], x.shape[1])
    return ce.mean(0).sum(), h, c


def ptb_reader(raw_data, batch_size, num_steps):
    """The models repository's get_data_iter: contiguous batches of num_steps words."""
    raw_data = np.array(raw_data, dtype="int64")
    data_len = len(raw_data)
    batch_len = data_len // batch_size
    data = raw_data[0:batch_size * batch_len].reshape((batch_size, batch_len))
    epoch_size = (batch_len - 1) // num_steps
    for i in range(epoch_size):
        start = i * num_steps
        x = np.copy(data[:, i * num_steps:(i + 1) * num_steps])
        y = np.copy(data[:, i * num_steps + 1:(i + 1) * num_steps + 1])
        del start
        yield (x, y)


def test_ptb_language_model_with_the_profiler(fresh_programs, tmp_path, capsys):
    from pdjit import profiler
    hidden_size, vocab_size, batch_size, num_layers, num_steps = 8, 16, 4, 2, 5
    max_grad_norm = 5.0
    main_program, startup_program = fresh_programs
    main_program.random_seed = startup_program.random_seed = 33
    loss, last_hidden, last_cell, feed_order = lm_model(
        hidden_size, vocab_size, batch_size, num_layers=num_layers, num_steps=num_steps,
        init_scale=0.1, dropout=None)
    inference_program = main_program.clone(for_test=True)
    clip1 = fluid.clip.GradientClipByGlobalNorm(clip_norm=max_grad_norm)
    learning_rate = fluid.layers.create_global_var(name="learning_rate", shape=[1], value=1.0,
                                                   dtype='float32', persistable=True)
    optimizer = fluid.optimizer.SGD(learning_rate=learning_rate, grad_clip=clip1)
    optimizer.minimize(loss)

    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    exe.run(startup_program)
    # a repetitive text: every word follows from the one before
    train_data = [(3 * i) % vocab_size for i in range(batch_size * (6 * num_steps + 1))]

    def generate_init_data():
        init_hidden = np.zeros((num_layers, batch_size, hidden_size), dtype='float32')
        init_cell = np.zeros((num_layers, batch_size, hidden_size), dtype='float32')
        return init_hidden, init_cell

    def prepare_input(batch, init_hidden=None, init_cell=None, epoch_id=0, with_lr=True):
        x, y = batch
        x = x.reshape((-1, num_steps, 1))
        y = y.reshape((-1, 1))
        res = {}
        res['x'] = x
        res['y'] = y
        if init_hidden is not None:
            res['init_hidden'] = init_hidden
        if init_cell is not None:
            res['init_cell'] = init_cell
        if with_lr:
            res['learning_rate'] = np.ones([1], dtype='float32') * 1.0 / (1 + epoch_id)
        return res

    # the loss of the first batch against NumPy, before any training
    first = next(ptb_reader(train_data, batch_size, num_steps))
    h0, c0 = generate_init_data()
    feed = prepare_input(first, h0, c0, with_lr=False)
    out = exe.run(inference_program, feed=feed, fetch_list=[loss.name, last_hidden.name])
    want, want_h, _ = _np_lm_loss(fluid.global_scope(), feed['x'], feed['y'], h0, c0,
                                  num_layers)
    assert out[0].shape == (1,)
    np.testing.assert_allclose(out[0][0], want, rtol=1e-5)
    np.testing.assert_allclose(out[1], want_h, rtol=1e-4, atol=1e-6)

    log_interval = 2

    def train_an_epoch(epoch_id):
        total_loss = 0
        iters = 0
        init_hidden, init_cell = generate_init_data()
        for batch_id, batch in enumerate(ptb_reader(train_data, batch_size, num_steps)):
            input_data_feed = prepare_input(batch, init_hidden=init_hidden,
                                            init_cell=init_cell, epoch_id=epoch_id)
            fetch_outs = exe.run(main_program, feed=input_data_feed,
                                 fetch_list=[loss.name, "learning_rate", last_hidden.name,
                                             last_cell.name], use_program_cache=True)
            cost_train = np.array(fetch_outs[0])
            lr = np.array(fetch_outs[1])
            init_hidden = np.array(fetch_outs[2])
            init_cell = np.array(fetch_outs[3])
            total_loss += cost_train
            iters += num_steps
            if batch_id > 0 and batch_id % log_interval == 0:
                ppl = np.exp(total_loss / iters)
                print("-- Epoch:[%d]; Batch:[%d]; ppl: %.5f, lr: %.5f" % (
                    epoch_id, batch_id, ppl[0], lr[0]))
            if batch_id == log_interval:
                profiler.reset_profiler()
        ppl = np.exp(total_loss / iters)
        return ppl

    profile_path = str(tmp_path / "paddingrnn.profile")
    ppls = []
    with profiler.profiler("All", 'total', profile_path):
        for epoch_id in range(2):
            ppls.append(train_an_epoch(epoch_id)[0])
    for epoch_id in range(2, 4):
        ppls.append(train_an_epoch(epoch_id)[0])
    assert_native(exe)
    assert ppls[-1] < ppls[0], ppls

    report = open(profile_path).read()
    printed = capsys.readouterr().out
    assert report in printed and "-- Epoch:[0]; Batch:[2]" in printed
    rows = [line.split() for line in report.splitlines() if line[:1].strip()]
    header = next(i for i, r in enumerate(rows) if r[:2] == ['Event', 'Calls'])
    events = rows[header + 1:]
    totals = [float(r[-5]) for r in events]
    assert events and totals == sorted(totals, reverse=True)
    # after reset_profiler at batch 2 of each of the two profiled epochs: batches 3..5 of
    # the first and 0..5 of the second; the training program's step ran each time
    calls = [int(r[-6]) for r in events]
    assert max(calls) >= 3 + 6, report

    # start_profiler / stop_profiler, timing the inference program alone
    profiler.start_profiler("CPU")
    for _ in range(3):
        exe.run(inference_program, feed=feed, fetch_list=[loss.name])
    text = profiler.stop_profiler(sorted_key="calls", profile_path=None)
    assert "Place: CPU" in text and "Sorted by calls" in text
