"""The index-taking ops of :mod:`pdjit.ops.indexing` (and ``lookup_table_v2`` of
:mod:`pdjit.ops.nn`) on the CPU: gather, gather_nd, index_select, lookup tables, scatter,
where_index, masked_select, cumsum and argsort with their gradients, through the kernels of
:mod:`pdjit.codegen.cpu.lib.indexing` (one compilation per dtype for every shape, axis and op)."""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.ops._common import norm_axis
from pdjit.ops.indexing import _NATIVE, _NO_PAD


def _rows_src(ctx, local: str, rank: int, axis: int) -> str:
    """Source viewing ``local`` (of ``rank``) as ``(A, N, B)`` around ``axis``."""
    return (f"{local}.reshape(({ctx.prod(local, 0, axis)}, {local}.shape[{axis}], "
            f"{ctx.prod(local, axis + 1, rank)}))")


def _flat_ids(local: str) -> str:
    return f"{local}.reshape({local}.size).astype(np.int64)"


def _shape_src(dims) -> str:
    return "(" + "".join(f"{d}, " for d in dims) + ")"


def _dims_array(local: str, lo: int, hi: int) -> str:
    """Source of an int64 array of ``local.shape[lo:hi]`` (``hi > lo``)."""
    return f"np.array({_shape_src(f'{local}.shape[{i}]' for i in range(lo, hi))}, np.int64)"


def _pad_literal(padding_idx) -> str:
    return repr(int(padding_idx)) if int(padding_idx) != -1 else repr(_NO_PAD)


def lookup_lowerings(ids_end: int):
    """``(lower, grad_lower)`` of a table lookup (``lookup_table``, ``lookup_table_v2``) whose
    Out has the dims of Ids up to ``ids_end`` (``-1``: v1's trailing 1 dropped; ``None``: all)
    and then W's width: ``_nn.take_rows`` over W viewed as ``(1, rows, width)``, and
    ``_nn.scatter_rows`` adding Out@GRAD's rows into a zeroed W@GRAD (mode 2), padding rows
    skipped (float32/float64 tables; a bad id makes the reference run and name it)."""
    def lower(ctx):
        if ctx.dtype("W") not in _NATIVE:
            return None
        W, ids = ctx.inp("W"), ctx.inp("Ids")
        dims = [f"{ids}.shape[{i}]" for i in range(ctx.rank("Ids"))][:ids_end]
        out = ctx.out("Out", shape=_shape_src(dims + [f"{W}.shape[1]"]))
        return [f"{ctx.lib_fn('take_rows')}({W}.reshape((1, {W}.shape[0], {W}.shape[1])), "
                f"{_flat_ids(ids)}, {_pad_literal(ctx.attrs['padding_idx'])}, False, "
                f"{out}.reshape((1, {ids}.size, {W}.shape[1])))"]

    def grad_lower(ctx):
        if ctx.dtype("W") not in _NATIVE or ctx.dtype("Out@GRAD") != ctx.dtype("W"):
            return None
        W, ids, g = ctx.inp("W"), ctx.inp("Ids"), ctx.inp("Out@GRAD")
        dw = ctx.out("W@GRAD", shape=f"{W}.shape", zero=True)
        return [f"{ctx.lib_fn('scatter_rows')}({dw}.reshape((1, {W}.shape[0], {W}.shape[1])), "
                f"{_flat_ids(ids)}, {g}.reshape((1, {ids}.size, {W}.shape[1])), 2, "
                f"{_pad_literal(ctx.attrs['padding_idx'])}, False)"]
    return lower, grad_lower


@lowering("index_select", host=True)
def _index_select_lower(ctx):
    r = ctx.rank("X")
    d = norm_axis(ctx.attrs["dim"], r)
    X, idx = ctx.inp("X"), ctx.inp("Index")
    dims = [f"{X}.shape[{i}]" if i != d else f"{idx}.size" for i in range(r)]
    out = ctx.out("Out", shape=_shape_src(dims))
    return [f"{ctx.lib_fn('take_rows')}("
            f"{_rows_src(ctx, X, r, d)}, {_flat_ids(idx)}, {_NO_PAD}, True, "
            f"{_rows_src(ctx, out, r, d)})"]


@lowering("index_select_grad", host=True)
def _index_select_grad_lower(ctx):
    if ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    r = ctx.rank("X")
    d = norm_axis(ctx.attrs["dim"], r)
    X, idx, g = ctx.inp("X"), ctx.inp("Index"), ctx.inp("Out@GRAD")
    dx = ctx.out("X@GRAD", shape=f"{X}.shape", zero=True)
    return [f"{ctx.lib_fn('scatter_rows')}({_rows_src(ctx, dx, r, d)}, {_flat_ids(idx)}, "
            f"{_rows_src(ctx, g, r, d)}, 2, {_NO_PAD}, True)"]


