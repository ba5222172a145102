"""The public names of ``import pdjit as fluid`` (the package loads this module at the first
use of one of them). Its module attributes (``fluid.optimizer``, ``fluid.core``...) are Fluid's
module paths, resolved through ``pdjit.MOVED``."""
from pdjit import (  # noqa: F401 (ops registers ops)
    backward,
    clip,
    compiler,
    contrib,
    core,
    data_feeder,
    dataset,
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
from pdjit.fluid.compiled_program import *  # noqa: F401,F403
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
from pdjit.io.dataset import DatasetFactory, InMemoryDataset, QueueDataset
from pdjit.layers._user_line import with_user_line as _with_user_line
from pdjit.layers.inputs import data_v2 as _data
from pdjit.layers.nn import embedding_v2 as _embedding
from pdjit.layers.param_attr import ParamAttr
from pdjit.passes.backward import append_backward, gradients
from pdjit.passes.verify import verify
from pdjit.runtime.data_feeder import *  # noqa: F401,F403
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
from pdjit.version import __version__, require_version  # noqa: F401


def set_num_threads(n: int) -> None:
    """The threads compiled loops and BLAS use (process-wide; ``PDJIT_NUM_THREADS``)."""
    from pdjit.codegen.cpu import threads  # (the code generator: when used)

    threads.set_num_threads(n)


def get_num_threads() -> int:
    from pdjit.codegen.cpu import threads

    return threads.get_num_threads()


def clear_cache() -> None:
    """Delete everything pdjit compiled to disk (``PDJIT_CACHE_DIR``): generated kernels, the
    library kernels' compiled code and the Predictor's optimized models."""
    from pdjit.codegen.compiler import clear_cache as clear  # (the code generator: when used)

    clear()


# fluid.data / fluid.embedding: argument errors name the user's line, as fluid.layers' do
data = _with_user_line(_data)
embedding = _with_user_line(_embedding)

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
    "in_dygraph_mode", "DatasetFactory", "InMemoryDataset", "QueueDataset",
]
from pdjit.framework import name_scope as _name_scope  # noqa: E402

__all__ += (compiler.__all__ + data_feeder.__all__ + io.checkpoint.__all__
            + _name_scope.__all__)
