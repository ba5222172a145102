"""How LoD offsets flow through the ops of one native segment.

Native code computes arrays only; the LoD of what it returns is worked out here, with the same
rules as the reference interpreter (``pdjit.runtime.interpreter``): an op's ``out_lod`` rule gives
the LoD of the outputs it names; any other output whose variable has ``lod_level > 0`` takes
the LoD of the op's first input that carries one, when its rows match. The walk over the
segment's ops is prepared once per plan (:class:`LoDFlow`) and costs a few dict operations per
op at run time, and nothing when no input carries a LoD and no op needs one.

Lowerings that loop over offsets ask for them with ``LowerContext.lod(slot, level)``: each such
request becomes an extra ``int64`` argument of the native function, bound here from the LoD the
value has when its op runs.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import registry
from pdjit.runtime.tensor import LoDTensor, check_offsets, device_holder

_NO_OFFSETS = np.zeros(0, np.int64)
_NO_OFFSETS.flags.writeable = False


def first_lod(in_lods):
    """The first LoD among an op's inputs: ``in_lods`` lists ``(slot, duplicable, [the LoD of
    each value it binds])`` in slot order (a LoD is a sequence of offset sequences, empty when
    the value has none); None when no input has one."""
    return next((lod for _, _, lods in in_lods for lod in lods if len(lod)), None)


def rule_lods(opdef, attrs, in_lods, to_rule=None) -> dict:
    """``{output slot: LoD or [LoD]}`` from the op's ``out_lod`` rule (``{}`` without one), the
    rule both executors apply; ``to_rule`` converts each LoD to the lists the rule takes.
    Raises :class:`~pdjit.framework.registry.ValueDependentLoD` when the rule needs values,
    and the rule's own errors for LoDs it refuses."""
    if opdef.out_lod is None:
        return {}
    conv = to_rule or (lambda lod: lod)
    given = {slot: [conv(lod) for lod in lods] if dup else (conv(lods[0]) if lods else [])
             for slot, dup, lods in in_lods}
    return opdef.call_out_lod(given, attrs)


def output_lod(slot: str, duplicable: bool, i: int, rule: dict, first, has_level: bool,
               rows=None):
    """``(LoD, ruled)`` for value ``i`` of output ``slot``: the rule's when it names the slot;
    else the first input LoD when the output's variable has a LoD level (and, when ``rows`` is
    given, the value has as many rows as that LoD covers); else ``(None, False)``."""
    if slot in rule:
        return (rule[slot][i] if duplicable else rule[slot]), True
    if first is not None and has_level and (rows is None or rows == first[-1][-1]):
        return first, False
    return None, False


class LoDUnavailable(Exception):
    """The native step cannot know a LoD (missing where a lowering needs it, value-dependent, or
    not fitting an output): run the references, which give the answer or the precise error."""


class _OpFlow:
    __slots__ = ("opdef", "attrs", "ins", "outs", "requests", "dim0")

    def __init__(self, opdef, attrs, ins, outs):
        self.opdef, self.attrs, self.ins, self.outs = opdef, attrs, ins, outs
        self.requests = []            # [(position in the extra args, name, level, optional)]


