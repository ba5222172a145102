"""Backward: append the gradient ops of a program (a program -> program rewrite, as in Fluid).

Assumes: the loss (or targets) lives in the global block; each op's definition declares
``grad`` (a grad maker, ``None`` for no gradient, or ``NO_GRAD_YET``).

Guarantees:

- the ops appended are a ``fill_constant`` seeding ``loss@GRAD`` with ones (role Backward|Loss),
  then, walking the forward ops in reverse, the grad ops their makers describe, each recorded
  with role Backward and, when it produces a parameter's gradient, ``op_role_var``;
- only ops on a path from a variable that needs a gradient to the loss get grad ops; a
  variable needs no gradient when it is in ``no_grad_set`` or has ``stop_gradient``;
- a gradient with several producers is summed: each producer writes ``X@GRAD@RENAME@k``
  and a ``sum`` op writes ``X@GRAD`` before its first reader (tensor arrays: ``sum_array``);
- a grad op's output that nobody needs is left out (its slot written empty, as Paddle does);
  an out-grad that no consumer produced is filled with zeros (``fill_zeros_like``);
- grad variables take their shape, dtype and type from their forward variables;
- a variable written again (in-place ops, loop-carried variables of ``while``) has one gradient
  per version: contributions made before the walk passes its writer belong to the value the
  writer produced, later ones to the value it overwrote;
- ops with sub-blocks (``BLOCK`` attributes: ``conditional_block``, ``while``) are
  differentiated by recursion, as Paddle does: a grad block (parent: the block the grad op goes
  into, ``forward_block_idx``: the forward sub-block) holds the grad ops of the sub-block's
  ops, and the grad op's ``BLOCK`` attribute names it. Inside it the gradient of each output of
  the op is read under the name of the grad op's out-grad input, and the grad block writes the
  gradient of each input of the op straight into the grad op's output variable for it (a
  variable of the enclosing block); its own gradient variables carry the suffix
  ``@BLOCK<idx>``. Forward variables of the sub-block that grad ops read are also declared in
  the grad block (same name and meta) so its ops resolve them; at run time their values come
  from the forward step scope. A variable an op both reads and writes (loop-carried) gets a
  gradient even when marked ``stop_gradient``;
- where a grad op in a grad block needs a forward value the step scope does not keep (a
  variable of an enclosing block read after the loop body, or the branch, overwrote it), the
  forward block gets an ``assign`` copying it right after that write into a variable of its
  own (which each run's step scope keeps), and the grad op reads the copy.

Which gradient belongs to which variable is kept in an explicit map, never parsed from names.
"""
from __future__ import annotations

from pdjit.framework import registry, unique_name
from pdjit.framework.errors import ProgramError
from pdjit.framework.program import Parameter, Program, Variable
from pdjit.framework.registry import EMPTY_VAR_NAME, OP_ROLE_BACKWARD, OP_ROLE_LOSS, grad_var_name
from pdjit.passes import dump_after
from pdjit.proto import framework_pb2 as pb

# also Fluid's ``fluid.backward`` module (pdjit.MOVED)
__all__ = ["append_backward", "gradients"]

VarType = pb.VarType


def _builder(trait: str):
    """``(op type, input slot, output slot)`` of the op declared ``trait`` (what the pass builds
    with: ``SUMS``, ``SUMS_ARRAYS``, ``COPIES``, ``ZEROS_LIKE``, ``FILLS``): its first input
    slot (``None`` without one) and its first output slot."""
    d = registry.serving(trait)
    return d.type, d.inputs[0].name if d.inputs else None, d.outputs[0].name


def _names(values) -> set:
    out = set()
    for v in values or ():
        out.add(v.name if isinstance(v, Variable) else v)
    return out


