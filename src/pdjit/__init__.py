"""pdjit: PaddlePaddle-Fluid-style programs, executed by a compiler.

``import pdjit as fluid`` gives Fluid's user API: build a program with ``fluid.layers``, run it
with ``fluid.Executor(fluid.CPUPlace())``.
"""
from pdjit import backward, clip, initializer, io, layers, nets, ops, optimizer, regularizer  # noqa: F401 (ops registers ops)
from pdjit.codegen.compiler import clear_cache
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
from pdjit.layers.io import data_v2 as data
from pdjit.param_attr import ParamAttr
from pdjit.passes.backward import append_backward, gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.place import CPUPlace, CUDAPinnedPlace, CUDAPlace
from pdjit.runtime.scope import Scope, global_scope, scope_guard
from pdjit.runtime.tensor import LoDTensor, create_lod_tensor, create_random_int_lodtensor
from pdjit.runtime.threads import get_num_threads, set_num_threads

__version__ = "0.1.0"

__all__ = [
    "Block", "Operator", "Parameter", "Program", "Variable", "default_main_program",
    "default_startup_program", "program_guard", "unique_name", "initializer", "layers",
    "ParamAttr", "Executor", "CPUPlace", "CUDAPlace", "CUDAPinnedPlace", "Scope", "global_scope",
    "scope_guard", "LoDTensor", "create_lod_tensor", "create_random_int_lodtensor",
    "data", "FeedError", "OpError", "OpRunError", "OpShapeError",
    "PdjitError", "ProgramError", "UnregisteredOpError", "set_num_threads", "get_num_threads",
    "clear_cache", "append_backward", "gradients", "optimizer", "regularizer", "clip", "backward",
]
