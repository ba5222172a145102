"""Where pdjit's compiled code is kept on disk: one directory, ``PDJIT_CACHE_DIR``.

Numba's own cache puts a function's compiled code beside its source file (the package's
``__pycache__``: a read-only install recompiles in every process) or under
``NUMBA_CACHE_DIR`` in a folder named after the source's absolute path, and stamps each index
with the source file's modification time. A cache directory copied or mounted elsewhere then
matches nothing. pdjit gives every function it compiles a cache of its own
(:func:`attach`), keyed by content instead:

- **Generated kernels** (``<cache dir>/pdjit_gen_<sha256>.py``): their Numba files in
  ``__pycache__`` beside the module file, wherever that directory now is; the stamp is the
  module's text (its name is its hash already).
- **Library kernels** (``pdjit.codegen.cpu.lib``, ``mathfuncs``, ``rt``): under
  ``<cache dir>/lib/<hash>``, whichever directory ``PDJIT_CACHE_DIR`` names at the time of the
  load or save; the hash (and the stamp) is one of every library source file and Numba's
  version (Numba's cache does not notice when a called function in another file changes).
  Numba's own runtime functions, which it compiles in every process, are kept there too
  (:func:`runtime_library`).

The library is compiled once per cache directory, not per process: the first time a process
compiles a library kernel into a directory whose library folder no warmup has started in, it
starts ``pdjit warmup --background`` (:func:`start_background_warmup`): a detached process at
the lowest CPU priority (``SCHED_IDLE``: it runs on cores nothing else wants) that compiles
every library kernel into that folder, and the generated kernels of a few common small
programs into the cache directory (``pdjit.tools.warmup``); processes after it load them.
``PDJIT_AUTO_WARMUP=0`` turns this off (the test suite, benchmarks that time cold caches).

Numba's index key (the signature, the CPU's name and features, the function's bytecode) is
kept, so a cache copied to another kind of machine is not misused. ``NUMBA_CACHE_DIR`` does not
apply to pdjit's code. Data files end with a SHA-256 of their content, checked on load (a
damaged file is dropped: ``compiler._harden``).
"""
from __future__ import annotations

import hashlib
import inspect
import os
import pathlib
import pickle
import subprocess
import sys

from numba.core import caching

#: the library's subdirectory of the cache directory
LIBRARY_DIR = "lib"


_dirs: dict = {}  # (PDJIT_CACHE_DIR, XDG_CACHE_HOME, HOME) -> the cache directory


def cache_dir() -> pathlib.Path:
    """``PDJIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pdjit`` (``~/.cache/pdjit``): looked up at
    each call (the environment may change in a process), computed once per setting."""
    env = os.environ.get
    key = (env("PDJIT_CACHE_DIR"), env("XDG_CACHE_HOME"), env("HOME"))
    found = _dirs.get(key)
    if found is None:
        if key[0]:
            found = pathlib.Path(key[0]).expanduser()
        else:
            base = key[1] or os.path.join(os.path.expanduser("~"), ".cache")
            found = pathlib.Path(base) / "pdjit"
        _dirs[key] = found
    return found


_lib_dirs: dict = {}  # cache directory -> its library folder


def library_dir() -> pathlib.Path:
    """Where the library kernels' compiled code is: a folder per version of the library's
    sources (:func:`library_stamp`), so that two installations sharing one cache directory
    do not overwrite each other's entries."""
    base = cache_dir()
    found = _lib_dirs.get(base)
    if found is None:
        found = _lib_dirs[base] = base / LIBRARY_DIR / library_stamp()[:16]
    return found


_LIBRARY_STAMP: list = []


def library_stamp() -> str:
    """A hash of the library's sources (each target's ``lib``, ``mathfuncs``, ``rt``) and
    Numba's version: a change in any of them invalidates every library kernel's cache."""
    if not _LIBRARY_STAMP:
        import numba

        here = pathlib.Path(__file__).parent
        h = hashlib.sha256(numba.__version__.encode())
        # every target's library (lib/), math functions and run-time helpers
        for f in sorted([*here.glob("*/lib/*.py"), *here.glob("*/mathfuncs.py"),
                         *here.glob("*/rt.py")]):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        _LIBRARY_STAMP.append(h.hexdigest())
    return _LIBRARY_STAMP[0]