class _Backward:
    """The gradient walk over the ops of ``fwd`` (a block), appending grad ops to ``block``
    (the same block for the global walk, a new grad block for a sub-block). In a grad block
    the walk's own gradient variables carry the suffix ``@BLOCK<idx>``, so they never shadow
    the enclosing block's gradients that the grad block reads (out-grads) or writes (sinks)."""

    def __init__(self, program: Program, no_grad: set, fwd=None, block=None, force=()):
        self.program = program
        self.fwd = fwd if fwd is not None else program.global_block()
        self.block = block if block is not None else self.fwd
        self.suffix = "" if self.block is self.fwd else f"@BLOCK{self.block.idx}"
        self.no_grad = no_grad
        self.force = set(force)         # loop-carried variables: differentiated regardless of
        self.grad_of: dict = {}         # stop_gradient; grad var name -> forward var name
        self.contribs: dict = {}        # forward var name -> [grad names written so far]
        self.summed: set = set()        # forward var names whose grad is final
        self.pending: dict = {}         # outputs of the grad op being built
        self.sources: set = set()       # extra variables to differentiate from (gradients())
        self.previous: dict = {}        # forward var name -> its later version's final grads
        self.owner = None               # in a grad block: the op owning the forward sub-block
        self.saved_names: set = set()
        self.repeats = False
        # where the forward block's ops stand, and the first op writing each name: "written
        # before op" is first_write[name] < position[id(op)] (linear in the block, not a set
        # of names per op)
        self.position: dict = {}        # id(forward op) -> its index when the walk began
        self.first_write: dict = {}     # name -> the index of the first op writing it
        self._outputs_here = None       # names some op of self.block writes (built lazily)
        self.maybe_kept: dict = {}      # name -> a branch op that may leave it unwritten
        self.kept: dict = {}            # (id(writer op), name) -> its copy (_kept_copy)

    def fwd_var(self, name: str):
        return self.fwd._find_var_recursive(name)

    def needs_grad(self, name: str) -> bool:
        v = self.fwd_var(name)
        if v is None or name in self.no_grad or v.dtype is None:
            return False
        return (not v.stop_gradient or name in self.force) and \
            (v.dtype.kind == "f" or v.type == VarType.LOD_TENSOR_ARRAY and v.dtype.kind == "f")

    def plain(self, fwd: str) -> str:
        return grad_var_name(fwd) + self.suffix

    # -- which ops matter ----------------------------------------------------------------------
    def relevant_ops(self, targets: set) -> list:
        """The differentiable ops on a path from a variable needing a gradient to ``targets``,
        in forward order. A variable read before any op of the block writes it (a feed, a
        parameter, a variable of an enclosing block) starts a path when it needs a gradient,
        and so does each of ``sources``. A variable an op both reads and writes on such a path
        (a loop-carried variable) is differentiated even when marked stop_gradient."""
        tainted, written, produced_by = set(self.sources), set(), []
        for op in self.fwd.ops:
            ins = [n for n in op.input_arg_names if n in tainted or
                   (n not in written and self.needs_grad(n))]
            opdef = registry.lookup(op.type)
            if ins and opdef is not None and opdef.grad is not None:
                both = set(op.input_arg_names) & set(op.output_arg_names)
                self.force.update(n for n in both if n not in self.no_grad and
                                  self._is_float(n))
                tainted.update(n for n in op.output_arg_names if self.needs_grad(n))
                produced_by.append(op)
            written.update(op.output_arg_names)
        reach = set(targets)
        keep = []
        for op in reversed(produced_by):
            if any(n in reach for n in op.output_arg_names):
                keep.append(op)
                reach.update(op.input_arg_names)
        keep.reverse()
        return keep

    def walk(self, targets: set) -> None:
        """Append the grad ops of the relevant ops, last op first; an op that is not relevant
        still ends the gradient version of what it writes."""
        relevant = {id(op) for op in self.relevant_ops(targets)}
        position, first_write = self.position, self.first_write
        for i, op in enumerate(self.fwd.ops):
            position[id(op)] = i
            for n in op.output_arg_names:
                first_write.setdefault(n, i)
        for op in reversed(list(self.fwd.ops)):  # (copies may be inserted meanwhile)
            if id(op) in relevant:
                self.grad_ops_for(op)
            else:
                self.note_branch(op)
                self.new_versions(op.output_arg_names)

    def new_versions(self, names) -> None:
        """``names`` were written here: earlier contributions are to the values they replace."""
        for n in names:
            if self.contribs.get(n):
                if n in self.sources:  # asked for (gradients()): sum it while it is whole
                    self.finish(n)
                self.previous[n] = self.contribs[n]
                self.contribs[n] = []
                self.summed.discard(n)

    def final(self, fwd: str) -> str | None:
        """The gradient of ``fwd`` after the walk: of the value the program started with when
        it has one (a feed, a parameter, a loop's initial value), else of the value its last
        writer produced (an intermediate variable)."""
        g = self.finish(fwd)
        if g is None and self.previous.get(fwd):
            self.contribs[fwd] = self.previous[fwd]
            self.summed.add(fwd)
            g = self.finish(fwd)
        return g

    # -- gradient variables ----------------------------------------------------------------------
    def grad_var(self, fwd: str, name: str | None = None) -> str:
        name = name or self.plain(fwd)
        if self.block._find_var_recursive(name) is None:
            v = self.fwd._var_recursive(fwd)
            array = v.type == VarType.LOD_TENSOR_ARRAY
            self.block.create_var(name=name, shape=v.shape, dtype=v.dtype, lod_level=v.lod_level,
                                  type=VarType.LOD_TENSOR_ARRAY if array else VarType.LOD_TENSOR)
        self.grad_of[name] = fwd
        return name

    def is_array(self, fwd: str) -> bool:
        v = self.fwd_var(fwd)
        return v is not None and v.type == VarType.LOD_TENSOR_ARRAY

    def finish(self, fwd: str, target: str | None = None) -> str | None:
        """Make ``fwd``'s gradient final (summing its contributions) in ``target`` (default:
        ``fwd@GRAD``, with the block's suffix); None if it has none."""
        contribs = self.contribs.get(fwd)
        if not contribs:
            return None
        target = target or self.plain(fwd)
        if fwd not in self.summed:
            self.summed.add(fwd)
            if len(contribs) > 1:
                self.grad_var(fwd, target)
                self.build(self._sums(fwd), list(contribs), [target])
                self.contribs[fwd] = [target]
        return self.contribs[fwd][0] if len(self.contribs[fwd]) == 1 else target

    def sink(self, fwd: str, target: str) -> bool:
        """Leave ``fwd``'s final gradient in ``target`` (a variable of an enclosing block);
        False when it has none."""
        contribs = self.contribs.get(fwd)
        if not contribs:
            return False
        copy = registry.SUMS_ARRAYS if self.is_array(fwd) else registry.COPIES
        if len(contribs) > 1 and fwd not in self.summed:
            self.summed.add(fwd)
            self.build(self._sums(fwd), list(contribs), [target])
        elif len(contribs) == 1 and fwd not in self.summed and \
                self.written_here(contribs[0]):
            self._rename_output(contribs[0], target)  # written here: write it where wanted
        else:
            self.build(copy, [self.finish(fwd)], [target])
        return True

    def append(self, op_type, inputs, outputs, attrs=None):
        with self.program._op_role_guard(OP_ROLE_BACKWARD):
            op = self.block.append_op(op_type, inputs=inputs, outputs=outputs, attrs=attrs)
        if self._outputs_here is not None:
            self._outputs_here.update(op.output_arg_names)
        return op

    def written_here(self, name: str) -> bool:
        """Whether an op of this walk's block writes ``name`` (an index of the block's outputs
        built once, kept up to date by :meth:`append` and :meth:`_rename_output`)."""
        if self._outputs_here is None:
            self._outputs_here = {n for op in self.block.ops for n in op.output_arg_names}
        return name in self._outputs_here

    def build(self, trait: str, reads: list, writes: list):
        """Append the op declared ``trait`` (:func:`_builder`) reading ``reads`` into
        ``writes``."""
        op_type, x, out = _builder(trait)
        return self.append(op_type, {x: reads}, {out: writes})

    def _sums(self, fwd: str) -> str:
        return registry.SUMS_ARRAYS if self.is_array(fwd) else registry.SUMS

    def seed(self, fwd: str, name: str) -> None:
        """``fwd``'s gradient is the value of ``name`` (bound from outside the walk)."""
        self.grad_of[name] = fwd
        self.contribs[fwd] = [name]
        self.summed.add(fwd)

    def write_target(self, fwd: str) -> str:
        """The name a new contribution to ``fwd``'s gradient is written to."""
        contribs = self.contribs.setdefault(fwd, [])
        self.summed.discard(fwd)   # (a seeded gradient read after an overwrite gets more)
        plain = self.plain(fwd)
        name = plain if not contribs else f"{plain}@RENAME@{len(contribs)}"
        if len(contribs) == 1 and contribs[0] == plain:
            # the first contribution took the plain name: move it aside, the sum gets it
            first = f"{plain}@RENAME@0"
            self._rename_output(contribs[0], first)
            contribs[0] = first
            self.grad_var(fwd, first)
        contribs.append(name)
        self.grad_var(fwd, name)
        return name

    def _rename_output(self, old: str, new: str) -> None:
        if self._outputs_here is not None:
            self._outputs_here.add(new)  # (old may still be written by another op: kept)
        for names in self.pending.values():  # the grad op being built (x * x: two outputs)
            if old in names:
                names[names.index(old)] = new
                return
        for op in reversed(self.block.ops):
            if old in op.output_arg_names:
                _rename_written(op, old, new)
                return


    # -- one forward op ----
    def grad_ops_for(self, op) -> None:
        opdef = registry.get(op.type)
        if opdef.grad is registry.NO_GRAD_YET:
            raise ProgramError(f"{op._describe()}: its gradient is not implemented yet, so "
                               f"append_backward cannot differentiate through it")
        self.check_kept_values(op)
        specs = opdef.grad(op)
        out_grads = {grad_var_name(n): n for n in op.output_arg_names}
        in_grads = {grad_var_name(n): n for n in op.input_arg_names}
        carried = set(op.input_arg_names) & set(op.output_arg_names) \
            if _control_kind(op, opdef) == registry.LOOP else set()
        bound_inputs = []
        for spec in specs:   # first every out-grad is read: the op's outputs' gradients
            grad_def = registry.get(spec.type)
            inputs, seeds = {}, {}
            for slot, names in spec.inputs.items():
                in_slot = grad_def.input_slot(slot)
                optional = in_slot is not None and (in_slot.duplicable or in_slot.dispensable)
                bound = []
                for n in names:
                    if n not in out_grads:
                        bound.append(n)
                        continue
                    fwd = out_grads[n]
                    have = self.finish(fwd) if self.needs_grad(fwd) else None
                    if have is None and optional and self.is_array(fwd) and \
                            fwd in carried and self.needs_grad(fwd):
                        # a tensor array a loop reads and writes, unused after it: no
                        # gradient flows in, but one flows between its steps; bound to a
                        # variable that holds none, which the loop's grad op reads as zeros
                        have = self.grad_var(fwd, f"{self.plain(fwd)}@NONE")
                    if have is None and optional and (self.is_array(fwd) or
                                                      not self._is_float(fwd)):
                        bound.append(EMPTY_VAR_NAME)  # no gradient: the grad op knows zeros
                        continue
                    if have is None:  # no consumer of this output produced a gradient
                        have = self.zeros_like(fwd)
                    bound.append(have)
                    seeds[fwd] = have
                inputs[slot] = bound
            bound_inputs.append((inputs, seeds))
        # ... then the op's outputs are values of their own: what comes next is for the inputs
        self.new_versions(op.output_arg_names)
        for spec, (inputs, seeds) in zip(specs, bound_inputs):
            grad_def = registry.get(spec.type)
            outputs, any_out, role_var, sinks = {}, False, [], {}
            self.pending = outputs
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
                    sinks[fwd] = target
                    any_out = True
                    v = self.fwd_var(fwd)
                    if isinstance(v, Parameter):
                        role_var += [fwd, grad_var_name(fwd)]
                outputs[slot] = bound
            self.pending = {}
            if not any_out:
                continue
            attrs = dict(spec.attrs)
            for name, value in spec.attrs.items():
                spec_attr = grad_def.attrs.get(name)
                if spec_attr is not None and spec_attr.type == registry.A.BLOCK:
                    attrs[name] = self.grad_block(op, self.program.block(value), seeds, sinks).idx
            if role_var:
                attrs["op_role_var"] = role_var
            self.check_forward_reads(op, inputs)
            self.declare_forward_names(inputs)
            self.append(spec.type, inputs, outputs, attrs)

    def _is_float(self, name: str) -> bool:
        v = self.fwd_var(name)
        return v is not None and v.dtype is not None and v.dtype.kind == "f"

    def check_kept_values(self, op) -> None:
        """A branch op (sub-block, not a loop) that writes a variable it does not read leaves
        it as it was when its condition fails; the gradient of that earlier value is not
        passed back. Refuse when an op on the gradient path wrote that earlier value."""
        for n in op.output_arg_names:
            branch = self.maybe_kept.get(n)
            if branch is not None and self.needs_grad(n):
                raise ProgramError(
                    f"{branch._describe()}: may leave {n!r} as {op._describe()} wrote it (when "
                    f"its condition does not hold), and the gradient cannot pass back to that "
                    f"value; read {n!r} in the block as well (then it is one of its inputs) or "
                    f"write the branch's result to a new variable (cond, select_input)")
        self.note_branch(op)

    def note_branch(self, op) -> None:
        opdef = registry.lookup(op.type)
        is_branch = opdef is not None and _control_kind(op, opdef) == registry.BRANCH
        if is_branch:
            for n in set(op.output_arg_names) - set(op.input_arg_names):
                self.maybe_kept[n] = op

    def check_forward_reads(self, op, inputs: dict) -> None:
        """In a grad block, a forward value of an enclosing block's variable is read from the
        step scope's ``saved`` inputs (or, for a variable the op does not read, the enclosing
        env): the value each run started with. Where the grad op needs another one (the
        variable was overwritten earlier in the sub-block's run, or by this op), it reads a
        copy made in the forward block right after that write instead (a variable of the
        sub-block, which each run's step scope keeps)."""
        if self.owner is None:
            return
        at = self.position.get(id(op), -1)
        first_write = self.first_write
        own = set(op.output_arg_names) - set(op.input_arg_names)
        for names in inputs.values():
            for k, n in enumerate(names):
                if n == EMPTY_VAR_NAME or n in self.grad_of or \
                        not (first_write.get(n, at) < at or n in own):
                    continue
                v = self.fwd._find_var_recursive(n)
                if v is None or self._declared_inside(v.block):
                    continue
                if self.repeats or n in self.saved_names:
                    names[k] = self._kept_copy(op, v, n in own)

    def _kept_copy(self, op, var, own: bool) -> str:
        """The name of a copy of ``var`` taken in the forward block right after the write that
        ``op`` reads (``op``'s own when ``own``, else the last one before ``op``)."""
        ops = self.fwd.ops
        at = next(i for i, o in enumerate(ops) if o is op)
        writer = at if own else max(i for i in range(at) if var.name in ops[i].output_arg_names)
        key = (id(ops[writer]), var.name)
        if key not in self.kept:
            holder = var.type in (VarType.LOD_TENSOR, VarType.LOD_TENSOR_ARRAY)
            copy = self.fwd.create_var(
                name=unique_name.generate(f"{var.name}@KEPT"), type=var.type,
                shape=var.shape if holder else None, dtype=var.dtype if holder else None,
                lod_level=var.lod_level if holder else 0, stop_gradient=True)
            op_type, x, out = _builder(registry.COPIES)
            self.fwd._insert_op(writer + 1, op_type, inputs={x: [var.name]},
                                outputs={out: [copy.name]})
            self.kept[key] = copy.name
        return self.kept[key]

    def _declared_inside(self, block) -> bool:
        b = block
        while b is not None:
            if b is self.fwd:
                return True
            b = b.parent_block
        return False

    def declare_forward_names(self, inputs: dict) -> None:
        """Forward variables of the sub-block a grad op reads, declared in the grad block too
        (the grad block's parent is not the forward sub-block)."""
        if self.block is self.fwd:
            return
        for names in inputs.values():
            for n in names:
                if n == EMPTY_VAR_NAME or self.block.has_var(n):
                    continue
                v = self.fwd._find_var_recursive(n)
                if v is None:
                    continue
                if self.block._find_var_recursive(n) is not None and \
                        not self._declared_inside(v.block):
                    continue  # (a sub-block's own variable may shadow an outer one: declared)
                holder = v.type in (VarType.LOD_TENSOR, VarType.LOD_TENSOR_ARRAY)
                self.block.create_var(name=n, shape=v.shape if holder else None,
                                      dtype=v.dtype if holder else None, type=v.type,
                                      lod_level=v.lod_level if holder else 0,
                                      stop_gradient=True)

    def grad_block(self, op, fwd_block, seeds: dict, sinks: dict):
        """The grad block of ``op``'s sub-block ``fwd_block``. ``seeds``: each output of ``op``
        with a gradient -> the name it is read under; ``sinks``: each input of ``op`` whose
        gradient is wanted -> the variable (of this walk's block) the grad block leaves it in.
        """
        keep = self.program.current_block_idx
        g = self.program._create_block(parent_idx=self.block.idx)
        self.program.current_block_idx = keep
        g.desc.forward_block_idx = fwd_block.idx
        carried = set(op.input_arg_names) & set(op.output_arg_names)
        sub = _Backward(self.program, self.no_grad, fwd_block, g,
                        self.force | {n for n in carried if self._is_float(n)})
        opdef = registry.get(op.type)
        sub.owner = op
        sub.saved_names = set(op.input_arg_names)  # the step scope's ``saved`` values
        sub.repeats = _control_kind(op, opdef) == registry.LOOP  # one run per iteration
        for fwd, name in seeds.items():
            if sub.needs_grad(fwd):
                sub.seed(fwd, name)
        links = opdef.control.state_links if opdef.control is not None else None
        pairs = list(zip(op.attr(links[0]), op.attr(links[1]))) if links else []
        for _, state in pairs:   # each state's gradient comes from the next run
            if sub.needs_grad(state):
                name = grad_var_name(state)
                sub.declare_grad_holder(state, name)
                if sub.contribs.get(state):
                    sub.contribs[state].append(name)
                    sub.summed.discard(state)
                else:
                    sub.seed(state, name)
        sub.walk(set(sub.contribs))
        for fwd, target in sinks.items():
            if fwd_block.has_var(fwd) and list(fwd_block.var(fwd).shape) != \
                    list(self.fwd_var(fwd).shape):
                # the body's own variable of that name (a recurrent op's step input): its
                # gradient stays in the grad block, under fwd@GRAD; the grad op gathers it
                target = grad_var_name(fwd)
                sub.declare_grad_holder(fwd, target)
            sub.sink(fwd, target)
        for ex, _ in pairs:      # ... and each ex-state's goes to the run before
            if sub.needs_grad(ex):
                name = grad_var_name(ex)
                sub.declare_grad_holder(ex, name)
                sub.sink(ex, name)
        return g

    def declare_grad_holder(self, fwd: str, name: str) -> None:
        """Declare ``name`` in this walk's block, a gradient shaped like ``fwd``."""
        if not self.block.has_var(name):
            v = self.fwd._var_recursive(fwd)
            self.block.create_var(name=name, shape=v.shape, dtype=v.dtype,
                                  lod_level=v.lod_level, stop_gradient=True)
        self.grad_of[name] = fwd

    def zeros_like(self, fwd: str) -> str:
        name = self.grad_var(fwd, f"{self.plain(fwd)}@ZERO")
        if not self.written_here(name):
            self.declare_forward_names({"": [fwd]})
            self.build(registry.ZEROS_LIKE, [fwd], [name])
        return name


