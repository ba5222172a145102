"""Runtime tensor values: dense NumPy arrays, and LoD tensors (array + offsets per level).

A scope holds a plain ``np.ndarray`` for a dense tensor and a :class:`LoDTensor` when the value
carries level-of-detail offsets. ``LoDTensor`` also serves Fluid's user API
(``scope.find_var(n).get_tensor()``, ``create_lod_tensor``).

Internally each LoD level is a read-only ``int64`` array of offsets, validated once with NumPy
(a LoD of 10,000 sequences costs microseconds, not a Python loop); ``lod()`` gives lists.
"""
from __future__ import annotations

import functools

import numpy as np


def _as_offsets(level, what: str, index: int) -> np.ndarray:
    if isinstance(level, np.ndarray) and level.dtype == np.int64 and level.ndim == 1 \
            and not level.flags.writeable:
        return level
    try:
        arr = np.array(level, dtype=np.int64, ndmin=1)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{what}: level {index} must be a list of ints, got {level!r}: {e}") \
            from None
    if arr.ndim != 1:
        raise ValueError(f"{what}: level {index} must be a flat list of offsets, got shape "
                         f"{list(arr.shape)}")
    if isinstance(level, np.ndarray) and level.dtype.kind == "f" and \
            not np.array_equal(arr, level):
        raise ValueError(f"{what}: level {index} offsets must be integers, got {level!r}")
    arr.flags.writeable = False
    return arr


def _short(arr) -> str:
    items = [int(v) for v in arr[:8]]
    return str(items)[:-1] + (", ...]" if len(arr) > 8 else "]")


def check_offsets(lod, rows: int | None, what: str = "LoD") -> list:
    """Validate offsets: each level starts at 0, never decreases, and ends where the next level
    (or, when ``rows`` is given, the rows of the data, for the last level) ends. Returns the LoD
    as read-only int64 arrays; raises ``ValueError`` saying what is wrong."""
    if isinstance(lod, np.ndarray) and lod.ndim == 1:
        raise ValueError(f"{what}: expected a list of levels (a list of offset lists), got a "
                         f"flat array {_short(lod)}")
    out = []
    for level, offs in enumerate(lod):
        arr = _as_offsets(offs, what, level)
        if arr.size == 0 or arr[0] != 0:
            raise ValueError(f"{what}: level {level} must start at 0, got {_short(arr)}")
        if arr.size > 1:
            d = np.diff(arr)
            if d.min() < 0:
                at = int(np.argmax(d < 0))
                raise ValueError(f"{what}: level {level} offsets must not decrease, got "
                                 f"{int(arr[at])} then {int(arr[at + 1])} (at index {at + 1})")
        out.append(arr)
    for level in range(len(out) - 1):
        if out[level][-1] != len(out[level + 1]) - 1:
            raise ValueError(f"{what}: level {level} ends at {int(out[level][-1])} but level "
                             f"{level + 1} has {len(out[level + 1]) - 1} sequences")
    if rows is not None and out and out[-1][-1] != rows:
        raise ValueError(f"{what}: the last level ends at {int(out[-1][-1])}, expected the "
                         f"number of rows {rows}")
    return out


def check_lod(lod, rows: int | None, what: str = "LoD") -> list:
    """:func:`check_offsets`, returning the LoD as lists of ints."""
    return [a.tolist() for a in check_offsets(lod, rows, what)]


