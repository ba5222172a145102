"""The ``cuda`` target: the same kernel descriptions rendered as ``numba.cuda`` kernels, and a
host driver that launches them on device arrays.

A :class:`~pdjit.codegen.kernel.LoopKernel` takes the parameters it takes on the CPU
(``kernel(L0.., O0.., R0, p0.., sizes..)``; destination passing, flat 1-D arrays) and is
rendered per loop form:

- elementwise forms (``flat``, ``row``, ``mid``, ``strided``): one grid-stride loop over the
  output's elements, each thread computing the leaves' indices from the flat index (a ``row``
  leaf at ``i % nc``, a ``mid`` leaf at ``(i // ni) % nm``, a ``strided`` leaf by unravelling
  ``i`` over the run-time dims with per-leaf strides, 0 where it broadcasts);
- reductions (``reduce_all``, ``reduce_rows``, ``reduce_block``, ``reduce_strided``): one block
  per output element (grid-stride over the outputs), its threads striding over the reduced
  extent, then a tree reduction in shared memory (the op's combine rule merging partials).

The scalar statements are the ops' emit templates, unchanged: in a kernel module ``np`` and
``_m`` are :mod:`pdjit.codegen.cuda.mathfuncs` (device functions under NumPy's and the CPU
helpers' names). Opaque ops lower through this target's table
(:mod:`pdjit.codegen.cuda.lowerings`) to calls of the launchers in :mod:`pdjit.codegen.cuda.lib`
(GEMM, softmax rows, optimizer updates...), lines of the host driver, as the CPU's library
calls are.

The call site (:func:`call_site`) is the shared one of :mod:`pdjit.codegen.driver`,
allocating on the device (``_cu.empty``) and launching (``K[_cu.grid(n)](...)``); the host
driver (:class:`HostDriver`) is the shared one, executed with the CUDA launchers in its
namespace. No parallel or in-place variants, no native
drivers and no blocked epilogues: a CUDA kernel is already parallel, and the host driver only
launches.
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.codegen import driver
from pdjit.codegen.compiler import deps_hash
from pdjit.codegen.cuda.lowerings import LOWERINGS
from pdjit.codegen.kernel import FULL, MID, ROW, SCALAR, LoopKernel
from pdjit.codegen.target import Module, Target, register_target

NAME = "cuda"


def _tpb() -> int:
    """Threads per block of the reduction kernels (a constant of their text: the shared
    array's size). The simulator runs each thread as a Python thread: fewer there."""
    from pdjit.codegen.cuda import lib as cuda_lib

    return cuda_lib.threads_per_block()


def _sizes(k: LoopKernel) -> list:
    if k.form in ("strided", "reduce_strided"):
        dims = [f"d{d}" for d in range(k.rank)]
        strides = [f"s{i}_{d}" for i in range(len(k.leaves)) for d in range(k.rank)]
        return dims + strides
    return driver.loop_sizes(k)


def _params(k: LoopKernel) -> list:
    return driver.kernel_params(k, _sizes)


def argtypes(k: LoopKernel, leaf_dtypes: list) -> list:
    """The kernel's argument types as its call site passes them: every array 1-D."""
    types = [(dt, 1) for dt in leaf_dtypes]
    types += [(_dtype(t), 1) for _, t, _ in k.stores]
    if k.reduce is not None:
        types.append((_dtype(k.reduce.dtype), 1))
    return types + [float] * k.nparams + [int] * len(_sizes(k))


def _dtype(t: str) -> np.dtype:
    return np.dtype(bool) if t == "np.bool_" else np.dtype(t[3:])


def render(k: LoopKernel, parallel: bool = False, inplace: dict | None = None) -> str:
    """The source of ``def kernel(...)`` for ``k`` (a ``cuda.jit`` kernel once compiled)."""
    if parallel or inplace:
        raise ValueError("the cuda target has no parallel or in-place variants")
    body = _reduce(k) if k.reduce is not None else _elementwise(k)
    return "\n".join([f"def kernel({', '.join(_params(k))}):"] + ["    " + b for b in body])


def _indent(lines, n=1) -> list:
    return ["    " * n + line for line in lines]


def _hoisted(k: LoopKernel) -> list:
    return [f"x{i} = L{i}[0]" for i, leaf in enumerate(k.leaves) if leaf.place == SCALAR]


def _index_lines(k: LoopKernel, idx: str) -> tuple:
    """(lines computing each leaf's index for the element at flat index ``idx``, leaf index
    expressions)."""
    lines, at = [], {}
    if k.form in ("strided", "reduce_strided"):
        lines.append(f"t = {idx}")
        for i in range(len(k.leaves)):
            lines.append(f"b{i} = 0")
        for d in range(k.rank - 1, -1, -1):
            lines += [f"q = t % d{d}", f"t = t // d{d}"]
            lines += [f"b{i} += q * s{i}_{d}" for i in range(len(k.leaves))]
        return lines, {i: f"b{i}" for i in range(len(k.leaves))}
    if k.form == "row":
        lines.append(f"c = {idx} % nc")
    if k.form == "mid":
        lines.append(f"m = ({idx} // ni) % nm")
    for i, leaf in enumerate(k.leaves):
        if leaf.place == FULL:
            at[i] = idx
        elif leaf.place == ROW:
            at[i] = "c"
        elif leaf.place == MID:
            at[i] = "m"
    return lines, at


def _element(k: LoopKernel, idx: str) -> list:
    lines, at = _index_lines(k, idx)
    loads = [f"x{i} = L{i}[{at[i]}]" for i in sorted(at)]
    stores = [f"O{j}[{idx}] = {expr}" for j, (expr, _, _) in enumerate(k.stores)]
    return lines + loads + k.body + stores


def _total(k: LoopKernel) -> str:
    return {"flat": "n", "row": "nr * nc", "mid": "no * nm * ni",
            "strided": " * ".join(f"d{d}" for d in range(k.rank)) or "1"}[k.form]


def _elementwise(k: LoopKernel) -> list:
    return _hoisted(k) + [f"n_ = {_total(k)}", "i = cuda.grid(1)", "gs = cuda.gridsize(1)",
                          "while i < n_:"] + _indent(_element(k, "i") + ["i += gs"])


def _reduce(k: LoopKernel) -> list:
    red = k.reduce
    tpb = _tpb()
    rank = k.rank
    if k.form == "reduce_all":
        nout, m, elem = "1", "n", ["e = c"]
    elif k.form == "reduce_rows":
        nout, m, elem = "nr", "nc", ["e = o * nc + c"]
    elif k.form == "reduce_block":
        nout, m, elem = "no * ni", "nr", ["e = ((o // ni) * nr + c) * ni + o % ni"]
    else:  # strided: the output's kept dims from o, the reduced dims from c
        kept = [d for d in range(rank) if d not in red.axes]
        nout = " * ".join(f"d{d}" for d in kept) or "1"
        m = " * ".join(f"d{d}" for d in red.axes) or "1"
        elem = ["t = o"] + [f"b{i} = 0" for i in range(len(k.leaves))]
        for d in reversed(kept):
            elem += [f"j{d} = t % d{d}", f"t = t // d{d}"]
        elem.append("t = c")
        for d in reversed(red.axes):
            elem += [f"j{d} = t % d{d}", f"t = t // d{d}"]
        elem += [f"b{i} += j{d} * s{i}_{d}" for d in range(rank) for i in range(len(k.leaves))]
        elem.append("e = " + (" + ".join(
            f"j{d}" + "".join(f" * d{e}" for e in range(d + 1, rank)) for d in range(rank))
            or "0"))
    if k.form == "reduce_strided":
        at = {i: f"b{i}" for i in range(len(k.leaves))}
    else:
        at = {i: "e" for i, leaf in enumerate(k.leaves) if leaf.place == FULL}
    loads = [f"x{i} = L{i}[{at[i]}]" for i in sorted(at)]
    stores = [f"O{j}[e] = {expr}" for j, (expr, _, _) in enumerate(k.stores)]
    merge = red.merge.format(acc="sm[t0]", x="sm[t0 + w]")
    dt = red.dtype
    return _hoisted(k) + [
        f"sm = cuda.shared.array({tpb}, {dt})",
        "t0 = cuda.threadIdx.x",
        f"m_ = {m}",
        f"nout = {nout}",
        "o = cuda.blockIdx.x",
        "while o < nout:",
        f"    acc = {red.init}",
        "    c = t0",
        "    while c < m_:"] + _indent(elem + loads + k.body + stores +
                                      [f"acc = {red.combine.format(acc='acc')}",
                                       f"c += {tpb}"], 2) + [
        "    sm[t0] = acc",
        "    cuda.syncthreads()",
        f"    w = {tpb // 2}",
        "    while w > 0:",
        "        if t0 < w:",
        f"            sm[t0] = {merge}",
        "        cuda.syncthreads()",
        "        w //= 2",
        "    if t0 == 0:",
        f"        R0[o] = {red.finalize.format(acc='sm[0]', n='m_')}",
        "    cuda.syncthreads()",
        "    o += cuda.gridDim.x"]


# ---- the module a kernel is compiled in --------------------------------------------------------
def module_text(fn_source: str, fn_name: str, header: str) -> Module:
    """The generated module of a CUDA kernel: ``np`` and ``_m`` are the device functions of
    ``cuda.mathfuncs`` (its text is part of the module's, through ``dependencies``: a change
    there is a new kernel), the function a ``cuda.jit`` kernel with numba-cuda's disk cache
    where the module has a file (``cuda.mathfuncs.kernel``): on a GPU a second process loads
    it compiled."""
    return Module.around([
        f"# generated by pdjit; deps {deps_hash(NAME)[:16]}; target cuda", header,
        "import math", "", "import numba", "from numba import cuda", "",
        "from pdjit.codegen.cuda import mathfuncs as _m",
        "from pdjit.codegen.cuda.mathfuncs import np", "", "",
        "@_m.kernel"], fn_source, [""])


# ---- call sites --------------------------------------------------------------------------------
def call_site(k: LoopKernel, fresh, flats: dict, leaves: list, stores: list,
              red_out: str | None, params: list, kname: str, pname: str | None = None) -> list:
    """The shared call site (shapes computed and checked on the host, outputs allocated on the
    device), then the launch: a grid over the elements, or one block per reduction output."""
    lines, args = driver.call_site(k, fresh, flats, leaves, stores, red_out, params, None,
                                   alloc="_cu.empty")
    red = k.reduce
    dims = None
    if k.form in ("strided", "reduce_strided"):
        more, args, dims = _strided_args(k, fresh, leaves, stores, red_out, args)
        lines += more
    if red is None:
        n = fresh("n")
        total = " * ".join(dims) if dims is not None else {
            "flat": f"{args[-1]}", "row": f"{args[-2]} * {args[-1]}",
            "mid": f"{args[-3]} * {args[-2]} * {args[-1]}"}[k.form]
        lines += [f"{n} = {total or '1'}", f"if {n} > 0:",
                  f"    {kname}[_cu.grid({n})]({', '.join(args)})"]
        return lines
    nout = fresh("nout")
    if k.form == "reduce_all":
        lines.append(f"{nout} = 1")
    elif k.form == "reduce_rows":
        lines.append(f"{nout} = {args[-2]}")
    elif k.form == "reduce_block":
        lines.append(f"{nout} = {args[-3]} * {args[-1]}")
    else:
        lines.append(f"{nout} = {red_out}.size")
    lines += [f"if {nout} > 0:", f"    {kname}[_cu.blocks({nout})]({', '.join(args)})"]
    return lines


def _strided_args(k: LoopKernel, fresh, leaves, stores, red_out, args) -> tuple:
    """(lines that check a strided kernel's shapes on the host and compute its dims and
    per-leaf strides, the kernel's arguments: flat arrays, params, dims, strides; the dims'
    locals)."""
    rank = k.rank
    lines = []
    dims = [fresh("d") for _ in range(rank)]
    for d in range(rank):
        acc = "1"
        for loc, leaf in zip(leaves, k.leaves):
            if leaf.offset <= d < leaf.offset + leaf.rank:
                acc = f"_rt.bdim({acc}, {loc}.shape[{d - leaf.offset}])"
        lines.append(f"{dims[d]} = {acc}")
    for _, _, cone in k.stores:  # a stored value covers the whole iteration shape
        for d in range(rank):
            cover = [f"{loc}.shape[{d - leaf.offset}] == {dims[d]}"
                     for i, (loc, leaf) in enumerate(zip(leaves, k.leaves))
                     if i in cone and leaf.offset <= d < leaf.offset + leaf.rank]
            lines.append(f"_rt.check({' or '.join([f'{dims[d]} == 1'] + cover)})")
    red = k.reduce
    if red is not None and not red.identity:
        kept = " * ".join(dims[d] for d in range(rank) if d not in red.axes) or "1"
        m = " * ".join(dims[d] for d in red.axes) or "1"
        lines.append(f"_rt.check({m} > 0 or ({kept}) == 0)")
    strides = []
    for loc, leaf in zip(leaves, k.leaves):
        for d in range(rank):
            s = fresh("st")
            if leaf.offset <= d < leaf.offset + leaf.rank:
                j = d - leaf.offset
                later = " * ".join(f"{loc}.shape[{q}]" for q in range(j + 1, leaf.rank)) or "1"
                lines.append(f"{s} = 0 if {loc}.shape[{j}] == 1 else {later}")
            else:
                lines.append(f"{s} = 0")
            strides.append(s)
    arrays = list(leaves) + list(stores) + ([red_out] if red is not None else [])
    flat = []
    for a in arrays:
        f = fresh("f")
        lines.append(f"{f} = {a}.reshape({a}.size)")
        flat.append(f)
    return lines, flat + list(args[len(arrays):]) + dims + strides, dims


# ---- the host driver ---------------------------------------------------------------------------
class HostDriver(driver.HostDriver):
    """A segment's driver: plain Python launching the segment's CUDA kernels and the
    launchers of ``cuda.lib`` on device arrays."""

    def __init__(self, gen, fn_name: str = "segment", memory_optim: bool = False):
        super().__init__(gen, fn_name, memory_optim=False)
        #: (Compiled, argument types) of the generated kernels whose types were known when
        #: the driver was built: what a PTX check compiles (``ptx``)
        self.device_jobs = list(gen.device_jobs)

    def _bind(self, ns: dict) -> None:
        ns.update({g: _Launcher(c) for g, c in self.calls})

    def _namespace(self) -> dict:
        from pdjit.codegen.cuda import lib as cuda_lib

        return {"np": np, "math": math, "_rt": cuda_lib.RT, "_cu": cuda_lib}


#: when a dict: every launch of a generated kernel adds ``(module name, argument types) ->
#: (module text, Numba types)`` (the PTX checks compile exactly what ran)
RECORD: dict | None = None


class _Launcher:
    """A generated kernel as the driver launches it (``K[grid](args)``)."""

    __slots__ = ("compiled",)

    def __init__(self, compiled):
        self.compiled = compiled

    def __getitem__(self, config):
        launch = self.compiled.fn[config]
        if RECORD is None:
            return launch

        def recorded(*args):
            sig = tuple(_numba_type(a) for a in args)
            RECORD.setdefault((self.compiled.name, sig), (self.compiled.text, sig))
            return launch(*args)
        return recorded


def _numba_type(value):
    import numba

    if hasattr(value, "copy_to_host"):  # a device array (the simulator's: its host array)
        host = np.asarray(value) if hasattr(value, "_ary") else None
        if host is not None:
            return numba.typeof(host)
        layout = "C" if value.is_c_contiguous() else "A"
        return numba.types.Array(numba.from_dtype(value.dtype), value.ndim, layout)
    return numba.typeof(value)


def numba_signature(argtypes) -> tuple:
    """Numba types of a kernel's predicted arguments (``(dtype, ndim)`` per array, ``float``
    or ``int`` per scalar)."""
    import numba
    from numba.core import types

    out = []
    for t in argtypes:
        if t is float:
            out.append(types.float64)
        elif t is int:
            out.append(types.int64)
        else:
            dt, nd = t
            out.append(types.Array(numba.from_dtype(np.dtype(dt)), nd, "C"))
    return tuple(out)


def ptx(compiled, argtypes, cc=(8, 0)) -> str:
    """The PTX of a generated kernel for these argument types (``(dtype, ndim)``/``float``/
    ``int``, or Numba types) and compute capability (needs NVVM, e.g. from
    ``numba-cuda[cu13]``; no GPU)."""
    from numba import cuda as _cuda
    from numba.core import types as _types

    kernel = compiled.fn
    fn = getattr(kernel, "py_func", kernel)
    sig = tuple(argtypes) if all(isinstance(t, _types.Type) for t in argtypes) else \
        numba_signature(argtypes)
    text, _ = _cuda.compile_ptx(fn, sig, cc=cc)
    return text


class CudaTarget(Target):
    """NVIDIA GPUs through ``numba.cuda``: every kernel a grid (no ``prange`` or in-place
    variants, no blocked epilogues, no native drivers), compiled at its first launch."""
    name = NAME
    lowerings = LOWERINGS
    device = True
    alloc_module = "_cu"
    library = "_cu"
    render = staticmethod(render)
    argtypes = staticmethod(argtypes)
    host_driver = HostDriver
    dependencies = ("pdjit.codegen.cuda.mathfuncs",)

    def require(self, what: str) -> None:
        from pdjit.codegen.cuda import device

        device.require(what)

    def available(self) -> bool:
        from pdjit.codegen.cuda import device

        return device.available()

    def simulated(self) -> bool:
        from pdjit.codegen.cuda import device

        return device.simulator()

    def device_count(self) -> int:
        from pdjit.codegen.cuda import device

        if not device.available():
            return 0
        try:
            return len(device.cuda().gpus)
        except Exception:  # noqa: BLE001 - a driver that lists nothing
            return 0

    def unavailable_reason(self) -> str:
        from pdjit.codegen.cuda import device

        return device.unavailable_reason()

    def to_device(self, array):
        from pdjit.codegen.cuda import device

        return device.to_device(array)

    def to_host(self, value):
        from pdjit.codegen.cuda import device

        return device.to_host(value)

    def is_device_array(self, value) -> bool:
        from pdjit.codegen.cuda import device

        return device.is_device_array(value)

    def lod_offsets(self, offsets: list) -> list:
        """Host values and their device copies (made once per offsets array, counted)."""
        from pdjit.codegen.cuda import device

        return [device.offsets(h) for h in offsets]

    def call_site(self, k, fresh, flats, leaves, stores, red_out, params, kname, pname=None,
                  inplace=None, parallel_min_size=0):
        if inplace:
            raise ValueError("the cuda target has no in-place variants")
        return call_site(k, fresh, flats, leaves, stores, red_out, params, kname, pname)

    def module_text(self, fn_source: str, fn_name: str, header: str, parallel: bool = False,
                    calls=()) -> Module:
        return module_text(fn_source, fn_name, header)

    def loop_kernel(self, var: str, params: list, before: list, body: list) -> str:
        """A grid-stride loop: thread ``cuda.grid(1)`` runs ``var`` = its index, then every
        grid size further."""
        return "\n".join([f"def kernel({', '.join(list(params) + ['n_'])}):"]
                         + ["    " + line for line in before]
                         + [f"    {var} = cuda.grid(1)", "    gs_ = cuda.gridsize(1)",
                            f"    while {var} < n_:"]
                         + ["        " + line for line in body]
                         + [f"        {var} += gs_"])

    def launch(self, kernel: str, n: str, args: list) -> str:
        return f"{kernel}[_cu.grid({n})]({', '.join(args)})"


TARGET = register_target(CudaTarget())