def _seed(bw: _Backward, target: Variable, seed) -> None:
    name = bw.grad_var(target.name)
    bw.contribs[target.name] = [name]
    bw.summed.add(target.name)
    with bw.program._op_role_guard(OP_ROLE_BACKWARD | OP_ROLE_LOSS):
        if seed is None:
            op_type, _, out = _builder(registry.FILLS)
            bw.block.append_op(op_type, outputs={out: [name]},
                               attrs={"shape": list(target.shape), "value": 1.0,
                                      "dtype": registry_dtype(target)})
        else:
            op_type, x, out = _builder(registry.COPIES)
            bw.block.append_op(op_type, inputs={x: [seed]}, outputs={out: [name]})


def registry_dtype(var: Variable) -> int:
    from pdjit.framework import dtypes

    return dtypes.to_code(var.dtype)


def _control_kind(op, opdef):
    """LOOP or BRANCH for an op owning a sub-block: its ControlFlow declaration, else (an op
    registered without one) LOOP when it records step scopes (an output of type STEP_SCOPES),
    BRANCH otherwise; None for an op without a sub-block."""
    if opdef.control is not None:
        return opdef.control.kind
    if not any(op.attr_type(a) == registry.A.BLOCK for a in op.attr_names):
        return None
    scopes = any((v := op.block._find_var_recursive(n)) is not None
                 and v.type == pb.VarType.STEP_SCOPES for n in op.output_arg_names)
    return registry.LOOP if scopes else registry.BRANCH


def _run(program, targets, seeds, no_grad_set, sources=()) -> _Backward:
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
    bw.sources = _names(sources)
    bw.walk({t.name for t in targets})
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
        g = bw.final(p.name)
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
    bw = _run(program, list(targets), list(seeds), no_grad_set, inputs)
    outs = []
    for x in inputs:
        g = bw.final(x.name)
        outs.append(program.global_block().var(g) if g is not None else None)
    return outs


def _rename_written(op, old: str, new: str) -> None:
    """Rename output ``old`` of ``op`` and, when ``op`` owns grad blocks, in the ops of those
    blocks that leave the gradient there for it."""
    op._rename_output(old, new)
    for name in op.attr_names:
        if op.attr_type(name) == registry.A.BLOCK:
            for inner in op.block.program.block(op.attr(name)).ops:
                if old in inner.output_arg_names:
                    _rename_written(inner, old, new)
