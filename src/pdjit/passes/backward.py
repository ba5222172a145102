"""Backward: append the gradient ops of a program (a program -> program rewrite, as in Fluid).

Assumes: the loss (or targets) and everything they depend on live in the global block; each
op's definition declares ``grad`` (a grad maker, ``None`` for no gradient, or ``NO_GRAD_YET``).

Guarantees:

- the ops appended are a ``fill_constant`` seeding ``loss@GRAD`` with ones (role Backward|Loss),
  then, walking the forward ops in reverse, the grad ops their makers describe, each recorded
  with role Backward and, when it produces a parameter's gradient, ``op_role_var``;
- only ops on a path from a variable that needs a gradient to the loss get grad ops; a
  variable needs no gradient when it is in ``no_grad_set`` or has ``stop_gradient``;
- a gradient with several producers is summed: each producer writes ``X@GRAD@RENAME@k``
  and a ``sum`` op writes ``X@GRAD`` before its first reader;
- a grad op's output that nobody needs is left out (its slot written empty, as Paddle does);
  an out-grad that no consumer produced is filled with zeros (``fill_zeros_like``);
- grad variables take their shape and dtype from their forward variables.

Which gradient belongs to which variable is kept in an explicit map, never parsed from names.
"""
from __future__ import annotations

from pdjit.framework import registry
from pdjit.framework.errors import ProgramError
from pdjit.framework.program import Parameter, Program, Variable
from pdjit.framework.registry import EMPTY_VAR_NAME, OP_ROLE_BACKWARD, OP_ROLE_LOSS, grad_var_name
from pdjit.passes import dump_after


def _names(values) -> set:
    out = set()
    for v in values or ():
        out.add(v.name if isinstance(v, Variable) else v)
    return out


class _Backward:
    def __init__(self, program: Program, no_grad: set):
        self.program = program
        self.block = program.global_block()
        self.no_grad = no_grad
        self.grad_of: dict = {}         # grad var name -> forward var name
        self.contribs: dict = {}        # forward var name -> [grad names written so far]
        self.summed: set = set()        # forward var names whose grad is final
        self.pending: dict = {}         # outputs of the grad op being built

    def needs_grad(self, name: str) -> bool:
        v = self.block._find_var_recursive(name)
        return v is not None and name not in self.no_grad and not v.stop_gradient and \
            v.dtype is not None and v.dtype.kind == "f"

    # -- which ops matter ----------------------------------------------------------------------
    def relevant_ops(self, targets: set) -> list:
        ops = self.block.ops
        # forward: variables that depend on something needing a gradient
        tainted = {v.name for v in self.block.vars.values() if self.needs_grad(v.name)
                   and v.op is None}
        produced_by = []
        for op in ops:
            ins = [n for n in op.input_arg_names if n in tainted or
                   (self.needs_grad(n) and self.block._find_var_recursive(n).op is None)]
            if ins and registry.lookup(op.type) is not None and \
                    registry.get(op.type).grad is not None:
                tainted.update(n for n in op.output_arg_names if self.needs_grad(n))
                produced_by.append(op)
        # backward: ops whose outputs reach a target
        reach = set(targets)
        keep = []
        for op in reversed(produced_by):
            if any(n in reach for n in op.output_arg_names):
                keep.append(op)
                reach.update(op.input_arg_names)
        return keep  # reversed order: the order grad ops are made in

    # -- gradient variables ----------------------------------------------------------------------
    def grad_var(self, fwd: str, name: str | None = None) -> str:
        name = name or grad_var_name(fwd)
        if not self.block.has_var(name):
            v = self.block._var_recursive(fwd)
            self.block.create_var(name=name, shape=v.shape, dtype=v.dtype, lod_level=v.lod_level)
        self.grad_of[name] = fwd
        return name

    def finish(self, fwd: str) -> str | None:
        """Make ``fwd@GRAD`` final (summing its contributions); None if it has none."""
        contribs = self.contribs.get(fwd)
        if not contribs:
            return None
        target = grad_var_name(fwd)
        if fwd not in self.summed:
            self.summed.add(fwd)
            if len(contribs) > 1:
                self.grad_var(fwd)
                with self.program._op_role_guard(OP_ROLE_BACKWARD):
                    self.block.append_op("sum", inputs={"X": contribs}, outputs={"Out": [target]})
        return target

    def write_target(self, fwd: str) -> str:
        """The name a new contribution to ``fwd``'s gradient is written to."""
        contribs = self.contribs.setdefault(fwd, [])
        name = grad_var_name(fwd) if not contribs else \
            f"{grad_var_name(fwd)}@RENAME@{len(contribs)}"
        if len(contribs) == 1 and contribs[0] == grad_var_name(fwd):
            # the first contribution took the plain name: move it aside, the sum gets it
            first = f"{grad_var_name(fwd)}@RENAME@0"
            self._rename_output(contribs[0], first)
            contribs[0] = first
            self.grad_var(fwd, first)
        contribs.append(name)
        self.grad_var(fwd, name)
        return name

    def _rename_output(self, old: str, new: str) -> None:
        for names in self.pending.values():  # the grad op being built (x * x: two outputs)
            if old in names:
                names[names.index(old)] = new
                return
        for op in reversed(self.block.ops):
            if old in op.output_arg_names:
                op._rename_output(old, new)
                return

    # -- one forward op ----
    def grad_ops_for(self, op) -> None:
        opdef = registry.get(op.type)
        if opdef.grad is registry.NO_GRAD_YET:
            raise ProgramError(f"{op._describe()}: its gradient is not implemented yet, so "
                               f"append_backward cannot differentiate through it")
        specs = opdef.grad(op)
        out_grads = {grad_var_name(n): n for n in op.output_arg_names}
        in_grads = {grad_var_name(n): n for n in op.input_arg_names}
        for spec in specs:
            inputs = {}
            for slot, names in spec.inputs.items():
                bound = []
                for n in names:
                    if n in out_grads:
                        fwd = out_grads[n]
                        have = self.finish(fwd)
                        if have is None:  # no consumer of this output produced a gradient
                            have = self.zeros_like(fwd)
                        bound.append(have)
                    else:
                        bound.append(n)
                inputs[slot] = bound
            outputs, any_out, role_var = {}, False, []
            self.pending = outputs
            grad_def = registry.get(spec.type)
            for slot, names in spec.outputs.items():
                out_slot = grad_def.output_slot(slot)
                keep_places = out_slot is not None and out_slot.duplicable
                bound = outputs[slot] = []
                for n in names:
                    fwd = in_grads.get(n, self.grad_of.get(n))
                    if fwd is None or not self.needs_grad(fwd):
                        if keep_places:  # a list slot keeps positions: Paddle's @EMPTY@
                            bound.append(EMPTY_VAR_NAME)
                        continue
                    target = self.write_target(fwd)
                    bound.append(target)
                    any_out = True
                    v = self.block._find_var_recursive(fwd)
                    if isinstance(v, Parameter):
                        role_var += [fwd, grad_var_name(fwd)]
                outputs[slot] = bound
            self.pending = {}
            if not any_out:
                continue
            attrs = dict(spec.attrs)
            if role_var:
                attrs["op_role_var"] = role_var
            with self.program._op_role_guard(OP_ROLE_BACKWARD):
                self.block.append_op(spec.type, inputs=inputs, outputs=outputs, attrs=attrs)

    def zeros_like(self, fwd: str) -> str:
        name = self.grad_var(fwd, f"{grad_var_name(fwd)}@ZERO")
        if not any(name in op.output_arg_names for op in self.block.ops):
            with self.program._op_role_guard(OP_ROLE_BACKWARD):
                self.block.append_op("fill_zeros_like", inputs={"X": [fwd]},
                                     outputs={"Out": [name]})
        return name


