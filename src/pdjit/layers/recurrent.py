"""Fluid 1.x's recurrent blocks: ``StaticRNN`` (time-major dense input) and ``DynamicRNN`` (over
the sequences of a LoD tensor).

Both build a ``while`` op whose body is the step block the user writes, so they are
differentiable through the while's step scopes (``while_grad``) and their step blocks compile
like any sub-block:

- ``StaticRNN`` keeps a step counter ``i``; ``step_input(x)`` reads row ``i`` of ``x``
  (``gather`` + ``squeeze2``), a memory is a variable of the enclosing block carried through the
  loop (its update is an ``assign`` at the end of the step), ``step_output(o)`` writes ``o``
  into a tensor array that is stacked into ``[T, ...]`` after the loop.
- ``DynamicRNN`` is built as Fluid 1.8 builds it, with its ops and slots: ``lod_rank_table``
  (the sequences sorted by length, longest first), ``max_sequence_len``,
  ``lod_tensor_to_array`` (step ``t`` holds the ``t``-th row of every sequence longer than
  ``t``), ``shrink_rnn_memory`` (a memory cut to the sequences still running),
  ``reorder_lod_tensor_by_rank`` (static inputs and initial memories in rank order) and
  ``array_to_lod_tensor`` (the step outputs back into the input's sequences and order).
"""
from __future__ import annotations

import contextlib

from pdjit.framework import unique_name
from pdjit.layers import control_flow as cf
from pdjit.layers.image import shape as _shape
from pdjit.layers.layer_helper import LayerHelper, check_variable
from pdjit.layers.math_ops import less_than
from pdjit.layers.shape_ops import gather, squeeze
from pdjit.layers.shape_ops import slice as _slice
from pdjit.layers.tensor import assign, cast, fill_constant, fill_constant_batch_size_like
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType

__all__ = ["StaticRNN"]


@contextlib.contextmanager
def _building_in(block):
    """Layers called inside append to ``block`` (an enclosing block of the current one)."""
    program = block.program
    keep = program.current_block_idx
    program.current_block_idx = block.idx
    try:
        yield
    finally:
        program.current_block_idx = keep


class _Memory:
    def __init__(self, pre, init):
        self.pre, self.init, self.new = pre, init, None


