"""The call-site and driver skeleton every target uses: the parameters of a loop kernel, the
lines that check the run-time shapes, allocate the outputs and call a kernel, and the host
driver (a segment's lines run as plain Python). A target gives what differs: its loop sizes,
its allocation, its launch, the globals its driver runs with.

``bdim`` and ``check`` are the shape helpers the call sites' lines call (``_rt.bdim``,
``_rt.check`` in every target's driver); the CPU also compiles them into kernels (its ``rt``
overloads them), so this file is part of the hash of every generated module
(``compiler.deps_hash``).
"""
from __future__ import annotations

import hashlib

from pdjit.codegen.kernel import FULL, MID, ROW, SCALAR, LoopKernel
from pdjit.codegen.pysource import compile_source

MISFIT = "pdjit: operand shapes do not fit the kernel's loop form"
EMPTY = "pdjit: a reduction without identity over an empty extent"


def bdim(acc, d):
    """Broadcast one more size into a dim: 1 gives way to anything; else sizes must agree."""
    if acc == 1:
        return d
    if d == 1 or d == acc:
        return acc
    raise ValueError("pdjit: operand shapes do not broadcast")


def check(cond):
    """Raise ``ValueError`` unless ``cond``: a shape that does not fit (the executor then
    re-runs the ops with their references, which say precisely what was wrong)."""
    if not cond:
        raise ValueError("pdjit: operand shapes do not fit")


def prod(sh: str, lo: int, hi: int) -> str:
    return " * ".join(f"{sh}[{d}]" for d in range(lo, hi)) or "1"


def loop_sizes(k: LoopKernel) -> list:
    """The size parameters of a kernel of ``k``'s loop form (after its arrays and attributes)."""
    return {"flat": ["n"], "row": ["nr", "nc"], "mid": ["no", "nm", "ni"], "reduce_all": ["n"],
            "reduce_rows": ["nr", "nc"], "reduce_block": ["no", "nr", "ni"]}.get(k.form, [])


def kernel_params(k: LoopKernel, sizes=loop_sizes) -> list:
    """A kernel's parameters: leaves, stores, the reduction's output, numeric attributes, then
    the sizes (``sizes(k)``: a target's own loop sizes)."""
    names = [f"L{i}" for i in range(len(k.leaves))] + [f"O{j}" for j in range(len(k.stores))]
    if k.reduce is not None:
        names.append("R0")
    return names + [f"p{i}" for i in range(k.nparams)] + sizes(k)


# ---- call sites --------------------------------------------------------------------------------
def call_site(k: LoopKernel, fresh, flats: dict, leaves: list, stores: list,
              red_out: str | None, params: list, kname: str, pname: str | None = None,
              alloc: str = "np.empty", inplace: dict | None = None,
              parallel_min_size: int = 0) -> list:
    """Lines that compute the run-time iteration shape, check it, allocate the outputs (locals
    ``stores`` and ``red_out``, in the order of ``k.stores``), and call the kernel global
    ``kname`` (``pname``: its parallel variant, called from ``parallel_min_size`` elements on).
    ``leaves``: the local arrays of ``k.leaves``; ``params``: the parameters' sources;
    ``fresh(hint)`` gives new local names; ``flats`` maps a local to the local of its 1-D view
    (read and extended: each view is made once per driver). With ``kname=None``: ``(lines,
    arguments)`` without the call. ``alloc``: the function that allocates the outputs (another
    target's device allocation: the ``cuda`` target allocates on its device). ``inplace``
    ``{store j: leaf i}`` (a flat form; the kernel the variant ``render(k, inplace=...)``):
    stored value ``j`` is not allocated: its local is leaf ``i``'s array, which the kernel
    overwrites."""
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
            lines += [f"if not ({' and '.join(conds)}):", f"    raise ValueError({MISFIT!r})"]
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
        lines += [f"{nr} = {prod(sh, 0, r0 - k.row_rank)}",
                  f"{nc} = {prod(sh, r0 - k.row_rank, r0)}"]
        if pname is not None:
            lines.append(f"{n} = {leaves[first]}.size")
        args += [nr, nc]
    elif k.form == "mid":
        a, b = k.mid
        n, no, nm, ni = fresh("n"), fresh("no"), fresh("nm"), fresh("ni")
        lines += [f"{no} = {prod(sh, 0, a)}", f"{nm} = {prod(sh, a, b)}",
                  f"{ni} = {prod(sh, b, r0)}"]
        if pname is not None:
            lines.append(f"{n} = {leaves[first]}.size")
        args += [no, nm, ni]
    elif k.form == "reduce_rows":
        a = red.axes[0]
        nr, nc = fresh("nr"), fresh("nc")
        lines += [f"{nr} = {prod(sh, 0, a)}", f"{nc} = {prod(sh, a, r0)}"]
        args += [nr, nc]
    elif k.form == "reduce_block":
        a, b = red.axes[0], red.axes[-1] + 1
        no, nr, ni = fresh("no"), fresh("nr"), fresh("ni")
        lines += [f"{no} = {prod(sh, 0, a)}", f"{nr} = {prod(sh, a, b)}",
                  f"{ni} = {prod(sh, b, r0)}"]
        args += [no, nr, ni]
    if red is not None and not red.identity and k.form != "reduce_strided":
        # nothing to reduce into a non-empty output: the reference says what is wrong
        empty = {"reduce_all": f"{args[-1]} == 0",
                 "reduce_rows": f"{args[-1]} == 0 and {args[-2]} > 0",
                 "reduce_block": f"{args[-2]} == 0 and {args[-3]} * {args[-1]} > 0"}[k.form]
        lines += [f"if {empty}:", f"    raise ValueError({EMPTY!r})"]
    if kname is None:  # the caller calls: the lines that prepare, and the arguments
        return lines, args
    call = f"({', '.join(args)})"
    if pname is not None and k.form in ("flat", "row", "mid"):
        # (the parallel variant is given the serial kernel: it serves until the variant is
        # compiled, see the CPU target's _LazyKernel)
        lines += [f"if {n} >= {parallel_min_size}:", f"    {pname}({', '.join([kname] + args)})",
                  "else:", f"    {kname}{call}"]
    else:
        lines.append(f"{kname}{call}")
    return lines


