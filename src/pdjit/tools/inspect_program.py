"""``pdjit inspect``: the program, an op histogram and a parameter summary.

The summary lines start with ``#`` so that ``--text`` output stays valid protobuf text.
"""
from __future__ import annotations

import sys
from collections import Counter

import numpy as np

from pdjit.framework import registry
from pdjit.io.inference_model import param_vars
from pdjit.tools import plural
from pdjit.tools.model import (
    Loaded,
    describe_var,
    dtype_name,
    load_program,
    shape_str,
)


def optimized(loaded: Loaded):
    """``(program, params)`` after the inference passes."""
    from pdjit.passes.inference import optimize
    return optimize(loaded.program, loaded.params if loaded.params is not None else {})


def op_histogram(program) -> list:
    """Lines: per block, each op type and how often it occurs (most frequent first)."""
    lines = ["# op histogram"]
    total = Counter()
    for b in program.blocks:
        counts = Counter(op.type for op in b.ops)
        total.update(counts)
        parent = "" if b.idx == 0 else f", parent {b.parent_idx}"
        lines.append(f"#   block {b.idx}{parent}: {plural(len(b.ops), 'op')}")
        for t, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"#     {t:32s} {n:6d}")
    if len(program.blocks) > 1:
        lines.append(f"#   all blocks: {plural(sum(total.values()), 'op')} of "
                     f"{plural(len(total), 'type')}")
    return lines


def _human(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""  # unreachable


def param_summary(loaded: Loaded, params: dict | None, largest: int = 5) -> list:
    """Lines: how many parameters, their elements and bytes, the largest few; from the values
    when they were loaded, else from the persistable variables' declared shapes."""
    program = loaded.program
    if params is not None:
        rows = [(n, tuple(np.shape(v)), np.asarray(v).dtype, int(np.size(v)),
                 int(np.asarray(v).nbytes)) for n, v in sorted(params.items())]
        where = loaded.params_file or f"one file per variable in {loaded.params_dir}"
        head = f"# parameters (values from {where})"
    else:
        rows = []
        for v in param_vars(program):
            shape = tuple(v.shape)
            known = all(d >= 0 for d in shape)
            size = int(np.prod(shape, dtype=np.int64)) if known else None
            item = np.dtype(v.dtype).itemsize if v.dtype is not None else 0
            rows.append((v.name, shape, v.dtype, size, size * item if size is not None else None))
        head = "# persistable variables (declared sizes; no values loaded)"
    if not rows:
        return ["# parameters: none"]
    lines = [head]
    elems = sum(r[3] for r in rows if r[3] is not None)
    nbytes = sum(r[4] for r in rows if r[4] is not None)
    unknown = sum(1 for r in rows if r[3] is None)
    more = f" ({unknown} of unknown size)" if unknown else ""
    lines.append(f"#   {plural(len(rows), 'variable')}, {plural(elems, 'element')}, "
                 f"{plural(nbytes, 'byte')} ({_human(nbytes)}){more}")
    top = sorted(rows, key=lambda r: (-(r[4] or 0), r[0]))[:largest]
    lines.append(f"#   largest {len(top)}:")
    for name, shape, dtype, size, b in top:
        size_s = plural(size, "element") if size is not None else "? elements"
        b_s = _human(b) if b is not None else "?"
        lines.append(f"#     {name:32s} {shape_str(shape):16s} {dtype_name(dtype):8s} "
                     f"{size_s:>21s} {b_s:>10s}")
    return lines


def inspect(path: str, text: bool = False, optimize: bool = False, out=None) -> int:
    out = out or sys.stdout
    loaded = load_program(path)
    program, params = loaded.program, loaded.params
    before = Counter(op.type for b in program.blocks for op in b.ops)
    if optimize:
        program, params = optimized(loaded)
        if loaded.params is None:
            params = None
    print(program.to_string(False) if text else str(program), file=out)
    if loaded.feed_names or loaded.fetch_names:
        print("# inputs:  " + "; ".join(describe_var(program, n) for n in loaded.feed_names),
              file=out)
        print("# outputs: " + "; ".join(describe_var(program, n) for n in loaded.fetch_names),
              file=out)
    if optimize:
        after = Counter(op.type for b in program.blocks for op in b.ops)
        changed = ", ".join(f"{t} {before[t]} -> {after[t]}" for t in sorted(before | after)
                            if before[t] != after[t])
        print(f"# after the inference passes: {plural(sum(before.values()), 'op')} -> "
              f"{plural(sum(after.values()), 'op')} ({changed or 'no op changed'})", file=out)
    for line in op_histogram(program) + param_summary(loaded, params):
        print(line, file=out)
    if loaded.params_note:
        print(f"# parameters not loaded: {loaded.params_note}", file=sys.stderr)
    unknown = sorted({op.type for b in program.blocks for op in b.ops
                      if registry.lookup(op.type) is None})
    if unknown:
        print(f"# op types pdjit does not know: {', '.join(unknown)}", file=sys.stderr)
    return 0
