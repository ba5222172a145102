"""Control-flow layers (Fluid 1.8): cond, while_loop, While, Switch, case, switch_case, IfElse,
tensor arrays, increment.

Branch and loop bodies are built into sub-blocks of the default main program
(``program._create_block()`` ... ``program._rollback()``). When a sub-block is closed, the
control-flow op is appended to the enclosing block with, as Paddle does, every variable the
sub-block reads from outside as an input and every outside variable it writes as an output, so
prune, fusion and the backward pass see the data flow. Comparisons, logical ops, ``assign`` and
``fill_constant_batch_size_like`` live in their own modules; ``pdjit.layers`` exports them all.
"""
from __future__ import annotations

from functools import partial

from pdjit.framework import dtypes, registry, unique_name
from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_variable
from pdjit.layers.math_ops import equal, logical_and, logical_not
from pdjit.layers.tensor import assign, cast, fill_constant
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType

__all__ = ["cond", "while_loop", "While", "Switch", "case", "switch_case", "IfElse",
           "create_array", "array_write", "array_read", "array_length", "increment",
           "tensor_array_to_tensor", "split_lod_tensor", "merge_lod_tensor"]


# ---- helpers ------------------------------------------------------------------------------------
def _check_bool(var, arg: str, layer: str) -> Variable:
    check_variable(var, arg, layer)
    if var.dtype is None or dtypes.dtype_str(var.dtype) != "bool":
        raise TypeError(f"{layer}: {arg!r} must be a bool Variable, got dtype "
                        f"{None if var.dtype is None else dtypes.dtype_str(var.dtype)} "
                        f"({var.name!r})")
    return var


def _check_one_element(var, arg: str, layer: str) -> None:
    known = [int(d) for d in var.shape]
    if known and all(d >= 0 for d in known) and _prod(known) != 1:
        raise TypeError(f"{layer}: {arg!r} must hold one element (shape [1]), got shape "
                        f"{known} ({var.name!r})")


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _flatten(structure) -> list:
    if isinstance(structure, (list, tuple)):
        return [leaf for s in structure for leaf in _flatten(s)]
    if isinstance(structure, dict):
        return [leaf for k in structure for leaf in _flatten(structure[k])]
    return [structure]


def _pack(structure, flat: list):
    """``flat`` (leaves in ``_flatten`` order) arranged like ``structure``."""
    it = iter(flat)

    def build(s):
        if isinstance(s, (list, tuple)):
            return type(s)(build(x) for x in s)
        if isinstance(s, dict):
            return {k: build(s[k]) for k in s}
        return next(it)
    return build(structure)


