"""Export an inference program and its parameters to ONNX (``to_onnx``).

``to_onnx(program, params, feed_names, fetch_names)`` converts the global block of an inference
program into a serialized ONNX ``ModelProto``: the feeds become graph inputs (a ``-1`` dim becomes
the symbolic dim ``N`` for dim 0, ``<feed>_d<i>`` elsewhere), the parameters the converted ops
read become initializers, and the fetches become graph outputs. Its use is to run the *same*
model with the *same* weights in another runtime (``pdjit bench --compare onnxruntime``).

This is an exporter to a foreign format, not a pass: ONNX's operator set is not pdjit's, so the
conversions are small functions registered per op type in :mod:`pdjit.io.onnx_rules`
(``@onnx_rule(type)`` beside each), each writing the ONNX nodes of one op; the exporter looks
them up by type and names no op. Ops declared ``FEED_FETCH`` are skipped, and so is every op
that no fetch needs. An op without a conversion, or an attribute form a conversion does not
take, raises ``NotImplementedError`` naming the op (``onnx export: op <type> #<idx> (block 0)
...``). The rules' semantics are the inference ones (see :mod:`pdjit.io.onnx_rules`).

``onnx`` is an optional dependency (the ``compare`` extra), imported when ``to_onnx`` runs.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import registry

__all__ = ["to_onnx"]

_MIN_OPSET = 15  # Shape(start, end), HardSwish, Squeeze/Unsqueeze with axes inputs
_COPY = object()  # a reshape target dim copied from the input's dim at the same index (0)


def _import_onnx():
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("pdjit.io.onnx_export needs the 'onnx' package: "
                          "pip install -e '.[compare]'") from e
    return onnx, helper, numpy_helper


def to_onnx(program, params: dict, feed_names, fetch_names, opset: int = 17) -> bytes:
    """The global block of ``program`` as a serialized ONNX ``ModelProto``.

    ``params`` maps parameter names to arrays (what the program's persistable variables hold);
    ``feed_names`` become the graph's inputs and ``fetch_names`` its outputs, in that order.
    """
    from pdjit.io.onnx_rules import RULES
    onnx, helper, _ = _import_onnx()
    top = onnx.defs.onnx_opset_version()
    if not _MIN_OPSET <= int(opset) <= top:
        raise ValueError(f"onnx export: opset must be in {_MIN_OPSET}..{top} (this onnx "
                         f"package), got {opset}")
    feed_names, fetch_names = list(feed_names), list(fetch_names)
    ex = _Exporter(program, params, int(opset))
    ex.add_inputs(feed_names)
    for idx in ex.needed_ops(fetch_names):
        op = ex.block.ops[idx]
        convert = RULES.get(op.type)
        ex.op, ex.op_idx = op, idx
        if convert is None:
            raise NotImplementedError(f"onnx export: op {op.type} #{idx} (block 0) has no ONNX "
                                      f"conversion")
        convert(ex, op)
    ex.op = None
    graph = ex.finish(fetch_names)
    opsets = [helper.make_opsetid("", int(opset))]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="pdjit",
                              ir_version=helper.find_min_ir_version_for(opsets))
    return model.SerializeToString()


class _Exporter:
    """The graph being built: nodes, initializers, and which ONNX name holds each pdjit
    variable's current value (a variable written twice gets a fresh name the second time)."""

    def __init__(self, program, params: dict, opset: int):
        _, self.helper, self.numpy_helper = _import_onnx()
        self.block = program.global_block()
        self.params = params
        self.opset = opset
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.cur: dict = {}  # pdjit var -> ONNX name of its current value
        self.taken: set = set()
        self.graph_inputs: set = set()
        self.op, self.op_idx = None, -1

    # -- errors ----------------------------------------------------------------------------------
    def where(self) -> str:
        return f"onnx export: op {self.op.type} #{self.op_idx} (block 0)"

    def unsupported(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"{self.where()}: {what} has no ONNX conversion")

    # -- variables -------------------------------------------------------------------------------
    def var_desc(self, name: str):
        v = self.block._find_var_recursive(name)
        if v is None:
            raise ValueError(f"onnx export: variable {name!r} is not declared in the program's "
                             f"global block")
        return v

    def shape(self, name: str) -> tuple:
        return tuple(int(d) for d in self.var_desc(name).shape)

    def dtype(self, name: str) -> np.dtype:
        return np.dtype(self.var_desc(name).dtype)

    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.taken:
            k += 1
            name = f"{hint}__{k}"
        self.taken.add(name)
        return name

    def define(self, var: str) -> str:
        """A new ONNX name for a new value of ``var``."""
        name = self.fresh(var)
        self.cur[var] = name
        return name

    def is_param(self, var: str) -> bool:
        return var not in self.cur and var in self.params

    def param(self, var: str):
        """The array of ``var`` when it is a parameter no converted op has written, else None."""
        return np.asarray(self.params[var]) if self.is_param(var) else None

    def value(self, var: str) -> str:
        """The ONNX name holding ``var``'s value here (a parameter becomes an initializer)."""
        if var in self.cur:
            return self.cur[var]
        if var in self.params:
            arr = np.ascontiguousarray(self.params[var])
            v = self.block._find_var_recursive(var)
            if v is not None:
                want = tuple(int(d) for d in v.shape)
                if len(want) != arr.ndim or any(w >= 0 and w != g
                                                for w, g in zip(want, arr.shape)):
                    raise ValueError(f"onnx export: parameter {var!r} has shape "
                                     f"{list(arr.shape)} but the program declares "
                                     f"{list(want)}")
            name = self.define(var)
            self.inits.append(self.numpy_helper.from_array(arr, name))
            return name
        v = self.block._find_var_recursive(var)
        if self.op is None:
            raise ValueError(f"onnx export: fetch {var!r} is neither fed nor computed by the "
                             f"program's ops")
        if v is not None and v.persistable:
            raise ValueError(f"{self.where()} reads the persistable variable {var!r}, which "
                             f"params does not hold")
        raise NotImplementedError(f"{self.where()} reads {var!r}, which is not fed, not in "
                                  f"params, and not written by an earlier converted op (or is "
                                  f"an output the conversion does not write)")

    def inp(self, op, slot: str) -> str:
        names = op.input(slot)
        if len(names) != 1:
            raise ValueError(f"{self.where()}: expected one variable in slot {slot}, got "
                             f"{names}")
        return self.value(names[0])

    def has(self, op, slot: str) -> bool:
        return bool(op.input(slot))

    def out_var(self, op, slot: str = "Out") -> str:
        names = op.output(slot)
        if len(names) != 1:
            raise ValueError(f"{self.where()}: expected one variable in output slot {slot}, got "
                             f"{names}")
        return names[0]

    def in_var(self, op, slot: str = "X") -> str:
        return op.input(slot)[0]

    # -- nodes -----------------------------------------------------------------------------------
    def node(self, op_type: str, inputs, out=None, **attrs) -> str:
        """Append an ONNX node with one output; ``out`` is the pdjit variable it defines (else
        a fresh temporary). Returns the output's name."""
        return self.node_n(op_type, inputs, [out], **attrs)[0]

    def node_n(self, op_type: str, inputs, outs, **attrs) -> list:
        """Append an ONNX node; ``outs`` holds per output the pdjit variable it defines or
        None (a fresh temporary). Returns the output names."""
        hint = f"{self.op.type}_{self.op_idx}" if self.op is not None else "t"
        names = [self.fresh(f"{hint}.{op_type}") if v is None else None for v in outs]
        names = [self.define(v) if v is not None else n for v, n in zip(outs, names)]
        self.nodes.append(self.helper.make_node(op_type, list(inputs), names, **attrs))
        return names

    def const(self, value, dtype, hint: str = "c") -> str:
        arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        name = self.fresh(f"{self.op.type}_{self.op_idx}.{hint}" if self.op is not None
                          else hint)
        self.inits.append(self.numpy_helper.from_array(arr, name))
        return name

    def ints(self, values, hint: str = "i64") -> str:
        return self.const(np.asarray(list(values), np.int64).reshape(-1), np.int64, hint)

    def derived_param(self, var: str, arr, how: str) -> str:
        """An initializer holding ``arr`` computed at export time from parameter ``var``."""
        name = self.fresh(f"{var}.{how}")
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def alias(self, var_out: str, onnx_name: str) -> None:
        """Make ``var_out`` hold the value ``onnx_name`` (an Identity node)."""
        self.node("Identity", [onnx_name], out=var_out)

    # -- shapes ----------------------------------------------------------------------------------
    def dims(self, src: str, shape, a: int, b: int):
        """Dims ``a..b-1`` of ``src`` (pdjit shape ``shape``) multiplied: an int when known,
        else a reference read from the tensor at run time."""
        part = shape[a:b]
        if all(d >= 0 for d in part):
            return int(np.prod(part, dtype=np.int64))
        return (src, a, b)

    def reshape(self, x: str, parts, out=None) -> str:
        """Reshape ``x`` to ``parts``: per output dim an int, ``_COPY`` (x's dim at the same
        index) or ``(src, a, b)`` (dims a..b-1 of src multiplied, known at run time only)."""
        dyn = [p for p in parts if isinstance(p, tuple)]
        if len(dyn) <= 1:
            target = [0 if p is _COPY else -1 if isinstance(p, tuple) else int(p) for p in parts]
            return self.node("Reshape", [x, self.ints(target, "shape")], out=out)
        pieces = []
        for j, p in enumerate(parts):
            if p is _COPY:
                p = (x, j, j + 1)
            if isinstance(p, tuple):
                src, a, b = p
                s = self.node("Shape", [src], start=a, end=b)
                pieces.append(s if b - a == 1 else self.node("ReduceProd", [s], keepdims=1))
            else:
                pieces.append(self.ints([p], "dim"))
        target = self.node("Concat", pieces, axis=0)
        return self.node("Reshape", [x, target], out=out)

    def transpose(self, x: str, perm, out=None) -> str:
        return self.node("Transpose", [x], out=out, perm=list(perm))

    # -- the program -----------------------------------------------------------------------------
    def add_inputs(self, feed_names) -> None:
        for name in feed_names:
            v = self.var_desc(name)
            shape = [d if d >= 0 else ("N" if i == 0 else f"{name}_d{i}")
                     for i, d in enumerate(int(d) for d in v.shape)]
            self.inputs.append(self.helper.make_tensor_value_info(
                name, _onnx_type(self.helper, np.dtype(v.dtype), name), shape))
            self.taken.add(name)
            self.cur[name] = name
            self.graph_inputs.add(name)

    def needed_ops(self, fetch_names) -> list:
        """Indices of the ops (not ``FEED_FETCH``) whose outputs the fetches need, in order."""
        for name in fetch_names:
            self.var_desc(name)
        need, keep = set(fetch_names), []
        ops = self.block.ops
        for idx in range(len(ops) - 1, -1, -1):
            op = ops[idx]
            d = registry.lookup(op.type)
            if d is not None and d.has(registry.FEED_FETCH):
                continue
            outs = set(op.output_arg_names)
            if outs & need:
                keep.append(idx)
                need |= set(op.input_arg_names)
        return keep[::-1]

    def finish(self, fetch_names):
        outputs = []
        for name in fetch_names:
            final = self.value(name)
            if final != name:
                final = self._claim(name, final)
            v = self.var_desc(name)
            shape = [d if d >= 0 else ("N" if i == 0 else f"{final}_d{i}")
                     for i, d in enumerate(int(d) for d in v.shape)]
            outputs.append(self.helper.make_tensor_value_info(
                final, _onnx_type(self.helper, np.dtype(v.dtype), name), shape))
        return self.helper.make_graph(self.nodes, "pdjit", self.inputs, outputs,
                                      initializer=self.inits)

    def _claim(self, name: str, final: str) -> str:
        """Give the value ``final`` the ONNX name ``name`` (the fetch's own name) when that
        name is free or held by an earlier intermediate value; else an Identity's output."""
        produced = {o for n in self.nodes for o in n.output}
        if final not in produced or name in self.graph_inputs or \
                any(t.name == name for t in self.inits):
            out = self.fresh(f"{name}.out")
            self.nodes.append(self.helper.make_node("Identity", [final], [out]))
            return out
        renames = {final: name}
        if name in self.taken:
            renames[name] = self.fresh(f"{name}.early")
        for n in self.nodes:
            for field in (n.input, n.output):
                for i, s in enumerate(field):
                    if s in renames:
                        field[i] = renames[s]
        self.taken.add(name)
        self.cur = {k: renames.get(v, v) for k, v in self.cur.items()}
        return name


def _onnx_type(helper, dt: np.dtype, name: str) -> int:
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    except (KeyError, TypeError, ValueError):
        raise NotImplementedError(f"onnx export: variable {name!r} has dtype {dt}, which has no "
                                  f"ONNX type") from None
