"""``fluid.nets``: Fluid 1.x's composite networks built from layers."""
from __future__ import annotations

from pdjit import layers
from pdjit.layers.layer_helper import check_dtype, check_variable

__all__ = ["sequence_conv_pool", "simple_img_conv_pool", "img_conv_group", "glu",
           "scaled_dot_product_attention"]


def sequence_conv_pool(input, num_filters, filter_size, param_attr=None, act="sigmoid",
                       pool_type="max", bias_attr=None):
    """``sequence_conv`` (``num_filters`` filters over windows of ``filter_size`` rows,
    centred; then ``act``) followed by ``sequence_pool`` of type ``pool_type``: one row per
    sequence of ``input``, as Fluid 1.8's ``nets.sequence_conv_pool``."""
    check_variable(input, "input", "sequence_conv_pool")
    check_dtype(input, "input", ("float32", "float64"), "sequence_conv_pool")
    conv_out = layers.sequence_conv(input=input, num_filters=num_filters,
                                    filter_size=filter_size, param_attr=param_attr,
                                    bias_attr=bias_attr, act=act)
    return layers.sequence_pool(input=conv_out, pool_type=pool_type)


def simple_img_conv_pool(input, num_filters, filter_size, pool_size, pool_stride,
                         pool_padding=0, pool_type="max", global_pooling=False, conv_stride=1,
                         conv_padding=0, conv_dilation=1, conv_groups=1, param_attr=None,
                         bias_attr=None, act=None, use_cudnn=True):
    """``conv2d`` (then ``act``) followed by ``pool2d``, as Fluid 1.8's
    ``nets.simple_img_conv_pool``; the arguments go to those layers as named."""
    check_variable(input, "input", "simple_img_conv_pool")
    conv_out = layers.conv2d(input=input, num_filters=num_filters, filter_size=filter_size,
                             stride=conv_stride, padding=conv_padding, dilation=conv_dilation,
                             groups=conv_groups, param_attr=param_attr, bias_attr=bias_attr,
                             act=act, use_cudnn=use_cudnn)
    return layers.pool2d(input=conv_out, pool_size=pool_size, pool_type=pool_type,
                         pool_stride=pool_stride, pool_padding=pool_padding,
                         global_pooling=global_pooling, use_cudnn=use_cudnn)


def img_conv_group(input, conv_num_filter, pool_size, conv_padding=1, conv_filter_size=3,
                   conv_act=None, param_attr=None, conv_with_batchnorm=False,
                   conv_batchnorm_drop_rate=0.0, pool_stride=1, pool_type="max",
                   use_cudnn=True):
    """A VGG-style group, as Fluid 1.8's ``nets.img_conv_group``: one ``conv2d`` per entry of
    ``conv_num_filter`` (each optionally followed by ``batch_norm`` carrying ``conv_act`` and a
    ``dropout`` of ``conv_batchnorm_drop_rate``), then one ``pool2d``. ``conv_padding``,
    ``conv_filter_size``, ``param_attr``, ``conv_with_batchnorm`` and
    ``conv_batchnorm_drop_rate`` are one value for every convolution or a list with one per
    convolution."""
    check_variable(input, "input", "img_conv_group")
    if not isinstance(conv_num_filter, (list, tuple)) or not conv_num_filter:
        raise TypeError(f"img_conv_group: conv_num_filter must be a non-empty list or tuple of "
                        f"filter counts, got {conv_num_filter!r}")
    n = len(conv_num_filter)

    def per_conv(value, arg):
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise ValueError(f"img_conv_group: {arg} must have one entry per convolution: "
                                 f"expected {n} (len(conv_num_filter)), got {len(value)}")
            return list(value)
        return [value] * n

    paddings = per_conv(conv_padding, "conv_padding")
    sizes = per_conv(conv_filter_size, "conv_filter_size")
    attrs = per_conv(param_attr, "param_attr")
    with_bn = per_conv(conv_with_batchnorm, "conv_with_batchnorm")
    drops = per_conv(conv_batchnorm_drop_rate, "conv_batchnorm_drop_rate")
    tmp = input
    for i in range(n):
        tmp = layers.conv2d(input=tmp, num_filters=conv_num_filter[i], filter_size=sizes[i],
                            padding=paddings[i], param_attr=attrs[i],
                            act=None if with_bn[i] else conv_act, use_cudnn=use_cudnn)
        if with_bn[i]:
            tmp = layers.batch_norm(input=tmp, act=conv_act)
            if abs(drops[i]) > 1e-5:
                tmp = layers.dropout(x=tmp, dropout_prob=drops[i])
    return layers.pool2d(input=tmp, pool_size=pool_size, pool_type=pool_type,
                         pool_stride=pool_stride, use_cudnn=use_cudnn)


