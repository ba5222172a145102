"""The creation ops of :mod:`pdjit.ops.creation` on the device: fill_constant (a static shape
and value: one kernel), assign (a copy on the device) and the random initialisers."""
from __future__ import annotations

from pdjit.codegen.cuda.lowerings import lowering
from pdjit.ops._common import src_literal
from pdjit.ops.creation import _fill_value, _np_dtype


@lowering("fill_constant", host=True)
def _fill(ctx):
    dt = _np_dtype(ctx.attrs["dtype"])
    if any(ctx.has_input(s) for s in ("ShapeTensor", "ShapeTensorList", "ValueTensor")):
        return None
    shape = [int(d) for d in ctx.attrs["shape"]]
    if any(d < 0 for d in shape) or dt.kind not in "fiub":
        return None
    T = ctx.T("Out")
    value = f"{T}({src_literal(_fill_value(ctx.attrs['value'], ctx.attrs['str_value'], dt))})"
    out = ctx.out("Out", shape=ctx.tuple_src([str(d) for d in shape]))
    o, i, v = ctx.tmp("o"), ctx.tmp("i"), ctx.tmp("v")
    # the value a kernel argument: every fill of a dtype shares one kernel
    return [f"{o} = {out}.reshape({out}.size)", f"{v} = {value}"] + \
        ctx.device_loop(i, f"{o}.size", [f"{o}[{i}] = {v}"])


@lowering("assign", host=True)
def _assign(ctx):
    """A copy of a dense tensor on the device."""
    if not ctx.has_input("X"):
        return None
    return [f"{ctx.out('Out')} = _cu.copy({ctx.inp('X')})"]


def _random_device_lines(ctx, normal: bool) -> list | None:
    """``uniform_random`` / ``gaussian_random`` on a device target: one thread per element
    draws element ``i`` (``2i, 2i+1`` for Box-Muller) of the run's stream (``_m.uniform01``)
    and maps it with the reference's float64 arithmetic: the numbers of the cpu target,
    bit-identical for uniform (the transcendental functions of Box-Muller may round the last
    float64 bit differently on a GPU). A static shape only; anything else (shape tensors,
    ``diag_num``, ``min > max``) runs the reference, which names the problem."""
    a = ctx.attrs
    if any(ctx.has_input(s) for s in ("ShapeTensor", "ShapeTensorList")):
        return None
    shape = [int(d) for d in a["shape"]]
    if not shape or any(d < 0 for d in shape):
        return None
    if normal:
        p0, p1 = float(a["mean"]), float(a["std"])
    else:
        if int(a["diag_num"]) > 0 or float(a["min"]) > float(a["max"]):
            return None
        p0, p1 = float(a["min"]), float(a["max"])
    T = ctx.T("Out")
    out = ctx.out("Out", shape=ctx.tuple_src([str(d) for d in shape]))
    o, i, lo, hi = ctx.tmp("o"), ctx.tmp("i"), ctx.tmp("p"), ctx.tmp("q")
    key = ctx.rng_key()
    if normal:
        body = [f"u1 = 1.0 - _m.uniform01({key}, 2 * {i})",
                f"u2 = _m.uniform01({key}, 2 * {i} + 1)",
                "z_ = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)",
                f"{o}[{i}] = {T}({lo} + {hi} * z_)"]
    else:
        body = [f"{o}[{i}] = {T}({lo} + ({hi} - {lo}) * _m.uniform01({key}, {i}))"]
    return [f"{o} = {out}.reshape({out}.size)", f"{lo} = {src_literal(p0)}",
            f"{hi} = {src_literal(p1)}"] + ctx.device_loop(i, f"{o}.size", body)


@lowering("uniform_random", host=True)
def _uniform(ctx):
    return _random_device_lines(ctx, False)


@lowering("gaussian_random", host=True)
def _gaussian(ctx):
    return _random_device_lines(ctx, True)
