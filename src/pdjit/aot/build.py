"""``compile_model``: a saved inference model to an AOT artifact directory (see ``pdjit.aot``)."""
from __future__ import annotations

import glob
import os
import shutil
import struct
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import numba
import numpy as np

from pdjit.aot import batch_split, csource, loader
from pdjit.codegen.aot import entry
from pdjit.codegen.aot.numba_aot import compile_object
from pdjit.codegen.target import get_target
from pdjit.framework.dtypes import to_numpy
from pdjit.framework.errors import AotError, ReferenceStepWarning
from pdjit.io.inference_model import load_model
from pdjit.passes.inference import optimize

__all__ = ["compile_model", "AotError", "Spec"]

SYMBOL = "pdjit_entry"
_ALIGN = 64


@dataclass
class Spec:
    """What the C side needs to know: inputs/outputs ``(name, dtype, shape with -1)``, the byte
    offsets of the parameters in the params blob (in entry argument order), and its size and
    checksum."""
    inputs: list
    outputs: list
    param_names: list
    param_offsets: list
    params_bytes: int
    params_hash: int
    symbol: str = SYMBOL
    timings: dict = field(default_factory=dict)
    # the build's options (``compile_model``'s keywords): batch, fixed_batch, threads,
    # embed_params, cpu; the C source, the loader and the link read them from here
    options: dict = field(default_factory=dict)
    # what the user should know about the build (``pdjit compile`` prints them): ops saved in
    # training mode that the inference passes switched to their inference form
    notes: list = field(default_factory=list)


