"""Export an inference program and its parameters to ONNX (``to_onnx``).

``to_onnx(program, params, feed_names, fetch_names)`` converts the global block of an inference
program into a serialized ONNX ``ModelProto``: the feeds become graph inputs (a ``-1`` dim becomes
the symbolic dim ``N`` for dim 0, ``<feed>_d<i>`` elsewhere), the parameters the converted ops
read become initializers, and the fetches become graph outputs. Its use is to run the *same*
model with the *same* weights in another runtime (``pdjit bench --compare onnxruntime``).

This is an exporter to a foreign format, not a pass: ONNX's operator set is not pdjit's, so the
conversions are a table of small functions keyed by op type (``_CONVERTERS``), each writing the
ONNX nodes of one op. That table is the one place where the exporter names ops; nothing else in
pdjit depends on it. ``feed`` and ``fetch`` ops are skipped, and so is every op that no fetch
needs. An op without a conversion, or an attribute form a conversion does not take, raises
``NotImplementedError`` naming the op (``onnx export: op <type> #<idx> (block 0) ...``).

Semantics are the inference ones: ``dropout`` scales by ``1 - p`` (``downgrade_in_infer``) or
passes through (``upscale_in_train``), and ``batch_norm`` normalises with its moving statistics
whatever ``is_test`` says. Windows follow pdjit's op definitions (``pdjit.ops.conv.Geometry``):
``SAME`` padding is computed from the input's (known) spatial size, dilations counting as 1.
An ``avg`` ``pool2d`` whose windows ONNX places or counts differently (``ceil_mode``; or
``exclusive=False`` with unequal paddings) is written as a zero padding, an unpadded
AveragePool and a constant divisor map. ``layer_norm`` exports ``Y`` only (its
``Mean``/``Variance`` outputs are not produced, and reading them is an error).

``onnx`` is an optional dependency (the ``compare`` extra), imported when ``to_onnx`` runs.
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework import dtypes
from pdjit.ops.conv import Geometry
from pdjit.ops.shape import unsqueeze_shape

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
        convert = _CONVERTERS.get(op.type)
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
        """Indices of the ops (not feed/fetch) whose outputs the fetches need, in order."""
        for name in fetch_names:
            self.var_desc(name)
        need, keep = set(fetch_names), []
        ops = self.block.ops
        for idx in range(len(ops) - 1, -1, -1):
            op = ops[idx]
            if op.type in ("feed", "fetch"):
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


# ==== conversions ===============================================================================
def _unary(onnx_type, **fixed):
    def convert(ex, op):
        ex.node(onnx_type, [ex.inp(op, "X")], out=ex.out_var(op), **fixed)
    return convert


def _attr(op, name, default):
    return op.attr(name) if op.has_attr(name) else default


def _scalar(ex, op, value, slot="X", hint="c"):
    """A 0-d initializer of ``value`` in the dtype of ``op``'s input ``slot``."""
    return ex.const(value, ex.dtype(ex.in_var(op, slot)), hint)


# -- matrix products ------------------------------------------------------------------------------
def _mul(ex, op):
    xv, yv = ex.in_var(op, "X"), ex.in_var(op, "Y")
    xs, ys = ex.shape(xv), ex.shape(yv)
    xn, yn = int(op.attr("x_num_col_dims")), int(op.attr("y_num_col_dims"))
    x = ex.inp(op, "X")
    x2 = x if (len(xs) == 2 and xn == 1) else ex.node("Flatten", [x], axis=xn)
    w = ex.param(yv)
    if w is not None:
        y2 = ex.value(yv) if w.ndim == 2 and yn == 1 else ex.derived_param(
            yv, w.reshape(int(np.prod(w.shape[:yn])), -1), "2d")
    else:
        y = ex.inp(op, "Y")
        y2 = y if (len(ys) == 2 and yn == 1) else ex.node("Flatten", [y], axis=yn)
    out = ex.out_var(op)
    if xn == 1 and len(ys) - yn == 1:
        ex.node("MatMul", [x2, y2], out=out)
        return
    m = ex.node("MatMul", [x2, y2])
    parts = [_COPY if (i == 0 and xn == 1) else ex.dims(x, xs, i, i + 1) for i in range(xn)]
    parts += [ex.dims(ex.value(yv), ys, j, j + 1) for j in range(yn, len(ys))]
    ex.reshape(m, parts, out=out)


def _matmul_operand(ex, op, slot, flag):
    var = ex.in_var(op, slot)
    rank = len(ex.shape(var))
    if not flag or rank < 2:  # a vector ignores its transpose flag
        return ex.inp(op, slot)
    w = ex.param(var)
    if w is not None:
        return ex.derived_param(var, np.swapaxes(w, -1, -2), "T")
    perm = list(range(rank))
    perm[-2:] = perm[-1], perm[-2]
    return ex.transpose(ex.inp(op, slot), perm)