class LoDFlow:
    """The LoD rules of a segment's ops, in order. ``requests``: ``(op, env name, level,
    optional)`` per offsets argument the generated function takes, in argument order."""

    def __init__(self, ops, requests=()):
        self._ops, self._requests = ops, list(requests)
        self.n_requests = len(self._requests)
        # with neither a rule nor a request, inputs without LoD give outputs without LoD (then
        # a run without LoD inputs never asks for the rules: built at the first that does)
        self.always = bool(self._requests) or any(
            registry.get(op.type).out_lod is not None for op, _ in ops)

    def __getattr__(self, name):
        if name in ("flows", "refuse"):
            self._build()
            return self.__dict__[name]
        raise AttributeError(name)

    def _build(self) -> None:
        """The rules, built into locals and published together at the end: concurrent first
        runs (a plan shared by threads) may each build them, never see half of them."""
        ops, requests = self._ops, self._requests
        flows = []
        by_op = {}
        for op, _ in ops:
            opdef = registry.get(op.type)
            block = op.block
            ins = [(s.name, s.duplicable,
                    [n for n in op.input(s.name) if n != registry.EMPTY_VAR_NAME])
                   for s in opdef.inputs]
            ins = [x for x in ins if x[2]]
            outs = []
            for s in opdef.outputs:
                names = []
                for n in op.output(s.name):
                    var = block._find_var_recursive(n) if n != registry.EMPTY_VAR_NAME else None
                    names.append((n, bool(var is not None and var.lod_level)))
                outs.append((s.name, s.duplicable, names))
            # build-time first dims: an input's LoD passes to an output (not ruled) only when
            # they agree (the reference checks the run-time rows; intermediates' rows are not
            # seen here)
            dim0 = {}
            for n in [n for _, _, ns in ins for n in ns] + [n for _, _, ns in outs for n, _ in ns]:
                var = block._find_var_recursive(n)
                dim0[n] = var.shape[0] if var is not None and var.shape else None
            attrs = {k: v for k, v in op.all_attrs().items() if k in opdef.attrs}
            flow = _OpFlow(opdef, attrs, ins, outs)
            flow.dim0 = dim0
            by_op[id(op)] = flow
            flows.append(flow)
        for pos, (op, name, level, optional) in enumerate(requests):
            by_op[id(op)].requests.append((pos, name, level, optional))
        # a control-flow op (a native loop) says nothing of LoD: LoD inputs run its reference
        refuse = any(f.opdef.has(registry.CONTROL_FLOW) for f in flows)
        self.__dict__.update(flows=flows, refuse=refuse)

    def resolve(self, arg_lods: dict):
        """``({name: (lod arrays, from a rule)}, extra offsets args)`` for one run, from the LoDs
        of the segment's arguments; :class:`LoDUnavailable` when a needed LoD is missing."""
        if self.refuse and arg_lods:
            raise LoDUnavailable("a control-flow op does not propagate LoD natively")
        lods = {n: (lod, False) for n, lod in arg_lods.items()}
        extra = [None] * self.n_requests
        for f in self.flows:
            for pos, name, level, optional in f.requests:
                lod = lods.get(name, ((), False))[0]
                if not lod or not -len(lod) <= level < len(lod):
                    if not optional:
                        raise LoDUnavailable(f"{name!r} has no LoD level {level}")
                    extra[pos] = _NO_OFFSETS
                else:
                    extra[pos] = lod[level]
            in_lods = [(slot, dup, [lods.get(n, ((), False))[0] for n in names])
                       for slot, dup, names in f.ins]
            first = first_lod(in_lods)
            carrier = next((n for _, _, names in f.ins for n in names
                            if len(lods.get(n, ((), False))[0])), None)
            try:
                rule = rule_lods(f.opdef, f.attrs, in_lods,
                                 to_rule=lambda lod: [a.tolist() for a in lod])
            except registry.ValueDependentLoD:
                raise LoDUnavailable("the output LoD depends on values") from None
            except (ValueError, IndexError, KeyError, TypeError) as e:
                raise LoDUnavailable(str(e)) from None
            for slot, dup, names in f.outs:
                for i, (n, has_level) in enumerate(names):
                    rows_agree = carrier is not None and f.dim0.get(n) == f.dim0.get(carrier)
                    lod, ruled = output_lod(slot, dup, i, rule, first, has_level and rows_agree)
                    if ruled:
                        try:
                            lods[n] = (check_offsets(lod or [], None), True)
                        except ValueError as e:
                            raise LoDUnavailable(str(e)) from None
                    else:
                        lods[n] = (lod, False) if lod is not None else ((), False)
        return lods, extra

    @staticmethod
    def attach(name: str, value, lods: dict):
        """``value`` as the env holds it: a LoDTensor when its LoD is non-empty and fits (a
        device array's too: the cuda target's LoD values stay on the device)."""
        lod, ruled = lods.get(name, ((), False))
        if not lod or (type(value) is not np.ndarray and device_holder(value) is None):
            return value
        if value.ndim and value.shape[0] == lod[-1][-1]:
            return LoDTensor._wrap(value, lod)
        if ruled:
            raise LoDUnavailable(f"output {name!r}: its LoD does not fit its rows")
        return value
