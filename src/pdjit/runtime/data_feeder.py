"""``DataFeeder``: a minibatch of samples (lists of fields) -> the feed dict of a run.

As in Fluid 1.x, a minibatch is an iterable of samples and each sample holds one field per
variable of ``feed_list``, in order. A field of a variable with ``lod_level=0`` is one example
(a number, a list or an array); with ``lod_level=k`` it is a sequence nested ``k`` deep, whose
innermost items are examples, and the LoD is built from the lengths. The examples of a field
are stacked into an array of the variable's dtype; when that array's rank differs from the
variable's (a flat list of 784 values for a ``[-1, 1, 28, 28]`` image), it is reshaped to the
variable's shape, as Fluid does when the shape has at most one unknown dim.

``feed`` returns ``{name: ndarray}`` for dense variables and ``{name: LoDTensor}`` for LoD ones,
ready for ``Executor.run(feed=...)``. Bad input is a ``FeedError`` naming the variable and the
sample at fault.
"""
from __future__ import annotations

import os

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import FeedError
from pdjit.framework.program import Variable, default_main_program
from pdjit.runtime.place import CPUPlace
from pdjit.runtime.tensor import LoDTensor, check_offsets, lengths_to_offsets

__all__ = ["DataFeeder", "cpu_places"]


class _Field:
    """Collects one variable's column of a minibatch, then turns it into its feed value."""

    __slots__ = ("name", "dtype", "shape", "lod_level", "items", "owners", "lengths")

    def __init__(self, var: Variable):
        self.name, self.dtype, self.lod_level = var.name, var.dtype, var.lod_level
        shape = list(var.shape)
        # Fluid reshapes to the declared shape only when at most one dim is unknown
        self.shape = shape if sum(1 for d in shape if d < 0) <= 1 else None
        self.items: list = []
        self.owners: list = []      # the sample index each example came from
        self.lengths = [[] for _ in range(self.lod_level)]

    def add(self, field, sample: int) -> None:
        self._add(field, 0, sample)

    def _add(self, field, level: int, sample: int) -> None:
        if level == self.lod_level:
            self.items.append(field)
            self.owners.append(sample)
            return
        try:
            n = len(field)
        except TypeError:
            raise FeedError(f"DataFeeder: variable {self.name!r} has lod_level="
                            f"{self.lod_level}: sample {sample} must give a sequence nested "
                            f"{self.lod_level} deep, got {type(field).__name__} {field!r} at "
                            f"depth {level}") from None
        self.lengths[level].append(n)
        for item in field:
            self._add(item, level + 1, sample)

    def done(self):
        arr = self._stack()
        if self.shape is not None:
            if arr.ndim != len(self.shape):
                try:
                    arr = arr.reshape(self.shape)
                except ValueError:
                    raise FeedError(f"DataFeeder: variable {self.name!r} is declared with shape "
                                    f"{self.shape}; the minibatch gives {list(arr.shape)}, "
                                    f"which cannot be reshaped to it") from None
            else:
                for d, a in zip(self.shape, arr.shape):
                    if d >= 0 and d != a:
                        raise FeedError(f"DataFeeder: variable {self.name!r} is declared with "
                                        f"shape {self.shape} (-1 = any size), the minibatch "
                                        f"gives {list(arr.shape)}")
        arr = np.ascontiguousarray(arr) if arr.ndim else arr
        if self.lod_level == 0:
            return arr
        lod = [lengths_to_offsets(level) for level in self.lengths]
        try:
            return LoDTensor._wrap(arr, check_offsets(lod, arr.shape[0] if arr.ndim else 1,
                                                      f"DataFeeder {self.name!r} LoD"))
        except ValueError as e:
            raise FeedError(str(e)) from None

    def _stack(self) -> np.ndarray:
        dtype = self.dtype
        try:
            arr = np.array(self.items, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise self._blame(e) from None
        return arr

    def _blame(self, error) -> FeedError:
        """The sample whose field differs in shape from the first one, or cannot be converted."""
        want = dtypes.dtype_str(self.dtype)
        first = None
        for item, sample in zip(self.items, self.owners):
            try:
                a = np.asarray(item, dtype=self.dtype)
            except (TypeError, ValueError, OverflowError) as e:
                return FeedError(f"DataFeeder: variable {self.name!r}: sample {sample} cannot be "
                                 f"converted to {want}: {e} (got {_short(item)})")
            if first is None:
                first = (a.shape, sample)
            elif a.shape != first[0]:
                return FeedError(f"DataFeeder: variable {self.name!r}: sample {sample} has shape "
                                 f"{list(a.shape)} but sample {first[1]} has "
                                 f"{list(first[0])}: the examples of a minibatch must agree "
                                 f"in shape (declare lod_level>0 for sequences)")
        return FeedError(f"DataFeeder: variable {self.name!r}: cannot convert the minibatch to "
                         f"{want}: {error}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class DataFeeder:
    """Converts minibatches of samples into feed dicts for the variables of ``feed_list``.

    ``feed_list`` holds Variables or the names of variables of ``program``'s global block
    (default: the default main program). ``place`` is accepted as in Fluid (values are host
    arrays on every place).
    """

    def __init__(self, feed_list, place=None, program=None):
        if isinstance(feed_list, (str, Variable)):
            feed_list = [feed_list]
        try:
            feed_list = list(feed_list)
        except TypeError:
            raise TypeError(f"DataFeeder: feed_list must be a list of Variables or names, got "
                            f"{type(feed_list).__name__}") from None
        if not feed_list:
            raise ValueError("DataFeeder: feed_list is empty")
        program = program if program is not None else default_main_program()
        self.feed_vars = []
        for i, v in enumerate(feed_list):
            if isinstance(v, str):
                gb = program.global_block()
                if not gb.has_var(v):
                    raise FeedError(f"DataFeeder: feed_list[{i}] names {v!r}, which is not a "
                                    f"variable of the program's global block")
                v = gb.var(v)
            elif not isinstance(v, Variable):
                raise TypeError(f"DataFeeder: feed_list[{i}] must be a Variable or a name, got "
                                f"{type(v).__name__}: {v!r}")
            if v.dtype is None:
                raise FeedError(f"DataFeeder: variable {v.name!r} has no dtype: it cannot be "
                                f"fed")
            self.feed_vars.append(v)
        self.feed_names = [v.name for v in self.feed_vars]
        self.feed_dtypes = [v.dtype for v in self.feed_vars]
        self.feed_shapes = [list(v.shape) for v in self.feed_vars]
        self.feed_lod_level = [v.lod_level for v in self.feed_vars]
        self.place = place

    def feed(self, iterable) -> dict:
        """``{name: value}`` for one minibatch: an iterable of samples, each a list/tuple with
        one field per variable of ``feed_list``."""
        fields = [_Field(v) for v in self.feed_vars]
        count = 0
        for i, sample in enumerate(iterable):
            if isinstance(sample, (str, bytes)) or not hasattr(sample, "__len__"):
                raise FeedError(f"DataFeeder: sample {i} must be a list or tuple of "
                                f"{len(fields)} field(s) (for {self.feed_names}), got "
                                f"{type(sample).__name__}: {_short(sample)}")
            if len(sample) != len(fields):
                raise FeedError(f"DataFeeder: sample {i} has {len(sample)} field(s), expected "
                                f"{len(fields)} (one per variable of feed_list "
                                f"{self.feed_names})")
            for f, value in zip(fields, sample):
                f.add(value, i)
            count += 1
        if not count:
            raise FeedError(f"DataFeeder: the minibatch for {self.feed_names} is empty")
        return {f.name: f.done() for f in fields}

    def feed_parallel(self, iterable, num_places=None):
        """One feed dict per minibatch of ``iterable`` (a list of minibatches, one per place)."""
        batches = list(iterable)
        if num_places is not None and len(batches) != num_places:
            raise FeedError(f"DataFeeder.feed_parallel: got {len(batches)} minibatches for "
                            f"{num_places} places")
        for batch in batches:
            yield self.feed(batch)

    def decorate_reader(self, reader, multi_devices=False, num_places=None, drop_last=True):
        """A reader of feed dicts from a reader of minibatches (``multi_devices=True``: lists
        of ``num_places`` dicts, one per place, by default as many as ``cpu_places()`` gives,
        i.e. ``CPU_NUM``, as Fluid; an incomplete last group is dropped unless
        ``drop_last=False``, which is an error then, as in Fluid)."""
        def single():
            for batch in reader():
                yield self.feed(batch)

        def multi():
            n = len(cpu_places()) if num_places is None else int(num_places)
            group = []
            for batch in reader():
                group.append(batch)
                if len(group) == n:
                    yield list(self.feed_parallel(group, n))
                    group = []
            if group and not drop_last:
                raise FeedError(f"DataFeeder.decorate_reader: {len(group)} minibatch(es) left "
                                f"over for {n} places; set drop_last=True")

        return multi if multi_devices else single


def cpu_places(device_count=None) -> list:
    """Fluid's ``fluid.cpu_places``: ``device_count`` CPUPlaces (default: the ``CPU_NUM``
    environment variable, else 1), e.g. for ``DataLoader.set_batch_generator(places=...)``."""
    if device_count is None:
        text = os.environ.get("CPU_NUM", "1").strip() or "1"
        try:
            device_count = int(text)
        except ValueError:
            raise ValueError(f"cpu_places: CPU_NUM must be a positive int, got {text!r}") \
                from None
    if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count <= 0:
        raise ValueError(f"cpu_places: device_count must be a positive int, got "
                         f"{device_count!r}")
    return [CPUPlace() for _ in range(device_count)]
