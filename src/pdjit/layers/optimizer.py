"""Optimizers: ``minimize(loss)`` appends the backward pass and one update op per parameter.

``SGD``, ``Momentum`` (with Nesterov), ``Adam``, ``AdamW``, ``Adagrad``, ``RMSProp`` under Fluid's
names (and their ``*Optimizer`` aliases). Each keeps its state (velocities, moments, beta
powers) in persistable variables named ``<param>_<kind>_0`` and initialised by the startup
program, and updates them with PaddlePaddle's legacy update ops (``sgd``, ``momentum``, ``adam``,
...), so programs move between the two. The learning rate is a program variable: a float
becomes a 0-d persistable ``learning_rate_N`` filled by the startup program; a Variable (from a
schedule in ``fluid.layers``) is used as it is.

Before the updates, gradients are clipped (``grad_clip``: see ``pdjit.clip``) and regularised
(``regularization``, or a parameter's own ``ParamAttr.regularizer``: see ``pdjit.regularizer``).

Every optimizer also takes the 2.x/3.x spellings of two arguments: ``parameters=`` for
``parameter_list=`` and ``weight_decay=`` (a float is ``L2Decay(weight_decay)``, or a
regularizer) for ``regularization=`` — except where a class has its own ``weight_decay``
(``AdamW``).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import warnings

from pdjit.framework import registry, unique_name
from pdjit.framework.program import (
    Parameter,
    Program,
    Variable,
    default_main_program,
    default_startup_program,
    program_guard,
)
from pdjit.layers.grad_clip import append_gradient_clip_ops
from pdjit.layers.initializer import Constant
from pdjit.layers.regularizer import L2Decay
from pdjit.passes.backward import append_backward


class Optimizer:
    #: the update op type
    op_type: str = ""

    def __init_subclass__(cls, **kw):
        """Each optimizer's ``__init__`` also takes the 2.x names ``parameters`` and
        ``weight_decay`` where its own signature does not have them."""
        super().__init_subclass__(**kw)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        own = inspect.signature(init).parameters
        renames = [(new, old) for new, old in (("parameters", "parameter_list"),
                                               ("weight_decay", "regularization"))
                   if new not in own and old in own]
        if not renames:
            return

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            for new, old in renames:
                if new in kwargs:
                    if kwargs.get(old) is not None:
                        raise TypeError(f"{cls.__name__}: give {old}= or {new}=, not both")
                    value = kwargs.pop(new)
                    if new == "weight_decay" and isinstance(value, (int, float)) and \
                            not isinstance(value, bool):
                        value = L2Decay(float(value))
                    kwargs[old] = value
            init(self, *args, **kwargs)
        cls.__init__ = __init__

    def __init__(self, learning_rate=0.001, regularization=None, grad_clip=None, name=None,
                 parameter_list=None):
        if not isinstance(learning_rate, (int, float, Variable)) or \
                isinstance(learning_rate, bool):
            raise TypeError(f"{type(self).__name__}: learning_rate must be a float or a "
                            f"Variable, got {type(learning_rate).__name__}")
        if isinstance(learning_rate, (int, float)) and learning_rate < 0:
            raise ValueError(f"{type(self).__name__}: learning_rate must be >= 0, got "
                             f"{learning_rate}")
        self._learning_rate = learning_rate
        self.regularization = regularization
        self._grad_clip = grad_clip
        self._name = name
        self._parameter_list = parameter_list
        self._lr_vars: dict = {}
        self._accumulators: dict = {}
        self._startup: Program | None = None

    # -- the learning rate ---------------------------------------------------------------------
    def _global_learning_rate(self, program: Program) -> Variable:
        if isinstance(self._learning_rate, Variable):
            return self._learning_rate
        lr = self._lr_vars.get(id(program))
        if lr is None:
            block = program.global_block()
            lr = block.create_var(name=unique_name.generate("learning_rate"), shape=[],
                                  dtype="float32", persistable=True, stop_gradient=True)
            self._init_in_startup(lr, float(self._learning_rate))
            self._lr_vars[id(program)] = lr
        return lr

    def _param_lr(self, param: Parameter, program: Program) -> Variable:
        lr = self._global_learning_rate(program)
        scale = (param.optimize_attr or {}).get("learning_rate", 1.0)
        if scale == 1.0:
            return lr
        block = program.global_block()
        out = block.create_var(name=unique_name.generate(f"{param.name}_lr"), shape=lr.shape,
                               dtype=lr.dtype, stop_gradient=True)
        block.append_op("scale", inputs={"X": [lr]}, outputs={"Out": [out]},
                        attrs={"scale": float(scale)})
        return out

    # -- state ---------------------------------------------------------------------------------
    def _init_in_startup(self, var: Variable, value: float) -> None:
        startup = self._startup or default_startup_program()
        sb = startup.global_block()
        svar = sb.create_var(name=var.name, shape=var.shape, dtype=var.dtype, persistable=True)
        Constant(value)(svar, sb)

    def _add_accumulator(self, kind: str, param: Parameter, fill_value: float = 0.0,
                         shape=None, dtype=None) -> Variable:
        key = (kind, param.name)
        if key in self._accumulators:
            return self._accumulators[key]
        block = param.block.program.global_block()
        var = block.create_var(name=unique_name.generate(f"{param.name}_{kind}"),
                               shape=list(param.shape) if shape is None else list(shape),
                               dtype=param.dtype if dtype is None else dtype, persistable=True,
                               stop_gradient=True)
        self._init_in_startup(var, fill_value)
        self._accumulators[key] = var
        return var

    def _create_accumulators(self, param: Parameter) -> None:
        """Subclasses: create the state one parameter's update needs."""

    def _append_optimize_op(self, block, param, grad, lr) -> object:
        raise NotImplementedError

    # -- the public API ------------------------------------------------------------------------
    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        self._startup = startup_program
        return append_backward(loss, parameter_list or self._parameter_list, no_grad_set,
                               callbacks)

    def apply_gradients(self, params_grads) -> list:
        if not params_grads:
            return []
        program = params_grads[0][0].block.program
        block = program.global_block()
        with program._op_role_guard(registry.OP_ROLE_OPTIMIZE):
            if self._grad_clip is not None:
                if any(getattr(p, "gradient_clip_attr", None) is not None
                       for p, _ in params_grads):
                    warnings.warn(f"{type(self).__name__}: the optimizer's grad_clip is used; "
                                  f"the clip set by set_gradient_clip is ignored (as in Fluid)",
                                  stacklevel=3)
                params_grads = self._grad_clip(params_grads)
            else:  # Fluid 1.x's global clip (clip.set_gradient_clip), when one was set
                params_grads = append_gradient_clip_ops(params_grads)
            from pdjit.layers.regularizer import append_regularization

            params_grads = append_regularization(params_grads, self.regularization)
        ops = []
        for param, grad in params_grads:
            self._create_accumulators(param)
            with program._op_role_guard(registry.OP_ROLE_OPTIMIZE, [param.name, grad.name]):
                lr = self._param_lr(param, program)
                ops.append(self._append_optimize_op(block, param, grad, lr))
        return ops

    def apply_optimize(self, loss, startup_program, params_grads) -> list:
        """Fluid 1.8's second half of ``minimize``: the clips, regularisation and updates of
        ``params_grads`` (from ``backward``), appended to ``loss``'s program; the update ops."""
        program = loss.block.program
        with program_guard(program, startup_program or default_startup_program()):
            self._startup = startup_program
            return self.apply_gradients(params_grads)

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        """Append the backward pass and the updates; return ``(optimize_ops, params_grads)``."""
        if not isinstance(loss, Variable):
            raise TypeError(f"minimize: loss must be a Variable, got {type(loss).__name__}")
        if loss.shape and any(d != 1 for d in loss.shape):
            raise ValueError(f"minimize: the loss must hold one value (shape [] or [1]), got "
                             f"{list(loss.shape)} for {loss.name!r}; reduce it with mean")
        program = loss.block.program
        startup = startup_program or default_startup_program()
        with program_guard(program, startup):
            params_grads = self.backward(loss, startup, parameter_list, no_grad_set)
            self._startup = startup
            ops = self.apply_gradients(params_grads)
        return ops, params_grads