def _matmul_with(tx_attr, ty_attr, alpha_attr=None):
    def convert(ex, op):
        x = _matmul_operand(ex, op, "X", bool(_attr(op, tx_attr, False)))
        y = _matmul_operand(ex, op, "Y", bool(_attr(op, ty_attr, False)))
        alpha = float(_attr(op, alpha_attr, 1.0)) if alpha_attr else 1.0
        out = ex.out_var(op)
        if alpha == 1.0:
            ex.node("MatMul", [x, y], out=out)
        else:
            ex.node("Mul", [ex.node("MatMul", [x, y]), _scalar(ex, op, alpha, hint="alpha")],
                    out=out)
    return convert


# -- elementwise with Fluid's axis --------------------------------------------------------------
def _aligned(ex, op, slot, other_slot, axis):
    """``op``'s operand ``slot`` with trailing 1-dims added so that NumPy broadcasting applies
    Fluid's ``axis`` rule (the lower-rank operand's dims start at ``axis``)."""
    var, other = ex.in_var(op, slot), ex.in_var(op, other_slot)
    rank, big = len(ex.shape(var)), len(ex.shape(other))
    if axis == -1 or rank >= big:
        return ex.inp(op, slot)
    if not 0 <= axis <= big - rank:
        raise ValueError(f"{ex.where()}: axis={axis} is out of range for operands of rank "
                         f"{big} and {rank}: expected -1 or 0..{big - rank}")
    trailing = big - rank - axis
    if trailing == 0:
        return ex.inp(op, slot)
    w = ex.param(var)
    if w is not None:
        return ex.derived_param(var, w.reshape(w.shape + (1,) * trailing), f"axis{axis}")
    return ex.node("Unsqueeze", [ex.inp(op, slot), ex.ints(range(rank, rank + trailing),
                                                          "axes")])


def _binary(onnx_type):
    def convert(ex, op):
        axis = int(_attr(op, "axis", -1))
        x = _aligned(ex, op, "X", "Y", axis)
        y = _aligned(ex, op, "Y", "X", axis)
        ex.node(onnx_type, [x, y], out=ex.out_var(op))
    return convert


# -- activations ----------------------------------------------------------------------------------
def _relu6(ex, op):
    t = float(_attr(op, "threshold", 6.0))
    ex.node("Clip", [ex.inp(op, "X"), _scalar(ex, op, 0.0, hint="lo"),
                     _scalar(ex, op, t, hint="hi")], out=ex.out_var(op))


def _hard_swish(ex, op):
    t, s, o = (float(_attr(op, k, d)) for k, d in (("threshold", 6.0), ("scale", 6.0),
                                                     ("offset", 3.0)))
    x, out = ex.inp(op, "X"), ex.out_var(op)
    if (t, s, o) == (6.0, 6.0, 3.0):
        ex.node("HardSwish", [x], out=out)
        return
    gate = ex.node("Clip", [ex.node("Add", [x, _scalar(ex, op, o, hint="offset")]),
                            _scalar(ex, op, 0.0, hint="lo"), _scalar(ex, op, t, hint="hi")])
    ex.node("Div", [ex.node("Mul", [x, gate]), _scalar(ex, op, s, hint="scale")], out=out)


def _hard_sigmoid(ex, op):
    ex.node("HardSigmoid", [ex.inp(op, "X")], out=ex.out_var(op),
            alpha=float(_attr(op, "slope", 0.2)), beta=float(_attr(op, "offset", 0.5)))


def _leaky_relu(ex, op):
    ex.node("LeakyRelu", [ex.inp(op, "X")], out=ex.out_var(op),
            alpha=float(_attr(op, "alpha", 0.02)))


def _elu(ex, op):
    ex.node("Elu", [ex.inp(op, "X")], out=ex.out_var(op), alpha=float(_attr(op, "alpha", 1.0)))


def _selu(ex, op):
    ex.node("Selu", [ex.inp(op, "X")], out=ex.out_var(op),
            alpha=float(_attr(op, "alpha", 1.6732632423543772)),
            gamma=float(_attr(op, "scale", 1.0507009873554805)))


def _swish(ex, op, beta=None):
    x = ex.inp(op, "X")
    beta = float(_attr(op, "beta", 1.0)) if beta is None else beta
    z = x if beta == 1.0 else ex.node("Mul", [x, _scalar(ex, op, beta, hint="beta")])
    ex.node("Mul", [x, ex.node("Sigmoid", [z])], out=ex.out_var(op))


