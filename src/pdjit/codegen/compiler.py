"""Compile generated source with Numba, through a content-addressed on-disk cache.

Numba caches only functions that live in a real module file registered in ``sys.modules``
(``shared/facts/numba.md``). So each generated function is written to
``<cache dir>/pdjit_gen_<sha256>.py``, executed as a module of that name (compiled from the
text this process holds, so no ``.pyc`` is written or read), and decorated with
``numba.njit`` with pdjit's disk cache (``pdjit.codegen.diskcache``, keyed by content): a second
process that generates the same source finds the file and Numba's compiled code beside it
(``__pycache__``), and runs without compiling, also when the directory was copied or mounted
elsewhere.

The file's text is the target's (``Target.module_text``) and includes a hash of everything it
calls that lives elsewhere (the modules the target lists as its ``dependencies``: for the CPU its
runtime helpers, math functions and library kernels; pdjit's and Numba's versions), because
Numba's cache does not notice when a called function in another file changes.

The cache directory is ``PDJIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pdjit`` (``~/.cache/pdjit``);
the library kernels' compiled code is kept there too (``lib/``). ``clear_cache()`` empties it.

The cache survives what a shared disk does to it:

- **Several processes at once.** A module file is written to a temporary file in the same
  directory and linked into place only if no other process got there first (``os.link``: the
  first complete file wins and is never rewritten under a reader); a damaged one is replaced
  with ``os.replace``. Numba writes its ``.nbi``/``.nbc`` files the same way; pdjit also
  serialises Numba's read-modify-write of an index under a lock file in that directory
  (``.pdjit-cache.lock``, ``fcntl.flock``), so two processes adding signatures to one function
  (a library kernel) cannot drop each other's entries or reuse each other's data file names.
- **Damaged entries.** A module file whose bytes are not its text is rewritten; the data files
  of pdjit's functions end with a SHA-256 of their content, checked on load; an
  index or data file that does not load (truncated, garbage, another signature's code) is
  dropped from its index and compiled again, with a :class:`CacheWarning` naming the file.
- **A read-only, unwritable or full directory.** Writing a module or Numba's data failing with
  an ``OSError`` (``EROFS``, ``EACCES``, ``ENOSPC``...) turns the disk cache off for that
  directory for the rest of the process, with one :class:`CacheWarning` naming it: new modules
  are then built in memory and compiled without Numba's cache, every kernel still native, and
  what a read-only directory already holds (a warm cache shipped read-only) is still loaded.

Each distinct text is one :class:`Compiled` per process (``compile_function`` returns the same
object for the same text), so equal kernels of different plans and programs share one Numba
dispatcher. :func:`precompile` compiles a new plan's kernels before their first call, on two
cores: a forked worker process and this one take them from one queue, and the worker's land in
the disk cache, from which the first calls here load them.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import os
import pathlib
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
import warnings

import numba
import numpy as np

from pdjit.codegen import diskcache
from pdjit.codegen.diskcache import CacheDamage, cache_dir  # noqa: F401 - pdjit's names
from pdjit.codegen.pysource import compile_source
from pdjit.version import __version__

_lock = threading.RLock()
_modules: dict = {}
_compiled: dict = {}   # module name -> Compiled: one per distinct text in this process
_by_worker = [0]       # kernels a compile worker compiled for this process
# Exceptions Numba lets escape from a damaged cache file.
CACHE_ERRORS = (pickle.UnpicklingError, EOFError, ImportError, AttributeError, ValueError,
                TypeError)

def clear_cache() -> None:
    """Delete everything pdjit compiled to disk: the generated modules and the compiled code
    of them and of the library kernels, and the Predictor's optimized models (the whole cache
    directory)."""
    d = cache_dir()
    if d.exists():
        shutil.rmtree(d, ignore_errors=True)
    _modules.clear()
    _compiled.clear()


def _source_hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def _module_files(module_name: str) -> list:
    """The source files of ``module_name`` (a package: every module in its folder)."""
    path = pathlib.Path(importlib.import_module(module_name).__file__)
    if path.name == "__init__.py":
        return sorted(path.parent.glob("*.py"))
    return [path]


_DEPS: dict = {}   # target name -> deps_hash


def deps_hash(target: str = "cpu") -> str:
    """What every generated module of ``target`` depends on outside itself: pdjit's and
    Numba's versions, the shared driver skeleton and the target's ``dependencies``."""
    found = _DEPS.get(target)
    if found is None:
        from pdjit.codegen.target import get_target

        files = [f for m in get_target(target).dependencies for f in _module_files(m)]
        found = _DEPS[target] = _source_hash(
            __version__, numba.__version__, *(f.read_text() for f in _module_files(
                "pdjit.codegen.driver")), *(f.read_text() for f in files))
    return found


def module_text(fn_source: str, fn_name: str, parallel: bool = False, target: str = "cpu",
                calls=()) -> str:
    """The whole generated module, as the target writes it (``Target.module_text``): imports,
    the kernels it calls (``calls``: ``(global name, Compiled)``, bound by module name so the
    text stays a function of their content) and the function."""
    return _module(fn_source, fn_name, parallel, target, calls).text


def _module(fn_source: str, fn_name: str, parallel: bool, target: str, calls):
    """The target's :class:`~pdjit.codegen.target.Module`: the text and the function's line."""
    from pdjit.codegen.target import get_target

    return get_target(target).module_text(fn_source, fn_name, f"# {__version__}",
                                          parallel=parallel, calls=calls)


class CacheWarning(UserWarning):
    """The disk cache of compiled code could not be used as it is: a directory that cannot be
    written (the disk cache is off for it, once per process), or a damaged entry (compiled
    again)."""


_disk_off: dict = {}   # directory -> why this process does not write it (warned once)
_texts: dict = {}      # module name -> (path or None, text): how to build it again
_hardened_libraries: set = set()   # the targets whose library dispatchers are hardened


def _no_disk(directory, why) -> None:
    """Stop writing the cache in ``directory`` for the rest of this process, warning once."""
    key = os.path.abspath(str(directory))
    with _lock:
        if key in _disk_off:
            return
        _disk_off[key] = str(why)
    warnings.warn(f"pdjit: the compile cache directory {key!r} cannot be written ({why}); "
                  "new kernels are compiled in memory, not kept on disk, for the rest of this "
                  "process; what it already holds is still read (set PDJIT_CACHE_DIR to a "
                  "writable directory to keep them)",
                  CacheWarning, stacklevel=3)


def disk_cache_problems() -> dict:
    """The cache directories this process stopped writing, each with the reason."""
    return dict(_disk_off)


def _write_module(d: pathlib.Path, name: str, text: str):
    """``d/<name>.py`` holding ``text``, written atomically; ``None`` when the disk cache is
    off for ``d`` and the file is not there already (then the module lives in memory only)."""
    path = d / f"{name}.py"
    data = text.encode()
    tmp = None
    try:
        try:
            if path.read_bytes() == data:
                return path
            damaged = True
        except FileNotFoundError:
            damaged = False
        if os.path.abspath(str(d)) in _disk_off:
            return None
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        if damaged:
            warnings.warn(f"pdjit: the cached module {str(path)!r} does not hold its text "
                          "(damaged): written again", CacheWarning, stacklevel=3)
            os.replace(tmp, path)
        else:
            try:  # the first complete file wins: never replace what another process linked
                os.link(tmp, path)
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links
                os.replace(tmp, path)
                tmp = None
        return path
    except OSError as e:
        _no_disk(d, f"{type(e).__name__}: {e}")
        return None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _exec(name: str, filename: str, text: str):
    mod = types.ModuleType(name)
    if not filename.startswith("<"):
        mod.__file__ = filename
    sys.modules[name] = mod  # Numba's cache re-imports the module by name
    try:
        exec(compile_source(text, filename), mod.__dict__)  # noqa: S102
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def _load(name: str, path, fn_name: str, text: str | None = None):
    mod = _modules.get(name)
    if mod is None:
        if text is None:
            path, text = _texts.get(name, (path, None))
            if text is None:  # a module of an earlier process: read it, and check it
                data = pathlib.Path(path).read_bytes()
                if f"pdjit_gen_{_source_hash(data)[:32]}" != name:
                    raise ImportError(f"pdjit: the cached module {str(path)!r} does not "
                                      f"hold the text of {name} (damaged)")
                text = data.decode()
        if path is not None:
            mod = _exec(name, str(path), text)
            fn = getattr(mod, fn_name, None)
            if isinstance(fn, numba.core.registry.CPUDispatcher):
                # beside the file; a directory that cannot be written is still read (a
                # read-only copy of a warm cache): its first failed save turns the disk off
                diskcache.attach(fn)
        else:
            mod = _exec(name, f"<pdjit generated {name}>", text)
        _modules[name] = mod
        _harden(getattr(mod, fn_name, None))
    return getattr(mod, fn_name)


# A generated kernel's compile time (CPU seconds, measured on 2 cores in a process that has
# compiled before, as the compile worker has): a one-statement flat loop 0.07 s, 20 statements
# 0.15 s, a reduction over rows 0.10 s; a math helper (``_m.tanh``...) adds ~0.2 s for the
# first kernel of a process that calls it (flat tanh 0.29 s, exp 0.26 s, a row sum of exp
# 0.30 s).
KERNEL_SECONDS, STATEMENT_SECONDS, HELPER_SECONDS = 0.07, 0.004, 0.2


def kernel_cost(statements: int, math=()) -> float:
    """The estimated compile time (CPU seconds) of a generated kernel of ``statements``
    statements calling the math helpers ``math``: how :func:`precompile` balances its jobs."""
    return KERNEL_SECONDS + STATEMENT_SECONDS * statements + HELPER_SECONDS * len(set(math))


class Compiled:
    """A generated function: its dispatcher, module name, file (``None`` when the disk cache
    is off), source text, whether it (or a kernel it calls) has parallel loops, the line
    of the module where the function's source begins (``first_line``: the module line of the
    source's line ``k`` is ``first_line + k - 1``), and, as the generator set them, its
    estimated compile time (``cost``, CPU seconds: :func:`kernel_cost`) and the math helpers
    it calls (``math``: names in the target's math module)."""

    def __init__(self, name: str, path, text: str, fn_name: str, parallel: bool = False,
                 first_line: int = 1, cost: float = KERNEL_SECONDS, math=()):
        self.name, self.path, self.text, self.fn_name = name, path, text, fn_name
        self.parallel, self.first_line = parallel, first_line
        self.cost, self.math = cost, tuple(sorted(set(math)))
        _texts[name] = (path, text)
        self.fn = _load(name, path, fn_name, text)

    @property
    def affinity(self) -> tuple:
        """Its compile job's group (:func:`_affinity`): the math helpers it calls, or itself."""
        return ("math", *self.math) if self.math else ("own", self.name)

    def reload_clean(self) -> None:
        """Drop this module's Numba cache files and import it afresh (a damaged cache)."""
        cache = getattr(self.fn, "_cache", None)
        cache_file = getattr(cache, "_cache_file", None)
        if cache_file is not None:
            _forget(cache, None, None)
        _modules.pop(self.name, None)
        _compiled.pop(self.name, None)
        sys.modules.pop(self.name, None)
        self.fn = _load(self.name, self.path, self.fn_name, self.text)
        _compiled[self.name] = self


def compile_function(fn_source: str, fn_name: str, parallel: bool = False, target: str = "cpu",
                     calls=(), cost: float | None = None, math=()) -> Compiled:
    """The compiled function of ``fn_source``, shared by content: the same text gives the same
    module (and Numba dispatcher) in this process and the same cache files across processes.
    Numba compiles it at its first call. ``cost`` and ``math``: its estimated compile time and
    the math helpers it calls, as the generator knows them (:class:`Compiled`)."""
    module = _module(fn_source, fn_name, parallel, target, calls)
    text = module.text
    name = f"pdjit_gen_{_source_hash(text)[:32]}"
    hit = _compiled.get(name)
    if hit is not None:
        return hit
    _harden_libraries(target)
    with _lock:
        hit = _compiled.get(name)
        if hit is not None:
            return hit
        path = _write_module(cache_dir(), name, text)
        compiled = _compiled[name] = Compiled(
            name, path, text, fn_name,
            parallel or any(c.parallel for _, c in calls), module.first_line,
            kernel_cost(1, math) if cost is None else cost, math)
        return compiled


class HostFunction:
    """A generated function that runs as plain Python and calls compiled kernels: a host
    driver's loop over blocks of samples, each block one call of a library kernel and one of an
    epilogue kernel (``calls``: ``(global name, Compiled)``). Run by Python, it compiles
    nothing of its own: compiled, the same loop would link a private copy of the library kernel
    (a convolution's, a GEMM's) and LLVM would optimise and emit it again for each epilogue
    (measured: 0.8 s of the ResNet's cold step for one convolution with one epilogue), for
    a few microseconds of dispatch per block. Same fields as :class:`Compiled` (``path`` is
    ``None``: nothing is written)."""

    parallel = False

    def __init__(self, fn_source: str, fn_name: str, calls=(), target: str = "cpu"):
        self.text, self.fn_name, self.calls, self.path = fn_source, fn_name, tuple(calls), None
        self.target = target
        self.name = "pdjit_host_" + _source_hash(fn_source, *(c.name for _, c in calls))[:32]
        self._build()

    def _build(self) -> None:
        from pdjit.codegen.target import get_target

        ns = get_target(self.target).function_globals()
        ns.update({g: c.fn for g, c in self.calls})
        exec(compile_source(self.text, f"<pdjit {self.name}>"), ns)  # noqa: S102
        self.fn = ns[self.fn_name]

    def reload_clean(self) -> None:
        """Reload the kernels it calls without their cache files, then rebind."""
        for _, c in self.calls:
            c.reload_clean()
        self._build()


def load_kernel(name: str, fn_name: str):
    """The dispatcher of the generated module ``name`` (written by :func:`compile_function`):
    how a generated function binds the kernels it calls."""
    return _load(name, cache_dir() / f"{name}.py", fn_name)


def kernel_stats() -> dict:
    """How many distinct generated functions this process holds (``kernels``), and how many
    compilations Numba made for them (``compiled``) or loaded from the disk cache
    (``loaded``), over all type signatures."""
    compiled = loaded = 0
    for c in list(_compiled.values()):
        stats = getattr(c.fn, "stats", None)
        if stats is not None:
            compiled += sum(stats.cache_misses.values())
            loaded += sum(stats.cache_hits.values())
    # what a compile worker compiled, this process loaded from disk
    return {"kernels": len(_compiled), "compiled": compiled + _by_worker[0],
            "loaded": max(loaded - _by_worker[0], 0)}


# ---- Numba's cache files, checked -------------------------------------------------------------
class _FileLock:
    """An exclusive ``flock`` on ``<directory>/.pdjit-cache.lock`` (nothing where that cannot
    be opened: a read-only directory, a system without ``fcntl``)."""

    def __init__(self, directory):
        self.path, self.fd = os.path.join(str(directory), ".pdjit-cache.lock"), None

    def __enter__(self):
        try:
            import fcntl

            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
            self.fd = None
        return False


def _forget(cache, sig, target_context) -> None:
    """Drop ``sig``'s entry from ``cache``'s index (every entry when ``sig`` is ``None`` or the
    index itself does not load)."""
    cache_file = cache._cache_file
    with _FileLock(cache._cache_path):
        try:
            try:
                if sig is None:
                    raise KeyError(sig)
                overloads = cache_file._load_index()
                overloads.pop(cache._index_key(sig, target_context.codegen()), None)
            except Exception:  # noqa: BLE001 - an index that does not load: start it afresh
                overloads = {}
            cache_file._save_index(overloads)
        except OSError:
            pass


def _harden(dispatcher) -> None:
    """Make ``dispatcher``'s Numba cache survive damage, races and a disk that cannot be
    written (see the module's docstring)."""
    if not isinstance(dispatcher, numba.core.registry.CPUDispatcher):
        return  # another target's kernel (cuda): its own cache, as Numba keeps it
    cache = getattr(dispatcher, "_cache", None)
    if cache is None or getattr(cache, "_pdjit_hardened", False):
        return
    # a disk cache (Numba's sets ``_cache_file`` when made, pdjit's computes it when read: not
    # here, once per library dispatcher of a process); not Numba's NullCache
    if "_cache_file" not in vars(cache) and \
            not isinstance(getattr(type(cache), "_cache_file", None), property):
        return
    load, save = cache.load_overload, cache.save_overload

    def load_overload(sig, target_context):
        try:
            cres = load(sig, target_context)
            if cres is not None:
                want = tuple(numba.core.sigutils.normalize_signature(sig)[0])
                if tuple(cres.signature.args) != want:
                    raise CacheDamage(f"the entry holds code for {cres.signature.args}, "
                                      f"not {want}")
            return cres
        except Exception as e:  # noqa: BLE001 - any failure to load is damage: compile again
            fn = getattr(cache, "_py_func", None)
            what = f"{fn.__module__}.{fn.__qualname__}" if fn is not None else cache._name
            warnings.warn(f"pdjit: a damaged compile cache entry of {what} in "
                          f"{str(cache._cache_path)!r} ({type(e).__name__}: {e}) was dropped; "
                          "compiling it again", CacheWarning, stacklevel=2)
            _forget(cache, sig, target_context)
            return None

    def save_overload(sig, data):
        if os.path.abspath(str(cache._cache_path)) in _disk_off:
            return
        try:
            with _FileLock(cache._cache_path):
                save(sig, data)
        except OSError as e:
            _no_disk(cache._cache_path, f"{type(e).__name__}: {e}")

    cache.load_overload, cache.save_overload = load_overload, save_overload
    cache._pdjit_hardened = True


def _harden_libraries(target: str = "cpu") -> None:
    """Harden the caches of the library kernels and math functions the generated code of
    ``target`` calls (the dispatchers of its ``dependencies``, each package's modules
    loaded)."""
    if target in _hardened_libraries:
        return
    _hardened_libraries.add(target)
    diskcache.load_blas_bindings()  # before a compile imports it the slow way
    from pdjit.codegen.target import get_target

    mods = []
    for name in get_target(target).dependencies:
        importlib.import_module(name)
        mods += [m for n, m in sorted(sys.modules.items())
                 if (n == name or n.startswith(name + ".")) and m is not None]
    for mod in mods:
        for value in list(vars(mod).values()):
            if isinstance(value, numba.core.registry.CPUDispatcher):
                _harden(value)


# ---- compiling ahead of the first call, on two cores ---------------------------------------------
# Below this many kernels to compile, a worker costs more than it saves.
POOL_MIN_JOBS = 3
# The queue (2 bytes a job) is written before the fork and must fit a pipe (64 KiB on Linux).
_MAX_JOBS = 30000


def compile_workers() -> int:
    """Worker processes that compile kernels beside this one: ``PDJIT_COMPILE_WORKERS``, else
    one on Linux when the machine has more than one core and they are not all busy already
    (the last minute's load average below the number of cores). At most one: measured on 2
    cores; the worker is forked, which other systems' libraries do not all survive.

    A worker pays for itself only on a core nothing else wants: each process runs slower
    beside the other (the jobs that share helpers go to one process, see :func:`_affinity`;
    the small CNN's cold first step at load 2-3 compiled its jobs in 6.6 s of CPU alone and
    in 3.5 + 3.6 s split; with the pools' and input gradients' own kernels, the whole step
    took 5.8-5.9 s of CPU and 5.9-6.0 s wall with a worker, 5.4-5.5 s both without, at load
    2.5-3).
    Measured there with the jobs split one by one (2 cores, CPU incl. the worker, wall): at
    load 1.5, 7.9 s and 5.8 s with a worker against 6.5 s and 6.4 s without; at
    load 5.5, 9.7 s and 24 s against 7.2 s and 17 s; at load 14-17, 9.5-9.8 s and 39-52 s
    against 7.8 s and 28-37 s."""
    env = os.environ.get("PDJIT_COMPILE_WORKERS")
    if env is not None:
        try:
            return max(0, min(1, int(env)))
        except ValueError:
            raise ValueError(f"PDJIT_COMPILE_WORKERS={env!r}: expected 0 or 1") from None
    cores = os.cpu_count() or 1
    if cores < 2 or not sys.platform.startswith("linux"):
        return 0
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average: as on an idle machine
        busy = 0.0
    return 1 if busy < cores else 0


class LibraryKernel:
    """A library kernel (a dispatcher of a target's library) as a compile job: its dispatcher caches
    itself on disk (``diskcache``, under ``PDJIT_CACHE_DIR``), so a worker's compilation serves
    this process too. ``cost``: its compile time (CPU seconds) as its library declares it. Its
    ``affinity`` is its module: the kernels of one module share helpers (see
    :func:`_affinity`). ``stand_in``: its library serves its calls by a stand-in while a worker
    compiles it beside the runs (:func:`stand_ins`)."""

    def __init__(self, fn, cost: float = 1.0, stand_in: bool = False):
        self.fn, self.cost, self.stand_in = fn, cost, stand_in
        self.name = f"{fn.py_func.__module__}.{fn.py_func.__qualname__}"
        self.affinity = fn.py_func.__module__
        self.text = ""
        self.parallel = bool(fn.targetoptions.get("parallel"))


_TYPES: dict = {}  # predicted argument type -> Numba type (a large plan predicts thousands)


def _numba_type(t):
    try:
        found = _TYPES.get(t)
    except TypeError:  # (not hashable: converted each time)
        return _make_numba_type(t)
    if found is None:
        found = _TYPES[t] = _make_numba_type(t)
    return found


def _make_numba_type(t):
    from numba.core import types

    if t is float:
        return types.float64
    if t is int:
        return types.int64
    if t is bool:
        return types.boolean
    if t is None:  # (an argument passed as None: a default given explicitly)
        return types.none
    if t == "lod":  # LoD offsets are read-only int64 arrays
        return types.Array(types.int64, 1, "C", readonly=True)
    dtype, ndim = t
    return types.Array(numba.from_dtype(np.dtype(dtype)), ndim, "C")


def _is_cached(c, sig) -> bool:
    cache = getattr(c.fn, "_cache", None)
    impl = getattr(cache, "_cache_file", None)
    path = getattr(impl, "_index_path", None)
    if path is None or not os.path.exists(path):
        return False
    if not isinstance(c, LibraryKernel):  # one generated module, one signature
        return True
    try:  # a library kernel has many signatures: is this one in its index?
        return any(key[0] == sig for key in impl._load_index())
    except Exception:  # noqa: BLE001 - an unreadable index: compile, as the first call would
        return False


def _affinity(c):
    """The jobs that compile the same helpers go to one process: Numba compiles a helper
    (a ``register_jitable`` function, a math function) once per process, in memory, for every
    kernel that calls it there, so two processes splitting its callers both compile it
    (measured on the small CNN's cold first step: ~0.85 s of CPU twice). A library kernel's
    affinity is its module (:class:`LibraryKernel`), a generated kernel's the math functions
    it calls (:attr:`Compiled.affinity`; none: a job of its own)."""
    return c.affinity


class Background:
    """The forked workers compiling a plan's kernels into the disk cache while this process
    goes on (:func:`compile_later`): ``done()`` says whether they all finished (without
    waiting), ``wait()`` waits for them (one that hangs is killed, as :func:`precompile`'s).
    ``todo``: the jobs :func:`precompile` handed over while the plan was built (its blocks'
    too), forked off together when it is (:meth:`start`); ``after``: the Backgrounds of other
    plans whose workers already compile some of this plan's kernels (another executor on the
    same program): done when they are too, not compiled twice."""

    def __init__(self):
        self.pids: list = []
        self.jobs = 0
        self.todo: list = []
        self.after: list = []
        self.owner = os.getpid()  # (a process forked from this one has no such children)

    def done(self) -> bool:
        if os.getpid() != self.owner:
            return True
        if self.after:
            self.after = [bg for bg in self.after if not bg.done()]
            if self.after:
                return False
        left = []
        for pid in self.pids:
            try:
                finished, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # (reaped elsewhere)
                finished = pid
            if not finished:
                left.append(pid)
        self.pids = left
        return not left

    def wait(self) -> None:
        if os.getpid() != self.owner:
            self.pids = []
            return
        while self.after:
            self.after[0].wait()
            del self.after[0]
        # a worker leaves the list once reaped: an interrupt leaves the others to done()
        # and to the wait at exit
        deadline = time.monotonic() + max(60.0, 2.0 * self.jobs)
        while self.pids:
            _wait(self.pids[0], deadline)
            del self.pids[0]

    def start(self, most: int = 2, idle: bool = False) -> None:
        """Fork the workers of ``todo`` (at most one per core, ``most`` at most, for all the
        jobs of the plan and its blocks, from one queue; ``idle``: at a low priority), where a
        worker can be forked; else its kernels compile at their first calls."""
        todo, self.todo = self.todo, []
        if not todo or len(todo) > _MAX_JOBS or not hasattr(os, "fork") or \
                os.path.abspath(str(cache_dir())) in _disk_off or \
                os.environ.get("PDJIT_COMPILE_WORKERS", "").strip() == "0" or \
                threading.active_count() > 1:  # another Python thread may hold a lock forever
            return
        groups: dict = {}
        for job in todo:
            groups.setdefault(_affinity(job[0]), []).append(job)
        todo = sorted(groups.values(), key=lambda g: -sum(c.cost for c, _ in g))
        pids, rd = _fork_workers(todo, min(len(todo), max(1, os.cpu_count() or 1), most),
                                 refresh=False, idle=idle)
        os.close(rd)
        if not pids:  # no worker could be forked: the kernels compile at their first calls
            return
        n = sum(len(g) for g in todo)
        self.pids += pids
        self.jobs += n
        _by_worker[0] += n
        for group in todo:
            for c, sig in group:
                _in_flight[(id(c.fn), sig)] = self
        if not _background_waited:
            _background_waited.append(atexit.register(_wait_background))
        # the workers of plans no run looks at any more (a program run once) reaped here:
        # no zombie processes pile up until exit
        _background[:] = [bg for bg in _background if not bg.done()]
        _background.append(self)


_later = threading.local()
_background: list = []  # every Background with a worker still running: waited for at exit
_in_flight: dict = {}  # (dispatcher id, signature) -> the Background whose workers compile it
_background_waited: list = []  # (the wait at exit registered)


@contextlib.contextmanager
def compile_later():
    """Within it, :func:`precompile` on this thread hands every kernel to compile to the
    :class:`Background` it yields, whose workers (forked once the body is done, where a worker
    can be forked: else the kernels compile at their first calls) compile them while this
    process goes on. The kernels are then on disk for their first calls once the workers are
    done; a first call before that compiles in this process.
    At exit, Python waits for the workers still compiling (the cache is then whole for the
    next process, and no worker outlives this one)."""
    bg = Background()
    prev = getattr(_later, "bg", None)
    _later.bg = bg
    try:
        yield bg
    finally:
        _later.bg = prev
    bg.start()


_stand_ins = threading.local()
#: id(library kernel) -> [the Background whose worker compiles it beside the runs, its jobs,
#: when to look on disk for them next]
_beside: dict = {}
#: how often :func:`compiling` looks whether a kernel's worker has written it to disk yet
BESIDE_LOOK_S = 0.25


@contextlib.contextmanager
def stand_ins():
    """Within it (on this thread), :func:`precompile` leaves the library kernels that have a
    stand-in to a worker forked once the others are compiled: their callers ask
    :func:`compiling` and run the stand-in meanwhile (the executor's first plan of a program
    too large for the references to serve its first runs, ``cold_runs="reference"``). Measured
    on the 2-vCPU machine (``bench_coldstart.py --paddle-models``, cold, one thread): the first
    result of ResNet-50 2.8 s instead of 5.6, MobileNetV2 2.7 instead of 8.4 (the taps kernel
    alone, ~2.4 s of CPU, was there for a stem of a few milliseconds); their steady speed a few
    seconds later than before (one worker compiles what two processes compiled)."""
    before = getattr(_stand_ins, "on", False)
    _stand_ins.on = True
    try:
        yield
    finally:
        _stand_ins.on = before


def _compile_beside(jobs) -> None:
    """Fork a worker compiling ``jobs`` (library kernels that have a stand-in) into the disk
    cache, one at a time, at a low priority (the runs their stand-ins serve, and the threads
    that compile a run's native code, keep their cores: at the process's priority, a cold
    SqueezeNet's runs after its first result waited on it, 154 ms against 20); each is
    :func:`compiling` until it is on disk (not where no worker could be forked: their first
    calls compile them, as without a stand-in)."""
    mine, theirs = [], []
    for c, sig in jobs:
        other = _in_flight.get((id(c.fn), sig))
        if other is not None and not other.done():  # (another plan's worker has it)
            theirs.append((other, (c, sig)))
        else:
            mine.append((c, sig))
    bg = Background()
    bg.todo = mine
    bg.start(most=1, idle=True)
    if bg.pids:
        theirs += [(bg, job) for job in mine]
    for owner, (c, sig) in theirs:
        _beside.setdefault(id(c.fn), [owner, [], 0.0])[1].append((c, sig))


def compiling(fn) -> bool:
    """Whether a worker of this process compiles the library kernel ``fn`` (a dispatcher)
    beside the runs (:func:`stand_ins`): its caller then runs its stand-in. Once the worker
    has written it to the disk cache (looked for every :data:`BESIDE_LOOK_S`), or is done, the
    next call loads it."""
    entry = _beside.get(id(fn))
    if entry is None:
        return False
    bg, jobs, look = entry
    if not bg.done():
        now = time.monotonic()
        if now < look:
            return True
        entry[2] = now + BESIDE_LOOK_S
        if not all(_is_cached(c, sig) for c, sig in jobs):
            return True
    _beside.pop(id(fn), None)  # (threads may ask at once)
    return False


def compiling_beside() -> bool:
    """Whether a worker of this process still compiles kernels beside the runs (their stand-ins
    serve meanwhile: :func:`stand_ins`)."""
    return any(not entry[0].done() for entry in list(_beside.values()))


def _wait_background() -> None:
    while _background:
        _background.pop().wait()


def _detach() -> None:
    """In a forked worker: its standard input and outputs on ``os.devnull``, and the socket an
    MPI launcher gave its parent closed (MPICH's ``PMI_FD``), so that whatever waits for the
    parent to end by watching them (a caller reading its output pipes, ``mpiexec`` watching a
    rank) does not wait for the worker too: a rank that exited during a compile was otherwise
    seen alive until its workers were done, and the job's other ranks waited out their
    collectives' timeout. A worker writes nothing of its own (what it cannot compile is
    compiled, and reported, at the first call)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    pmi = os.environ.get("PMI_FD", "")
    if pmi.isdigit() and int(pmi) > 2:
        try:
            os.close(int(pmi))
        except OSError:
            pass


#: the ``nice`` increment of a worker that compiles beside the runs (:func:`_fork_workers`)
IDLE_NICE = 10


def _fork_workers(todo: list, n: int = 1, refresh: bool = True, idle: bool = False) -> tuple:
    """Fork ``n`` workers that compile ``todo``'s groups of jobs from one queue into the disk
    cache; returns ``(their pids, the queue's read end)`` (this process may take groups from
    it too; fewer pids where a fork failed, none where every one did). ``refresh``: Numba's
    registries loaded before the fork, for every process (else each worker loads them, off
    this process's path). ``idle``: the workers run at the lowest priority the scheduler
    still shares a core with (``nice`` 10: a tenth of a core beside a busy thread; not
    ``SCHED_IDLE``, under which a worker that held the disk cache's lock waited on a busy
    machine, and the processes that wanted it with it)."""
    # the queue: a pipe holding every group's index; a 2-byte read claims one, atomically
    rd, wr = os.pipe()
    os.write(wr, b"".join(i.to_bytes(2, "little") for i in range(len(todo))))
    os.close(wr)
    os.set_blocking(rd, False)
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with global_compiler_lock, warnings.catch_warnings():
        # Numba's registries imported and installed once, here, before the fork (a compile
        # does it first): the worker inherits them instead of spending its first ~0.7 s on it
        if refresh:
            cpu_target.target_context.refresh()
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with native threads
        pids = []
        for _ in range(n):
            try:
                pid = os.fork()
            except OSError:  # (a limit on processes, or memory): fewer workers, maybe none
                break
            if pid == 0:  # a worker: compile into the disk cache, then leave without cleanup
                try:
                    _detach()
                    if idle:
                        with contextlib.suppress(OSError):
                            os.nice(IDLE_NICE)
                    # (an interrupt, Ctrl-C reaching the whole process group, ends it: this
                    # process does not wait for it then, at exit or in a run)
                    _drain(rd, todo, Exception)
                finally:
                    os._exit(0)
            pids.append(pid)
    return pids, rd


def precompile(jobs) -> int:
    """Compile ``jobs`` (``(Compiled or LibraryKernel, predicted argument types)``: a job has
    ``fn``, ``name``, ``cost`` and ``affinity``) before their first call, this process and a
    forked worker taking them from one queue, by groups of one affinity (:func:`_affinity`),
    costliest first (the sum of their ``cost``); the worker writes what it compiles
    to the disk cache, from which the first calls here load it. Within :func:`compile_later`,
    they are handed to its :class:`Background` (whose workers take them all once the plan is
    built) and this process does not wait for them. Within :func:`stand_ins`, the library
    kernels that have a stand-in are compiled beside the first runs instead (where a worker
    may be forked: :func:`_compile_beside`).
    Kernels already on disk or in memory are skipped, and a prediction that turns out wrong
    only means the first call compiles as it would have anyway. Returns how many kernels
    the worker compiled (0 without a worker; within :func:`compile_later`, how many were
    handed over)."""
    todo, seen = [], set()
    for c, argtypes in jobs:
        try:
            sig = tuple(_numba_type(t) for t in argtypes)
        except (TypeError, ValueError, NotImplementedError):
            continue
        if (c.name, sig) in seen:  # (a library kernel called by many ops: checked once)
            continue
        seen.add((c.name, sig))
        if sig in c.fn.overloads or _is_cached(c, sig):
            continue
        todo.append((c, sig))
    later = getattr(_later, "bg", None)
    if later is not None:  # compile_later: its workers take them all; this process goes on
        held = {(id(c.fn), sig) for c, sig in later.todo}
        for job in todo:
            key = (id(job[0].fn), job[1])
            other = _in_flight.get(key)
            if other is not None and not other.done():  # (another plan's workers have it)
                if other is not later and other not in later.after:
                    later.after.append(other)
                continue
            _in_flight.pop(key, None)
            if key not in held:
                held.add(key)
                later.todo.append(job)
        return len(todo)
    beside = [job for job in todo if getattr(job[0], "stand_in", False)] if \
        getattr(_stand_ins, "on", False) and compile_workers() > 0 else []
    if beside:
        todo = [job for job in todo if not getattr(job[0], "stand_in", False)]
        try:
            return _precompile_now(todo)
        finally:
            _compile_beside(beside)
    return _precompile_now(todo)


def _precompile_now(todo) -> int:
    """:func:`precompile`'s compile of ``todo`` (``(job, Numba signature)``, none compiled or
    on disk) before the first calls."""
    if len(todo) < POOL_MIN_JOBS or compile_workers() == 0 or len(todo) > _MAX_JOBS or \
            os.path.abspath(str(cache_dir())) in _disk_off or \
            not hasattr(os, "fork") or \
            threading.active_count() > 1:  # another Python thread may hold a lock forever
        return 0
    groups: dict = {}
    for job in todo:
        groups.setdefault(_affinity(job[0]), []).append(job)
    todo = sorted(groups.values(), key=lambda g: -sum(c.cost for c, _ in g))
    pids, rd = _fork_workers(todo)
    if not pids:  # no worker could be forked: the kernels compile at their first calls
        os.close(rd)
        return 0
    (pid,) = pids
    t0 = time.monotonic()
    try:
        mine = _drain(rd, todo, Exception)
    except BaseException:  # an interrupt: stop the worker too, and let it through
        os.close(rd)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    os.close(rd)
    # whatever the worker is still compiling, this process will need: wait for it (a worker
    # that hangs is killed: its kernels then compile at their first call)
    _wait(pid, deadline=time.monotonic() + max(30.0, 3 * (time.monotonic() - t0)))
    theirs = sum(len(g) for g in todo) - mine
    _by_worker[0] += theirs
    return theirs


def _drain(rd: int, todo: list, swallow) -> int:
    """Compile groups of jobs from the queue until it is empty; how many jobs this process
    took. A job's failure (of class ``swallow``) is left for its first call to report."""
    n = 0
    while True:
        try:
            item = os.read(rd, 2)
        except BlockingIOError:
            return n
        if len(item) < 2:
            return n
        for c, sig in todo[int.from_bytes(item, "little")]:
            n += 1
            try:
                c.fn.compile(sig)
            except swallow:  # noqa: BLE001 - the first call compiles again and reports it
                pass


def _wait(pid: int, deadline: float) -> None:
    """Wait for the worker; one that hangs past ``deadline`` (or an interrupt) kills it (its
    kernels then compile at their first call, as without a worker)."""
    done = 0
    try:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped already (SIGCHLD ignored, another waiter)
                done = pid
            if done:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.002)
    finally:
        if not done:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def warmup(dtypes=("float32",), target: str = "cpu") -> dict:
    """Compile the library kernels of ``target`` (its ``warmup_jobs``: for the CPU, every
    entry point of its library, for float data of each of ``dtypes``, and its math functions)
    into the disk cache, on two cores as :func:`precompile` does: what ``pdjit warmup`` runs
    once per installation (a container image, a read-only install with a writable
    ``PDJIT_CACHE_DIR``), so that no process compiles them at a first run.
    Returns how many compile jobs there were, how many were on disk already, how many were
    compiled, and the seconds it took."""
    from pdjit.codegen.target import get_target

    _harden_libraries(target)
    diskcache.claim_warmup()  # no background warmup started for this folder after this one
    t0 = time.perf_counter()
    todo, jobs = [], []
    for c, argtypes in get_target(target).warmup_jobs(dtypes):
        try:
            sig = tuple(_numba_type(t) for t in argtypes)
        except (TypeError, ValueError, NotImplementedError):  # not a type precompile knows
            continue
        jobs.append((c, argtypes))
        if sig not in c.fn.overloads and not _is_cached(c, sig):
            todo.append((c, sig))
    precompile(jobs)
    for c, sig in todo:  # what no worker took (none, or a single core): compiled here
        if sig not in c.fn.overloads and not _is_cached(c, sig):
            c.fn.compile(sig)
    diskcache.save_runtime_library()  # Numba's runtime functions, which loaded code needs
    try:
        (diskcache.library_dir() / diskcache.WARMUP_DONE).write_text(",".join(dtypes) + "\n")
    except OSError:
        pass
    return {"jobs": len(jobs), "cached": len(jobs) - len(todo), "compiled": len(todo),
            "seconds": time.perf_counter() - t0, "directory": str(diskcache.library_dir())}
