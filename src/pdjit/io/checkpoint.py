"""Checkpoints, the Fluid way: ``save``/``load`` (``.pdparams``, ``.pdopt``, ``.pdmodel``),
``load_program_state``/``set_program_state``.

``save(program, prefix)`` writes three files, as PaddlePaddle does:

- ``prefix.pdparams``: a pickle (protocol 4 by default) of ``{name: ndarray}`` holding every
  parameter of the program (its ``Parameter`` variables);
- ``prefix.pdopt``: the same for the other persistable variables, the ones that are neither
  parameters nor fed data (``need_check_feed``): optimizer moments, beta powers, learning rates,
  step counters, BatchNorm's running statistics... (always written, possibly an empty dict);
- ``prefix.pdmodel``: the program's ``ProgramDesc`` bytes.

Pickles with protocol 2 or 3 cannot hold an object over 4 GiB: as PaddlePaddle does, a larger
array is written in slices named ``<name>@@.<i>`` plus an ``UnpackBigParamInfor@@`` entry that
tells the loader how to join them.

Loading never runs code from a file. A restricted unpickler admits only dicts, lists, tuples,
strings, bytes, numbers, booleans, ``None`` and NumPy arrays and scalars of numeric dtypes
(NumPy's own reconstruction path, reimplemented here with every field checked: a claimed shape
must match the bytes given before anything is allocated). Any other global a pickle asks for
(``os.system``, ``builtins.eval``...) is refused with a :class:`ModelFileError` naming the file
and the global, before anything is called.

``load`` reads and checks everything (every variable present, dtype and shape as the program
declares them) before writing the Scope, so a failed load changes nothing. Without a
``.pdparams`` file, ``load`` and ``load_program_state`` read what ``save_vars`` /
``save_params`` / ``save_persistables`` wrote: a directory of one file per variable, or, with
``var_list``, one combined file.

``var_list`` also works with ``.pdparams`` checkpoints here (PaddlePaddle ignores it there):
only the variables it names are loaded or returned.
"""
from __future__ import annotations

import io
import math
import os
import pickle
import pickletools
import threading
import warnings

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ModelFileError, named_errors
from pdjit.framework.program import Parameter, Program, Variable
from pdjit.io.tensor_stream import _Reader, read_tensor
from pdjit.io.variables import _read_file, check_against, commit_values, is_persistable, read_values
from pdjit.io.variables import load_vars as _load_vars
from pdjit.runtime.scope import global_scope
from pdjit.runtime.tensor import LoDTensor

__all__ = ["save", "load", "load_program_state", "set_program_state",
           "get_program_parameter", "get_program_persistable_vars"]

PARAMS_SUFFIX, OPT_SUFFIX, MODEL_SUFFIX = ".pdparams", ".pdopt", ".pdmodel"
_BIG_INFO = "UnpackBigParamInfor@@"  # the key PaddlePaddle writes (sic)
# the most bytes one pickled object may hold with protocol 2 or 3 (PaddlePaddle's bound)
_MAX_PART_BYTES = 2 ** 30 - 1


# -- which variables go where ---------------------------------------------------------------------
def _unique_vars(program: Program) -> list:
    seen, out = set(), []
    for v in program.list_vars():
        if v.name not in seen:
            seen.add(v.name)
            out.append(v)
    return out


def _is_parameter(var) -> bool:
    return isinstance(var, Parameter)


def _is_optimizer_var(var) -> bool:
    """Persistable, neither a parameter nor fed data: what ``.pdopt`` holds."""
    return not (_is_parameter(var) or var.need_check_feed) and is_persistable(var)


def get_program_parameter(program: Program) -> list:
    """The parameters of ``program`` (all blocks)."""
    return [v for v in _unique_vars(_check_program(program, "get_program_parameter"))
            if _is_parameter(v)]


def get_program_persistable_vars(program: Program) -> list:
    """The persistable variables of ``program`` (feed/fetch holders and readers excluded)."""
    return [v for v in _unique_vars(_check_program(program, "get_program_persistable_vars"))
            if is_persistable(v)]


