"""Values derived from parameters and kept beside them (the CPU's packed weights,
``pdjit.codegen.cpu.lib.pgemm``), and when they are made again.

A derived value is kept by the identity of the array it was made from, weakly (it goes with
the array): a parameter given a new array (``Tensor.set``, loading a model) is another array,
which it never stands for. A run that may change an array in place says so with
:func:`written`: the executor does, before and after each run, for the persistable variables
that the program's ops write and those the run feeds (a fed array may be the user's buffer,
refilled between runs). A parameter changed in place through a NumPy view of the Scope's array,
outside any run, is not seen: give the Scope a new array instead (``Tensor.set``). The
Predictor keeps the values derived from a cached model's parameters on disk
(:class:`pdjit.io.optimized_cache.DerivedValues`: :func:`made`, :func:`of`, :func:`keep`)."""
from __future__ import annotations

import weakref

import numpy as np

#: (id of an array, key) -> (a weak reference to the array, the value derived from it)
_DERIVED: dict = {}
#: how many values :func:`derived` has made (whoever keeps them elsewhere, the optimized-model
#: cache, asks whether there are new ones)
_MADE = [0]
#: how many times :func:`written` dropped derived values (what holds one, a recorded host
#: driver, asks whether its own may be stale)
_DROPPED = [0]


def _gone(k):
    def drop(ref, k=k, table=_DERIVED):  # (the table bound: at exit the module's names go)
        entry = table.get(k)
        if entry is not None and entry[0] is ref:
            table.pop(k, None)
    return drop


#: called with the array of each :func:`derived` asked (``pdjit.codegen.cpu.replay``: a
#: recorded host driver keeps the value, so the array must be a parameter)
on_derived = [None]


def derived(array, key, make):
    """The value ``make()`` derived from ``array`` under ``key``: made at the first ask and
    kept until ``array`` goes or is :func:`written`."""
    if on_derived[0] is not None:
        on_derived[0](array)
    k = (id(array), key)
    entry = _DERIVED.get(k)
    if entry is not None and entry[0]() is array:
        return entry[1]
    value = aligned(make())
    _DERIVED[k] = (weakref.ref(array, _gone(k)), value)
    _MADE[0] += 1
    return value


#: the alignment (bytes) of the arrays :func:`derived` keeps: a cache line, which a kernel's
#: vector loads then never straddle (a GRU classifier's recurrent products on weights packed
#: at an address 16 bytes past a line took 25 % longer)
ALIGN = 64


def aligned(value):
    """``value``, an array (or a tuple of them) copied where it does not start at a multiple
    of :data:`ALIGN` bytes (other values as they are)."""
    if type(value) is tuple:
        return tuple(aligned(v) for v in value)
    if not isinstance(value, np.ndarray) or value.ctypes.data % ALIGN == 0 or \
            not value.flags.c_contiguous:
        return value
    raw = np.empty(value.nbytes + ALIGN, np.uint8)
    at = -raw.ctypes.data % ALIGN
    out = raw[at:at + value.nbytes].view(value.dtype).reshape(value.shape)
    out[...] = value
    return out


def made() -> int:
    """How many values :func:`derived` has made so far in this process."""
    return _MADE[0]


def of(array) -> dict:
    """``{key: value}`` of what is kept derived from ``array``."""
    i = id(array)
    return {k[1]: e[1] for k, e in list(_DERIVED.items()) if k[0] == i and e[0]() is array}


def keep(array, key, value) -> None:
    """Keep ``value`` as what :func:`derived` gives for ``array`` under ``key`` (made
    elsewhere from the same values: read from a cache); a value already kept stays."""
    k = (id(array), key)
    entry = _DERIVED.get(k)
    if entry is None or entry[0]() is not array:
        _DERIVED[k] = (weakref.ref(array, _gone(k)), value)


def any_derived() -> bool:
    """Whether a value derived from an array is kept (else :func:`written` has nothing to do)."""
    return bool(_DERIVED)


def written(arrays) -> None:
    """``arrays`` may change in place: what was derived from them is made again when next
    asked for."""
    ids = {id(a) for a in arrays if a is not None}
    for k in [k for k in list(_DERIVED) if k[0] in ids]:
        _DERIVED.pop(k, None)
        _DROPPED[0] += 1


def generation() -> int:
    """Changes whenever :func:`written` drops a derived value: a value taken from
    :func:`derived` before may no longer be the one it would give."""
    return _DROPPED[0]
