"""A loop around a generated segment: ``while cond: body`` inside one native function (CPU).

The body is a :class:`~pdjit.codegen.lowering.SegmentGen` already generated for the loop's
body block. :meth:`LoopGen.source` wraps its lines in a ``while`` whose condition is re-read from
the condition value's latest array at the end of every iteration, so one call runs the whole
loop with no Python per iteration.

Guarantees of the generated function:

- it takes the values the body reads from outside plus the initial values of every carried
  value the body writes without reading it first (in ``LoopGen.args`` order) and returns the
  final value of every carried value (``LoopGen.outputs``); with zero iterations it returns
  the initial values;
- it never writes into an array it was given (lowerings never write their inputs): every
  iteration's results are new arrays, and the carried values are rebound to them all at once at
  the end of the iteration, so a swap of two carried values is a swap;
- a carried value whose shape changes from one iteration to the next, or a condition that does
  not hold exactly one element, raises ``ValueError`` (the caller then runs the loop with the
  reference semantics on the untouched inputs);
- a loop whose condition still holds after ``PDJIT_MAX_LOOP_ITERATIONS`` iterations
  (``pdjit.framework.limits``, read when the loop is generated) raises ``ValueError`` with
  :data:`LIMIT_MESSAGE`, which the caller turns into the error naming the loop that the loop
  op's reference raises (without running the loop again);
- the source names no variable and no size, so equal loops share one cache entry;
- a random op of the body (its lowering draws through ``ctx.rng_key``) gets, after the carried
  values' arguments, one argument per op (``LoopGen.rng_ops``): its key with the enclosing loops'
  iterations but not this one's (``RunContext.rng_key`` in the env the loop op runs in); the
  loop derives iteration ``i``'s key from it as ``random.iteration_key`` does (splitmix64's
  finaliser of ``key ^ i``), so the draws are those of the reference, iteration by iteration. An
  op with a fixed seed draws with its argument in every iteration, as the reference does.
"""
from __future__ import annotations

from pdjit.codegen.lowering import Declined, SegmentGen
from pdjit.codegen.target import get_target
from pdjit.framework import limits, registry
from pdjit.framework.random import fixed_seed
from pdjit.passes.fusion import REFERENCE, partition
from pdjit.passes.prune import prune

#: what a generated loop raises beyond its iteration bound
LIMIT_MESSAGE = "pdjit: the loop ran past its iteration bound"
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's multipliers (framework.random)

# ops whose traits keep a body out of native code: nested blocks, feeds and fetches, LoD
# offsets (random ops are in when their lowering draws through the key argument)
_NOT_IN_NATIVE_LOOPS = (registry.CONTROL_FLOW, registry.FEED_FETCH, registry.SEQUENCE)


def native_loop(program, op, target: str = "cpu", parallel: bool = False, fetched=()):
    """``(LoopGen, "")`` when the loop op ``op`` (its definition declares
    ``ControlFlow(LOOP, ...)``) can run as one native function, else ``(None, why not)``.

    It can when nothing reads (or ``fetched`` names) its step scopes, it has one
    condition, and its body is one native segment of lowerable ops."""
    control = registry.get(op.type).control
    scopes = [n for n in op.output(control.step_scopes) if n != registry.EMPTY_VAR_NAME] \
        if control.keeps_scopes(op) else []
    if scopes:
        if set(scopes) & set(fetched):
            return None, "its step scopes are fetched"
        readers = [o for b in program.blocks for o in b.ops
                   if any(n in scopes for n in o.input_arg_names)]
        if readers:
            return None, f"its step scopes are read by {readers[0].type}"
    conds = op.input(control.condition)
    if len(conds) != 1:
        return None, "expected one condition"
    body = program.block(op.attr(control.body))
    for bop in body.ops:
        bdef = registry.lookup(bop.type)
        if bdef is None:
            return None, f"body op {bop.type} is not registered"
        for trait in _NOT_IN_NATIVE_LOOPS:
            if bdef.has(trait):
                return None, f"body op {bop.type} is {trait}"
    # what outlives an iteration: the names the body writes that are declared outside it (its
    # own variables live in one iteration's env only)
    carried = {n for bop in body.ops for n in bop.output_arg_names
               if n != registry.EMPTY_VAR_NAME and not body.has_var(n)}
    part = partition(body, prune(body, carried), carried, target=get_target(target))
    if len(part.segments) != 1 or not part.segments[0].native:
        bad = next((g.nodes[0] for s in part.segments for g in s.groups if g.kind == REFERENCE),
                   None)
        return None, (f"body op {bad.label} is not lowerable ({bad.why_not})" if bad is not None
                      else "empty body")
    gen = SegmentGen(part.segments[0], body, carried, parallel=parallel, native=True,
                     target=target)
    try:
        gen.generate()
    except Declined as d:
        return None, f"body op {d.op.type} declines its lowering"
    for bop in (o for g in part.segments[0].groups for o in g.ops):
        if registry.get(bop.type).has(registry.RANDOM) and \
                not any(r is bop for r in gen.rng_requests):
            return None, f"body op {bop.type} is random and its lowering draws no run key"
    try:
        return LoopGen(gen, conds[0]), ""
    except ValueError as e:
        return None, str(e)


