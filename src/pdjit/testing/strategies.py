"""Hypothesis strategies for pdjit's ops and programs (public: ``pdjit.testing.strategies``).

- ``dtypes``, ``shapes``, ``batch_shapes`` (a declared shape with ``-1`` dims and the sizes to
  feed), ``broadcast_pairs`` (X and Y shapes that broadcast under Fluid's ``axis`` rule);
- ``attr_values(op_type)``: attributes drawn from the op definition's declared ``AttrSpec``s
  (choices, ranges, defaults); ``arrays(shape, dtype, domain)``: values in an op's input
  domain (``positive`` for ``log``...);
- ``elementwise_programs()``: random DAGs of the registered elementwise ops (picked by traits,
  so new ops join by themselves), each returned with feeds, ready to run;
- ``lods(rows, max_seqs, ...)``: valid LoDs (offset lists per level, empty sequences included
  unless ``allow_empty=False``); ``lod_tensors(...)``: ``LoDTensor`` values with such a LoD.
"""
from __future__ import annotations

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st

from pdjit.framework import registry
from pdjit.framework.errors import OpShapeError
from pdjit.framework.program import Program, program_guard
from pdjit.ops._common import align_for_axis

A = registry.A
FLOAT_DTYPES = ("float32", "float64")
INT_DTYPES = ("int32", "int64")


def dtypes(kinds: str = "f") -> st.SearchStrategy:
    names = (FLOAT_DTYPES if "f" in kinds else ()) + (INT_DTYPES if "i" in kinds else ())
    return st.sampled_from(names).map(np.dtype)


def shapes(min_rank: int = 0, max_rank: int = 4, min_side: int = 1, max_side: int = 5):
    return st.lists(st.integers(min_side, max_side), min_size=min_rank, max_size=max_rank) \
        .map(tuple)


@st.composite
def batch_shapes(draw, min_rank: int = 1, max_rank: int = 4, max_side: int = 5, sizes: int = 3):
    """(declared shape with -1 leading dim, [concrete shapes to feed at several batch sizes])."""
    shape = draw(shapes(max(min_rank, 1), max_rank, 1, max_side))
    batches = draw(st.lists(st.integers(1, 9), min_size=1, max_size=sizes, unique=True))
    return (-1,) + shape[1:], [(b,) + shape[1:] for b in batches]


@st.composite
def broadcast_pairs(draw, max_rank: int = 4, max_side: int = 5):
    """(x_shape, y_shape, axis): Y's dims align with X's from ``axis`` (or trailing, -1), each
    aligned pair equal or 1 — the shapes Fluid's elementwise ops accept."""
    x = draw(shapes(1, max_rank, 1, max_side))
    ry = draw(st.integers(1, len(x)))
    use_axis = draw(st.booleans())
    axis = draw(st.integers(0, len(x) - ry)) if use_axis else -1
    start = len(x) - ry if axis == -1 else axis
    y = tuple(d if draw(st.booleans()) else 1 for d in x[start:start + ry])
    if draw(st.booleans()):  # sometimes X is the operand that broadcasts
        x = tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in x)
    align_for_axis(x, y, axis)  # the pair is valid by construction
    return x, y, axis


def _attr_strategy(name: str, spec: registry.AttrSpec) -> st.SearchStrategy:
    if spec.choices is not None:
        return st.sampled_from(spec.choices)
    if spec.type in (A.FLOAT, A.FLOAT64) and spec.low is not None:
        return st.floats(spec.low, spec.high, allow_nan=False, width=32)
    if spec.type in (A.INT, A.LONG) and spec.low is not None:
        return st.integers(int(spec.low), int(spec.high))
    if spec.type == A.BOOLEAN:
        return st.booleans()
    if spec.type in (A.BLOCK, A.BLOCKS):
        raise ValueError(f"attribute {name!r} names a block of a program and cannot be drawn: "
                         f"build the op inside a program (see pdjit.testing.check_program_grad)")
    if spec.required:
        raise ValueError(f"attribute {name!r} is required and declares no values to draw "
                         f"(choices or low/high)")
    return st.just(spec.default)


