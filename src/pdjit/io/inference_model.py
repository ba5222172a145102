"""Inference models in PaddlePaddle's legacy format: save, load, and find them on disk.

An inference model is a program pruned to what its targets need, in test mode, with ``feed``
ops (column ``i`` writes the ``i``-th fed variable) and ``fetch`` ops (column ``i`` reads the
``i``-th target), plus the values of its persistable variables. Two layouts exist:

- Fluid 1.x (``save_inference_model(dirname, ...)``): ``dirname/__model__`` (or
  ``model_filename``) and one file per variable, named after it, or one combined file
  ``params_filename``;
- Paddle 2.x/3.x (``pdjit.static.save_inference_model(path_prefix, ...)``): ``<prefix>.pdmodel``
  and the combined ``<prefix>.pdiparams``.

A combined file holds the tensors of the program's persistables in the order of their sorted
names (``tensor_stream``). The program is written as PaddlePaddle writes it: global-block
variables sorted by name and the feed/fetch holders last, feed ops first in reverse column
order, fetch ops last, ``is_test`` set, ``is_parameter``/``stop_gradient`` and the ops' creation
stacks cleared (they hold the saving machine's paths). Saving what was loaded gives the same
bytes.

Loading reads and checks everything (the program parses, every parameter file exists and holds
a tensor of the declared dtype and shape, no bytes are left over) before the Scope is written:
a damaged model is a :class:`ModelFileError` naming the file and the variable, and changes
nothing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from pdjit.framework import registry
from pdjit.framework.errors import ModelFileError, ProgramError, named_errors
from pdjit.framework.program import Program, Variable, default_main_program
from pdjit.io.tensor_stream import _Reader, persistable_names, write_tensor
from pdjit.io.variables import _read_file, commit_values, read_checked, read_values
from pdjit.passes.verify import verify
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime.feed_fetch import names_of
from pdjit.runtime.scope import global_scope

VarType = pb.VarType
MODEL_FILENAME = "__model__"
FEED_HOLDER, FETCH_HOLDER = "feed", "fetch"
# attributes a saved op does not keep: where it was created (absolute paths of the saving
# machine), as PaddlePaddle's saving leaves them out
_DROPPED_ATTRS = ("op_callstack",)

__all__ = ["save_inference_model", "load_inference_model", "normalize_program",
           "load_model", "InferenceModel", "feed_target_names", "fetch_target_names",
           "MODEL_FILENAME"]


# -- the inference program ------------------------------------------------------------------------
def _names(items, what: str) -> list:
    """Names of Variables or names; one of them alone stands for a list of one."""
    return list(names_of([items] if isinstance(items, (str, Variable)) else items, what))


def _block_reads(program: Program, idx: int, seen=None) -> set:
    """The names block ``idx`` and the blocks its ops own read without defining them."""
    seen = set() if seen is None else seen
    if idx in seen:
        return set()
    seen.add(idx)
    block = program.block(idx)
    reads = set()
    for op in block.ops:
        reads.update(op.input_arg_names)
        for sub in op.sub_block_indices():
            reads |= _block_reads(program, sub, seen)
    return {n for n in reads if n not in block.vars}


def _is_feed_fetch(op) -> bool:
    opdef = registry.lookup(op.type)
    return opdef is not None and opdef.has(registry.FEED_FETCH)


def _prune_ops(program: Program, feeds: list, targets: list) -> list:
    """The indices of the global block's ops the targets need, the fed variables given: an op
    is kept when it writes a needed name, unless all it writes of them are fed values it does
    not read (their producers go; a loop updating a fed value in place stays)."""
    gb = program.global_block()
    needed, fed = set(targets), set(feeds)
    keep = []
    for i in range(len(gb.ops) - 1, -1, -1):
        op = gb.ops[i]
        if _is_feed_fetch(op):
            continue
        outs = [n for n in op.output_arg_names if n in needed]
        if not outs:
            continue
        reads = set(op.input_arg_names)
        for sub in op.sub_block_indices():
            reads |= _block_reads(program, sub)
        if all(n in fed and n not in reads for n in outs):
            continue  # it only produces what is fed instead (an op updating a fed value stays)
        keep.append(i)
        needed |= reads
    keep.reverse()
    return keep


def _clean_op(desc: pb.OpDesc) -> None:
    kept = [a for a in desc.attrs if a.name not in _DROPPED_ATTRS]
    if len(kept) != len(desc.attrs):
        del desc.attrs[:]
        desc.attrs.extend(kept)
    desc.ClearField("is_target")
    test_mode = registry.test_mode_of(desc.type)
    for a in desc.attrs:
        if a.name == test_mode and a.type == pb.AttrType.BOOLEAN:
            a.b = True


def _feed_fetch_op(kind: str, holder: str, name: str, col: int) -> pb.OpDesc:
    desc = pb.OpDesc(type=kind)
    x, out = (holder, name) if kind == "feed" else (name, holder)
    desc.inputs.add(parameter="X", arguments=[x])
    desc.outputs.add(parameter="Out", arguments=[out])
    desc.attrs.add(name="col", type=pb.AttrType.INT, i=col)
    desc.attrs.add(name="op_callstack", type=pb.AttrType.STRINGS)
    desc.attrs.add(name="op_device", type=pb.AttrType.STRING, s="")
    desc.attrs.add(name="op_namescope", type=pb.AttrType.STRING, s="/")
    desc.attrs.add(name="op_role", type=pb.AttrType.INT, i=0)
    desc.attrs.add(name="op_role_var", type=pb.AttrType.STRINGS)
    desc.attrs.add(name="with_quant_attr", type=pb.AttrType.BOOLEAN, b=False)
    return desc


def normalize_program(program: Program, feed_vars, fetch_vars) -> Program:
    """The inference program of ``program`` for these feeds and targets (a new Program):
    pruned to what the targets need, in test mode, with feed and fetch ops."""
    if not isinstance(program, Program):
        raise TypeError(f"program must be a Program, got {type(program).__name__}")
    feeds, targets = _names(feed_vars, "feed_vars"), _names(fetch_vars, "fetch_vars")
    if not targets:
        raise ValueError("save_inference_model: fetch_vars (the targets) is empty")
    gb = program.global_block()
    for what, names in (("feed", feeds), ("fetch", targets)):
        for n in names:
            if not gb.has_var(n):
                raise ValueError(f"save_inference_model: {what} variable {n!r} is not in the "
                                 f"program's global block")
    if len(set(feeds)) != len(feeds):
        raise ValueError(f"save_inference_model: a variable is fed twice: {feeds}")
    keep = _prune_ops(program, feeds, targets)
    src = program.desc
    desc = pb.ProgramDesc()
    desc.CopyFrom(src)
    g = desc.blocks[0]
    ops = [src.blocks[0].ops[i] for i in keep]
    used = set(feeds) | set(targets)
    for op in ops:
        for slot in list(op.inputs) + list(op.outputs):
            used.update(slot.arguments)
    for b in program.blocks[1:]:
        used |= _block_reads(program, b.idx)
    vars_ = sorted((v for v in src.blocks[0].vars
                    if v.name in used and v.name not in (FEED_HOLDER, FETCH_HOLDER)),
                   key=lambda v: v.name)
    del g.vars[:]
    for v in vars_:
        nv = g.vars.add()
        nv.CopyFrom(v)
        nv.ClearField("is_parameter")
        nv.ClearField("stop_gradient")
    g.vars.add(name=FEED_HOLDER, persistable=True).type.type = VarType.FEED_MINIBATCH
    g.vars.add(name=FETCH_HOLDER, persistable=True).type.type = VarType.FETCH_LIST
    del g.ops[:]
    for col in range(len(feeds) - 1, -1, -1):
        g.ops.append(_feed_fetch_op("feed", FEED_HOLDER, feeds[col], col))
    for op in ops:
        g.ops.add().CopyFrom(op)
    for col, name in enumerate(targets):
        g.ops.append(_feed_fetch_op("fetch", FETCH_HOLDER, name, col))
    for b in desc.blocks:
        for op in b.ops:
            if op.type not in ("feed", "fetch") or b.idx:
                _clean_op(op)
    out = Program._from_desc(desc)
    out.random_seed = program.random_seed
    out._is_test = True
    return out


def feed_target_names(program: Program) -> list:
    """The variables the feed ops write, in column order."""
    return _targets(program, "feed", "Out")


def fetch_target_names(program: Program) -> list:
    """The variables the fetch ops read, in column order."""
    return _targets(program, "fetch", "X")


def _targets(program: Program, kind: str, slot: str) -> list:
    found = {}
    for i, op in enumerate(program.global_block().ops):
        if op.type != kind:
            continue
        col, names = op.attr("col"), op.input(slot) if slot == "X" else op.output(slot)
        if not isinstance(col, int) or col < 0 or len(names) != 1:
            raise ProgramError(f"{kind} op #{i} (block 0): expected an int col >= 0 and one "
                               f"{slot} variable, got col={col!r}, {slot}={names}")
        if col in found:
            raise ProgramError(f"{kind} op #{i} (block 0): column {col} is also written by "
                               f"another {kind} op ({found[col]!r})")
        found[col] = names[0]
    if sorted(found) != list(range(len(found))):
        raise ProgramError(f"the {kind} ops' columns {sorted(found)} are not 0..{len(found) - 1}")
    return [found[c] for c in range(len(found))]


# -- files -----------------------------------------------------------------------------------------
def _write_file(path: str, data: bytes) -> None:
    """Written to a temporary name and renamed: a failed save leaves no half-written file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@named_errors("pdjit.io.parse_model")
