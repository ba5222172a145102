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
"""
from __future__ import annotations

from pdjit.framework import registry, unique_name
from pdjit.framework.program import (
    Parameter,
    Program,
    Variable,
    default_startup_program,
    program_guard,
)
from pdjit.initializer import Constant
from pdjit.passes.backward import append_backward


class Optimizer:
    #: the update op type
    op_type: str = ""

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
                         shape=None) -> Variable:
        key = (kind, param.name)
        if key in self._accumulators:
            return self._accumulators[key]
        block = param.block.program.global_block()
        var = block.create_var(name=unique_name.generate(f"{param.name}_{kind}"),
                               shape=list(param.shape) if shape is None else list(shape),
                               dtype=param.dtype, persistable=True, stop_gradient=True)
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
                params_grads = self._grad_clip(params_grads)
            from pdjit.regularizer import append_regularization

            params_grads = append_regularization(params_grads, self.regularization)
        ops = []
        for param, grad in params_grads:
            self._create_accumulators(param)
            with program._op_role_guard(registry.OP_ROLE_OPTIMIZE, [param.name, grad.name]):
                lr = self._param_lr(param, program)
                ops.append(self._append_optimize_op(block, param, grad, lr))
        return ops

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


SGDOptimizer, MomentumOptimizer, AdamOptimizer = SGD, Momentum, Adam
AdamWOptimizer, AdagradOptimizer, RMSPropOptimizer = AdamW, Adagrad, RMSProp

__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "AdamW", "Adagrad", "RMSProp",
           "SGDOptimizer", "MomentumOptimizer", "AdamOptimizer", "AdamWOptimizer",
           "AdagradOptimizer", "RMSPropOptimizer"]

