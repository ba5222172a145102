/* example.c: runs the model and prints its outputs' shapes and first values;
   exit status 0 on success. With no arguments the inputs are generated (batch 2, or 1 for a
   library built with --batch 1); else each argument is a .npy file holding one input, in the
   order of pdjit_input_name. PDJIT_NUM_THREADS=N in the environment: the instance runs on N
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
        snprintf(want, sizeof want, "'%s'", descrs[k]);
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
        fprintf(stderr, "%s: expected %zu bytes of data\n", path, bytes);
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
        fprintf(stderr, "expected %d .npy file(s) (one per input), got %d\n", n, argc - 1);
        return 2;
    }
    if (pdjit_model_create(NULL, batch, &m, err, sizeof err) != PDJIT_OK) {
        fprintf(stderr, "create: %s\n", err);
        return 1;
    }
    const char *threads = getenv("PDJIT_NUM_THREADS");
    if (threads != NULL && pdjit_model_set_threads(m, atoi(threads)) != PDJIT_OK) {
        fprintf(stderr, "threads: %s\n", pdjit_model_error(m));
        return 2;
    }
    printf("threads: %d (%s)\n", pdjit_model_threads(m),
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
                double v = (double)((k * 7919 + i * 104729) % 2001) / 1000.0 - 1.0;
                switch (dtypes[i]) {
                    case PDJIT_FLOAT32: ((float *)data[i])[k] = (float)v; break;
                    case PDJIT_FLOAT64: ((double *)data[i])[k] = v; break;
                    case PDJIT_INT32: ((int32_t *)data[i])[k] = (int32_t)(k % 2); break;
                    case PDJIT_INT64: ((int64_t *)data[i])[k] = (int64_t)(k % 2); break;
                    default: break;
                }
            }
        }
        printf("input %s: %s [", pdjit_input_name(i), pdjit_dtype_name(dtypes[i]));
        for (int d = 0; d < ndims[i]; d++) printf(d ? ", %lld" : "%lld", (long long)shapes[i][d]);
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