def _same_structure(a, b) -> str | None:
    """None if ``a`` and ``b`` nest the same way, else what differs."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"a sequence of {len(a)} vs one of {len(b)}"
        for x, y in zip(a, b):
            why = _same_structure(x, y)
            if why:
                return why
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"dict keys {list(a)} vs {list(b)}"
        for k in a:
            why = _same_structure(a[k], b[k])
            if why:
                return why
        return None
    nested = (list, tuple, dict)
    if isinstance(a, nested) or isinstance(b, nested):
        return f"{type(a).__name__} vs {type(b).__name__}"
    return None


def _outside_io(sub_block, parent_block, first_outputs=()):
    """(names the sub-block reads from outside, outside names it writes), in first-use order.

    A name read before any op of the sub-block wrote it is an input; a name some op writes and
    that an enclosing block declares is an output (``first_outputs`` count as written first).
    """
    written = dict.fromkeys(first_outputs)
    reads: dict = {}
    for op in sub_block.ops:
        for n in op.input_arg_names:
            if n != registry.EMPTY_VAR_NAME and n not in written:
                reads[n] = None
        for n in op.output_arg_names:
            if n != registry.EMPTY_VAR_NAME:
                written[n] = None
    ins = [n for n in reads if not sub_block.has_var(n)
           and parent_block._find_var_recursive(n) is not None]
    outs = [n for n in written if not sub_block.has_var(n)
            and parent_block._find_var_recursive(n) is not None]
    return ins, outs


class BlockGuard:
    """``with BlockGuard(program):`` builds into a new sub-block of the current block."""

    def __init__(self, program):
        self.program = program

    def __enter__(self):
        self.block = self.program._create_block()
        return self.block

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.program._rollback()
        return False


# ---- conditional_block ---------------------------------------------------------------------------
class ConditionalBlock:
    """A ``conditional_block`` op built with ``with cb.block(): ...`` (Fluid's ConditionalBlock).

    The sub-block runs when the one bool element of ``inputs[0]`` is true
    (``is_scalar_condition``), else when every tensor of ``inputs`` is non-empty.
    """

    def __init__(self, inputs, is_scalar_condition: bool = False, name=None):
        for x in inputs:
            check_variable(x, "inputs", "ConditionalBlock")
        self.inputs = list(inputs)
        self.is_scalar_condition = bool(is_scalar_condition)
        self.helper = LayerHelper("conditional_block", name=name)

    def block(self) -> "ConditionalBlockGuard":
        return ConditionalBlockGuard(self)

    def complete(self):
        program = self.helper.main_program
        inside = program.current_block()
        parent = program.block(inside.parent_idx)
        ins, outs = _outside_io(inside, parent)
        scope = parent.create_var(name=unique_name.generate(f"{self.helper.name}.scope"),
                                  type=VarType.STEP_SCOPES)
        return parent.append_op(
            "conditional_block",
            inputs={"Cond": self.inputs, "Input": ins},
            outputs={"Out": outs, "Scope": [scope]},
            attrs={"sub_block": inside.idx, "is_scalar_condition": self.is_scalar_condition})


class ConditionalBlockGuard(BlockGuard):
    def __init__(self, cond_block: ConditionalBlock):
        super().__init__(cond_block.helper.main_program)
        self.cond_block = cond_block

    def __exit__(self, exc_type, exc_val, exc_tb):
        if exc_type is None:
            self.cond_block.complete()
        return super().__exit__(exc_type, exc_val, exc_tb)


def select_input(inputs, mask) -> Variable:
    """``inputs[mask]``: ``mask`` an int32 Variable of one element (how ``cond`` merges)."""
    helper = LayerHelper("select_input")
    for x in inputs:
        check_variable(x, "inputs", "select_input")
    check_variable(mask, "mask", "select_input")
    first = inputs[0]
    out = helper.create_variable(name=unique_name.generate(f"{helper.name}.tmp"),
                                 dtype=first.dtype, shape=first.shape, type=first.type)
    helper.append_op("select_input", inputs={"X": list(inputs), "Mask": [mask]},
                     outputs={"Out": [out]})
    return out


def _copy_to_parent(var, layer: str):
    """A variable of the enclosing block holding a copy of ``var`` (a branch's output)."""
    if var is None:
        return None
    if not isinstance(var, Variable):
        raise TypeError(f"{layer}: branch outputs must be Variables (or nested lists, tuples or "
                        f"dicts of them), got {type(var).__name__}")
    program = var.block.program
    parent = program.block(program.current_block().parent_idx)
    out = parent.create_var(dtype=var.dtype, shape=var.shape, type=var.type)
    assign(var, out)
    return out


def cond(pred, true_fn=None, false_fn=None, name=None):
    """``true_fn()`` if ``pred`` (a bool Variable of one element) is true, else ``false_fn()``.

    Built as Paddle builds it: one ``conditional_block`` on ``pred`` for ``true_fn``, one on
    ``logical_not(pred)`` for ``false_fn``, and a ``select_input`` per output (mask
    ``cast(pred, int32)``). The branches return the same nesting of Variables (or both None).
    """
    _check_bool(pred, "pred", "cond")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"cond: name must be a str or None, got {type(name).__name__}")
    true_output = false_output = None
    if true_fn is not None:
        if not callable(true_fn):
            raise TypeError(f"cond: true_fn must be callable, got {type(true_fn).__name__}")
        with ConditionalBlock([pred], is_scalar_condition=True).block():
            out = true_fn()
            if out is not None:
                true_output = _pack(out, [_copy_to_parent(v, "cond") for v in _flatten(out)])
    if false_fn is not None:
        if not callable(false_fn):
            raise TypeError(f"cond: false_fn must be callable, got {type(false_fn).__name__}")
        with ConditionalBlock([logical_not(pred)], is_scalar_condition=True).block():
            out = false_fn()
            if out is not None:
                false_output = _pack(out, [_copy_to_parent(v, "cond") for v in _flatten(out)])
    if true_output is None and false_output is None:
        return None
    if true_output is None or false_output is None:
        which = "true_fn" if true_output is None else "false_fn"
        raise ValueError(f"cond: incompatible return values of true_fn and false_fn: {which} "
                         f"returns None while the other returns Variables")
    why = _same_structure(true_output, false_output)
    if why:
        raise ValueError(f"cond: incompatible return values of true_fn and false_fn: {why}")
    mask = cast(pred, "int32")
    merged = [select_input([f, t], mask)
              for f, t in zip(_flatten(false_output), _flatten(true_output))]
    return _pack(true_output, merged)


def case(pred_fn_pairs, default=None, name=None):
    """The output of the first ``fn`` whose ``pred`` is true, else of ``default`` (or, when
    ``default`` is None, of the last pair's ``fn``). Nested ``cond``s, as Fluid builds it."""
    if not isinstance(pred_fn_pairs, (list, tuple)):
        raise TypeError(f"case: pred_fn_pairs must be a list or tuple, got "
                        f"{type(pred_fn_pairs).__name__}")
    if not pred_fn_pairs:
        raise ValueError("case: pred_fn_pairs must not be empty")
    for pair in pred_fn_pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"case: each item of pred_fn_pairs must be a (pred, fn) tuple, got "
                            f"{pair!r}")
        _check_bool(pair[0], "pred", "case")
        if not callable(pair[1]):
            raise TypeError(f"case: fn of each (pred, fn) must be callable, got "
                            f"{type(pair[1]).__name__}")
    pairs = list(pred_fn_pairs)
    if default is None:
        default = pairs.pop()[1]
    elif not callable(default):
        raise TypeError(f"case: default must be callable, got {type(default).__name__}")
    fn = default
    for pred, true_fn in reversed(pairs):
        fn = partial(cond, pred, true_fn, fn)
    return fn()


