"""The C half of an AOT artifact: the header, the runtime the Numba object needs, the model API
and the example program — C files shipped in ``pdjit/aot/c/`` — and the per-model part
(``model_spec.h``) generated here.

The object compiled by ``pdjit.codegen.aot.numba_aot`` refers to symbols that Numba's JIT
resolves from its own C helpers at run time. The library provides them here, hidden (only
``pdjit_*`` is exported, so loading the library into a Python process that has Numba changes
nothing there):

- NRT's allocation entry points (``NRT_MemInfo_alloc[_aligned]``, ``NRT_MemInfo_call_dtor``,
  ``NRT_Allocate``, ``NRT_Free``): a ``MemInfo`` laid out as NRT's (refcount, destructor,
  destructor data, data, size, and a word that says whether the block came from the heap),
  placed in the running instance's arena (a bump allocator, reset every run) or, when the arena
  is too small, on the heap; after such a run the arena grows to what the run needed;
- ``numba_xxgemm``/``numba_xxgemv``/``numba_xxdot``: the Fortran BLAS of NumPy's OpenBLAS
  (64-bit integers), the product NumPy computes;
- ``numba_attempt_nocopy_reshape``: a reshape's strides without a copy (written here);
- the CPython entry points of Numba's exception-unwrapping code, which runs only inside a
  CPython wrapper and never here: stubs.

The model API (``model.c``) follows the build's options (:func:`options`): a ``--batch N``
library refuses a batch over N and never grows its arenas after creation; with
``batch_split`` (``pdjit.aot.batch_split``) an instance on N threads runs a batch of B rows as
``min(N, B // 2)`` slices, the first on the calling thread and the others on pthreads started
with the instance and parked between runs (a run wakes them: no thread start-up per run; 40 us
on a loaded 2-core box), each with an arena of its own and writing its rows of the outputs in
place (a slice that fails, or inputs that disagree on the batch, send the run to one thread,
which gives the outputs or the error); without it the threads go to OpenBLAS. With
``embed_params`` the parameters are an assembler ``.incbin`` in the library
(:func:`extra_sources`), used in place.

A run the native code refuses (an exception raised in compiled code: an index out of range, sizes
that disagree) fails with ``PDJIT_ERR_NATIVE`` and the exception's type and message: model.c
reads the strings of the pickled ``(class, args, location)`` that Numba's ``excinfo`` struct
points to (its first two members: the bytes and their length), without unpickling; a layout it
does not recognise gives the older message, which only has the status
(``tests/codegen/aot/test_aot_review.py`` checks the message end to end).
"""
from __future__ import annotations

import os
import re

#: dtype codes of the C ABI, in the order of ``model.h``'s enum
DTYPES = ["float32", "float64", "int32", "int64", "uint8", "int8", "bool", "int16", "float16"]

#: status codes of the C ABI
STATUS = {"PDJIT_OK": 0, "PDJIT_ERR_ARGS": 1, "PDJIT_ERR_COUNT": 2, "PDJIT_ERR_DTYPE": 3,
          "PDJIT_ERR_SHAPE": 4, "PDJIT_ERR_PARAMS": 5, "PDJIT_ERR_MEMORY": 6,
          "PDJIT_ERR_NATIVE": 7}

#: the C sources shipped with the package (real files: ``runtime.c``, ``model.c``, the header
#: ``model.h``, ``arena.h`` and ``example.c``); a build adds the generated ``model_spec.h``
C_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "c")


def source(name: str) -> str:
    """The text of the shipped C file ``name`` (under :data:`C_DIR`)."""
    with open(os.path.join(C_DIR, name), encoding="utf-8") as f:
        return f.read()


HEADER = source("model.h")




