"""Fluid 1.x's recurrent blocks: ``StaticRNN`` (time-major dense input) and ``DynamicRNN`` (over
the sequences of a LoD tensor), built as Fluid 1.8 builds them so their programs are Fluid's:

- ``StaticRNN`` appends a ``recurrent`` op (``pdjit.ops.recurrent``): its step block reads each
  step input under the outer variable's name, each memory's previous value from its
  ex-state, and hands each new value on through ``rnn_memory_helper``; the step outputs are
  stacked into ``[T, ...]``. Differentiable through ``recurrent_grad``.
- ``DynamicRNN`` builds a ``while`` over the steps of the longest sequence with Fluid 1.8's ops:
  ``lod_rank_table`` (the sequences sorted by length, longest first), ``max_sequence_len``,
  ``lod_tensor_to_array`` (step ``t`` holds the ``t``-th row of every sequence longer than
  ``t``), ``shrink_rnn_memory`` (a memory cut to the sequences still running),
  ``reorder_lod_tensor_by_rank`` (static inputs and initial memories in rank order) and
  ``array_to_lod_tensor`` (the step outputs back into the input's sequences and order).
  Differentiable through ``while_grad``.

The step blocks compile like any sub-block; the ops moving rows between them run on the host.
"""
from __future__ import annotations

import contextlib

from pdjit.framework import dtypes, unique_name
from pdjit.layers import control_flow as cf
from pdjit.layers.layer_helper import LayerHelper, check_variable
from pdjit.layers.math_ops import less_than
from pdjit.layers.tensor import fill_constant, fill_constant_batch_size_like
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType

