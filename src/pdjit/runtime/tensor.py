"""Runtime tensor values: dense NumPy arrays, and LoD tensors (array + offsets per level).

A scope holds a plain ``np.ndarray`` for a dense tensor and a :class:`LoDTensor` when the value
carries level-of-detail offsets. ``LoDTensor`` also serves Fluid's user API
(``scope.find_var(n).get_tensor()``, ``create_lod_tensor``).
"""
from __future__ import annotations

import numpy as np


def check_lod(lod, rows: int, what: str = "LoD") -> list:
    """Validate offsets: each level starts at 0, never decreases, and ends where the next level
    (or the rows of the data, for the last level) ends. Returns the LoD as lists of ints."""
    out = []
    for level, offs in enumerate(lod):
        offs = [int(o) for o in offs]
        if not offs or offs[0] != 0:
            raise ValueError(f"{what}: level {level} must start at 0, got {offs[:3]}...")
        if any(b < a for a, b in zip(offs, offs[1:])):
            raise ValueError(f"{what}: level {level} offsets must not decrease, got {offs}")
        out.append(offs)
    for level in range(len(out) - 1):
        if out[level][-1] != len(out[level + 1]) - 1:
            raise ValueError(f"{what}: level {level} ends at {out[level][-1]} but level "
                             f"{level + 1} has {len(out[level + 1]) - 1} sequences")
    if out and out[-1][-1] != rows:
        raise ValueError(f"{what}: the last level ends at {out[-1][-1]}, expected the number of "
                         f"rows {rows}")
    return out


def lengths_to_offsets(lengths) -> list:
    offs = [0]
    for n in lengths:
        if int(n) < 0:
            raise ValueError(f"sequence lengths must be non-negative, got {list(lengths)}")
        offs.append(offs[-1] + int(n))
    return offs


class LoDTensor:
    """An array plus LoD offsets. ``np.array(t)`` gives the data."""

    def __init__(self, array=None, lod=None):
        self._array = None if array is None else np.asarray(array)
        self._lod = []
        if lod:
            self.set_lod(lod)

    # Fluid's API ------------------------------------------------------------------------------
    def set(self, array, place=None) -> None:
        self._array = np.array(array, copy=True)
        self._on_set()

    def _on_set(self):
        pass

    def lod(self) -> list:
        return [list(level) for level in self._lod]

    def set_lod(self, lod) -> None:
        rows = 0 if self._array is None else (self._array.shape[0] if self._array.ndim else 1)
        self._lod = check_lod(lod, rows)
        self._on_set()

    def recursive_sequence_lengths(self) -> list:
        return [[b - a for a, b in zip(level, level[1:])] for level in self._lod]

    def set_recursive_sequence_lengths(self, lengths) -> None:
        self.set_lod([lengths_to_offsets(level) for level in lengths])

    def has_valid_recursive_sequence_lengths(self) -> bool:
        try:
            check_lod(self._lod, self._array.shape[0] if self._array is not None else 0)
            return True
        except ValueError:
            return False

    def shape(self) -> list:
        return [] if self._array is None else list(self._array.shape)

    def _dtype(self):
        return None if self._array is None else self._array.dtype

    def __array__(self, dtype=None, copy=None):
        if self._array is None:
            raise ValueError("the tensor holds no data yet")
        return self._array if dtype is None else self._array.astype(dtype)

    def numpy(self) -> np.ndarray:
        return np.array(self)

    def __repr__(self):
        return f"LoDTensor(shape={self.shape()}, dtype={self._dtype()}, lod={self._lod})"


def as_array(value) -> np.ndarray:
    """The dense data of a runtime value."""
    if isinstance(value, LoDTensor):
        return np.asarray(value)
    return value


def lod_of(value) -> list:
    return value.lod() if isinstance(value, LoDTensor) else []
