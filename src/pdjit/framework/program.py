"""Program: the compile-time description of a model, and the default programs.

Its parts live beside it: ``block.py`` (Block, where ops are built and checked), ``operator.py``
(Operator), ``variable.py`` (Variable, Parameter); they are importable from here too.

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
import hashlib
from typing import Iterable, Iterator

from google.protobuf import text_format

from pdjit.framework import limits, registry
from pdjit.framework.block import Block, infer_op_shape  # noqa: F401 (re-exported)
from pdjit.framework.errors import ProgramError, named_errors
from pdjit.framework.operator import Operator, location_from_callstack  # noqa: F401
from pdjit.framework.variable import Parameter, Variable  # noqa: F401
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType


# what a clone shares with its original: the readers (py_reader, non-iterable DataLoader) that
# pdjit.runtime.generator_loader attached, as a Fluid clone reads the same reader variable
_SHARED_WITH_CLONES = ("_py_readers",)


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

    def written_names(self) -> frozenset:
        """The names some op of the program writes (an output of an op of any block), found
        once per version."""
        if getattr(self, "_written_version", None) != self._version:
            self._written = frozenset(n for b in self.blocks for o in b.ops
                                      for n in o.output_arg_names)
            self._written_version = self._version
        return self._written

    def content_key(self) -> str:
        """A hash of what the program computes (its ``ProgramDesc`` and random seed), computed
        once per version."""
        if getattr(self, "_key_version", None) != (self._version, self.random_seed):
            h = hashlib.sha256(self.desc.SerializeToString(deterministic=True))
            h.update(str(self.random_seed).encode())
            self._content_key = h.hexdigest()
            self._key_version = (self._version, self.random_seed)
        return self._content_key

    def __getstate__(self):
        """Pickled and copied without what executors built for it (compiled plans)."""
        state = dict(self.__dict__)
        for k in ("_run_cache_dict", "_run_cache_key", "_run_cache_version", "_run_counts"):
            state.pop(k, None)
        return state

    def _run_cache(self) -> dict:
        """What executors built for this program (run bindings, compiled plans), valid for its
        current content; emptied when the content changes."""
        version = (self._version, self.random_seed)
        if getattr(self, "_run_cache_version", None) == version:
            return self._run_cache_dict  # the same version: O(1)
        key = self.content_key()
        if getattr(self, "_run_cache_key", None) != key:
            self._run_cache_key, self._run_cache_dict = key, {}
        self._run_cache_version = version
        return self._run_cache_dict

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
    @named_errors("Program.parse_from_string")
    def parse_from_string(binary: bytes) -> "Program":
        desc = pb.ProgramDesc()
        try:
            desc.ParseFromString(binary)
        except Exception as e:  # protobuf's DecodeError and friends
            raise ProgramError(f"cannot parse a ProgramDesc from {len(binary)} bytes: {e}") \
                from None
        if not desc.IsInitialized():
            missing = desc.FindInitializationErrors()
            raise ProgramError(f"cannot parse a ProgramDesc from {len(binary)} bytes: required "
                               f"field(s) missing: {', '.join(missing[:5])}"
                               f"{' ...' if len(missing) > 5 else ''}")
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
        max_blocks, max_depth = limits.bound(limits.MAX_BLOCKS), \
            limits.bound(limits.MAX_BLOCK_DEPTH)
        if len(desc.blocks) > max_blocks:
            raise limits.exceeded("program: blocks", len(desc.blocks), limits.MAX_BLOCKS,
                                  max_blocks)
        depth = []
        for i, bd in enumerate(desc.blocks):
            if bd.idx != i:
                raise ProgramError(f"block at position {i} says idx={bd.idx}")
            if bd.parent_idx >= i or (i > 0 and bd.parent_idx < 0):
                raise ProgramError(f"block {i} has parent_idx {bd.parent_idx}: a parent must "
                                   f"come before its child")
            depth.append(0 if i == 0 else depth[bd.parent_idx] + 1)
            if depth[-1] > max_depth:  # (before the walks below, which follow the nesting)
                raise limits.exceeded(f"block {i}: nesting depth (blocks between it and the "
                                      f"global block)", depth[-1], limits.MAX_BLOCK_DEPTH,
                                      max_depth)
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
        for key in _SHARED_WITH_CLONES:
            if key in self.__dict__:
                p.__dict__[key] = self.__dict__[key]
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
                    if op.has_attr(attr := registry.test_mode_of(op.type)):
                        op._set_attr(attr, True)
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

