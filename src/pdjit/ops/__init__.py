"""The built-in op definitions. Importing this package registers every op.

One module per family; each op is defined once, with ``pdjit.framework.registry.register_op``.
"""
from pdjit.ops import (  # noqa: F401
    activation,
    activation_fluid,
    collective,
    control_flow,
    conv,
    creation,
    crf,
    elementwise,
    image,
    indexing,
    io,
    lod_array,
    loss,
    loss_rank,
    matmul,
    metric,
    misc,
    nn,
    norm,
    optimizer,
    pool,
    reduce,
    rnn,
    sequence,
    sequence_fluid,
    shape,
    trig,
)
