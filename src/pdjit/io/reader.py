"""Data loading, the Fluid way: ``DataLoader.from_generator``, ``PyReader`` and the reader
decorators (``batch``, ``shuffle``, ``buffered``, ``xmap_readers``, ``multiprocess_reader``,
``map_readers``, ``chain``, ``compose``, ``firstn``, ``cache``).

A *reader* here is what Fluid calls a reader creator: a callable that returns an iterator of
items (samples, or lists of samples once batched). Decorators take readers and return readers.

``DataLoader.from_generator(feed_list, capacity, ...)`` feeds the variables of ``feed_list``
from a generator set with ``set_sample_generator`` / ``set_sample_list_generator`` /
``set_batch_generator``, converting and prefetching up to ``capacity`` batches in a background
thread (``pdjit.runtime.generator_loader``). Iterable loaders yield feed dicts (lists with
``return_list=True``; with ``places`` given as a list, a list with one of them per place);
non-iterable ones feed the runs of their program between ``start()`` and ``EOFException``.
"""
from __future__ import annotations

import queue
import random
import threading

from pdjit.runtime.generator_loader import (
    GeneratorLoader,
    PyReaderLoader,
    ReaderError,
    _batched,
    check_batch_size,
    check_reader,
)

__all__ = ["DataLoader", "PyReader", "GeneratorLoader", "ReaderError", "batch", "shuffle",
           "buffered", "xmap_readers", "multiprocess_reader", "map_readers", "chain", "compose",
           "firstn", "cache",
           "ComposeNotAligned"]


class DataLoader:
    """Fluid's ``fluid.io.DataLoader``: made with :meth:`from_generator`."""

    def __init__(self, *args, **kwargs):
        raise TypeError("DataLoader is made with DataLoader.from_generator(feed_list, capacity, "
                        "...) in static-graph programs")

    @staticmethod
    def from_generator(feed_list=None, capacity=None, use_double_buffer: bool = True,
                       iterable: bool = True, return_list: bool = False,
                       use_multiprocess: bool = False, drop_last: bool = True) -> GeneratorLoader:
        """A loader feeding ``feed_list`` (data Variables) from a Python generator.

        ``capacity``: batches kept ready by the background thread. ``iterable=False``: the
        loader feeds the runs of its program after ``start()`` until ``EOFException``.
        ``return_list``: iteration yields lists in ``feed_list`` order instead of dicts.
        ``drop_last``: with several places, drop a last group smaller than the places.
        ``use_multiprocess`` is accepted; the producer is a thread (conversion releases the GIL
        in NumPy).
        """
        return GeneratorLoader(feed_list, capacity, use_double_buffer, iterable, return_list,
                               drop_last)

    @staticmethod
    def from_dataset(dataset, places, drop_last: bool = True):
        raise NotImplementedError("DataLoader.from_dataset: fluid.Dataset (the C++ data feed) "
                                  "is not supported; use DataLoader.from_generator")


class PyReader(PyReaderLoader):
    """Fluid's ``fluid.io.PyReader``: a :class:`DataLoader` with the ``decorate_*`` names."""

    def __init__(self, feed_list=None, capacity=None, use_double_buffer: bool = True,
                 iterable: bool = True, return_list: bool = False):
        super().__init__(feed_list, capacity, use_double_buffer, iterable, return_list,
                         kind="PyReader")


# -- reader decorators ---------------------------------------------------------------------------
def batch(reader, batch_size, drop_last: bool = False):
    """A reader of lists of ``batch_size`` items of ``reader``; the last, shorter list is kept
    unless ``drop_last``."""
    check_reader(reader, "batch")
    check_batch_size(batch_size, "batch")
    return _batched(reader, batch_size, drop_last)


def shuffle(reader, buf_size):
    """Items of ``reader`` shuffled within consecutive windows of ``buf_size``."""
    check_reader(reader, "shuffle")
    if isinstance(buf_size, bool) or not isinstance(buf_size, int) or buf_size <= 0:
        raise ValueError(f"shuffle: buf_size must be a positive int, got {buf_size!r}")

    def shuffled():
        buf = []
        for item in reader():
            buf.append(item)
            if len(buf) >= buf_size:
                random.shuffle(buf)
                yield from buf
                buf = []
        if buf:
            random.shuffle(buf)
            yield from buf
    return shuffled


class _Raised:
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


_DONE = object()


def _pump(it, q: queue.Queue, stop: threading.Event) -> None:
    """Put every item of ``it`` into ``q`` (then ``_DONE``, or the exception raised)."""
    def put(item):
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False
    try:
        for item in it:
            if not put(item):
                return
        put(_DONE)
    except BaseException as e:
        put(_Raised(e))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def _drain(q: queue.Queue, stop: threading.Event, what: str, finished=1):
    """Yield the items of ``q`` until ``finished`` producers said ``_DONE``; re-raise what a
    producer raised (as a ReaderError chained to it); stop the producers when left early."""
    try:
        while finished:
            item = q.get()
            if item is _DONE:
                finished -= 1
            elif isinstance(item, _Raised):
                e = item.error
                raise ReaderError(f"{what}: the reader raised {type(e).__name__}: {e}") from e
            else:
                yield item
    finally:
        stop.set()


