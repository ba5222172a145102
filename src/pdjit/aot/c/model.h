/* model.h: the C ABI of a model compiled ahead of time by pdjit. */
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
enum { PDJIT_OK = 0, PDJIT_ERR_ARGS = 1, PDJIT_ERR_COUNT = 2, PDJIT_ERR_DTYPE = 3, PDJIT_ERR_SHAPE = 4, PDJIT_ERR_PARAMS = 5, PDJIT_ERR_MEMORY = 6, PDJIT_ERR_NATIVE = 7 };
enum { PDJIT_FLOAT32 = 0, PDJIT_FLOAT64 = 1, PDJIT_INT32 = 2, PDJIT_INT64 = 3, PDJIT_UINT8 = 4, PDJIT_INT8 = 5, PDJIT_BOOL = 6, PDJIT_INT16 = 7, PDJIT_FLOAT16 = 8 };
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