class SGD(Optimizer):
    """``param -= lr * grad``"""
    op_type = "sgd"

    def __init__(self, learning_rate, regularization=None, grad_clip=None, name=None,
                 parameter_list=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)

    def _append_optimize_op(self, block, param, grad, lr):
        return block.append_op("sgd", inputs={"Param": [param], "Grad": [grad],
                                              "LearningRate": [lr]},
                               outputs={"ParamOut": [param]})


class Momentum(Optimizer):
    """``v = mu * v + grad; param -= lr * v`` (Nesterov: ``param -= lr * (grad + mu * v)``)."""
    op_type = "momentum"

    def __init__(self, learning_rate, momentum, use_nesterov=False, regularization=None,
                 grad_clip=None, name=None, parameter_list=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        if momentum is None or not 0 <= float(momentum):
            raise ValueError(f"Momentum: momentum must be >= 0, got {momentum}")
        self._momentum, self._use_nesterov = float(momentum), bool(use_nesterov)

    def _create_accumulators(self, param):
        self._add_accumulator("velocity", param)

    def _append_optimize_op(self, block, param, grad, lr):
        v = self._accumulators[("velocity", param.name)]
        return block.append_op(
            "momentum",
            inputs={"Param": [param], "Grad": [grad], "Velocity": [v], "LearningRate": [lr]},
            outputs={"ParamOut": [param], "VelocityOut": [v]},
            attrs={"mu": self._momentum, "use_nesterov": self._use_nesterov})


class Adam(Optimizer):
    """Adam with Paddle's bias correction folded into the step size."""
    op_type = "adam"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 regularization=None, grad_clip=None, name=None, lazy_mode=False,
                 parameter_list=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        for what, v in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= v < 1:
                raise ValueError(f"{type(self).__name__}: {what} must be in [0, 1), got {v}")
        if epsilon <= 0:
            raise ValueError(f"{type(self).__name__}: epsilon must be > 0, got {epsilon}")
        self._beta1, self._beta2, self._epsilon = float(beta1), float(beta2), float(epsilon)
        self._lazy_mode = bool(lazy_mode)

    def _create_accumulators(self, param):
        self._add_accumulator("moment1", param)
        self._add_accumulator("moment2", param)
        self._add_accumulator("beta1_pow_acc", param, self._beta1, shape=[1])
        self._add_accumulator("beta2_pow_acc", param, self._beta2, shape=[1])

    def _attrs(self) -> dict:
        return {"beta1": self._beta1, "beta2": self._beta2, "epsilon": self._epsilon,
                "lazy_mode": self._lazy_mode}

    def _append_optimize_op(self, block, param, grad, lr):
        acc = {k: self._accumulators[(k, param.name)]
               for k in ("moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc")}
        return block.append_op(
            self.op_type,
            inputs={"Param": [param], "Grad": [grad], "LearningRate": [lr],
                    "Moment1": [acc["moment1"]], "Moment2": [acc["moment2"]],
                    "Beta1Pow": [acc["beta1_pow_acc"]], "Beta2Pow": [acc["beta2_pow_acc"]]},
            outputs={"ParamOut": [param], "Moment1Out": [acc["moment1"]],
                     "Moment2Out": [acc["moment2"]], "Beta1PowOut": [acc["beta1_pow_acc"]],
                     "Beta2PowOut": [acc["beta2_pow_acc"]]},
            attrs=self._attrs())


class AdamW(Adam):
    """Adam with decoupled weight decay: ``param *= 1 - lr * coeff`` before the Adam step."""
    op_type = "adamw"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 weight_decay=0.01, regularization=None, grad_clip=None, name=None,
                 lazy_mode=False, parameter_list=None, apply_decay_param_fun=None):
        super().__init__(learning_rate, beta1, beta2, epsilon, regularization, grad_clip, name,
                         lazy_mode, parameter_list)
        self._coeff = float(weight_decay)
        self._apply_decay = apply_decay_param_fun

    def _append_optimize_op(self, block, param, grad, lr):
        self._decay_now = self._apply_decay is None or self._apply_decay(param.name)
        return super()._append_optimize_op(block, param, grad, lr)

    def _attrs(self) -> dict:
        return dict(super()._attrs(), coeff=self._coeff, with_decay=bool(self._decay_now))


