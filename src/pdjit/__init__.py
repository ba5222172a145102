"""pdjit: PaddlePaddle-Fluid-style programs, executed by a compiler.

``import pdjit as fluid`` gives Fluid's user API: build a program with ``fluid.layers``, run it
with ``fluid.Executor(fluid.CPUPlace())``.
"""
from pdjit import (  # noqa: F401 (ops registers ops)
                   backward,
                   clip,
                   compiler,
                   core,
                   data_feeder,
                   initializer,
                   install_check,
                   io,
                   layers,
                   metrics,
                   nets,
                   ops,
                   optimizer,
                   regularizer,
)
from pdjit.compiler import *  # noqa: F401,F403
from pdjit.data_feeder import *  # noqa: F401,F403
from pdjit.framework import (
                   Block,
                   Operator,
                   Parameter,
                   Program,
                   Variable,
                   default_main_program,
                   default_startup_program,
                   program_guard,
                   unique_name,
)
from pdjit.framework.errors import (
                   FeedError,
                   OpError,
                   OpRunError,
                   OpShapeError,
                   PdjitError,
                   ProgramError,
                   UnregisteredOpError,
)
from pdjit.framework.name_scope import *  # noqa: F401,F403
from pdjit.io.checkpoint import *  # noqa: F401,F403
from pdjit.layers.io import data_v2 as data
from pdjit.layers.nn import embedding_v2 as embedding
from pdjit.param_attr import ParamAttr
from pdjit.passes.backward import append_backward, gradients
from pdjit.passes.verify import verify
from pdjit.runtime.executor import Executor
from pdjit.runtime.place import CPUPlace, CUDAPinnedPlace, CUDAPlace, is_compiled_with_cuda
from pdjit.runtime.scope import Scope, global_scope, scope_guard
from pdjit.runtime.tensor import LoDTensor, create_lod_tensor, create_random_int_lodtensor
from pdjit.runtime.threads import get_num_threads, set_num_threads

__version__ = "0.1.0"


def clear_cache() -> None:
    """Delete everything pdjit compiled to disk (``PDJIT_CACHE_DIR``): generated kernels and
    the library kernels' compiled code."""
    from pdjit.codegen.compiler import clear_cache as clear  # (the code generator: when used)

    clear()


__all__ = [
    "Block", "Operator", "Parameter", "Program", "Variable", "default_main_program",
    "default_startup_program", "program_guard", "unique_name", "initializer", "layers",
    "ParamAttr", "Executor", "CPUPlace", "CUDAPlace", "CUDAPinnedPlace", "Scope", "global_scope",
    "scope_guard", "LoDTensor", "create_lod_tensor", "create_random_int_lodtensor",
    "data", "FeedError", "OpError", "OpRunError", "OpShapeError",
    "PdjitError", "ProgramError", "UnregisteredOpError", "set_num_threads", "get_num_threads",
    "clear_cache", "append_backward", "gradients", "optimizer", "regularizer", "clip", "backward",
    "compiler", "core", "metrics", "install_check", "is_compiled_with_cuda", "embedding", "verify",
]
from pdjit.framework import name_scope as _name_scope  # noqa: E402

__all__ += (compiler.__all__ + data_feeder.__all__ + io.checkpoint.__all__
            + _name_scope.__all__)
