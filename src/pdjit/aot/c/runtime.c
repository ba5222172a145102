/* runtime.c: what the compiled object needs from outside, without Numba. */
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

#include "arena.h"

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