def buffered(reader, size):
    """``reader`` read ahead by a background thread into a buffer of ``size`` items."""
    check_reader(reader, "buffered")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"buffered: size must be a positive int, got {size!r}")

    def buffered_reader():
        q, stop = queue.Queue(maxsize=size), threading.Event()
        threading.Thread(target=_pump, args=(iter(reader()), q, stop), daemon=True,
                         name="pdjit-buffered").start()
        yield from _drain(q, stop, "buffered")
    return buffered_reader


def xmap_readers(mapper, reader, process_num, buffer_size, order: bool = False):
    """``mapper`` applied to the items of ``reader`` by ``process_num`` threads, through
    buffers of ``buffer_size``; ``order=True`` keeps the order of ``reader``."""
    check_reader(reader, "xmap_readers")
    if not callable(mapper):
        raise TypeError(f"xmap_readers: mapper must be callable, got {type(mapper).__name__}")
    for what, n in (("process_num", process_num), ("buffer_size", buffer_size)):
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"xmap_readers: {what} must be a positive int, got {n!r}")

    def xreader():
        stop = threading.Event()
        inq, outq = queue.Queue(maxsize=buffer_size), queue.Queue(maxsize=buffer_size)
        threading.Thread(target=_pump, args=(enumerate(reader()), inq, stop), daemon=True,
                         name="pdjit-xmap-read").start()
        lock = threading.Lock()
        ended = [False]

        def work():
            def mapped():
                while not stop.is_set():
                    with lock:  # one worker passes the end on: each worker must see it
                        if ended[0]:
                            return
                        while True:
                            try:
                                item = inq.get(timeout=0.05)
                                break
                            except queue.Empty:
                                if stop.is_set():
                                    return
                        if item is _DONE or isinstance(item, _Raised):
                            ended[0] = True
                            if isinstance(item, _Raised):
                                raise item.error
                            return
                    i, sample = item
                    yield i, mapper(sample)
            _pump(mapped(), outq, stop)

        for k in range(process_num):
            threading.Thread(target=work, daemon=True, name=f"pdjit-xmap-{k}").start()
        items = _drain(outq, stop, "xmap_readers", finished=process_num)
        if not order:
            for _, value in items:
                yield value
            return
        pending, want = {}, 0
        for i, value in items:
            pending[i] = value
            while want in pending:
                yield pending.pop(want)
                want += 1
    return xreader


def multiprocess_reader(readers, use_pipe: bool = True, queue_size: int = 1000):
    """The items of all ``readers`` read at once, by one background thread each (Fluid runs
    processes; the readers here share the process), into one buffer of ``queue_size`` items:
    each reader's items keep their order, the interleaving is whatever comes first.
    ``use_pipe`` is accepted (there is no pipe between threads)."""
    readers = list(readers) if isinstance(readers, (list, tuple)) else [readers]
    if not readers:
        raise ValueError("multiprocess_reader: readers is empty")
    for r in readers:
        check_reader(r, "multiprocess_reader")
    if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size <= 0:
        raise ValueError(f"multiprocess_reader: queue_size must be a positive int, got "
                         f"{queue_size!r}")

    def merged():
        q, stop = queue.Queue(maxsize=queue_size), threading.Event()
        for k, r in enumerate(readers):
            threading.Thread(target=_pump, args=(iter(r()), q, stop), daemon=True,
                             name=f"pdjit-multi-{k}").start()
        yield from _drain(q, stop, "multiprocess_reader", finished=len(readers))
    return merged


def map_readers(func, *readers):
    """``func`` applied to the items of ``readers`` taken together (stops at the shortest)."""
    for r in readers:
        check_reader(r, "map_readers")

    def mapped():
        for items in zip(*[r() for r in readers]):
            yield func(*items)
    return mapped


def chain(*readers):
    """The items of each reader in turn."""
    for r in readers:
        check_reader(r, "chain")

    def chained():
        for r in readers:
            yield from r()
    return chained


class ComposeNotAligned(ReaderError, ValueError):
    """``compose``: the readers gave different numbers of items."""


def compose(*readers, check_alignment: bool = True):
    """Tuples of the items of ``readers`` taken together (tuples items are flattened in).
    With ``check_alignment``, readers of different lengths are a ``ComposeNotAligned``."""
    for r in readers:
        check_reader(r, "compose")
    end = object()

    def as_tuple(x):
        return x if isinstance(x, tuple) else (x,)

    def composed():
        its = [iter(r()) for r in readers]
        while True:
            items = [next(it, end) for it in its]
            if all(x is end for x in items):
                return
            if any(x is end for x in items):
                if check_alignment:
                    raise ComposeNotAligned("compose: the readers gave different numbers of "
                                            "items")
                return
            yield sum((as_tuple(x) for x in items), ())
    return composed


def firstn(reader, n):
    """The first ``n`` items of ``reader``."""
    check_reader(reader, "firstn")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"firstn: n must be a non-negative int, got {n!r}")

    def first():
        for i, item in enumerate(reader()):
            if i >= n:
                return
            yield item
    return first


def cache(reader):
    """``reader``'s items, read once and kept in memory."""
    check_reader(reader, "cache")
    items = list(reader())

    def cached():
        yield from items
    return cached