def attr_values(op_type: str, fixed=None) -> st.SearchStrategy:
    """Every declared attribute of ``op_type`` drawn from its spec (``fixed`` overrides)."""
    opdef = registry.get(op_type)
    fixed = dict(fixed or {})
    return st.fixed_dictionaries({name: st.just(fixed[name]) if name in fixed
                                  else _attr_strategy(name, spec)
                                  for name, spec in opdef.attrs.items()})


def arrays(shape, dtype, domain: str | None = None, low: float = -3.0, high: float = 3.0):
    """Arrays of ``shape``/``dtype`` in ``domain`` (``positive``, ``nonzero``, ``unit``)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype.kind == "f":
        if domain == "positive":
            low, high = 0.05, high
        elif domain == "unit":
            low, high = -0.95, 0.95
        width = 32 if dtype == np.float32 else 64
        if width == 32:  # bounds must be float32 values for a width-32 strategy
            low, high = float(np.float32(low)), float(np.float32(high))
        elem = st.floats(low, high, allow_nan=False, width=width)
        if domain == "nonzero":
            elem = elem.filter(lambda v: abs(v) > 0.05)
    else:
        lo = 1 if domain == "positive" else int(low)
        elem = st.integers(lo, int(high)).filter(lambda v: domain != "nonzero" or v != 0)
    return st.lists(elem, min_size=n, max_size=n).map(
        lambda v: np.asarray(v, dtype=dtype).reshape(shape))


def _unary_ops() -> list:
    return sorted(t for t, d in registry.all_ops().items()
                  if d.has(registry.ELEMENTWISE) and not d.has(registry.BROADCAST)
                  and [s.name for s in d.inputs if not s.dispensable] == ["X"]
                  and [s.name for s in d.outputs] == ["Out"] and d.emit is not None
                  and not any(spec.required for spec in d.attrs.values())
                  and not t.endswith("_grad"))


def _binary_ops() -> list:
    return sorted(t for t, d in registry.all_ops().items()
                  if d.has(registry.BROADCAST) and [s.name for s in d.inputs] == ["X", "Y"]
                  and d.emit is not None and "axis" in d.attrs
                  and not t.endswith("_grad"))


@st.composite
def elementwise_programs(draw, dtype="float64", max_ops: int = 8, width: int = 4):
    """(program, feed, fetch_vars): a random DAG of elementwise ops over ``x [n, width]`` and a
    row ``r [width]``; inputs of ops with a domain are mapped into it (``abs(v) + 0.5``)."""
    from pdjit import layers

    unary, binary = _unary_ops(), _binary_ops()
    n = draw(st.integers(1, 6))
    prog = Program()
    with program_guard(prog, Program()):
        x = layers.data(name="x", shape=[-1, width], dtype=dtype, append_batch_size=False)
        r = layers.data(name="r", shape=[width], dtype=dtype, append_batch_size=False)
        values = [x, r]
        for _ in range(draw(st.integers(1, max_ops))):
            if draw(st.booleans()):
                op = draw(st.sampled_from(unary))
                v = values[draw(st.integers(0, len(values) - 1))]
                v = _into_domain(op, "X", v)
                attrs = draw(attr_values(op))
                out = prog.global_block().create_var(
                    name=f"v{len(values)}", dtype=dtype)
                _append(prog, op, {"X": v}, out, attrs)
            else:
                op = draw(st.sampled_from(binary))
                a = values[draw(st.integers(0, len(values) - 1))]
                b = values[draw(st.integers(0, len(values) - 1))]
                if len(a.shape) < len(b.shape):
                    a, b = b, a
                a, b = _into_domain(op, "X", a), _into_domain(op, "Y", b)
                out = prog.global_block().create_var(name=f"v{len(values)}", dtype=dtype)
                _append(prog, op, {"X": a, "Y": b}, out, {"axis": -1})
            values.append(out)
    fetch = draw(st.lists(st.sampled_from(values[2:]), min_size=1, max_size=3, unique_by=id))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 31 - 1)))
    feed = {"x": rng.uniform(-2, 2, (n, width)).astype(dtype),
            "r": rng.uniform(-2, 2, width).astype(dtype)}
    return prog, feed, fetch


def _append(prog, op, inputs, out, attrs):
    """Append, or reject the example when the op refuses these inputs (e.g. a dtype)."""
    try:
        prog.global_block().append_op(op, inputs=inputs, outputs={"Out": out}, attrs=attrs)
    except OpShapeError:
        reject()


def _into_domain(op_type, slot, var):
    """``var`` mapped into the domain of ``op_type``'s input ``slot``; the example is rejected
    when the mapping refuses ``var`` (an earlier op's attributes made it bool or integer)."""
    from pdjit import layers

    domain = registry.get(op_type).domain.get(slot)
    try:
        if domain in ("positive", "nonzero"):
            return layers.scale(layers.abs(var), scale=1.0, bias=0.5)
        if domain == "unit":
            return layers.scale(layers.tanh(var), scale=0.9)
    except OpShapeError:
        reject()
    return var


# ---- LoD -----------------------------------------------------------------------------------
def _split(draw, total: int, parts: int, allow_empty: bool) -> list:
    """``parts`` non-negative lengths summing to ``total`` (each >= 1 unless allow_empty)."""
    if parts == 0:
        return []
    low = 0 if allow_empty else 1
    free = total - low * parts
    cuts = sorted(draw(st.lists(st.integers(0, free), min_size=parts - 1, max_size=parts - 1)))
    bounds = [0] + cuts + [free]
    return [low + b - a for a, b in zip(bounds, bounds[1:])]


def _offsets(lengths) -> list:
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + n)
    return offs