__all__ = ["StaticRNN", "DynamicRNN", "lod_rank_table", "max_sequence_len", "lod_tensor_to_array",
           "array_to_lod_tensor", "shrink_memory", "reorder_lod_tensor_by_rank"]


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
            h_pre = rnn.memory(init=h0)                   # or memory(shape=[-1, H], batch_ref=x_t)
            h = fluid.layers.fc([x_t, h_pre], H, act="tanh")
            rnn.update_memory(h_pre, h)
            rnn.step_output(h)
        out = rnn()                                       # [T, batch, H]

    Built as Fluid 1.8 builds it, a ``recurrent`` op (``pdjit.ops.recurrent``) whose step
    block sees each step input under the outer variable's name, reads each memory's previous
    value from its ``ex_state`` and hands the new one on through ``rnn_memory_helper``; the
    step outputs are stacked into ``[T, ...]``. Every ``step_input`` must have the same ``T``
    (dim 0); each memory must be updated once.
    """

    BEFORE_RNN_BLOCK, IN_RNN_BLOCK, AFTER_RNN_BLOCK = 0, 1, 2

    def __init__(self, name=None):
        self.helper = LayerHelper("static_rnn", name=name)
        self.status = StaticRNN.BEFORE_RNN_BLOCK
        self.seq_len = None          # T (dim 0 of the step inputs), -1 when known at run time
        self.inputs: list = []       # the step block's input variables (outer names)
        self.memories: dict = {}     # pre-memory name -> _Memory
        self.outputs: list = []      # the stacked outputs (variables of the enclosing block)
        # run the steps last to first (layers.rnn's is_reverse); outputs stay in time order
        self._reverse = False

    # -- the block ----
    def step(self):
        return _StaticRNNGuard(self)

    def _assert_in_block(self, method: str) -> None:
        if self.status != StaticRNN.IN_RNN_BLOCK:
            raise ValueError(f"StaticRNN.{method}: call it inside 'with rnn.step():'")

    def _parent(self):
        program = self.helper.main_program
        return program.block(self._block.parent_idx)

    def _enter(self):
        if self.status != StaticRNN.BEFORE_RNN_BLOCK:
            raise ValueError("StaticRNN.step(): a StaticRNN has one step block")
        self._block = self.helper.main_program._create_block()
        self.status = StaticRNN.IN_RNN_BLOCK

    def _exit(self, exc_type, exc_val, exc_tb):
        program = self.helper.main_program
        try:
            if exc_type is None:
                self._complete_op()
        finally:
            self.status = StaticRNN.AFTER_RNN_BLOCK
            program._rollback()
        return False

    def _complete_op(self):
        block, parent = self._block, self._parent()
        if not self.inputs:
            raise ValueError("StaticRNN: the step block called no step_input(); the number of "
                             "steps comes from the step inputs")
        local = {n for op in block.ops for n in op.output_arg_names}
        local.update(v.name for v in self.inputs)
        local.update(self.memories)
        params: dict = {}
        for op in block.ops:
            for n in op.input_arg_names:
                if n not in local and parent._find_var_recursive(n) is not None:
                    params[n] = None
        boot, pre, states = [], [], []
        for m in self.memories.values():
            if m.new is None:
                raise ValueError(f"StaticRNN: memory {m.pre.name!r} (initialised from "
                                 f"{m.init.name!r}) is never updated: call "
                                 f"update_memory(mem, new_value) in the step block")
            new = block.create_var(name=unique_name.generate(f"{self.helper.name}.state"),
                                   dtype=m.new.dtype, shape=list(m.new.shape))
            block.append_op("rnn_memory_helper", inputs={"X": [m.new]}, outputs={"Out": [new]},
                            attrs={"dtype": _dtype_code(m.new)})
            boot.append(m.init)
            pre.append(m.pre.name)
            states.append(new.name)
        scopes = parent.create_var(name=unique_name.generate(f"{self.helper.name}.step_scopes"),
                                   type=VarType.STEP_SCOPES)
        parent.append_op(
            "recurrent",
            inputs={"inputs": [parent._var_recursive(v.name) for v in self.inputs],
                    "initial_states": boot, "parameters": list(params)},
            outputs={"outputs": self.outputs, "step_scopes": [scopes]},
            attrs={"has_states": bool(pre), "ex_states": pre, "states": states,
                   "sub_block": block.idx, "reverse": self._reverse, "is_train": True})

    # -- the step ----
    def step_input(self, x):
        """Step ``t`` of ``x`` (``x[t]``: ``x`` is ``[T, batch, ...]``), a variable of the step
        block named as ``x``."""
        self._assert_in_block("step_input")
        check_variable(x, "x", "StaticRNN.step_input")
        if len(x.shape) < 1:
            raise ValueError(f"StaticRNN.step_input: x must be [seq_len, ...], got shape "
                             f"{list(x.shape)} ({x.name!r})")
        if x.block.idx != self._block.parent_idx and \
                self._parent()._find_var_recursive(x.name) is None:
            raise ValueError(f"StaticRNN.step_input: x ({x.name!r}) must be a variable of the "
                             f"block around the step block")
        t = int(x.shape[0])
        if self.seq_len is None:
            self.seq_len = t
        elif t != self.seq_len and t >= 0 and self.seq_len >= 0:
            raise ValueError(f"StaticRNN.step_input: every step input must have the same "
                             f"seq_len (dim 0): {x.name!r} has {t}, an earlier one "
                             f"{self.seq_len}")
        ipt = self._block.create_var(name=x.name, dtype=x.dtype, shape=list(x.shape[1:]),
                                     type=x.type)
        self.inputs.append(ipt)
        return ipt

    def memory(self, init=None, shape=None, batch_ref=None, init_value=0.0,
               init_batch_dim_idx=0, ref_batch_dim_idx=1):
        """A state carried from step to step: ``init`` at the first step, else the value given
        to ``update_memory`` at the step before. Without ``init``, a ``shape`` tensor (its
        ``init_batch_dim_idx`` dim taken from ``batch_ref``'s ``ref_batch_dim_idx`` dim) full of
        ``init_value``; a step input as ``batch_ref`` stands for its whole sequence, as in
        Fluid."""
        self._assert_in_block("memory")
        parent = self._parent()
        if init is None:
            if shape is None or batch_ref is None:
                raise ValueError("StaticRNN.memory: without init, give shape and batch_ref")
            check_variable(batch_ref, "batch_ref", "StaticRNN.memory")
            ref = parent._find_var_recursive(batch_ref.name)
            if ref is None:
                raise ValueError(f"StaticRNN.memory: batch_ref ({batch_ref.name!r}) must be a "
                                 f"step input or a variable of the block around the step block")
            with _building_in(parent):
                init = fill_constant_batch_size_like(
                    ref, shape=list(shape), dtype=ref.dtype, value=init_value,
                    input_dim_idx=ref_batch_dim_idx, output_dim_idx=init_batch_dim_idx)
        else:
            check_variable(init, "init", "StaticRNN.memory")
        pre = self._block.create_var(name=unique_name.generate(f"{self.helper.name}@mem"),
                                     dtype=init.dtype, shape=list(init.shape))
        self.memories[pre.name] = _Memory(pre, init)
        return pre

    def update_memory(self, mem, var):
        """``mem`` takes the value ``var`` at the next step."""
        self._assert_in_block("update_memory")
        check_variable(mem, "mem", "StaticRNN.update_memory")
        check_variable(var, "var", "StaticRNN.update_memory")
        m = self.memories.get(mem.name)
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
        tmp = self._block.create_var(name=unique_name.generate(f"{self.helper.name}.out"),
                                     dtype=o.dtype, shape=list(o.shape))
        self._block.append_op("rnn_memory_helper", inputs={"X": [o]}, outputs={"Out": [tmp]},
                              attrs={"dtype": _dtype_code(o)})
        out = self._parent().create_var(name=tmp.name, dtype=o.dtype,
                                        shape=[self.seq_len if self.seq_len is not None
                                               else -1] + list(o.shape))
        self.outputs.append(out)

    def output(self, *outputs):
        for o in outputs:
            self.step_output(o)

    def __call__(self, *args, **kwargs):
        if self.status != StaticRNN.AFTER_RNN_BLOCK:
            raise ValueError("StaticRNN(): the outputs exist after the 'with rnn.step():' block")
        if not self.outputs:
            raise ValueError("StaticRNN(): the step block called no step_output()")
        return self.outputs[0] if len(self.outputs) == 1 else self.outputs


def _dtype_code(var) -> int:
    return dtypes.to_code(var.dtype)


class _StaticRNNGuard:
    def __init__(self, rnn: StaticRNN):
        self.rnn = rnn

    def __enter__(self):
        self.rnn._enter()
        return self.rnn

    def __exit__(self, exc_type, exc_val, exc_tb):
        return self.rnn._exit(exc_type, exc_val, exc_tb)


# ---- DynamicRNN ---------------------------------------------------------------------------------
class DynamicRNN:
    """Fluid 1.x's ``DynamicRNN``: a step block run over the sequences of a LoD tensor::

        drnn = fluid.layers.DynamicRNN()
        with drnn.block():
            word = drnn.step_input(sentence)          # one row per sequence still running
            enc = drnn.static_input(encoder_out)      # the same rows of a per-sequence input
            prev = drnn.memory(shape=[H], value=0.0)  # or memory(init=h0, need_reorder=True)
            h = fluid.layers.fc([word, prev], H, act="tanh")
            drnn.update_memory(prev, h)
            drnn.output(h)
        out = drnn()                                  # a LoD tensor with sentence's LoD

    At step ``t`` the block sees the ``t``-th row of every sequence longer than ``t``, the
    sequences ranked longest first (``lod_rank_table``); memories shrink as sequences end.
    The ops are Fluid 1.8's (see ``pdjit.ops.lod_array``) in a ``while``.
    """

    BEFORE_RNN, IN_RNN, AFTER_RNN = 0, 1, 2

    def __init__(self, name=None):
        self.helper = LayerHelper("dynamic_rnn", name=name)
        self.status = DynamicRNN.BEFORE_RNN
        self.lod_rank_table = None
        self.max_seq_len = None
        self.step_idx = None
        self.zero_idx = None
        self.mem_dict: dict = {}
        self.output_array: list = []
        self.outputs: list = []
        self.cond = self.helper.main_program.current_block().create_var(
            name=unique_name.generate(f"{self.helper.name}.cond"), dtype="bool", shape=[1],
            stop_gradient=True)
        self.while_op = cf.While(self.cond)
        self.input_array: list = []
        self.mem_link: list = []

    def _parent(self):
        program = self.helper.main_program
        return program.block(program.current_block().parent_idx)

    def _assert_in_rnn_block(self, method: str) -> None:
        if self.status != DynamicRNN.IN_RNN:
            raise ValueError(f"DynamicRNN.{method}: call it inside 'with drnn.block():'")

    @contextlib.contextmanager
    def block(self):
        """The step block: ``with drnn.block(): ...`` (once per DynamicRNN)."""
        if self.status != DynamicRNN.BEFORE_RNN:
            raise ValueError("DynamicRNN.block(): a DynamicRNN has one step block")
        self.step_idx = fill_constant([1], "int64", 0, force_cpu=True)
        self.status = DynamicRNN.IN_RNN
        with self.while_op.block():
            yield
            if self.lod_rank_table is None:
                raise ValueError("DynamicRNN: the step block called no step_input(); the steps "
                                 "come from the sequences of the step inputs")
            # as Fluid 1.8: the counter moves on, the memories' next values go to that step
            cf.increment(self.step_idx, 1.0, in_place=True)
            for new_mem, mem_array in self.mem_link:
                cf.array_write(new_mem, self.step_idx, array=mem_array)
            less_than(self.step_idx, self.max_seq_len, force_cpu=True, cond=self.cond)
        self.status = DynamicRNN.AFTER_RNN
        for arr in self.output_array:
            self.outputs.append(_array_to_lod_tensor(arr, self.lod_rank_table))

    def step_input(self, x, level: int = 0):
        """The rows of ``x``'s sequences (LoD level ``level``) at the current step."""
        self._assert_in_rnn_block("step_input")
        check_variable(x, "x", "DynamicRNN.step_input")
        if x.lod_level < 1:
            raise ValueError(f"DynamicRNN.step_input: x must be a LoD tensor (lod_level >= 1), "
                             f"got {x.name!r} with lod_level {x.lod_level}")
        parent = self._parent()
        if self.lod_rank_table is None:
            self.lod_rank_table = parent.create_var(
                name=unique_name.generate("lod_rank_table"), type=VarType.LOD_RANK_TABLE,
                stop_gradient=True)
            parent.append_op("lod_rank_table", inputs={"X": [x]},
                             outputs={"Out": [self.lod_rank_table]}, attrs={"level": level})
            self.max_seq_len = parent.create_var(
                name=unique_name.generate("dynamic_rnn_max_seq_len"), dtype="int64",
                shape=[1], stop_gradient=True)
            parent.append_op("max_sequence_len", inputs={"RankTable": [self.lod_rank_table]},
                             outputs={"Out": [self.max_seq_len]})
            with _building_in(parent):
                less_than(self.step_idx, self.max_seq_len, force_cpu=True, cond=self.cond)
        input_array = parent.create_var(
            name=unique_name.generate("dynamic_rnn_input_array"),
            type=VarType.LOD_TENSOR_ARRAY, dtype=x.dtype)
        self.input_array.append((input_array, x.dtype))
        parent.append_op("lod_tensor_to_array",
                         inputs={"X": [x], "RankTable": [self.lod_rank_table]},
                         outputs={"Out": [input_array]})
        return cf.array_read(input_array, self.step_idx)

    def static_input(self, x):
        """``x`` (one row, or one sequence, per sequence of the step input) cut to the
        sequences still running at the current step."""
        self._assert_in_rnn_block("static_input")
        check_variable(x, "x", "DynamicRNN.static_input")
        if self.lod_rank_table is None:
            raise RuntimeError("DynamicRNN.static_input: call step_input() before it")
        parent = self._parent()
        reordered = parent.create_var(
            name=unique_name.generate("dynamic_rnn_static_input_reordered"),
            type=VarType.LOD_TENSOR, dtype=x.dtype, shape=list(x.shape),
            lod_level=x.lod_level)
        parent.append_op("reorder_lod_tensor_by_rank",
                         inputs={"X": [x], "RankTable": [self.lod_rank_table]},
                         outputs={"Out": [reordered]})
        return shrink_memory(reordered, self.step_idx, self.lod_rank_table)

    def memory(self, init=None, shape=None, value=0.0, need_reorder=False, dtype="float32"):
        """A state carried from step to step, cut to the running sequences at each step:
        ``init`` (one row per sequence; in rank order unless ``need_reorder``) or, without it,
        ``shape`` (without the batch dim) full of ``value``."""
        self._assert_in_rnn_block("memory")
        parent = self._parent()
        if self.zero_idx is None:
            with _building_in(parent):
                self.zero_idx = fill_constant([1], "int64", 0, force_cpu=True)
        if init is not None:
            check_variable(init, "init", "DynamicRNN.memory")
            init_tensor = init
            if need_reorder:
                if self.lod_rank_table is None:
                    raise ValueError("DynamicRNN.memory: need_reorder=True needs step_input() "
                                     "called before memory()")
                init_tensor = parent.create_var(
                    name=unique_name.generate("dynamic_rnn_mem_init_reordered"),
                    type=VarType.LOD_TENSOR, dtype=init.dtype, shape=list(init.shape))
                parent.append_op("reorder_lod_tensor_by_rank",
                                 inputs={"X": [init], "RankTable": [self.lod_rank_table]},
                                 outputs={"Out": [init_tensor]})
            mem_array = parent.create_var(name=unique_name.generate("dynamic_rnn_mem_array"),
                                          type=VarType.LOD_TENSOR_ARRAY, dtype=init.dtype)
            parent.append_op("write_to_array", inputs={"X": [init_tensor], "I": [self.zero_idx]},
                             outputs={"Out": [mem_array]})
            retv = cf.array_read(mem_array, self.step_idx)
            retv = shrink_memory(retv, self.step_idx, self.lod_rank_table)
            self.mem_dict[retv.name] = mem_array
            return retv
        if not self.input_array:
            raise ValueError("DynamicRNN.memory: call step_input() before memory(shape=..., "
                             "value=...)")
        if shape is None:
            raise ValueError("DynamicRNN.memory: give init, or shape (and value)")
        arr, in_dtype = self.input_array[0]
        with _building_in(parent):
            in0 = cf.array_read(arr, self.zero_idx)
            init = fill_constant_batch_size_like(in0, shape=[-1] + list(shape), dtype=dtype,
                                                 value=float(value))
        return self.memory(init=init)

    def update_memory(self, ex_mem, new_mem):
        """``ex_mem`` (a memory) takes the value ``new_mem`` at the next step."""
        self._assert_in_rnn_block("update_memory")
        check_variable(ex_mem, "ex_mem", "DynamicRNN.update_memory")
        check_variable(new_mem, "new_mem", "DynamicRNN.update_memory")
        mem_array = self.mem_dict.get(ex_mem.name)
        if mem_array is None:
            raise ValueError(f"DynamicRNN.update_memory: {ex_mem.name!r} is not a memory of "
                             f"this DynamicRNN (make it with drnn.memory())")
        self.mem_link.append((new_mem, mem_array))

    def output(self, *outputs):
        """Collect each of ``outputs`` at every step: ``drnn()`` returns them as LoD tensors
        with the step input's LoD."""
        self._assert_in_rnn_block("output")
        parent = self._parent()
        for each in outputs:
            check_variable(each, "outputs", "DynamicRNN.output")
            arr = parent.create_var(
                name=unique_name.generate(f"{self.helper.name}_output_array_{each.name}"),
                type=VarType.LOD_TENSOR_ARRAY, dtype=each.dtype)
            cf.array_write(each, self.step_idx, array=arr)
            self.output_array.append(arr)

    def __call__(self, *args, **kwargs):
        if self.status != DynamicRNN.AFTER_RNN:
            raise ValueError("DynamicRNN(): the outputs exist after the 'with drnn.block():' "
                             "block")
        if not self.outputs:
            raise ValueError("DynamicRNN(): the step block called no output()")
        return self.outputs[0] if len(self.outputs) == 1 else self.outputs


def shrink_memory(x, i, table):
    """``x`` cut to its first rows, one per sequence of ``table`` longer than step ``i``."""
    helper = LayerHelper("shrink_memory")
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("shrink_rnn_memory", inputs={"X": [x], "I": [i], "RankTable": [table]},
                     outputs={"Out": [out]})
    return out


def _array_to_lod_tensor(x, table):
    helper = LayerHelper("array_to_lod_tensor")
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("array_to_lod_tensor", inputs={"X": [x], "RankTable": [table]},
                     outputs={"Out": [out]})
    return out


# ---- the ops as layers (Fluid 1.x exports them) --------------------------------------------------
def lod_rank_table(x, level: int = 0):
    """The sequences of ``x``'s LoD level ``level`` ranked by length, longest first."""
    check_variable(x, "x", "lod_rank_table")
    helper = LayerHelper("lod_rank_table")
    table = helper.create_variable(name=unique_name.generate("lod_rank_table"),
                                   type=VarType.LOD_RANK_TABLE, stop_gradient=True)
    helper.append_op("lod_rank_table", inputs={"X": [x]}, outputs={"Out": [table]},
                     attrs={"level": int(level)})
    return table


def _check_table(table, layer: str):
    if not hasattr(table, "type") or table.type != VarType.LOD_RANK_TABLE:
        raise TypeError(f"{layer}: argument 'table' must be a rank table (lod_rank_table), got "
                        f"{getattr(table, 'name', type(table).__name__)!r}")


def max_sequence_len(rank_table):
    """The longest sequence's length in ``rank_table`` (int64 ``[1]``)."""
    _check_table(rank_table, "max_sequence_len")
    helper = LayerHelper("max_seqence_len")
    out = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("max_sequence_len", inputs={"RankTable": [rank_table]},
                     outputs={"Out": [out]})
    return out


def lod_tensor_to_array(x, table):
    """A tensor array of ``x``'s time steps (element ``t``: step ``t`` of every sequence longer
    than ``t``, in ``table``'s order)."""
    check_variable(x, "x", "lod_tensor_to_array")
    _check_table(table, "lod_tensor_to_array")
    helper = LayerHelper("lod_tensor_to_array")
    array = helper.create_variable(name=unique_name.generate("lod_tensor_to_array"),
                                   type=VarType.LOD_TENSOR_ARRAY, dtype=x.dtype)
    helper.append_op("lod_tensor_to_array", inputs={"X": [x], "RankTable": [table]},
                     outputs={"Out": [array]})
    return array


def array_to_lod_tensor(x, table):
    """The inverse of ``lod_tensor_to_array``: a LoD tensor of the sequences."""
    cf._check_array(x, "array_to_lod_tensor")
    _check_table(table, "array_to_lod_tensor")
    return _array_to_lod_tensor(x, table)


def reorder_lod_tensor_by_rank(x, rank_table):
    """``x``'s sequences (rows without LoD) in ``rank_table``'s order."""
    check_variable(x, "x", "reorder_lod_tensor_by_rank")
    _check_table(rank_table, "reorder_lod_tensor_by_rank")
    helper = LayerHelper("reorder_lod_tensor_by_rank")
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("reorder_lod_tensor_by_rank",
                     inputs={"X": [x], "RankTable": [rank_table]}, outputs={"Out": [out]})
    return out
