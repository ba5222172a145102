"""Paddle 2.x/3.x's static-graph names for what a Fluid user reaches as ``fluid.*``.

``save_inference_model(path_prefix, feed_vars, fetch_vars, executor, program=None)`` writes
``<path_prefix>.pdmodel`` and ``<path_prefix>.pdiparams``; ``load_inference_model(path_prefix,
executor)`` reads them back. As in PaddlePaddle, ``load_inference_model`` with
``model_filename`` / ``params_filename`` keyword arguments treats ``path_prefix`` as a Fluid 1.x
model directory. ``save``/``load``/``load_program_state``/``set_program_state`` are
``fluid.save`` and its companions (``pdjit.io.checkpoint``) under their 2.x names.
"""
from __future__ import annotations

import os

from pdjit.framework.errors import named_errors
from pdjit.framework.program import (
    Program,
    Variable,
    default_main_program,
    default_startup_program,
    program_guard,
)
from pdjit.io import inference_model as _inf
from pdjit.io.checkpoint import load, load_program_state, save, set_program_state
from pdjit.io.tensor_stream import persistable_names, write_tensor
from pdjit.layers.inputs import data_v2 as data
from pdjit.runtime.executor import Executor
from pdjit.runtime.place import CPUPlace, CUDAPlace
from pdjit.runtime.scope import Scope, global_scope, scope_guard

normalize_program = _inf.normalize_program

__all__ = ["save_inference_model", "load_inference_model", "normalize_program",
           "serialize_program", "deserialize_program", "serialize_persistables",
           "deserialize_persistables", "Program", "Variable", "default_main_program",
           "default_startup_program", "program_guard", "data", "Executor", "CPUPlace",
           "CUDAPlace", "Scope", "global_scope", "scope_guard", "save", "load",
           "load_program_state", "set_program_state"]


def _prefix(path_prefix) -> str:
    if not isinstance(path_prefix, (str, os.PathLike)):
        raise TypeError(f"path_prefix must be a path, got {type(path_prefix).__name__}")
    path_prefix = os.fspath(path_prefix)
    if not path_prefix or os.path.basename(path_prefix) == "" or os.path.isdir(path_prefix):
        raise ValueError(f"path_prefix {path_prefix!r} must name a file prefix such as "
                         f"'dir/model' (it gets .pdmodel and .pdiparams), not a directory")
    return path_prefix


def serialize_program(feed_vars, fetch_vars, program=None, **kwargs) -> bytes:
    """The bytes of the inference program of ``program`` (what ``.pdmodel`` holds)."""
    program = program if program is not None else default_main_program()
    return _inf.normalize_program(program, feed_vars, fetch_vars).serialize_to_string()


def serialize_persistables(feed_vars, fetch_vars, executor, program=None, scope=None,
                           **kwargs) -> bytes:
    """The bytes of the inference program's parameters (what ``.pdiparams`` holds)."""
    program = program if program is not None else default_main_program()
    inference = _inf.normalize_program(program, feed_vars, fetch_vars)
    values = _inf._scope_values(inference, scope if scope is not None else global_scope())
    return b"".join(write_tensor(values[n]) for n in persistable_names(inference))


@named_errors("pdjit.static.deserialize_program")
def deserialize_program(data: bytes) -> Program:
    """A program from ``.pdmodel`` bytes (ModelFileError if they are not one)."""
    return _inf.parse_model(bytes(data), "<bytes>")


@named_errors("pdjit.static.deserialize_persistables")
def deserialize_persistables(program: Program, data: bytes, executor=None, scope=None) -> None:
    """Load ``.pdiparams`` bytes into the scope (all or nothing)."""
    values = _inf.params_from_bytes(program, bytes(data), "<bytes>")
    _inf.commit_values(values, scope if scope is not None else global_scope())


def save_inference_model(path_prefix, feed_vars, fetch_vars, executor, program=None,
                         scope=None, **kwargs) -> None:
    """Write ``<path_prefix>.pdmodel`` (the pruned, test-mode program with feed and fetch ops)
    and ``<path_prefix>.pdiparams`` (its persistables, combined, in sorted-name order)."""
    path_prefix = _prefix(path_prefix)
    unknown = set(kwargs) - {"clip_extra", "legacy_format"}
    if unknown:
        raise TypeError(f"save_inference_model: unexpected keyword arguments {sorted(unknown)}")
    program = program if program is not None else default_main_program()
    dirname, base = os.path.split(path_prefix)
    _inf.save_inference_model(dirname or ".", _inf._names(feed_vars, "feed_vars"), fetch_vars,
                              executor, main_program=program, model_filename=base + ".pdmodel",
                              params_filename=base + ".pdiparams", scope=scope)


@named_errors("pdjit.static.load_inference_model")
def load_inference_model(path_prefix, executor, scope=None, **kwargs) -> list:
    """``[program, feed_target_names, fetch_targets]`` from ``<path_prefix>.pdmodel`` and
    ``.pdiparams`` (or, given ``model_filename``/``params_filename``, from the Fluid 1.x model
    directory ``path_prefix``); the parameters go into the scope only if all were read."""
    unknown = set(kwargs) - {"model_filename", "params_filename"}
    if unknown:
        raise TypeError(f"load_inference_model: unexpected keyword arguments {sorted(unknown)}")
    path_prefix = os.fspath(path_prefix)
    if kwargs:
        model, params = kwargs.get("model_filename"), kwargs.get("params_filename")
        model = _existing(path_prefix, model, ".pdmodel") if model else None
        params = _existing(path_prefix, params, ".pdiparams") if params else None
        return _inf.load_inference_model(path_prefix, executor, model, params, scope=scope)
    dirname, base = os.path.split(path_prefix)
    if not base:
        raise ValueError(f"path_prefix {path_prefix!r} must name a file prefix, not a directory")
    params = base + ".pdiparams"
    return _inf.load_inference_model(dirname or ".", executor, base + ".pdmodel", params,
                                     scope=scope)


def _existing(dirname: str, name: str, suffix: str) -> str:
    return name + suffix if os.path.exists(os.path.join(dirname, name + suffix)) else name
