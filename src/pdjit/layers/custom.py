"""User-defined ops: define one in Python and it behaves like a built-in.

``define_op`` registers the op (and, when a NumPy gradient is given, its ``<type>_grad`` op and
grad maker) in pdjit's one registry, and returns a layer function that appends it. The op then
appears in programs and their serialized ``ProgramDesc``, fuses with its neighbours when it has
an ``emit`` template, differentiates through ``minimize``/``append_backward``, and is tested
with ``pdjit.testing`` like every built-in op::

    swish = define_op(
        "swish", attrs={"beta": 1.0},
        reference=lambda X, beta: X / (1 + np.exp(-beta * X)),
        emit="{X} * _m.sigmoid({T}({beta}) * {X})",
        grad=lambda X, Out, dOut, beta: dOut * (Out / X + beta * Out * (1 - Out / X)))
    y = swish(x, beta=2.0)

A program using a custom op runs in another process once the op is defined there too.
"""
from __future__ import annotations

import inspect

import numpy as np

from pdjit.framework import registry
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import AttrSpec, VarMeta
from pdjit.layers.layer_helper import LayerHelper, check_variable

_TYPES = ((bool, registry.Bool), (int, registry.Int), (float, registry.Float),
          (str, registry.Str))


def _attr_spec(name, value) -> AttrSpec:
    if isinstance(value, AttrSpec):
        return value
    for t, make in _TYPES:
        if type(value) is t:
            return make(value)
    if isinstance(value, (list, tuple)) and value and type(value[0]) is float:
        return registry.Floats(list(value))
    if isinstance(value, (list, tuple)):
        return registry.Ints(list(value))
    raise TypeError(f"define_op: attribute {name!r}: give a default of type bool, int, float, "
                    f"str or a list, or an AttrSpec; got {value!r}")


def _call_with(fn, values: dict):
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(**values)
    return fn(**{k: v for k, v in values.items() if k in params})


def define_op(type: str, *, reference, inputs=("X",), outputs=("Out",), attrs=None,
              infer_shape=None, emit=None, grad=None, grad_emit=None, doc: str = ""):
    """Register a new op type and return a layer function for it.

    ``reference(**inputs, **attrs) -> array`` (one output) or ``-> {slot: array}``.
    ``infer_shape``: by default the first input's shape and dtype. ``emit``: a scalar template
    (``{X}``, ``{T}``, ``{attr}``; see ``pdjit.framework.registry``) making the op
    elementwise-fusable. ``grad(**inputs, <Out>, d<Out>, **attrs) -> array | {slot: array}``
    gives the inputs' gradients in NumPy (one output only); ``grad_emit`` optionally a template
    for the gradient of an elementwise op with one input (placeholders ``{X}``, ``{Out}``,
    ``{Out@GRAD}``).
    """
    if registry.lookup(type) is not None:
        raise ValueError(f"define_op: op type {type!r} is already registered")
    attr_specs = {k: _attr_spec(k, v) for k, v in (attrs or {}).items()}
    in_slots = [registry.Slot.parse(s).name for s in inputs]
    out_slots = [registry.Slot.parse(s).name for s in outputs]

    def _infer(**kw):
        metas = {s: kw[s] for s in in_slots if kw.get(s) is not None}
        if infer_shape is not None:
            res = _call_with(infer_shape, dict(kw))
            return res if isinstance(res, dict) else {out_slots[0]: res}
        first = metas[in_slots[0]]
        return {s: first for s in out_slots}

    def _ref(**kw):
        res = _call_with(reference, kw)
        if not isinstance(res, dict):
            res = {out_slots[0]: res}
        dtype = kw[in_slots[0]].dtype
        out = {}
        for k, v in res.items():  # float results take the input's float type (NumPy promotes)
            v = np.asarray(v)
            out[k] = v.astype(dtype, copy=False) if v.dtype.kind == dtype.kind == "f" else v
        return out

    traits = [registry.ELEMENTWISE] if isinstance(emit, str) else [registry.OPAQUE]
    maker = None
    if grad is not None:
        if len(out_slots) != 1:
            raise ValueError("define_op: a NumPy gradient is supported for ops with one output")
        out = out_slots[0]
        maker = registry.default_grad(f"{type}_grad", fwd_inputs=tuple(in_slots),
                                      fwd_outputs=(out,), grad_outputs=(out,),
                                      wrt=tuple(in_slots))
        _register_grad(type, in_slots, out, attr_specs, grad, grad_emit)
    registry.register_op(type, inputs=list(inputs), outputs=list(outputs), attrs=attr_specs,
                         traits=traits, infer_shape=_infer, reference=_ref, emit=emit,
                         grad=maker, doc=doc or f"user-defined op {type!r}")
    return _layer(type, in_slots, out_slots, attr_specs)


def _register_grad(type, in_slots, out, attr_specs, grad, grad_emit):
    d_out = f"{out}@GRAD"

    def infer(**kw):
        return {f"{s}@GRAD": kw[s] for s in in_slots if isinstance(kw.get(s), VarMeta)}

    def ref(**kw):
        values = dict(kw)
        values[f"d{out}"] = kw[d_out]
        res = _call_with(grad, values)
        if not isinstance(res, dict):
            res = {in_slots[0]: res}
        outs = {}
        for s, g in res.items():
            g = np.asarray(g)
            if g.shape != kw[s].shape:
                raise ShapeMismatch(f"{type}_grad: the gradient of {s} must have {s}'s shape "
                                    f"{list(kw[s].shape)}, got {list(g.shape)}")
            outs[f"{s}@GRAD"] = g.astype(kw[s].dtype, copy=False)
        return outs

    fusable = isinstance(grad_emit, str) and len(in_slots) == 1
    registry.register_op(
        f"{type}_grad", inputs=in_slots + [out, d_out],
        outputs=[f"{s}@GRAD?" for s in in_slots], attrs=dict(attr_specs),
        traits=[registry.ELEMENTWISE] if fusable else [registry.OPAQUE], infer_shape=infer,
        reference=ref, emit=grad_emit if fusable else None, grad=None,
        doc=f"gradient of the user-defined op {type!r}")


def _layer(type, in_slots, out_slots, attr_specs):
    def layer(*args, name=None, **kwargs):
        values = dict(zip(in_slots, args))
        for s in in_slots:
            if s in kwargs:
                values[s] = kwargs.pop(s)
        attrs = {k: kwargs.pop(k) for k in list(kwargs) if k in attr_specs}
        if kwargs:
            raise TypeError(f"{type}: unexpected arguments {sorted(kwargs)}")
        for s, v in values.items():
            check_variable(v, s, type)
        helper = LayerHelper(type, name=name)
        first = values[in_slots[0]]
        outs = {s: helper.create_variable_for_type_inference(first.dtype) for s in out_slots}
        helper.append_op(type, inputs={s: [v] for s, v in values.items()},
                         outputs={s: [v] for s, v in outs.items()}, attrs=attrs)
        res = [outs[s] for s in out_slots]
        return res[0] if len(res) == 1 else res
    layer.__name__ = type
    layer.__doc__ = f"Append the user-defined op {type!r}."
    return layer


__all__ = ["define_op"]
