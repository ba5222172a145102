"""Program, Block, Variable, Parameter, Operator: the compile-time description of a model.

These are thin Python views over the protobuf messages of ``schema/framework.proto`` (the
seeds' ``ProgramDesc``/``BlockDesc``/``VarDesc``/``OpDesc``). Each ``Variable`` and ``Operator``
owns its own message; ``Program.desc`` assembles the ``ProgramDesc`` from them when it is asked
for and the program changed (every change bumps ``Program.version``). So a program parsed from
bytes serialises back to the same bytes, attributes pdjit does not use included, and passes may
insert, remove and rename freely.

Guarantees when an op is appended (``Block.append_op``): its slots and attributes match its
definition, it records the user's call stack (``op_callstack``) and ``op_role``, and its outputs'
shapes and dtypes are inferred (``-1`` for dims unknown until run time). A bad op is refused
with an :class:`OpShapeError` and leaves the block as it was.
"""
from __future__ import annotations

import contextlib
import os
import re
import traceback
from typing import Iterable, Iterator

import numpy as np
from google.protobuf import text_format

from pdjit.framework import attrs as attrs_mod
from pdjit.framework import dtypes, registry, unique_name
from pdjit.framework.errors import (
    OpShapeError,
    ProgramError,
    ShapeMismatch,
    UnregisteredOpError,
    describe_op,
)
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType
_PDJIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>[^\n]+)')

# Variable types whose VarType carries a TensorDesc, and where it lives.
_TENSOR_HOLDERS = {VarType.LOD_TENSOR: "lod_tensor", VarType.LOD_TENSOR_ARRAY: "tensor_array",
                   VarType.SELECTED_ROWS: "selected_rows"}


def _tensor_desc(vt: pb.VarType, create: bool = False):
    holder = _TENSOR_HOLDERS.get(vt.type)
    if holder is None:
        return None
    if holder == "selected_rows":
        return vt.selected_rows if (create or vt.HasField("selected_rows")) else None
    sub = getattr(vt, holder)
    return sub.tensor if (create or sub.HasField("tensor")) else None


# ==============================================================================================
class Variable:
    """A named value of a block: a view of its ``VarDesc``.

    ``op`` is the op that produced it (``None`` for feeds, parameters and loaded programs
    until looked up). Arithmetic operators append ops (installed by ``pdjit.layers``).
    """

    def __init__(self, block: "Block", desc: pb.VarDesc):
        self.block = block
        self.desc = desc
        self.op: Operator | None = None

    # -- identity ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.desc.name

    @property
    def program(self) -> "Program":
        return self.block.program

    # -- type, dtype, shape --------------------------------------------------------------------
    @property
    def type(self) -> int:
        return self.desc.type.type

    @property
    def dtype(self) -> np.dtype | None:
        td = _tensor_desc(self.desc.type)
        return dtypes.to_numpy(td.data_type) if td is not None else None

    @dtype.setter
    def dtype(self, value) -> None:
        _tensor_desc(self.desc.type, create=True).data_type = dtypes.to_code(value)
        self._changed()

    @property
    def shape(self) -> tuple:
        td = _tensor_desc(self.desc.type)
        return tuple(td.dims) if td is not None else ()

    @shape.setter
    def shape(self, value) -> None:
        td = _tensor_desc(self.desc.type, create=True)
        del td.dims[:]
        td.dims.extend(int(d) for d in value)
        self._changed()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def lod_level(self) -> int:
        vt = self.desc.type
        if vt.type == VarType.LOD_TENSOR:
            return vt.lod_tensor.lod_level
        if vt.type == VarType.LOD_TENSOR_ARRAY:
            return vt.tensor_array.lod_level
        return 0

    @lod_level.setter
    def lod_level(self, value: int) -> None:
        vt = self.desc.type
        if vt.type == VarType.LOD_TENSOR:
            vt.lod_tensor.lod_level = int(value)
        elif vt.type == VarType.LOD_TENSOR_ARRAY:
            vt.tensor_array.lod_level = int(value)
        elif value:
            raise ProgramError(f"variable {self.name!r} of type "
                               f"{dtypes.type_name(vt.type)} has no lod_level")
        self._changed()

    # -- flags ---------------------------------------------------------------------------------
    def _flag(name):  # noqa: N805 - property factory
        def get(self):
            return getattr(self.desc, name)

        def set_(self, value):
            setattr(self.desc, name, bool(value))
            self._changed()
        return property(get, set_)

    persistable = _flag("persistable")
    stop_gradient = _flag("stop_gradient")
    is_parameter = _flag("is_parameter")
    need_check_feed = _flag("need_check_feed")
    del _flag

    def meta(self) -> registry.VarMeta:
        """What infer_shape sees of this variable."""
        return registry.VarMeta(self.shape, self.dtype if self.dtype is not None else np.float32,
                                self.lod_level, self.type, self.name)

    def _changed(self) -> None:
        self.block.program._bump()

    def to_string(self, throw_on_error: bool = False, with_details: bool = False) -> str:
        text = text_format.MessageToString(self.desc)
        if with_details:
            text += "".join(f"{k}: {getattr(self, k)!r}\n" for k in self._detail_fields())
        return text

    def _detail_fields(self):
        return ("stop_gradient",)

    def __repr__(self) -> str:
        dt = dtypes.dtype_str(self.dtype) if self.dtype is not None else "-"
        kind = dtypes.type_name(self.type)
        extra = ", persistable" if self.persistable else ""
        lod = f", lod_level={self.lod_level}" if self.lod_level else ""
        return f"var {self.name} : {kind}.shape{list(self.shape)}.dtype({dt}){lod}{extra}"

    __str__ = __repr__

    # Variables hash by identity; ``==`` appends an ``equal`` op (see pdjit.layers.math_ops).
    __hash__ = object.__hash__