def checksum(blob: bytes) -> int:
    """The parameters' checksum model.c recomputes: over the blob's 64-bit words ``w_i``,
    the XOR of ``w_i * K1 + i * K2`` (mod 2**64)."""
    w = np.frombuffer(blob, np.uint64)
    i = np.arange(w.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = w * np.uint64(0x9E3779B97F4A7C15) + i * np.uint64(0xBF58476D1CE4E5B9)
    return int(np.bitwise_xor.reduce(mixed)) if w.size else 0


def compile_model(model_path, out_dir, batch: int = 1, cpu: str = "host",
                  params_file: str | None = None, *, fixed_batch: bool = False,
                  threads: int = 1, embed_params: bool = False,
                  prefix: str = csource.DEFAULT_PREFIX) -> Spec:
    """Compile the saved model at ``model_path`` (any layout ``pdjit.io.inference_model.load_model``
    reads) into ``out_dir`` (see ``pdjit.aot``). ``batch``: the batch the instances' memory is
    sized for at creation by default. ``cpu``: ``host`` (this machine's instruction set) or
    ``generic``. ``fixed_batch``: runs take 1 to ``batch`` rows and memory never grows (else
    any batch, memory re-sized after a bigger one). ``threads``, ``embed_params``: see
    ``pdjit.aot``. ``prefix``: of the C ABI's names (``PREFIX_model_create``; the library
    ``libPREFIX.so``, the header ``PREFIX.h``; default ``pdjit``: ``libmodel.so``,
    ``model.h``), for a program that links several artifacts.
    Raises :class:`AotError` for a model it cannot compile, naming the op."""
    if not isinstance(batch, int) or batch < 1:
        raise AotError(f"batch: expected an int >= 1, got {batch!r}")
    try:
        csource.check_prefix(prefix)
    except ValueError as e:
        raise AotError(str(e)) from None
    cc = shutil.which("cc")
    if cc is None:
        raise AotError("no C compiler: 'cc' is not on PATH")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):   # before the long part
        raise AotError(f"output {str(out_dir)!r}: expected a directory, got a file")
    t0 = time.perf_counter()
    model = load_model(model_path, params_file)
    notes = _training_mode_ops(model.program)
    program, params = optimize(model.program, model.params, target=get_target(entry.NAME))
    gb = program.global_block()
    for n in model.feed_names:   # before the plan, whose refusal would name an op reading it
        v = gb._find_var_recursive(n)
        if v is not None and getattr(v, "lod_level", 0):
            raise AotError(f"{model_path}: cannot compile ahead of time: input {n!r} is a LoD "
                           f"tensor (lod_level {v.lod_level}); sequences are not compiled "
                           "ahead of time yet")
    with warnings.catch_warnings():
        # a step that runs its reference is refused below, naming the op: no warning too
        warnings.simplefilter("ignore", ReferenceStepWarning)
        plan = entry.build_plans(program, model.fetch_names)
    for step in plan.steps:
        why = entry.refuse_step(plan, step)
        if why is not None:
            raise AotError(f"{model_path}: cannot compile ahead of time: {why}")
    t_plan = time.perf_counter()

    def desc(name):
        v = gb._find_var_recursive(name)
        if v is None:
            raise AotError(f"{model_path}: variable {name!r} is not declared")
        return v

    def spec(n, what):
        """(name, dtype name, declared dims) of an input or output the ABI can carry."""
        v = desc(n)
        dtype = np.dtype(to_numpy(v.dtype)).name
        if dtype not in csource.DTYPES:
            raise AotError(f"{what} {n!r}: dtype {dtype} is not supported (expected one of "
                           f"{csource.DTYPES})")
        if what == "input" and getattr(v, "lod_level", 0):
            raise AotError(f"input {n!r} is a LoD tensor (lod_level {v.lod_level}): sequences "
                           "are not compiled ahead of time yet")
        if len(v.shape) > 8:   # model.c's shape tables hold 8 dims
            raise AotError(f"{what} {n!r}: rank {len(v.shape)} is not supported (expected at "
                           "most 8)")
        return n, dtype, [int(d) for d in v.shape]

    inputs = [spec(n, "input") for n in model.feed_names]
    outputs = [spec(n, "output") for n in model.fetch_names]
    # the parameters the steps read (in sub-blocks too), in first-use order
    used = []
    for n in entry.reads(plan):
        if n in params and n not in used and n not in model.feed_names:
            used.append(n)
    blob, offsets, values = bytearray(), [], []
    for n in used:
        a = np.ascontiguousarray(params[n])
        pad = (-len(blob)) % _ALIGN
        blob += b"\0" * pad
        offsets.append(len(blob))
        blob += a.tobytes()
        values.append((n, a))
    blob += b"\0" * ((-len(blob)) % _ALIGN)
    split, why_not = batch_split.analyse(program, plan, model.feed_names, model.fetch_names)
    spec = Spec(inputs, outputs, used, offsets, len(blob), checksum(bytes(blob)),
                options={"batch": batch, "fixed_batch": bool(fixed_batch),
                         "threads": threads, "embed_params": bool(embed_params), "cpu": cpu,
                         "batch_split": split, "batch_split_why_not": why_not,
                         "prefix": prefix,
                         "warm_up": not entry.has_loop(plan)})
    spec.notes = notes
    func, argtypes = entry.entry(program, plan, spec.inputs, spec.outputs, values)
    t_src = time.perf_counter()
    try:
        obj, _ = compile_object(func, argtypes, SYMBOL, cpu=cpu,
                                scope=get_target(entry.NAME).llvm_scope)
    except numba.core.errors.NumbaError as e:
        raise AotError(f"{model_path}: cannot compile ahead of time: {entry.culprit(plan, e)}") \
            from None
    t_obj = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    _write_params(os.path.join(out_dir, "model.params"), spec, bytes(blob))
    _link(out_dir, obj, spec, cc, bytes(blob))
    with open(os.path.join(out_dir, "__init__.py"), "w") as f:
        f.write(loader.source(spec))
    _loader_bytecode(os.path.join(out_dir, "__init__.py"))
    with open(os.path.join(out_dir, "example.c"), "w") as f:
        f.write(csource.example_c(prefix))
    t_end = time.perf_counter()
    spec.timings = {"load+plan": t_plan - t0, "numba_aot": t_obj - t_src,
                    "link": t_end - t_obj, "total": t_end - t0}
    return spec


