"""``ParamAttr``: how a layer creates a parameter (name, initializer, learning rate, ...)."""
from __future__ import annotations

from pdjit.layers.initializer import Initializer


class ParamAttr:
    def __init__(self, name=None, initializer=None, learning_rate: float = 1.0, regularizer=None,
                 trainable: bool = True, do_model_average: bool = True, need_clip: bool = True):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"ParamAttr: name must be a str, got {type(name).__name__}")
        if initializer is not None and not isinstance(initializer, Initializer):
            raise TypeError(f"ParamAttr: initializer must be an Initializer, got "
                            f"{type(initializer).__name__}")
        self.name, self.initializer, self.learning_rate = name, initializer, float(learning_rate)
        self.regularizer, self.trainable = regularizer, trainable
        self.do_model_average, self.need_clip = do_model_average, need_clip

    @staticmethod
    def _to_attr(arg, layer: str = "", argument: str = "param_attr"):
        """None or True -> ParamAttr() (the default, as Fluid 1.x takes ``bias_attr=True``);
        a name -> ParamAttr(name); an Initializer -> ParamAttr(init=..); False -> False (no
        parameter); a ParamAttr as it is. ``layer`` and ``argument`` name the caller in the
        TypeError for anything else."""
        if arg is None or arg is True:
            return ParamAttr()
        if arg is False:
            return False
        if isinstance(arg, ParamAttr):
            return arg
        if isinstance(arg, str):
            return ParamAttr(name=arg)
        if isinstance(arg, Initializer):
            return ParamAttr(initializer=arg)
        if isinstance(arg, (list, tuple)):
            return [ParamAttr._to_attr(a, layer, argument) for a in arg]
        who = f"{layer}: argument {argument!r}" if layer else f"argument {argument!r}"
        raise TypeError(f"{who} must be a ParamAttr, a name, an Initializer, True or None (the "
                        f"default) or False (no parameter), got {type(arg).__name__} {arg!r}")

    def _param_kwargs(self) -> dict:
        return {"trainable": self.trainable,
                "optimize_attr": {"learning_rate": self.learning_rate},
                "regularizer": self.regularizer, "do_model_average": self.do_model_average}

    def __repr__(self):
        return f"ParamAttr(name={self.name!r}, initializer={self.initializer!r}, " \
               f"learning_rate={self.learning_rate}, trainable={self.trainable})"