class Parameter(Variable):
    """A persistable, trainable variable of the global block (weights, biases)."""

    def __init__(self, block, desc, trainable=True, optimize_attr=None, regularizer=None,
                 gradient_clip_attr=None, do_model_average=None, initializer=None):
        super().__init__(block, desc)
        self.trainable = trainable
        self.optimize_attr = optimize_attr if optimize_attr is not None else {"learning_rate": 1.0}
        self.regularizer = regularizer
        self.gradient_clip_attr = gradient_clip_attr
        self.do_model_average = do_model_average
        self.initializer = initializer

    def _detail_fields(self):
        return ("stop_gradient", "trainable", "optimize_attr", "regularizer")


# ==============================================================================================
class Operator:
    """One op of a block: a view of its ``OpDesc`` with cached slot and attribute maps."""

    def __init__(self, block: "Block", desc: pb.OpDesc):
        self.block = block
        self.desc = desc
        self._inputs = {v.parameter: list(v.arguments) for v in desc.inputs}
        self._outputs = {v.parameter: list(v.arguments) for v in desc.outputs}
        self._attrs = {a.name: attrs_mod.read(a) for a in desc.attrs}

    @property
    def type(self) -> str:
        return self.desc.type

    @property
    def opdef(self) -> registry.OpDef | None:
        return registry.lookup(self.desc.type)

    @property
    def idx(self) -> int:
        return self.block.ops.index(self)

    # -- slots -----------------------------------------------------------------------------------
    @property
    def input_names(self) -> list:
        return list(self._inputs)

    @property
    def output_names(self) -> list:
        return list(self._outputs)

    def input(self, slot: str) -> list:
        return list(self._inputs.get(slot, ()))

    def output(self, slot: str) -> list:
        return list(self._outputs.get(slot, ()))

    @property
    def inputs(self) -> dict:
        return {k: list(v) for k, v in self._inputs.items()}

    @property
    def outputs(self) -> dict:
        return {k: list(v) for k, v in self._outputs.items()}

    @property
    def input_arg_names(self) -> list:
        return [n for args in self._inputs.values() for n in args]

    @property
    def output_arg_names(self) -> list:
        return [n for args in self._outputs.values() for n in args]

    def _rename_input(self, old: str, new: str) -> None:
        self._rename(self._inputs, self.desc.inputs, old, new)

    def _rename_output(self, old: str, new: str) -> None:
        self._rename(self._outputs, self.desc.outputs, old, new)

    def _rename(self, cache, field, old, new):
        for v in field:
            if old in v.arguments:
                args = [new if a == old else a for a in v.arguments]
                del v.arguments[:]
                v.arguments.extend(args)
                cache[v.parameter] = args
        self.block.program._bump()

    def _set_slot(self, which: str, slot: str, names: list) -> None:
        cache = self._inputs if which == "input" else self._outputs
        field = self.desc.inputs if which == "input" else self.desc.outputs
        for v in field:
            if v.parameter == slot:
                del v.arguments[:]
                v.arguments.extend(names)
                break
        else:
            v = field.add()
            v.parameter = slot
            v.arguments.extend(names)
        cache[slot] = list(names)
        self.block.program._bump()

    # -- attributes ----------------------------------------------------------------------------
    def attr(self, name: str):
        try:
            return self._attrs[name]
        except KeyError:
            raise ProgramError(f"{self._describe()}: has no attribute {name!r}") from None

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    @property
    def attr_names(self) -> list:
        return list(self._attrs)

    def all_attrs(self) -> dict:
        return dict(self._attrs)

    def attr_type(self, name: str) -> int:
        for a in self.desc.attrs:
            if a.name == name:
                return a.type
        raise ProgramError(f"{self._describe()}: has no attribute {name!r}")

    def _block_attr(self, name: str) -> "Block":
        return self.block.program.block(self.attr(name))

    def _blocks_attr(self, name: str) -> list:
        return [self.block.program.block(i) for i in self.attr(name)]

    def _set_attr(self, name: str, value, attr_type: int | None = None) -> None:
        if attr_type is None:
            attr_type = _declared_attr_type(self.opdef, name)
        if attr_type is None and name in self._attrs:
            attr_type = self.attr_type(name)
        if attr_type is None:
            attr_type = attrs_mod.infer_type(value)
        for a in self.desc.attrs:
            if a.name == name:
                attrs_mod.write(a, name, attr_type, value)
                break
        else:
            attrs_mod.write(self.desc.attrs.add(), name, attr_type, value)
        self._attrs[name] = attrs_mod.read(next(a for a in self.desc.attrs if a.name == name))
        self.block.program._bump()

    def set_attr(self, name: str, value) -> None:
        self._set_attr(name, value)

    def _remove_attr(self, name: str) -> None:
        keep = [a for a in self.desc.attrs if a.name != name]
        if len(keep) != len(self.desc.attrs):
            kept = [pb.OpDesc.Attr.FromString(a.SerializeToString()) for a in keep]
            del self.desc.attrs[:]
            self.desc.attrs.extend(kept)
            self._attrs.pop(name, None)
            self.block.program._bump()

    # -- where the user created it ---------------------------------------------------------------
    @property
    def callstack(self) -> list:
        return list(self._attrs.get("op_callstack", ()))

    def location(self) -> str | None:
        """``file:line`` of the user code that created the op, from ``op_callstack``."""
        return location_from_callstack(self.callstack)

    def _describe(self) -> str:
        try:
            idx = self.idx
        except ValueError:
            idx = None
        return describe_op(self.type, self.block.idx, idx, self.location())

    def to_string(self, throw_on_error: bool = False) -> str:
        return text_format.MessageToString(self.desc)

    def __repr__(self) -> str:
        outs = ", ".join(f"{k}={v}" for k, v in self._outputs.items())
        ins = ", ".join(f"{k}={v}" for k, v in self._inputs.items())
        shown = {k: v for k, v in self._attrs.items()
                 if k not in ("op_callstack", "op_namescope", "op_device", "with_quant_attr")}
        attrs = ", ".join(f"{k} = {v!r}" for k, v in sorted(shown.items()))
        return f"{{{outs}}} = {self.type}(inputs={{{ins}}}{', ' if attrs else ''}{attrs})"

    __str__ = __repr__


