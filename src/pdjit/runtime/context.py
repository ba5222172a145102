"""What an op's reference sees of the run it is part of (when it declares a ``ctx`` argument).

``Env`` holds the values of one block run: reads fall back to the enclosing block's env and then
to the Scope; a write goes to the env of the block that declares the variable. Nothing reaches
the Scope until the whole run succeeded (the executor commits persistable values at the end), so
a failed run leaves the Scope as it was.
"""
from __future__ import annotations

from pdjit.framework import random as prandom
from pdjit.framework.program import Block, Operator
from pdjit.runtime.scope import Scope

_MISSING = object()


class Env:
    def __init__(self, scope: Scope, block: Block, parent: "Env | None" = None):
        self.scope, self.block, self.parent = scope, block, parent
        self.values: dict = {}

    def get(self, name: str, default=None):
        e = self
        while e is not None:
            v = e.values.get(name, _MISSING)
            if v is not _MISSING:
                return v
            e = e.parent
        sv = self.scope.find_var(name)
        return default if sv is None or sv.value is None else sv.value

    def set(self, name: str, value) -> None:
        e = self
        while not e.block.has_var(name) and e.parent is not None:
            e = e.parent
        (e if e.block.has_var(name) else self).values[name] = value

    def child(self, block: Block) -> "Env":
        return Env(self.scope, block, self)


class RunContext:
    """Passed to references that take ``ctx``: the op, its env, randomness, LoD, sub-blocks."""

    def __init__(self, executor, env: Env, op: Operator, op_idx: int, run_index: int):
        self.executor, self.env, self.op = executor, env, op
        self.op_idx, self.run_index = op_idx, run_index
        self.in_lods: dict = {}
        self.out_lods: dict = {}

    @property
    def program(self):
        return self.op.block.program

    def rng_key(self) -> int:
        seed = self.op.attr("seed") if self.op.has_attr("seed") else 0
        if self.op.has_attr("fix_seed") and not self.op.attr("fix_seed"):
            seed = 0
        return prandom.op_key(seed, self.program.random_seed, self.op.block.idx, self.op_idx,
                              self.run_index)

    def input_lod(self, slot: str, i: int = 0) -> list:
        lods = self.in_lods.get(slot) or []
        return lods[i] if i < len(lods) else []

    def set_output_lod(self, slot: str, lod, i: int = 0) -> None:
        self.out_lods.setdefault(slot, {})[i] = lod

    def run_block(self, block_idx: int, env: Env) -> None:
        """Run a sub-block in ``env`` (made with ``self.env.child(block)``)."""
        self.executor._run_block(self.program.block(block_idx), env, self.run_index)
