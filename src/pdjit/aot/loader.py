"""The ``__init__.py`` written into an AOT artifact: loads ``libmodel.so`` (``libPREFIX.so``) with
``ctypes``; needs only NumPy (no pdjit, Numba or llvmlite)."""

SOURCE = r'''"""A model compiled ahead of time by pdjit:
``model = load(); outs = model.run({"x": x})``.

Needs only NumPy and ctypes. ``load(params=None, max_batch=%(batch)d, threads=None)``: an
instance (its memory sized for ``max_batch`` at creation, re-sized for a bigger batch unless
the library was built for a fixed batch); instances are independent: give each thread its own
(calls on one instance from several threads wait for each other).

Built with: %(built)s.
"""
import ctypes
import os
import threading

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBRARY, _PREFIX = %(library)r, %(prefix)r   # the C ABI's names: PREFIX_model_run, ...
_DTYPES = ["float32", "float64", "int32", "int64", "uint8", "int8", "bool", "int16", "float16"]
_CODES = {np.dtype(d): i for i, d in enumerate(_DTYPES)}
_lib = None


class _Functions:
    """The library's functions under their default names (``pdjit_model_run``, ...), whatever
    the prefix it was built with."""


def _library():
    global _lib
    if _lib is None:
        lib, funcs = ctypes.CDLL(os.path.join(_HERE, _LIBRARY)), _Functions()
        i64p = ctypes.POINTER(ctypes.c_int64)
        for name, res, args in (
                ("pdjit_num_inputs", ctypes.c_int, []), ("pdjit_num_outputs", ctypes.c_int, []),
                ("pdjit_input_name", ctypes.c_char_p, [ctypes.c_int]),
                ("pdjit_input_dtype", ctypes.c_int, [ctypes.c_int]),
                ("pdjit_input_ndim", ctypes.c_int, [ctypes.c_int]),
                ("pdjit_input_shape", i64p, [ctypes.c_int]),
                ("pdjit_output_name", ctypes.c_char_p, [ctypes.c_int]),
                ("pdjit_output_dtype", ctypes.c_int, [ctypes.c_int]),
                ("pdjit_output_ndim", ctypes.c_int, [ctypes.c_int]),
                ("pdjit_output_shape", i64p, [ctypes.c_int]),
                ("pdjit_model_create", ctypes.c_int,
                 [ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p),
                  ctypes.c_char_p, ctypes.c_size_t]),
                ("pdjit_model_run", ctypes.c_int,
                 [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                  ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                  ctypes.POINTER(i64p)]),
                ("pdjit_model_run_into", ctypes.c_int,
                 [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                  ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                  ctypes.POINTER(i64p), ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                  i64p, i64p]),
                ("pdjit_model_output", ctypes.c_int,
                 [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                  ctypes.POINTER(i64p)]),
                ("pdjit_model_error", ctypes.c_char_p, [ctypes.c_void_p]),
                ("pdjit_model_memory", ctypes.c_int, [ctypes.c_void_p, i64p, i64p]),
                ("pdjit_model_set_threads", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
                ("pdjit_model_threads", ctypes.c_int, [ctypes.c_void_p]),
                ("pdjit_fixed_batch", ctypes.c_int, []), ("pdjit_build_threads", ctypes.c_int, []),
                ("pdjit_batch_split", ctypes.c_int, []),
                ("pdjit_batch_split_why_not", ctypes.c_char_p, []),
                ("pdjit_params_embedded", ctypes.c_int, []),
                ("pdjit_model_destroy", None, [ctypes.c_void_p])):
            fn = getattr(lib, _PREFIX + name[len("pdjit"):])
            fn.restype, fn.argtypes = res, args
            setattr(funcs, name, fn)
        _lib = funcs
    return _lib


_UNSET = object()


def _address(a):
    """The address of a C-contiguous array's data (a writeable array's through the buffer
    protocol, several times quicker than ``a.ctypes.data``)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):   # read-only or empty
        return a.ctypes.data


class _Plan:
    """The outputs of runs on inputs of one set of shapes: their ``shapes`` and ``dtypes``,
    dims ``flat``, sizes (``nbytes``, as the library takes them). Small outputs (1 byte to
    1 KiB each, rank >= 1) are rows of blocks of 64 runs (``take``: one run's arrays and
    addresses; a returned array is a view of its block, which lives while one of its rows
    does): a row's address is arithmetic, where a new array's costs a buffer export."""

    ROWS = 64

    def __init__(self, shapes, dtypes):
        self.shapes, self.dtypes = shapes, dtypes
        self.flat = [d for s in shapes for d in s]
        self.sizes = [int(np.prod(s, dtype=np.int64)) * dt.itemsize
                      for s, dt in zip(shapes, dtypes)]
        self.nbytes = (ctypes.c_int64 * max(len(shapes), 1))(*self.sizes)
        self.rows = self.ROWS if all(0 < n <= 1024 and len(s) for n, s in
                                     zip(self.sizes, shapes)) else 0
        self.k = self.rows
        self.blocks, self.bases = [], []

    def take(self, optr):
        """New output arrays, their addresses written into ``optr``."""
        if not self.rows:
            outs = [np.empty(s, dt) for s, dt in zip(self.shapes, self.dtypes)]
            for i, o in enumerate(outs):
                optr[i] = _address(o)
            return outs
        if self.k == self.rows:
            self.blocks = [np.empty((self.rows,) + s, dt)
                           for s, dt in zip(self.shapes, self.dtypes)]
            self.bases = [_address(b) for b in self.blocks]
            self.k = 0
        k = self.k
        self.k = k + 1
        for i, b in enumerate(self.bases):
            optr[i] = b + k * self.sizes[i]
        return [b[k] for b in self.blocks]


class ModelError(RuntimeError):
    """A call into the library failed: ``code`` is its status, the message says why."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Model:
    """An instance. ``fixed_batch``: N for a library built with ``--batch N`` (runs take 1 to N
    rows), else 0; ``batch_split``: whether a run splits its batch across threads
    (``batch_split_why_not`` names the op that prevents it); ``threads``: the threads runs use
    (``set_threads``); ``threads_used``: ``"batch"`` (slices of the batch on threads of their
    own) or ``"blas"`` (OpenBLAS's threads, process-wide); ``params_embedded``: the parameters
    are inside the library (``model.params`` is not read)."""

    def __init__(self, params=None, max_batch=%(batch)d, threads=None):
        lib = _library()
        self._lib, self._h = lib, None
        self._lock = threading.Lock()   # the C instance runs one call at a time
        ni, no = lib.pdjit_num_inputs(), lib.pdjit_num_outputs()
        self.input_names = [lib.pdjit_input_name(i).decode() for i in range(ni)]
        self.output_names = [lib.pdjit_output_name(i).decode() for i in range(no)]
        self.input_dtypes = [np.dtype(_DTYPES[lib.pdjit_input_dtype(i)]) for i in range(ni)]
        self.output_dtypes = [np.dtype(_DTYPES[lib.pdjit_output_dtype(i)]) for i in range(no)]
        self.input_shapes = [tuple(lib.pdjit_input_shape(i)[d] for d in
                                   range(lib.pdjit_input_ndim(i))) for i in range(ni)]
        self.output_shapes = [tuple(lib.pdjit_output_shape(i)[d] for d in
                                    range(lib.pdjit_output_ndim(i))) for i in range(no)]
        if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) or \
                max_batch > 1 << 40:
            raise ModelError(1, f"max_batch: expected an int from 1 to 2**40, got {max_batch!r}")
        err = ctypes.create_string_buffer(512)
        h = ctypes.c_void_p()
        path = None if params is None else os.fsencode(params)
        rc = lib.pdjit_model_create(path, max(int(max_batch), -1), ctypes.byref(h), err, 512)
        if rc != 0:
            raise ModelError(rc, err.value.decode(errors="replace"))
        self._h = h
        self.fixed_batch = lib.pdjit_fixed_batch()
        self.batch_split = bool(lib.pdjit_batch_split())
        self.batch_split_why_not = lib.pdjit_batch_split_why_not().decode(errors="replace")
        self.params_embedded = bool(lib.pdjit_params_embedded())
        self.threads_used = "batch" if self.batch_split else "blas"
        i64p = ctypes.POINTER(ctypes.c_int64)
        self._n, self._nout, self._plans = -1, no, {}
        self._run_into = getattr(ctypes.CDLL(os.path.join(_HERE, _LIBRARY)),
                                 _PREFIX + "_model_run_into")
        self._run_into.restype, self._run_into.argtypes = ctypes.c_int, None
        self._flat = sum(len(s) for s in self.output_shapes)
        self._optr = (ctypes.c_void_p * max(no, 1))()
        self._odims = (ctypes.c_int64 * max(self._flat, 1))()
        p, s = ctypes.c_void_p(), i64p()
        self._out = (p, s, ctypes.byref(p), ctypes.byref(s))
        if threads is not None:
            self.set_threads(threads)

    @property
    def threads(self):
        with self._lock:
            return self._lib.pdjit_model_threads(self._h) if self._h is not None else 0

    def set_threads(self, n):
        """The threads this instance's runs use from now on (see the class)."""
        if not isinstance(n, int) or isinstance(n, bool):
            raise ModelError(1, f"threads: expected an int, got {n!r}")
        with self._lock:
            if self._h is None:
                raise ModelError(1, "the model was closed")
            if not -(1 << 31) <= n < 1 << 31:
                raise ModelError(1, f"threads: expected 1 to 64, got {n}")
            rc = self._lib.pdjit_model_set_threads(self._h, n)
            if rc != 0:
                raise ModelError(rc, self._lib.pdjit_model_error(self._h).decode(
                    errors="replace"))

    def _buffers(self, n):
        """Argument arrays for runs of ``n`` inputs, made once (a run fills them in place)."""
        i64p = ctypes.POINTER(ctypes.c_int64)
        self._n = n
        self._data = (ctypes.c_void_p * max(n, 1))()
        self._codes = (ctypes.c_int * max(n, 1))()
        self._ndims = (ctypes.c_int * max(n, 1))()
        self._dims = [(ctypes.c_int64 * 32)() for _ in range(n)]
        self._shapes = (i64p * max(n, 1))(*[ctypes.cast(d, i64p) for d in self._dims])
        self._last = [None] * n     # the shape each input's dims hold now
        self._lastdt = [None] * n   # the dtype each input's code is for
        self._cur = _UNSET          # the outputs' plan for the shapes in _last

    def _describe(self, i, a):
        """Input ``i``'s dtype code and shape into the argument arrays (a new dtype or shape)."""
        self._last[i] = self._lastdt[i] = None
        code = _CODES.get(a.dtype, -1)
        if a.ndim > 32 or (code < 0 and i < len(self.input_dtypes)):
            what = repr(self.input_names[i]) if i < len(self.input_names) else str(i)
            if a.ndim > 32:
                raise ModelError(4, f"input {what}: rank {a.ndim} is too large")
            raise ModelError(3, f"input {what}: expected dtype {self.input_dtypes[i]}, "
                                f"got unknown dtype {a.dtype.str!r} (the library takes "
                                f"native-byte-order {_DTYPES})")
        self._codes[i] = code
        shape = a.shape
        self._ndims[i] = len(shape)
        dims = self._dims[i]
        for d, size in enumerate(shape):
            dims[d] = size
        self._last[i], self._lastdt[i] = shape, a.dtype

    def run(self, feed, out=None):
        """The outputs (in ``output_names`` order) for ``feed``, a dict by input name (or a list
        in ``input_names`` order): new arrays the library writes into (an output of up to 1 KiB
        is a view of a block shared by 64 runs' outputs), or the arrays of ``out``
        (one C-contiguous, writeable array per output, of its dtype and of the shape this run
        gives it, not sharing memory with an input; returned as they are). One thread at a
        time per instance: a call from another thread waits for the running one."""
        with self._lock:
            return self._run(feed, out)

    def _arrays(self, feed):
        names = self.input_names
        if type(feed) is dict and len(feed) == len(names) == 1:
            try:
                return [feed[names[0]]]
            except KeyError:
                pass
        if isinstance(feed, dict):
            if len(feed) == len(names):
                try:
                    return [feed[n] for n in names]
                except KeyError:
                    pass
            unknown = sorted(set(feed) - set(names))
            missing = [n for n in names if n not in feed]
            raise ModelError(2, f"feed: expected inputs {names}; missing {missing}, "
                                f"unknown {unknown}")
        return list(feed)

    def _plan(self, key):
        """The outputs' expected shapes for inputs of shapes ``key`` (a dim declared -1 is the
        largest such dim of the inputs, as the library sizes its buffers, 1 when no input
        declares one; 0 for a batch of no rows), their dims flat and their bytes; None when
        the library's own buffers are to be used."""
        if len(self._plans) > 64:
            self._plans.clear()
        batch = -1   # (0: a batch of no rows, outputs of no rows)
        for shape, decl in zip(key, self.input_shapes):
            if len(shape) != len(decl):
                return None   # the library names the input and the ranks
            for d, want in zip(shape, decl):
                if want < 0 and d > batch:
                    batch = d
        if batch < 0:
            batch = 1
        plan = _Plan([tuple(batch if d < 0 else d for d in s) for s in self.output_shapes],
                     self.output_dtypes)
        self._plans[key] = plan
        return plan

    def _outputs(self, out, plan):
        """``out`` checked against the outputs (a list of arrays; the expected shapes from
        ``plan``); their sizes in bytes, as the library takes them."""
        if isinstance(out, np.ndarray) or not isinstance(out, (list, tuple)) or \
                len(out) != self._nout:
            raise ModelError(2, f"out: expected a list of {self._nout} array(s), one per output "
                                f"{self.output_names}, got {type(out).__name__}"
                                + (f" of {len(out)}" if isinstance(out, (list, tuple)) else ""))
        for i, o in enumerate(out):
            dt = self.output_dtypes[i]
            want = None if plan is None else plan.shapes[i]
            if type(o) is np.ndarray and o.dtype == dt and o.flags.c_contiguous and \
                    o.flags.writeable and (want is None or o.shape == want):
                continue
            got = (f"{o.dtype} {o.shape}"
                   + ("" if o.flags.c_contiguous else ", not C-contiguous")
                   + ("" if o.flags.writeable else ", read-only")) \
                if isinstance(o, np.ndarray) else type(o).__name__
            raise ModelError(4, f"out[{i}] (output {self.output_names[i]!r}): expected a "
                                f"writeable C-contiguous {dt} array of shape "
                                f"{want if want is not None else self.output_shapes[i]}, "
                                f"got {got}")
        if plan is not None:
            return plan.nbytes
        return (ctypes.c_int64 * self._nout)(*[o.nbytes for o in out])

    def _run(self, feed, out):
        if self._h is None:
            raise ModelError(1, "the model was closed")
        arrays = self._arrays(feed)   # converted inputs replace the originals: alive in here
        n = len(arrays)
        if self._n != n:
            self._buffers(n)
        data, last, lastdt = self._data, self._last, self._lastdt
        plan = self._cur
        for i, a in enumerate(arrays):
            if type(a) is not np.ndarray or not a.flags.c_contiguous:
                a = np.asarray(a)   # (ascontiguousarray would make a 0-d input 1-d)
                if not a.flags.c_contiguous:
                    a = np.ascontiguousarray(a)
                arrays[i] = a
            if a.dtype is not lastdt[i] or a.shape != last[i]:
                self._describe(i, a)
                plan = _UNSET
            data[i] = _address(a)
        if plan is _UNSET:
            key = tuple(last)
            plans = self._plans
            plan = self._cur = plans[key] if key in plans else self._plan(key)
        lib, h, optr, odims = self._lib, self._h, self._optr, self._odims
        if out is not None:
            nbytes = self._outputs(out, plan)
            outs = list(out)
            for a in arrays:
                for o in outs:
                    if np.may_share_memory(a, o):
                        raise ModelError(4, "out: an output array shares memory with an input")
            for i, o in enumerate(outs):
                optr[i] = _address(o)
        elif plan is not None:
            outs, nbytes = plan.take(optr), plan.nbytes
        else:
            outs = None
        # the prepared arrays as they are: no argtypes conversion (h is a c_void_p)
        if outs is not None:
            rc = self._run_into(h, n, data, self._codes, self._ndims, self._shapes, self._nout,
                                optr, nbytes, odims)
        else:
            rc = self._run_into(h, n, data, self._codes, self._ndims, self._shapes, self._nout,
                                None, None, odims)
        if rc != 0:
            raise ModelError(rc, lib.pdjit_model_error(h).decode(errors="replace"))
        if outs is not None and odims[:self._flat] == (plan.flat if out is None else
                                                       [d for o in outs for d in o.shape]):
            return outs   # the library wrote them in place
        if out is not None:
            got = odims[:self._flat]
            k, shapes = 0, []
            for s in self.output_shapes:
                shapes.append(tuple(got[k:k + len(s)]))
                k += len(s)
            raise ModelError(4, f"out: this run's outputs have shapes {shapes}, the arrays "
                                f"given {[o.shape for o in outs]}")
        if plan is not None:   # shapes other than expected: the library's buffers from now on
            self._plans[tuple(self._last)] = self._cur = None
        outs = []
        p, s, pref, sref = self._out
        output = lib.pdjit_model_output
        for i, dt in enumerate(self.output_dtypes):
            output(h, i, pref, sref)
            o = np.empty(s[:len(self.output_shapes[i])], dt)
            if o.nbytes:
                ctypes.memmove(o.ctypes.data, p.value, o.nbytes)
            outs.append(o)
        return outs

    def memory(self):
        """``(arena bytes, arrays the last run put on the heap)``, over the instance's threads:
        the heap count is 0 once the arenas fit the batch (they grow after a run that needed
        more, unless the library was built for a fixed batch)."""
        a, h = ctypes.c_int64(), ctypes.c_int64()
        with self._lock:
            if self._h is None:
                raise ModelError(1, "the model was closed")
            self._lib.pdjit_model_memory(self._h, ctypes.byref(a), ctypes.byref(h))
        return a.value, h.value

    def close(self):
        """Frees the instance (a later call raises ModelError); closing twice is harmless."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if self._h is not None:
                self._lib.pdjit_model_destroy(self._h)
                self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def load(params=None, max_batch=%(batch)d, threads=None):
    """A new instance of the model (``params``: the parameters file, default the parameters
    embedded in the library, else ``model.params`` beside it; ``threads``: see
    ``Model.set_threads``, default the build's)."""
    return Model(params, max_batch, threads)
'''


def source(spec) -> str:
    """The loader's text for the build ``spec`` (``spec.options``: see ``Spec`` and
    ``csource.options``)."""
    from pdjit.aot import csource
    from pdjit.aot.csource import options

    o = options(spec)
    built = [f"--batch {o['fixed_batch']}" if o["fixed_batch"] else "--dynamic-batch",
             f"--threads {o['threads']} ("
             + ("batch split across threads" if o["batch_split"] else
                "OpenBLAS threads: the batch is not split, "
                + o["batch_split_why_not"].replace("\\", "/").replace('"', "'")) + ")",
             f"--cpu {o.get('cpu', 'host')}"]
    if o["embed_params"]:
        built.append("--embed-params")
    if o["prefix"] != csource.DEFAULT_PREFIX:
        built.append(f"--prefix {o['prefix']}")
    return SOURCE % {"batch": int(o.get("batch", 1)),
                     "built": ", ".join(built), "prefix": o["prefix"],
                     "library": csource.files(o["prefix"])[0]}