def parse_model(data: bytes, path: str) -> Program:
    """The program of a model file's bytes, verified (``pdjit.verify``): a
    :class:`ModelFileError` when they do not parse, a :class:`ProgramError` naming the file and
    the block, op or variable when the program is malformed."""
    try:
        program = Program.parse_from_string(data)
    except ProgramError as e:
        raise ModelFileError(f"{path}: not a valid model program: {e}") from None
    verify_parsed(program, path)
    try:
        feed_target_names(program)
        fetch_target_names(program)
    except ProgramError as e:
        raise ModelFileError(f"{path}: {e}") from None
    return program


def verify_parsed(program: Program, path: str, registered: bool = True) -> Program:
    """``pdjit.verify`` of a program read from ``path``; its errors name the file."""
    try:
        return verify(program, registered=registered)
    except ProgramError as e:
        raise type(e)(f"{path}: {e}") from None


def param_vars(program: Program) -> list:
    """The persistable variables a parameter file holds, in file order (sorted names)."""
    names = persistable_names(program)
    by_name = {}
    for v in program.list_vars():
        by_name.setdefault(v.name, v)
    return [by_name[n] for n in names]


def read_params(program: Program, dirname: str, params_filename: str | None) -> dict:
    """``{name: value}`` for every persistable of ``program``, read from one combined file or
    one file per variable, each checked against its ``VarDesc``."""
    chosen = param_vars(program)
    return read_values(chosen, dirname, params_filename) if chosen else {}