def _check_program(program, what: str) -> Program:
    if not isinstance(program, Program) and hasattr(program, "_as_program"):
        # a CompiledProgram: its Program (read without _as_program, which warns about runs)
        inner = getattr(program, "_program", None)
        program = inner if isinstance(inner, Program) else program._as_program()
    if not isinstance(program, Program):
        raise TypeError(f"{what}: program must be a Program, got {type(program).__name__}")
    return program


def _prefix(model_path, what: str) -> str:
    if not isinstance(model_path, (str, os.PathLike)):
        raise TypeError(f"{what}: model_path must be a str, got {type(model_path).__name__}")
    path = os.fspath(model_path)
    for suffix in (PARAMS_SUFFIX, OPT_SUFFIX, MODEL_SUFFIX):
        if path.endswith(suffix):
            return path[:-len(suffix)]
    return path


def _names(var_list, what: str) -> list | None:
    if var_list is None:
        return None
    if isinstance(var_list, (str, Variable)):
        var_list = [var_list]
    out = []
    for v in var_list:
        if not isinstance(v, (str, Variable)):
            raise TypeError(f"{what}: var_list holds Variables or names, got "
                            f"{type(v).__name__}")
        out.append(v if isinstance(v, str) else v.name)
    return out


# -- writing --------------------------------------------------------------------------------------
def _split_big(values: dict, protocol: int) -> dict:
    """PaddlePaddle's slicing of arrays too big for a protocol 2/3 pickle."""
    if protocol >= 4:
        return values
    out, info = {}, {}
    for name, arr in values.items():
        per_part = max(1, _MAX_PART_BYTES // max(1, arr.dtype.itemsize))
        if arr.size <= per_part:
            out[name] = arr
            continue
        flat = arr.reshape(-1)
        parts = [f"{name}@@.{i}" for i in range(math.ceil(arr.size / per_part))]
        for i, part in enumerate(parts):
            out[part] = flat[i * per_part:(i + 1) * per_part]
        info[name] = {"OriginShape": tuple(arr.shape), "slices": parts}
    if info:
        out[_BIG_INFO] = info
    return out


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _scope_values(variables, scope, what: str) -> dict:
    out = {}
    for v in variables:
        sv = scope.find_var(v.name)
        if sv is None or sv.value is None:
            raise ValueError(f"{what}: variable {v.name!r} has no value in the scope (run the "
                             f"startup program first)")
        value = sv.value
        arr = np.asarray(value.numpy() if isinstance(value, LoDTensor) else value)
        out[v.name] = np.array(arr, copy=True)
    return out


def save(program: Program, model_path: str, protocol: int = 4, *, scope=None,
         **configs) -> None:
    """Write ``model_path + ".pdparams"`` (the parameters), ``".pdopt"`` (the other
    persistable variables: optimizer state) and ``".pdmodel"`` (the program), taking the
    values from ``scope`` (the global scope by default)."""
    program = _check_program(program, "save")
    if "pickle_protocol" in configs:
        protocol = configs.pop("pickle_protocol")
        warnings.warn("save: 'pickle_protocol' is deprecated, use 'protocol'", stacklevel=2)
    if configs:
        raise TypeError(f"save: unexpected keyword arguments {sorted(configs)}")
    path = os.fspath(model_path) if isinstance(model_path, os.PathLike) else model_path
    if not isinstance(path, str):
        raise TypeError(f"save: model_path must be a str, got {type(model_path).__name__}")
    if os.path.basename(path) == "":
        raise ValueError(f"save: model_path must be 'dirname/prefix' with a non-empty prefix, "
                         f"got {path!r}")
    if not isinstance(protocol, int) or isinstance(protocol, bool) or not 2 <= protocol <= 4:
        raise ValueError(f"save: protocol must be an int in [2, 4], got {protocol!r}")
    sc = scope if scope is not None else global_scope()
    variables = _unique_vars(program)
    params = _scope_values([v for v in variables if _is_parameter(v)], sc, "save")
    opt = _scope_values([v for v in variables if _is_optimizer_var(v)], sc, "save")
    dirname = os.path.dirname(path)
    if dirname:
        os.makedirs(dirname, exist_ok=True)
    _atomic_write(path + PARAMS_SUFFIX, pickle.dumps(_split_big(params, protocol),
                                                     protocol=protocol))
    _atomic_write(path + OPT_SUFFIX, pickle.dumps(_split_big(opt, protocol), protocol=protocol))
    _atomic_write(path + MODEL_SUFFIX, program.serialize_to_string())


# -- the restricted unpickler ---------------------------------------------------------------------
# dtypes a checkpoint may hold: booleans and numbers
_DTYPE_NAMES = {"b1", "bool", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8",
                "c8", "c16"}
_BYTEORDERS = {"<", ">", "|", "="}


class _Refused(Exception):
    pass


class _NdarrayClass:
    """What a pickle gets for ``numpy.ndarray``: only ``_reconstruct`` accepts it."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        raise _Refused("a call of numpy.ndarray (arrays come only through numpy's _reconstruct)")


_NDARRAY = _NdarrayClass()


class _DtypeProxy:
    """``numpy.dtype(name, align, copy)`` then ``BUILD`` with its state, checked."""

    __slots__ = ("dtype",)

    def __init__(self, name, align=False, copy=False):
        if not isinstance(name, str) or name not in _DTYPE_NAMES:
            raise _Refused(f"a dtype {name!r} (only bool and numeric dtypes are admitted)")
        self.dtype = np.dtype(name)

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) < 2:
            raise _Refused(f"a dtype state {type(state).__name__}")
        order = state[1]
        if order not in _BYTEORDERS or any(s is not None for s in state[2:5]):
            raise _Refused("a structured or subarray dtype")
        if order in "<>":
            self.dtype = self.dtype.newbyteorder(order)


def _dtype_of(obj) -> np.dtype:
    if not isinstance(obj, _DtypeProxy):
        raise _Refused(f"an array whose dtype is a {type(obj).__name__}")
    return obj.dtype


class _ArrayProxy:
    """``numpy.core.multiarray._reconstruct(ndarray, ...)`` then ``BUILD`` with the array's
    state ``(version, shape, dtype, is_fortran, raw bytes)``: the bytes must be exactly what the
    shape and dtype claim, so nothing is allocated on a file's say-so."""

    __slots__ = ("array",)

    def __init__(self):
        self.array = None

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise _Refused("an array state that is not (version, shape, dtype, fortran, data)")
        shape, dt, fortran, raw = state[-4:]
        dt = _dtype_of(dt)
        if not isinstance(shape, tuple) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise _Refused(f"an array shape {shape!r}")
        if isinstance(raw, str):  # Python 2 pickles, read as latin-1
            raw = raw.encode("latin1")
        if not isinstance(raw, (bytes, bytearray)):
            raise _Refused(f"array data of type {type(raw).__name__}")
        count = math.prod(shape)
        if count * dt.itemsize != len(raw):
            raise _Refused(f"an array of shape {list(shape)} and dtype {dt} with "
                           f"{len(raw)} bytes of data ({count * dt.itemsize} expected)")
        _spend("bytes", len(raw), "array data")
        arr = np.frombuffer(bytes(raw), dtype=dt).reshape(shape, order="F" if fortran else "C")
        self.array = np.array(arr, dtype=dt.newbyteorder("="), order="C")


def _reconstruct(cls, shape=None, typecode=None):
    if cls is not _NDARRAY:
        raise _Refused(f"reconstructing a {type(cls).__name__} (only numpy.ndarray)")
    return _ArrayProxy()


def _scalar(dt, raw=None):
    dt = _dtype_of(dt)
    if isinstance(raw, str):
        raw = raw.encode("latin1")
    if not isinstance(raw, bytes) or len(raw) != dt.itemsize:
        raise _Refused(f"a {dt} scalar with {type(raw).__name__} data")
    return np.frombuffer(raw, dtype=dt)[0]


def _codecs_encode(obj, encoding="utf-8", errors="strict"):
    """Protocol 2 spells bytes as ``_codecs.encode(str, 'latin1')``."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused(f"_codecs.encode with encoding {encoding!r}")
    return obj.encode("latin1")


def _guarded(fn):
    """``fn`` behind an object with no attributes: a pickle can call it but not change it
    (``BUILD`` on it fails), nor use it as a class (``NEWOBJ``)."""
    cls = type(f"_Guarded_{fn.__name__}", (), {"__slots__": (), "__call__": staticmethod(fn)})
    return cls()


_ALLOWED = {("numpy", "ndarray"): _NDARRAY,
            ("numpy", "dtype"): _guarded(_DtypeProxy),
            ("_codecs", "encode"): _guarded(_codecs_encode),
            ("collections", "OrderedDict"): _guarded(dict)}
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_mod, "_reconstruct")] = _guarded(_reconstruct)
    _ALLOWED[(_mod, "scalar")] = _guarded(_scalar)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        found = _ALLOWED.get((module, name))
        if found is None:
            raise _Refused(f"the global {module}.{name}")
        return found

    def persistent_load(self, pid):
        raise _Refused("a persistent id")


# What unpickling one file may build: the bytes of array data a file of n bytes can hold (each
# array's data is in the file once; shared references to one bytes object would multiply it),
# and the objects its opcodes can make. Set per load by ``load_pickle``; None: unbounded.
_budget = threading.local()


def _spend(kind: str, n: int, what: str) -> None:
    left = getattr(_budget, kind, None)
    if left is None:
        return
    left -= n
    setattr(_budget, kind, left)
    if left < 0:
        raise _Refused(f"{what} beyond what the file's size can hold (shared references that "
                       f"multiply one value: {kind} over the bound)")


def _resolve(obj, what: str, depth: int = 0, done: dict | None = None):
    """Replace array proxies by their arrays; refuse anything not admitted. A container the
    pickle shares is resolved once (``done``: id -> result), so shared references cost nothing
    twice; every object resolved counts against the load's budget."""
    if depth > 32:
        raise _Refused("nesting deeper than 32 levels")
    if done is None:
        done = {}
    if isinstance(obj, (dict, list, tuple, _ArrayProxy)):
        got = done.get(id(obj))
        if got is not None:
            return got[1]
    _spend("objects", 1, "objects")
    if isinstance(obj, _ArrayProxy):
        if not isinstance(obj.array, np.ndarray):
            raise _Refused("an array without its data")
        out = obj.array
    elif isinstance(obj, dict):
        out = {k if isinstance(k, (str, int)) else _bad_key(k):
               _resolve(v, what, depth + 1, done) for k, v in obj.items()}
    elif isinstance(obj, list):
        out = [_resolve(v, what, depth + 1, done) for v in obj]
    elif isinstance(obj, tuple):
        out = tuple(_resolve(v, what, depth + 1, done) for v in obj)
    elif obj is None or isinstance(obj, (str, bytes, bool, int, float, complex, np.generic)):
        return obj
    else:
        raise _Refused(f"an object of type {type(obj).__name__}")
    done[id(obj)] = (obj, out)  # (obj kept alive: its id stays its own)
    return out


def _bad_key(k):
    raise _Refused(f"a dict key of type {type(k).__name__}")


def _join_big(values: dict, path: str) -> dict:
    """Undo :func:`_split_big` (PaddlePaddle's protocol 2/3 slicing)."""
    info = values.pop(_BIG_INFO, None)
    if info is None:
        return values
    if not isinstance(info, dict):
        raise ModelFileError(f"{path}: {_BIG_INFO} is a {type(info).__name__}, not a dict")
    for name, entry in info.items():
        try:
            parts = [np.asarray(values.pop(p)) for p in entry["slices"]]
            shape = tuple(int(d) for d in entry["OriginShape"])
            total = sum(p.size for p in parts)
            if any(d < 0 for d in shape) or math.prod(shape) != total:
                raise ValueError(f"OriginShape {list(shape)} holds {math.prod(shape)} "
                                 f"elements, the slices {total}")
            if len({id(p) for p in parts}) != len(parts):
                raise ValueError("one slice is used twice")
            _spend("bytes", sum(p.nbytes for p in parts), f"joining {name!r}")
            values[name] = np.concatenate([p.reshape(-1) for p in parts]).reshape(shape)
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFileError(f"{path}: variable {name!r} is split into slices that do not "
                                 f"join: {type(e).__name__}: {e}") from None
    return values


# opcodes a checkpoint never needs: persistent ids, the copyreg extension registry, and
# protocol 5's out-of-band buffers and bytearrays
_REFUSED_OPS = {"PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "BYTEARRAY8", "NEXT_BUFFER",
                "READONLY_BUFFER"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}


def _scan(data: bytes) -> None:
    """Walk the opcodes without running them: refuse the ones a checkpoint never needs, and
    memo indices beyond the next free one (the unpickler grows its memo table to any index a
    file names: one 5-byte opcode could ask for tens of GiB)."""
    memo = 0
    ops = pickletools.genops(data)
    while True:
        try:
            op, arg, pos = next(ops)
        except StopIteration:
            return
        except ValueError as e:  # truncated, or an unknown opcode
            raise pickle.UnpicklingError(str(e)) from None
        if op.name in _REFUSED_OPS:
            raise _Refused(f"the pickle opcode {op.name} at byte {pos}")
        if op.name in _PUT_OPS:
            if not isinstance(arg, int) or not 0 <= arg <= memo:
                raise _Refused(f"a memo index {arg!r} at byte {pos} (the pickle has {memo} "
                               f"memo entries so far)")
            memo += arg == memo
        elif op.name == "MEMOIZE":
            memo += 1


@named_errors("pdjit.io.load_pickle")
def load_pickle(path: str, what: str = "checkpoint") -> dict:
    """The ``{name: value}`` dict of a ``.pdparams``/``.pdopt`` file, read without running
    any code from it; a damaged or hostile file is a :class:`ModelFileError` naming it."""
    data = _read_file(path, what)
    try:
        _scan(data)
        # array data: once from the file, once more joining split arrays
        _budget.bytes, _budget.objects = 2 * len(data) + 4096, len(data) + 4096
        try:
            obj = _Unpickler(io.BytesIO(data), encoding="latin1").load()
            obj = _resolve(obj, path)
            obj = _join_big(obj, path) if isinstance(obj, dict) else obj
        finally:
            _budget.bytes = _budget.objects = None
    except ModelFileError:
        raise
    except _Refused as e:
        raise ModelFileError(f"{path}: refused to load {e}: a checkpoint holds only dicts, "
                             f"lists, strings, numbers and NumPy arrays") from None
    except RecursionError:
        raise ModelFileError(f"{path}: the pickle nests too deeply") from None
    except (EOFError, pickle.UnpicklingError) as e:
        raise ModelFileError(f"{path}: damaged or truncated pickle ({len(data)} bytes): "
                             f"{e or type(e).__name__}") from None
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError,
            OverflowError) as e:
        raise ModelFileError(f"{path}: damaged pickle: {type(e).__name__}: {e}") from None
    if not isinstance(obj, dict):
        raise ModelFileError(f"{path}: holds a {type(obj).__name__}, expected a dict of "
                             f"variable name -> array")
    return obj


