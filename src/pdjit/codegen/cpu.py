"""The ``cpu`` target: kernel descriptions rendered as Numba functions, and their call sites.

A loop kernel takes its outputs as arguments (destination passing): ``kernel(L0.., O0.., R0,
p0.., sizes..)`` with the leaves ``L``, the stored chain values ``O``, the reduction's result
``R`` and the attribute parameters ``p``. Except in the strided forms, every array arrives
flattened to one dimension, so one kernel serves every rank. The call site (:func:`call_site`)
is a few lines valid both as Python (the plan's host driver) and under Numba (a native loop):
it reads the run-time shapes, checks them against the chosen form, allocates the outputs and
calls the kernel. A form whose shape check fails raises ``ValueError``; the executor then runs
the group's ops with their references, which either report the precise error or compute the
broadcast the form did not cover.

Parallel variants (``numba.prange`` over the outer loop) of the flat and row forms are rendered
separately and compiled only when a run first reaches :data:`PARALLEL_MIN_SIZE` elements.
"""
from __future__ import annotations

import hashlib
import math
import threading

import numpy as np

from pdjit.codegen import memplan, nnlib, rt
from pdjit.codegen.compiler import compile_function, module_text
from pdjit.codegen.kernel import FULL, MID, ROW, SCALAR, LoopKernel

NAME = "cpu"

_MISFIT = "pdjit: operand shapes do not fit the kernel's loop form"
_EMPTY = "pdjit: a reduction without identity over an empty extent"

# Below this many elements a parallel loop loses to its thread start-up. Alone, the break-even
# of numba's prange on 2 cores is ~1e3-1e4 elements (at 6.5e4 two threads win); between other
# kernels of a network, whose threads the waiting OpenMP threads must wake after, it is far
# higher (measured: LeNet's bias + relu over 221,184 elements took 337 us on 2 threads and
# 56 us on one).
PARALLEL_MIN_SIZE = 1 << 20


def _prod(sh: str, lo: int, hi: int) -> str:
    return " * ".join(f"{sh}[{d}]" for d in range(lo, hi)) or "1"


def _sizes(k: LoopKernel) -> list:
    return {"flat": ["n"], "row": ["nr", "nc"], "mid": ["no", "nm", "ni"], "reduce_all": ["n"],
            "reduce_rows": ["nr", "nc"], "reduce_block": ["no", "nr", "ni"]}.get(k.form, [])


def _params(k: LoopKernel, sizes=_sizes) -> list:
    """A kernel's parameters: leaves, stores, the reduction's output, numeric attributes, then
    the sizes (``sizes(k)``: a target's own loop sizes)."""
    names = [f"L{i}" for i in range(len(k.leaves))] + [f"O{j}" for j in range(len(k.stores))]
    if k.reduce is not None:
        names.append("R0")
    return names + [f"p{i}" for i in range(k.nparams)] + sizes(k)


def argtypes(k: LoopKernel, leaf_dtypes: list) -> list:
    """The kernel's argument types as its call site passes them (see ``SegmentGen._kernel``)."""
    strided = k.form in ("strided", "reduce_strided")
    types = [(dt, leaf.rank if strided else 1) for dt, leaf in zip(leaf_dtypes, k.leaves)]
    types += [(np.dtype(t[3:]) if t != "np.bool_" else np.dtype(bool), k.rank if strided else 1)
              for _, t, _ in k.stores]
    red = k.reduce
    if red is not None:
        out_rank = k.rank if red.keep_dim else k.rank - len(red.axes)
        t = red.dtype
        types.append((np.dtype(t[3:]) if t != "np.bool_" else np.dtype(bool),
                      out_rank if strided else 1))
    return types + [float] * k.nparams + [int] * len(_sizes(k))