def _declared_attr_type(opdef, name):
    if opdef is not None and name in opdef.attrs:
        return opdef.attrs[name].type
    if name in registry.COMMON_ATTRS:
        return registry.COMMON_ATTRS[name].type
    return None


def location_from_callstack(stack: list) -> str | None:
    for entry in reversed(stack):
        m = _FRAME_RE.search(entry)
        if m and not os.path.abspath(m.group("file")).startswith(_PDJIT_DIR):
            return f"{m.group('file')}:{m.group('line')}"
    return None


def _user_callstack() -> list:
    """The current Python stack, without pdjit's own frames, as Paddle's ``op_callstack``."""
    frames = [f for f in traceback.extract_stack()[:-1]
              if not os.path.abspath(f.filename).startswith(_PDJIT_DIR)]
    return traceback.format_list(frames[-12:])


# ==============================================================================================
class Block:
    """A block: local variables and a sequence of ops, with a parent block (seed 002)."""

    def __init__(self, program: "Program", desc: pb.BlockDesc):
        self.program = program
        self.desc = desc  # holds idx, parent_idx, forward_block_idx; vars/ops are rebuilt on flush
        self.vars: dict[str, Variable] = {}
        self.ops: list[Operator] = []

    @property
    def idx(self) -> int:
        return self.desc.idx

    @property
    def parent_idx(self) -> int:
        return self.desc.parent_idx

    @property
    def forward_block_idx(self) -> int:
        return self.desc.forward_block_idx

    @property
    def parent_block(self) -> "Block | None":
        return self.program.block(self.parent_idx) if self.parent_idx >= 0 else None

    # -- variables -----------------------------------------------------------------------------
    def var(self, name: str) -> Variable:
        """The variable ``name`` of this block (not its ancestors)."""
        try:
            return self.vars[name]
        except KeyError:
            raise ProgramError(f"variable {name!r} is not in block {self.idx}") from None

    def has_var(self, name: str) -> bool:
        return name in self.vars

    def _find_var_recursive(self, name: str) -> Variable | None:
        b = self
        while b is not None:
            v = b.vars.get(name)
            if v is not None:
                return v
            b = b.parent_block
        return None

    def _var_recursive(self, name: str) -> Variable:
        v = self._find_var_recursive(name)
        if v is None:
            raise ProgramError(f"variable {name!r} is not defined in block {self.idx} or its "
                               f"ancestors")
        return v

    def create_var(self, name: str | None = None, shape=None, dtype=None, type=VarType.LOD_TENSOR,
                   lod_level: int = 0, persistable: bool = False, stop_gradient: bool = False,
                   need_check_feed: bool = False, **kw) -> Variable:
        """Declare a variable here (an existing one of the same name is returned as it is)."""
        if name is None:
            name = unique_name.generate("_generated_var")
        if name in self.vars:
            return self.vars[name]
        desc = pb.VarDesc(name=name)
        desc.type.type = type
        if type in _TENSOR_HOLDERS:
            td = _tensor_desc(desc.type, create=True)
            td.data_type = dtypes.to_code(dtype if dtype is not None else "float32")
            if shape is not None:
                td.dims.extend(int(d) for d in shape)
            if lod_level and type in (VarType.LOD_TENSOR, VarType.LOD_TENSOR_ARRAY):
                getattr(desc.type, _TENSOR_HOLDERS[type]).lod_level = int(lod_level)
        desc.persistable = bool(persistable)
        if stop_gradient:
            desc.stop_gradient = True
        if need_check_feed:
            desc.need_check_feed = True
        cls = kw.pop("_cls", Variable)
        var = cls(self, desc, **kw)
        self.vars[name] = var
        self.program._bump()
        return var

    def create_parameter(self, name: str, shape, dtype, **kw) -> Parameter:
        if any(int(d) < 0 for d in shape):
            raise ProgramError(f"parameter {name!r}: every dim must be known, got shape "
                               f"{list(shape)}")
        p = self.create_var(name=name, shape=shape, dtype=dtype, persistable=True, _cls=Parameter,
                            **kw)
        p.desc.is_parameter = True
        return p

    def _remove_var(self, name: str) -> None:
        if self.vars.pop(name, None) is not None:
            self.program._bump()

    def _rename_var(self, old: str, new: str) -> Variable:
        v = self.vars.pop(old)
        v.desc.name = new
        self.vars[new] = v
        for op in self.ops:
            op._rename_input(old, new)
            op._rename_output(old, new)
        self.program._bump()
        return v

    def all_parameters(self) -> list:
        return [v for v in self.vars.values() if isinstance(v, Parameter)]

    def iter_parameters(self) -> Iterator[Parameter]:
        return iter(self.all_parameters())

    # -- ops -------------------------------------------------------------------------------------
    def append_op(self, type: str, inputs=None, outputs=None, attrs=None, **kw) -> Operator:
        return self._insert_op(len(self.ops), type, inputs, outputs, attrs, **kw)

    def _prepend_op(self, type: str, inputs=None, outputs=None, attrs=None, **kw) -> Operator:
        return self._insert_op(0, type, inputs, outputs, attrs, **kw)

    def _insert_op(self, index: int, type: str, inputs=None, outputs=None, attrs=None,
                   infer_shape: bool = True) -> Operator:
        """Build an op from its definition, check it, infer its outputs, and insert it."""
        opdef = registry.lookup(type)
        stack = _user_callstack()
        where = location_from_callstack(stack)
        if opdef is None:
            raise UnregisteredOpError(f"{describe_op(type, self.idx, index, where)}: op type "
                                      f"{type!r} is not registered")

        def fail(msg, cls=OpShapeError):
            return cls(msg, type, self.idx, index, where)

        desc = pb.OpDesc(type=type)
        in_names = self._bind_slots(opdef.inputs, inputs or {}, "input", fail)
        out_names = self._bind_slots(opdef.outputs, outputs or {}, "output", fail)
        for slot, names in in_names.items():
            desc.inputs.add(parameter=slot, arguments=names)
        for slot, names in out_names.items():
            desc.outputs.add(parameter=slot, arguments=names)

        given = dict(attrs or {})
        for name in given:
            if name not in opdef.attrs and name not in registry.COMMON_ATTRS:
                known = ", ".join(sorted(opdef.attrs)) or "none"
                raise fail(f"unknown attribute {name!r} (its attributes: {known})")
        values = opdef.attr_values(given)
        missing = [n for n, s in opdef.attrs.items() if s.required and n not in values]
        if missing:
            raise fail(f"missing required attribute(s) {missing}")
        values.setdefault("op_role", given.get("op_role", self.program._current_role))
        if self.program._current_role_vars and "op_role_var" not in given:
            values["op_role_var"] = list(self.program._current_role_vars)
        values.setdefault("op_callstack", stack)
        for name, value in values.items():
            t = _declared_attr_type(opdef, name)
            try:
                attrs_mod.write(desc.attrs.add(), name, t if t is not None
                                else attrs_mod.infer_type(value), value)
            except TypeError as e:
                raise fail(str(e)) from None
        for name, value in given.items():  # common attrs given explicitly but not in values
            if name not in values:
                attrs_mod.write(desc.attrs.add(), name, registry.COMMON_ATTRS[name].type, value)

        op = Operator(self, desc)
        if infer_shape:
            infer_op_shape(op, opdef, fail)
        self.ops.insert(index, op)
        for names in out_names.values():
            for n in names:
                v = self._find_var_recursive(n)
                if v is not None:
                    v.op = op
        self.program._bump()
        return op

    def _bind_slots(self, slots, given: dict, which: str, fail) -> dict:
        """{slot: Variable | name | list | None} -> {slot: [names]}, checked against ``slots``."""
        known = {s.name: s for s in slots}
        for name in given:
            if name not in known:
                raise fail(f"has no {which} slot {name!r} (its {which} slots: "
                           f"{', '.join(known) or 'none'})")
        out = {}
        for slot in slots:
            value = given.get(slot.name)
            items = [] if value is None else list(value) if isinstance(value, (list, tuple)) \
                else [value]
            names = []
            for item in items:
                if isinstance(item, Variable):
                    names.append(item.name)
                elif isinstance(item, str):
                    names.append(item)
                else:
                    raise fail(f"{which} {slot.name!r}: expected a Variable or a variable name, "
                               f"got {type(item).__name__}")
            if not names and not slot.dispensable:
                raise fail(f"{which} {slot.name!r} is required but was not given")
            if len(names) > 1 and not slot.duplicable:
                raise fail(f"{which} {slot.name!r} takes one variable, got {len(names)}: {names}")
            for n in names:
                if n != registry.EMPTY_VAR_NAME and self._find_var_recursive(n) is None:
                    raise fail(f"{which} {slot.name!r}: variable {n!r} is not defined in block "
                               f"{self.idx} or its ancestors")
            if names or slot.name in given:
                out[slot.name] = names
        return out

    def _remove_op(self, index: int) -> None:
        del self.ops[index]
        self.program._bump()

    def _sync_with_desc(self) -> None:
        """Rebuild this block's desc vars/ops from the Python objects (``Program.desc`` does)."""
        del self.desc.vars[:]
        self.desc.vars.extend(v.desc for v in self.vars.values())
        del self.desc.ops[:]
        self.desc.ops.extend(op.desc for op in self.ops)

    def __repr__(self) -> str:
        return f"Block(idx={self.idx}, parent_idx={self.parent_idx}, {len(self.vars)} vars, " \
               f"{len(self.ops)} ops)"


