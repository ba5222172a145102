"""Operator: a view of one ``OpDesc``, and where the user created it.

The slot and attribute maps are cached Python dicts; every change goes through the methods
here, which update the message and the cache together and bump the program's version.
"""
from __future__ import annotations

import os
import re
import sys
import traceback
from typing import TYPE_CHECKING

from google.protobuf import text_format

from pdjit.framework import attrs as attrs_mod
from pdjit.framework import registry
from pdjit.framework.errors import (
    ProgramError,
    describe_op,
)
from pdjit.proto import framework_pb2 as pb

if TYPE_CHECKING:
    from pdjit.framework.block import Block

VarType = pb.VarType
_BLOCK, _BLOCKS = int(pb.AttrType.BLOCK), int(pb.AttrType.BLOCKS)
_PDJIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>[^\n]+)')


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

    def sub_block_indices(self) -> list:
        """The indices of the blocks this op owns (its BLOCK and BLOCKS attributes)."""
        out = []
        for a in self.desc.attrs:
            t = a.type
            if t == _BLOCK:
                out.append(int(a.block_idx))
            elif t == _BLOCKS:
                out.extend(int(i) for i in a.blocks_idx)
        return out

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
        if type(entry) is not str:
            continue  # (bytes: a program file whose text is not UTF-8)
        m = _FRAME_RE.search(entry)
        if m and not os.path.abspath(m.group("file")).startswith(_PDJIT_DIR):
            return f"{m.group('file')}:{m.group('line')}"
    return None


_OWN_FILE: dict = {}  # an absolute file name -> whether it is pdjit's own


def _is_own(filename: str) -> bool:
    own = _OWN_FILE.get(filename)
    if own is None:
        own = os.path.abspath(filename).startswith(_PDJIT_DIR)
        if os.path.isabs(filename):  # (a relative name depends on the working directory)
            _OWN_FILE[filename] = own
    return own


def _user_callstack() -> list:
    """The current Python stack, without pdjit's own frames, as Paddle's ``op_callstack``:
    the innermost 12 of them (only their lines are read: the cost does not grow with the
    stack's depth)."""
    frame, picked = sys._getframe(1), []
    while frame is not None and len(picked) < 12:
        code = frame.f_code
        if not _is_own(code.co_filename):
            picked.append(traceback.FrameSummary(code.co_filename, frame.f_lineno,
                                                 code.co_name))
        frame = frame.f_back
    picked.reverse()
    return traceback.format_list(picked)

