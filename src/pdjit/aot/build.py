"""``compile_model``: a saved inference model to an AOT artifact directory (see ``pdjit.aot``)."""
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import numba
import numpy as np

from pdjit.aot import batch_split, csource, loader
from pdjit.aot.numba_aot import compile_object, pointer
from pdjit.framework.dtypes import to_numpy
from pdjit.framework.errors import PdjitError
from pdjit.io.inference import load_model
from pdjit.passes.inference import optimize
from pdjit.runtime import threads
from pdjit.runtime.plan import build_plan

SYMBOL = "pdjit_entry"
_ALIGN = 64


class AotError(PdjitError):
    """A model that cannot be compiled ahead of time (the message names the op or the value),
    or a toolchain that is missing or failed."""


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
    # the build's options (``compile_model``'s keywords): batch, dynamic_batch, threads,
    # embed_params, cpu; the C source, the loader and the link read them from here
    options: dict = field(default_factory=dict)


def checksum(blob: bytes) -> int:
    """The parameters' checksum model.c recomputes: over the blob's 64-bit words ``w_i``,
    the XOR of ``w_i * K1 + i * K2`` (mod 2**64)."""
    w = np.frombuffer(blob, np.uint64)
    i = np.arange(w.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = w * np.uint64(0x9E3779B97F4A7C15) + i * np.uint64(0xBF58476D1CE4E5B9)
    return int(np.bitwise_xor.reduce(mixed)) if w.size else 0


@contextlib.contextmanager
def _one_thread():
    """Plans built inside generate one-thread code (no ``prange``: ahead-of-time code has no
    thread pool), whatever thread count this process asked for; restored after."""
    saved, numba_saved = threads._applied, numba.get_num_threads()
    threads._applied = 1
    try:
        yield
    finally:
        threads._applied = saved
        numba.set_num_threads(numba_saved)


def _refuse_step(step) -> str | None:
    """Why ``step`` cannot be compiled ahead of time, or None."""
    if step.kind == "reference":
        return f"op {step.op.type!r} (#{step.op_idx}) has no native lowering ({step.why})"
    if step.kind != "native":
        op, i = step.ops[0]
        return f"op {op.type!r} (#{i}) runs as a {step.kind} step (control flow is not " \
               f"compiled ahead of time yet)"
    op, i = step.ops[0]
    if step.native is None:
        return f"op {op.type!r} (#{i}): its step has no native driver"
    if step.rng_ops:
        return f"op {step.rng_ops[0][0].type!r}: random ops are not compiled ahead of time"
    if step.lod_flow.always or any(True for _ in getattr(step.lod_flow, "requests", ())):
        return f"op {op.type!r} (#{i}): LoD inputs are not compiled ahead of time"
    if "parallel=True" in step.native.text:
        return f"op {op.type!r} (#{i}): a parallel driver (build with one thread)"
    return None


def compile_model(model_path, out_dir, batch: int = 1, cpu: str = "host",
                  params_file: str | None = None, *, dynamic_batch: bool = False,
                  threads: int = 1, embed_params: bool = False) -> Spec:
    """Compile the saved model at ``model_path`` (any layout ``pdjit.io.inference.load_model``
    reads) into ``out_dir`` (see ``pdjit.aot``). ``batch``: the batch the instances' memory is
    sized for at creation by default. ``cpu``: ``host`` (this machine's instruction set) or
    ``generic``. ``dynamic_batch``, ``threads``, ``embed_params``: see ``pdjit.aot``.
    Raises :class:`AotError` for a model it cannot compile, naming the op."""
    if not isinstance(batch, int) or batch < 1:
        raise AotError(f"batch: expected an int >= 1, got {batch!r}")
    cc = shutil.which("cc")
    if cc is None:
        raise AotError("no C compiler: 'cc' is not on PATH")
    t0 = time.perf_counter()
    model = load_model(model_path, params_file)
    program, params = optimize(model.program, model.params)
    gb = program.global_block()
    with _one_thread():
        plan = build_plan(program, model.fetch_names, native_drivers=True)
    for step in plan.steps:
        why = _refuse_step(step)
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
        return n, dtype, [int(d) for d in v.shape]

    inputs = [spec(n, "input") for n in model.feed_names]
    outputs = [spec(n, "output") for n in model.fetch_names]
    # the parameters the steps read, in first-use order
    used = []
    for step in plan.steps:
        for n in step.args:
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
                options={"batch": batch, "dynamic_batch": bool(dynamic_batch),
                         "threads": threads, "embed_params": bool(embed_params), "cpu": cpu,
                         "batch_split": split, "batch_split_why_not": why_not})
    func, argtypes = _entry(plan, spec, values, model.feed_names)
    t_src = time.perf_counter()
    try:
        obj, _ = compile_object(func, argtypes, SYMBOL, cpu=cpu)
    except numba.core.errors.NumbaError as e:
        raise AotError(f"{model_path}: cannot compile ahead of time: {_culprit(plan, e)}") \
            from None
    t_obj = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    _write_params(os.path.join(out_dir, "model.params"), spec, bytes(blob))
    _link(out_dir, obj, spec, cc, bytes(blob))
    with open(os.path.join(out_dir, "__init__.py"), "w") as f:
        f.write(loader.source(spec))
    with open(os.path.join(out_dir, "example.c"), "w") as f:
        f.write(csource.EXAMPLE)
    t_end = time.perf_counter()
    spec.timings = {"load+plan": t_plan - t0, "numba_aot": t_obj - t_src,
                    "link": t_end - t_obj, "total": t_end - t0}
    return spec