#: the prefix of the C ABI's names unless ``pdjit compile --prefix`` says otherwise
DEFAULT_PREFIX = "pdjit"
#: the names ``model.h`` declares (its functions and the instance type ``pdjit_model``)
API_NAMES = sorted(set(re.findall(r"\bpdjit_\w+", HEADER)))
_API = re.compile(r"\bpdjit_(" + "|".join(n[len("pdjit_"):] for n in API_NAMES) + r")\b")
_PREFIX_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_prefix(prefix) -> str:
    """``prefix`` if it can start the C ABI's names (a C identifier of 1 to 64 characters),
    else ValueError naming it."""
    if not isinstance(prefix, str) or not _PREFIX_OK.fullmatch(prefix):
        raise ValueError(f"prefix: expected a C identifier of 1 to 64 characters (letters, "
                         f"digits, '_'; not starting with a digit), got {prefix!r}")
    return prefix


def files(prefix: str = DEFAULT_PREFIX) -> tuple:
    """The artifact's library and header file names: ``libmodel.so`` and ``model.h`` by
    default, ``libPREFIX.so`` and ``PREFIX.h`` for another prefix (so that a program can link
    the libraries of several artifacts: ``-lA -lB``)."""
    if prefix == DEFAULT_PREFIX:
        return "libmodel.so", "model.h"
    return f"lib{prefix}.so", f"{prefix}.h"


def exported(prefix: str = DEFAULT_PREFIX) -> list:
    """The functions the library exports (every other symbol is local to it)."""
    return [f"{prefix}_{n[len('pdjit_'):]}" for n in API_NAMES if n != "pdjit_model"]


def renamed(text: str, prefix: str = DEFAULT_PREFIX) -> str:
    """C text (the header, model.c, example.c) with the ABI's names for ``prefix``:
    ``pdjit_model_create`` becomes ``PREFIX_model_create``, the type ``pdjit_model``
    ``PREFIX_model``, ``#include "model.h"`` includes ``PREFIX.h`` and ``-lmodel`` is
    ``-lPREFIX``; the status and dtype codes (``PDJIT_OK``, ``PDJIT_FLOAT32``) stay."""
    if prefix == DEFAULT_PREFIX:
        return text
    lib, head = files(prefix)
    text = _API.sub(lambda m: f"{prefix}_{m.group(1)}", text)
    return (text.replace('#include "model.h"', f'#include "{head}"')
            .replace("PDJIT_MODEL_H", f"{prefix.upper()}_MODEL_H")
            .replace("/* model.h:", f"/* {head}:")
            .replace(" -lmodel ", f" -l{prefix} "))


def version_script(prefix: str = DEFAULT_PREFIX) -> str:
    """The linker's version script: the API exported, everything else (the compiled entry,
    Numba's symbols, the runtime) local, so that two artifacts in one program do not bind
    each other's."""
    return "{\n  global:\n" + "".join(f"    {n};\n" for n in exported(prefix)) + \
        "  local: *;\n};\n"


def header(prefix: str = DEFAULT_PREFIX) -> str:
    """``model.h`` (with ``prefix``: ``PREFIX.h``, see :func:`renamed`)."""
    return renamed(HEADER, prefix)


#: ``runtime.c``: what the compiled object needs from outside, without Numba
RUNTIME = source("runtime.c")