# -- loading ---------------------------------------------------------------------------------------
def _checked(var, values: dict, path: str):
    if var.name not in values:
        raise ModelFileError(f"{path}: no value for variable {var.name!r} of the program "
                             f"(the file holds {len(values)} variables)")
    value = values[var.name]
    if not isinstance(value, (np.ndarray, np.generic)):
        raise ModelFileError(f"{path}: variable {var.name!r} holds a {type(value).__name__}, "
                             f"expected an array")
    value = np.asarray(value)
    check_against(var, value, path)
    return value


@named_errors("pdjit.io.load")
def load(program: Program, model_path: str, executor=None, var_list=None, *,
         scope=None) -> None:
    """Load the values ``save`` wrote for ``program`` into ``scope`` (the global scope by
    default): its parameters from ``.pdparams`` and its other persistable variables from
    ``.pdopt``. Without a ``.pdparams`` file, ``model_path`` is what ``save_vars`` &co. wrote:
    a directory of variable files, or a combined file (then ``var_list`` says what it holds).
    ``executor`` is accepted for Fluid's signature; nothing needs it."""
    program = _check_program(program, "load")
    prefix = _prefix(model_path, "load")
    names = _names(var_list, "load")
    sc = scope if scope is not None else global_scope()
    params_file = prefix + PARAMS_SUFFIX
    if not os.path.exists(params_file):
        _load_saved_vars(program, os.fspath(model_path), names, sc)
        return
    wanted = (lambda v: True) if names is None else (lambda v: v.name in set(names))
    if names is not None:
        known = {v.name for v in program.list_vars()}
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"load: var_list names variables not in the program: {missing}")
    variables = [v for v in _unique_vars(program) if wanted(v)]
    values = {}
    params = [v for v in variables if _is_parameter(v)]
    if params:
        stored = load_pickle(params_file, "parameters")
        values.update({v.name: _checked(v, stored, params_file) for v in params})
    opt = [v for v in variables if _is_optimizer_var(v)]
    if opt:
        opt_file = prefix + OPT_SUFFIX
        if not os.path.exists(opt_file):
            raise ModelFileError(f"load: no such file: {opt_file} (the optimizer state of "
                                 f"{len(opt)} variables such as {opt[0].name!r})")
        stored = load_pickle(opt_file, "optimizer state")
        values.update({v.name: _checked(v, stored, opt_file) for v in opt})
    commit_values(values, sc)


