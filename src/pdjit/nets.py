"""``fluid.nets``: Fluid 1.x's composite networks built from layers."""
from __future__ import annotations

from pdjit import layers
from pdjit.layers.layer_helper import check_dtype, check_variable

__all__ = ["sequence_conv_pool"]


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