def _entry(plan, spec, values, feed_names):
    """The entry function (compiled below) and its argument types."""
    from numba.core import types as nt

    local: dict = {}
    ns = {"numba": numba, "np": np}
    args, argtypes, body = [], [], []

    def fresh(name):
        local[name] = f"v{len(local)}"
        return local[name]

    for k, (name, dtype, shape) in enumerate(spec.inputs):
        dims = [f"n{k}_{d}" for d in range(len(shape))]
        args += [f"p{k}"] + dims
        argtypes += [pointer(dtype)] + [nt.int64] * len(shape)
        body.append(f"{fresh(name)} = numba.carray(p{k}, ({''.join(d + ', ' for d in dims)}))")
    for k, (name, value) in enumerate(values):
        args.append(f"w{k}")
        argtypes.append(pointer(value.dtype))
        dims = "".join(f"{int(d)}, " for d in value.shape)
        body.append(f"{fresh(name)} = numba.carray(w{k}, ({dims}))")
    for j, step in enumerate(plan.steps):
        ns[f"S{j}"] = step.native.fn
        missing = [n for n in step.args if n not in local]
        if missing:
            raise AotError(f"step {j} ({step.ops[0][0].type}) reads {missing[0]!r}, which is "
                           "neither fed, a parameter nor computed before it")
        body.append(f"r{j} = S{j}({', '.join(local[n] for n in step.args)})")
        for i, n in enumerate(step.outputs):
            body.append(f"{fresh(n)} = r{j}[{i}]")
    meta_len = max(1, sum(len(s) for _, _, s in spec.outputs))
    body.append(f"mt = numba.carray(meta, ({meta_len},))")
    body.append("big = False")
    k = 0
    for i, (name, dtype, shape) in enumerate(spec.outputs):
        if name not in local:
            raise AotError(f"output {name!r}: nothing computes it")
        args += [f"q{i}", f"c{i}"]
        argtypes += [pointer(dtype), nt.int64]
        o = local[name]
        if len(shape):
            body.append(f"if {o}.ndim != {len(shape)}:")
            body.append("    return 2")
        for d in range(len(shape)):
            body.append(f"mt[{k + d}] = {o}.shape[{d}]")
        k += len(shape)
        body.append(f"if {o}.size > c{i}:")
        body.append("    big = True")
    body.append("if big:")
    body.append("    return 3")
    for i, (name, _, _) in enumerate(spec.outputs):
        o = local[name]
        body.append(f"d{i} = numba.carray(q{i}, ({o}.size,))")
        body.append(f"for t, x in enumerate({o}.flat):")
        body.append(f"    d{i}[t] = x")
    body.append("return 0")
    args.append("meta")
    argtypes.append(nt.CPointer(nt.int64))
    src = f"def entry({', '.join(args)}):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(src, "<pdjit aot entry>", "exec"), ns)  # noqa: S102
    return ns["entry"], argtypes


def _culprit(plan, exc) -> str:
    """Which op's code Numba refused (from the generated module and line in its message)."""
    text = str(exc)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and
                  "Failed in nopython" not in ln), type(exc).__name__)
    first = re.sub(r"\x1b\[[0-9;]*m", "", first)
    for m in re.finditer(r'(pdjit_gen_[0-9a-f]+)\.py", line (\d+)', text):
        for step in plan.steps:
            if step.native is not None and step.native.name == m.group(1):
                lines = step.native.text.splitlines()[:int(m.group(2))]
                group = next((ln.strip() for ln in reversed(lines)
                              if ln.strip().startswith("# group ")), None)
                if group is not None:
                    ops = re.search(r"\[(.*?)\]", group)
                    what = ops.group(1) if ops else group
                    return f"op(s) [{what}] have no code Numba compiles without Python " \
                           f"({first})"
    return f"Numba could not compile the model's native code ({first})"


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


def _link(out_dir, obj: bytes, spec: Spec, cc: str, blob: bytes) -> None:
    """Link ``libmodel.so`` from the entry's object, the runtime and ``csource.model_c``'s C
    (``blob``: the parameters, for a build that embeds them; ``csource.extra_sources`` may add
    files, e.g. an assembler file that includes the blob)."""
    libs = _openblas_files()
    for f in libs:
        dst = os.path.join(out_dir, os.path.basename(f))
        if not os.path.exists(dst) or os.path.getsize(dst) != os.path.getsize(f):
            shutil.copy2(f, dst)
    blas = next(os.path.basename(f) for f in libs if "openblas" in os.path.basename(f))
    with open(os.path.join(out_dir, "model.h"), "w") as f:
        f.write(csource.header())
    with tempfile.TemporaryDirectory(prefix="pdjit-aot-") as tmp:
        paths = {}
        files = [("runtime.c", csource.RUNTIME), ("model.c", csource.model_c(spec))]
        files += csource.extra_sources(spec, blob, tmp)
        for name, text in files:
            paths[name] = os.path.join(tmp, name)
            with open(paths[name], "w") as f:
                f.write(text)
        o = os.path.join(tmp, "entry.o")
        with open(o, "wb") as f:
            f.write(obj)
        out = os.path.join(out_dir, "libmodel.so")
        cmd = [cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{out_dir}",
               *paths.values(), o, "-o", out, f"-L{out_dir}",
               f"-l:{blas}", "-lm", "-ldl", "-lpthread", "-Wl,-rpath,$ORIGIN",
               "-Wl,--no-undefined"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise AotError(f"linking {out} failed ({' '.join(cmd)}):\n{r.stderr[-4000:]}")