def _load_saved_vars(program: Program, path: str, names, scope) -> None:
    if os.path.isdir(path):
        files = set()
        for root, _, fs in os.walk(path):
            files.update(os.path.relpath(os.path.join(root, f), path).replace(os.sep, "/")
                         for f in fs)
        chosen = [v for v in _unique_vars(program)
                  if v.name in files and (names is None or v.name in names)]
        if not chosen:
            raise ModelFileError(f"load: {path} holds neither {os.path.basename(path)}"
                                 f"{PARAMS_SUFFIX} nor a file named after a variable of the "
                                 f"program")
        unused = sorted(files - {v.name for v in chosen})
        if unused:
            warnings.warn(f"load: files of {path} not loaded (no such variable in the "
                          f"program): {unused[:10]}", stacklevel=3)
        _load_vars(None, path, program, vars=chosen, scope=scope)
        return
    if os.path.isfile(path):
        if names is None:
            raise ValueError(f"load: {path} is a single file (written by save_vars with a "
                             f"filename): var_list must say which variables it holds")
        gb = {v.name: v for v in _unique_vars(program)}
        missing = [n for n in names if n not in gb]
        if missing:
            raise ValueError(f"load: var_list names variables not in the program: {missing}")
        dirname, filename = os.path.split(path)
        _load_vars(None, dirname, program, vars=[gb[n] for n in names], filename=filename,
                   scope=scope)
        return
    raise ModelFileError(f"load: no checkpoint at {path!r}: neither {path}{PARAMS_SUFFIX} "
                         f"(written by save) nor a file or directory written by save_vars "
                         f"exists")