@st.composite
def lods(draw, rows: int | None = None, max_seqs: int = 5, max_len: int = 4, levels: int = 1,
         allow_empty: bool = True, min_seqs: int = 1) -> list:
    """A valid LoD: ``levels`` lists of offsets, each starting at 0 and never decreasing; the
    last level ends at ``rows`` (drawn when ``None``, at most ``max_seqs * max_len``), each
    upper level at the number of sequences of the level below it."""
    if rows is None:
        n = draw(st.integers(min_seqs, max_seqs))
        lo = 0 if allow_empty else 1
        lengths = draw(st.lists(st.integers(lo, max_len), min_size=n, max_size=n))
    else:
        most = max_seqs if allow_empty else min(max_seqs, rows)
        if rows > 0 and most < 1:
            raise ValueError(f"lods: {rows} rows cannot be split into at most {max_seqs} "
                             f"sequences")
        n = draw(st.integers(min(max(min_seqs, 1 if rows else 0), most), most))
        lengths = _split(draw, rows, n, allow_empty)
    out = [_offsets(lengths)]
    for _ in range(levels - 1):
        below = len(out[0]) - 1
        n = draw(st.integers(1 if below else 0, max(below, 1) if allow_empty else max(below, 0)))
        out.insert(0, _offsets(_split(draw, below, n, allow_empty or below == 0)))
    return out


@st.composite
def lod_tensors(draw, dtype="float64", feature_shape=(3,), lod=None, domain: str | None = None,
                **lod_kw):
    """A ``LoDTensor`` of ``dtype`` with rows ``feature_shape`` and a LoD (``lod``, or one drawn
    by :func:`lods` with ``lod_kw``), values in ``domain``."""
    from pdjit.runtime.tensor import LoDTensor

    lod = lod if lod is not None else draw(lods(**lod_kw))
    rows = lod[-1][-1]
    data = draw(arrays((rows,) + tuple(feature_shape), dtype, domain))
    return LoDTensor(data, lod)
