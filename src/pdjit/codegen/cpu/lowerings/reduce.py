"""The reductions' gradients (:mod:`pdjit.ops.reduce`) on the CPU: host lines through the
kernels of :mod:`pdjit.codegen.cpu.lib.indexing` (float32 and float64)."""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.ops.reduce import reduce_grad_axes


def _dims_src(dims) -> str:
    return "np.array((" + "".join(f"{d}, " for d in dims) + "), np.int64)"


def _make_reduce_grad_lower(kind):
    """The gradient of a reduction of ``kind`` (``"total"``, ``"average"``, ``"extreme"``,
    ``"product"``, given where it is registered). Host lines through kernels of
    ``pdjit.codegen.cpu.lib.indexing`` (float32 and float64); a size mismatch makes a kernel
    raise, and the reference then names it.

    - total: ``X@GRAD = tile(Out@GRAD)``: Out@GRAD read as X with its reduced dims 1 (the
      kept shape) and broadcast back by ``_nn.tile_nd``; average: ``tile(Out@GRAD / n)`` (n
      the reduced count, at least 1), the reference's order of operations.
    - extreme (max/min): ``_nn.extreme_share``: ``Out@GRAD * hit / count``, ``hit`` where X
      equals its group's Out, ``count`` the group's hits (the reference's rule and operations).
    - product: ``_nn.others_product``: Out@GRAD times the product of the other elements of each
      group, as exclusive running products in C order (the reference's).
    """
    def lower(ctx):
        axes = reduce_grad_axes(ctx)
        if axes is None:
            return None
        r = ctx.rank("X")
        X, g, T = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.T("X")
        xd = [f"{X}.shape[{i}]" for i in range(r)]
        kd = ["1" if i in axes else f"{X}.shape[{i}]" for i in range(r)]
        lines = []
        if kind == "average":
            n = " * ".join(f"{X}.shape[{i}]" for i in axes) or "1"
            gs = ctx.tmp("gs")
            # 1-D first: a 0-d array divided under Numba is a scalar
            lines.append(f"{gs} = {g}.reshape({g}.size) / {T}(max({n}, 1))")
            g = gs
        dx = ctx.out("X@GRAD", shape=f"{X}.shape")
        red = _dims_src(["1" if i in axes else "0" for i in range(r)])
        if kind == "product":
            return [f"{ctx.lib_fn('others_product')}("
                    f"{X}.reshape({X}.size), {_dims_src(xd)}, {red}, "
                    f"{g}.reshape({g}.size), {dx}.reshape({dx}.size))"]
        if kind in ("total", "average"):
            return lines + [f"{ctx.lib_fn('tile_nd')}({g}.reshape({g}.size), {_dims_src(kd)}, "
                            f"{dx}.reshape({dx}.size), {_dims_src(xd)})"]
        if not ctx.has_input("Out") or ctx.dtype("Out") != ctx.dtype("X"):
            return None
        o = ctx.inp("Out")
        return [f"{ctx.lib_fn('extreme_share')}({X}.reshape({X}.size), {o}.reshape({o}.size), "
                f"{g}.reshape({g}.size), {_dims_src(xd)}, {red}, {dx}.reshape({dx}.size))"]
    return lower


lowering("reduce_sum_grad", host=True)(_make_reduce_grad_lower("total"))
lowering("reduce_mean_grad", host=True)(_make_reduce_grad_lower("average"))
lowering("reduce_max_grad", "reduce_min_grad", host=True)(_make_reduce_grad_lower("extreme"))
lowering("reduce_prod_grad", host=True)(_make_reduce_grad_lower("product"))