def switch_case(branch_index, branch_fns, default=None, name=None):
    """The output of ``branch_fns[branch_index]`` (a list of callables, a list of
    ``(int, callable)`` or a dict int -> callable), else of ``default`` (or, when None, of the
    branch with the largest index)."""
    check_variable(branch_index, "branch_index", "switch_case")
    kind = dtypes.dtype_str(branch_index.dtype) if branch_index.dtype is not None else None
    if kind not in ("uint8", "int32", "int64"):
        raise TypeError(f"switch_case: branch_index must be uint8, int32 or int64, got {kind}")
    if kind != "int64":
        branch_index = cast(branch_index, "int64")
    if isinstance(branch_fns, dict):
        items = list(branch_fns.items())
    elif isinstance(branch_fns, (list, tuple)):
        items = list(enumerate(branch_fns)) if all(callable(f) for f in branch_fns) \
            else list(branch_fns)
    else:
        raise TypeError(f"switch_case: branch_fns must be a list, tuple or dict, got "
                        f"{type(branch_fns).__name__}")
    if not items:
        raise ValueError("switch_case: branch_fns must not be empty")
    keys = set()
    for pair in items:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"switch_case: each branch must be an (int, callable) pair, got "
                            f"{pair!r}")
        key, fn = pair
        if not isinstance(key, int) or isinstance(key, bool):
            raise TypeError(f"switch_case: branch keys must be ints, got {key!r}")
        if key in keys:
            raise ValueError(f"switch_case: key {key} appears more than once in branch_fns")
        keys.add(key)
        if not callable(fn):
            raise TypeError(f"switch_case: the branch of key {key} must be callable, got "
                            f"{type(fn).__name__}")
    items.sort(key=lambda p: p[0])
    if default is None:
        default = items.pop()[1]
    elif not callable(default):
        raise TypeError(f"switch_case: default must be callable, got {type(default).__name__}")
    pairs = [(equal(branch_index, fill_constant([1], "int64", key)), fn) for key, fn in items]
    fn = default
    for pred, true_fn in pairs:
        fn = partial(cond, pred, true_fn, fn)
    return fn()


class Switch:
    """Fluid's Switch: ``with Switch() as s: with s.case(c1): ...; with s.default(): ...``.

    The first case whose condition holds runs (each case is a conditional block on "this
    condition and none before"); ``default`` runs when none held.
    """

    def __init__(self, name=None):
        self.helper = LayerHelper("switch", name=name)
        self.inside_scope = False
        self.pre_not_conditions: list = []

    def case(self, condition):
        if not self.inside_scope:
            raise ValueError("Switch.case must be used inside 'with Switch() as switch:'")
        _check_bool(condition, "condition", "Switch.case")
        if not self.pre_not_conditions:
            block = ConditionalBlock([condition], is_scalar_condition=True)
            self.pre_not_conditions.append(logical_not(condition))
        else:
            pre_not = self.pre_not_conditions[-1]
            self.pre_not_conditions.append(logical_and(pre_not, logical_not(condition)))
            block = ConditionalBlock([logical_and(pre_not, condition)], is_scalar_condition=True)
        return block.block()

    def default(self):
        if not self.pre_not_conditions:
            raise ValueError("Switch.default: there must be at least one case before it")
        return ConditionalBlock([self.pre_not_conditions[-1]], is_scalar_condition=True).block()

    def __enter__(self):
        self.inside_scope = True
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.inside_scope = False
        return False