# ---- the host driver ---------------------------------------------------------------------------
class HostDriver:
    """A segment's driver as a plain Python function that calls its compiled kernels: building
    it compiles nothing but the kernels Numba has not seen (at their first call). A target's
    driver gives the globals the driver's lines run with (``_namespace``), how a kernel is
    bound (``_bind``) and the text of its lazily compiled variants (``_lazy_text``).

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
        #: the driver's lines call the host's BLAS (an opaque lowering declared ``blas``)
        self.calls_blas = gen.calls_blas
        self.kernels = [c for _, c in self.calls]
        self.name = f"{fn_name}_" + hashlib.sha256(self.source.encode()).hexdigest()[:12]
        parts = [f"# host driver {self.name}", self.source]
        parts += [f"# {g} = {c.name}\n{c.text}" for g, c in self.calls]
        parts += [f"# {g}: parallel variant, compiled at its first call\n"
                  f"{self._lazy_text(src)}"
                  for g, src in self.lazy]
        self.text = "\n".join(parts)
        self.filename = f"<pdjit {self.name}>"
        # the 1-based source line where each group begins, as the generator placed them: a
        # traceback's line names the group
        self.group_lines = [line for line, _ in gen.group_lines()]
        self.joined = frozenset(gen.joined)  # groups run by the previous group's call
        self._build()

    def _namespace(self) -> dict:
        """The globals the driver's lines run with (the target's helpers and library)."""
        raise NotImplementedError

    def _bind(self, ns: dict) -> None:
        """Bind the driver's kernels (``self.calls``, ``self.lazy``) in ``ns``."""
        ns.update({g: c.fn for g, c in self.calls})

    def _lazy_text(self, source: str) -> str:
        """The module text of a variant compiled at its first call (for ``text``)."""
        return source

    def _exec(self, source: str, filename: str, extra: dict | None = None):
        ns = self._namespace()
        self._bind(ns)
        ns.update(extra or {})
        exec(compile_source(source, filename), ns)  # noqa: S102
        return ns[self.fn_name]

    def _build(self) -> None:
        self.fn = self._exec(self.source, self.filename)

    def timed(self, tick):
        """This driver with ``tick(k)`` called as each group ``k >= 1`` starts (a profiler's
        hook, ``pdjit.runtime.profile``), but for a group of :attr:`joined` (the previous
        group's opaque op runs its ops as it stores: the two are timed as one): the same source
        and kernels otherwise."""
        starts = {at: k for k, at in enumerate(self.group_lines) if k and k not in self.joined}
        lines = []
        for n, line in enumerate(self.source.splitlines(), 1):
            if n in starts:
                lines.append(f"{line[:len(line) - len(line.lstrip())]}_tick({starts[n]})")
            lines.append(line)
        return self._exec("\n".join(lines), f"<pdjit {self.name} timed>", {"_tick": tick})

    def reload_clean(self) -> None:
        """Reload every kernel without its cache files (a damaged cache), then rebind."""
        for c in self.kernels:
            c.reload_clean()
        self._build()