def infer_op_shape(op: Operator, opdef: registry.OpDef, fail) -> None:
    """Run the op's ``infer_shape`` and write the results into its output variables."""
    block = op.block
    metas = {}
    for slot in opdef.inputs:
        names = op.input(slot.name)
        vs = [block._find_var_recursive(n) for n in names if n != registry.EMPTY_VAR_NAME]
        ms = [v.meta() for v in vs if v is not None]
        metas[slot.name] = ms if slot.duplicable else (ms[0] if ms else None)
    attrs = {k: v for k, v in op.all_attrs().items() if k in opdef.attrs}
    try:
        result = opdef.call_infer_shape(metas, attrs)
    except ShapeMismatch as e:
        raise fail(str(e)) from None
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise fail(f"{type(e).__name__}: {e}") from None
    for slot in opdef.outputs:
        if slot.name not in result:
            continue
        res = result[slot.name]
        res = res if isinstance(res, (list, tuple)) else [res]
        names = op.output(slot.name)
        if not names:
            continue  # a dispensable output left unbound: its meta is not needed
        if len(names) != len(res) and res:
            raise fail(f"output {slot.name!r}: infer_shape gave {len(res)} results for "
                       f"{len(names)} variables")
        for n, meta in zip(names, res):
            v = block._find_var_recursive(n)
            if v is None or meta is None:
                continue
            if v.type in _TENSOR_HOLDERS:
                if v.persistable and v.shape and list(v.shape) != list(meta.shape) \
                        and -1 not in v.shape and -1 not in meta.shape:
                    raise fail(f"output {slot.name!r} writes variable {n!r} of shape "
                               f"{list(v.shape)}: expected that shape, got {list(meta.shape)}")
                td = _tensor_desc(v.desc.type, create=True)
                del td.dims[:]
                td.dims.extend(meta.shape)
                td.data_type = dtypes.to_code(meta.dtype)
                if v.type in (VarType.LOD_TENSOR, VarType.LOD_TENSOR_ARRAY):
                    v.lod_level = meta.lod_level