def _gather_nd_lines(ctx, X, idx):
    """(lines binding the rows, the rows' local, the row count source, k)."""
    k = ctx.shape("Index")[-1]
    ri = ctx.rank("Index")
    m = ctx.prod(idx, 0, ri - 1)
    rows = ctx.tmp("rows")
    if k == 0:
        return [f"{rows} = np.zeros(({m},), np.int64)"], rows, m, k
    return [f"{rows} = np.empty(({m},), np.int64)",
            f"{ctx.lib_fn('nd_rows')}("
            f"{idx}.reshape(({m}, {k})).astype(np.int64), {_dims_array(X, 0, k)}, "
            f"{rows})"], rows, m, k


@lowering("gather_nd", host=True)
def _gather_nd_lower(ctx):
    X, idx = ctx.inp("X"), ctx.inp("Index")
    r, ri = ctx.rank("X"), ctx.rank("Index")
    lines, rows, m, k = _gather_nd_lines(ctx, X, idx)
    dims = [f"{idx}.shape[{i}]" for i in range(ri - 1)] + [f"{X}.shape[{i}]"
                                                           for i in range(k, r)]
    out = ctx.out("Out", shape=_shape_src(dims))
    lead, rest = ctx.prod(X, 0, k), ctx.prod(X, k, r)
    return lines + [f"{ctx.lib_fn('take_rows')}("
                    f"{X}.reshape((1, {lead}, {rest})), {rows}, {_NO_PAD}, False, "
                    f"{out}.reshape((1, {m}, {rest})))"]


@lowering("gather_nd_grad", host=True)
def _gather_nd_grad_lower(ctx):
    if ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    X, idx, g = ctx.inp("X"), ctx.inp("Index"), ctx.inp("Out@GRAD")
    r = ctx.rank("X")
    lines, rows, m, k = _gather_nd_lines(ctx, X, idx)
    dx = ctx.out("X@GRAD", shape=f"{X}.shape", zero=True)
    lead, rest = ctx.prod(X, 0, k), ctx.prod(X, k, r)
    return lines + [f"{ctx.lib_fn('scatter_rows')}({dx}.reshape((1, {lead}, {rest})), {rows}, "
                    f"{g}.reshape((1, {m}, {rest})), 2, {_NO_PAD}, False)"]


@lowering("scatter", host=True)
def _scatter_lower(ctx):
    X, ids, u = ctx.inp("X"), ctx.inp("Ids"), ctx.inp("Updates")
    r = ctx.rank("X")
    out = ctx.out("Out", shape=f"{X}.shape")
    rest = ctx.prod(X, 1, r)
    return [f"{out}.reshape({out}.size)[:] = {X}.reshape({X}.size)",
            f"{ctx.lib_fn('scatter_rows')}("
            f"{out}.reshape((1, {X}.shape[0], {rest})), {_flat_ids(ids)}, "
            f"{u}.reshape((1, {u}.shape[0], {ctx.prod(u, 1, r)})), "
            f"{0 if ctx.attrs['overwrite'] else 1}, {_NO_PAD}, True)"]


@lowering("scatter_grad", host=True)
def _scatter_grad_lower(ctx):
    if ctx.dtype("Out@GRAD") != ctx.dtype("Updates"):
        return None
    ids, u, g = ctx.inp("Ids"), ctx.inp("Updates"), ctx.inp("Out@GRAD")
    r = ctx.rank("Out@GRAD")
    g3 = f"{g}.reshape((1, {g}.shape[0], {ctx.prod(g, 1, r)}))"
    flat = ctx.tmp("ids")
    lines = [f"{flat} = {_flat_ids(ids)}"]
    if ctx.has_output("X@GRAD"):
        dx = ctx.out("X@GRAD", shape=f"{g}.shape")
        lines += [f"{dx}.reshape({dx}.size)[:] = {g}.reshape({g}.size)",
                  f"{ctx.lib_fn('scatter_rows')}("
                  f"{dx}.reshape((1, {g}.shape[0], {ctx.prod(g, 1, r)})), "
                  f"{flat}, {g3}, 3, {_NO_PAD}, True)"]
    if ctx.has_output("Updates@GRAD"):
        du = ctx.out("Updates@GRAD", shape=f"{u}.shape")
        lines.append(f"{ctx.lib_fn('take_rows')}({g3}, {flat}, {_NO_PAD}, True, "
                     f"{du}.reshape((1, {u}.shape[0], {ctx.prod(u, 1, r)})))")
    return lines