def render(k: LoopKernel, parallel: bool = False, inplace: dict | None = None) -> str:
    """The source of ``def kernel(...)`` for ``k`` (``parallel``: prange over the outer loop).
    ``inplace`` ``{store j: leaf i}`` (forms ``INPLACE_FORMS`` only): the variant that writes
    stored value ``j`` into leaf ``i`` (whose buffer the memory plan gave the output), with the
    same parameters (``O{j}`` unused). Writing through ``O{j}`` when it is ``L{i}`` would be
    right too, but LLVM's run-time overlap check then takes the loop's scalar path (measured:
    bias + relu over [128, 256] 2.7 us with distinct arrays, 9.5 us aliased, 2.2 us with the
    variant)."""
    if inplace and k.form not in INPLACE_FORMS:
        raise ValueError(f"no in-place variant of the {k.form} form")
    lines = [f"def kernel({', '.join(_params(k))}):"]
    body = _FORMS[k.form](k, parallel, inplace) if inplace else _FORMS[k.form](k, parallel)
    return "\n".join(lines + ["    " + line for line in body])


def _hoisted(k: LoopKernel) -> list:
    return [f"x{i} = L{i}[0]" for i, leaf in enumerate(k.leaves) if leaf.place == SCALAR]


def _element(k: LoopKernel, full_idx: str, row_idx: str = "", inplace=None) -> list:
    loads = [f"x{i} = L{i}[{full_idx if leaf.place == FULL else row_idx}]"
             for i, leaf in enumerate(k.leaves) if leaf.place in (FULL, ROW)]
    inplace = inplace or {}
    stores = [f"{f'L{inplace[j]}' if j in inplace else f'O{j}'}[{full_idx}] = {expr}"
              for j, (expr, _, _) in enumerate(k.stores)]
    return loads + k.body + stores


def _indent(lines, n=1) -> list:
    return ["    " * n + line for line in lines]


def _flat(k, parallel, inplace=None):
    rng = "numba.prange" if parallel else "range"
    return _hoisted(k) + [f"for i in {rng}(n):"] + _indent(_element(k, "i", "", inplace))


def _row(k, parallel, inplace=None):
    rng = "numba.prange" if parallel else "range"
    # unsigned offsets: Numba then skips its negative-index wraparound and the inner loop
    # vectorises
    return _hoisted(k) + [f"for r in {rng}(nr):", "    b = np.uint64(r * nc)",
                          "    for c in range(np.uint64(nc)):"] + \
        _indent(_element(k, "b + c", "c", inplace), 2)


def _mid(k, parallel, inplace=None):
    rng = "numba.prange" if parallel else "range"
    mids = [f"x{i} = L{i}[m]" for i, leaf in enumerate(k.leaves) if leaf.place == MID]
    return _hoisted(k) + [f"for q in {rng}(no * nm):", "    m = q % nm"] + _indent(mids) + \
        ["    b = np.uint64(q * ni)", "    for i in range(np.uint64(ni)):"] + \
        _indent(_element(k, "b + i", "", inplace), 2)


def _reduce_all(k, parallel):
    red = k.reduce
    return _hoisted(k) + [f"acc = {red.init}", "for i in range(n):"] + \
        _indent(_element(k, "i") + [f"acc = {red.combine.format(acc='acc')}"]) + \
        [f"R0[0] = {red.finalize.format(acc='acc', n='n')}"]


def _reduce_rows(k, parallel):
    red = k.reduce
    return _hoisted(k) + ["for r in range(nr):", f"    acc = {red.init}", "    b = r * nc",
                          "    for c in range(nc):"] + \
        _indent(["e = b + c"] + _element(k, "e") + [f"acc = {red.combine.format(acc='acc')}"],
                2) + [f"    R0[r] = {red.finalize.format(acc='acc', n='nc')}"]


def _reduce_block(k, parallel):
    red = k.reduce
    item = "R0[o * ni + i]"
    return _hoisted(k) + [
        "for o in range(no):",
        "    for i in range(ni):",
        f"        {item} = {red.init}",
        "    for r in range(nr):",
        "        b = (o * nr + r) * ni",
        "        for i in range(ni):"] + \
        _indent(["e = b + i"] + _element(k, "e") + [f"{item} = {red.combine.format(acc=item)}"],
                3) + [
        "    for i in range(ni):",
        f"        {item} = {red.finalize.format(acc=item, n='nr')}"]