def _gelu(ex, op):
    x, out = ex.inp(op, "X"), ex.out_var(op)
    approximate = bool(_attr(op, "approximate", False))
    if ex.opset >= 20:
        ex.node("Gelu", [x], out=out, approximate="tanh" if approximate else "none")
        return
    c = lambda v, h: _scalar(ex, op, v, hint=h)  # noqa: E731
    if approximate:  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        cube = ex.node("Mul", [ex.node("Mul", [x, x]), x])
        inner = ex.node("Add", [x, ex.node("Mul", [cube, c(0.044715, "k")])])
        t = ex.node("Tanh", [ex.node("Mul", [inner, c(math.sqrt(2.0 / math.pi), "s")])])
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        t = ex.node("Erf", [ex.node("Mul", [x, c(1.0 / math.sqrt(2.0), "s")])])
    half_x = ex.node("Mul", [x, c(0.5, "half")])
    ex.node("Mul", [half_x, ex.node("Add", [t, c(1.0, "one")])], out=out)


def _softmax(ex, op):
    ex.node("Softmax", [ex.inp(op, "X")], out=ex.out_var(op), axis=int(_attr(op, "axis", -1)))


def _scale(ex, op):
    x, out = ex.inp(op, "X"), ex.out_var(op)
    s = ex.inp(op, "ScaleTensor") if ex.has(op, "ScaleTensor") else float(op.attr("scale"))
    b = ex.inp(op, "BiasTensor") if ex.has(op, "BiasTensor") else float(op.attr("bias"))
    as_input = lambda v, h: v if isinstance(v, str) else _scalar(ex, op, v, hint=h)  # noqa: E731
    steps = []
    if bool(_attr(op, "bias_after_scale", True)):
        if s != 1.0:
            steps.append(("Mul", as_input(s, "scale")))
        if b != 0.0:
            steps.append(("Add", as_input(b, "bias")))
    else:
        if b != 0.0:
            steps.append(("Add", as_input(b, "bias")))
        if s != 1.0:
            steps.append(("Mul", as_input(s, "scale")))
    if not steps:
        ex.alias(out, x)
        return
    for i, (kind, operand) in enumerate(steps):
        x = ex.node(kind, [x, operand], out=out if i == len(steps) - 1 else None)


def _dropout(ex, op):
    x, out = ex.inp(op, "X"), ex.out_var(op)
    impl = _attr(op, "dropout_implementation", "downgrade_in_infer")
    p = float(_attr(op, "dropout_prob", 0.5))
    if impl == "upscale_in_train" or p == 0.0:
        ex.alias(out, x)
    elif impl == "downgrade_in_infer":
        ex.node("Mul", [x, _scalar(ex, op, 1.0 - p, hint="keep")], out=out)
    else:
        raise ex.unsupported(f"dropout_implementation={impl!r}")


def _cast(ex, op):
    to = np.dtype(dtypes.to_numpy(int(op.attr("out_dtype"))))
    ex.node("Cast", [ex.inp(op, "X")], out=ex.out_var(op),
            to=_onnx_type(ex.helper, to, ex.out_var(op)))


# -- convolution and pooling ----------------------------------------------------------------------
def _geometry(op) -> Geometry:
    """The window attributes of a convolution or pooling op, as pdjit's ops read them."""
    return Geometry(strides=list(_attr(op, "strides", [1, 1])),
                    paddings=list(_attr(op, "paddings", [0, 0])),
                    padding_algorithm=_attr(op, "padding_algorithm", "EXPLICIT") or "EXPLICIT",
                    dilations=list(_attr(op, "dilations", [1, 1])),
                    data_format=_layout(op, "data_format"), what=op.type)


def _layout(op, attr) -> str:
    fmt = _attr(op, attr, "NCHW")
    return "NCHW" if fmt == "AnyLayout" else fmt


def _nchw_node(ex, onnx_type, x, extra, nhwc, out, **attrs):
    """``onnx_type`` applied to image ``x`` (NCHW, transposed there and back when ``nhwc``)."""
    if not nhwc:
        return ex.node(onnx_type, [x] + extra, out=out, **attrs)
    y = ex.node(onnx_type, [ex.transpose(x, [0, 3, 1, 2])] + extra, **attrs)
    return ex.transpose(y, [0, 2, 3, 1], out=out)


def _window_attrs(g: Geometry, hw, k) -> dict:
    """ONNX ``pads``/``dilations`` (or ``auto_pad``) of window ``k`` over spatial size ``hw``."""
    if g.algo == "SAME" and min(hw) < 0:
        return {"auto_pad": "SAME_UPPER", "dilations": [1, 1]}
    (t, b, d0), (left, r, d1) = (g.window(0, hw[0], k[0]), g.window(1, hw[1], k[1]))
    return {"pads": [t, left, b, r], "dilations": [d0, d1]}