@named_errors("pdjit.io.load_program_state")
def load_program_state(model_path: str, var_list=None) -> dict:
    """``{name: ndarray}`` read from a checkpoint: ``.pdparams`` and ``.pdopt`` (if present),
    or what ``save_vars`` &co. wrote (a directory, or a combined file with ``var_list``)."""
    prefix = _prefix(model_path, "load_program_state")
    names = _names(var_list, "load_program_state")
    params_file = prefix + PARAMS_SUFFIX
    if os.path.exists(params_file):
        state = load_pickle(params_file, "parameters")
        opt_file = prefix + OPT_SUFFIX
        if os.path.exists(opt_file):
            state.update(load_pickle(opt_file, "optimizer state"))
        if names is not None:
            missing = [n for n in names if n not in state]
            if missing:
                raise ModelFileError(f"load_program_state: {prefix}: no value for {missing}")
            state = {n: state[n] for n in names}
        return state
    path = os.fspath(model_path)
    if os.path.isfile(path):
        if var_list is None:
            raise ValueError(f"load_program_state: {path} is a single file (written by "
                             f"save_vars with a filename): var_list must say which variables "
                             f"it holds")
        dirname, filename = os.path.split(path)
        chosen = sorted(var_list if not isinstance(var_list, (str, Variable)) else [var_list],
                        key=lambda v: v if isinstance(v, str) else v.name)
        return _as_arrays(read_values(chosen, dirname, filename))
    if os.path.isdir(path):
        if var_list is not None:
            chosen = var_list if not isinstance(var_list, (str, Variable)) else [var_list]
            return _as_arrays(read_values(chosen, path))
        state = {}
        for root, _, fs in os.walk(path):
            for f in sorted(fs):
                full = os.path.join(root, f)
                name = os.path.relpath(full, path).replace(os.sep, "/")
                try:
                    reader = _Reader(_read_file(full, f"variable {name!r}"), full)
                    value = read_tensor(reader, name)
                    if reader.left:
                        raise ValueError(f"{full}: {reader.left} bytes left "
                                         f"after the tensor")
                except (ValueError, ModelFileError) as e:
                    warnings.warn(f"load_program_state: skipped {full}: {e}", stacklevel=2)
                    continue
                state[name] = value
        return _as_arrays(state)
    raise ModelFileError(f"load_program_state: no checkpoint at {path!r}: neither "
                         f"{params_file} nor a file or directory written by save_vars exists")