#: the part of ``model.c`` that is the model's own, generated as ``model_spec.h``
SPEC = """/* model_spec.h: the model's sizes, names and build options (generated by pdjit.aot). */
#define NUM_IN %(n_in)d
#define NUM_OUT %(n_out)d
#define NUM_PARAMS %(n_params)d
#define PARAMS_BYTES %(params_bytes)dULL
#define PARAMS_HASH %(params_hash)dULL
#define META_LEN %(meta_len)d
#define FIXED_BATCH %(fixed_batch)d     /* --batch N: N; 0: any batch */
#define BUILD_THREADS %(threads)d
#define BATCH_SPLIT %(batch_split)d
#define EMBEDDED %(embedded)d
#define WARM_UP %(warm_up)d          /* 0: a model with a while loop, not run at creation */
/* the compiled entry, in Numba's internal calling convention */
extern int32_t %(symbol)s(int32_t *ret, void **excinfo%(proto)s);
/* its call inside model.c's call_entry (data, shapes, P, outp, outc, meta in scope) */
#define PDJIT_CALL_ENTRY(ret, excinfo) %(symbol)s(ret, excinfo%(call)s)
static const char *in_names[NUM_IN + 1] = {%(in_names)s};
static const int in_dtypes[NUM_IN + 1] = {%(in_dtypes)s};
static const int in_ndims[NUM_IN + 1] = {%(in_ndims)s};
static const int64_t in_shapes[NUM_IN + 1][8] = {%(in_shapes)s};
static const char *out_names[NUM_OUT + 1] = {%(out_names)s};
static const int out_dtypes[NUM_OUT + 1] = {%(out_dtypes)s};
static const int out_ndims[NUM_OUT + 1] = {%(out_ndims)s};
static const int64_t out_shapes[NUM_OUT + 1][8] = {%(out_shapes)s};
static const int64_t out_itemsize[NUM_OUT + 1] = {%(out_itemsize)s};
static const uint64_t param_offsets[NUM_PARAMS + 1] = {%(param_offsets)s};
static const char *dtype_names[] = {%(dtype_names)s};
static const char split_why_not[] = %(why_not)s;
/* inputs whose dim 0 is the batch (declared -1): a split run slices them */
static const int in_split[NUM_IN + 1] = {%(in_split)s};
/* elements in one row (dim 0) of each output, for a split run's slices */
static const int64_t out_row[NUM_OUT + 1] = {%(out_row)s};
"""


def build_files(spec) -> list:
    """The ``(file name, text)`` of the library's C: the shipped ``arena.h``, ``runtime.c``
    and ``model.c`` (the ABI's names for the build's prefix, :func:`renamed`) and the
    generated ``model_spec.h``. Headers are included, not compiled."""
    prefix = options(spec)["prefix"]
    return [("arena.h", source("arena.h")), ("model_spec.h", model_spec_h(spec)),
            ("runtime.c", RUNTIME), ("model.c", renamed(source("model.c"), prefix))]


def model_spec_h(spec) -> str:
    """``model_spec.h`` (which the shipped ``model.c`` includes) for a
    :class:`pdjit.aot.build.Spec`."""
    def strs(items):
        return ", ".join('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
                         for s in items) or "0"

    def ints(items):
        return ", ".join(str(int(v)) for v in items) or "0"

    def shapes(items):
        return ", ".join("{" + (", ".join(str(int(d)) for d in s) or "0") + "}"
                         for s in items) or "{0}"

    proto, call = [], []
    for i, (_, _, shape) in enumerate(spec.inputs):
        proto.append("void *")
        call.append(f"(void *)data[{i}]")
        for d in range(len(shape)):
            proto.append("int64_t")
            call.append(f"shapes[{i}][{d}]")
    for off in spec.param_offsets:
        proto.append("void *")
        call.append(f"(void *)(P + {off})")
    for i in range(len(spec.outputs)):
        proto += ["void *", "int64_t"]
        call += [f"outp[{i}]", f"outc[{i}]"]
    proto.append("int64_t *")
    call.append("meta")
    opts = options(spec)
    split = bool(opts["batch_split"])
    return renamed(SPEC % {
        "n_in": len(spec.inputs), "n_out": len(spec.outputs),
        "n_params": len(spec.param_offsets), "params_bytes": spec.params_bytes,
        "params_hash": spec.params_hash, "meta_len": max(1, sum(len(s) for _, _, s in
                                                                spec.outputs)),
        "symbol": spec.symbol, "proto": "".join(", " + p for p in proto),
        "call": "".join(", " + c for c in call),
        "in_names": strs(n for n, _, _ in spec.inputs),
        "in_dtypes": ints(DTYPES.index(d) for _, d, _ in spec.inputs),
        "in_ndims": ints(len(s) for _, _, s in spec.inputs),
        "in_shapes": shapes(s for _, _, s in spec.inputs),
        "out_names": strs(n for n, _, _ in spec.outputs),
        "out_dtypes": ints(DTYPES.index(d) for _, d, _ in spec.outputs),
        "out_ndims": ints(len(s) for _, _, s in spec.outputs),
        "out_shapes": shapes(s for _, _, s in spec.outputs),
        "out_itemsize": ints(_itemsize(d) for _, d, _ in spec.outputs),
        "param_offsets": ints(spec.param_offsets),
        "dtype_names": strs(DTYPES),
        "fixed_batch": opts["fixed_batch"], "threads": opts["threads"],
        "batch_split": int(split), "embedded": int(opts["embed_params"]),
        "warm_up": int(opts["warm_up"]),
        "why_not": _c_string(opts["batch_split_why_not"] or ""),
        "in_split": ints(int(bool(s) and s[0] == -1) for _, _, s in spec.inputs),
        "out_row": ints(_row(s) for _, _, s in spec.outputs),
    }, opts["prefix"])