def _strided(k: LoopKernel, parallel: bool = False) -> list:
    """A loop nest over the broadcast of the leaves' run-time shapes, each leaf stepping with
    its own strides (0 where it broadcasts); the reduction, if any, indexes its output by the
    kept dims."""
    rank, leaves = k.rank, k.leaves
    lines = [f"d{d} = 1" for d in range(rank)]
    for i, leaf in enumerate(leaves):
        for j in range(leaf.rank):
            lines.append(f"d{leaf.offset + j} = _rt.bdim(d{leaf.offset + j}, L{i}.shape[{j}])")
    lines.append("n = " + (" * ".join(f"d{d}" for d in range(rank)) or "1"))
    for _, _, cone in k.stores:  # a stored value must cover the whole iteration shape
        for d in range(rank):
            cover = [f"L{i}.shape[{d - leaf.offset}] == d{d}" for i, leaf in enumerate(leaves)
                     if i in cone and leaf.offset <= d < leaf.offset + leaf.rank]
            lines.append(f"_rt.check({' or '.join([f'd{d} == 1'] + cover)})")
    lines += [f"F{i} = L{i}.reshape(L{i}.size)" for i in range(len(leaves))]
    lines += [f"Q{j} = O{j}.reshape(O{j}.size)" for j in range(len(k.stores))]
    for i, leaf in enumerate(leaves):
        for j in range(leaf.rank):
            later = " * ".join(f"L{i}.shape[{m}]" for m in range(j + 1, leaf.rank)) or "1"
            lines.append(f"st{i}_{leaf.offset + j} = 0 if L{i}.shape[{j}] == 1 else {later}")
    red = k.reduce
    nest_extra: dict = {}
    inner: list = []
    if red is not None:
        kept = [d for d in range(rank) if d not in red.axes]
        out_total = " * ".join(f"d{d}" for d in kept) or "1"
        lines.append(f"m = (n // ({out_total})) if ({out_total}) > 0 else 0")
        if not red.identity:  # nothing to reduce into a non-empty output: the reference says
            lines.append(f"_rt.check(m > 0 or ({out_total}) == 0)")
        if kept:
            lines += ["A = R0.reshape(R0.size)", "for q in range(A.size):",
                      f"    A[q] = {red.init}"]
            for pos, d in enumerate(kept):
                stride = " * ".join(f"d{e}" for e in kept[pos + 1:]) or "1"
                nest_extra[d] = f"q{d} = {f'q{d - 1}' if d else '0'} + i{d} * ({stride})"
            last = f"q{rank - 1}"
            item = f"A[{last}]"
            inner = [f"{item} = {red.combine.format(acc=item)}"]
        else:
            lines.append(f"acc = {red.init}")
            inner = [f"acc = {red.combine.format(acc='acc')}"]
    lines.append("o = 0")
    ind = 0
    for d in range(rank):
        lines.append("    " * ind + f"for i{d} in range(d{d}):")
        ind += 1
        for i, leaf in enumerate(leaves):
            prev = f"b{i}_{d - 1}" if d > 0 else "0"
            step = f" + i{d} * st{i}_{d}" if leaf.offset <= d < leaf.offset + leaf.rank else ""
            lines.append("    " * ind + f"b{i}_{d} = {prev}{step}")
        if red is not None and kept:
            lines.append("    " * ind + nest_extra.get(d, f"q{d} = {f'q{d - 1}' if d else '0'}"))
    loads = [f"x{i} = F{i}[{f'b{i}_{rank - 1}' if rank else '0'}]" for i in range(len(leaves))]
    stores = [f"Q{j}[o] = {expr}" for j, (expr, _, _) in enumerate(k.stores)]
    lines += _indent(loads + k.body + stores + inner + ["o += 1"], ind)
    if red is not None:
        if kept:
            lines += ["for q in range(A.size):",
                      f"    A[q] = {red.finalize.format(acc='A[q]', n='m')}"]
        else:
            lines.append(f"R0.reshape(R0.size)[0] = {red.finalize.format(acc='acc', n='m')}")
    return lines