class Adagrad(Optimizer):
    """``m += grad^2; param -= lr * grad / (sqrt(m) + epsilon)``"""
    op_type = "adagrad"

    def __init__(self, learning_rate, epsilon=1e-6, regularization=None, grad_clip=None,
                 name=None, initial_accumulator_value=0.0, parameter_list=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        self._epsilon, self._initial = float(epsilon), float(initial_accumulator_value)

    def _create_accumulators(self, param):
        self._add_accumulator("moment", param, self._initial)

    def _append_optimize_op(self, block, param, grad, lr):
        m = self._accumulators[("moment", param.name)]
        return block.append_op(
            "adagrad", inputs={"Param": [param], "Grad": [grad], "Moment": [m],
                               "LearningRate": [lr]},
            outputs={"ParamOut": [param], "MomentOut": [m]}, attrs={"epsilon": self._epsilon})


class RMSProp(Optimizer):
    """RMSProp (``centered`` subtracts the running mean of the gradient)."""
    op_type = "rmsprop"

    def __init__(self, learning_rate, rho=0.95, epsilon=1e-6, momentum=0.0, centered=False,
                 regularization=None, grad_clip=None, name=None, parameter_list=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        self._rho, self._epsilon = float(rho), float(epsilon)
        self._momentum, self._centered = float(momentum), bool(centered)

    def _create_accumulators(self, param):
        for kind in ("momentum", "mean_square", "mean_grad"):
            self._add_accumulator(kind, param)

    def _append_optimize_op(self, block, param, grad, lr):
        acc = {k: self._accumulators[(k, param.name)]
               for k in ("momentum", "mean_square", "mean_grad")}
        return block.append_op(
            "rmsprop",
            inputs={"Param": [param], "Grad": [grad], "LearningRate": [lr],
                    "Moment": [acc["momentum"]], "MeanSquare": [acc["mean_square"]],
                    "MeanGrad": [acc["mean_grad"]]},
            outputs={"ParamOut": [param], "MomentOut": [acc["momentum"]],
                     "MeanSquareOut": [acc["mean_square"]], "MeanGradOut": [acc["mean_grad"]]},
            attrs={"epsilon": self._epsilon, "decay": self._rho, "momentum": self._momentum,
                   "centered": self._centered})


def _number(owner: str, what: str, value, low=None, high=None, low_open=False,
            high_open=False) -> float:
    """``value`` as a float, checked against its range; errors name the optimizer and argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: {what} must be a float, got {type(value).__name__}")
    v = float(value)
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lo = "" if low is None else f"{low} {'<' if low_open else '<='} "
        hi = "" if high is None else f" {'<' if high_open else '<='} {high}"
        raise ValueError(f"{owner}: {what} must be {lo}{what}{hi}, got {value}")
    return v


class Adamax(Optimizer):
    """Adam with the infinity norm: ``m = b1 * m + (1 - b1) * g``, ``u = max(b2 * u + eps,
    |g|)``, ``param -= lr / (1 - b1^t) * m / u``; the beta1 power is scaled after each step."""
    op_type = "adamax"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 parameter_list=None, regularization=None, grad_clip=None, name=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        n = type(self).__name__
        self._beta1 = _number(n, "beta1", beta1, 0, 1, high_open=True)
        self._beta2 = _number(n, "beta2", beta2, 0, 1, high_open=True)
        self._epsilon = _number(n, "epsilon", epsilon, 0, low_open=True)

    def _create_accumulators(self, param):
        self._add_accumulator("moment", param)
        self._add_accumulator("inf_norm", param)
        self._add_accumulator("beta1_pow_acc", param, self._beta1, shape=[1])

    def _append_optimize_op(self, block, param, grad, lr):
        m, u, b1p = (self._accumulators[(k, param.name)]
                     for k in ("moment", "inf_norm", "beta1_pow_acc"))
        op = block.append_op(
            "adamax",
            inputs={"Param": [param], "Grad": [grad], "LearningRate": [lr], "Moment": [m],
                    "InfNorm": [u], "Beta1Pow": [b1p]},
            outputs={"ParamOut": [param], "MomentOut": [m], "InfNormOut": [u]},
            attrs={"beta1": self._beta1, "beta2": self._beta2, "epsilon": self._epsilon})
        # the adamax op leaves the beta1 power as it is: the optimizer scales it (as Fluid does)
        block.append_op("scale", inputs={"X": [b1p]}, outputs={"Out": [b1p]},
                        attrs={"scale": self._beta1})
        return op


class Adadelta(Optimizer):
    """``E[g^2] = rho E[g^2] + (1 - rho) g^2``; ``d = -sqrt((E[d^2] + eps) / (E[g^2] + eps)) g``;
    ``E[d^2] = rho E[d^2] + (1 - rho) d^2``; ``param += lr * d`` (Paddle 3.3.1's op applies the
    learning rate; Fluid 1.8's ignored it)."""
    op_type = "adadelta"

    def __init__(self, learning_rate, epsilon=1.0e-6, rho=0.95, parameter_list=None,
                 regularization=None, grad_clip=None, name=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        n = type(self).__name__
        self._epsilon = _number(n, "epsilon", epsilon, 0, low_open=True)
        self._rho = _number(n, "rho", rho, 0, 1)

    def _create_accumulators(self, param):
        self._add_accumulator("avg_squared_grad", param)
        self._add_accumulator("avg_squared_update", param)

    def _append_optimize_op(self, block, param, grad, lr):
        sg, su = (self._accumulators[(k, param.name)]
                  for k in ("avg_squared_grad", "avg_squared_update"))
        return block.append_op(
            "adadelta",
            inputs={"Param": [param], "Grad": [grad], "AvgSquaredGrad": [sg],
                    "AvgSquaredUpdate": [su], "LearningRate": [lr]},
            outputs={"ParamOut": [param], "AvgSquaredGradOut": [sg],
                     "AvgSquaredUpdateOut": [su]},
            attrs={"epsilon": self._epsilon, "rho": self._rho})


class DecayedAdagrad(Optimizer):
    """``m = decay * m + (1 - decay) * g^2``; ``param -= lr * g / (sqrt(m) + epsilon)``"""
    op_type = "decayed_adagrad"

    def __init__(self, learning_rate, decay=0.95, epsilon=1.0e-6, parameter_list=None,
                 regularization=None, grad_clip=None, name=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        n = type(self).__name__
        self._decay = _number(n, "decay", decay, 0, 1)
        self._epsilon = _number(n, "epsilon", epsilon, 0, low_open=True)

    def _create_accumulators(self, param):
        self._add_accumulator("moment", param)

    def _append_optimize_op(self, block, param, grad, lr):
        m = self._accumulators[("moment", param.name)]
        return block.append_op(
            "decayed_adagrad",
            inputs={"Param": [param], "Grad": [grad], "Moment": [m], "LearningRate": [lr]},
            outputs={"ParamOut": [param], "MomentOut": [m]},
            attrs={"decay": self._decay, "epsilon": self._epsilon})


class Ftrl(Optimizer):
    """FTRL-proximal with L1/L2 shrinkage (see the ``ftrl`` op for the rule)."""
    op_type = "ftrl"

    def __init__(self, learning_rate, l1=0.0, l2=0.0, lr_power=-0.5, parameter_list=None,
                 regularization=None, grad_clip=None, name=None):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        n = type(self).__name__
        self._l1 = _number(n, "l1", l1, 0)
        self._l2 = _number(n, "l2", l2, 0)
        self._lr_power = _number(n, "lr_power", lr_power, high=0)

    def _create_accumulators(self, param):
        self._add_accumulator("squared", param)
        self._add_accumulator("linear", param)

    def _append_optimize_op(self, block, param, grad, lr):
        sq, lin = (self._accumulators[(k, param.name)] for k in ("squared", "linear"))
        return block.append_op(
            "ftrl",
            inputs={"Param": [param], "Grad": [grad], "SquaredAccumulator": [sq],
                    "LinearAccumulator": [lin], "LearningRate": [lr]},
            outputs={"ParamOut": [param], "SquaredAccumOut": [sq], "LinearAccumOut": [lin]},
            attrs={"l1": self._l1, "l2": self._l2, "lr_power": self._lr_power})


class Lamb(Adam):
    """LAMB: the Adam direction plus weight decay, scaled per parameter by the trust ratio
    ``||param|| / ||direction||``. ``exclude_from_weight_decay_fn(param) -> bool`` turns the
    decay off for some parameters."""
    op_type = "lamb"

    def __init__(self, learning_rate=0.001, lamb_weight_decay=0.01, beta1=0.9, beta2=0.999,
                 epsilon=1e-6, parameter_list=None, regularization=None, grad_clip=None,
                 exclude_from_weight_decay_fn=None, name=None):
        super().__init__(learning_rate, beta1, beta2, epsilon, regularization, grad_clip, name,
                         parameter_list=parameter_list)
        self._weight_decay = _number(type(self).__name__, "lamb_weight_decay",
                                     lamb_weight_decay, 0)
        if exclude_from_weight_decay_fn is not None and not callable(exclude_from_weight_decay_fn):
            raise TypeError(f"Lamb: exclude_from_weight_decay_fn must be callable, got "
                            f"{type(exclude_from_weight_decay_fn).__name__}")
        self._exclude_fn = exclude_from_weight_decay_fn

    def _append_optimize_op(self, block, param, grad, lr):
        wd = 0.0 if self._exclude_fn is not None and self._exclude_fn(param) else \
            self._weight_decay
        acc = {k: self._accumulators[(k, param.name)]
               for k in ("moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc")}
        return block.append_op(
            "lamb",
            inputs={"Param": [param], "Grad": [grad], "LearningRate": [lr],
                    "Moment1": [acc["moment1"]], "Moment2": [acc["moment2"]],
                    "Beta1Pow": [acc["beta1_pow_acc"]], "Beta2Pow": [acc["beta2_pow_acc"]]},
            outputs={"ParamOut": [param], "Moment1Out": [acc["moment1"]],
                     "Moment2Out": [acc["moment2"]], "Beta1PowOut": [acc["beta1_pow_acc"]],
                     "Beta2PowOut": [acc["beta2_pow_acc"]]},
            attrs={"beta1": self._beta1, "beta2": self._beta2, "epsilon": self._epsilon,
                   "weight_decay": wd})


class LarsMomentum(Optimizer):
    """Momentum with a layer-wise rate: ``local_lr = lr * lars_coeff * ||param|| / (||grad|| +
    lars_weight_decay * ||param|| + epsilon)``; ``v = mu * v + local_lr * (grad +
    lars_weight_decay * param)``; ``param -= v``. ``exclude_from_weight_decay``: substrings of
    parameter names whose decay is 0."""
    op_type = "lars_momentum"

    def __init__(self, learning_rate, momentum, lars_coeff=0.001, lars_weight_decay=0.0005,
                 parameter_list=None, regularization=None, grad_clip=None, name=None,
                 exclude_from_weight_decay=None, epsilon=0, multi_precision=False,
                 rescale_grad=1.0):
        super().__init__(learning_rate, regularization, grad_clip, name, parameter_list)
        n = type(self).__name__
        if momentum is None:
            raise ValueError(f"{n}: momentum is required")
        self._momentum = _number(n, "momentum", momentum, 0)
        self._lars_coeff = _number(n, "lars_coeff", lars_coeff, 0)
        self._lars_weight_decay = _number(n, "lars_weight_decay", lars_weight_decay, 0)
        self._epsilon = _number(n, "epsilon", epsilon, 0)
        self._rescale_grad = _number(n, "rescale_grad", rescale_grad)
        if multi_precision:
            raise NotImplementedError(f"{n}: multi_precision (float16 master weights) is not "
                                      f"supported")
        self._exclude = list(exclude_from_weight_decay or [])

    def _create_accumulators(self, param):
        self._add_accumulator("velocity", param)

    def _append_optimize_op(self, block, param, grad, lr):
        v = self._accumulators[("velocity", param.name)]
        wd = 0.0 if any(s in param.name for s in self._exclude) else self._lars_weight_decay
        return block.append_op(
            "lars_momentum",
            inputs={"Param": [param], "Grad": [grad], "Velocity": [v], "LearningRate": [lr]},
            outputs={"ParamOut": [param], "VelocityOut": [v]},
            attrs={"mu": self._momentum, "lars_coeff": self._lars_coeff,
                   "lars_weight_decay": [wd], "epsilon": self._epsilon,
                   "rescale_grad": self._rescale_grad})


# ---- averages of the parameters -----------------------------------------------------------------
_DTYPE_CODE = {"bool": 0, "int32": 2, "int64": 3, "float32": 5, "float64": 6}


def _startup_fill(startup: Program, var: Variable, value: float) -> None:
    sb = startup.global_block()
    svar = sb.create_var(name=var.name, shape=var.shape, dtype=var.dtype, persistable=True)
    Constant(value)(svar, sb)


def _persistable(block, like: Variable, name: str | None = None, shape=None, dtype=None):
    """``like`` (or a new persistable variable ``name``) declared in another program's block."""
    name = like.name if name is None else name
    if block.has_var(name):
        return block.var(name)
    return block.create_var(name=name, shape=list(like.shape) if shape is None else shape,
                            dtype=like.dtype if dtype is None else dtype, persistable=True,
                            stop_gradient=True)


def _tmp(block, shape, dtype, hint: str) -> Variable:
    return block.create_var(name=unique_name.generate(hint), shape=shape, dtype=dtype,
                            stop_gradient=True)


def _op(block, type_, inputs, out_shape, out_dtype, attrs=None, hint="tmp", out=None):
    out = out if out is not None else _tmp(block, out_shape, out_dtype, hint)
    block.append_op(type_, inputs=inputs, outputs={"Out": [out]}, attrs=attrs or {})
    return out


def _cast(block, x, dtype: str):
    if x.dtype == dtype:
        return x
    return _op(block, "cast", {"X": [x]}, list(x.shape), dtype,
               {"in_dtype": _DTYPE_CODE[str(x.dtype)], "out_dtype": _DTYPE_CODE[dtype]})


def _averaged_params(owner: str, program: Program) -> list:
    params = [p for p in program.global_block().all_parameters()
              if getattr(p, "do_model_average", None) is not False]
    if not params:
        raise ValueError(f"{owner}: the main program has no parameters to average; build the "
                         f"model (and call minimize) before creating it")
    return params


class _AppliedAverage:
    """``apply`` / ``restore`` of an average: programs that swap the averaged values into the
    parameters (backing them up) and put the backups back."""
    apply_program: Program
    restore_program: Program

    @contextlib.contextmanager
    def apply(self, executor, need_restore: bool = True, scope=None):
        """Within the block the parameters hold their averages; on leaving, with
        ``need_restore``, they get their trained values back."""
        executor.run(self.apply_program, scope=scope)
        try:
            yield
        finally:
            if need_restore:
                self.restore(executor, scope=scope)

    def restore(self, executor, scope=None) -> None:
        """Put the trained values (backed up by ``apply``) back into the parameters."""
        executor.run(self.restore_program, scope=scope)

    def _build_restore(self, params, backups) -> None:
        self.restore_program = Program()
        block = self.restore_program.global_block()
        for p in params:
            block.append_op("assign", inputs={"X": [_persistable(block, backups[p.name])]},
                            outputs={"Out": [_persistable(block, p)]})


class ExponentialMovingAverage(_AppliedAverage):
    """The exponential moving average of the parameters (Fluid 1.8):
    ``ema = decay * ema + (1 - decay) * param`` after each step (``update()`` appends this to
    the main program); with ``thres_steps`` (a Variable holding the step) the decay is
    ``min(decay, (1 + thres_steps) / (10 + thres_steps))``. ``apply(executor)`` swaps
    the bias-corrected averages ``ema / (1 - decay^t)`` (``t`` the number of updates run) into
    the parameters; ``restore(executor)`` puts the trained values back. Build it after the
    model, in the same program guard."""

    STEP_COUNTER = "@EMA_STEP_COUNTER@"

    def __init__(self, decay=0.999, thres_steps=None, name=None):
        self._decay = _number("ExponentialMovingAverage", "decay", decay, 0, 1)
        if thres_steps is not None and not isinstance(thres_steps, Variable):
            raise TypeError(f"ExponentialMovingAverage: thres_steps must be a Variable (the "
                            f"global step) or None, got {type(thres_steps).__name__}")
        self._name = name or ""
        main, startup = default_main_program(), default_startup_program()
        self._main = main
        self._params = _averaged_params("ExponentialMovingAverage", main)
        block = main.global_block()
        self._decay_var = block.create_var(
            name=unique_name.generate("scheduled_ema_decay_rate"), shape=[1], dtype="float32",
            persistable=True, stop_gradient=True)
        _startup_fill(startup, self._decay_var, self._decay)
        if thres_steps is not None:
            with main._op_role_guard(registry.OP_ROLE_LRSCHED):
                t = _cast(block, thres_steps, "float32")
                num = _op(block, "scale", {"X": [t]}, list(t.shape), "float32",
                          {"scale": 1.0, "bias": 1.0})
                den = _op(block, "scale", {"X": [t]}, list(t.shape), "float32",
                          {"scale": 1.0, "bias": 10.0})
                ratio = _op(block, "elementwise_div", {"X": [num], "Y": [den]}, list(t.shape),
                            "float32")
                cap = _op(block, "fill_constant", {}, [1], "float32",
                          {"shape": [1], "value": self._decay, "dtype": 5})
                _op(block, "elementwise_min", {"X": [cap], "Y": [ratio]}, None, None,
                    out=self._decay_var)
        if block.has_var(self.STEP_COUNTER):
            self._counter = block.var(self.STEP_COUNTER)
        else:
            self._counter = block.create_var(name=self.STEP_COUNTER, shape=[1], dtype="int64",
                                             persistable=True, stop_gradient=True)
            _startup_fill(startup, self._counter, 0)
        self._ema = {}
        for p in self._params:
            ema = block.create_var(name=unique_name.generate(f"{self._name}{p.name}_ema"),
                                   shape=list(p.shape), dtype=p.dtype, persistable=True,
                                   stop_gradient=True)
            _startup_fill(startup, ema, 0.0)
            self._ema[p.name] = ema
        # the backups live only in the apply/restore programs (and the scope)
        self._backup = {p.name: _Named(unique_name.generate(f"{self._name}{p.name}.ema_tmp"), p)
                        for p in self._params}
        self._build_apply()
        self._build_restore(self._params, self._backup)

    def _build_apply(self) -> None:
        self.apply_program = Program()
        block = self.apply_program.global_block()
        decay = _persistable(block, self._decay_var)
        step = _cast(block, _persistable(block, self._counter), "float32")
        power = _op(block, "elementwise_pow", {"X": [decay], "Y": [step]}, [1], "float32")
        zero = _op(block, "fill_constant", {}, [1], "float32",
                   {"shape": [1], "value": 0.0, "dtype": 5})
        first = _cast(block, _op(block, "equal", {"X": [step], "Y": [zero]}, [1], "bool"),
                      "float32")
        # 1 - decay^t, or 1 before any update (the average is then its initial zeros)
        denom = _op(block, "elementwise_add",
                    {"X": [_op(block, "scale", {"X": [power]}, [1], "float32",
                               {"scale": -1.0, "bias": 1.0})], "Y": [first]}, [1], "float32")
        for p in self._params:
            param = _persistable(block, p)
            backup = _persistable(block, p, name=self._backup[p.name].name)
            block.append_op("assign", inputs={"X": [param]}, outputs={"Out": [backup]})
            _op(block, "elementwise_div", {"X": [_persistable(block, self._ema[p.name])],
                                           "Y": [_cast(block, denom, str(p.dtype))]},
                None, None, out=param)

    def update(self) -> None:
        """Append the moving-average update to the main program (after the optimizer's)."""
        block = self._main.global_block()
        with self._main._op_role_guard(registry.OP_ROLE_OPTIMIZE):
            block._prepend_op("increment", inputs={"X": [self._counter]},
                              outputs={"Out": [self._counter]}, attrs={"step": 1.0})
            keep = _op(block, "scale", {"X": [self._decay_var]}, [1], "float32",
                       {"scale": -1.0, "bias": 1.0}, hint="ema_one_minus_decay")
            for p in self._params:
                ema = self._ema[p.name]
                decay, rest = (_cast(block, v, str(p.dtype)) for v in (self._decay_var, keep))
                old = _op(block, "elementwise_mul", {"X": [ema], "Y": [decay]}, list(p.shape),
                          p.dtype)
                new = _op(block, "elementwise_mul", {"X": [p], "Y": [rest]}, list(p.shape),
                          p.dtype)
                total = _op(block, "elementwise_add", {"X": [old], "Y": [new]}, list(p.shape),
                            p.dtype)
                block.append_op("assign", inputs={"X": [total]}, outputs={"Out": [ema]})


class _Named:
    """A name standing for a variable shaped like ``like`` (a backup made by ``apply``)."""

    def __init__(self, name: str, like: Variable):
        self.name, self.shape, self.dtype = name, like.shape, like.dtype


class ModelAverage(Optimizer, _AppliedAverage):
    """The average of the parameters over a sliding window of recent steps (Fluid 1.8): each
    step ``average_accumulates`` adds the parameters to running sums; the window restarts once
    it holds ``max(min_average_window, min(max_average_window, num_updates *
    average_window_rate))`` steps, the previous window's sum kept. ``apply(executor)`` puts
    ``(sum_1 + sum_2 + sum_3) / (num_accumulates + old_num_accumulates)`` into the parameters;
    ``restore(executor)`` the trained values back. Build it after ``minimize``."""

    def __init__(self, average_window_rate, min_average_window=10000, max_average_window=10000,
                 regularization=None, name=None):
        super().__init__(0.0, regularization=regularization, name=name)
        n = "ModelAverage"
        self.average_window = _number(n, "average_window_rate", average_window_rate, 0)
        for what, v in (("min_average_window", min_average_window),
                        ("max_average_window", max_average_window)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{n}: {what} must be an int >= 1, got {v!r}")
        if min_average_window > max_average_window:
            raise ValueError(f"{n}: min_average_window must be <= max_average_window, got "
                             f"{min_average_window} > {max_average_window}")
        self.min_average_window, self.max_average_window = min_average_window, \
            max_average_window
        main = default_main_program()
        self._startup = default_startup_program()
        self._params = _averaged_params(n, main)
        with main._op_role_guard(registry.OP_ROLE_OPTIMIZE):
            for p in self._params:
                self._append_average_accumulate_op(main.global_block(), p)
        self._backup = {p.name: _Named(unique_name.generate(f"{p.name}.model_average_tmp"), p)
                        for p in self._params}
        self._build_apply()
        self._build_restore(self._params, self._backup)

    _SUMS = ("sum_1", "sum_2", "sum_3")
    _COUNTS = ("num_accumulates", "old_num_accumulates", "num_updates")

    def _append_average_accumulate_op(self, block, param) -> None:
        acc = {k: self._add_accumulator(k, param) for k in self._SUMS}
        acc.update({k: self._add_accumulator(k, param, 0, shape=[1], dtype="int64")
                    for k in self._COUNTS})
        block.append_op(
            "average_accumulates",
            inputs={"param": [param], **{f"in_{k}": [v] for k, v in acc.items()}},
            outputs={f"out_{k}": [v] for k, v in acc.items()},
            attrs={"average_window": self.average_window,
                   "min_average_window": self.min_average_window,
                   "max_average_window": self.max_average_window})

    def _build_apply(self) -> None:
        self.apply_program = Program()
        block = self.apply_program.global_block()
        for p in self._params:
            acc = {k: _persistable(block, self._accumulators[(k, p.name)])
                   for k in self._SUMS + self._COUNTS}
            param = _persistable(block, p)
            backup = _persistable(block, p, name=self._backup[p.name].name)
            block.append_op("assign", inputs={"X": [param]}, outputs={"Out": [backup]})
            count = _op(block, "sum", {"X": [acc["num_accumulates"],
                                             acc["old_num_accumulates"]]}, [1], "int64")
            total = _op(block, "sum", {"X": [acc[k] for k in self._SUMS]}, list(p.shape),
                        p.dtype)
            _op(block, "elementwise_div", {"X": [total], "Y": [_cast(block, count,
                                                                      str(p.dtype))]},
                None, None, out=param)

    def minimize(self, *args, **kwargs):
        raise TypeError("ModelAverage averages the parameters another optimizer trains: build "
                        "it after that optimizer's minimize, and use apply()/restore()")


SGDOptimizer, MomentumOptimizer, AdamOptimizer = SGD, Momentum, Adam
AdamWOptimizer, AdagradOptimizer, RMSPropOptimizer = AdamW, Adagrad, RMSProp
AdamaxOptimizer, AdadeltaOptimizer, DecayedAdagradOptimizer = Adamax, Adadelta, DecayedAdagrad
FtrlOptimizer, LambOptimizer, LarsMomentumOptimizer = Ftrl, Lamb, LarsMomentum

__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "AdamW", "Adagrad", "RMSProp",
           "SGDOptimizer", "MomentumOptimizer", "AdamOptimizer", "AdamWOptimizer",
           "AdagradOptimizer", "RMSPropOptimizer", "Adamax", "Adadelta", "DecayedAdagrad", "Ftrl",
           "Lamb", "LarsMomentum", "AdamaxOptimizer", "AdadeltaOptimizer",
           "DecayedAdagradOptimizer", "FtrlOptimizer", "LambOptimizer", "LarsMomentumOptimizer",
           "ExponentialMovingAverage", "ModelAverage"]