def _loader_bytecode(path) -> None:
    """The loader's bytecode for this Python, beside it in ``__pycache__``, checked against the
    source's hash (not its mtime: still valid in a copy of the directory, and recompiled if the
    source is edited): a process that may not write bytecode (PYTHONDONTWRITEBYTECODE, a
    read-only directory) would otherwise compile the loader at every start (4-12 ms here).
    Another Python version compiles it as usual."""
    import importlib.util
    import py_compile

    try:
        py_compile.compile(path, cfile=importlib.util.cache_from_source(path), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    except (py_compile.PyCompileError, NotImplementedError, OSError) as e:  # a speed-up only
        warnings.warn(f"{path}: the loader's bytecode was not written ({e})", stacklevel=3)


def _training_mode_ops(program) -> list:
    """A note for each op the saved program runs in training mode (``is_test`` False, e.g. a
    random ``dropout``): the inference passes run it in its inference form, as
    ``pdjit.inference``'s predictor and Paddle Inference do, where ``Executor.run`` on the saved
    program would not."""
    notes = []
    for b in program.blocks:
        for i, op in enumerate(b.ops):
            if op.has_attr("is_test") and op.attr("is_test") is False:
                notes.append(f"op {op.type!r} (#{i}, block {b.idx}) was saved in training mode "
                             "(is_test=False): compiled in its inference form, as "
                             "pdjit.inference's predictor runs it")
    return notes


def _write_params(path, spec, blob: bytes) -> None:
    head = b"PDJITPRM" + struct.pack("<4Q", 1, len(spec.param_offsets), spec.params_bytes,
                                     spec.params_hash)
    with open(path, "wb") as f:
        f.write(head + blob)


def _openblas_files() -> list:
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    found = sorted(glob.glob(os.path.join(libs, "*.so*")))
    if not any("openblas" in os.path.basename(f) for f in found):
        raise AotError(f"NumPy's OpenBLAS was not found in {libs} (the library links it)")
    return found


def _place(src: str, dst: str) -> None:
    """``dst``: the file ``src`` (NumPy's BLAS, 28 MB with what it needs), a hard link where
    the file system allows one (no space taken; the artifact's directory still holds a file
    of its own, moved or deleted with it), else a copy."""
    try:
        if os.path.lexists(dst):
            os.unlink(dst)
        os.link(src, dst)
    except OSError:  # another device, a file system without links, a protected file
        shutil.copy2(src, dst)


def _link(out_dir, obj: bytes, spec: Spec, cc: str, blob: bytes) -> None:
    """Link ``libmodel.so`` (``csource.files``: ``libPREFIX.so``) from the entry's object and
    the C of ``csource.build_files`` (``blob``: the parameters, for a build that embeds them;
    ``csource.extra_sources`` may add files, e.g. an assembler file that includes the blob).
    Only the API is exported (``csource.version_script``), and the library's own
    references to it bind to itself (``-Bsymbolic``: another artifact loaded before it with the
    same names, e.g. ``RTLD_GLOBAL``, does not take its calls)."""
    libs = _openblas_files()
    for f in libs:
        dst = os.path.join(out_dir, os.path.basename(f))
        if not os.path.exists(dst) or os.path.getsize(dst) != os.path.getsize(f):
            _place(f, dst)
    blas = next(os.path.basename(f) for f in libs if "openblas" in os.path.basename(f))
    prefix = csource.options(spec)["prefix"]
    libname, header = csource.files(prefix)
    with open(os.path.join(out_dir, header), "w") as f:
        f.write(csource.header(prefix))
    with tempfile.TemporaryDirectory(prefix="pdjit-aot-") as tmp:
        paths = {}
        files = csource.build_files(spec) + csource.extra_sources(spec, blob, tmp)
        for name, text in files:
            paths[name] = os.path.join(tmp, name)
            with open(paths[name], "w") as f:
                f.write(text)
        script = os.path.join(tmp, "exports.map")
        with open(script, "w") as f:
            f.write(csource.version_script(prefix))
        o = os.path.join(tmp, "entry.o")
        with open(o, "wb") as f:
            f.write(obj)
        out = os.path.join(out_dir, libname)
        units = [p for name, p in paths.items() if not name.endswith(".h")]
        cmd = [cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{out_dir}", f"-I{tmp}",
               *units, o, "-o", out, f"-L{out_dir}",
               f"-l:{blas}", "-lm", "-ldl", "-lpthread", "-Wl,-rpath,$ORIGIN",
               "-Wl,--no-undefined", f"-Wl,--version-script={script}",
               f"-Wl,-soname,{libname}", "-Wl,-Bsymbolic"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise AotError(f"linking {out} failed ({' '.join(cmd)}):\n{r.stderr[-4000:]}")
