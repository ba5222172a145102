"""The ``__init__.py`` written into an AOT artifact: loads ``libmodel.so`` with ``ctypes``; needs
only NumPy (no pdjit, Numba or llvmlite)."""

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
_DTYPES = ["float32", "float64", "int32", "int64", "uint8", "int8", "bool", "int16", "float16"]
_CODES = {np.dtype(d): i for i, d in enumerate(_DTYPES)}
_lib = None


def _library():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(os.path.join(_HERE, "libmodel.so"))
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
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _lib = lib
    return _lib


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
        p, s = ctypes.c_void_p(), i64p()
        self._out = (p, s, ctypes.byref(p), ctypes.byref(s))

    def run(self, feed):
        """The outputs (new arrays, in ``output_names`` order) for ``feed``, a dict by input
        name (or a list in ``input_names`` order). One thread at a time per instance: a call
        from another thread waits for the running one."""
        with self._lock:
            return self._run(feed)

    def _arrays(self, feed):
        names = self.input_names
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

    def _run(self, feed):
        if self._h is None:
            raise ModelError(1, "the model was closed")
        arrays = self._arrays(feed)
        n = len(arrays)
        if getattr(self, "_n", -1) != n:
            self._buffers(n)
        keep = []   # the arrays the pointers point into, alive until the call returns
        data, codes, ndims, all_dims = self._data, self._codes, self._ndims, self._dims
        for i, a in enumerate(arrays):
            if type(a) is not np.ndarray:
                a = np.asarray(a)   # (ascontiguousarray would make a 0-d input 1-d)
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            keep.append(a)
            code = _CODES.get(a.dtype, -1)
            if a.ndim > 32 or (code < 0 and i < len(self.input_dtypes)):
                what = repr(self.input_names[i]) if i < len(self.input_names) else str(i)
                if a.ndim > 32:
                    raise ModelError(4, f"input {what}: rank {a.ndim} is too large")
                raise ModelError(3, f"input {what}: expected dtype {self.input_dtypes[i]}, "
                                    f"got unknown dtype {a.dtype.str!r} (the library takes "
                                    f"native-byte-order {_DTYPES})")
            data[i] = a.ctypes.data
            codes[i] = code
            ndims[i] = a.ndim
            dims = all_dims[i]
            for d, size in enumerate(a.shape):
                dims[d] = size
        lib, h = self._lib, self._h
        rc = lib.pdjit_model_run(h, n, data, codes, ndims, self._shapes)
        if rc != 0:
            raise ModelError(rc, lib.pdjit_model_error(h).decode(errors="replace"))
        outs = []
        p, s, pref, sref = self._out
        output = lib.pdjit_model_output
        for i, dt in enumerate(self.output_dtypes):
            output(h, i, pref, sref)
            out = np.empty(s[:len(self.output_shapes[i])], dt)
            if out.nbytes:
                ctypes.memmove(out.ctypes.data, p.value, out.nbytes)
            outs.append(out)
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
    return SOURCE % {"batch": int(o.get("batch", 1)),
                     "built": ", ".join(built)}