def _conv(ex, op):
    xv, wv = ex.in_var(op, "Input"), ex.in_var(op, "Filter")
    g = _geometry(op)
    xs, ks = ex.shape(xv), ex.shape(wv)
    if len(xs) != 4 or len(ks) != 4:
        raise ex.unsupported(f"a convolution of rank {len(xs)} (Input {list(xs)})")
    k = ks[2:]
    _nchw_node(ex, "Conv", ex.inp(op, "Input"), [ex.inp(op, "Filter")], g.nhwc,
               ex.out_var(op, "Output"), kernel_shape=list(k), strides=list(g.strides),
               group=int(_attr(op, "groups", 1)), **_window_attrs(g, g.spatial(xs), k))


def _conv_transpose(ex, op):
    xv, wv = ex.in_var(op, "Input"), ex.in_var(op, "Filter")
    g = _geometry(op)
    xs, ks = ex.shape(xv), ex.shape(wv)
    if len(xs) != 4 or len(ks) != 4:
        raise ex.unsupported(f"a transposed convolution of rank {len(xs)} (Input {list(xs)})")
    k, hw = ks[2:], g.spatial(xs)
    out_size = list(_attr(op, "output_size", []))
    out_pad = list(_attr(op, "output_padding", []))
    if min(hw) < 0 and (g.algo == "SAME" or out_size):
        raise ex.unsupported(f"padding_algorithm={g.algo!r} / output_size={out_size} with "
                             f"unknown spatial dims {list(hw)}")
    pads, dil, extra = [0, 0, 0, 0], [1, 1], [0, 0]
    for axis in range(2):
        p0, p1, d = g.window(axis, hw[axis], k[axis])
        pads[axis], pads[axis + 2], dil[axis] = p0, p1, d
        if out_size:
            base = (hw[axis] - 1) * g.strides[axis] - p0 - p1 + d * (k[axis] - 1) + 1
            extra[axis] = int(out_size[axis]) - base
        elif out_pad:
            extra[axis] = int(out_pad[axis])
    attrs = dict(kernel_shape=list(k), strides=list(g.strides), pads=pads, dilations=dil,
                 group=int(_attr(op, "groups", 1)))
    if any(extra):
        attrs["output_padding"] = extra
    _nchw_node(ex, "ConvTranspose", ex.inp(op, "Input"), [ex.inp(op, "Filter")], g.nhwc,
               ex.out_var(op, "Output"), **attrs)


