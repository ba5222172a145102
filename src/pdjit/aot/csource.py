"""The C half of an AOT artifact: the header, the runtime the Numba object needs, the model API
and the example program, as text.

The object compiled by ``pdjit.aot.numba_aot`` refers to symbols that Numba's JIT resolves from
its own C helpers at run time. The library provides them here, hidden (only ``pdjit_*`` is
exported, so loading the library into a Python process that has Numba changes nothing there):

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
(``tests/aot/test_aot_review.py`` checks the message end to end).
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

HEADER = r"""/* model.h: the C ABI of a model compiled ahead of time by pdjit. */
#ifndef PDJIT_MODEL_H
#define PDJIT_MODEL_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* status codes: every call that can fail returns one; pdjit_model_error() says why; and the
   element types. The same in every artifact's header (defined once when a program includes
   the headers of several, built with pdjit compile --prefix) */
#ifndef PDJIT_ABI_CODES
#define PDJIT_ABI_CODES
enum { %(status)s };
enum { %(dtypes)s };
#endif

typedef struct pdjit_model pdjit_model;

/* what the model takes and gives: names, element types, ranks and shapes (-1: any size,
   the batch) */
int pdjit_num_inputs(void);
int pdjit_num_outputs(void);
const char *pdjit_input_name(int i);
int pdjit_input_dtype(int i);
int pdjit_input_ndim(int i);
const int64_t *pdjit_input_shape(int i);
const char *pdjit_output_name(int i);
int pdjit_output_dtype(int i);
int pdjit_output_ndim(int i);
const int64_t *pdjit_output_shape(int i);
const char *pdjit_dtype_name(int dtype);

/* How the library was built (pdjit compile's options):
   - pdjit_fixed_batch: N for --batch N (a run takes a batch of 1 to N; a bigger one is a
     PDJIT_ERR_SHAPE error, and the instance's memory is sized for N at creation and never
     grows); 0 for a library that takes any batch (--dynamic-batch, the default);
   - pdjit_build_threads: the threads an instance runs on when created (--threads);
   - pdjit_batch_split: 1 when a run may split its batch into slices run on threads of their
     own (every output row depends only on the same rows of the inputs), else 0 and
     pdjit_batch_split_why_not() names the op that prevents it;
   - pdjit_params_embedded: 1 when the parameters are inside the library (--embed-params). */
int pdjit_fixed_batch(void);
int pdjit_build_threads(void);
int pdjit_batch_split(void);
const char *pdjit_batch_split_why_not(void);
int pdjit_params_embedded(void);

/* Create an instance: parameters from params_path (NULL: the parameters embedded in the
   library, else model.params beside the library); max_batch: the batch its memory is sized for
   at creation, by a run on zeros (a bigger one re-sizes it; for a --batch N library at most N,
   and the memory is sized for N). A model with a while loop is not run at creation (its loop
   need not end on zeros): its memory is sized by its first runs. On failure *out is NULL and
   err (err_len bytes, may be NULL) holds the message. */
int pdjit_model_create(const char *params_path, int64_t max_batch, pdjit_model **out,
                       char *err, size_t err_len);
/* Run on n_inputs inputs, in the order of pdjit_input_name: data[i] C-contiguous, of element
   type dtypes[i], rank ndims[i], shape shapes[i]. A dim declared -1 takes any size >= 0: a
   batch of 0 rows gives outputs of 0 rows (of their dtypes and other dims, as the JIT gives
   them), and an input of 0 elements may have data[i] NULL. An instance runs in one thread at
   a time; instances are independent. */
int pdjit_model_run(pdjit_model *m, int n_inputs, const void *const *data, const int *dtypes,
                    const int *ndims, const int64_t *const *shapes);
/* As pdjit_model_run, writing the outputs straight into the caller's buffers: out[i] (out_bytes[i]
   bytes, aligned to the element size; out NULL: the instance's own buffers, as pdjit_model_run)
   for output i. When an output does not fit its buffer, the run is made again into the
   instance's buffers (all outputs). Either way pdjit_model_output gives each output's data (out[i]
   or the instance's buffer) and shape after the run; out_dims (NULL: not written) receives
   the outputs' dims, output after output (the sum of pdjit_output_ndim(i) values). */
int pdjit_model_run_into(pdjit_model *m, int n_inputs, const void *const *data,
                         const int *dtypes, const int *ndims, const int64_t *const *shapes,
                         int n_outputs, void *const *out, const int64_t *out_bytes,
                         int64_t *out_dims);
/* Output i of the last successful run (valid until the next run or destroy, or while the
   caller's buffer lives): its data and shape (rank pdjit_output_ndim(i)). */
int pdjit_model_output(const pdjit_model *m, int i, const void **data, const int64_t **shape);
/* The message of the last failed call on m (a run the native code refused: the exception's
   type and message, e.g. "IndexError: pdjit: an index is out of range (in _checked_rows)"). */
const char *pdjit_model_error(const pdjit_model *m);
/* Frees m (NULL: nothing). Like free(), m must not be used or destroyed again after. */
void pdjit_model_destroy(pdjit_model *m);
/* The instance's arenas (bytes, all its threads together) and how many arrays the last run
   had to put on the heap because an arena was too small (0 once the arenas fit the batch). */
int pdjit_model_memory(const pdjit_model *m, int64_t *arena_bytes, int64_t *heap_blocks);
/* The threads this instance's runs use (1 to 64; created with pdjit_build_threads()). When
   pdjit_batch_split() is 1, a run on a batch of B rows is split into min(n, B / 2) slices, each
   run on its own thread with its own arena (sized by one run at creation, or at the first run
   after this call); the outputs equal one thread's. The n - 1 threads besides the caller's are
   started here and wait between runs (pdjit_model_destroy, or n = 1, ends them). With n > 1
   OpenBLAS is then set to one thread for the whole process (a slice's GEMMs run on its own
   thread: OpenBLAS's threads on top of the slices' would oversubscribe the cores). Otherwise
   n goes to OpenBLAS, for the whole process (as pdjit_set_blas_threads). */
int pdjit_model_set_threads(pdjit_model *m, int n);
int pdjit_model_threads(const pdjit_model *m);
/* Threads of the BLAS (NumPy's OpenBLAS) for the whole process: in a process that imported
   NumPy it is NumPy's own BLAS, so this sets NumPy's too. Left at OpenBLAS's default
   (OPENBLAS_NUM_THREADS) unless called. */
int pdjit_set_blas_threads(int n);

#ifdef __cplusplus
}
#endif
#endif
"""


#: the arena, as runtime.c and model.c both see it
ARENA = """#define PDJIT_FREE_SLOTS 256
typedef struct {
    char *base;
    size_t cap, used, need, heap_blocks;
    int nfree;
    char *free_at[PDJIT_FREE_SLOTS];
    size_t free_size[PDJIT_FREE_SLOTS];
} pdjit_arena;"""


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
    return renamed(HEADER % {
        "status": ", ".join(f"{k} = {v}" for k, v in STATUS.items()),
        "dtypes": ", ".join(f"PDJIT_{d.upper()} = {i}" for i, d in enumerate(DTYPES))}, prefix)


RUNTIME_TEXT = r"""/* runtime.c: what the compiled object needs from outside, without Numba. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HIDDEN __attribute__((visibility("hidden")))

/* ---- NRT subset: MemInfo as NRT lays it out; blocks in the running instance's arena ---- */
typedef void (*nrt_dtor)(void *data, size_t size, void *info);
typedef struct {
    size_t refct;
    nrt_dtor dtor;
    void *dtor_info;
    void *data;
    size_t size;
    void *heap;   /* NRT: external allocator; here non-NULL when the block is on the heap */
    size_t block; /* bytes of the arena block (header + data), to reuse it when freed */
} MemInfo;

PDJIT_ARENA

