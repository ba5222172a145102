"""The built-in op definitions. Importing this package registers every op.

One module per family; each op is defined once, with ``pdjit.framework.registry.register_op``.
"""
from pdjit.ops import (  # noqa: F401
    activation,
    attention,
    beam_search,
    collective,
    control_flow,
    conv,
    creation,
    crf,
    elementwise,
    feed_fetch,
    image,
    indexing,
    lod_array,
    loss,
    matmul,
    metric,
    misc,
    nn,
    norm,
    optimizer,
    pool,
    recurrent,
    reduce,
    rnn,
    sequence,
    shape,
    similarity,
    trig,
)

# Fluid 1.8's remaining activations, 3-D conv/pool, ranking and center losses, CTC, focal loss, IoU,
# grid sampling, hsigmoid, nce, py_func, ROI pooling, reverse, sequence ops, spectral norm
# isort: split
from pdjit.ops import (  # noqa: E402,F401
    activation_fluid,
    center_loss,
    conv3d,
    ctc,
    detection_basic,
    grid_sample,
    hsigmoid,
    loss_rank,
    manip,
    nce,
    py_func,
    roi,
    sequence_fluid,
    spectral_norm,
)

# ops Fluid 1.8's layers append under names of their own (label_smooth, maxout, lrn, ...)
# isort: split
from pdjit.ops import fluid_layer_ops  # noqa: E402,F401
