"""The ``__init__.py`` written into an AOT artifact: loads ``libmodel.so`` with ``ctypes``; needs
only NumPy (no pdjit, Numba or llvmlite)."""

SOURCE = r'''"""A model compiled ahead of time by pdjit:
``model = load(); outs = model.run({"x": x})``.

Needs only NumPy and ctypes. ``load(params=None, max_batch=%(batch)d)``: an instance (its memory
sized for ``max_batch`` at creation, re-sized for a bigger batch); instances are independent,
one per thread.
"""
import ctypes
import os

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_DTYPES = ["float32", "float64", "int32", "int64", "uint8", "int8", "bool", "int16", "float16"]
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
    def __init__(self, params=None, max_batch=%(batch)d):
        lib = _library()
        self._lib, self._h = lib, None
        ni, no = lib.pdjit_num_inputs(), lib.pdjit_num_outputs()
        self.input_names = [lib.pdjit_input_name(i).decode() for i in range(ni)]
        self.output_names = [lib.pdjit_output_name(i).decode() for i in range(no)]
        self.input_dtypes = [np.dtype(_DTYPES[lib.pdjit_input_dtype(i)]) for i in range(ni)]
        self.output_dtypes = [np.dtype(_DTYPES[lib.pdjit_output_dtype(i)]) for i in range(no)]
        self.input_shapes = [tuple(lib.pdjit_input_shape(i)[d] for d in
                                   range(lib.pdjit_input_ndim(i))) for i in range(ni)]
        self.output_shapes = [tuple(lib.pdjit_output_shape(i)[d] for d in
                                    range(lib.pdjit_output_ndim(i))) for i in range(no)]
        err = ctypes.create_string_buffer(512)
        h = ctypes.c_void_p()
        path = None if params is None else os.fsencode(params)
        rc = lib.pdjit_model_create(path, int(max_batch), ctypes.byref(h), err, 512)
        if rc != 0:
            raise ModelError(rc, err.value.decode(errors="replace"))
        self._h = h

    def run(self, feed):
        """The outputs (new arrays, in ``output_names`` order) for ``feed``, a dict by input
        name (or a list in ``input_names`` order)."""
        if self._h is None:
            raise ModelError(1, "the model was closed")
        if isinstance(feed, dict):
            unknown = sorted(set(feed) - set(self.input_names))
            missing = [n for n in self.input_names if n not in feed]
            if unknown or missing:
                raise ModelError(2, f"feed: expected inputs {self.input_names}; "
                                    f"missing {missing}, unknown {unknown}")
            arrays = [feed[n] for n in self.input_names]
        else:
            arrays = list(feed)
        n = len(arrays)
        keep = [np.ascontiguousarray(a) for a in arrays]
        data = (ctypes.c_void_p * max(n, 1))(*[a.ctypes.data for a in keep])
        codes = [(_DTYPES.index(a.dtype.name) if a.dtype.name in _DTYPES else -1)
                 for a in keep]
        dtypes = (ctypes.c_int * max(n, 1))(*codes)
        ndims = (ctypes.c_int * max(n, 1))(*[a.ndim for a in keep])
        shapes_ = [(ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for a in keep]
        i64p = ctypes.POINTER(ctypes.c_int64)
        shapes = (i64p * max(n, 1))(*[ctypes.cast(s, i64p) for s in shapes_])
        rc = self._lib.pdjit_model_run(self._h, n, data, dtypes, ndims, shapes)
        if rc != 0:
            raise ModelError(rc, self._lib.pdjit_model_error(self._h).decode(errors="replace"))
        outs = []
        for i, dt in enumerate(self.output_dtypes):
            p, s = ctypes.c_void_p(), i64p()
            self._lib.pdjit_model_output(self._h, i, ctypes.byref(p), ctypes.byref(s))
            shape = tuple(s[d] for d in range(len(self.output_shapes[i])))
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            buf = (ctypes.c_char * max(size, 1)).from_address(p.value)
            outs.append(np.frombuffer(buf, dt, count=size // dt.itemsize).reshape(shape).copy())
        return outs

    def close(self):
        if self._h is not None:
            self._lib.pdjit_model_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def load(params=None, max_batch=%(batch)d):
    """A new instance of the model (``params``: the parameters file, default ``model.params``
    beside the library)."""
    return Model(params, max_batch)
'''


def source(batch: int) -> str:
    return SOURCE % {"batch": int(batch)}