def lengths_to_offsets(lengths) -> list:
    """Sequence lengths -> offsets (``[2, 3] -> [0, 2, 5]``); negative lengths are an error."""
    arr = np.asarray(lengths, dtype=np.int64).reshape(-1) if len(lengths) else \
        np.zeros(0, np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(f"sequence lengths must be non-negative, got {list(lengths)}")
    return [0] + np.cumsum(arr).tolist()


def _rows(array) -> int:
    return 0 if array is None else (array.shape[0] if array.ndim else 1)


class LoDTensor:
    """An array plus LoD offsets (Fluid's ``LoDTensor``). ``np.array(t)`` gives the data.

    ``set_lod`` / ``set_recursive_sequence_lengths`` check the offsets themselves (start at 0,
    never decrease, levels agree); whether they fit the data's rows is
    ``has_valid_recursive_sequence_lengths()``, and feeding checks it.
    """

    def __init__(self, array=None, lod=None):
        """``LoDTensor(array, lod)``: with both given, the LoD must fit the array's rows
        (``ValueError`` otherwise)."""
        self._array = None if array is None else np.asarray(array)
        self._lod = []
        if lod is not None and len(lod):
            self._lod = check_offsets(lod, None if self._array is None else _rows(self._array))

    @classmethod
    def _wrap(cls, array: np.ndarray, lod_arrays: list) -> "LoDTensor":
        """A LoDTensor of already validated parts (no copy, no check)."""
        t = cls.__new__(cls)
        t._array, t._lod = array, lod_arrays
        return t

    # Fluid's API ------------------------------------------------------------------------------
    def set(self, array, place=None) -> None:
        """Copy ``array`` (anything ``np.array`` takes) in as the data."""
        self._array = np.array(array, copy=True)
        self._on_set()

    def _on_set(self):
        pass

    def lod(self) -> list:
        """The offsets per level, as lists of ints (``[[0, 2, 5]]``)."""
        return [level.tolist() for level in self._lod]

    def set_lod(self, lod) -> None:
        """Set the offsets per level (``[[0, 2, 5]]``); ``ValueError`` when malformed."""
        self._lod = check_offsets(lod, None)
        self._on_set()

    def recursive_sequence_lengths(self) -> list:
        """The sequence lengths per level (``[[2, 3]]`` for offsets ``[[0, 2, 5]]``)."""
        return [np.diff(level).tolist() for level in self._lod]

    def set_recursive_sequence_lengths(self, lengths) -> None:
        """Set the LoD from sequence lengths per level (``[[2, 3]]``)."""
        if isinstance(lengths, np.ndarray) and lengths.ndim == 1:
            raise ValueError(f"recursive_seq_lens: expected a list of levels, got a flat array "
                             f"{_short(lengths)}")
        self.set_lod([lengths_to_offsets(level) for level in lengths])

    def has_valid_recursive_sequence_lengths(self) -> bool:
        """Whether the LoD is well formed and its last level ends at the data's row count."""
        try:
            check_offsets(self._lod, _rows(self._array))
            return True
        except ValueError:
            return False

    def shape(self) -> list:
        return [] if self._array is None else list(self._array.shape)

    def _dtype(self):
        return None if self._array is None else self._array.dtype

    def _is_initialized(self) -> bool:
        return self._array is not None

    def _offsets(self, level: int = -1) -> np.ndarray:
        """The offsets of one level as a read-only int64 array (no copy)."""
        return self._lod[level]

    def __array__(self, dtype=None, copy=None):
        if self._array is None:
            raise ValueError("the LoDTensor holds no data yet (call set() first)")
        if type(self._array) is not np.ndarray and hasattr(self._array, "copy_to_host"):
            host = self._array.copy_to_host()  # a device array (CUDAPlace): a host copy
            return host if dtype is None else host.astype(dtype)
        if copy:
            return np.array(self._array, dtype=dtype, copy=True)
        return self._array if dtype is None else self._array.astype(dtype)

    def numpy(self) -> np.ndarray:
        return np.array(self)

    def __repr__(self):
        return f"LoDTensor(shape={self.shape()}, dtype={self._dtype()}, lod={self.lod()})"


def create_lod_tensor(data, recursive_seq_lens, place=None) -> LoDTensor:
    """A LoDTensor from ``data`` and sequence lengths per level (Fluid's ``create_lod_tensor``).

    ``data`` is an ndarray (rows = the total length of the last level), a LoDTensor (its data is
    used), or a list of sequences of ints (one level; the result is int64 of shape ``[rows, 1]``,
    as Fluid makes it). Lengths that do not fit the data are a ``ValueError``.
    """
    if isinstance(data, LoDTensor):
        return create_lod_tensor(np.array(data, copy=True), recursive_seq_lens, place)
    if isinstance(data, list):
        if len(recursive_seq_lens) != 1:
            raise ValueError(f"create_lod_tensor: a list of sequences gives one LoD level; got "
                             f"recursive_seq_lens with {len(recursive_seq_lens)} levels")
        lens = [len(seq) for seq in data]
        if lens != list(recursive_seq_lens[0]):
            raise ValueError(f"create_lod_tensor: the sequence lengths of data {lens} differ "
                             f"from recursive_seq_lens {list(recursive_seq_lens[0])}")
        flat = [x for seq in data for x in seq]
        arr = np.array(flat, dtype=np.int64).reshape(len(flat), 1)
        return create_lod_tensor(arr, recursive_seq_lens, place)
    if not isinstance(data, np.ndarray):
        raise TypeError(f"create_lod_tensor: data must be a numpy array, a LoDTensor or a list "
                        f"of sequences, got {type(data).__name__}")
    t = LoDTensor()
    t.set(data, place)
    t.set_recursive_sequence_lengths(recursive_seq_lens)
    if not t.has_valid_recursive_sequence_lengths():
        lens = [int(sum(level)) for level in recursive_seq_lens]
        raise ValueError(f"create_lod_tensor: recursive_seq_lens {_short_lens(recursive_seq_lens)}"
                         f" do not fit data of shape {list(data.shape)} (the last level sums to "
                         f"{lens[-1] if lens else 0} rows)")
    return t


def _short_lens(lens) -> str:
    text = str([list(level) for level in lens])
    return text if len(text) < 80 else text[:76] + "...]"


def create_random_int_lodtensor(recursive_seq_lens, base_shape, place=None, low=0,
                                high=1) -> LoDTensor:
    """A LoDTensor of int64 values drawn uniformly from ``[low, high]``, shaped
    ``[total length] + base_shape``."""
    rows = int(sum(recursive_seq_lens[-1])) if recursive_seq_lens else 0
    data = np.random.randint(low, high + 1, size=[rows] + list(base_shape)).astype(np.int64)
    return create_lod_tensor(data, recursive_seq_lens, place)


def as_array(value) -> np.ndarray:
    """The dense data of a runtime value."""
    if isinstance(value, LoDTensor):
        return np.asarray(value)
    return value


def lod_of(value) -> list:
    return value.lod() if isinstance(value, LoDTensor) else []


def device_holder(value):
    """The device target whose memory holds ``value`` (``codegen.target.holder``), or None:
    the code generator is imported at the first call (with the first plan or fetch), once."""
    return _holder()(value)


@functools.cache
def _holder():
    from pdjit.codegen.target import holder

    return holder