_FORMS = {"flat": _flat, "row": _row, "mid": _mid, "strided": _strided, "reduce_all": _reduce_all,
          "reduce_rows": _reduce_rows, "reduce_block": _reduce_block,
          "reduce_strided": _strided}


# Loop forms whose kernels read every full-shape leaf at the very element they then write
# (loads before stores, one element per iteration, outputs indexed like the full leaves): an
# output may take the buffer of such a leaf that nothing reads after the kernel (memory plan;
# the kernel's variant ``render(k, inplace=...)`` then writes the leaf). Not the strided forms
# (a leaf's strides may broadcast) nor the reductions.
INPLACE_FORMS = ("flat", "row", "mid")


# ---- call sites --------------------------------------------------------------------------------
def call_site(k: LoopKernel, fresh, flats: dict, leaves: list, stores: list,
              red_out: str | None, params: list, kname: str, pname: str | None = None,
              alloc: str = "np.empty", inplace: dict | None = None) -> list:
    """Lines that compute the run-time iteration shape, check it, allocate the outputs (locals
    ``stores`` and ``red_out``, in the order of ``k.stores``), and call the kernel global
    ``kname`` (``pname``: its parallel variant, called above the size threshold). ``leaves``:
    the local arrays of ``k.leaves``; ``params``: the parameters' sources; ``fresh(hint)`` gives
    new local names; ``flats`` maps a local to the local of its 1-D view (read and extended:
    each view is made once per driver). With ``kname=None``: ``(lines, arguments)`` without
    the call. ``alloc``: the function that allocates the outputs (another target's device
    allocation: the ``cuda`` target reuses these lines). ``inplace`` ``{store j: leaf i}`` (a
    flat form; the kernel the variant ``render(k, inplace=...)``): stored value ``j`` is not
    allocated: its local is leaf ``i``'s array, which the kernel overwrites."""
    sh = fresh("sh")
    lines = []

    def flat(local):
        if local not in flats:
            flats[local] = fresh("f")
            lines.append(f"{flats[local]} = {local}.reshape({local}.size)")
        return flats[local]

    if k.form in ("strided", "reduce_strided"):
        dims = []
        for d in range(k.rank):
            acc = "1"
            for loc, leaf in zip(leaves, k.leaves):
                if leaf.offset <= d < leaf.offset + leaf.rank:
                    acc = f"_rt.bdim({acc}, {loc}.shape[{d - leaf.offset}])"
            dims.append(acc)
        lines.append(f"{sh} = (" + "".join(f"{d}, " for d in dims) + ")")
        is_flat = False
    else:
        first = next(i for i, leaf in enumerate(k.leaves) if leaf.place == FULL)
        lines.append(f"{sh} = {leaves[first]}.shape")
        conds = []
        for loc, leaf in zip(leaves, k.leaves):
            if leaf.place == FULL and loc != leaves[first]:
                conds.append(f"{loc}.shape == {sh}")
            elif leaf.place == SCALAR:
                conds.append(f"{loc}.size == 1")
            elif leaf.place == ROW:
                lead = leaf.rank - k.row_rank
                conds += [f"{loc}.shape[{j}] == 1" for j in range(lead)]
                conds += [f"{loc}.shape[{j}] == {sh}[{leaf.offset + j}]"
                          for j in range(lead, leaf.rank)]
            elif leaf.place == MID:
                a, b = k.mid
                conds += [f"{loc}.shape[{j}] == {sh}[{leaf.offset + j}]"
                          if a <= leaf.offset + j < b else f"{loc}.shape[{j}] == 1"
                          for j in range(leaf.rank)]
        if conds:
            lines += [f"if not ({' and '.join(conds)}):", f"    raise ValueError({_MISFIT!r})"]
        is_flat = True
    red = k.reduce
    outs = stores + ([red_out] if red is not None else [])
    if is_flat:  # outputs allocated flat, viewed with their shape
        out_args = [fresh("o") for _ in outs]
        for j, (loc, o, (_, t, _)) in enumerate(zip(stores, out_args, k.stores)):
            if inplace and j in inplace:
                out_args[j] = flat(leaves[inplace[j]])
                lines.append(f"{loc} = {leaves[inplace[j]]}")
                flats[loc] = out_args[j]
                continue
            lines += [f"{o} = {alloc}({leaves[first]}.size, {t})", f"{loc} = {o}.reshape({sh})"]
            flats[loc] = o
    else:
        out_args = outs
        for loc, (_, t, _) in zip(stores, k.stores):
            lines.append(f"{loc} = {alloc}({sh}, {t})")
    if red is not None:
        dims = [("1" if red.keep_dim else None) if d in red.axes else f"{sh}[{d}]"
                for d in range(k.rank)]
        lines.append(f"{red_out} = {alloc}((" + "".join(f"{d}, " for d in dims if d) +
                     f"), {red.dtype})")
        if is_flat:
            lines.append(f"{out_args[-1]} = {red_out}.reshape({red_out}.size)")
            flats[red_out] = out_args[-1]
    leaf_args = [flat(loc) for loc in leaves] if is_flat else list(leaves)
    args = leaf_args + out_args + list(params)
    r0 = k.rank
    if k.form in ("flat", "reduce_all"):
        n = fresh("n")
        lines.append(f"{n} = {leaves[first]}.size")
        args.append(n)
    elif k.form == "row":
        n, nc, nr = fresh("n"), fresh("nc"), fresh("nr")
        lines += [f"{nr} = {_prod(sh, 0, r0 - k.row_rank)}",
                  f"{nc} = {_prod(sh, r0 - k.row_rank, r0)}"]
        if pname is not None:
            lines.append(f"{n} = {leaves[first]}.size")
        args += [nr, nc]
    elif k.form == "mid":
        a, b = k.mid
        n, no, nm, ni = fresh("n"), fresh("no"), fresh("nm"), fresh("ni")
        lines += [f"{no} = {_prod(sh, 0, a)}", f"{nm} = {_prod(sh, a, b)}",
                  f"{ni} = {_prod(sh, b, r0)}"]
        if pname is not None:
            lines.append(f"{n} = {leaves[first]}.size")
        args += [no, nm, ni]
    elif k.form == "reduce_rows":
        a = red.axes[0]
        nr, nc = fresh("nr"), fresh("nc")
        lines += [f"{nr} = {_prod(sh, 0, a)}", f"{nc} = {_prod(sh, a, r0)}"]
        args += [nr, nc]
    elif k.form == "reduce_block":
        a, b = red.axes[0], red.axes[-1] + 1
        no, nr, ni = fresh("no"), fresh("nr"), fresh("ni")
        lines += [f"{no} = {_prod(sh, 0, a)}", f"{nr} = {_prod(sh, a, b)}",
                  f"{ni} = {_prod(sh, b, r0)}"]
        args += [no, nr, ni]
    if red is not None and not red.identity and k.form != "reduce_strided":
        # nothing to reduce into a non-empty output: the reference says what is wrong
        empty = {"reduce_all": f"{args[-1]} == 0",
                 "reduce_rows": f"{args[-1]} == 0 and {args[-2]} > 0",
                 "reduce_block": f"{args[-2]} == 0 and {args[-3]} * {args[-1]} > 0"}[k.form]
        lines += [f"if {empty}:", f"    raise ValueError({_EMPTY!r})"]
    if kname is None:  # the caller calls: the lines that prepare, and the arguments
        return lines, args
    call = f"({', '.join(args)})"
    if pname is not None and k.form in ("flat", "row", "mid"):
        # (the parallel variant is given the serial kernel: it serves until the variant is
        # compiled, see _LazyKernel)
        lines += [f"if {n} >= {PARALLEL_MIN_SIZE}:", f"    {pname}({', '.join([kname] + args)})",
                  "else:", f"    {kname}{call}"]
    else:
        lines.append(f"{kname}{call}")
    return lines