TRAILER = b"\npdjit-sha256:"   # ends every data file, followed by the digest of what precedes


class CacheDamage(Exception):
    """A cache file whose content is not what was written."""


def _sealed(payload: bytes) -> bytes:
    """``payload`` followed by :data:`TRAILER` and its SHA-256."""
    return payload + TRAILER + hashlib.sha256(payload).digest()


def _unsealed(raw: bytes, path) -> bytes:
    """What :func:`_sealed` was given (``raw`` without a trailer: as it is); CacheDamage
    where the digest does not match."""
    n = len(TRAILER) + 32
    if len(raw) >= n and raw[-n:-32] == TRAILER:
        raw, digest = raw[:-n], raw[-32:]
        if hashlib.sha256(raw).digest() != digest:
            raise CacheDamage(f"{path}: its content does not match its SHA-256")
    return raw


class _IndexFile(caching.IndexDataCacheFile):
    """Numba's index and data files, each data file checksummed."""

    def _save_data(self, name, data):
        with self._open_for_write(self._data_path(name)) as f:
            f.write(_sealed(self._dump(data)))

    def _load_data(self, name):
        path = self._data_path(name)
        with open(path, "rb") as f:
            return pickle.loads(_unsealed(f.read(), path))


class _Locator(caching._CacheLocator):
    """pdjit's cache location of one function: ``directory()`` when asked, ``stamp()``."""

    def __init__(self, directory, stamp, lineno: int):
        self._directory, self._stamp, self._lineno = directory, stamp, lineno

    def ensure_cache_path(self):
        os.makedirs(self.get_cache_path(), exist_ok=True)  # an OSError: nothing is saved

    def get_cache_path(self):
        return str(self._directory())

    def get_source_stamp(self):
        return self._stamp()

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):  # pdjit's locators are made by attach()
        return None


class _Impl(caching.CompileResultCacheImpl):
    """Numba's compile results as cache data, with the symbols the code needs defined by
    other libraries (:func:`needs_of`): resolved before a loaded library is finalized, and a
    load whose symbols cannot be defined is a miss (compiled again), never an unresolved
    symbol (which LLVM answers by ending the process)."""

    _locator_classes = [_Locator]

    def reduce(self, cres):
        return super().reduce(cres), tuple(sorted(needs_of(cres.library).items()))

    def rebuild(self, target_context, payload):
        if not (isinstance(payload, tuple) and len(payload) == 2 and
                isinstance(payload[1], tuple)):
            return None  # (an entry of another layout)
        data, needs = payload
        for symbol, how in needs:
            if not define_symbol(symbol, how):
                return None
        cres = super().rebuild(target_context, data)
        cres.library._pdjit_needs = dict(needs)
        return cres

    def __init__(self, py_func, locator):  # given its locator (Numba's searches for one)
        self._lineno = py_func.__code__.co_firstlineno
        self._locator = locator
        modname = os.path.splitext(os.path.basename(inspect.getfile(py_func)))[0]
        fullname = f"{modname}.{getattr(py_func, '__qualname__', py_func.__name__)}"
        self._filename_base = self.get_filename_base(fullname, getattr(sys, "abiflags", ""))