HIDDEN __thread pdjit_arena *pdjit_current_arena;

static size_t align_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

/* An arena block: 64-byte aligned, reused best-fit from the blocks this run freed (a freed
   array's bytes serve a later one), else cut from the free end; from the heap when the arena
   is full, and then reused the same way until the run ends. ``need`` counts the bytes cut
   (wherever they came from): the arena the next run gets, which then fits it exactly. */
static MemInfo *meminfo_new(size_t size, size_t align) {
    if (align < 16) align = 16;
    pdjit_arena *a = pdjit_current_arena;
    MemInfo *mi = NULL;
    void *heap = NULL;
    size_t head = align_up(sizeof(MemInfo), align), block = 0;
    if (a != NULL && align <= 64) {
        head = align_up(sizeof(MemInfo), 64);
        block = align_up(head + size, 64);
        /* a block of 4 KiB or more gets 256 bytes more: arrays whose sizes are multiples of
           4 KiB would otherwise start 64 bytes apart modulo 4 KiB, one after the other (the
           same L1 sets; MobileNet-like at batch 64 ran 1.5-2% slower) */
        if (block >= 4096) block += 256;
        int best = -1;
        for (int k = 0; k < a->nfree; k++)
            if (a->free_size[k] >= block && (best < 0 || a->free_size[k] < a->free_size[best]))
                best = k;
        if (best >= 0) {
            mi = (MemInfo *)a->free_at[best];
            heap = mi->heap;
            block = a->free_size[best];
            a->nfree--;
            a->free_at[best] = a->free_at[a->nfree];
            a->free_size[best] = a->free_size[a->nfree];
        } else {
            a->need += block;
            if (a->base != NULL && a->used + block <= a->cap) {
                mi = (MemInfo *)(a->base + a->used);
                a->used += block;
            }
        }
    }
    if (mi == NULL) {
        size_t bytes = block ? block : head + size;
        if (posix_memalign((void **)&mi, align > 64 ? align : 64, bytes) != 0) return NULL;
        heap = (void *)1;
        if (a != NULL) a->heap_blocks++;
    }
    mi->refct = 1;
    mi->dtor = NULL;
    mi->dtor_info = NULL;
    mi->data = (char *)mi + head;
    mi->size = size;
    mi->heap = heap;
    mi->block = block;
    return mi;
}

/* after a run: the heap blocks kept for reuse go back to the heap */
HIDDEN void pdjit_arena_release(pdjit_arena *a) {
    for (int k = 0; k < a->nfree; k++)
        if (((MemInfo *)a->free_at[k])->heap != NULL) free(a->free_at[k]);
    a->nfree = 0;
}

HIDDEN void *NRT_MemInfo_alloc(size_t size) { return meminfo_new(size, 16); }
HIDDEN void *NRT_MemInfo_alloc_aligned(size_t size, unsigned align) {
    return meminfo_new(size, align);
}
HIDDEN void *NRT_MemInfo_alloc_safe(size_t size) { return meminfo_new(size, 16); }
HIDDEN void *NRT_MemInfo_alloc_safe_aligned(size_t size, unsigned align) {
    return meminfo_new(size, align);
}
HIDDEN void NRT_MemInfo_call_dtor(MemInfo *mi) {
    if (mi->dtor != NULL) mi->dtor(mi->data, mi->size, mi->dtor_info);
    pdjit_arena *a = pdjit_current_arena;
    if (a != NULL && mi->block != 0 && a->nfree < PDJIT_FREE_SLOTS) {  /* reused this run */
        a->free_at[a->nfree] = (char *)mi;
        a->free_size[a->nfree] = mi->block;
        a->nfree++;
    } else if (mi->heap != NULL) {
        free(mi);
    }
}
HIDDEN void *NRT_Allocate(size_t size) { return malloc(size ? size : 1); }
HIDDEN void NRT_Free(void *p) { free(p); }

/* variable-size blocks (typed lists): the data lives on the heap, the element destructor is
   kept as the MemInfo's destructor data */
static void varsize_dtor(void *data, size_t size, void *info) {
    (void)size;
    if (info != NULL) ((void (*)(void *))info)(data);
    free(data);
}
HIDDEN void *NRT_MemInfo_new_varsize(size_t size) {
    MemInfo *mi = meminfo_new(0, 16);
    if (mi == NULL) return NULL;
    mi->data = malloc(size ? size : 1);
    if (mi->data == NULL) return NULL;
    mi->size = size;
    mi->dtor = varsize_dtor;
    return mi;
}
HIDDEN void *NRT_MemInfo_new_varsize_dtor(size_t size, nrt_dtor dtor) {
    MemInfo *mi = NRT_MemInfo_new_varsize(size);
    if (mi != NULL) mi->dtor_info = (void *)dtor;
    return mi;
}
HIDDEN void *NRT_MemInfo_varsize_alloc(MemInfo *mi, size_t size) {
    if (mi->dtor != varsize_dtor) abort();  /* never: only varsize MemInfos come here */
    mi->data = malloc(size ? size : 1);
    if (mi->data != NULL) mi->size = size;
    return mi->data;
}
HIDDEN void *NRT_MemInfo_varsize_realloc(MemInfo *mi, size_t size) {
    if (mi->dtor != varsize_dtor) abort();
    void *p = realloc(mi->data, size ? size : 1);
    if (p == NULL) return NULL;
    mi->data = p;
    mi->size = size;
    return p;
}
HIDDEN void NRT_MemInfo_varsize_free(MemInfo *mi, void *p) {
    free(p);
    if (p == mi->data) mi->data = NULL;
}

/* ---- BLAS: NumPy's OpenBLAS, Fortran interface with 64-bit integers ---- */
typedef int64_t blasint;
extern void scipy_sgemm_64_(const char *, const char *, const blasint *, const blasint *,
                            const blasint *, const float *, const float *, const blasint *,
                            const float *, const blasint *, const float *, float *,
                            const blasint *);
extern void scipy_dgemm_64_(const char *, const char *, const blasint *, const blasint *,
                            const blasint *, const double *, const double *, const blasint *,
                            const double *, const blasint *, const double *, double *,
                            const blasint *);
extern void scipy_sgemv_64_(const char *, const blasint *, const blasint *, const float *,
                            const float *, const blasint *, const float *, const blasint *,
                            const float *, float *, const blasint *);
extern void scipy_dgemv_64_(const char *, const blasint *, const blasint *, const double *,
                            const double *, const blasint *, const double *, const blasint *,
                            const double *, double *, const blasint *);
extern float scipy_sdot_64_(const blasint *, const float *, const blasint *, const float *,
                            const blasint *);
extern double scipy_ddot_64_(const blasint *, const double *, const blasint *, const double *,
                             const blasint *);
extern void scipy_openblas_set_num_threads64_(int);

HIDDEN void pdjit_blas_threads(int n) { scipy_openblas_set_num_threads64_(n); }

HIDDEN int numba_xxgemm(char kind, char transa, char transb, int64_t m, int64_t n, int64_t k,
                        void *alpha, void *a, int64_t lda, void *b, int64_t ldb, void *beta,
                        void *c, int64_t ldc) {
    blasint M = m, N = n, K = k, LDA = lda, LDB = ldb, LDC = ldc;
    if (kind == 's')
        scipy_sgemm_64_(&transa, &transb, &M, &N, &K, alpha, a, &LDA, b, &LDB, beta, c, &LDC);
    else if (kind == 'd')
        scipy_dgemm_64_(&transa, &transb, &M, &N, &K, alpha, a, &LDA, b, &LDB, beta, c, &LDC);
    else
        return -1;
    return 0;
}

