"""Ahead-of-time compiled inference: a saved model as a native library with a C ABI.

``compile_model(model, out_dir)`` (or ``pdjit compile MODEL -o OUT_DIR [--batch N |
--dynamic-batch] [--threads N] [--embed-params] [--cpu host|generic] [--prefix NAME]``) writes:

- ``libmodel.so`` and ``model.h``: create an instance (parameters read from ``model.params``
  beside the library, or a given path), query input/output names, dtypes and shapes, run (a
  batch of 0 rows too: empty outputs), destroy; errors are status codes with a message (wrong
  count, dtype, rank or size of an input never reach native code). Only the API is exported.
  With ``--prefix NAME`` they are ``libNAME.so`` and ``NAME.h`` and the names
  ``NAME_model_create``, ``NAME_model``, ... (the status and dtype codes ``PDJIT_*`` stay), so
  that one C program can link several artifacts;
- ``model.params``: the parameters, in the order the library reads them (with
  ``--embed-params`` they are also inside ``libmodel.so``, ``.incbin``'d, and an instance
  needs no file; the checksum is verified at create either way);
- ``__init__.py``: a loader that needs only NumPy and ``ctypes``
  (``import OUT_DIR as m; model = m.load(); outs = model.run({"x": x})``);
- ``example.c``: a C program that runs the model on generated inputs (exit status 0);
- the BLAS the library links (NumPy's OpenBLAS and what it needs), copied beside it.

How (``pdjit.aot.build``): the model's inference program gets its plan descriptions from the
compile pipeline for the ``aot`` target (``pdjit.codegen.aot``: the CPU target's kernels,
generated for one thread), with every native step's driver as one Numba function
(``native_drivers``). One generated entry function (``pdjit.codegen.aot.entry``) takes the
inputs and parameters as raw pointers and sizes, wraps them as arrays (``numba.carray``), calls
the steps' drivers in plan order with the values in locals, and copies the fetched values into
the caller's buffers. That entry is compiled with Numba's ahead-of-time code generation into one
object file (``pdjit.codegen.aot.numba_aot``), which C code generated here
(``pdjit.aot.csource``) completes: a small runtime for the array allocations the kernels make
(an arena per instance, sized at creation by one run on zeros at the largest batch, except for a
model with a ``while``, whose loop need not end on zeros; re-sized after a run that needed
more), the ``numba_*`` helpers the object uses (GEMM through OpenBLAS), and the
model API. A plan with a step that is not a native driver (an op without a native lowering) is
refused, naming the op; so is a driver Numba cannot compile without Python (a library call that
is a Python function), naming its op group.

Control flow is Python control flow in the entry, compiled with it: the sub-blocks of
``conditional_block`` and ``while`` get plans of their own (native drivers too, recursively).
A ``while`` whose body became one native loop (``pdjit.codegen.loops``) is one call; any other
``while`` is driven by the entry (read the condition, run the body's steps, repeat), and
``conditional_block`` runs its block's steps when its condition holds (the one bool element, or
every ``Cond`` non-empty). A value a branch or loop writes goes to a variable of the enclosing
block, so it is there after it; one with no value before it is an empty array with a flag, and
reading it while unset (``select_input`` picking a branch that did not run) fails the run with
``PDJIT_ERR_NATIVE`` instead of reading garbage. ``select_input``/``select_output`` pick by their
mask in the entry. A random op, a tensor array or a LoD input in a sub-block is refused as at
the top, naming the op and the block. A native loop whose carried value changes shape fails the
run (``PDJIT_ERR_NATIVE``; the JIT re-runs such a loop with its reference instead).

What runs today (tests/codegen/aot): every model of the inference corpus. mlp, lenet and cond_while
are bit-identical to the JIT executor when built for ``host`` (the same kernels and the same
BLAS); mobilenet, resnet_block, transformer, gru and lstm (an opt-in test) are within 1e-6
of it through the loader and through ``example.c``; and a ``while_loop`` with a ``cond`` in
its body (``tests/codegen/aot/test_aot_control_flow.py``). The artifact runs the program after
the inference passes, as ``pdjit.inference``'s predictor does, and equals it bit for bit;
``Executor.run`` on the saved program itself differs in the last bits where a pass folded
``batch_norm`` into a convolution (a small CNN: 1.2e-7).

Batch and memory: ``--dynamic-batch`` (the default) takes any batch, the arenas re-sized after
a bigger one; ``--batch N`` makes a library for 1 to N rows whose memory is sized for N at
creation and never grows (a bigger batch is an error naming the input). In an arena a dead
array's block serves a later one (best fit: LeNet at batch 64 needs 2.9 MB where its arrays add
up to 3.9 MB); ``pdjit_model_memory`` reports the size and how many arrays the last run had to
put on the heap.

Run path: ``pdjit_model_run_into`` takes the caller's output buffers, and the entry copies the
fetched values straight into them (a buffer too small: the run is made again into the
instance's own buffers, which ``pdjit_model_output`` then names). The loader uses it: a run
fills the arguments prepared at ``load`` (ctypes arrays; dims rewritten only when an input's
shape or dtype changes; the run function called without ctypes argument conversion), and the
library writes the outputs into new arrays of the shapes the declared ones give for the
batch (outputs of up to 1 KiB: rows of a block allocated for 64 runs, whose addresses are known
without a buffer export each run), or into the caller's (``run(feed, out=[...])``); outputs
of other shapes (a ``-1`` that is not the batch) come back through the library's buffers,
copied.

Threads: no ``prange`` in the artifact (plans are built on one thread). ``--threads N``
(``load(threads=N)``, ``pdjit_model_set_threads``) splits a run's batch into ``min(N, B // 2)``
slices on pthreads (started with the instance and parked between runs: a run wakes them, no
thread start-up per run), one arena per thread per instance (OpenBLAS set to one thread: the slices
are the threads), when ``pdjit.aot.batch_split`` shows every output row depends only on the
same input rows; else the build names the op that mixes
rows and the N threads go to OpenBLAS (process-wide; ``pdjit_set_blas_threads``; in a process
that imported NumPy the library shares NumPy's OpenBLAS, loaded once by its soname). A split
run equals one thread on each slice bit for bit; one thread on the whole batch may differ in
the last bit where OpenBLAS sums a row differently for another row count (LeNet at 100 rows:
2.7e-7). Instances are independent: threads may run their own instances concurrently.

Relies on Numba internals (pinned by ``tests/codegen/aot/test_aot_numba_internals.py``), tested with
Numba 0.68.x and llvmlite 0.50.x (:data:`NUMBA_RANGE`): ``BaseContext.with_aot_codegen``,
``numba.core.compiler.compile_extra`` with ``Flags(no_compile, no_cpython_wrapper,
no_cfunc_wrapper, nrt)``, ``nrtdynmod.create_nrt_module``, ``AOTCodeLibrary.emit_native_object``,
``CompileResult.fndesc.llvm_func_name`` and Numba's internal calling convention
(``int32 status = fn(ret*, excinfo**, args...)``), the layout of NRT's ``MemInfo`` and the
signatures of ``numba_xxgemm``/``numba_xxgemv``/``numba_xxdot``/
``numba_attempt_nocopy_reshape``.

Not imported by ``import pdjit``: import ``pdjit.aot`` explicitly.
"""
NUMBA_RANGE = ((0, 68), (0, 68))   # (oldest, newest) minor versions the route was tested with

__all__ = ["compile_model", "AotError", "NUMBA_RANGE"]


def __getattr__(name):
    # the compiler (Numba) loads with the first use, not with ``pdjit.aot.__main__`` (the
    # command line's parser)
    if name in ("compile_model", "AotError"):
        from pdjit.aot import build

        return getattr(build, name)
    raise AttributeError(f"module 'pdjit.aot' has no attribute {name!r}")