# ---- while ---------------------------------------------------------------------------------------
class While:
    """Fluid's While: ``with While(cond).block(): ...`` runs the block while ``cond`` (a bool
    Variable of one element, which the block must update) is true."""

    def __init__(self, cond, is_test: bool = False, name=None):
        _check_bool(cond, "cond", "While")
        _check_one_element(cond, "cond", "While")
        self.cond_var = cond
        self.is_test = bool(is_test)
        self.helper = LayerHelper("while", name=name)

    def block(self) -> "WhileGuard":
        return WhileGuard(self)

    def _complete(self):
        program = self.helper.main_program
        inside = program.current_block()
        parent = program.block(inside.parent_idx)
        ins, outs = _outside_io(inside, parent, first_outputs=[self.cond_var.name])
        scopes = parent.create_var(name=unique_name.generate(f"{self.helper.name}.step_scopes"),
                                   type=VarType.STEP_SCOPES)
        parent.append_op("while", inputs={"X": ins, "Condition": [self.cond_var]},
                         outputs={"Out": outs, "StepScopes": [scopes]},
                         attrs={"sub_block": inside.idx, "is_test": self.is_test})


class WhileGuard(BlockGuard):
    def __init__(self, while_op: While):
        super().__init__(while_op.helper.main_program)
        self.while_op = while_op

    def __exit__(self, exc_type, exc_val, exc_tb):
        if exc_type is None:
            self.while_op._complete()
        return super().__exit__(exc_type, exc_val, exc_tb)


def while_loop(cond, body, loop_vars, is_test: bool = False, name=None):
    """``while cond(*loop_vars): loop_vars = body(*loop_vars)``; returns ``loop_vars``.

    ``cond`` returns a bool Variable of one element; ``body`` returns as many values as
    ``loop_vars`` holds (the same nesting). The results are written back into the loop
    variables (``assign``), which are returned.
    """
    if not callable(cond):
        raise TypeError(f"while_loop: cond must be callable, got {type(cond).__name__}")
    if not callable(body):
        raise TypeError(f"while_loop: body must be callable, got {type(body).__name__}")
    if not isinstance(loop_vars, (list, tuple)):
        raise TypeError(f"while_loop: loop_vars must be a list or tuple, got "
                        f"{type(loop_vars).__name__}")
    if not loop_vars:
        raise ValueError("while_loop: loop_vars must not be empty")
    for v in _flatten(loop_vars):
        check_variable(v, "loop_vars", "while_loop")
    pre_cond = cond(*loop_vars)
    check_variable(pre_cond, "the value cond returns", "while_loop")
    _check_bool(pre_cond, "the value cond returns", "while_loop")
    _check_one_element(pre_cond, "the value cond returns", "while_loop")
    loop = While(pre_cond, is_test, name)
    with loop.block():
        outs = body(*loop_vars)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        if len(outs) != len(loop_vars):
            raise ValueError(f"while_loop: body must return as many values as loop_vars "
                             f"({len(loop_vars)}), got {len(outs)}")
        why = _same_structure(list(outs), list(loop_vars))
        if why:
            raise ValueError(f"while_loop: body must return the structure of loop_vars: {why}")
        now_cond = cond(*outs)
        _check_bool(now_cond, "the value cond returns", "while_loop")
        for new, old in zip(_flatten(list(outs)), _flatten(list(loop_vars))):
            check_variable(new, "the values body returns", "while_loop")
            assign(new, old)
        assign(now_cond, pre_cond)
    return loop_vars


# ---- IfElse (Fluid 1.x) --------------------------------------------------------------------------
def split_lod_tensor(input, mask, level: int = 0):
    """(rows of ``input`` where ``mask`` is true, the other rows), in order."""
    check_variable(input, "input", "split_lod_tensor")
    check_variable(mask, "mask", "split_lod_tensor")
    helper = LayerHelper("split_lod_tensor")
    out_true = helper.create_variable_for_type_inference(input.dtype)
    out_false = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("split_lod_tensor", inputs={"X": [input], "Mask": [mask]},
                     outputs={"OutTrue": [out_true], "OutFalse": [out_false]},
                     attrs={"level": level})
    return out_true, out_false


