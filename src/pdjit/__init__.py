"""pdjit: PaddlePaddle-Fluid-style programs, executed by a compiler.

``import pdjit as fluid`` gives Fluid's user API: build a program with ``fluid.layers``, run it
with ``fluid.Executor(fluid.CPUPlace())``.
"""
from pdjit import (  # noqa: F401 (ops registers ops)
                   backward,
                   clip,
                   compiler,
                   contrib,
                   core,
                   data_feeder,
                   executor,
                   initializer,
                   install_check,
                   io,
                   layers,
                   metrics,
                   nets,
                   ops,
                   optimizer,
                   profiler,
                   regularizer,
                   version,
)
from pdjit.codegen.compiler import clear_cache
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
                   in_dygraph_mode,
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
from pdjit.layers.io import data_v2 as _data
from pdjit.layers.layer_helper import with_user_line as _with_user_line
from pdjit.layers.nn import embedding_v2 as _embedding
from pdjit.param_attr import ParamAttr
from pdjit.passes.backward import append_backward, gradients
from pdjit.passes.verify import verify
from pdjit.runtime.executor import Executor
from pdjit.runtime.place import (
                   CPUPlace,
                   CUDAPinnedPlace,
                   CUDAPlace,
                   cuda_pinned_places,
                   cuda_places,
                   is_compiled_with_cuda,
)
from pdjit.runtime.scope import Scope, global_scope, scope_guard
from pdjit.runtime.tensor import LoDTensor, create_lod_tensor, create_random_int_lodtensor
from pdjit.runtime.threads import get_num_threads, set_num_threads
from pdjit.version import require_version

data = _with_user_line(_data, "data")
embedding = _with_user_line(_embedding, "embedding")
__version__ = "0.1.0"

__all__ = [
    "Block", "Operator", "Parameter", "Program", "Variable", "default_main_program",
    "default_startup_program", "program_guard", "unique_name", "initializer", "layers",
    "ParamAttr", "Executor", "CPUPlace", "CUDAPlace", "CUDAPinnedPlace", "Scope", "global_scope",
    "scope_guard", "LoDTensor", "create_lod_tensor", "create_random_int_lodtensor",
    "data", "FeedError", "OpError", "OpRunError", "OpShapeError",
    "PdjitError", "ProgramError", "UnregisteredOpError", "set_num_threads", "get_num_threads",
    "clear_cache", "append_backward", "gradients", "optimizer", "regularizer", "clip", "backward",
    "compiler", "core", "metrics", "install_check", "is_compiled_with_cuda", "embedding", "verify",
    "contrib", "executor", "profiler", "require_version", "cuda_places", "cuda_pinned_places",
    "in_dygraph_mode",
]
from pdjit.framework import name_scope as _name_scope  # noqa: E402

__all__ += (compiler.__all__ + data_feeder.__all__ + io.checkpoint.__all__
            + _name_scope.__all__)
