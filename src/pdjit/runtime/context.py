"""What an op's reference sees of the run it is part of (when it declares a ``ctx`` argument).

``Env`` holds the values of one block run: reads fall back to the enclosing block's env and then
to the Scope; a write goes to the env of the block that declares the variable. Nothing reaches
the Scope until the whole run succeeded (the executor commits persistable values at the end), so
a failed run leaves the Scope as it was.
"""
from __future__ import annotations

from typing import Protocol

from pdjit.framework import random as prandom
from pdjit.framework.program import Block, Operator
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor

_MISSING = object()


class Env:
    """The values of one run of ``block``.

    ``saved`` is filled by the control-flow op that made this env for a sub-block run: the
    op's inputs as they were when the run started (see :class:`StepScopes`).
    """

    def __init__(self, scope: Scope, block: Block, parent: "Env | None" = None,
                 fetched_scopes: tuple = ()):
        self.scope, self.block, self.parent = scope, block, parent
        self.values: dict = {}
        self.saved: dict = {}
        # the iteration number of each loop this env runs in, outermost first (random keys
        # mix them in: pdjit.framework.random.op_key); a sub-block run inherits its parent's
        self.iterations: tuple = parent.iterations if parent is not None else ()
        # the step scopes the run fetches (the plans of their blocks keep every value of
        # every iteration)
        self.fetched_scopes = parent.fetched_scopes if parent is not None else fetched_scopes

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
        """An env for one run of sub-block ``block``: reads fall back to this env; writes of
        variables declared by an enclosing block go to that block's env; the sub-block's own
        variables live in the child and go away with it."""
        return Env(self.scope, block, self)

    def __repr__(self):
        return f"Env(block {self.block.idx}, {len(self.values)} values)"


class StepScopes(list):
    """The value of a ``STEP_SCOPES`` variable: the child :class:`Env` of each sub-block run of
    a control-flow op, in run order, kept for the backward pass.

    - ``conditional_block`` stores (output ``Scope``) a StepScopes holding the one env its
      sub-block ran in, or none when the condition did not hold.
    - ``while`` stores (output ``StepScopes``) one env per iteration, first to last, when
      ``is_test`` is false; when it is true nothing is kept (an empty StepScopes).

    Each env's ``values`` holds what the sub-block wrote to its own variables (those declared
    in the sub-block) during that run; writes to variables of enclosing blocks went to those
    blocks' envs. Each env's ``saved`` is ``{name: value}`` for every name of the op's inputs
    (``while``: ``X``; ``conditional_block``: ``Input``) as it was when that run started: a
    ``while`` overwrites loop-carried variables in the enclosing env as it goes, so the value an
    iteration read is found only here. ``saved`` values may be ``None`` (no value yet), and are
    never mutated by the runtime. ``env.parent`` is the env the op ran in.
    """

    __slots__ = ()

    def __repr__(self):
        return f"StepScopes({len(self)} env(s))"


class Runner(Protocol):
    """What plan steps and references ask of the one running them (the Executor): run one op
    with its NumPy reference, run a block (its compiled plan, or op by op), and whether a
    native step's fallback to the references is an error (``strict``). Steps and contexts
    receive a runner, never the Executor's internals."""

    strict: bool

    def run_op(self, op: Operator, op_idx: int, env: Env, run_index: int) -> None:
        """Run ``op`` (index ``op_idx`` of its block) with its reference on ``env``."""

    def run_block(self, block: Block, env: Env, run_index: int) -> None:
        """Run every op of ``block`` on ``env`` (a sub-block: its own compiled plan)."""


class RunContext:
    """Passed to references that take ``ctx``: the op, its env, randomness, LoD, sub-blocks."""

    def __init__(self, runner: Runner, env: Env, op: Operator, op_idx: int, run_index: int):
        self.runner, self.env, self.op = runner, env, op
        self.op_idx, self.run_index = op_idx, run_index
        self.in_lods: dict = {}
        self.out_lods: dict = {}

    @property
    def program(self):
        return self.op.block.program

    @property
    def iterations(self) -> tuple:
        """The iteration number of every loop the op runs in, outermost first."""
        return self.env.iterations

    def rng_key(self) -> int:
        """The op's random key: its fixed seed, else one of this run, this op and every
        enclosing loop's iteration (``pdjit.framework.random.op_key``)."""
        return prandom.op_key(prandom.fixed_seed(self.op), self.program.random_seed,
                              self.op.block.idx, self.op_idx, self.run_index,
                              self.env.iterations)

    def input_lod(self, slot: str, i: int = 0) -> list:
        lods = self.in_lods.get(slot) or []
        return lods[i] if i < len(lods) else []

    def set_output_lod(self, slot: str, lod, i: int = 0) -> None:
        self.out_lods.setdefault(slot, {})[i] = lod

    def new_step_scopes(self) -> StepScopes:
        return StepScopes()

    @staticmethod
    def with_lod(array, lod) -> LoDTensor:
        """``array`` with LoD offsets ``lod`` (a runtime LoD tensor value)."""
        return LoDTensor(array, lod)

    def run_block(self, block_idx: int, env: Env, iteration: int | None = None) -> None:
        """Run a sub-block in ``env`` (made with ``self.env.child(block)``): the one entry point
        control-flow references use to run a sub-block. A loop passes ``iteration`` (0 for its
        first run of the body, then 1, ...): random ops in the block, and in blocks it runs,
        then draw other numbers in every iteration."""
        if iteration is not None:
            env.iterations = self.env.iterations + (int(iteration),)
        self.runner.run_block(self.program.block(block_idx), env, self.run_index)