# ==============================================================================================
class Program:
    """A program: a flat array of nested blocks; block 0 is the global block (seeds 002/004)."""

    def __init__(self):
        self._desc = pb.ProgramDesc()
        self.blocks: list[Block] = []
        self.current_block_idx = 0
        self.random_seed = 0
        self._version = 0
        self._flushed_version = -1
        self._current_role = registry.OP_ROLE_FORWARD
        self._current_role_vars: tuple = ()
        self._is_test = False
        self._add_block(-1)

    # -- versions --------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Bumped by every change; compile caches key on it."""
        return self._version

    def _bump(self) -> None:
        self._version += 1

    @property
    def desc(self) -> pb.ProgramDesc:
        """The ``ProgramDesc``, assembled from the blocks when the program changed."""
        if self._flushed_version != self._version:
            for b in self.blocks:
                b._sync_with_desc()
            self._flushed_version = self._version
        return self._desc

    # -- blocks ----------------------------------------------------------------------------------
    def _add_block(self, parent_idx: int) -> Block:
        desc = self._desc.blocks.add()
        desc.idx = len(self.blocks)
        desc.parent_idx = parent_idx
        b = Block(self, desc)
        self.blocks.append(b)
        self._bump()
        return b

    def global_block(self) -> Block:
        return self.blocks[0]

    def block(self, index: int) -> Block:
        if not 0 <= index < len(self.blocks):
            raise ProgramError(f"block index {index} out of range: the program has "
                               f"{len(self.blocks)} blocks")
        return self.blocks[index]

    def current_block(self) -> Block:
        return self.blocks[self.current_block_idx]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def _create_block(self, parent_idx: int | None = None) -> Block:
        parent = self.current_block_idx if parent_idx is None else parent_idx
        b = self._add_block(parent)
        self.current_block_idx = b.idx
        return b

    def _rollback(self) -> None:
        self.current_block_idx = self.current_block().parent_idx

    @contextlib.contextmanager
    def _op_role_guard(self, role: int, role_vars: Iterable[str] = ()):
        old = self._current_role, self._current_role_vars
        self._current_role, self._current_role_vars = role, tuple(role_vars)
        try:
            yield
        finally:
            self._current_role, self._current_role_vars = old

    # -- queries ---------------------------------------------------------------------------------
    def list_vars(self) -> Iterator[Variable]:
        for b in self.blocks:
            yield from b.vars.values()

    def all_parameters(self) -> list:
        return self.global_block().all_parameters()

    # -- serialisation -----------------------------------------------------------------------------
    def serialize_to_string(self) -> bytes:
        return self.desc.SerializeToString()

    @staticmethod
    def parse_from_string(binary: bytes) -> "Program":
        desc = pb.ProgramDesc()
        try:
            desc.ParseFromString(binary)
        except Exception as e:  # protobuf's DecodeError and friends
            raise ProgramError(f"cannot parse a ProgramDesc from {len(binary)} bytes: {e}") \
                from None
        return Program._from_desc(desc)

    @staticmethod
    def _from_desc(desc: pb.ProgramDesc) -> "Program":
        p = Program.__new__(Program)
        p._desc = desc
        p.blocks, p.current_block_idx, p.random_seed = [], 0, 0
        p._version, p._flushed_version = 0, -1
        p._current_role, p._current_role_vars, p._is_test = registry.OP_ROLE_FORWARD, (), False
        if not desc.blocks:
            raise ProgramError("a ProgramDesc needs at least one block (the global block)")
        for i, bd in enumerate(desc.blocks):
            if bd.idx != i:
                raise ProgramError(f"block at position {i} says idx={bd.idx}")
            if bd.parent_idx >= i or (i > 0 and bd.parent_idx < 0):
                raise ProgramError(f"block {i} has parent_idx {bd.parent_idx}: a parent must "
                                   f"come before its child")
            b = Block(p, bd)
            for vd in bd.vars:
                own = pb.VarDesc()
                own.CopyFrom(vd)
                cls = Parameter if own.is_parameter else Variable
                b.vars[own.name] = cls(b, own)
            for od in bd.ops:
                own = pb.OpDesc()
                own.CopyFrom(od)
                b.ops.append(Operator(b, own))
            p.blocks.append(b)
        for b in p.blocks:
            for op in b.ops:
                for n in op.output_arg_names:
                    v = b._find_var_recursive(n)
                    if v is not None:
                        v.op = op
        p._flushed_version = p._version  # desc already matches
        return p

    def clone(self, for_test: bool = False) -> "Program":
        """A deep copy. ``for_test=True`` also drops backward/optimizer ops and sets ``is_test``."""
        p = Program._from_desc(pb.ProgramDesc.FromString(self.serialize_to_string()))
        p.random_seed = self.random_seed
        p._is_test = for_test or self._is_test
        for b_old, b_new in zip(self.blocks, p.blocks):
            for name, v in b_old.vars.items():
                if isinstance(v, Parameter):
                    nv = b_new.vars[name]
                    if not isinstance(nv, Parameter):
                        nv.__class__ = Parameter
                    nv.trainable, nv.optimize_attr = v.trainable, v.optimize_attr
                    nv.regularizer, nv.gradient_clip_attr = v.regularizer, v.gradient_clip_attr
                    nv.do_model_average, nv.initializer = v.do_model_average, v.initializer
        if for_test:
            drop = registry.OP_ROLE_BACKWARD | registry.OP_ROLE_OPTIMIZE | registry.OP_ROLE_LRSCHED
            for b in p.blocks:
                b.ops = [op for op in b.ops if not int(op._attrs.get("op_role", 0)) & drop]
                for op in b.ops:
                    if op.has_attr("is_test"):
                        op._set_attr("is_test", True)
            p._bump()
        return p

    # -- printing --------------------------------------------------------------------------------
    def to_string(self, throw_on_error: bool = False, with_details: bool = False) -> str:
        """The program as protobuf text, the way seed 004 shows it.

        ``throw_on_error`` checks that every required field is set; ``with_details`` adds
        Python-side details of parameters (trainable, optimize_attr, regularizer).
        """
        desc = self.desc
        if throw_on_error and not desc.IsInitialized():
            raise ProgramError("the program is missing required fields: "
                               f"{desc.FindInitializationErrors()}")
        text = text_format.MessageToString(desc)
        if with_details:
            details = [f"{p.name}: trainable={p.trainable} optimize_attr={p.optimize_attr} "
                       f"regularizer={p.regularizer}" for p in self.all_parameters()]
            if details:
                text += "# parameters\n" + "".join(f"# {d}\n" for d in details)
        return text

    def __str__(self) -> str:
        """A readable listing: blocks, their variables and their ops."""
        lines = []
        for b in self.blocks:
            lines.append(f"{{ // block {b.idx} (parent {b.parent_idx})")
            lines += [f"    {v!r}" for v in b.vars.values()]
            lines.append("")
            lines += [f"    {op!r}" for op in b.ops]
            lines.append("}")
        return "\n".join(lines)

    __repr__ = __str__


# ==============================================================================================
_main_program = Program()
_startup_program = Program()


def default_main_program() -> Program:
    return _main_program


def default_startup_program() -> Program:
    return _startup_program


def switch_main_program(program: Program) -> Program:
    global _main_program
    old, _main_program = _main_program, program
    return old


def switch_startup_program(program: Program) -> Program:
    global _startup_program
    old, _startup_program = _startup_program, program
    return old


@contextlib.contextmanager
def program_guard(main_program: Program, startup_program: Program | None = None):
    """Within the guard, layers append to ``main_program`` (and ``startup_program``)."""
    if not isinstance(main_program, Program):
        raise TypeError(f"program_guard: main_program must be a Program, got "
                        f"{type(main_program).__name__}")
    if startup_program is not None and not isinstance(startup_program, Program):
        raise TypeError(f"program_guard: startup_program must be a Program, got "
                        f"{type(startup_program).__name__}")
    old_main = switch_main_program(main_program)
    old_startup = switch_startup_program(startup_program) if startup_program is not None else None
    try:
        yield
    finally:
        switch_main_program(old_main)
        if old_startup is not None:
            switch_startup_program(old_startup)