@lowering("where_index", host=True)
def _where_index_lower(ctx):
    r = ctx.rank("Condition")
    if r == 0:
        return None
    c, out = ctx.inp("Condition"), ctx.out("Out")
    return [f"{out} = np.empty((np.count_nonzero({c}), {r}), np.int64)",
            f"{ctx.lib_fn('nonzero_index')}({c}.reshape({c}.size), {_dims_array(c, 0, r)}, {out})"]


def _broadcast_lines(ctx):
    """(lines, X's dims, Mask's dims, the broadcast dims): sources, each padded to one rank,
    with the checks that X and Mask broadcast."""
    X, m = ctx.inp("X"), ctx.inp("Mask")
    rx, rm = ctx.rank("X"), ctx.rank("Mask")
    r = max(rx, rm)
    xd = ["1"] * (r - rx) + [f"{X}.shape[{i}]" for i in range(rx)]
    md = ["1"] * (r - rm) + [f"{m}.shape[{i}]" for i in range(rm)]
    fd = [ctx.tmp("d") for _ in range(r)]
    lines = [f"{f} = max({a}, {b})" for f, a, b in zip(fd, xd, md)]
    lines += [f"_rt.check({a} == 1 or {a} == {f})" for f, a in zip(fd, xd + md)
              if a != "1"] + [f"_rt.check({b} == 1 or {b} == {f})" for f, b in zip(fd, md)
                              if b != "1"]
    return lines, xd, md, fd


def _dims_src(dims) -> str:
    return f"np.array({_shape_src(dims)}, np.int64)"


def _broadcast_mask(ctx, lines, md, fd) -> str:
    """The local of Mask broadcast to ``fd`` (Mask itself when it has that shape)."""
    m = ctx.inp("Mask")
    if ctx.shape("Mask") == ctx.shape("X") and -1 not in ctx.shape("X"):
        return m
    mb = ctx.tmp("mb")
    lines += [f"{mb} = np.empty({_shape_src(fd)}, np.bool_)",
              f"{ctx.lib_fn('tile_nd')}("
              f"{m}.reshape({m}.size), {_dims_src(md)}, {mb}.reshape({mb}.size), "
              f"{_dims_src(fd)})"]
    return mb


@lowering("masked_select", host=True)
def _masked_select_lower(ctx):
    """X and Mask broadcast (``tile_nd``) where their shapes differ, then the selection."""
    if ctx.rank("X") == 0 and ctx.rank("Mask") == 0:
        return None
    X, y, T = ctx.inp("X"), ctx.out("Y"), ctx.T("X")
    lines, xd, md, fd = _broadcast_lines(ctx)
    mb = _broadcast_mask(ctx, lines, md, fd)
    xb = X
    if mb != ctx.inp("Mask"):
        xb = ctx.tmp("xb")
        lines += [f"{xb} = np.empty({_shape_src(fd)}, {T})",
                  f"{ctx.lib_fn('tile_nd')}({X}.reshape({X}.size), {_dims_src(xd)}, "
                  f"{xb}.reshape({xb}.size), {_dims_src(fd)})"]
    return lines + [f"{y} = np.empty((np.count_nonzero({mb}),), {T})",
                    f"{ctx.lib_fn('mask_take')}("
                    f"{xb}.reshape({xb}.size), {mb}.reshape({mb}.size), {y})"]


@lowering("masked_select_grad", host=True)
def _masked_select_grad_lower(ctx):
    if ctx.rank("X") == 0 and ctx.rank("Mask") == 0:
        return None
    X, g, T = ctx.inp("X"), ctx.inp("Y@GRAD"), ctx.T("X")
    lines, xd, md, fd = _broadcast_lines(ctx)
    mb = _broadcast_mask(ctx, lines, md, fd)
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    if mb == ctx.inp("Mask"):
        return lines + [f"{ctx.lib_fn('mask_put')}("
                        f"{g}, {mb}.reshape({mb}.size), {dx}.reshape({dx}.size))"]
    full = ctx.tmp("full")
    return lines + [f"{full} = np.empty({_shape_src(fd)}, {T})",
                    f"{ctx.lib_fn('mask_put')}("
                    f"{g}, {mb}.reshape({mb}.size), {full}.reshape({full}.size))",
                    f"{ctx.lib_fn('untile_nd')}({full}.reshape({full}.size), {_dims_src(xd)}, "
                    f"{dx}.reshape({dx}.size), {_dims_src(fd)})"]


