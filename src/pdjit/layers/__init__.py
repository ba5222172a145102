"""Fluid's layers: functions that append ops to the default main program and return Variables.

``import pdjit as fluid; fluid.layers.fc(...)`` works as in Fluid 1.x. Each family lives in its
own module; this package re-exports them all.
"""
from pdjit.layers import (
    control_flow,
    conv,
    crf,
    decode,
    image,
    inputs,
    learning_rate_scheduler,
    loss,
    math_ops,
    metric_op,
    misc,
    nn,
    norm,
    recurrent,
    rnn,
    sequence,
    shape_ops,
    tensor,
)
from pdjit.layers.control_flow import *  # noqa: F401,F403
from pdjit.layers.conv import *  # noqa: F401,F403
from pdjit.layers.crf import *  # noqa: F401,F403
from pdjit.layers.decode import *  # noqa: F401,F403
from pdjit.layers.image import *  # noqa: F401,F403
from pdjit.layers.inputs import *  # noqa: F401,F403
from pdjit.layers.layer_helper import LayerHelper
from pdjit.layers.learning_rate_scheduler import *  # noqa: F401,F403
from pdjit.layers.loss import *  # noqa: F401,F403
from pdjit.layers.math_ops import *  # noqa: F401,F403
from pdjit.layers.metric_op import *  # noqa: F401,F403
from pdjit.layers.misc import *  # noqa: F401,F403
from pdjit.layers.nn import *  # noqa: F401,F403
from pdjit.layers.norm import *  # noqa: F401,F403
from pdjit.layers.recurrent import *  # noqa: F401,F403
from pdjit.layers.rnn import *  # noqa: F401,F403
from pdjit.layers.sequence import *  # noqa: F401,F403
from pdjit.layers.shape_ops import *  # noqa: F401,F403
from pdjit.layers.tensor import *  # noqa: F401,F403

__all__ = (["LayerHelper"] + control_flow.__all__ + conv.__all__ + crf.__all__ + decode.__all__
           + image.__all__ + inputs.__all__ + learning_rate_scheduler.__all__ + loss.__all__
           + math_ops.__all__
           + metric_op.__all__ + misc.__all__ + nn.__all__ + norm.__all__ + recurrent.__all__
           + rnn.__all__ + sequence.__all__ + shape_ops.__all__ + tensor.__all__)

# ``rnn`` (the cell API's function) is also the name of a module of this package: exported
# after the lists above are made, so ``fluid.layers.rnn(cell, inputs)`` is the function
from pdjit.layers import rnn_cells  # noqa: E402
from pdjit.layers.rnn_cells import *  # noqa: E402,F401,F403

__all__ = __all__ + rnn_cells.__all__

# Fluid 1.8's remaining activations, 3-D convolution and pooling, distributions, losses, tensor
# manipulations, 2.0-preview functions, RNN units and sequence layers
from pdjit.layers import (  # noqa: E402
    activation,
    conv_pool3d,
    distributions,
    losses,
    manip,
    preview,
    rnn_units,
    sequence_lod,
)
from pdjit.layers.activation import *  # noqa: E402,F401,F403
from pdjit.layers.conv_pool3d import *  # noqa: E402,F401,F403
from pdjit.layers.distributions import *  # noqa: E402,F401,F403
from pdjit.layers.losses import *  # noqa: E402,F401,F403
from pdjit.layers.manip import *  # noqa: E402,F401,F403
from pdjit.layers.preview import *  # noqa: E402,F401,F403
from pdjit.layers.rnn_units import *  # noqa: E402,F401,F403
from pdjit.layers.sequence_lod import *  # noqa: E402,F401,F403

__all__ = (__all__ + activation.__all__ + conv_pool3d.__all__ + distributions.__all__
           + losses.__all__ + manip.__all__ + preview.__all__ + rnn_units.__all__
           + sequence_lod.__all__)

# argument checks that name the user's line (pdjit.framework.errors.LayerInputError)
from pdjit.layers._user_line import wrap_all  # noqa: E402

wrap_all(globals(), __all__)
wrap_all(vars(inputs), ["data_v2"])      # pdjit.data
wrap_all(vars(nn), ["embedding_v2"])     # pdjit.embedding
del wrap_all
