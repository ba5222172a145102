"""``sin`` and ``cos`` (a cosine learning-rate schedule needs one), with their gradients."""
from __future__ import annotations

import numpy as np

from pdjit.framework.registry import ELEMENTWISE, default_grad, register_op
from pdjit.ops._common import FLOATS, check_dtype


def _infer(X):
    check_dtype(X, FLOATS, "input X")
    return {"Out": X}


def _grad_infer(X, **_):
    return {"X@GRAD": X}


for _name, _fn, _emit, _dfn, _demit in (
        ("sin", np.sin, "math.sin({X})", np.cos, "{Out@GRAD} * math.cos({X})"),
        ("cos", np.cos, "math.cos({X})", lambda x: -np.sin(x), "-{Out@GRAD} * math.sin({X})")):
    register_op(_name, inputs=["X"], outputs=["Out"], traits=[ELEMENTWISE], infer_shape=_infer,
                reference=lambda X, _fn=_fn: {"Out": _fn(X).astype(X.dtype, copy=False)},
                emit=_emit, grad=default_grad(f"{_name}_grad", fwd_inputs=("X",)),
                doc=f"Out = {_name}(X).")
    register_op(f"{_name}_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD?"],
                traits=[ELEMENTWISE], infer_shape=_grad_infer,
                reference=lambda X, _d=_dfn, **kw: {
                    "X@GRAD": (kw["Out@GRAD"] * _d(X)).astype(X.dtype, copy=False)},
                emit=_demit, grad=None, doc=f"X@GRAD = Out@GRAD * d{_name}/dX.")