def _cumsum_lower_for(src_slot, dst_slot, flip):
    def lower(ctx):
        a = ctx.attrs
        r = ctx.rank("X")
        if r == 0 or ctx.dtype(src_slot) != ctx.dtype(dst_slot if dst_slot != "Out" else "X"):
            return None
        x = ctx.inp(src_slot)
        X = ctx.inp("X")
        if a["flatten"]:
            shape = f"({X}.size,)" if dst_slot == "Out" else f"{X}.shape"
            view = lambda local: f"{local}.reshape((1, {local}.size, 1))"  # noqa: E731
        else:
            ax = norm_axis(a["axis"], r)
            shape = f"{X}.shape"
            view = lambda local: _rows_src(ctx, local, r, ax)  # noqa: E731
        out = ctx.out(dst_slot, shape=shape)
        reverse = bool(a["reverse"]) != flip
        return [f"{ctx.lib_fn('cumsum_rows')}("
                f"{view(x)}, {bool(a['exclusive'])}, {reverse}, {view(out)})"]
    return lower


@lowering("argsort", host=True)
def _argsort_lower(ctx):
    r = ctx.rank("X")
    if r == 0:
        return None
    ax = norm_axis(ctx.attrs["axis"], r)
    X = ctx.inp("X")
    out = ctx.out("Out", shape=f"{X}.shape")
    idx = ctx.out("Indices", shape=f"{X}.shape")
    return [f"{ctx.lib_fn('argsort_rows')}("
            f"{_rows_src(ctx, X, r, ax)}, {bool(ctx.attrs['descending'])}, "
            f"{_rows_src(ctx, out, r, ax)}, {_rows_src(ctx, idx, r, ax)})"]


@lowering("argsort_grad", host=True)
def _argsort_grad_lower(ctx):
    r = ctx.rank("X")
    if r == 0 or ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    ax = norm_axis(ctx.attrs["axis"], r)
    X, idx, g = ctx.inp("X"), ctx.inp("Indices"), ctx.inp("Out@GRAD")
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    return [f"{ctx.lib_fn('put_along_rows')}("
            f"{_rows_src(ctx, g, r, ax)}, {_rows_src(ctx, idx, r, ax)}, "
            f"{_rows_src(ctx, dx, r, ax)})"]


@lowering("gather", host=True)
def _gather_lower(ctx):
    """Rows of X along the axis, as index_select (negative indices from the end); a 0-d Index
    takes one slice and drops the axis."""
    if ctx.has_input("Axis"):
        return None
    r = ctx.rank("X")
    if r == 0:
        return None
    ax = norm_axis(ctx.attrs["axis"], r)
    X, idx = ctx.inp("X"), ctx.inp("Index")
    dims = [f"{X}.shape[{i}]" if i != ax else f"{idx}.size" for i in range(r)]
    if ctx.rank("Index") == 0:
        del dims[ax]
    out = ctx.out("Out", shape=_shape_src(dims))
    rows = (f"{out}.reshape(({ctx.prod(X, 0, ax)}, {idx}.size, {ctx.prod(X, ax + 1, r)}))")
    return [f"{ctx.lib_fn('take_rows')}("
            f"{_rows_src(ctx, X, r, ax)}, {_flat_ids(idx)}, {_NO_PAD}, True, "
            f"{rows})"]


@lowering("gather_grad", host=True)
def _gather_grad_lower(ctx):
    if ctx.has_input("Axis") or ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    r = ctx.rank("X")
    if r == 0:
        return None
    ax = norm_axis(ctx.attrs["axis"], r)
    X, idx, g = ctx.inp("X"), ctx.inp("Index"), ctx.inp("Out@GRAD")
    dx = ctx.out("X@GRAD", shape=f"{X}.shape", zero=True)
    rows = f"{g}.reshape(({ctx.prod(X, 0, ax)}, {idx}.size, {ctx.prod(X, ax + 1, r)}))"
    return [f"_rt.check({g}.size == {idx}.size * {ctx.prod(X, 0, ax)} * "
            f"{ctx.prod(X, ax + 1, r)})",
            f"{ctx.lib_fn('scatter_rows')}("
            f"{_rows_src(ctx, dx, r, ax)}, {_flat_ids(idx)}, {rows}, 2, "
            f"{_NO_PAD}, True)"]


for _types, _ids_end in ((("lookup_table", "lookup_table_grad"), -1),
                         (("lookup_table_v2", "lookup_table_v2_grad"), None)):
    for _type, _lower in zip(_types, lookup_lowerings(_ids_end)):
        lowering(_type, host=True)(_lower)
lowering("cumsum", host=True)(_cumsum_lower_for("X", "Out", False))
lowering("cumsum_grad", host=True)(_cumsum_lower_for("Out@GRAD", "X@GRAD", True))