def merge_lod_tensor(in_true, in_false, x, mask, level: int = 0):
    """The rows of ``in_true`` and ``in_false`` put back where ``mask`` is true / false."""
    for v, arg in ((in_true, "in_true"), (in_false, "in_false"), (x, "x"), (mask, "mask")):
        check_variable(v, arg, "merge_lod_tensor")
    helper = LayerHelper("merge_lod_tensor")
    out = helper.create_variable_for_type_inference(in_true.dtype)
    helper.append_op("merge_lod_tensor",
                     inputs={"X": [x], "Mask": [mask], "InTrue": [in_true],
                             "InFalse": [in_false]},
                     outputs={"Out": [out]}, attrs={"level": level})
    return out


class IfElse:
    """Fluid 1.x's IfElse: per-row branches on a bool ``cond`` of shape [batch, 1].

    In ``true_block()``, ``input(x)`` gives the rows of ``x`` where ``cond`` is true (in
    ``false_block()``, the others); ``output(*vars)`` records a branch's results; ``ie()``
    returns the list of results with the rows of both branches merged back in the batch's
    order. A batch where every row (or none) takes one branch works: the other branch computes
    on zero rows.
    """

    OUT_IF_ELSE_BLOCKS, IN_IF_ELSE_TRUE_BLOCKS, IN_IF_ELSE_FALSE_BLOCKS = 0, 1, 2

    def __init__(self, cond, name=None):
        _check_bool(cond, "cond", "IfElse")
        self.helper = LayerHelper("ifelse", name=name)
        self.cond = cond
        self.input_table: dict = {}
        self.status = IfElse.OUT_IF_ELSE_BLOCKS
        self.conditional_true_block = ConditionalBlock(inputs=[cond])
        self.conditional_false_block = ConditionalBlock(inputs=[cond])
        self.output_table: tuple = ([], [])  # (false outputs, true outputs)

    def _parent_block(self):
        program = self.helper.main_program
        return program.block(program.current_block().parent_idx)

    def input(self, x):
        if self.status == IfElse.OUT_IF_ELSE_BLOCKS:
            raise ValueError("IfElse.input must be called inside true_block() or false_block()")
        check_variable(x, "x", "IfElse.input")
        if id(x) not in self.input_table:
            parent = self._parent_block()
            base = f"ifelse_input_{self.helper.name}"
            out_true = parent.create_var(name=unique_name.generate(base), dtype=x.dtype)
            out_false = parent.create_var(name=unique_name.generate(base), dtype=x.dtype)
            parent.append_op("split_lod_tensor", inputs={"X": [x], "Mask": [self.cond]},
                             outputs={"OutTrue": [out_true], "OutFalse": [out_false]},
                             attrs={"level": 0})
            self.input_table[id(x)] = (x, out_true, out_false)
        _, out_true, out_false = self.input_table[id(x)]
        return out_true if self.status == IfElse.IN_IF_ELSE_TRUE_BLOCKS else out_false

    def true_block(self):
        return _IfElseBlockGuard(True, self)

    def false_block(self):
        return _IfElseBlockGuard(False, self)

    def output(self, *outs):
        if self.status == IfElse.OUT_IF_ELSE_BLOCKS:
            raise ValueError("IfElse.output must be called inside true_block() or "
                             "false_block()")
        table = self.output_table[1 if self.status == IfElse.IN_IF_ELSE_TRUE_BLOCKS else 0]
        parent = self._parent_block()
        for each in outs:
            check_variable(each, "outs", "IfElse.output")
            outside = parent.create_var(
                name=unique_name.generate(f"{self.helper.name}_output"), dtype=each.dtype)
            table.append(outside)
            assign(each, outside)

    def __call__(self):
        if self.status != IfElse.OUT_IF_ELSE_BLOCKS:
            raise ValueError("IfElse() must be called outside true_block() and false_block()")
        false_len, true_len = map(len, self.output_table)
        if false_len == 0 and true_len == 0:
            raise ValueError("IfElse(): call output() in true_block() or false_block() first")
        if false_len != true_len and false_len != 0 and true_len != 0:
            raise ValueError(f"IfElse(): the branches output different numbers of variables: "
                             f"true block {true_len}, false block {false_len}")
        if false_len == 0 or true_len == 0:
            return self.output_table[0 if false_len != 0 else 1]
        return [merge_lod_tensor(t, f, self.cond, self.cond, level=0)
                for f, t in zip(*self.output_table)]


