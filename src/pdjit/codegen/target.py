"""Targets: who renders kernel descriptions and compiles them, chosen by the plan's Place.

A target is one :class:`Target` object, registered under its name by the module that defines
it (``register_target``). What it can do is declared as fields with the defaults below, never
probed; what it does is its methods: rendering a :class:`~pdjit.codegen.kernel.LoopKernel`
(``render``), the driver lines that allocate and call it (``call_site``, built on the shared
skeleton of :mod:`pdjit.codegen.driver`), a segment's driver (``host_driver``, and
``native_driver`` where ``native_drivers``), the module its kernels are compiled in
(``module_text``, with the modules it calls as ``dependencies``: in the cache key), the
globals of a generated function run as plain Python (``function_globals``), the library
kernels its lowerings' lines call (``library_jobs``) and those ``pdjit warmup`` compiles
(``warmup_jobs``), its
device memory (``to_device``, ``to_host``, ``is_device_array``) and whether it can run here
(``require``).

Built-in targets: ``cpu`` (:mod:`pdjit.codegen.cpu.target`), ``cuda``
(:mod:`pdjit.codegen.cuda.target`, imported when first asked for: it imports ``numba.cuda``),
``aot`` (:mod:`pdjit.codegen.aot.target`: ahead-of-time builds, on the ``cpu`` target) and
``python`` (:mod:`pdjit.codegen.python.target`). A new target is a folder ``codegen/<name>/``
whose ``target`` module registers its object, plus its line in ``BUILTIN``. The target that
writes a kernel's module names itself in its text, hence in its cache key.

A target may be built on another (``base``, a registered target's name): what its class does
not define of this interface (a field, a method) is the base target's, taken from the base
target object when it registers (looked up by name in the registry: no target imports
another's modules). Its kernels are then the base target's, with the same text and cache keys
where it renders them alike.

Lowerings: an opaque op (an ``Opaque`` emit) lowers through the table of the plan's target,
keyed by op type (:class:`Lowerings`): the modules of the target's ``lowerings`` package
register them (``@lowering("op_type", host=True)``) and are imported at the first lookup. A
target without an entry for an op runs the op definition's own target-neutral ``Opaque.lower``
(its generic rule) where it declares ``generic_lowerings``, or where its table lists the op
with ``generic``; else the op runs its reference, and the plan report says so.
"""
from __future__ import annotations

import contextlib
import importlib
import pkgutil
from typing import NamedTuple

import numpy as np

from pdjit.framework import registry
from pdjit.framework.registry import Opaque

#: a table entry: the target runs the op definition's own ``Opaque.lower``
GENERIC = "generic"


class Lowerings:
    """A target's lowerings by op type, registered by the modules of the package ``package``
    (imported, each of them, at the first lookup)."""

    def __init__(self, package: str):
        self.package = package
        self._table: dict = {}
        self._loaded = False

    def lowering(self, *op_types: str, host: bool = False, flat: bool = False,
                 blocked=None, blas: bool = False, channel_axis=1, channels_last=None,
                 channel_prologue=None):
        """Decorator: ``fn(ctx) -> [source lines] | None`` lowers ``op_types`` on this target
        (``host``, ``flat``, ``blocked``, ``blas``, ``channel_axis``, ``channels_last``,
        ``channel_prologue``: as ``Opaque`` declares them)."""
        def register(fn):
            for op_type in op_types:
                self._add(op_type, Opaque(fn, host=host, flat=flat, blocked=blocked,
                                          blas=blas, channel_axis=channel_axis,
                                          channels_last=channels_last,
                                          channel_prologue=channel_prologue))
            return fn
        return register

    def generic(self, *op_types: str) -> None:
        """The target runs these ops' own target-neutral ``Opaque.lower``."""
        for op_type in op_types:
            self._add(op_type, GENERIC)

    def _add(self, op_type: str, entry) -> None:
        if op_type in self._table:
            raise ValueError(f"{self.package}: op type {op_type!r} lowered twice")
        self._table[op_type] = entry

    def get(self, op_type: str):
        if not self._loaded:
            self._loaded = True
            pkg = importlib.import_module(self.package)
            for info in pkgutil.iter_modules(pkg.__path__):
                importlib.import_module(f"{self.package}.{info.name}")
        return self._table.get(op_type)

    def op_types(self) -> set:
        self.get("")
        return set(self._table)

class Module(NamedTuple):
    """A generated module (``Target.module_text``): its ``text`` and the line of it where the
    function's source begins (``first_line``: the source's line ``k`` is the module's line
    ``first_line + k - 1``), as the target placed it."""

    text: str
    first_line: int

    @classmethod
    def around(cls, head: list, fn_source: str, tail: list = ()) -> "Module":
        """The lines ``head``, the function's source, the lines ``tail``."""
        top = "\n".join(head)
        return cls("\n".join([top, fn_source, *tail]), top.count("\n") + 2)