HIDDEN int numba_xxgemv(char kind, char trans, int64_t m, int64_t n, void *alpha, void *a,
                        int64_t lda, void *x, void *beta, void *y) {
    blasint M = m, N = n, LDA = lda, one = 1;
    if (kind == 's')
        scipy_sgemv_64_(&trans, &M, &N, alpha, a, &LDA, x, &one, beta, y, &one);
    else if (kind == 'd')
        scipy_dgemv_64_(&trans, &M, &N, alpha, a, &LDA, x, &one, beta, y, &one);
    else
        return -1;
    return 0;
}

HIDDEN int numba_xxdot(char kind, char conjugate, int64_t n, void *dx, void *dy, void *result) {
    blasint N = n, one = 1;
    (void)conjugate;
    if (kind == 's')
        *(float *)result = scipy_sdot_64_(&N, dx, &one, dy, &one);
    else if (kind == 'd')
        *(double *)result = scipy_ddot_64_(&N, dx, &one, dy, &one);
    else
        return -1;
    return 0;
}

/* ---- reshape without a copy: the new strides, or 0 when the layout needs a copy ---- */
HIDDEN int numba_attempt_nocopy_reshape(int64_t nd, const int64_t *dims, const int64_t *strides,
                                        int64_t newnd, const int64_t *newdims,
                                        int64_t *newstrides, int64_t itemsize, int is_f_order) {
    int64_t od[64], os[64], n = 0, i;
    if (nd > 64) return 0;
    for (i = 0; i < nd; i++) {
        if (dims[i] == 0) {  /* an empty array: any strides do */
            for (int64_t k = 0; k < newnd; k++) newstrides[k] = itemsize;
            return 1;
        }
        if (dims[i] != 1) { od[n] = dims[i]; os[n] = strides[i]; n++; }
    }
    int64_t oi = 0, oj = 1, ni = 0, nj = 1;
    while (ni < newnd && oi < n) {
        int64_t np_ = newdims[ni], op = od[oi];
        while (np_ != op) {
            if (np_ < op) {
                if (nj >= newnd) return 0;
                np_ *= newdims[nj++];
            } else {
                if (oj >= n) return 0;
                op *= od[oj++];
            }
        }
        for (int64_t k = oi; k < oj - 1; k++) {  /* the old axes of a group must be one run */
            if (is_f_order ? os[k + 1] != od[k] * os[k] : os[k] != od[k + 1] * os[k + 1])
                return 0;
        }
        if (is_f_order) {
            newstrides[ni] = os[oi];
            for (int64_t k = ni + 1; k < nj; k++)
                newstrides[k] = newstrides[k - 1] * newdims[k - 1];
        } else {
            newstrides[nj - 1] = os[oj - 1];
            for (int64_t k = nj - 1; k > ni; k--) newstrides[k - 1] = newstrides[k] * newdims[k];
        }
        ni = nj++;
        oi = oj++;
    }
    int64_t last = itemsize;
    if (ni >= 1) last = is_f_order ? newstrides[ni - 1] * newdims[ni - 1] : newstrides[ni - 1];
    for (int64_t k = ni; k < newnd; k++) newstrides[k] = last;
    return 1;
}

/* ---- CPython entry points of Numba's exception unwrapping: never called outside CPython ---- */
HIDDEN void *PyExc_RuntimeError = NULL;
HIDDEN void PyErr_SetString(void *type, const char *msg) { (void)type; (void)msg; }
HIDDEN int64_t PyObject_Hash(void *o) { (void)o; return -1; }
HIDDEN void *PyTuple_Pack(int64_t n, ...) { (void)n; return NULL; }
HIDDEN void *PyUnicode_FromKindAndData(int kind, const void *data, int64_t size) {
    (void)kind; (void)data; (void)size; return NULL;
}
HIDDEN void Py_FatalError(const char *msg) { (void)msg; abort(); }
HIDDEN int numba_gil_ensure(void) { return 0; }
HIDDEN void numba_gil_release(int *s) { (void)s; }
"""


RUNTIME = RUNTIME_TEXT.replace("PDJIT_ARENA", ARENA)


MODEL = r"""/* model.c: the model API over the compiled entry (generated by pdjit.aot). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define API __attribute__((visibility("default")))
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
#define MAX_THREADS 64

PDJIT_ARENA
extern __thread pdjit_arena *pdjit_current_arena;
extern void pdjit_arena_release(pdjit_arena *a);
extern void pdjit_blas_threads(int n);
/* the compiled entry, in Numba's internal calling convention */
extern int32_t %(symbol)s(int32_t *ret, void **excinfo%(proto)s);
#if EMBEDDED
extern const char pdjit_embedded_params[];   /* params_blob.s: the blob, 64-byte aligned */
#endif

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
static const int64_t dtype_sizes[] = {4, 8, 4, 8, 1, 1, 1, 2, 2};
static const char split_why_not[] = %(why_not)s;
/* inputs whose dim 0 is the batch (declared -1): a split run slices them */
static const int in_split[NUM_IN + 1] = {%(in_split)s};
/* elements in one row (dim 0) of each output, for a split run's slices */
static const int64_t out_row[NUM_OUT + 1] = {%(out_row)s};

/* one slice of a split run: its inputs, its part of the outputs, its arena */
typedef struct {
    pdjit_model *m;
    pdjit_arena *arena;
    const void *data[NUM_IN + 1];
    int64_t shape[NUM_IN + 1][8];
    const int64_t *sp[NUM_IN + 1];
    void *outp[NUM_OUT + 1];
    int64_t outc[NUM_OUT + 1];
    int64_t meta[META_LEN + 1];
    int64_t rows;
    int32_t status, ret;
} pdjit_slice;

/* the threads of a split run, started once (pdjit_model_set_threads) and parked between runs:
   a run bumps gen, worker k runs slice k when k < active, the last to finish signals done */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;
    int active, pending, stop, up;
    unsigned forks;                 /* fork_count when started: another value, a forked child */
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS];
} pdjit_pool;

struct pdjit_model {
    char *params;
    int params_owned;
    void *out[NUM_OUT + 1];         /* the instance's output buffers */
    int64_t out_cap[NUM_OUT + 1];   /* elements */
    void *at[NUM_OUT + 1];          /* where the last run's outputs are (out[i] or the caller's) */
    int64_t at_cap[NUM_OUT + 1];    /* elements there */
    int64_t meta[META_LEN + 1];
    int64_t out_shape[NUM_OUT + 1][8];
    pdjit_arena arena;              /* one-thread runs and a split run's first slice */
    int ran;
    int sizing;                     /* creation's warm-up: arenas may grow (--batch N too) */
    int sized;                      /* the warm-up sized the arenas */
    int threads;
    int64_t max_batch;
    pdjit_slice *slices;            /* threads of them when split; [k].arena for k >= 1 */
    pdjit_arena *worker_arenas;     /* threads - 1 */
    int nslices;
    pdjit_pool pool;                /* nslices - 1 workers */
    char error[512];
};

API int pdjit_num_inputs(void) { return NUM_IN; }
API int pdjit_num_outputs(void) { return NUM_OUT; }
API const char *pdjit_input_name(int i) { return i >= 0 && i < NUM_IN ? in_names[i] : NULL; }
API int pdjit_input_dtype(int i) { return i >= 0 && i < NUM_IN ? in_dtypes[i] : -1; }
API int pdjit_input_ndim(int i) { return i >= 0 && i < NUM_IN ? in_ndims[i] : -1; }
API const int64_t *pdjit_input_shape(int i) { return i >= 0 && i < NUM_IN ? in_shapes[i] : NULL; }
API const char *pdjit_output_name(int i) { return i >= 0 && i < NUM_OUT ? out_names[i] : NULL; }
API int pdjit_output_dtype(int i) { return i >= 0 && i < NUM_OUT ? out_dtypes[i] : -1; }
API int pdjit_output_ndim(int i) { return i >= 0 && i < NUM_OUT ? out_ndims[i] : -1; }
API const int64_t *pdjit_output_shape(int i) {
    return i >= 0 && i < NUM_OUT ? out_shapes[i] : NULL;
}
API const char *pdjit_dtype_name(int d) {
    return d >= 0 && d < (int)(sizeof(dtype_names) / sizeof(*dtype_names)) ? dtype_names[d]
                                                                          : "unknown";
}