class _IfElseBlockGuard:
    def __init__(self, is_true: bool, ifelse: IfElse):
        if ifelse.status != IfElse.OUT_IF_ELSE_BLOCKS:
            raise ValueError("IfElse: true_block()/false_block() cannot be nested in one another")
        self.ie, self.is_true = ifelse, is_true
        cb = ifelse.conditional_true_block if is_true else ifelse.conditional_false_block
        self.guard = cb.block()

    def __enter__(self):
        self.ie.status = (IfElse.IN_IF_ELSE_TRUE_BLOCKS if self.is_true
                          else IfElse.IN_IF_ELSE_FALSE_BLOCKS)
        self.guard.__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.guard.__exit__(exc_type, exc_val, exc_tb)
        self.ie.status = IfElse.OUT_IF_ELSE_BLOCKS
        return False


# ---- tensor arrays and counters ------------------------------------------------------------------
def create_array(dtype) -> Variable:
    """An empty tensor array (a ``LOD_TENSOR_ARRAY`` variable) of elements of ``dtype``."""
    helper = LayerHelper("array")
    return helper.create_variable(name=f"{helper.name}.out", type=VarType.LOD_TENSOR_ARRAY,
                                  dtype=dtype)


def _check_array(array, layer: str) -> Variable:
    if not isinstance(array, Variable) or array.type != VarType.LOD_TENSOR_ARRAY:
        got = type(array).__name__ if not isinstance(array, Variable) else \
            f"variable {array.name!r} of type {VarType.Type.Name(array.type)}"
        raise TypeError(f"{layer}: 'array' must be a tensor array Variable (create_array), got "
                        f"{got}")
    return array


def array_write(x, i, array=None) -> Variable:
    """``array[i] = x`` (the array grows as needed); a new array when ``array`` is None."""
    check_variable(x, "x", "array_write")
    check_variable(i, "i", "array_write")
    helper = LayerHelper("array_write")
    if array is None:
        array = helper.create_variable(name=f"{helper.name}.out", type=VarType.LOD_TENSOR_ARRAY,
                                       dtype=x.dtype)
    _check_array(array, "array_write")
    helper.append_op("write_to_array", inputs={"X": [x], "I": [i]}, outputs={"Out": [array]})
    return array


def array_read(array, i) -> Variable:
    """``array[i]`` (an error at run time when ``i`` is out of range)."""
    _check_array(array, "array_read")
    check_variable(i, "i", "array_read")
    helper = LayerHelper("array_read")
    out = helper.create_variable_for_type_inference(array.dtype)
    helper.append_op("read_from_array", inputs={"X": [array], "I": [i]}, outputs={"Out": [out]})
    return out


def array_length(array) -> Variable:
    """The number of elements of ``array`` (int64 of shape [1])."""
    _check_array(array, "array_length")
    helper = LayerHelper("array_length")
    out = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("lod_array_length", inputs={"X": [array]}, outputs={"Out": [out]})
    return out


def tensor_array_to_tensor(input, axis: int = 1, name=None, use_stack: bool = False):
    """(the elements of ``input`` concatenated, or stacked, along ``axis``; int32 sizes of each
    element along ``axis``)."""
    _check_array(input, "tensor_array_to_tensor")
    helper = LayerHelper("tensor_array_to_tensor", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    out_index = helper.create_variable_for_type_inference("int32")
    helper.append_op("tensor_array_to_tensor", inputs={"X": [input]},
                     outputs={"Out": [out], "OutIndex": [out_index]},
                     attrs={"axis": int(axis), "use_stack": bool(use_stack)})
    return out, out_index


def increment(x, value: float = 1.0, in_place: bool = True) -> Variable:
    """``x + value`` for a one-element ``x``, written into ``x`` itself when ``in_place``."""
    check_variable(x, "x", "increment")
    helper = LayerHelper("increment")
    out = x if in_place else helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("increment", inputs={"X": [x]}, outputs={"Out": [out]},
                     attrs={"step": float(value)})
    return out



# Fluid 1.x's recurrent blocks live in their own module (they build on the layers above);
# Fluid scripts also reach them as fluid.layers.control_flow.StaticRNN / DynamicRNN
from pdjit.layers.recurrent import DynamicRNN, StaticRNN  # noqa: E402,F401