# ---- an opaque op computed by blocks of samples, its epilogue after each block ---------------
BLOCK_FORMS = ("flat", "row", "mid")
# samples per block: about this many output elements (256 KiB of float32: in L2 when the
# epilogue reads them back)
BLOCK_ELEMS = 1 << 16


def blocked_kernel(k: LoopKernel, fn: str, nbefore: int, nafter: int) -> str:
    """Source of ``kernel(n0, n1, N, r0.., L0.., O0.., p0.., sizes)``: for each block
    ``b0..b1`` of the samples ``n0..n1`` (of ``N``), ``fn(r<before>, b0, b1, r<after>)``
    computes the block of an opaque op's output, then the epilogue kernel ``E`` (global: the
    compiled ``k``) runs on it while it is in cache: its full leaves and outputs (flat,
    ``L``/``O``) sliced to the block, its other leaves whole, its sizes (those of the whole
    batch) scaled to the block."""
    nl, no = len(k.leaves), len(k.stores)
    rs = [f"r{i}" for i in range(nbefore + nafter)]
    sizes = {"flat": ["n"], "row": ["nr", "nc"], "mid": ["no", "nm", "ni"]}[k.form]
    params = ["n0", "n1", "N"] + rs + [f"L{i}" for i in range(nl)] + \
        [f"O{j}" for j in range(no)] + [f"p{i}" for i in range(k.nparams)] + sizes
    full = next(i for i, leaf in enumerate(k.leaves) if leaf.place == FULL)
    args = [f"L{i}[lo:hi]" if leaf.place == FULL else f"L{i}"
            for i, leaf in enumerate(k.leaves)]
    args += [f"O{j}[lo:hi]" for j in range(no)] + [f"p{i}" for i in range(k.nparams)]
    args += [f"{sizes[0]} // N * (b1 - b0)"] + sizes[1:]
    call = ", ".join(rs[:nbefore] + ["b0", "b1"] + rs[nbefore:])
    return "\n".join([
        f"def kernel({', '.join(params)}):",
        "    if N == 0:",
        "        return",
        f"    per = L{full}.size // N",
        f"    nb = max(1, {BLOCK_ELEMS} // max(per, 1))",
        "    for b0 in range(n0, n1, nb):",
        "        b1 = min(b0 + nb, n1)",
        f"        {fn}({call})",
        "        lo, hi = b0 * per, b1 * per",
        f"        E({', '.join(args)})"])