class PdjitCache(caching.FunctionCache):
    """A dispatcher's disk cache in pdjit's directory (see the module's docstring): the
    directory is looked up again at each use (``PDJIT_CACHE_DIR`` may change in a process).
    A library kernel's first save into a library folder starts the background warmup."""

    _impl_class = _Impl

    def __init__(self, py_func, directory, stamp,
                 library: bool = False):  # (Numba's Cache.__init__, located here)
        self._name = repr(py_func)
        self._py_func = py_func
        self._library = library
        self._impl = _Impl(py_func, _Locator(directory, stamp,
                                             py_func.__code__.co_firstlineno))
        self.enable()

    # Numba's Cache reads ``_cache_path`` / ``_cache_file`` (set once in its __init__): here
    # both follow the directory the locator names now
    @property
    def _cache_path(self):
        return self._impl.locator.get_cache_path()

    @property
    def _cache_file(self):
        path = self._impl.locator.get_cache_path()
        held = self.__dict__.get("_pdjit_file")
        if held is None or held._cache_path != path:
            held = self.__dict__["_pdjit_file"] = _IndexFile(
                cache_path=path, filename_base=self._impl.filename_base,
                source_stamp=self._impl.locator.get_source_stamp())
        return held

    def load_overload(self, sig, target_context):
        """Numba's load without its refresh of the target context first (importing and
        installing every registry of Numba's implementations, SciPy's BLAS bindings among
        them: measured ~0.3-0.45 s at a process's first load, a third of a warm ResNet-50's
        first result). Loaded code needs only Numba's runtime (NRT) and the symbols of the
        modules :func:`_init_for_loading` imports; a compile refreshes the context itself
        (Numba's ``CompilerBase`` does, before typing anything)."""
        _init_for_loading(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    def save_overload(self, sig, data):
        super().save_overload(sig, data)
        if self._library:  # a library kernel compiled here: the rest compiled in the background
            start_background_warmup()


# ---- symbols one library's code needs another to define ------------------------------------
# A library kernel called by address (``cpu.lib._jit.by_address``) is not linked into the code
# that calls it: its callers declare a symbol of its own, published in the process (LLVM's
# symbol table) when the kernel is compiled or loaded. A caller kept on disk records the
# symbols it needs and how each is defined (the kernel's module, name and argument types);
# loading it compiles or loads those kernels first.


def needs_of(library) -> dict:
    """``{symbol: (module, qualified name, argument types)}`` of the kernels ``library``'s code
    calls by address, its linked libraries' included."""
    found, seen, todo = {}, set(), [library]
    while todo:
        lib = todo.pop()
        if id(lib) in seen:
            continue
        seen.add(id(lib))
        found.update(getattr(lib, "_pdjit_needs", ()))
        todo += getattr(lib, "_linking_libraries", ())
    return found


def _compiled(how: tuple):
    """The compile result of the kernel ``how`` names (:func:`needs_of`), compiled or loaded
    (which publishes its symbol)."""
    import importlib

    module, qualname, argtypes = how
    kernel = importlib.import_module(module)
    for part in qualname.split("."):
        kernel = getattr(kernel, part)
    kernel.compile(tuple(argtypes))
    return kernel.overloads[tuple(argtypes)]


def define_symbol(symbol: str, how: tuple) -> bool:
    """Compile or load the kernel ``how`` names (:func:`needs_of`), which publishes
    ``symbol``; False where that fails or publishes another symbol."""
    import llvmlite.binding as ll

    try:
        _compiled(how)
    except Exception:  # noqa: BLE001 - any failure: the caller is compiled again
        return False
    return bool(ll.address_of_symbol(symbol))


def link_called_kernels(library, context) -> None:
    """Link into ``library`` (code that must hold its callees: an ahead-of-time library, not
    finalized yet) every kernel its code calls by address (:func:`needs_of`: its linked
    libraries' calls included, compiled for the JIT), each under the symbol its callers call:
    a function of that name calling the kernel's own, inlined by LLVM."""
    import llvmlite.ir as llvm_ir

    done = set()
    while True:
        todo = {s: how for s, how in needs_of(library).items() if s not in done}
        if not todo:
            return
        module = llvm_ir.Module(name="pdjit_called_kernels")
        for symbol, how in sorted(todo.items()):
            cres = _compiled(how)
            library.add_linking_library(cres.library)
            fnty = context.call_conv.get_function_type(cres.fndesc.restype,
                                                       cres.fndesc.argtypes)
            kernel = llvm_ir.Function(module, fnty, cres.fndesc.llvm_func_name)
            wrapper = llvm_ir.Function(module, fnty, symbol)
            wrapper.attributes.add("alwaysinline")
            builder = llvm_ir.IRBuilder(wrapper.append_basic_block())
            builder.ret(builder.call(kernel, wrapper.args))
            done.add(symbol)
        library.add_ir_module(module)


_loading_ready: list = []


def _init_for_loading(target_context) -> None:
    """What compiled code loaded from the disk cache needs of Numba, once per process: its
    runtime (NRT: allocation, reference counts) initialised, and the symbols that Numba's
    modules add to LLVM's symbol table when imported (the hash secret of
    ``numba.cpython.hashing``; the C helpers are added when Numba is imported)."""
    if _loading_ready:
        return
    import numba.cpython.hashing  # noqa: F401 - its symbols
    from numba.core.runtime import nrtdynmod, rtsys

    compile_runtime = getattr(nrtdynmod, "compile_nrt_functions", None)
    if compile_runtime is None:  # (another Numba: its own initialisation)
        rtsys.initialize(target_context)
    else:  # Numba's initialisation, its compiled functions read from the library folder
        nrtdynmod.compile_nrt_functions = runtime_library
        try:
            rtsys.initialize(target_context)
        finally:
            nrtdynmod.compile_nrt_functions = compile_runtime
    load_blas_bindings()
    _loading_ready.append(True)


def runtime_library(target_context):
    """Numba's runtime functions (NRT's reference counts, its allocation helpers: LLVM IR that
    Numba compiles in every process, 0.018-0.027 s of a warm ResNet-50's first result, read
    back in 3 ms) compiled for this CPU, read from the library folder where an earlier
    process left them (a file per CPU name and features, checksummed), else compiled and
    saved there: what Numba's
    ``rtsys.initialize`` calls for them (``nrtdynmod.compile_nrt_functions``), and what
    ``pdjit warmup`` saves. The caller holds Numba's compiler lock."""
    from numba.core.runtime import nrtdynmod

    codegen = target_context.codegen()
    path = _runtime_path(target_context)
    try:
        with open(path, "rb") as f:
            return codegen.unserialize_library(pickle.loads(_unsealed(f.read(), path)))
    except Exception:  # noqa: BLE001 - absent, damaged or unreadable: compiled below
        pass
    module, library = nrtdynmod.create_nrt_module(target_context)
    library.enable_object_caching()
    library.add_ir_module(module)
    library.finalize()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(_sealed(pickle.dumps(library.serialize_using_object_code(), 4)))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: compiled in each process, as Numba does
        tmp.unlink(missing_ok=True)
    return library


def _runtime_path(target_context) -> pathlib.Path:
    from numba.core import config

    key = repr((target_context.codegen().magic_tuple(), bool(config.DEBUG_NRT),
                config.MACHINE_BITS))
    return library_dir() / f"runtime-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pickle"


def save_runtime_library() -> None:
    """Compile Numba's runtime functions into the library folder unless they are there
    (:func:`runtime_library`; for ``pdjit warmup``)."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    context = cpu_target.target_context
    with global_compiler_lock:
        _init_for_loading(context)  # saves them where it initialises Numba's runtime
        if not _runtime_path(context).exists():  # initialised before: the symbols are known
            runtime_library(context)


#: SciPy's module of BLAS function pointers, which Numba's compiled BLAS calls import
BLAS_MODULE = "scipy.linalg.cython_blas"


def load_blas_bindings() -> bool:
    """Load SciPy's BLAS capsule module (:data:`BLAS_MODULE`), from which Numba's compiled
    BLAS calls (``np.dot``, pdjit's ``blas_gemm``) take their function pointers at their first
    call, from its extension file alone: importing it by name first runs the ``scipy.linalg``
    package (LAPACK wrappers, array-API shims, NumPy's f2py: measured 0.15 s of CPU, against
    0.02 s for the file alone, in a process's first run). The module is the same one
    ``import scipy.linalg.cython_blas`` gives, registered under its name; a later
    ``import scipy.linalg`` runs the package as usual (reach the module as
    ``from scipy.linalg import cython_blas``). Nothing is done where the package is loaded
    already; where the file is not found or does not load, the import by name happens at the
    first call, as without this. Whether the module is loaded now."""
    if BLAS_MODULE in sys.modules:
        return True
    if "scipy.linalg" in sys.modules:
        return False
    try:
        import importlib.machinery
        import importlib.util

        spec = importlib.util.find_spec("scipy")
        if spec is None or not spec.submodule_search_locations:
            return False
        folder = pathlib.Path(list(spec.submodule_search_locations)[0]) / "linalg"
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = folder / f"cython_blas{suffix}"
            if path.exists():
                break
        else:
            return False
        spec = importlib.util.spec_from_file_location(BLAS_MODULE, str(path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[BLAS_MODULE] = module
        spec.loader.exec_module(module)
        return True
    except Exception:  # noqa: BLE001 - the import by name at the first call, as without this
        sys.modules.pop(BLAS_MODULE, None)
        return False


# ---- the library compiled once per cache directory, in the background ----------------------
#: in a library folder: created (exclusively) by the first warmup, explicit or background
WARMUP_STARTED = ".warmup-started"
#: in a library folder: written when a warmup has compiled every library kernel
WARMUP_DONE = ".warmup-done"
_background: list = []  # the warmup process this process started (at most one)


def auto_warmup_enabled() -> bool:
    """``PDJIT_AUTO_WARMUP`` (default on; ``0``, ``false``, ``off``, ``no``: off)."""
    return os.environ.get("PDJIT_AUTO_WARMUP", "1").strip().lower() not in (
        "0", "false", "off", "no")


def claim_warmup(directory=None) -> bool:
    """Create the library folder's :data:`WARMUP_STARTED` marker; whether this call created
    it (False: a warmup started there before, or the folder cannot be written)."""
    d = pathlib.Path(directory) if directory is not None else library_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / WARMUP_STARTED, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return False
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return True


def start_background_warmup(popen=None):
    """Start ``python -m pdjit.cli warmup --background`` for the library folder of the cache
    directory in use, once per folder (its :data:`WARMUP_STARTED` marker, created here
    exclusively, says a warmup was started there) and where ``PDJIT_AUTO_WARMUP`` allows;
    detached (a session of its own, no terminal, output discarded), the same pdjit and cache
    directory as this process. Returns the process, or ``None`` where none was started."""
    if _background or not auto_warmup_enabled() or not sys.executable:
        return None
    if not claim_warmup():
        return None
    package_root = str(pathlib.Path(__file__).resolve().parents[2])  # the folder of ``pdjit``
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PDJIT_CACHE_DIR": str(cache_dir()), "PDJIT_AUTO_WARMUP": "0",
           "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
    try:
        proc = (popen or subprocess.Popen)(
            [sys.executable, "-m", "pdjit.cli", "warmup", "--background"], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
    except OSError:  # no process could be started: the first calls compile, as without it
        return None
    _background.append(proc)
    return proc


def lower_priority() -> str:
    """Run this process only on otherwise idle cores (Linux ``SCHED_IDLE``; elsewhere the
    lowest ``nice``): what a background warmup does first. Returns which it got."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "idle"
    except (AttributeError, OSError):
        pass
    try:
        os.nice(19)
        return "nice"
    except (AttributeError, OSError):
        return "none"


def _file_stamp(path: str):
    digest = []

    def stamp():
        if not digest:
            with open(path, "rb") as f:
                digest.append(hashlib.sha256(f.read()).hexdigest())
        return ("pdjit", digest[0])
    return stamp


def attach(dispatcher) -> None:
    """Give ``dispatcher`` (a CPU dispatcher pdjit compiles) pdjit's disk cache: a library
    kernel's under ``<cache dir>/lib``, a generated module's beside its file."""
    fn = dispatcher.py_func
    if fn.__module__.startswith("pdjit."):
        dispatcher._cache = PdjitCache(fn, library_dir, lambda: ("pdjit-lib", library_stamp()),
                                       library=True)
        return
    path = inspect.getfile(fn)
    here = os.path.join(os.path.dirname(path), "__pycache__")
    dispatcher._cache = PdjitCache(fn, lambda: here, _file_stamp(path))


def cached(decorator):
    """``decorator`` (a ``numba.njit(...)`` without ``cache``), its functions given pdjit's
    disk cache (:func:`attach`)."""
    def apply(fn):
        dispatcher = decorator(fn)
        attach(dispatcher)
        return dispatcher
    return apply