def _as_arrays(values: dict) -> dict:
    return {n: np.asarray(v.numpy() if isinstance(v, LoDTensor) else v)
            for n, v in values.items()}


def set_program_state(program: Program, state_dict: dict, *, scope=None) -> None:
    """Write the values of ``state_dict`` into ``scope`` (the global scope by default) for the
    persistable variables of ``program`` it names; each must have the dtype and shape of the
    variable (its current value when it has one, else its declaration). Names the program does
    not have are warned about."""
    program = _check_program(program, "set_program_state")
    if not isinstance(state_dict, dict):
        raise TypeError(f"set_program_state: state_dict must be a dict, got "
                        f"{type(state_dict).__name__}")
    state = _join_big(dict(state_dict), "state_dict")
    sc = scope if scope is not None else global_scope()
    values, used = {}, set()
    for var in _unique_vars(program):
        if not is_persistable(var) or var.name not in state:
            continue
        value = state[var.name]
        if isinstance(value, LoDTensor):
            value = value.numpy()
        if not (isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__array__")):
            raise TypeError(f"set_program_state: the value of {var.name!r} is a "
                            f"{type(value).__name__}, expected an ndarray")
        value = np.asarray(value)
        held = sc.find_var(var.name)
        current = None if held is None or held.value is None else np.asarray(
            held.value.numpy() if isinstance(held.value, LoDTensor) else held.value)
        if current is not None:
            if current.shape != value.shape:
                raise ValueError(f"set_program_state: variable {var.name!r} has shape "
                                 f"{list(current.shape)} in the program, the state holds "
                                 f"{list(value.shape)}")
            if current.dtype != value.dtype:
                raise ValueError(f"set_program_state: variable {var.name!r} is "
                                 f"{dtypes.dtype_str(current.dtype)} in the program, the state "
                                 f"holds {value.dtype}")
        else:
            try:
                check_against(var, value, "set_program_state")
            except ModelFileError as e:
                raise ValueError(str(e)) from None
        values[var.name] = np.array(value, copy=True)
        used.add(var.name)
    unused = [k for k in state if k not in used]
    if unused:
        warnings.warn(f"set_program_state: not set, no such persistable variable in the "
                      f"program: {' '.join(map(str, unused))}", stacklevel=2)
    commit_values(values, sc)
