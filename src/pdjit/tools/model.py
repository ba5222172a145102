"""Finding what a command was pointed at: a saved inference model, or a bare program file."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ModelFileError, ProgramError
from pdjit.framework.program import Program
from pdjit.io import inference_model as inf
from pdjit.io.variables import _read_file
from pdjit.proto import framework_pb2 as pb
from pdjit.tools import CliError, plural


@dataclass
class Loaded:
    """A program and, when they could be read, its parameters."""
    program: Program
    model_file: str
    params: dict | None = field(default=None, repr=False)  # None: not loaded
    params_file: str | None = None
    params_dir: str | None = None
    params_note: str | None = None   # why the parameters were not loaded
    feed_names: list = field(default_factory=list)
    fetch_names: list = field(default_factory=list)


def load_program(path: str) -> Loaded:
    """The program at ``path`` (anything ``load_model`` takes, or any serialized ProgramDesc
    file, e.g. a training program) and its parameters when they are there and readable.

    A program that cannot be found or parsed is a :class:`ModelFileError`; parameters that cannot
    be read leave ``params`` at None with the reason in ``params_note``."""
    model_file, pdir, pname = inf.resolve(path)
    data = _read_file(model_file, "model")
    try:
        program = Program.parse_from_string(data)
    except ProgramError as e:
        raise ModelFileError(f"{model_file}: {e}") from None
    inf.verify_parsed(program, model_file, registered=False)  # an unknown op type still prints
    out = Loaded(program, model_file)
    try:
        out.feed_names = inf.feed_target_names(program)
        out.fetch_names = inf.fetch_target_names(program)
    except ProgramError as e:
        out.params_note = f"{model_file}: {e}"
        return out
    has_persistables = bool(inf.param_vars(program))
    if not has_persistables:
        out.params = {}
        return out
    if pname is None and not out.feed_names and not out.fetch_names:
        # a program of its own (a training program): no parameter files to look for
        return out
    try:
        out.params = inf.read_params(program, pdir, pname)
        out.params_file = os.path.join(pdir, pname) if pname else None
        out.params_dir = pdir
    except ModelFileError as e:
        out.params_note = str(e)
    return out


def shape_str(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def dtype_name(dtype) -> str:
    return "-" if dtype is None else dtypes.dtype_str(np.dtype(dtype))


def describe_var(program: Program, name: str) -> str:
    gb = program.global_block()
    if not gb.has_var(name):
        return f"{name} (not declared)"
    v = gb.var(name)
    lod = f" lod_level {v.lod_level}" if v.type == pb.VarType.LOD_TENSOR and v.lod_level else ""
    return f"{name} {shape_str(v.shape)} {dtype_name(v.dtype)}{lod}"


def require(cond: bool, message: str) -> None:
    if not cond:
        raise CliError(message)


def check(path: str, out=None, err=None) -> int:
    """``pdjit check``: read the model at ``path``, verify its program (``pdjit.verify``) and
    read its parameters; print ``OK`` and a summary (status 0) or the error (status 1). A path
    where no model is found is bad input: the error and status 2."""
    import sys

    from pdjit.framework.errors import as_pdjit_error
    from pdjit.passes.verify import verify

    out, err = out or sys.stdout, err or sys.stderr
    try:
        inf.resolve(path)
    except ModelFileError as e:
        print(f"pdjit check: {e}", file=err)
        return 2
    try:
        loaded = load_program(path)
        verify(loaded.program)  # (load_program accepted unregistered op types)
        if loaded.params_note:
            raise ModelFileError(loaded.params_note)
    except Exception as e:  # noqa: BLE001 - every failure named on one line, status 1
        if not isinstance(e, CliError):
            e = as_pdjit_error(e, "check")
        text = " ".join(s.strip() for s in str(e).splitlines() if s.strip())
        print(f"pdjit check: {path}: {type(e).__name__}: {text}", file=err)
        return 1
    program = loaded.program
    ops = [op.type for b in program.blocks for op in b.ops]
    nvars = sum(len(b.vars) for b in program.blocks)
    print(f"OK {loaded.model_file}: {plural(len(program.blocks), 'block')}, "
          f"{plural(len(ops), 'op')} of {plural(len(set(ops)), 'type')}, "
          f"{plural(nvars, 'variable')}", file=out)
    if loaded.feed_names or loaded.fetch_names:
        print(f"  feeds:   {', '.join(describe_var(program, n) for n in loaded.feed_names)}",
              file=out)
        print(f"  fetches: {', '.join(describe_var(program, n) for n in loaded.fetch_names)}",
              file=out)
    if loaded.params is None:
        print(f"  parameters: {plural(len(inf.param_vars(program)), 'persistable variable')} "
              f"declared (a program of its own: no parameter file read)", file=out)
    else:
        nbytes = int(sum(np.asarray(v).nbytes for v in loaded.params.values()))
        where = loaded.params_file or loaded.params_dir or "-"
        print(f"  parameters: {len(loaded.params)} read and checked "
              f"({plural(nbytes, 'byte')}) from {where}", file=out)
    return 0