# ---- StaticRNN ----------------------------------------------------------------------------------
class StaticRNN:
    """Fluid 1.x's ``StaticRNN`` over time-major inputs ``[T, batch, ...]``::

        rnn = fluid.layers.StaticRNN()
        with rnn.step():
            x_t = rnn.step_input(x)                       # [batch, ...], step t of x
            h_pre = rnn.memory(init=h0)                   # or memory(shape=[-1, H], batch_ref=x)
            h = fluid.layers.fc([x_t, h_pre], H, act="tanh")
            rnn.update_memory(h_pre, h)
            rnn.step_output(h)
        out = rnn()                                       # [T, batch, H]

    Every ``step_input`` must have the same ``T`` (dim 0); each memory must be updated once.
    """

    BEFORE_RNN_BLOCK, IN_RNN_BLOCK, AFTER_RNN_BLOCK = 0, 1, 2

    def __init__(self, name=None):
        self.helper = LayerHelper("static_rnn", name=name)
        self.status = StaticRNN.BEFORE_RNN_BLOCK
        self.seq_len = None          # the static T, when known
        self._limit = None           # int64[1] T, a variable of the enclosing block
        self._inputs: dict = {}      # step variable name -> outer variable
        self._memories: dict = {}    # pre-memory name -> _Memory
        self._arrays: list = []      # the step outputs' tensor arrays
        self.outputs: list = []

    # -- the block ----
    def step(self):
        return _StaticRNNGuard(self)

    def _assert_in_block(self, method: str) -> None:
        if self.status != StaticRNN.IN_RNN_BLOCK:
            raise ValueError(f"StaticRNN.{method}: call it inside 'with rnn.step():'")

    def _parent(self):
        return self.helper.main_program.block(self._loop_block.parent_idx)

    def _enter(self):
        if self.status != StaticRNN.BEFORE_RNN_BLOCK:
            raise ValueError("StaticRNN.step(): a StaticRNN has one step block")
        self._i = fill_constant([1], "int64", 0)
        self._cond = self.helper.main_program.current_block().create_var(
            name=unique_name.generate(f"{self.helper.name}.cond"), dtype="bool", shape=[1])
        self._while = cf.While(self._cond)
        self._guard = self._while.block()
        self._loop_block = self._guard.__enter__()
        self.status = StaticRNN.IN_RNN_BLOCK

    def _exit(self, exc_type, exc_val, exc_tb):
        if exc_type is not None:
            self.status = StaticRNN.AFTER_RNN_BLOCK
            return self._guard.__exit__(exc_type, exc_val, exc_tb)
        if self._limit is None:
            raise ValueError("StaticRNN: the step block called no step_input(); the number of "
                             "steps comes from the step inputs")
        news = []
        pres = set(self._memories)
        for m in self._memories.values():
            if m.new is None:
                raise ValueError(f"StaticRNN: memory {m.pre.name!r} (initialised from "
                                 f"{m.init.name!r}) is never updated: call "
                                 f"update_memory(mem, new_value) in the step block")
            # a new value that is itself a memory is copied first (swaps stay correct)
            news.append(assign(m.new) if m.new.name in pres else m.new)
        for m, new in zip(self._memories.values(), news):
            assign(new, m.pre)
        cf.increment(self._i, in_place=True)
        less_than(self._i, self._limit, cond=self._cond)
        self.status = StaticRNN.AFTER_RNN_BLOCK
        self._guard.__exit__(None, None, None)
        for arr, o in self._arrays:
            out, _ = cf.tensor_array_to_tensor(arr, axis=0, use_stack=True)
            out.shape = [self.seq_len or -1] + list(o.shape)
            self.outputs.append(out)
        return False

    # -- the step ----
    def step_input(self, x):
        """Step ``t`` of ``x`` (``x[t]``: ``x`` is ``[T, batch, ...]``)."""
        self._assert_in_block("step_input")
        check_variable(x, "x", "StaticRNN.step_input")
        if len(x.shape) < 1:
            raise ValueError(f"StaticRNN.step_input: x must be [seq_len, ...], got shape "
                             f"{list(x.shape)} ({x.name!r})")
        t = int(x.shape[0])
        if self._limit is None:
            self.seq_len = t if t > 0 else None
            with _building_in(self._parent()):
                if t > 0:
                    self._limit = fill_constant([1], "int64", t)
                else:
                    dims = _shape(x)
                    self._limit = cast(_slice(dims, axes=[0], starts=[0], ends=[1]), "int64")
                less_than(self._i, self._limit, cond=self._cond)
        elif t > 0 and self.seq_len is not None and t != self.seq_len:
            raise ValueError(f"StaticRNN.step_input: every step input must have the same "
                             f"seq_len (dim 0): {x.name!r} has {t}, an earlier one "
                             f"{self.seq_len}")
        row = squeeze(gather(x, self._i), axes=[0])
        self._inputs[row.name] = x
        return row

    def memory(self, init=None, shape=None, batch_ref=None, init_value=0.0,
               init_batch_dim_idx=0, ref_batch_dim_idx=1):
        """A state carried from step to step: ``init`` at the first step, else the value given
        to ``update_memory`` at the step before. Without ``init``, a ``shape`` tensor (its
        ``init_batch_dim_idx`` dim taken from ``batch_ref``'s ``ref_batch_dim_idx`` dim) full of
        ``init_value``."""
        self._assert_in_block("memory")
        parent = self._parent()
        if init is None:
            if shape is None or batch_ref is None:
                raise ValueError("StaticRNN.memory: without init, give shape and batch_ref")
            check_variable(batch_ref, "batch_ref", "StaticRNN.memory")
            ref = self._inputs.get(batch_ref.name, batch_ref)  # a step input: its sequence
            with _building_in(parent):
                init = fill_constant_batch_size_like(
                    ref, shape=list(shape), dtype=ref.dtype, value=init_value,
                    input_dim_idx=ref_batch_dim_idx, output_dim_idx=init_batch_dim_idx)
        else:
            check_variable(init, "init", "StaticRNN.memory")
        pre = parent.create_var(name=unique_name.generate(f"{self.helper.name}.mem"),
                                dtype=init.dtype, shape=list(init.shape), stop_gradient=False)
        with _building_in(parent):
            assign(init, pre)
        self._memories[pre.name] = _Memory(pre, init)
        return pre

    def update_memory(self, mem, var):
        """``mem`` takes the value ``var`` at the next step."""
        self._assert_in_block("update_memory")
        check_variable(mem, "mem", "StaticRNN.update_memory")
        check_variable(var, "var", "StaticRNN.update_memory")
        m = self._memories.get(mem.name)
        if m is None:
            raise ValueError(f"StaticRNN.update_memory: {mem.name!r} is not a memory of this "
                             f"StaticRNN (make it with rnn.memory())")
        if m.new is not None:
            raise ValueError(f"StaticRNN.update_memory: memory {mem.name!r} is updated twice")
        m.new = var

    def step_output(self, o):
        """Collect ``o`` of every step: ``rnn()`` returns them stacked, ``[T, ...]``."""
        self._assert_in_block("step_output")
        check_variable(o, "o", "StaticRNN.step_output")
        with _building_in(self._parent()):
            arr = cf.create_array(o.dtype)
        cf.array_write(o, self._i, array=arr)
        self._arrays.append((arr, o))

    def output(self, *outputs):
        for o in outputs:
            self.step_output(o)

    def __call__(self, *args, **kwargs):
        if self.status != StaticRNN.AFTER_RNN_BLOCK:
            raise ValueError("StaticRNN(): the outputs exist after the 'with rnn.step():' block")
        if not self.outputs:
            raise ValueError("StaticRNN(): the step block called no step_output()")
        return self.outputs[0] if len(self.outputs) == 1 else self.outputs


class _StaticRNNGuard:
    def __init__(self, rnn: StaticRNN):
        self.rnn = rnn

    def __enter__(self):
        self.rnn._enter()
        return self.rnn

    def __exit__(self, exc_type, exc_val, exc_tb):
        return self.rnn._exit(exc_type, exc_val, exc_tb)