def _seed(bw: _Backward, target: Variable, seed) -> None:
    name = bw.grad_var(target.name)
    bw.contribs[target.name] = [name]
    bw.summed.add(target.name)
    with bw.program._op_role_guard(OP_ROLE_BACKWARD | OP_ROLE_LOSS):
        if seed is None:
            bw.block.append_op("fill_constant", outputs={"Out": [name]},
                               attrs={"shape": list(target.shape), "value": 1.0,
                                      "dtype": registry_dtype(target)})
        else:
            bw.block.append_op("assign", inputs={"X": [seed]}, outputs={"Out": [name]})


def registry_dtype(var: Variable) -> int:
    from pdjit.framework import dtypes

    return dtypes.to_code(var.dtype)


def _run(program, targets, seeds, no_grad_set) -> _Backward:
    block = program.global_block()
    for t in targets:
        if not isinstance(t, Variable) or t.block is not block:
            raise ProgramError(f"backward: target {getattr(t, 'name', t)!r} must be a Variable "
                               f"of the program's global block")
    if any(-1 in t.shape for t, s in zip(targets, seeds) if s is None):
        raise ProgramError(f"backward: target {targets[0].name!r} has unknown dims "
                           f"{list(targets[0].shape)}; reduce it to a known shape (e.g. mean) "
                           f"or give target_gradients")
    bw = _Backward(program, _names(no_grad_set))
    for t, s in zip(targets, seeds):
        _seed(bw, t, s)
    for op in bw.relevant_ops({t.name for t in targets}):
        bw.grad_ops_for(op)
    return bw


def append_backward(loss: Variable, parameter_list=None, no_grad_set=None, callbacks=None):
    """Append the gradient ops of ``loss``; return ``[(parameter, its gradient variable)]``."""
    if callbacks:
        raise NotImplementedError("append_backward: callbacks are not supported")
    program = loss.block.program
    if loss.op is not None:  # Paddle marks the op that computes the loss
        loss.op._set_attr("op_role", registry.OP_ROLE_FORWARD | OP_ROLE_LOSS)
    params = program.global_block().all_parameters()
    if parameter_list is not None:
        wanted = _names(parameter_list)
        params = [p for p in params if p.name in wanted]
    params = [p for p in params if p.trainable and p.name not in _names(no_grad_set)]
    no_grad = _names(no_grad_set) | {p.name for p in program.global_block().all_parameters()
                                     if not p.trainable}
    bw = _run(program, [loss], [None], no_grad)
    result = []
    for p in params:
        g = bw.finish(p.name)
        if g is not None:
            result.append((p, program.global_block().var(g)))
    dump_after("backward", lambda: str(program))
    return result


def gradients(targets, inputs, target_gradients=None, no_grad_set=None):
    """Gradients of the sum of ``targets`` with respect to each of ``inputs`` (None where a
    target does not depend on an input)."""
    targets = targets if isinstance(targets, (list, tuple)) else [targets]
    inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    seeds = target_gradients if target_gradients is not None else [None] * len(targets)
    seeds = seeds if isinstance(seeds, (list, tuple)) else [seeds]
    if len(seeds) != len(targets):
        raise ValueError(f"gradients: expected {len(targets)} target_gradients, got "
                         f"{len(seeds)}")
    program = targets[0].block.program
    # inputs may have stop_gradient (data layers do): asking for their gradient overrides it
    for x in inputs:
        x.stop_gradient = False
    bw = _run(program, list(targets), list(seeds), no_grad_set)
    outs = []
    for x in inputs:
        g = bw.finish(x.name)
        outs.append(program.global_block().var(g) if g is not None else None)
    return outs
