"""Block: local variables and a sequence of ops, with a parent block (seed 002).

``append_op`` is where an op is built from its definition: slots and attributes checked, the
user's call stack and ``op_role`` recorded, output shapes and dtypes inferred (``-1`` for dims
unknown until run time). A bad op is refused with an :class:`OpShapeError` and leaves the block
as it was.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from pdjit.framework import attrs as attrs_mod
from pdjit.framework import dtypes, name_scope, registry, unique_name
from pdjit.framework.errors import (
    OpShapeError,
    ProgramError,
    ShapeMismatch,
    UnregisteredOpError,
    describe_op,
)
from pdjit.framework.operator import (
    Operator,
    _declared_attr_type,
    _user_callstack,
    location_from_callstack,
)
from pdjit.framework.variable import _TENSOR_HOLDERS, Parameter, Variable, _tensor_desc
from pdjit.proto import framework_pb2 as pb

if TYPE_CHECKING:
    from pdjit.framework.program import Program

VarType = pb.VarType


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
        scope = name_scope.current()
        if scope is not None:  # inside fluid.name_scope(...): the op carries its scope's name
            values.setdefault("op_namescope", scope)
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