def _pool2d(ex, op):
    xv = ex.in_var(op, "X")
    xs = ex.shape(xv)
    if len(xs) != 4:
        raise ex.unsupported(f"pool2d of rank {len(xs)}")
    is_max = _attr(op, "pooling_type", "max") == "max"
    g = _geometry(op)
    hw, ksize = g.spatial(xs), [int(v) for v in op.attr("ksize")]
    x, out = ex.inp(op, "X"), ex.out_var(op)
    global_ = bool(_attr(op, "global_pooling", False))
    adaptive = bool(_attr(op, "adaptive", False)) and not global_
    if adaptive and ksize == [1, 1]:
        global_ = True
    if global_:
        _nchw_node(ex, "GlobalMaxPool" if is_max else "GlobalAveragePool", x, [], g.nhwc, out)
        return
    attrs = {}
    ceil, exclusive = bool(_attr(op, "ceil_mode", False)), bool(_attr(op, "exclusive", True))
    if adaptive:
        if min(hw) < 0 or hw[0] % ksize[0] or hw[1] % ksize[1]:
            raise ex.unsupported(f"adaptive pooling of a {list(hw)} image to {ksize} (the "
                                 f"output must divide the known input)")
        k = [hw[0] // ksize[0], hw[1] // ksize[1]]
        attrs.update(kernel_shape=k, strides=k, pads=[0, 0, 0, 0])
    else:
        win = _window_attrs(g, hw, ksize)
        pads = win.get("pads", [0, 0, 0, 0])
        if not is_max and (ceil or (not exclusive and pads[:2] != pads[2:])):
            _avg_pool_exact(ex, g, x, hw, ksize, exclusive, ceil, out)
            return
        win.pop("dilations")
        attrs.update(kernel_shape=ksize, strides=list(g.strides), **win)
        if ceil:
            attrs["ceil_mode"] = 1
    if not is_max:
        attrs["count_include_pad"] = 0 if (adaptive or exclusive) else 1
    _nchw_node(ex, "MaxPool" if is_max else "AveragePool", x, [], g.nhwc, out, **attrs)


def _avg_pool_exact(ex, g: Geometry, x, hw, ksize, exclusive, ceil, out):
    """Average pooling with Paddle's windows where ONNX's differ (ceil_mode: ONNX drops a last
    window that starts in the padding; exclusive=False with unequal paddings: Paddle clips a
    window at the padding *before*): the image zero-padded to cover every window, an
    AveragePool without padding (so each window divides by its full size), and a constant map
    turning that into Paddle's divisor (the count read in the image, or the clipped length)."""
    if min(hw) < 0:
        raise ex.unsupported(f"an avg pool2d with ceil_mode or unequal paddings over unknown "
                             f"spatial dims {list(hw)}")
    begin, end, factors = [], [], []
    for axis in range(2):
        size, k, s = hw[axis], ksize[axis], g.strides[axis]
        p0, p1, _ = g.window(axis, size, k)
        n_out = (size - k + p0 + p1 + (s - 1 if ceil else 0)) // s + 1
        begin.append(p0)
        end.append(max((n_out - 1) * s + k - size - p0, 0))
        a = np.arange(n_out) * s - p0  # window starts; a window ends k later, not past size + p0
        b = np.minimum(a + k, size + p0)
        divisor = np.minimum(b, size) - np.maximum(a, 0) if exclusive else b - a
        with np.errstate(divide="ignore"):
            factors.append(k / divisor.astype(np.float64))  # 0 read: 0 / 0, as Paddle gives
    dt = ex.dtype(ex.in_var(ex.op, "X"))
    x = ex.transpose(x, [0, 3, 1, 2]) if g.nhwc else x
    padded = ex.node("Pad", [x, ex.ints([0, 0] + begin + [0, 0] + end, "pads")], mode="constant")
    mean = ex.node("AveragePool", [padded], kernel_shape=list(ksize), strides=list(g.strides))
    scale = ex.const(np.outer(factors[0], factors[1]), dt, "divisor")
    if g.nhwc:
        ex.transpose(ex.node("Mul", [mean, scale]), [0, 2, 3, 1], out=out)
    else:
        ex.node("Mul", [mean, scale], out=out)


# -- normalisation --------------------------------------------------------------------------------
def _batch_norm(ex, op):
    xv = ex.in_var(op, "X")
    xs = ex.shape(xv)
    nhwc = _layout(op, "data_layout") == "NHWC" and len(xs) > 2
    c = ex.shape(ex.in_var(op, "Mean"))[0]
    mt = ex.dtype(ex.in_var(op, "Mean"))
    scale = ex.inp(op, "Scale") if ex.has(op, "Scale") else ex.const(np.ones(c), mt, "ones")
    bias = ex.inp(op, "Bias") if ex.has(op, "Bias") else ex.const(np.zeros(c), mt, "zeros")
    x = ex.inp(op, "X")
    if nhwc:
        x = ex.transpose(x, [0, len(xs) - 1] + list(range(1, len(xs) - 1)))
    out = ex.out_var(op, "Y")
    y = ex.node("BatchNormalization", [x, scale, bias, ex.inp(op, "Mean"),
                                       ex.inp(op, "Variance")], out=None if nhwc else out,
                epsilon=float(_attr(op, "epsilon", 1e-5)))
    if nhwc:
        ex.transpose(y, [0] + list(range(2, len(xs))) + [1], out=out)


def _layer_norm(ex, op):
    if ex.opset < 17:
        raise ex.unsupported(f"layer_norm at opset {ex.opset} (LayerNormalization needs 17)")
    xv = ex.in_var(op, "X")
    xs, dt = ex.shape(xv), ex.dtype(xv)
    begin = int(_attr(op, "begin_norm_axis", 1))
    norm_shape = xs[begin:]
    if any(d < 0 for d in norm_shape):
        raise ex.unsupported(f"layer_norm over unknown dims {list(norm_shape)}")

    def affine(slot, fill):
        if not ex.has(op, slot):
            return ex.const(np.full(norm_shape, fill), dt, slot.lower())
        var = ex.in_var(op, slot)
        w = ex.param(var)
        if w is not None:
            return ex.derived_param(var, w.reshape(norm_shape), "nd") \
                if w.shape != norm_shape else ex.value(var)
        return ex.reshape(ex.inp(op, slot), list(norm_shape))

    ex.node("LayerNormalization", [ex.inp(op, "X"), affine("Scale", 1.0), affine("Bias", 0.0)],
            out=ex.out_var(op, "Y"), axis=begin, epsilon=float(_attr(op, "epsilon", 1e-5)))


# -- shapes ---------------------------------------------------------------------------------------
def _flatten_range(ex, op):
    xv = ex.in_var(op, "X")
    xs = ex.shape(xv)
    r = len(xs)
    s, e = int(op.attr("start_axis")), int(op.attr("stop_axis"))
    s, e = (s + r if s < 0 else s), (e + r if e < 0 else e)
    x, out = ex.inp(op, "X"), ex.out_var(op)
    if r == 0 or not 0 <= s <= e < r:
        raise ValueError(f"{ex.where()}: start_axis={op.attr('start_axis')}, stop_axis="
                         f"{op.attr('stop_axis')} do not fit X of shape {list(xs)}")
    if s == 1 and e == r - 1:
        ex.node("Flatten", [x], out=out, axis=1)
        return
    parts = [_COPY if xs[i] < 0 else xs[i] for i in range(s)]
    parts.append(ex.dims(x, xs, s, e + 1))
    parts += [ex.dims(x, xs, i, i + 1) for i in range(e + 1, r)]
    ex.reshape(x, parts, out=out)


def _flatten2(ex, op):
    ex.node("Flatten", [ex.inp(op, "X")], out=ex.out_var(op), axis=int(_attr(op, "axis", 1)))


def _reshape2(ex, op):
    if ex.has(op, "Shape") or ex.has(op, "ShapeTensor"):
        raise ex.unsupported("a reshape by a Shape/ShapeTensor input")
    shape = [int(d) for d in op.attr("shape")]
    ex.node("Reshape", [ex.inp(op, "X"), ex.ints(shape, "shape")], out=ex.out_var(op))


def _transpose2(ex, op):
    ex.transpose(ex.inp(op, "X"), [int(a) for a in op.attr("axis")], out=ex.out_var(op))


def _concat(ex, op):
    if ex.has(op, "AxisTensor"):
        raise ex.unsupported("concat with an AxisTensor input")
    ex.node("Concat", [ex.value(n) for n in op.input("X")], out=ex.out_var(op),
            axis=int(_attr(op, "axis", 0)))


def _squeeze2(ex, op):
    xs = ex.shape(ex.in_var(op, "X"))
    r = len(xs)
    named = {int(a) + r if int(a) < 0 else int(a) for a in _attr(op, "axes", [])}
    axes = sorted(i for i in (named or range(r)) if xs[i] == 1 or (named and xs[i] < 0))
    x, out = ex.inp(op, "X"), ex.out_var(op)
    if not axes:
        ex.alias(out, x)
    else:
        ex.node("Squeeze", [x, ex.ints(axes, "axes")], out=out)


def _unsqueeze2(ex, op):
    if ex.has(op, "AxesTensor") or ex.has(op, "AxesTensorList"):
        raise ex.unsupported("unsqueeze2 with axes given as tensors")
    r = len(ex.shape(ex.in_var(op, "X")))
    marks = tuple(range(2, r + 2))  # stand-ins for X's dims (never 1)
    placed = unsqueeze_shape(marks, [int(a) for a in op.attr("axes")])
    axes = [i for i, d in enumerate(placed) if d == 1]
    ex.node("Unsqueeze", [ex.inp(op, "X"), ex.ints(axes, "axes")], out=ex.out_var(op))


def _fill_constant(ex, op):
    dt = np.dtype(dtypes.to_numpy(int(op.attr("dtype"))))
    str_value = _attr(op, "str_value", "")
    value = np.asarray(float(str_value) if str_value else op.attr("value")).astype(dt)
    out = ex.out_var(op)
    if ex.has(op, "ShapeTensor"):
        shape = ex.node("Cast", [ex.inp(op, "ShapeTensor")], to=_onnx_type(ex.helper, np.dtype(
            np.int64), "ShapeTensor"))
    elif ex.has(op, "ShapeTensorList"):
        i64 = _onnx_type(ex.helper, np.dtype(np.int64), "ShapeTensorList")
        one = ex.ints([1], "one")
        shape = ex.node("Concat", [ex.node("Reshape", [ex.node("Cast", [ex.value(n)], to=i64),
                                                       one])
                                   for n in op.input("ShapeTensorList")], axis=0)
    else:
        shape = None
    if ex.has(op, "ValueTensor"):
        v = ex.node("Cast", [ex.inp(op, "ValueTensor")], to=_onnx_type(ex.helper, dt, out))
        v = ex.node("Reshape", [v, ex.ints([], "scalar")])
        target = shape if shape is not None else ex.ints([int(d) for d in op.attr("shape")])
        ex.node("Expand", [v, target], out=out)
        return
    if shape is not None:
        ex.node("ConstantOfShape", [shape], out=out,
                value=ex.numpy_helper.from_array(value.reshape(1)))
        return
    dims = [int(d) for d in op.attr("shape")]
    if any(d < 0 for d in dims):
        raise ex.unsupported(f"fill_constant of unknown shape {dims}")
    name = ex.define(out)
    ex.inits.append(ex.numpy_helper.from_array(np.full(dims, value, dt), name))


def _reduce(onnx_type):
    def convert(ex, op):
        xv, out = ex.in_var(op, "X"), ex.out_var(op)
        rank = len(ex.shape(xv))
        dims = [int(d) + rank if int(d) < 0 else int(d) for d in _attr(op, "dim", [])]
        if bool(_attr(op, "reduce_all", False)) or not dims or len(set(dims)) >= rank:
            dims = list(range(rank))
        keep = int(bool(_attr(op, "keep_dim", False)))
        same_type = ex.dtype(out) == ex.dtype(xv)
        target = out if same_type else None
        if onnx_type == "ReduceSum" or ex.opset >= 18:
            y = ex.node(onnx_type, [ex.inp(op, "X"), ex.ints(dims, "axes")], out=target,
                        keepdims=keep)
        else:
            y = ex.node(onnx_type, [ex.inp(op, "X")], out=target, axes=dims, keepdims=keep)
        if not same_type:
            ex.node("Cast", [y], out=out, to=_onnx_type(ex.helper, ex.dtype(out), out))
    return convert


def _shape(ex, op):
    s = ex.node("Shape", [ex.inp(op, "Input")])
    ex.node("Cast", [s], out=ex.out_var(op), to=_onnx_type(ex.helper, np.dtype(np.int32), "Out"))


def _slice(ex, op):
    if any(ex.has(op, s) for s in ("StartsTensor", "EndsTensor", "StartsTensorList",
                                   "EndsTensorList")):
        raise ex.unsupported("slice with tensor bounds")
    x, out = ex.inp(op, "Input"), ex.out_var(op)
    axes = [int(a) for a in op.attr("axes")]
    big = np.iinfo(np.int64).max
    clip = lambda v: max(min(int(v), big), -big)  # noqa: E731
    sliced = ex.node("Slice", [x, ex.ints([clip(v) for v in op.attr("starts")], "starts"),
                               ex.ints([clip(v) for v in op.attr("ends")], "ends"),
                               ex.ints(axes, "axes")])
    dec = [int(a) for a in _attr(op, "decrease_axis", [])]
    if dec:
        r = len(ex.shape(ex.in_var(op, "Input")))
        ex.node("Squeeze", [sliced, ex.ints(sorted(a + r if a < 0 else a for a in dec),
                                            "axes")], out=out)
    else:
        ex.alias(out, sliced)


# -- recurrent networks ---------------------------------------------------------------------------
# Paddle's gate blocks (rows of its weights) in ONNX's order: LSTM i, f, g, o -> i, o, f, g;
# GRU r, z, c -> z, r, h (with linear_before_reset, as Paddle computes); simple RNNs one gate.
_RNN_MODES = {"LSTM": ("LSTM", [0, 3, 1, 2], 2), "GRU": ("GRU", [1, 0, 2], 1),
              "RNN_TANH": ("RNN", [0], 1), "RNN_RELU": ("RNN", [0], 1)}


def _rnn(ex, op):
    """Paddle's ``rnn`` op (time-major, ``num_layers`` stacked, optionally bidirectional) as
    one ONNX LSTM/GRU/RNN node per layer. WeightList holds per cell (layer-major, then
    direction) ``w_ih, w_hh``, then per cell ``b_ih, b_hh``; they must be parameters."""
    mode = _attr(op, "mode", "LSTM")
    if mode not in _RNN_MODES:
        raise ex.unsupported(f"rnn mode {mode!r}")
    if ex.has(op, "SequenceLength"):
        raise ex.unsupported("rnn with a SequenceLength input")
    onnx_type, order, n_states = _RNN_MODES[mode]
    ndir = 2 if bool(_attr(op, "is_bidirec", False)) else 1
    layers, hidden = int(op.attr("num_layers")), int(op.attr("hidden_size"))
    ncell, wl = layers * ndir, op.input("WeightList")
    if len(wl) != 4 * ncell:
        raise ValueError(f"{ex.where()}: expected {4 * ncell} tensors in WeightList "
                         f"({layers} layers x {ndir} directions x 4), got {len(wl)}")
    arrays = [ex.param(n) for n in wl]
    if any(a is None for a in arrays):
        raise ex.unsupported("an rnn whose weights are not parameters")
    dt = ex.dtype(ex.in_var(op, "Input"))

    def gates(a):  # rows regrouped in ONNX's gate order
        blocks = np.split(np.asarray(a, dt), len(order), axis=0)
        return np.concatenate([blocks[g] for g in order], axis=0)

    pre = [ex.value(n) for n in op.input("PreState")]
    if len(pre) != n_states:
        raise ValueError(f"{ex.where()}: mode {mode} expects {n_states} PreState tensors, got "
                         f"{len(pre)}")
    state_vars = op.output("State")
    x = ex.inp(op, "Input")
    finals = [[] for _ in range(n_states)]
    for layer in range(layers):
        cells = range(layer * ndir, (layer + 1) * ndir)
        w = np.stack([gates(arrays[2 * c]) for c in cells])
        r = np.stack([gates(arrays[2 * c + 1]) for c in cells])
        b = np.stack([np.concatenate([gates(arrays[2 * ncell + 2 * c]),
                                      gates(arrays[2 * ncell + 2 * c + 1])]) for c in cells])
        names = [ex.derived_param(wl[2 * cells[0]], arr, f"onnx_{k}")
                 for k, arr in (("W", w), ("R", r), ("B", b))]
        bounds = [ex.ints([layer * ndir], "start"), ex.ints([(layer + 1) * ndir], "end"),
                  ex.ints([0], "axis")]
        init = [ex.node("Slice", [s] + bounds) for s in pre]
        attrs = dict(hidden_size=hidden, direction="bidirectional" if ndir == 2 else "forward")
        if onnx_type == "GRU":
            attrs["linear_before_reset"] = 1
        elif onnx_type == "RNN":
            attrs["activations"] = ["Relu" if mode == "RNN_RELU" else "Tanh"] * ndir
        outs = ex.node_n(onnx_type, [x] + names + [""] + init, [None] * (1 + n_states), **attrs)
        y = ex.transpose(outs[0], [0, 2, 1, 3])  # [T, dirs, B, H] -> [T, B, dirs, H]
        last = layer == layers - 1
        x = ex.node("Reshape", [y, ex.ints([0, 0, ndir * hidden], "shape")],
                    out=ex.out_var(op) if last else None)
        for k in range(n_states):
            finals[k].append(outs[1 + k])
    for k, var in enumerate(state_vars[:n_states]):
        if len(finals[k]) == 1:
            ex.alias(var, finals[k][0])
        else:
            ex.node("Concat", finals[k], out=var, axis=0)


def _sum(ex, op):
    ex.node("Sum", [ex.value(n) for n in op.input("X")], out=ex.out_var(op))


_CONVERTERS = {
    "mul": _mul,
    "matmul": _matmul_with("transpose_X", "transpose_Y", "alpha"),
    "matmul_v2": _matmul_with("trans_x", "trans_y"),
    "elementwise_add": _binary("Add"),
    "elementwise_sub": _binary("Sub"),
    "elementwise_mul": _binary("Mul"),
    "elementwise_div": _binary("Div"),
    "elementwise_max": _binary("Max"),
    "elementwise_min": _binary("Min"),
    "elementwise_pow": _binary("Pow"),
    "relu": _unary("Relu"),
    "sigmoid": _unary("Sigmoid"),
    "tanh": _unary("Tanh"),
    "exp": _unary("Exp"),
    "log": _unary("Log"),
    "sqrt": _unary("Sqrt"),
    "abs": _unary("Abs"),
    "floor": _unary("Floor"),
    "assign": _unary("Identity"),
    "relu6": _relu6,
    "hard_swish": _hard_swish,
    "hard_sigmoid": _hard_sigmoid,
    "leaky_relu": _leaky_relu,
    "elu": _elu,
    "selu": _selu,
    "swish": _swish,
    "silu": lambda ex, op: _swish(ex, op, beta=1.0),
    "gelu": _gelu,
    "softmax": _softmax,
    "scale": _scale,
    "dropout": _dropout,
    "cast": _cast,
    "conv2d": _conv,
    "depthwise_conv2d": _conv,
    "conv2d_transpose": _conv_transpose,
    "depthwise_conv2d_transpose": _conv_transpose,
    "pool2d": _pool2d,
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "flatten_contiguous_range": _flatten_range,
    "flatten2": _flatten2,
    "reshape2": _reshape2,
    "reshape": _reshape2,
    "transpose2": _transpose2,
    "transpose": _transpose2,
    "concat": _concat,
    "squeeze2": _squeeze2,
    "unsqueeze2": _unsqueeze2,
    "fill_constant": _fill_constant,
    "shape": _shape,
    "reduce_sum": _reduce("ReduceSum"),
    "reduce_mean": _reduce("ReduceMean"),
    "reduce_max": _reduce("ReduceMax"),
    "reduce_min": _reduce("ReduceMin"),
    "reduce_prod": _reduce("ReduceProd"),
    "slice": _slice,
    "sum": _sum,
    "rnn": _rnn,
}