def params_from_bytes(program: Program, data: bytes, what: str) -> dict:
    """``read_params`` from the bytes of a combined file."""
    chosen = param_vars(program)
    reader = _Reader(data, what)
    values = {v.name: read_checked(reader, v, what) for v in chosen}
    if reader.left:
        raise ModelFileError(f"{what}: {reader.left} bytes left after the "
                             f"{len(chosen)} tensors the program declares")
    return values


def _params_blob(values: dict, names: list) -> bytes:
    return b"".join(write_tensor(values[n]) for n in names)


def _scope_values(program: Program, scope) -> dict:
    values = {}
    for v in param_vars(program):
        sv = scope.find_var(v.name)
        if sv is None or sv.value is None:
            raise ValueError(f"save_inference_model: persistable variable {v.name!r} has no value "
                             f"in the scope (run the startup program, or train, first)")
        values[v.name] = sv.value
    return values


# -- Fluid 1.x --------------------------------------------------------------------------------
def save_inference_model(dirname, feeded_var_names, target_vars, executor, main_program=None,
                         model_filename=None, params_filename=None, export_for_deployment=True,
                         program_only=False, clip_extra=True, scope=None) -> list:
    """Fluid's ``save_inference_model``: the pruned test-mode program as ``dirname/__model__``
    (or ``model_filename``) and its persistables, one file each or combined into
    ``params_filename``. Returns the targets' names."""
    if isinstance(feeded_var_names, str):
        feeded_var_names = [feeded_var_names]
    if not all(isinstance(n, str) for n in feeded_var_names or ()):
        raise TypeError("save_inference_model: feeded_var_names must be a list of names")
    program = main_program if main_program is not None else default_main_program()
    inference = normalize_program(program, feeded_var_names, target_vars)
    scope = scope if scope is not None else global_scope()
    values = {} if program_only else _scope_values(inference, scope)
    os.makedirs(dirname, exist_ok=True)
    _write_file(os.path.join(dirname, model_filename or MODEL_FILENAME),
                inference.serialize_to_string())
    if not program_only:
        names = persistable_names(inference)
        if params_filename is not None:
            _write_file(os.path.join(dirname, params_filename), _params_blob(values, names))
        else:
            for n in names:
                _write_file(os.path.join(dirname, n), write_tensor(values[n]))
    return fetch_target_names(inference)


