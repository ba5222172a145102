/* model.c: the model API over the compiled entry, shipped with pdjit.aot; the facts of one
   model (sizes, names, build options, the entry) are in model_spec.h, generated per build. */
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
#define MAX_THREADS 64
#define POOL_THREAD_NAME "pdjit-slice"   /* a split run's worker threads */

#include "arena.h"
#include "model_spec.h"   /* generated per model: sizes, names, options, the entry */
extern __thread pdjit_arena *pdjit_current_arena;
extern void pdjit_arena_release(pdjit_arena *a);
extern void pdjit_blas_threads(int n);
/* the compiled entry, in Numba's internal calling convention */
#if EMBEDDED
extern const char pdjit_embedded_params[];   /* params_blob.s: the blob, 64-byte aligned */
#endif

static const int64_t dtype_sizes[] = {4, 8, 4, 8, 1, 1, 1, 2, 2};

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
        snprintf(here, sizeof here, "%s", info.dli_fname);
        char *slash = strrchr(here, '/');
        if (slash) slash[1] = 0; else here[0] = 0;
        strncat(here, "model.params", sizeof here - strlen(here) - 1);
        path = here;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) return fail(m, PDJIT_ERR_PARAMS, "%s: cannot open the parameters file", path);
    unsigned char head[40];
    uint64_t fields[4];
    if (fread(head, 1, 40, f) != 40 || memcmp(head, "PDJITPRM", 8) != 0) {
        fclose(f);
        return fail(m, PDJIT_ERR_PARAMS, "%s: not a pdjit parameters file (bad header)", path);
    }
    memcpy(fields, head + 8, 32);
    if (fields[0] != 1 || fields[1] != NUM_PARAMS || fields[2] != PARAMS_BYTES) {
        fclose(f);
        return fail(m, PDJIT_ERR_PARAMS, "%s: expected version 1, %d parameters, %llu bytes; "
                    "got version %llu, %llu parameters, %llu bytes", path, NUM_PARAMS,
                    (unsigned long long)PARAMS_BYTES, (unsigned long long)fields[0],
                    (unsigned long long)fields[1], (unsigned long long)fields[2]);
    }
    m->params_owned = 1;
    if (posix_memalign((void **)&m->params, 64, PARAMS_BYTES ? PARAMS_BYTES : 64) != 0) {
        fclose(f);
        m->params = NULL;
        return fail(m, PDJIT_ERR_MEMORY, "out of memory for %llu bytes of parameters",
                    (unsigned long long)PARAMS_BYTES);
    }
    size_t got = fread(m->params, 1, PARAMS_BYTES, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != PARAMS_BYTES || extra)
        return fail(m, PDJIT_ERR_PARAMS, "%s: expected %llu bytes of parameters, got %s", path,
                    (unsigned long long)PARAMS_BYTES, extra ? "more" : "fewer");
    if (checksum(m->params, PARAMS_BYTES) != PARAMS_HASH ||
            fields[3] != PARAMS_HASH)
        return fail(m, PDJIT_ERR_PARAMS, "%s: the parameters are not this model's "
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
        return fail(m, PDJIT_ERR_MEMORY, "out of memory for output '%s' (%lld elements)",
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
    return PDJIT_CALL_ENTRY(ret, excinfo);
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
    size_t k = (size_t)snprintf(out, n, "%.*s", lens[1], strs[1]);
    for (int i = 2; i < args_end && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%.*s", i == 2 ? ": " : ", ", lens[i], strs[i]);
    if (args_end < ns && k < n)
        k += (size_t)snprintf(out + k, n - k, " (in %.*s)", lens[args_end], strs[args_end]);
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
                return fail(m, PDJIT_ERR_NATIVE, "the model's native code failed: %s", why);
            return fail(m, PDJIT_ERR_NATIVE, "the model's native code failed (status %d): an "
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
        j->rows = batch / n + (k < batch % n);
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
        return fail(m, PDJIT_ERR_COUNT, "expected %d input(s), got %d", NUM_IN, n_inputs);
    if (NUM_IN > 0 && (data == NULL || dtypes == NULL || ndims == NULL || shapes == NULL))
        return fail(m, PDJIT_ERR_ARGS, "data, dtypes, ndims and shapes must not be NULL");
    /* the batch: the largest dim declared -1 (0 is a batch of no rows: the native code runs
       on empty inputs as the JIT does and gives empty outputs); 1 when none is declared -1 */
    int64_t batch = -1;
    const void *given[NUM_IN + 1];   /* data, with a 0-element input's NULL made a pointer */
    int nulls = 0;
    for (int i = 0; i < NUM_IN; i++) {
        if (dtypes[i] != in_dtypes[i])
            return fail(m, PDJIT_ERR_DTYPE, "input '%s': expected dtype %s, got %s",
                        in_names[i], pdjit_dtype_name(in_dtypes[i]),
                        pdjit_dtype_name(dtypes[i]));
        if (ndims[i] != in_ndims[i])
            return fail(m, PDJIT_ERR_SHAPE, "input '%s': expected rank %d, got %d",
                        in_names[i], in_ndims[i], ndims[i]);
        if (in_ndims[i] > 0 && shapes[i] == NULL)
            return fail(m, PDJIT_ERR_ARGS, "input '%s': data or shape is NULL", in_names[i]);
        int64_t elems = 1;
        for (int d = 0; d < in_ndims[i]; d++) {
            int64_t want = in_shapes[i][d], got = shapes[i][d];
            if (want >= 0 && got != want)
                return fail(m, PDJIT_ERR_SHAPE, "input '%s': dim %d expected %lld, got %lld",
                            in_names[i], d, (long long)want, (long long)got);
            if (want < 0 && got < 0)
                return fail(m, PDJIT_ERR_SHAPE, "input '%s': dim %d expected >= 0, got %lld",
                            in_names[i], d, (long long)got);
            if (want < 0 && got > batch) batch = got;
            if (FIXED_BATCH && d == 0 && want < 0 && got > FIXED_BATCH)
                return fail(m, PDJIT_ERR_SHAPE, "input '%s': dim 0 (the batch) expected at "
                            "most %d (the library was built with --batch %d), got %lld",
                            in_names[i], FIXED_BATCH, FIXED_BATCH, (long long)got);
            elems *= got;
        }
        given[i] = data[i];
        if (data[i] == NULL) {
            if (elems != 0)
                return fail(m, PDJIT_ERR_ARGS, "input '%s': data or shape is NULL",
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
        return fail(m, PDJIT_ERR_COUNT, "expected %d output buffer(s), got %d", NUM_OUT,
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
#ifdef __linux__
        /* named before pool_start returns, as top, gdb and /proc see it */
        if (pool->started[k]) pthread_setname_np(pool->tid[k], POOL_THREAD_NAME);
#endif
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
        return fail(m, PDJIT_ERR_ARGS, "threads: expected 1 to %d, got %d", MAX_THREADS, n);
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
            return fail(m, PDJIT_ERR_MEMORY, "out of memory for %d threads' state", n);
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
            rc = fail(m, PDJIT_ERR_MEMORY, "out of memory for input '%s' at max_batch "
                      "%lld", in_names[i], (long long)max_batch);
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
    int rc = max_batch < 1 ? fail(m, PDJIT_ERR_ARGS, "max_batch must be >= 1, got %lld",
                                  (long long)max_batch) : PDJIT_OK;
    if (rc == PDJIT_OK && FIXED_BATCH && max_batch > FIXED_BATCH)
        rc = fail(m, PDJIT_ERR_ARGS, "max_batch %lld: the library was built for batches of at "
                  "most %d (--batch %d)", (long long)max_batch, FIXED_BATCH, FIXED_BATCH);
    if (FIXED_BATCH) max_batch = FIXED_BATCH;   /* sized for N whatever smaller was asked */
    m->max_batch = max_batch;
    m->threads = 1;
    if (rc == PDJIT_OK) rc = read_params(m, params_path);
    if (rc == PDJIT_OK && BUILD_THREADS > 1) rc = pdjit_model_set_threads(m, BUILD_THREADS);
    if (rc == PDJIT_OK && WARM_UP) rc = size_arenas(m, max_batch);
    if (rc != PDJIT_OK) {
        if (err && err_len) snprintf(err, err_len, "%s", m->error);
        pdjit_model_destroy(m);
        return rc;
    }
    *out = m;
    return PDJIT_OK;
}