static int fail(pdjit_model *m, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->error, sizeof m->error, fmt, ap);
    va_end(ap);
    return code;
}

static uint64_t checksum(const char *blob, uint64_t n) {
    uint64_t h = 0, w;
    for (uint64_t i = 0; i < n / 8; i++) {
        memcpy(&w, blob + 8 * i, 8);
        h ^= w * 0x9E3779B97F4A7C15ULL + i * 0xBF58476D1CE4E5B9ULL;
    }
    return h;
}

static int read_params(pdjit_model *m, const char *path) {
    char here[4096];
#if EMBEDDED
    if (path == NULL) {  /* the parameters inside the library: used in place */
        m->params = (char *)pdjit_embedded_params;
        m->params_owned = 0;
        if (checksum(m->params, PARAMS_BYTES) != PARAMS_HASH)
            return fail(m, PDJIT_ERR_PARAMS, "the parameters embedded in the library are "
                        "damaged (checksum differs)");
        return PDJIT_OK;
    }
#endif
    if (path == NULL) {  /* model.params beside this library */
        Dl_info info;
        if (!dladdr((void *)&pdjit_model_create, &info) || info.dli_fname == NULL)
            return fail(m, PDJIT_ERR_PARAMS, "cannot find the library's own path");
        snprintf(here, sizeof here, "%%s", info.dli_fname);
        char *slash = strrchr(here, '/');
        if (slash) slash[1] = 0; else here[0] = 0;
        strncat(here, "model.params", sizeof here - strlen(here) - 1);
        path = here;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) return fail(m, PDJIT_ERR_PARAMS, "%%s: cannot open the parameters file", path);
    unsigned char head[40];
    uint64_t fields[4];
    if (fread(head, 1, 40, f) != 40 || memcmp(head, "PDJITPRM", 8) != 0) {
        fclose(f);
        return fail(m, PDJIT_ERR_PARAMS, "%%s: not a pdjit parameters file (bad header)", path);
    }
    memcpy(fields, head + 8, 32);
    if (fields[0] != 1 || fields[1] != NUM_PARAMS || fields[2] != PARAMS_BYTES) {
        fclose(f);
        return fail(m, PDJIT_ERR_PARAMS, "%%s: expected version 1, %%d parameters, %%llu bytes; "
                    "got version %%llu, %%llu parameters, %%llu bytes", path, NUM_PARAMS,
                    (unsigned long long)PARAMS_BYTES, (unsigned long long)fields[0],
                    (unsigned long long)fields[1], (unsigned long long)fields[2]);
    }
    m->params_owned = 1;
    if (posix_memalign((void **)&m->params, 64, PARAMS_BYTES ? PARAMS_BYTES : 64) != 0) {
        fclose(f);
        m->params = NULL;
        return fail(m, PDJIT_ERR_MEMORY, "out of memory for %%llu bytes of parameters",
                    (unsigned long long)PARAMS_BYTES);
    }
    size_t got = fread(m->params, 1, PARAMS_BYTES, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != PARAMS_BYTES || extra)
        return fail(m, PDJIT_ERR_PARAMS, "%%s: expected %%llu bytes of parameters, got %%s", path,
                    (unsigned long long)PARAMS_BYTES, extra ? "more" : "fewer");
    if (checksum(m->params, PARAMS_BYTES) != PARAMS_HASH ||
            fields[3] != PARAMS_HASH)
        return fail(m, PDJIT_ERR_PARAMS, "%%s: the parameters are not this model's "
                    "(checksum differs)", path);
    return PDJIT_OK;
}

/* output i's elements for the shapes of this run's inputs (-1 dims: the largest leading dim) */
static int64_t out_elems(int i, int64_t batch) {
    int64_t n = 1;
    for (int d = 0; d < out_ndims[i]; d++) n *= out_shapes[i][d] < 0 ? batch : out_shapes[i][d];
    return n;
}

static int grow_output(pdjit_model *m, int i, int64_t elems) {
    if (elems <= m->out_cap[i] && m->out[i] != NULL) return PDJIT_OK;
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)(elems ? elems : 1) * out_itemsize[i]) != 0)
        return fail(m, PDJIT_ERR_MEMORY, "out of memory for output '%%s' (%%lld elements)",
                    out_names[i], (long long)elems);
    free(m->out[i]);
    m->out[i] = p;
    m->out_cap[i] = elems;
    return PDJIT_OK;
}

static int32_t call_entry(pdjit_model *m, const void *const *data, const int64_t *const *shapes,
                          void *const *outp, const int64_t *outc, int64_t *meta, int32_t *ret,
                          void **excinfo) {
    char *P = m->params;
    *excinfo = NULL;
    (void)P; (void)data; (void)shapes; (void)outp; (void)outc;
    return %(symbol)s(ret, excinfo%(call)s);
}

/* The message of the exception the native code raised: Numba's excinfo is a struct whose first
   members are the pickled (class, args, location) and its length; the pickle's strings are
   read without unpickling (module, class, then the arguments' strings up to the tuple holding
   them, then the function's name). Writes "" when the layout is not the expected one. */