def _c_string(text: str) -> str:
    """``text`` as a C string literal (printable ASCII as it is; anything else escaped)."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= o < 127:
            out.append(ch)
        else:
            for b in ch.encode():
                out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _row(shape) -> int:
    """Elements in one row (dim 0) of a value of ``shape``; 0 when a later dim is unknown."""
    n = 1
    for d in list(shape)[1:]:
        if int(d) < 0:
            return 0
        n *= int(d)
    return n


def options(spec) -> dict:
    """The build's options as the C source and the loader read them (``spec.options`` with
    defaults; written back into ``spec.options``): ``fixed_batch``
    (N, or 0 for any batch), ``threads``, ``batch_split``, ``batch_split_why_not``,
    ``embed_params``, ``prefix`` (of the C ABI's names, :func:`renamed`)."""
    o = spec.options
    batch = int(o.get("batch", 1) or 1)
    o["fixed_batch"] = batch if o.get("fixed_batch") else 0
    o["threads"] = max(1, int(o.get("threads", 1) or 1))
    o.setdefault("batch_split", False)
    o.setdefault("batch_split_why_not", "")
    o["embed_params"] = bool(o.get("embed_params", False))
    o["warm_up"] = bool(o.get("warm_up", True))
    o["threads_used"] = "batch" if o["batch_split"] else "blas"
    o["prefix"] = check_prefix(o.get("prefix") or DEFAULT_PREFIX)
    return o


def extra_sources(spec, blob: bytes, tmp: str) -> list:
    """More ``(file name, text)`` to compile into the library; ``tmp`` is the build's scratch
    directory. With ``embed_params``: ``params_blob.s``, an assembler file whose ``.incbin``
    puts ``blob`` (written to ``tmp/params.bin``) into the library's read-only data as
    ``pdjit_embedded_params`` (64-byte aligned; the assembler copies the bytes, so a large blob
    costs no compile time)."""
    if not options(spec)["embed_params"]:
        return []
    path = os.path.join(tmp, "params.bin")
    with open(path, "wb") as f:
        f.write(blob)
    quoted = path.replace("\\", "\\\\").replace('"', '\\"')
    return [("params_blob.s", PARAMS_ASM % {"path": quoted})]


PARAMS_ASM = """/* params_blob.s: the parameters inside the library (generated by pdjit.aot) */
    .section .rodata.pdjit_params,"a",@progbits
    .balign 64
    .globl pdjit_embedded_params
    .hidden pdjit_embedded_params
    .type pdjit_embedded_params, @object
pdjit_embedded_params:
    .incbin "%(path)s"
    .balign 64
    .size pdjit_embedded_params, . - pdjit_embedded_params
    .section .note.GNU-stack,"",@progbits
"""


def _itemsize(dtype: str) -> int:
    import numpy as np

    return np.dtype(dtype).itemsize


EXAMPLE = source("example.c")


def example_c(prefix: str = DEFAULT_PREFIX) -> str:
    """``example.c`` for the ABI's names of ``prefix``."""
    return renamed(EXAMPLE, prefix)