#: target name -> the module that defines and registers it (imported at the first ask)
BUILTIN = {"cpu": "pdjit.codegen.cpu.target", "cuda": "pdjit.codegen.cuda.target",
           "aot": "pdjit.codegen.aot.target", "python": "pdjit.codegen.python.target"}


class Target:
    """A code generation target. Subclasses set ``name`` and override the methods; the fields
    declare the capabilities (the defaults are a target that has none of the optional ones)."""

    #: the target's name (``Place.kind``): in every kernel's text, hence its cache key
    name: str = ""
    #: the registered target this one is built on (``""``: none): every field and method of
    #: this interface its class does not define is the base target's (``register_target``)
    base: str = ""
    #: elements from which a loop runs on threads (its parallel variant, ``ctx.loop``)
    parallel_min_size: int = 1 << 20
    #: ... in a block that writes no persistable (inference: no optimizer, no moving
    #: statistics; 0: ``parallel_min_size`` too)
    inference_parallel_min_size: int = 0
    #: loop kernels get ``numba.prange`` variants, used from ``parallel_min_size`` on
    parallel_variants: bool = False
    #: kernels are compiled ahead of their first call, with the types the plan predicts
    #: (else at their first launch; the types are kept for checks: ``SegmentGen.device_jobs``)
    precompile: bool = False
    #: loop forms with an in-place variant (the memory plan may give an output a dead leaf's
    #: buffer; ``render(k, inplace=...)``)
    inplace_forms: tuple = ()
    #: loop forms that run as an opaque op's epilogue, block by block (``blocked_kernel``)
    block_forms: tuple = ()
    #: a segment's driver may be compiled as one native function (``native_driver``)
    native_drivers: bool = False
    #: the data lives in device memory and the host driver only launches: every opaque
    #: lowering is lines of the driver (calling the target's library), ``ctx.loop`` is a
    #: device loop, and no elementwise chain is fused into a row-wise op's first pass
    device: bool = False
    #: the module (a global of the driver) whose ``empty``/``zeros`` allocate an output
    alloc_module: str = "np"
    #: the global under which the driver (and a lowering's lines: ``ctx.lib``) reaches the
    #: target's library of kernels
    library: str = ""
    #: the target's lowerings by op type (:class:`Lowerings`; ``None``: none of its own)
    lowerings: Lowerings | None = None
    #: ops without an entry in ``lowerings`` run their definition's own ``Opaque.lower``
    generic_lowerings: bool = False
    #: the modules (a package: each module under it) its generated modules call: their source
    #: is part of every kernel's text (``compiler.deps_hash``), hence of its cache key, and
    #: their Numba dispatchers' disk caches are hardened before the target's first compile
    dependencies: tuple = ()

    def lowering(self, op_type: str, generic: Opaque):
        """The ``Opaque`` lowering this target runs for an op of ``op_type`` whose definition
        emits ``generic``; ``None``: the op runs its reference here."""
        own = self.lowerings.get(op_type) if self.lowerings is not None else None
        if own is None and self.generic_lowerings or own == GENERIC:
            own = generic
        return own if own is not None and own.lower is not None else None

    def channels_last(self, op) -> bool:
        """Whether this target runs ``op`` (as the program has it) faster on channels-last
        images: its lowering's ``Opaque.channels_last`` says so (the inference pass
        ``channels_last`` asks)."""
        opdef = registry.lookup(op.type)
        if opdef is None or opdef.layout is None or not isinstance(opdef.emit, Opaque):
            return False
        own = self.lowering(op.type, opdef.emit)
        return own is not None and own.channels_last is not None and \
            bool(own.channels_last(op))

    def fuses_attention(self, dtype) -> bool:
        """Whether this target runs attention's core as one op for data of ``dtype`` (the op
        declaring ``ATTENTION``, which the inference pass ``fuse_attention`` builds): a
        lowering of its own for that op, float32 or float64 data."""
        found = registry.having(registry.ATTENTION)
        if not found or np.dtype(dtype) not in (np.float32, np.float64):
            return False
        own = self.lowerings.get(found[0].type) if self.lowerings is not None else None
        return own is not None and own.lower is not None

    def require(self, what: str) -> None:
        """Raise a clear error (naming ``what`` needs it) when the target cannot run in this
        process (a device target without its device)."""

    def available(self) -> bool:
        """Whether the target can run in this process (a simulator of its device counts)."""
        return True

    def simulated(self) -> bool:
        """Whether its device is a simulator (runs the same code paths, far slower)."""
        return False

    def device_count(self) -> int:
        """How many devices of this target this process sees (a host target: none)."""
        return 0

    def unavailable_reason(self) -> str:
        """Why the target cannot run here (``""``: it can)."""
        return ""

    # ---- the process and the plan step (the host target's, unless a target overrides) ----
    def prepare(self) -> None:
        """Make the process ready before a plan of this target is built (the host target's
        thread pools and memory allocator: every plan runs some ops on the host)."""
        host = host_target()
        if host is not self:
            host.prepare()

    def run_threads(self):
        """The host's thread control around each run (the host target's): an object with
        ``begin_run(cap)`` (this run's thread cap), ``RunChoice(settled, measured)`` (measures,
        per plan and batch size, whether a run uses the free cores or one thread, unless
        ``measured(batch, seconds)`` says the plan's driver trials did; its ``tiny_key`` and
        ``tiny_left`` count down runs too short to measure; ``settled(batch)``: no trial on
        or due), ``numpy_blas()`` (a context in which NumPy's BLAS uses the plan's threads),
        ``BACKGROUND`` (``[n]``: compiles going on beside the runs on threads of this process)
        and ``marks()`` (counts a run moves where it is served as later runs will not be)."""
        host = host_target()
        if host is self:
            raise NotImplementedError(f"the {self.name} target has no thread control")
        return host.run_threads()

    def threads(self) -> tuple:
        """``(threads a parallel loop may use, threads a host driver may run loops on)`` as
        the code generator should assume them (the host target's)."""
        host = host_target()
        return (1, 1) if host is self else host.threads()

    def step_tiers(self, step, native=None, build=None, mode=False, split=None):
        """The object that picks, run by run, which of a native step's drivers serves it
        (``call(values)``, ``settled(batch)``, ``split_seconds(batch)``: the time of its
        run spent on slices of the batch on every free core, ``describe()``; the step's
        ``native`` driver built with the plan, the ``build`` of one built once the step is
        hot under the ``native_drivers`` ``mode``, ``split()``: which arguments carry the
        batch's rows), or None: the step's host driver always serves (a target without
        ``native_drivers``)."""
        return None

    def lod_offsets(self, offsets: list) -> list:
        """LoD offsets (host arrays) as a driver of this target reads them."""
        return offsets

    # ---- device memory (a host target's values are NumPy arrays: nothing to copy) ----
    def to_device(self, array):
        """``array`` (host) where the target's kernels read it (counted by a device target)."""
        return array

    def to_host(self, value):
        """A value of the target's memory as a host array."""
        return value

    def is_device_array(self, value) -> bool:
        """Whether ``value`` lives in the target's device memory."""
        return False

    def render(self, k, parallel: bool = False, inplace: dict | None = None) -> str:
        """The source of ``def kernel(...)`` for the loop kernel ``k``."""
        raise NotImplementedError

    def argtypes(self, k, leaf_dtypes: list) -> list:
        """The kernel's argument types as its call site passes them."""
        raise NotImplementedError

    def call_site(self, k, fresh, flats: dict, leaves: list, stores: list, red_out,
                  params: list, kname, pname=None, inplace: dict | None = None,
                  parallel_min_size: int = 0):
        """The driver lines that check shapes, allocate the outputs and call the kernel
        (``kname=None``: ``(lines, arguments)`` without the call); the parallel variant
        ``pname`` from ``parallel_min_size`` elements (0: the target's own) on."""
        raise NotImplementedError

    def module_text(self, fn_source: str, fn_name: str, header: str, parallel: bool = False,
                    calls=()) -> Module:
        """The generated module a kernel of this target is compiled in, and where the
        function's source begins in it (``header``: a comment line naming pdjit's version;
        ``parallel``: the function has parallel loops; ``calls``: ``(global name, Compiled)``
        of the kernels it calls)."""
        raise NotImplementedError

    def function_globals(self) -> dict:
        """The globals of a generated function that runs as plain Python and calls compiled
        kernels (``compiler.HostFunction``): those of the target's generated modules."""
        raise NotImplementedError(f"the {self.name} target has no host functions")

    def llvm_scope(self, codegen):
        """A context manager under which ``codegen`` (Numba's code generator of an object
        compiled ahead of time, :mod:`pdjit.codegen.aot.numba_aot`) runs LLVM's passes at the
        level this target compiles its own code at: none here (Numba's level)."""
        return contextlib.nullcontext()

    def warmup_jobs(self, dtypes) -> list:
        """Compile jobs ``(dispatcher or Compiled, argument types)`` that ``pdjit warmup``
        compiles into the disk cache for float data of each of ``dtypes`` (none: the target
        has nothing to compile ahead of a first run)."""
        return []

    def host_driver(self, gen, fn_name: str = "segment", memory_optim: bool = False):
        """A segment's driver (a :class:`pdjit.codegen.driver.HostDriver`)."""
        raise NotImplementedError

    def native_driver(self, gen, fn_name: str = "segment"):
        """A segment's driver compiled as one native function (``native_drivers`` only)."""
        raise NotImplementedError(f"the {self.name} target has no native drivers")

    def blocked_kernel(self, k, fn: str, nbefore: int, nafter: int,
                       parallel: bool = False, host: bool = False,
                       parallel_min_size: int = 0) -> str:
        """An opaque op computed by blocks, ``k`` its epilogue (``block_forms`` only);
        ``parallel``: the kernel takes the epilogue's parallel variant after ``N`` (from
        ``parallel_min_size`` elements, 0: the target's threshold); ``host``: the source of a
        host function (``compiler.HostFunction``), not of a compiled one."""
        raise NotImplementedError(f"the {self.name} target has no blocked epilogues")

    def loop_kernel(self, var: str, params: list, before: list, body: list) -> str:
        """The source of ``def kernel(*params, n_)`` running ``body`` for each ``var`` in
        ``0..n_`` (each iteration a thread of its own), every thread running ``before`` first:
        an opaque lowering's loop on a ``device`` target (``ctx.device_loop``)."""
        raise NotImplementedError(f"the {self.name} target has no device loops")

    def launch(self, kernel: str, n: str, args: list) -> str:
        """The driver line that runs the loop kernel bound to ``kernel`` over ``n``
        iterations (``args``: its arguments, ``n`` last)."""
        raise NotImplementedError(f"the {self.name} target has no device loops")

    def library_jobs(self, names: list, dtype) -> list:
        """Compile jobs ``(compiler.LibraryKernel, argument types)`` of the library kernels
        that a call of each of the library functions ``names`` runs (as a lowering named
        them: ``LowerContext.lib_fn``), for float data of ``dtype``, each with the compile
        cost its library declares (none: the target compiles them at first use)."""
        return []

    def __repr__(self) -> str:
        return f"<pdjit target {self.name}>"