def glu(input, dim=-1):
    """The gated linear unit: ``input`` split in two halves ``a, b`` along ``dim``, then
    ``a * sigmoid(b)`` (Fluid 1.8's ``nets.glu``). ``input``'s size along ``dim`` must be
    even."""
    check_variable(input, "input", "glu")
    check_dtype(input, "input", ("float16", "float32", "float64"), "glu")
    ndim = len(input.shape)
    if not -ndim <= dim < ndim:
        raise ValueError(f"glu: dim={dim} is out of range for input of rank {ndim}")
    size = input.shape[dim]
    if size >= 0 and size % 2:
        raise ValueError(f"glu: input's size along dim {dim} must be even to split in two "
                         f"halves, got {size} (shape {list(input.shape)})")
    a, b = layers.split(input, num_or_sections=2, dim=dim)
    return layers.elementwise_mul(x=a, y=layers.sigmoid(b))


def scaled_dot_product_attention(queries, keys, values, num_heads=1, dropout_rate=0.0):
    """Multi-head scaled dot-product attention, as Fluid 1.8's
    ``nets.scaled_dot_product_attention``: ``softmax(Q K^T / sqrt(d)) V`` with ``d`` the keys'
    hidden size per head.

    ``queries`` ``[N, Lq, Dk]``, ``keys`` ``[N, Lk, Dk]``, ``values`` ``[N, Lk, Dv]``. With
    ``num_heads > 1`` each input first goes through a linear projection of its own size
    (``fc`` with ``num_flatten_dims=2``: a weight and a bias, no activation) and is split into
    ``num_heads`` heads along its last dim; the heads' results are joined again. The result
    is ``[N, Lq, Dv]``. ``dropout_rate`` drops attention weights (training
    mode)."""
    for arg, v in (("queries", queries), ("keys", keys), ("values", values)):
        check_variable(v, arg, "scaled_dot_product_attention")
        check_dtype(v, arg, ("float32", "float64"), "scaled_dot_product_attention")
    shapes = [list(v.shape) for v in (queries, keys, values)]
    if any(len(s) != 3 for s in shapes):
        raise ValueError(f"scaled_dot_product_attention: queries, keys and values must be 3-D "
                         f"[batch, length, hidden], got shapes {shapes}")
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError(f"scaled_dot_product_attention: queries and keys must have one hidden "
                         f"size, got {queries.shape[-1]} and {keys.shape[-1]}")
    if keys.shape[-2] >= 0 and values.shape[-2] >= 0 and keys.shape[-2] != values.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: keys and values must have one length, "
                         f"got {keys.shape[-2]} and {values.shape[-2]}")
    num_heads = int(num_heads)
    if num_heads < 1:
        raise ValueError(f"scaled_dot_product_attention: num_heads must be >= 1, got "
                         f"{num_heads}")
    for arg, v in (("keys", keys), ("values", values)):
        if v.shape[-1] < 0 or v.shape[-1] % num_heads:
            raise ValueError(f"scaled_dot_product_attention: the hidden size of {arg} "
                             f"({v.shape[-1]}) must be known and divisible by num_heads "
                             f"({num_heads})")

    def split_heads(x):
        if num_heads == 1:
            return x
        hidden = x.shape[-1]
        x = layers.reshape(x, [0, 0, num_heads, hidden // num_heads])
        return layers.transpose(x, perm=[0, 2, 1, 3])

    q, k, v = queries, keys, values
    if num_heads > 1:
        q, k, v = (layers.fc(input=t, size=t.shape[-1], num_flatten_dims=2) for t in (q, k, v))
    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    per_head = keys.shape[-1] // num_heads
    product = layers.matmul(layers.scale(q, scale=per_head ** -0.5), k, transpose_y=True)
    weights = layers.softmax(product, axis=-1)
    if dropout_rate:
        weights = layers.dropout(weights, dropout_prob=dropout_rate, is_test=False)
    out = layers.matmul(weights, v)
    if num_heads == 1:
        return out
    out = layers.transpose(out, perm=[0, 2, 1, 3])
    return layers.reshape(out, [0, 0, values.shape[-1]])