static void exc_message(const void *excinfo, int32_t status, char *out, size_t n) {
    struct { const unsigned char *data; int32_t len; } info;
    out[0] = 0;
    if (excinfo == NULL || status < 1) return;
    memcpy(&info, excinfo, sizeof info);
    if (info.data == NULL || info.len < 2 || info.len > (1 << 20) || info.data[0] != 0x80)
        return;
    const unsigned char *p = info.data, *end = info.data + info.len;
    const char *strs[8];
    int lens[8], ns = 0, args_end = -1;
    p += 2;   /* PROTO n */
    while (p < end && ns < 8) {
        unsigned char op = *p++;
        uint64_t len = 0;
        size_t skip = 0;
        switch (op) {
            case 0x8c: if (p >= end) return; len = *p++; break;           /* SHORT_BINUNICODE */
            case 0x58: if (end - p < 4) return; memcpy(&len, p, 4); p += 4; break;
            case 0x8d: if (end - p < 8) return; memcpy(&len, p, 8); p += 8; break;
            case 0x95: skip = 8; break;                                   /* FRAME */
            case 0x94: case 0x93: case 0x4e: case 0x28: case 0x88: case 0x89: break;
            case 0x85: case 0x86: case 0x87: case 0x74: case 0x29:       /* a tuple ends */
                if (args_end < 0 && ns >= 2) args_end = ns;
                break;
            case 0x4b: case 0x68: skip = 1; break;                        /* BININT1, BINGET */
            case 0x4d: skip = 2; break;
            case 0x4a: case 0x6a: skip = 4; break;
            case 0x47: skip = 8; break;
            case 0x2e: p = end; break;                                    /* STOP */
            default: p = end; break;                                      /* unknown: done */
        }
        if (op == 0x8c || op == 0x58 || op == 0x8d) {
            if (len > (uint64_t)(end - p)) return;
            strs[ns] = (const char *)p;
            lens[ns++] = (int)len;
            p += len;
        } else if (skip) {
            if ((size_t)(end - p) < skip) return;
            p += skip;
        }
    }
    if (ns < 2) return;
    if (args_end < 0) args_end = ns;
    size_t k = (size_t)snprintf(out, n, "%%.*s", lens[1], strs[1]);
    for (int i = 2; i < args_end && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%%s%%.*s", i == 2 ? ": " : ", ", lens[i], strs[i]);
    if (args_end < ns && k < n)
        k += (size_t)snprintf(out + k, n - k, " (in %%.*s)", lens[args_end], strs[args_end]);
}

static void arena_reset(pdjit_arena *a) {
    a->used = 0;
    a->need = 0;
    a->heap_blocks = 0;
    a->nfree = 0;
}

/* after a run that needed more than the arena: the same run again fits it exactly (a --batch N
   library only while creation sizes it) */
static void arena_fit(pdjit_model *m, pdjit_arena *a) {
    if (a->need <= a->cap || (FIXED_BATCH && m->sized && !m->sizing)) return;
    void *p = NULL;
    if (posix_memalign(&p, 64, a->need) == 0) {
        free(a->base);
        a->base = p;
        a->cap = a->need;
    }
}

/* the outputs go to the instance's buffers */
static void at_own(pdjit_model *m) {
    for (int i = 0; i < NUM_OUT; i++) {
        m->at[i] = m->out[i];
        m->at_cap[i] = m->out_cap[i];
    }
}

/* the outputs go to the caller's buffers (user: NULL when the caller gave none); 0 when one of
   them holds fewer than need[i] elements (need NULL: any size) */
static int at_user(pdjit_model *m, void *const *user, const int64_t *bytes, const int64_t *need) {
    if (user == NULL) return 0;
    for (int i = 0; i < NUM_OUT; i++) {
        int64_t cap = bytes[i] > 0 ? bytes[i] / out_itemsize[i] : 0;
        if (user[i] == NULL || (need != NULL && cap < need[i])) return 0;
        m->at[i] = user[i];
        m->at_cap[i] = cap;
    }
    return 1;
}

static int run_checked(pdjit_model *m, const void *const *data, const int64_t *const *shapes,
                       int64_t batch, void *const *user, const int64_t *user_bytes) {
    if (!at_user(m, user, user_bytes, NULL)) {
        for (int i = 0; i < NUM_OUT; i++) {
            int rc = grow_output(m, i, out_elems(i, batch));
            if (rc) return rc;
        }
        at_own(m);
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t ret = 0;
        arena_reset(&m->arena);
        for (int k = 1; k < m->nslices; k++) m->worker_arenas[k - 1].heap_blocks = 0;
        pdjit_current_arena = &m->arena;
        void *excinfo = NULL;
        int32_t status = call_entry(m, data, shapes, m->at, m->at_cap, m->meta, &ret,
                                    &excinfo);
        pdjit_current_arena = NULL;
        pdjit_arena_release(&m->arena);
        arena_fit(m, &m->arena);
        if (status != 0) {
            char why[384];
            exc_message(excinfo, status, why, sizeof why);
            if (why[0])
                return fail(m, PDJIT_ERR_NATIVE, "the model's native code failed: %%s", why);
            return fail(m, PDJIT_ERR_NATIVE, "the model's native code failed (status %%d): an "
                        "input the model cannot take (run it with pdjit for the op's message)",
                        (int)status);
        }
        if (ret == 0) {
            int k = 0;
            for (int i = 0; i < NUM_OUT; i++)
                for (int d = 0; d < out_ndims[i]; d++) m->out_shape[i][d] = m->meta[k++];
            m->ran = 1;
            return PDJIT_OK;
        }
        /* an output larger than its buffer: the shapes are in meta; grow and run again */
        int k = 0;
        for (int i = 0; i < NUM_OUT; i++) {
            int64_t n = 1;
            for (int d = 0; d < out_ndims[i]; d++) n *= m->meta[k++];
            int rc = grow_output(m, i, n);
            if (rc) return rc;
        }
        at_own(m);   /* the caller's buffers too: the next attempt uses the instance's */
    }
    return fail(m, PDJIT_ERR_NATIVE, "the outputs did not fit their buffers twice");
}

/* bumped in the child of a fork(): the pool's threads did not come along, start them again */
static unsigned fork_count;
static void on_fork_child(void) { fork_count++; }
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(NULL, NULL, on_fork_child); }

static void pool_start(pdjit_model *m);

static void *run_slice(void *arg) {
    pdjit_slice *j = arg;
    arena_reset(j->arena);
    pdjit_current_arena = j->arena;
    j->ret = 0;
    void *excinfo = NULL;
    j->status = call_entry(j->m, j->data, j->sp, j->outp, j->outc, j->meta, &j->ret,
                           &excinfo);
    pdjit_current_arena = NULL;
    pdjit_arena_release(j->arena);
    return NULL;
}

/* A run split into m->nslices slices of the batch, slice k on thread k (the caller runs slice
   0), each on its own arena, writing its rows of the outputs in place. 0 when done; 1 when the
   run cannot be split this time (the inputs disagree on the batch, fewer than 2 rows a thread)
   or a slice failed: then the caller runs the whole batch on one thread, which gives the same
   outputs or the error. */
static int run_split(pdjit_model *m, const void *const *data, const int64_t *const *shapes,
                     void *const *user, const int64_t *user_bytes) {
    int64_t batch = -1;
    for (int i = 0; i < NUM_IN; i++) {
        if (in_ndims[i] > 8) return 1;
        if (!in_split[i]) continue;
        if (batch >= 0 && shapes[i][0] != batch) return 1;
        batch = shapes[i][0];
    }
    int n = m->nslices;
    if (batch < 0 || n < 2) return 1;
    if (n > batch / 2) n = (int)(batch / 2);
    if (n < 2) return 1;
    int64_t need[NUM_OUT + 1];
    for (int i = 0; i < NUM_OUT; i++) need[i] = batch * out_row[i];
    if (!at_user(m, user, user_bytes, need)) {
        for (int i = 0; i < NUM_OUT; i++)
            if (grow_output(m, i, need[i]) != PDJIT_OK) return 1;
        at_own(m);
    }
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
        pdjit_slice *j = &m->slices[k];
        j->m = m;
        j->arena = k == 0 ? &m->arena : &m->worker_arenas[k - 1];
        j->rows = batch / n + (k < batch %% n);
        for (int i = 0; i < NUM_IN; i++) {
            int64_t row = dtype_sizes[in_dtypes[i]];
            for (int d = 0; d < in_ndims[i]; d++) {
                j->shape[i][d] = shapes[i][d];
                if (d > 0) row *= shapes[i][d];
            }
            if (in_split[i]) j->shape[i][0] = j->rows;
            j->sp[i] = j->shape[i];
            j->data[i] = in_split[i] ? (const char *)data[i] + start * row : data[i];
        }
        for (int i = 0; i < NUM_OUT; i++) {
            j->outp[i] = (char *)m->at[i] + start * out_row[i] * out_itemsize[i];
            j->outc[i] = j->rows * out_row[i];
        }
        start += j->rows;
    }
    pdjit_pool *pool = &m->pool;
    if (pool->up && pool->forks != fork_count) pool_start(m);   /* a forked child: anew */
    int waiting = 0;
    for (int k = 1; k < n; k++) waiting += pool->started[k];
    if (waiting) {
        pthread_mutex_lock(&pool->mu);
        pool->active = n;
        pool->pending = waiting;
        pool->gen++;
        pthread_cond_broadcast(&pool->go);
        pthread_mutex_unlock(&pool->mu);
    }
    run_slice(&m->slices[0]);
    for (int k = 1; k < n; k++)
        if (!pool->started[k]) run_slice(&m->slices[k]);   /* no thread to be had: here */
    if (waiting) {
        pthread_mutex_lock(&pool->mu);
        while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->mu);
        pthread_mutex_unlock(&pool->mu);
    }
    int ok = 1;
    for (int k = 0; k < n; k++) {
        pdjit_slice *j = &m->slices[k];
        arena_fit(m, j->arena);
        if (j->status != 0 || j->ret != 0) ok = 0;
        int q = 0;
        for (int i = 0; i < NUM_OUT && ok; i++) {   /* each slice gave its rows, as declared */
            for (int d = 0; d < out_ndims[i]; d++, q++)
                if (j->meta[q] != (d == 0 ? j->rows : out_shapes[i][d])) ok = 0;
        }
    }
    if (!ok) return 1;
    for (int i = 0; i < NUM_OUT; i++) {
        for (int d = 0; d < out_ndims[i]; d++) m->out_shape[i][d] = out_shapes[i][d];
        m->out_shape[i][0] = batch;
    }
    m->ran = 1;
    return 0;
}