class LoopGen:
    """Source of ``while cond: body`` around a generated body segment.

    ``body``: a generated ``SegmentGen`` whose ``outputs`` are the carried values (the values
    the body writes that live outside one iteration). ``cond``: the name of the condition value,
    which the body must write.
    """

    def __init__(self, body, cond: str):
        if cond not in body.defined:
            raise ValueError("the loop body never writes its condition")
        if getattr(body, "lod_requests", None):
            raise ValueError("the loop body reads LoD offsets")
        self.body, self.cond = body, cond
        # iterations beyond this bound raise LIMIT_MESSAGE (the caller names the loop)
        self.limit = limits.bound(limits.MAX_LOOP_ITERATIONS)
        # the random ops whose base key is an argument after the carried values (r0...)
        self.rng_ops: list = list(getattr(body, "rng_requests", ()))
        self.args: list = list(body.args)
        self.expected: list = list(body.expected)
        self.outputs: list = list(body.outputs)
        if cond not in self.outputs:
            self.outputs.append(cond)
        # every carried value has a loop variable: its argument, or a new one for its initial value
        self.loop_var: dict = {n: f"a{i}" for i, n in enumerate(self.args)}
        for name in self.outputs:
            if name not in self.loop_var:
                self.loop_var[name] = f"a{len(self.args)}"
                self.args.append(name)
                v = body.block._find_var_recursive(name)
                self.expected.append((v.dtype, len(v.shape)))

    def source(self, fn_name: str) -> str:
        body = self.body
        params = [f"a{i}" for i in range(len(self.args))] + \
            [f"r{k}" for k in range(len(self.rng_ops))]
        lines = [f"def {fn_name}({', '.join(params)}):"]
        cond_var = self.loop_var[self.cond]
        if self.rng_ops:
            lines.append("    it = np.uint64(0)")
        lines.append("    n_iter = 0")
        lines.append(f"    while {cond_var}.reshape(1)[0]:")
        lines.append(f"        if n_iter >= {self.limit}:")
        lines.append(f"            raise ValueError({LIMIT_MESSAGE!r})")
        lines.append("        n_iter += 1")
        for k, op in enumerate(self.rng_ops):
            lines += _iteration_key_lines(f"rng{k}", f"r{k}", "it", fixed_seed(op) != 0)
        if self.rng_ops:
            lines.append("        it += np.uint64(1)")
        self.body_line = len(lines) + 1   # the body's first line (``group_lines``)
        lines += ["    " + line for line in body.lines]
        changed = [n for n in self.outputs if body.current[n] != self.loop_var[n]]
        for n in changed:
            new, old = body.current[n], self.loop_var[n]
            lines.append(f"        if {new}.shape != {old}.shape:")
            lines.append("            raise ValueError('pdjit: a loop-carried value changed "
                         "shape')")
        if changed:
            lhs = "".join(f"{self.loop_var[n]}, " for n in changed)
            rhs = "".join(f"{body.current[n]}, " for n in changed)
            lines.append(f"        ({lhs}) = ({rhs})")
        lines.append("    return (" + "".join(f"{self.loop_var[n]}, " for n in self.outputs) + ")")
        return "\n".join(lines)


def _iteration_key_lines(key: str, base: str, it: str, fixed: bool) -> list:
    """Lines (in the loop) setting ``key`` to ``random.iteration_key(base, it)`` in uint64
    arithmetic (wrapping as the finaliser's), or to ``base`` for an op with a fixed seed."""
    if fixed:
        return [f"        {key} = {base}"]
    return [f"        {key} = {base} ^ {it}",
            f"        {key} = ({key} ^ ({key} >> np.uint64(30))) * np.uint64({_M1:#x})",
            f"        {key} = ({key} ^ ({key} >> np.uint64(27))) * np.uint64({_M2:#x})",
            f"        {key} = {key} ^ ({key} >> np.uint64(31))"]
