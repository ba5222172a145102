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

The loops are the sequential ones of :mod:`pdjit.codegen.sequential`, compiled by Numba.
Parallel variants (``numba.prange`` over the outer loop) of the flat and row forms are rendered
separately and compiled only when a run first reaches :data:`PARALLEL_MIN_SIZE` elements.
"""
from __future__ import annotations

import math
import threading
import weakref

import numba
import numpy as np

from pdjit.codegen import driver, memplan, params
from pdjit.codegen.compiler import (
    LibraryKernel,
    compile_function,
    deps_hash,
    kernel_cost,
    module_text,
)
from pdjit.codegen.cpu import lib as nnlib
from pdjit.codegen.cpu import mathfuncs, rt, threads
from pdjit.codegen.cpu.lib._jit import llvm_level
from pdjit.codegen.cpu.lowerings import LOWERINGS
from pdjit.codegen.kernel import FULL, LoopKernel
from pdjit.codegen.sequential import INPLACE_FORMS, argtypes, render  # noqa: F401
from pdjit.codegen.target import Module, Target, register_target

NAME = "cpu"

# no cache=True: pdjit's own disk cache is attached once the module is loaded
# (``compiler._load``); pipeline_class: LLVM at pdjit's own level (cpu.lib._jit.OPT_LEVEL), not
# the user's NUMBA_OPT; no C-callable wrapper (nothing takes a kernel's address: ~0.02 s less
# compile per function)
JIT_OPTIONS = ("error_model='numpy', nogil=True, no_cfunc_wrapper=True, "
               "pipeline_class=_PdjitCompiler")
PARALLEL_OPTIONS = JIT_OPTIONS + ", parallel=True"

# Below this many elements a parallel loop loses to its thread start-up. Alone, the break-even
# of numba's prange on 2 cores is ~1e3-1e4 elements (at 6.5e4 two threads win); between other
# kernels of a network, whose threads the waiting OpenMP threads must wake after, it is far
# higher (measured: LeNet's bias + relu over 221,184 elements took 337 us on 2 threads and
# 56 us on one). From 64 K elements, on two threads: DenseNet-121 at batch 1 5 % faster (its
# batch-norm + relu kernels over each concat split), but an 8-layer ResNet-style training step
# at batch 16 41 -> 44-47 ms and LeNet-5 at batch 64 4 % slower.
PARALLEL_MIN_SIZE = 1 << 20
#: ... in an inference block (one that writes no persistable), from 64 K elements: there the
#: elementwise ops left between the library's kernels (whose own threads are the ones then
#: awake) are an activation a convolution's epilogue does not take, or a gate's product
#: (measured, PaddlePaddle's MobileNetV3-small at batch 1 on two threads, its hard_swish over
#: the stem's 16 x 112 x 112 outputs 58 -> 31 us, the run 1.64 -> 1.45 ms; LeNet-5 at batch
#: 64 as fast). A training block keeps the larger threshold (the ResNet-style training step
#: above, measured again: 43-44 ms, one run of two 50 ms, at 64 K)
INFERENCE_PARALLEL_MIN_SIZE = 1 << 16
#: a loop kernel that calls math functions (exp, tanh, erf: tens of instructions an element)
#: runs on the threads from this many times fewer elements (as softmax's rows do, measured:
#: ``ctx.loop``'s ``work``)
MATH_WORK = 16


def parallel_min_elements(k: LoopKernel, size: int = 0) -> int:
    """The elements from which the loop kernel ``k`` runs its parallel variant (``size``:
    the block's threshold for elementwise loops, 0: :data:`PARALLEL_MIN_SIZE`)."""
    return (size or PARALLEL_MIN_SIZE) // (MATH_WORK if k.math else 1)


def call_site(k: LoopKernel, fresh, flats: dict, leaves: list, stores: list,
              red_out: str | None, params: list, kname: str, pname: str | None = None,
              inplace: dict | None = None, parallel_min_size: int = 0) -> list:
    """The shared call site (:func:`pdjit.codegen.driver.call_site`): outputs allocated with
    NumPy, the parallel variant ``pname`` called from :func:`parallel_min_elements`."""
    return driver.call_site(k, fresh, flats, leaves, stores, red_out, params, kname, pname,
                            inplace=inplace,
                            parallel_min_size=parallel_min_elements(k, parallel_min_size))


# ---- an opaque op computed by blocks of samples, its epilogue after each block ---------------
BLOCK_FORMS = ("flat", "row", "mid")
# samples per block: about this many output elements (256 KiB of float32: in L2 when the
# epilogue reads them back)
BLOCK_ELEMS = 1 << 16


def blocked_kernel(k: LoopKernel, fn: str, nbefore: int, nafter: int,
                   parallel: bool = False, host: bool = False, parallel_min_size: int = 0) -> str:
    """Source of ``kernel(n0, n1, N, r0.., L0.., O0.., p0.., sizes)``: for each block
    ``b0..b1`` of the samples ``n0..n1`` (of ``N``), ``fn(r<before>, b0, b1, r<after>)``
    computes the block of an opaque op's output, then the epilogue kernel ``E`` (global: the
    compiled ``k``) runs on it while it is in cache: its full leaves and outputs (flat,
    ``L``/``O``) sliced to the block, its other leaves whole, its sizes (those of the whole
    batch) scaled to the block. ``parallel`` (a host driver's): ``kernel(n0, n1, N, EP, W,
    ...)`` where ``EP`` is the epilogue's parallel variant (a :class:`_LazyKernel`), which
    runs a block of :func:`parallel_min_elements` (of ``parallel_min_size``: the block's
    threshold, 0: the target's) or more where the call has the whole batch
    (one the host driver did not split by samples over threads, whose parts would each start
    a team of their own: a batch of one, an encoder's gelu after its first feed-forward
    product); and a batch of one sample goes through ``split_work`` (``W``: the op's work),
    which splits one sample's convolution over threads by its channels or pixels as it does
    for the op without an epilogue (MobileNetV3's convolutions before a hard_swish).

    ``host``: run as Python (``compiler.HostFunction``), the function is declared a
    ``"leaves"`` entry of the replay recorder (``replay.declare``) and makes each call through
    ``replay.kernel_call``, so that a recorded host driver replays the kernels it ends in, not
    its loop."""
    nl, no = len(k.leaves), len(k.stores)
    rs = [f"r{i}" for i in range(nbefore + nafter)]
    sizes = {"flat": ["n"], "row": ["nr", "nc"], "mid": ["no", "nm", "ni"]}[k.form]
    params = ["n0", "n1", "N"] + (["EP", "W"] if parallel else []) + rs + \
        [f"L{i}" for i in range(nl)] + [f"O{j}" for j in range(no)] + \
        [f"p{i}" for i in range(k.nparams)] + sizes
    full = next(i for i, leaf in enumerate(k.leaves) if leaf.place == FULL)
    args = [f"L{i}[lo:hi]" if leaf.place == FULL else f"L{i}"
            for i, leaf in enumerate(k.leaves)]
    args += [f"O{j}[lo:hi]" for j in range(no)] + [f"p{i}" for i in range(k.nparams)]
    args += [f"{sizes[0]} // N * (b1 - b0)"] + sizes[1:]
    call = ", ".join(rs[:nbefore] + ["b0", "b1"] + rs[nbefore:])
    def called(f, a):  # (a host function's calls through the recorder's hook)
        return f"_kc({f}, {a})" if host else f"{f}({a})"

    epilogue = [f"        {called('E', ', '.join(args))}"]
    if parallel:
        epilogue = [f"        if hi - lo >= {parallel_min_elements(k, parallel_min_size)} "
                    "and n1 - n0 == N:",
                    f"            {called('EP', ', '.join(['E'] + args))}",
                    "        else:", "    " + epilogue[0]]
    body = [f"        {called(fn, call)}"]
    if parallel:
        body = ["        if N == 1:",
                f"            _nn.split_work({', '.join([fn, '1', 'W'] + rs)}, head={nbefore})",
                "        else:", "    " + body[0]]
    return "\n".join([
        f"def kernel({', '.join(params)}):",
        "    if N == 0:",
        "        return",
        f"    per = L{full}.size // N",
        f"    nb = max(1, {BLOCK_ELEMS} // max(per, 1))",
        "    for b0 in range(n0, n1, nb):",
        "        b1 = min(b0 + nb, n1)",
        *body,
        "        lo, hi = b0 * per, b1 * per",
        *epilogue] + (["", "", "_rp_declare('leaves', kernel)"] if host else []))


# ---- the host driver ---------------------------------------------------------------------------
#: compile a parallel variant on a thread of its own (False: in the run that first reaches its
#: size, as tests that count compilations want)
LAZY_THREAD = True


class _LazyKernel:
    """A parallel variant, compiled once a run first reaches its size (few do), on a thread of
    its own for that run's argument types: until it is ready, the serial kernel (``serial``)
    serves, so no run waits for it (a softmax's took 1.7 s). ``compiling``: that thread."""

    #: called as ``(serial kernel, *args)``, its compiled variant ``fn`` once ready (what a
    #: host driver's recording records: ``replay``)
    takes_serial = True

    def __init__(self, source: str):
        self.source, self.fn, self.compiling, self.failed = source, None, None, None
        self._lock = threading.Lock()

    def __call__(self, serial, *args):
        fn = self.fn
        if fn is not None:
            threads.place_team()  # (its threads off this one's core: see there)
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
                with threads.background():
                    fn = compile_function(self.source, "kernel", parallel=True,
                                          target=NAME).fn
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


class HostDriver(driver.HostDriver):
    """A segment's driver: plain Python calling its compiled kernels, the library kernels of
    :mod:`pdjit.codegen.cpu.lib` (``_nn``) and the helpers of :mod:`pdjit.codegen.cpu.rt`
    (``_rt``); a parallel variant is compiled at its first call."""

    def _namespace(self) -> dict:
        return {"np": np, "math": math, "_rt": _HOST_RT, "_nn": nnlib, "_mp": memplan}

    def _bind(self, ns: dict) -> None:
        super()._bind(ns)
        ns.update({g: _LazyKernel(src) for g, src in self.lazy})

    def _lazy_text(self, source: str) -> str:
        return module_text(source, "kernel", parallel=True, target=NAME)


class NativeDriver:
    """A segment's driver compiled as one native function (``SegmentGen(native=True)``): the
    kernels and library calls of all its groups called from compiled code, no Python between
    them (a run of a small model costs a third of the host driver's at batch 1, measured on
    LeNet). Compiled at its first call and cached on disk by content, like every kernel; the
    plan measures it against the host driver and keeps the faster (``tiers.DriverTiers``)."""

    def __init__(self, gen, fn_name: str = "segment"):
        self.compiled = compile_function(gen.source(fn_name), fn_name, parallel=gen.uses_prange,
                                         target=NAME, calls=gen.calls)
        self.name, self.text = self.compiled.name, self.compiled.text
        self._derived = [(_library(name), where, consts)
                         for name, where, consts in gen.derived_requests]
        self.fn = self._callable()
        #: ``(module line, op types)`` per group, as the generator placed them: which group
        #: a compile error's line is in
        self.module_groups = [(self.compiled.first_line + line - 1, ops)
                              for line, ops in gen.group_lines()]
        # prange loops inside, its own or a kernel's (their threads are the cores: the plan
        # runs it on the whole batch, never on slices from threads of its own)
        self.parallel = self.compiled.parallel

    def reload_clean(self) -> None:
        self.compiled.reload_clean()
        self.fn = self._callable()

    def compile(self, values, sig: tuple) -> None:
        """Compile for a run's arguments ``values``, of the Numba types ``sig``."""
        if self._derived:
            sig = tuple(sig) + tuple(numba.typeof(v) for v in self.fn.values(values))
        self.compiled.fn.compile(sig)

    def _callable(self):
        return DerivedArgs(self.compiled.fn, self._derived) if self._derived else \
            self.compiled.fn


def _library(name: str):
    """The library function ``name`` (``"rnn_weight_table"``, ``"conv._fwd_range"``)."""
    fn = nnlib
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


class DerivedArgs:
    """A native driver called with the values derived from its weights after the run's
    arguments (``SegmentGen.derived_requests``: ``(fn, where, consts)``, the value
    ``fn(*[args[i] or a tuple of them for i in where], *consts)``), computed by the host and
    kept while the weights are the same arrays and :func:`pdjit.codegen.params.generation`
    has not moved (nothing was written that a value was derived from). A GRU classifier at
    batch 1 spent 20 of its ~120 us a run packing its weights in compiled code."""

    def __init__(self, fn, requests):
        self.fn, self.requests = fn, requests
        self.reads = sorted({i for _, where, _ in requests for w in where
                             for i in (w if isinstance(w, tuple) else (w,))})
        self._refs, self._generation, self._values = (), -1, ()

    def __call__(self, *args):
        return self.fn(*args, *self.values(args))

    def values(self, args) -> tuple:
        refs, gen = self._refs, params.generation()
        if gen != self._generation or len(refs) != len(self.reads) or \
                not all(r() is args[i] for r, i in zip(refs, self.reads)):
            self._values = tuple(
                fn(*[tuple(args[i] for i in w) if isinstance(w, tuple) else args[w]
                     for w in where], *consts)
                for fn, where, consts in self.requests)
            self._refs = tuple(weakref.ref(args[i]) for i in self.reads)
            self._generation = gen  # (as before making them: a write meanwhile makes them again)
        return self._values


class CpuTarget(Target):
    """The CPU: Numba functions, ``prange`` variants, in-place variants, blocked epilogues,
    native drivers, library kernels compiled ahead of their first call."""
    name = NAME
    lowerings = LOWERINGS
    generic_lowerings = True
    parallel_min_size = PARALLEL_MIN_SIZE
    inference_parallel_min_size = INFERENCE_PARALLEL_MIN_SIZE
    parallel_variants = True
    precompile = True
    inplace_forms = INPLACE_FORMS
    block_forms = BLOCK_FORMS
    native_drivers = True
    library = "_nn"
    render = staticmethod(render)
    argtypes = staticmethod(argtypes)
    call_site = staticmethod(call_site)
    blocked_kernel = staticmethod(blocked_kernel)
    host_driver = HostDriver
    native_driver = NativeDriver

    #: what generated modules call: their source is in every kernel's cache key, their
    #: dispatchers' disk caches are hardened before the first compile
    dependencies = ("pdjit.codegen.cpu.rt", "pdjit.codegen.cpu.mathfuncs", "pdjit.codegen.cpu.lib")

    def module_text(self, fn_source: str, fn_name: str, header: str, parallel: bool = False,
                    calls=()) -> Module:
        """Imports (math functions ``_m``, runtime helpers ``_rt``, the library ``_nn``), the
        kernels it calls (bound by module name: ``compiler.load_kernel``) and the function
        under ``@numba.njit``."""
        from pdjit.version import __version__

        lines = [f"# generated by pdjit {__version__}; deps {deps_hash(NAME)[:16]}; "
                 f"target {NAME}",
                 "import math", "", "import numba", "import numpy as np", "",
                 "from pdjit.codegen.cpu import mathfuncs as _m",
                 "from pdjit.codegen.cpu import rt as _rt",
                 "from pdjit.codegen.cpu import lib as _nn",
                 "from pdjit.codegen.cpu.lib._jit import PdjitCompiler as _PdjitCompiler", ""]
        if calls:
            lines += ["from pdjit.codegen.compiler import load_kernel as _kernel", ""]
            lines += [f"{g} = _kernel({c.name!r}, {c.fn_name!r})" for g, c in calls]
        options = PARALLEL_OPTIONS if parallel else JIT_OPTIONS
        return Module.around(lines + ["", "", f"@numba.njit({options})"], fn_source, [""])

    def function_globals(self) -> dict:
        from pdjit.codegen.cpu import replay

        return {"math": math, "np": np, "_m": mathfuncs, "_rt": rt, "_nn": nnlib,
                "_kc": replay.kernel_call, "_rp_declare": replay.declare}

    def warmup_jobs(self, dtypes) -> list:
        """Every entry point the library declares jobs for, and each math function through a
        small kernel, for float data of each of ``dtypes``."""
        jobs = [(_library_kernel(fn), types) for dt in dtypes
                for _, maker in sorted(nnlib.JOBS.items()) for fn, types in maker(np.dtype(dt))]
        for dt in dtypes:
            for fn in mathfuncs.__all__:
                c = compile_function(f"def kernel(x, y):\n    for i in range(x.size):\n"
                                     f"        y[i] = _m.{fn}(x[i])\n", "kernel", target=NAME,
                                     cost=kernel_cost(1, (fn,)), math=(fn,))
                jobs.append((c, [(dt, 1), (dt, 1)]))
        return jobs

    def prepare(self) -> None:
        """The thread settings applied (Numba's, OpenBLAS's), the allocator tuned."""
        from pdjit.codegen.cpu import malloc, threads

        threads.ensure_applied()
        malloc.tune_malloc()

    def run_threads(self):
        """:mod:`pdjit.codegen.cpu.threads`: run caps, the measured run choice, NumPy's BLAS."""
        return threads

    def threads(self) -> tuple:
        return threads.get_num_threads(), threads.max_loop_threads()

    def step_tiers(self, step, native=None, build=None, mode=False, split=None):
        """The host driver, the native one and the native one on slices of the batch, timed
        per batch size (:class:`pdjit.codegen.cpu.tiers.DriverTiers`)."""
        from pdjit.codegen.cpu import replay, tiers

        if native is None and build is None:
            return None
        hot = tiers.BACKGROUND_RUNS if mode == "background" else tiers.HOT_RUNS
        # its host driver's calls recorded and replayed (:mod:`.replay`), but where an output
        # takes an argument's name (a step updating a value in place)
        rp = None if set(step.outputs) & set(step.args) else \
            replay.HostReplay(step.compiled, step.params)
        return tiers.DriverTiers(step, native, build, hot if build is not None else 0, split,
                                 rp)

    def library_jobs(self, names: list, dtype) -> list:
        return [(_library_kernel(fn), types) for fn, types in nnlib.library_jobs(names, dtype)]

    def llvm_scope(self, codegen):
        return llvm_level(codegen)


def _library_kernel(fn) -> LibraryKernel:
    """The compile job of the library kernel ``fn``: its declared cost, whether it has a
    stand-in."""
    return LibraryKernel(fn, nnlib.cost_of(fn), fn in nnlib.BESIDE)


TARGET = register_target(CpuTarget())