# ---- the host driver ---------------------------------------------------------------------------
#: compile a parallel variant on a thread of its own (False: in the run that first reaches its
#: size, as tests that count compilations want)
LAZY_THREAD = True


class _LazyKernel:
    """A parallel variant, compiled once a run first reaches its size (few do), on a thread of
    its own for that run's argument types: until it is ready, the serial kernel (``serial``)
    serves, so no run waits for it (a softmax's took 1.7 s). ``compiling``: that thread."""

    def __init__(self, source: str):
        self.source, self.fn, self.compiling, self.failed = source, None, None, None
        self._lock = threading.Lock()

    def __call__(self, serial, *args):
        fn = self.fn
        if fn is not None:
            return fn(*args)
        with self._lock:
            start = self.compiling is None and self.failed is None
            if start:
                self.compiling = True
        if start:
            self._start(args)
            if self.fn is not None:  # (compiled in this run: LAZY_THREAD off)
                return self.fn(*args)
        return serial(*args)

    def _start(self, args) -> None:
        import numba

        try:
            sig = tuple(numba.typeof(a) for a in args)
        except (TypeError, ValueError):
            sig = None

        def work():
            try:
                fn = compile_function(self.source, "kernel", parallel=True, target=NAME).fn
                if sig is not None:
                    fn.compile(sig)
                self.fn = fn
            except Exception as e:  # noqa: BLE001 - the serial kernel goes on serving
                self.failed = f"{type(e).__name__}: {e}"

        if not LAZY_THREAD:
            work()
            return
        # not a daemon: the interpreter waits for it at exit rather than unloading LLVM under
        # a compile that runs without the GIL
        self.compiling = threading.Thread(target=work, name="pdjit-parallel-variant",
                                          daemon=False)
        self.compiling.start()