_TARGETS: dict = {}
_DEVICE_TARGETS: list = []   # the registered targets with device memory (``holder``)


def register_target(target: Target) -> Target:
    """Register ``target`` under its name (a target with a ``base`` first takes what it does
    not define from the registered base target: :func:`_take_from_base`)."""
    if not isinstance(target, Target):
        raise TypeError(f"register_target: expected a Target, got {type(target).__name__}")
    if target.base:
        if target.base == target.name:
            raise ValueError(f"register_target: the {target.name} target is its own base")
        _take_from_base(target, get_target(target.base))
    _TARGETS[target.name] = target
    _DEVICE_TARGETS[:] = [t for t in _TARGETS.values() if t.device]
    return target


def _own(cls: type, attr: str) -> bool:
    """Whether a subclass of :class:`Target` (``cls`` or a class between it and Target)
    defines ``attr`` itself."""
    return any(attr in vars(c) for c in cls.__mro__ if c is not Target and
               issubclass(c, Target))


def _take_from_base(target: Target, base: Target) -> None:
    """Give ``target`` (on the instance) every field and method of the :class:`Target`
    interface that its class does not define: a field's value is the base target's; a method
    the base target's class defines is the base target's own (bound to it: it runs as the
    base target, e.g. its ``module_text`` writes the base target's modules, so that both
    share kernels); a method of the interface's defaults (``Target.lowering``, ...) stays
    ``target``'s, reading ``target``'s fields."""
    for attr, default in vars(Target).items():
        if attr.startswith("_") or attr in ("name", "base") or _own(type(target), attr):
            continue
        if callable(default) and not _own(type(base), attr):
            continue
        setattr(target, attr, getattr(base, attr))


def get_target(name: str) -> Target:
    target = _TARGETS.get(name)
    if target is None and name in BUILTIN:  # a built-in target registers itself
        importlib.import_module(BUILTIN[name])
        target = _TARGETS.get(name)
    if target is None:
        raise NotImplementedError(f"no code generation target {name!r} (targets: "
                                  f"{sorted(set(_TARGETS) | set(BUILTIN))})")
    return target


def holder(value) -> Target | None:
    """The loaded device target whose memory holds ``value``; None: a host value."""
    for target in _DEVICE_TARGETS:
        if target.is_device_array(value):
            return target
    return None


def target_name(place) -> str:
    """The target that runs plans for ``place`` (``None``: the CPU)."""
    return "cpu" if place is None else place.kind


def host_target() -> Target:
    """The target of the host (``place=None``): where references and host ops run."""
    return get_target(target_name(None))