static const int64_t empty_input[8];   /* what a 0-element input given as NULL points to */

static int run_into(pdjit_model *m, int n_inputs, const void *const *data, const int *dtypes,
                    const int *ndims, const int64_t *const *shapes, void *const *user,
                    const int64_t *user_bytes) {
    if (n_inputs != NUM_IN)
        return fail(m, PDJIT_ERR_COUNT, "expected %%d input(s), got %%d", NUM_IN, n_inputs);
    if (NUM_IN > 0 && (data == NULL || dtypes == NULL || ndims == NULL || shapes == NULL))
        return fail(m, PDJIT_ERR_ARGS, "data, dtypes, ndims and shapes must not be NULL");
    /* the batch: the largest dim declared -1 (0 is a batch of no rows: the native code runs
       on empty inputs as the JIT does and gives empty outputs); 1 when none is declared -1 */
    int64_t batch = -1;
    const void *given[NUM_IN + 1];   /* data, with a 0-element input's NULL made a pointer */
    int nulls = 0;
    for (int i = 0; i < NUM_IN; i++) {
        if (dtypes[i] != in_dtypes[i])
            return fail(m, PDJIT_ERR_DTYPE, "input '%%s': expected dtype %%s, got %%s",
                        in_names[i], pdjit_dtype_name(in_dtypes[i]),
                        pdjit_dtype_name(dtypes[i]));
        if (ndims[i] != in_ndims[i])
            return fail(m, PDJIT_ERR_SHAPE, "input '%%s': expected rank %%d, got %%d",
                        in_names[i], in_ndims[i], ndims[i]);
        if (in_ndims[i] > 0 && shapes[i] == NULL)
            return fail(m, PDJIT_ERR_ARGS, "input '%%s': data or shape is NULL", in_names[i]);
        int64_t elems = 1;
        for (int d = 0; d < in_ndims[i]; d++) {
            int64_t want = in_shapes[i][d], got = shapes[i][d];
            if (want >= 0 && got != want)
                return fail(m, PDJIT_ERR_SHAPE, "input '%%s': dim %%d expected %%lld, got %%lld",
                            in_names[i], d, (long long)want, (long long)got);
            if (want < 0 && got < 0)
                return fail(m, PDJIT_ERR_SHAPE, "input '%%s': dim %%d expected >= 0, got %%lld",
                            in_names[i], d, (long long)got);
            if (want < 0 && got > batch) batch = got;
            if (FIXED_BATCH && d == 0 && want < 0 && got > FIXED_BATCH)
                return fail(m, PDJIT_ERR_SHAPE, "input '%%s': dim 0 (the batch) expected at "
                            "most %%d (the library was built with --batch %%d), got %%lld",
                            in_names[i], FIXED_BATCH, FIXED_BATCH, (long long)got);
            elems *= got;
        }
        given[i] = data[i];
        if (data[i] == NULL) {
            if (elems != 0)
                return fail(m, PDJIT_ERR_ARGS, "input '%%s': data or shape is NULL",
                            in_names[i]);
            given[i] = &empty_input;   /* no elements: any valid address */
            nulls = 1;
        }
    }
    if (batch < 0) batch = 1;
    if (nulls) data = given;
    if (BATCH_SPLIT && m->nslices > 1 && run_split(m, data, shapes, user, user_bytes) == 0)
        return PDJIT_OK;
    return run_checked(m, data, shapes, batch, user, user_bytes);
}

API int pdjit_model_run(pdjit_model *m, int n_inputs, const void *const *data,
                        const int *dtypes, const int *ndims, const int64_t *const *shapes) {
    if (m == NULL) return PDJIT_ERR_ARGS;
    m->ran = 0;
    return run_into(m, n_inputs, data, dtypes, ndims, shapes, NULL, NULL);
}

API int pdjit_model_run_into(pdjit_model *m, int n_inputs, const void *const *data,
                             const int *dtypes, const int *ndims, const int64_t *const *shapes,
                             int n_outputs, void *const *out, const int64_t *out_bytes,
                             int64_t *out_dims) {
    if (m == NULL) return PDJIT_ERR_ARGS;
    m->ran = 0;
    if (out != NULL && n_outputs != NUM_OUT)
        return fail(m, PDJIT_ERR_COUNT, "expected %%d output buffer(s), got %%d", NUM_OUT,
                    n_outputs);
    if (out != NULL && out_bytes == NULL)
        return fail(m, PDJIT_ERR_ARGS, "out_bytes must not be NULL when out is given");
    int rc = run_into(m, n_inputs, data, dtypes, ndims, shapes, out, out_bytes);
    if (rc == PDJIT_OK && out_dims != NULL) {
        int k = 0;
        for (int i = 0; i < NUM_OUT; i++)
            for (int d = 0; d < out_ndims[i]; d++) out_dims[k++] = m->out_shape[i][d];
    }
    return rc;
}

API int pdjit_model_output(const pdjit_model *m, int i, const void **data,
                           const int64_t **shape) {
    if (m == NULL || !m->ran || i < 0 || i >= NUM_OUT) return PDJIT_ERR_ARGS;
    if (data) *data = m->at[i];
    if (shape) *shape = m->out_shape[i];
    return PDJIT_OK;
}

API const char *pdjit_model_error(const pdjit_model *m) {
    return m == NULL ? "no model instance" : m->error;
}

API int pdjit_model_memory(const pdjit_model *m, int64_t *arena_bytes, int64_t *heap_blocks) {
    if (m == NULL) return PDJIT_ERR_ARGS;
    int64_t bytes = (int64_t)m->arena.cap, heap = (int64_t)m->arena.heap_blocks;
    for (int k = 1; k < m->nslices; k++) {
        bytes += (int64_t)m->worker_arenas[k - 1].cap;
        heap += (int64_t)m->worker_arenas[k - 1].heap_blocks;
    }
    if (arena_bytes) *arena_bytes = bytes;
    if (heap_blocks) *heap_blocks = heap;
    return PDJIT_OK;
}

API int pdjit_fixed_batch(void) { return FIXED_BATCH; }
API int pdjit_build_threads(void) { return BUILD_THREADS; }
API int pdjit_batch_split(void) { return BATCH_SPLIT; }
API const char *pdjit_batch_split_why_not(void) { return split_why_not; }
API int pdjit_params_embedded(void) { return EMBEDDED; }
API int pdjit_model_threads(const pdjit_model *m) { return m == NULL ? 0 : m->threads; }