@named_errors("pdjit.io.load_inference_model")
def load_inference_model(dirname, executor, model_filename=None, params_filename=None,
                         pserver_endpoints=None, scope=None) -> list:
    """Fluid's ``load_inference_model``: ``[program, feed_target_names, fetch_targets]``, the
    parameters loaded into the scope (the global scope unless given) only if all of them
    were read and checked."""
    model_path = os.path.join(dirname, model_filename or MODEL_FILENAME)
    if model_filename is None and not os.path.exists(model_path) and \
            os.path.isfile(dirname):  # a model file given as the directory
        model_path, dirname = dirname, os.path.dirname(dirname)
    program = parse_model(_read_file(model_path, "model"), model_path)
    values = read_params(program, dirname, params_filename)
    commit_values(values, scope if scope is not None else global_scope())
    return _result(program)


def _result(program: Program) -> list:
    gb = program.global_block()
    return [program, feed_target_names(program), [gb.var(n) for n in fetch_target_names(program)]]


# -- finding a model on disk --------------------------------------------------------------------
@dataclass
class InferenceModel:
    """A loaded model: its program (with feed/fetch ops), what it feeds and fetches, the
    values of its persistables, and the files they came from."""
    program: Program
    feed_names: list
    fetch_names: list
    params: dict = field(repr=False)
    model_file: str = ""
    params_file: str | None = None

    def param_bytes(self) -> int:
        return int(sum(np.asarray(v).nbytes for v in self.params.values()))


def resolve(path: str, params_file: str | None = None) -> tuple:
    """``(model file, params directory, params file name or None)`` for a path prefix, a
    ``.pdmodel``/``__model__`` file or a directory holding one model."""
    path = os.fspath(path)
    if params_file is not None:
        return path, os.path.dirname(params_file) or ".", os.path.basename(params_file)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, MODEL_FILENAME)):
            model = os.path.join(path, MODEL_FILENAME)
            combined = [f for f in ("__params__", "params") if os.path.isfile(
                os.path.join(path, f))]
            return model, path, combined[0] if combined else None
        found = sorted(f for f in os.listdir(path) if f.endswith(".pdmodel"))
        if len(found) != 1:
            raise ModelFileError(f"{path}: expected a directory holding __model__ or exactly one "
                                 f"*.pdmodel file, found {found or 'neither'}")
        path = os.path.join(path, found[0][:-len(".pdmodel")])
    elif path.endswith(".pdmodel"):
        path = path[:-len(".pdmodel")]
    elif os.path.isfile(path):  # a program file of another name: per-variable files beside it
        return path, os.path.dirname(path) or ".", None
    model = path + ".pdmodel"
    if not os.path.exists(model):
        raise ModelFileError(f"no model at {path!r}: neither {model} nor a directory with "
                             f"{MODEL_FILENAME}")
    params = path + ".pdiparams"
    return model, os.path.dirname(params) or ".", os.path.basename(params)


@named_errors("pdjit.io.load_model")
def load_model(path, params_file: str | None = None) -> InferenceModel:
    """Read a saved model (any layout, see :func:`resolve`) without touching any Scope."""
    model, pdir, pname = resolve(path, params_file)
    program = parse_model(_read_file(model, "model"), model)
    if not persistable_names(program):
        pname = None  # a model without parameters has no parameter file
    params = read_params(program, pdir, pname)
    return InferenceModel(program, feed_target_names(program), fetch_target_names(program),
                          params, model, os.path.join(pdir, pname) if pname else None)
