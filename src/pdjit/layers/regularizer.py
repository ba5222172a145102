"""Weight regularisation, applied to gradients before the update (Fluid's ``regularizer``).

``L2Decay(c)`` adds ``c * param`` to the gradient, ``L1Decay(c)`` adds ``c * sign(param)``. A
parameter's own ``ParamAttr(regularizer=...)`` wins over the optimizer's ``regularization``.
The coefficient is positional or named as either API names it: ``regularization_coeff=``
(Fluid 1.x's ``L2DecayRegularizer``) or ``coeff=`` (``paddle.regularizer.L2Decay``).
"""
from __future__ import annotations

import numbers

from pdjit.framework import unique_name
from pdjit.framework.errors import LayerInputError, LayerTypeError


class WeightDecayRegularizer:
    def __init__(self, regularization_coeff: float | None = None, coeff: float | None = None):
        name = type(self).__name__
        if regularization_coeff is not None and coeff is not None:
            raise LayerInputError(f"{name}: give the coefficient once, as regularization_coeff "
                                  f"or coeff, got both ({regularization_coeff}, {coeff})")
        value = coeff if coeff is not None else regularization_coeff
        value = 0.0 if value is None else value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise LayerTypeError(f"{name}: regularization_coeff must be a number, got "
                                 f"{type(value).__name__} {value!r}")
        if value < 0:
            raise LayerInputError(f"{name}: regularization_coeff must be >= 0, got {value}")
        self.coeff = float(value)

    def _penalty(self, block, param):
        raise NotImplementedError

    def __call__(self, param, grad):
        """The regularised gradient (a new variable), appended to the param's block."""
        block = param.block.program.global_block()
        penalty = self._penalty(block, param)
        out = block.create_var(name=unique_name.generate(f"{grad.name}@REG"), shape=grad.shape,
                               dtype=grad.dtype, stop_gradient=True)
        block.append_op("elementwise_add", inputs={"X": [grad], "Y": [penalty]},
                        outputs={"Out": [out]})
        return out

    def __repr__(self):
        return f"{type(self).__name__}(coeff={self.coeff})"


class L2Decay(WeightDecayRegularizer):
    def _penalty(self, block, param):
        out = block.create_var(name=unique_name.generate(f"{param.name}@L2"), shape=param.shape,
                               dtype=param.dtype, stop_gradient=True)
        block.append_op("scale", inputs={"X": [param]}, outputs={"Out": [out]},
                        attrs={"scale": self.coeff})
        return out


class L1Decay(WeightDecayRegularizer):
    def _penalty(self, block, param):
        sign = block.create_var(name=unique_name.generate(f"{param.name}@SIGN"),
                                shape=param.shape, dtype=param.dtype, stop_gradient=True)
        block.append_op("sign", inputs={"X": [param]}, outputs={"Out": [sign]})
        out = block.create_var(name=unique_name.generate(f"{param.name}@L1"), shape=param.shape,
                               dtype=param.dtype, stop_gradient=True)
        block.append_op("scale", inputs={"X": [sign]}, outputs={"Out": [out]},
                        attrs={"scale": self.coeff})
        return out


L2DecayRegularizer, L1DecayRegularizer = L2Decay, L1Decay


def append_regularization(params_grads, regularization=None) -> list:
    out = []
    for param, grad in params_grads:
        reg = getattr(param, "regularizer", None) or regularization
        out.append((param, reg(param, grad) if reg is not None and reg.coeff else grad))
    return out