class _HostRT:
    """``_rt`` as the host driver sees it: the same helpers (the GEMM with its thread policy,
    ``threads.gemm_threads``)."""
    bdim, check, gemm = staticmethod(rt.bdim), staticmethod(rt.check), staticmethod(rt.gemm)


_HOST_RT = _HostRT()


class HostDriver:
    """A segment's driver as a plain Python function that calls its compiled kernels: building
    it compiles nothing but the kernels Numba has not seen (at their first call).

    ``memory_optim``: the driver reuses the buffers of dead intermediates and releases each
    intermediate after its last use (``pdjit.codegen.memplan``; ``memory_plan`` says how)."""

    def __init__(self, gen, fn_name: str = "segment", memory_optim: bool = False):
        self.fn_name = fn_name
        self.source = gen.source(fn_name)
        self.memory_plan = None
        if memory_optim:
            gen.plan_memory()
            self.source, self.memory_plan = gen.source(fn_name), gen.memory_plan
        self.calls, self.lazy = list(gen.calls), list(gen.lazy)
        self.kernels = [c for _, c in self.calls]
        self.name = f"{fn_name}_" + hashlib.sha256(self.source.encode()).hexdigest()[:12]
        parts = [f"# host driver {self.name}", self.source]
        parts += [f"# {g} = {c.name}\n{c.text}" for g, c in self.calls]
        parts += [f"# {g}: parallel variant, compiled at its first call\n"
                  f"{module_text(src, 'kernel', parallel=True, target=NAME)}"
                  for g, src in self.lazy]
        self.text = "\n".join(parts)
        self.filename = f"<pdjit {self.name}>"
        # the 1-based source line of each group's comment: a traceback's line names the group
        self.group_lines = [k + 1 for k, line in enumerate(self.source.splitlines())
                            if line.lstrip().startswith("# group ")]
        self._build()

    def _namespace(self) -> dict:
        """The globals the driver runs with (a target's driver gives its own launchers)."""
        return {"np": np, "math": math, "_rt": _HOST_RT, "_nn": nnlib, "_mp": memplan}

    def _build(self) -> None:
        ns = self._namespace()
        ns.update({g: c.fn for g, c in self.calls})
        ns.update({g: _LazyKernel(src) for g, src in self.lazy})
        exec(compile(self.source, self.filename, "exec"), ns)  # noqa: S102
        self.fn = ns[self.fn_name]

    def reload_clean(self) -> None:
        """Reload every kernel without its cache files (a damaged cache), then rebind."""
        for c in self.kernels:
            c.reload_clean()
        self._build()


class NativeDriver:
    """A segment's driver compiled as one native function (``SegmentGen(native=True)``): the
    kernels and library calls of all its groups called from compiled code, no Python between
    them (a run of a small model costs a third of the host driver's at batch 1, measured on
    LeNet). Compiled at its first call and cached on disk by content, like every kernel; the
    plan measures it against the host driver and keeps the faster (``NativeStep``)."""

    def __init__(self, gen, fn_name: str = "segment"):
        self.compiled = compile_function(gen.source(fn_name), fn_name, parallel=gen.uses_prange,
                                         target=NAME, calls=gen.calls)
        self.name, self.text, self.fn = self.compiled.name, self.compiled.text, self.compiled.fn
        # prange loops inside (their threads are the cores: the plan runs it on the whole
        # batch, never on slices from threads of its own)
        self.parallel = gen.uses_prange

    def reload_clean(self) -> None:
        self.compiled.reload_clean()
        self.fn = self.compiled.fn