static void *pool_worker(void *arg) {
    pdjit_slice *j = arg;
    pdjit_model *m = j->m;
    pdjit_pool *pool = &m->pool;
    int k = (int)(j - m->slices);
    unsigned seen = 0;   /* pool_start's gen: no run before the workers exist */
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (pool->gen == seen && !pool->stop) pthread_cond_wait(&pool->go, &pool->mu);
        if (pool->stop) break;
        seen = pool->gen;
        if (k >= pool->active) continue;   /* a smaller batch: fewer slices this run */
        pthread_mutex_unlock(&pool->mu);
        run_slice(j);
        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

/* the workers of slices 1 .. nslices-1; one that cannot be started leaves its slice to the
   calling thread */
static void pool_start(pdjit_model *m) {
    pdjit_pool *pool = &m->pool;
    memset(pool, 0, sizeof *pool);
    pthread_once(&atfork_once, atfork_register);
    pool->forks = fork_count;
    if (pthread_mutex_init(&pool->mu, NULL) != 0) return;
    if (pthread_cond_init(&pool->go, NULL) != 0) {
        pthread_mutex_destroy(&pool->mu);
        return;
    }
    if (pthread_cond_init(&pool->done, NULL) != 0) {
        pthread_cond_destroy(&pool->go);
        pthread_mutex_destroy(&pool->mu);
        return;
    }
    pool->up = 1;
    for (int k = 1; k < m->nslices; k++) {
        m->slices[k].m = m;
        pool->started[k] = pthread_create(&pool->tid[k], NULL, pool_worker,
                                          &m->slices[k]) == 0;
    }
}

static void pool_stop(pdjit_model *m) {
    pdjit_pool *pool = &m->pool;
    if (!pool->up) return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    for (int k = 1; k < MAX_THREADS; k++)
        if (pool->started[k]) pthread_join(pool->tid[k], NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->go);
    pthread_mutex_destroy(&pool->mu);
    memset(pool, 0, sizeof *pool);
}

static void free_slices(pdjit_model *m) {
    pool_stop(m);
    for (int k = 1; k < m->nslices; k++) free(m->worker_arenas[k - 1].base);
    free(m->worker_arenas);
    free(m->slices);
    m->worker_arenas = NULL;
    m->slices = NULL;
    m->nslices = 0;
}

static int size_arenas(pdjit_model *m, int64_t max_batch);

API int pdjit_model_set_threads(pdjit_model *m, int n) {
    if (m == NULL) return PDJIT_ERR_ARGS;
    if (n < 1 || n > MAX_THREADS)
        return fail(m, PDJIT_ERR_ARGS, "threads: expected 1 to %%d, got %%d", MAX_THREADS, n);
    m->ran = 0;
    if (!BATCH_SPLIT) {   /* the batch cannot be split: OpenBLAS gets the threads */
        m->threads = n;
        pdjit_blas_threads(n);
        return PDJIT_OK;
    }
    if (n == m->nslices || (n == 1 && m->nslices == 0)) {
        m->threads = n;
        return PDJIT_OK;
    }
    free_slices(m);
    m->threads = n;
    if (n > 1) {
        pdjit_blas_threads(1);   /* the slices are the threads (see model.h) */
        m->slices = calloc((size_t)n, sizeof *m->slices);
        m->worker_arenas = calloc((size_t)n - 1, sizeof *m->worker_arenas);
        if (m->slices == NULL || m->worker_arenas == NULL) {
            free_slices(m);
            m->threads = 1;
            return fail(m, PDJIT_ERR_MEMORY, "out of memory for %%d threads' state", n);
        }
        m->nslices = n;
        pool_start(m);
        if (m->sized) return size_arenas(m, m->max_batch);   /* the new arenas, now */
    }
    return PDJIT_OK;
}

API int pdjit_set_blas_threads(int n) {
    if (n < 1) return PDJIT_ERR_ARGS;
    pdjit_blas_threads(n);
    return PDJIT_OK;
}

API void pdjit_model_destroy(pdjit_model *m) {
    if (m == NULL) return;
    for (int i = 0; i < NUM_OUT; i++) free(m->out[i]);
    free(m->arena.base);
    free_slices(m);
    if (m->params_owned) free(m->params);
    free(m);
}

/* runs on zeros at max_batch size the arenas: one on one thread (the whole batch), then one
   split across the instance's threads (skipped when an input has an unknown dim that is not
   the leading one) */
static int size_arenas(pdjit_model *m, int64_t max_batch) {
    int64_t shapes[NUM_IN + 1][8];
    const int64_t *sp[NUM_IN + 1];
    const void *data[NUM_IN + 1];
    int rc = PDJIT_OK;
    for (int i = 0; i < NUM_IN; i++)
        for (int d = 1; d < in_ndims[i]; d++)
            if (in_shapes[i][d] < 0) return PDJIT_OK;
    for (int i = 0; i < NUM_IN; i++) {
        int64_t n = 1;
        for (int d = 0; d < in_ndims[i]; d++) {
            shapes[i][d] = in_shapes[i][d] < 0 ? max_batch : in_shapes[i][d];
            if (__builtin_mul_overflow(n, shapes[i][d], &n) ||
                    __builtin_mul_overflow(n, dtype_sizes[in_dtypes[i]], &(int64_t){0}))
                n = -1;
            if (n < 0) break;
        }
        sp[i] = shapes[i];
        data[i] = n < 0 ? NULL : calloc((size_t)(n ? n : 1), dtype_sizes[in_dtypes[i]]);
        if (data[i] == NULL && rc == PDJIT_OK)
            rc = fail(m, PDJIT_ERR_MEMORY, "out of memory for input '%%s' at max_batch "
                      "%%lld", in_names[i], (long long)max_batch);
    }
    m->sizing = 1;
    if (rc == PDJIT_OK) rc = run_checked(m, data, sp, max_batch, NULL, NULL);
    if (rc == PDJIT_OK && m->nslices > 1) run_split(m, data, sp, NULL, NULL);
    m->sizing = 0;
    m->sized = 1;
    for (int i = 0; i < NUM_IN; i++) free((void *)data[i]);
    m->ran = 0;
    m->arena.heap_blocks = 0;   /* the warm-up's blocks were what sized the arenas */
    for (int k = 1; k < m->nslices; k++) m->worker_arenas[k - 1].heap_blocks = 0;
    return rc;
}

API int pdjit_model_create(const char *params_path, int64_t max_batch, pdjit_model **out,
                           char *err, size_t err_len) {
    if (out == NULL) return PDJIT_ERR_ARGS;
    *out = NULL;
    pdjit_model *m = calloc(1, sizeof *m);
    if (m == NULL) {
        if (err && err_len) snprintf(err, err_len, "out of memory");
        return PDJIT_ERR_MEMORY;
    }
    int rc = max_batch < 1 ? fail(m, PDJIT_ERR_ARGS, "max_batch must be >= 1, got %%lld",
                                  (long long)max_batch) : PDJIT_OK;
    if (rc == PDJIT_OK && FIXED_BATCH && max_batch > FIXED_BATCH)
        rc = fail(m, PDJIT_ERR_ARGS, "max_batch %%lld: the library was built for batches of at "
                  "most %%d (--batch %%d)", (long long)max_batch, FIXED_BATCH, FIXED_BATCH);
    if (FIXED_BATCH) max_batch = FIXED_BATCH;   /* sized for N whatever smaller was asked */
    m->max_batch = max_batch;
    m->threads = 1;
    if (rc == PDJIT_OK) rc = read_params(m, params_path);
    if (rc == PDJIT_OK && BUILD_THREADS > 1) rc = pdjit_model_set_threads(m, BUILD_THREADS);
    if (rc == PDJIT_OK && WARM_UP) rc = size_arenas(m, max_batch);
    if (rc != PDJIT_OK) {
        if (err && err_len) snprintf(err, err_len, "%%s", m->error);
        pdjit_model_destroy(m);
        return rc;
    }
    *out = m;
    return PDJIT_OK;
}
"""


def model_c(spec) -> str:
    """``model.c`` for a :class:`pdjit.aot.build.Spec`."""
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
    return renamed(MODEL.replace("PDJIT_ARENA", ARENA.replace("%", "%%")) % {
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


EXAMPLE = r"""/* example.c: runs the model and prints its outputs' shapes and first values;
   exit status 0 on success. With no arguments the inputs are generated (batch 2, or 1 for a
   library built with --batch 1); else each argument is a .npy file holding one input, in the
   order of pdjit_input_name. PDJIT_THREADS=N in the environment: the instance runs on N
   threads (pdjit_model_set_threads). Build here:
     cc -O2 -I. example.c -L. -lmodel -Wl,-rpath,'$ORIGIN' -o example */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static size_t dtype_size(int d) {
    static const size_t sizes[] = {4, 8, 4, 8, 1, 1, 1, 2, 2};
    return d >= 0 && d < 9 ? sizes[d] : 1;
}

/* a little-endian, C-order .npy file: its data, dtype code, rank and shape; NULL on error */
static void *read_npy(const char *path, int *dtype, int *ndim, int64_t **shape) {
    static const char *descrs[] = {"<f4", "<f8", "<i4", "<i8", "|u1", "|i1", "|b1", "<i2",
                                   "<f2"};
    FILE *f = fopen(path, "rb");
    unsigned char magic[10];
    if (f == NULL) { fprintf(stderr, "%s: cannot open\n", path); return NULL; }
    if (fread(magic, 1, 10, f) != 10 || memcmp(magic, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "%s: not a .npy file\n", path);
        fclose(f);
        return NULL;
    }
    size_t hlen = magic[8] | (magic[9] << 8);
    if (magic[6] >= 2) {  /* version 2/3: a 4-byte header length */
        unsigned char more[2];
        if (fread(more, 1, 2, f) != 2) { fclose(f); return NULL; }
        hlen |= ((size_t)more[0] << 16) | ((size_t)more[1] << 24);
    }
    char *head = calloc(hlen + 1, 1);
    if (head == NULL || fread(head, 1, hlen, f) != hlen) {
        fprintf(stderr, "%s: truncated header\n", path);
        free(head);
        fclose(f);
        return NULL;
    }
    *dtype = -1;
    for (int k = 0; k < 9; k++) {
        char want[16];
        snprintf(want, sizeof want, "'%%s'", descrs[k]);
        if (strstr(head, want)) *dtype = k;
    }
    const char *sh = strstr(head, "'shape': (");
    if (*dtype < 0 || strstr(head, "'fortran_order': True") || sh == NULL) {
        fprintf(stderr, "%s: expected a little-endian C-order array of a dtype in model.h\n",
                path);
        free(head);
        fclose(f);
        return NULL;
    }
    *shape = calloc(32, sizeof(int64_t));
    *ndim = 0;
    int64_t count = 1;
    for (const char *q = sh + 10; *q && *q != ')' && *ndim < 32;) {
        char *end;
        long long v = strtoll(q, &end, 10);
        if (end == q) { q++; continue; }
        (*shape)[(*ndim)++] = v;
        count *= v;
        q = end;
    }
    free(head);
    size_t bytes = (size_t)count * dtype_size(*dtype);
    void *data = malloc(bytes ? bytes : 1);
    if (data == NULL || fread(data, 1, bytes, f) != bytes) {
        fprintf(stderr, "%s: expected %%zu bytes of data\n", path, bytes);
        free(data);
        fclose(f);
        return NULL;
    }
    fclose(f);
    return data;
}

int main(int argc, char **argv) {
    const int64_t batch = pdjit_fixed_batch() == 1 ? 1 : 2;
    int n = pdjit_num_inputs();
    pdjit_model *m = NULL;
    char err[512];
    if (argc > 1 && argc - 1 != n) {
        fprintf(stderr, "expected %%d .npy file(s) (one per input), got %%d\n", n, argc - 1);
        return 2;
    }
    if (pdjit_model_create(NULL, batch, &m, err, sizeof err) != PDJIT_OK) {
        fprintf(stderr, "create: %%s\n", err);
        return 1;
    }
    const char *threads = getenv("PDJIT_THREADS");
    if (threads != NULL && pdjit_model_set_threads(m, atoi(threads)) != PDJIT_OK) {
        fprintf(stderr, "threads: %%s\n", pdjit_model_error(m));
        return 2;
    }
    printf("threads: %%d (%%s)\n", pdjit_model_threads(m),
           pdjit_batch_split() ? "slices of the batch" : "OpenBLAS");
    void **data = calloc(n ? n : 1, sizeof *data);
    int *dtypes = calloc(n ? n : 1, sizeof *dtypes), *ndims = calloc(n ? n : 1, sizeof *ndims);
    int64_t **shapes = calloc(n ? n : 1, sizeof *shapes);
    for (int i = 0; i < n; i++) {
        if (argc > 1) {
            data[i] = read_npy(argv[i + 1], &dtypes[i], &ndims[i], &shapes[i]);
            if (data[i] == NULL) return 2;
        } else {
            dtypes[i] = pdjit_input_dtype(i);
            ndims[i] = pdjit_input_ndim(i);
            shapes[i] = calloc(ndims[i] ? ndims[i] : 1, sizeof(int64_t));
            int64_t count = 1;
            for (int d = 0; d < ndims[i]; d++) {
                int64_t s = pdjit_input_shape(i)[d];
                shapes[i][d] = s < 0 ? batch : s;
                count *= shapes[i][d];
            }
            data[i] = calloc(count ? count : 1, dtype_size(dtypes[i]));
            for (int64_t k = 0; k < count; k++) {  /* deterministic values in [-1, 1] */
                double v = (double)((k * 7919 + i * 104729) %% 2001) / 1000.0 - 1.0;
                switch (dtypes[i]) {
                    case PDJIT_FLOAT32: ((float *)data[i])[k] = (float)v; break;
                    case PDJIT_FLOAT64: ((double *)data[i])[k] = v; break;
                    case PDJIT_INT32: ((int32_t *)data[i])[k] = (int32_t)(k %% 2); break;
                    case PDJIT_INT64: ((int64_t *)data[i])[k] = (int64_t)(k %% 2); break;
                    default: break;
                }
            }
        }
        printf("input %%s: %%s [", pdjit_input_name(i), pdjit_dtype_name(dtypes[i]));
        for (int d = 0; d < ndims[i]; d++) printf(d ? ", %%lld" : "%%lld", (long long)shapes[i][d]);
        printf("]\n");
    }
    int rc = pdjit_model_run(m, n, (const void *const *)data, dtypes, ndims,
                             (const int64_t *const *)shapes);
    if (rc != PDJIT_OK) {
        fprintf(stderr, "run: %s\n", pdjit_model_error(m));
        return 1;
    }
    for (int i = 0; i < pdjit_num_outputs(); i++) {
        const void *out;
        const int64_t *shape;
        pdjit_model_output(m, i, &out, &shape);
        printf("output %s: %s [", pdjit_output_name(i), pdjit_dtype_name(pdjit_output_dtype(i)));
        int64_t count = 1;
        for (int d = 0; d < pdjit_output_ndim(i); d++) {
            printf(d ? ", %lld" : "%lld", (long long)shape[d]);
            count *= shape[d];
        }
        printf("]:");
        for (int64_t k = 0; k < count && k < 5; k++) {
            int t = pdjit_output_dtype(i);
            if (t == PDJIT_FLOAT32) printf(" %.6g", ((const float *)out)[k]);
            else if (t == PDJIT_FLOAT64) printf(" %.6g", ((const double *)out)[k]);
            else if (t == PDJIT_INT64) printf(" %lld", (long long)((const int64_t *)out)[k]);
            else if (t == PDJIT_INT32) printf(" %d", ((const int32_t *)out)[k]);
            else if (t == PDJIT_INT16) printf(" %d", ((const int16_t *)out)[k]);
            else if (t == PDJIT_INT8) printf(" %d", ((const int8_t *)out)[k]);
            else if (t == PDJIT_UINT8 || t == PDJIT_BOOL)
                printf(" %d", ((const unsigned char *)out)[k]);
        }
        printf("\n");
    }
    for (int i = 0; i < n; i++) { free(data[i]); free(shapes[i]); }
    free(data); free(dtypes); free(ndims); free(shapes);
    pdjit_model_destroy(m);
    return 0;
}
""".replace("%%", "%")


def example_c(prefix: str = DEFAULT_PREFIX) -> str:
    """``example.c`` for the ABI's names of ``prefix``."""
    return renamed(EXAMPLE, prefix)
