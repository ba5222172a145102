"""The built-in op definitions. Importing this package registers every op.

One module per family; each op is defined once, with ``pdjit.framework.registry.register_op``.
"""
from pdjit.ops import (activation, creation, elementwise, io, matmul, nn, reduce,  # noqa: F401
                       shape)
