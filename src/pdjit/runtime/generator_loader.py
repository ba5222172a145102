"""Readers that feed a program from Python generators (``DataLoader.from_generator``,
``PyReader``, ``layers.py_reader``).

A :class:`GeneratorLoader` turns a user's generator into checked feed values in a background
thread, keeping up to ``capacity`` batches ready in a bounded queue, so that the next batch is
converted while ``Executor.run`` computes the current one.

- **Iterable** loaders are iterated: ``for feed in loader(): exe.run(feed=feed, ...)``. Each
  pass over the loader calls the generator afresh; leaving a pass early (``break``) or starting a
  new one stops the previous producer.
- **Non-iterable** loaders are attached to the program of their variables (as Fluid's reader
  ops are): after ``loader.start()``, a run of that program that does not feed the loader's
  variables takes the next batch (:func:`pending_feed`, called by the executor). When the
  generator is exhausted the run raises ``EOFException``; ``loader.reset()`` then
  ``loader.start()`` begin the next pass. ``reset()`` mid-pass stops the producer.

The producer threads are daemon threads named ``pdjit-reader-*``; a stopped producer closes the
user's generator (its ``finally`` blocks run) at its next ``yield``. An exception raised by the
generator reaches the user at the batch where it happened, as a :class:`ReaderError` chained to
it; a batch that does not fit its variables is a ``FeedError`` naming the variable and batch.
"""
from __future__ import annotations

import itertools
import queue
import threading
import weakref

from pdjit.framework.errors import EOFException, FeedError, PdjitError
from pdjit.framework.program import Variable
from pdjit.runtime import feed_fetch

__all__ = ["ReaderError", "GeneratorLoader", "PyReaderLoader", "pending_feed", "attached_readers"]

READERS = "_py_readers"          # the program attribute holding its non-iterable readers
_END = object()                # the producer's last item: the generator is exhausted
_POLL = 0.05                   # seconds between checks of the stop flag while blocked
_IDS = itertools.count()


class ReaderError(PdjitError, RuntimeError):
    """A reader's generator failed, or a reader was used the wrong way."""


class _Readers(list):
    """The readers attached to a program. Copies and pickles of the program do not take them
    (a copy is another program; threads and queues cannot be pickled)."""

    def __reduce__(self):
        return (_Readers, ())


def attached_readers(program) -> list:
    """The non-iterable readers attached to ``program`` (a list, possibly empty)."""
    return program.__dict__.get(READERS) or []


def _attach(program, reader) -> None:
    readers = program.__dict__.get(READERS)
    if readers is None:
        readers = program.__dict__[READERS] = _Readers()
    readers.append(reader)


def pending_feed(program, feed: dict) -> dict:
    """``feed`` with the next batch of each started reader attached to ``program`` added.

    O(1) for a program without readers. A started reader whose generator is exhausted raises
    ``EOFException``; a reader that is not started, whose variables the run does not feed, is
    a ``ReaderError`` saying to call ``start()``. Variables fed explicitly keep their values.
    """
    readers = program.__dict__.get(READERS)
    if not readers:
        return feed
    fed = {k if isinstance(k, str) else getattr(k, "name", k) for k in feed}
    out = dict(feed)
    for r in readers:
        for name, value in r._take_for_run(fed).items():
            if name not in fed:
                out[name] = value
    return out


# -- the producer ---------------------------------------------------------------------------------
class _Failure:
    """An exception raised while batch ``index`` was produced (by the generator, or while it
    was converted)."""

    __slots__ = ("error", "index")

    def __init__(self, error: BaseException, index: int):
        self.error, self.index = error, index


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL)
            return True
        except queue.Full:
            pass
    return False


def _produce(make, convert, q: queue.Queue, stop: threading.Event) -> None:
    """The producer thread: ``convert(item, index)`` every item of ``make()`` into ``q``."""
    it, index = None, 0
    try:
        it = iter(make())
        for item in it:
            if stop.is_set():
                return
            value = convert(item, index)
            if not _put(q, value, stop):
                return
            index += 1
        _put(q, _END, stop)
    except BaseException as e:  # the consumer raises it, at the batch where it happened
        _put(q, _Failure(e, index), stop)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()  # a stopped generator's finally blocks run now
            except BaseException:  # noqa: S110 - nothing to tell anyone: the pass is over
                pass


class _Prefetcher:
    """One pass over a generator: a daemon thread filling a queue of ``capacity`` batches."""

    def __init__(self, make, convert, capacity: int, label: str):
        self.label = label
        self.queue: queue.Queue = queue.Queue(maxsize=capacity)
        self.stop_event = threading.Event()
        self.done = False
        self.thread = threading.Thread(
            target=_produce, args=(make, convert, self.queue, self.stop_event),
            name=f"pdjit-reader-{next(_IDS)}", daemon=True)
        self.thread.start()
        # a pass nobody holds any more stops its producer
        self._finalizer = weakref.finalize(self, self.stop_event.set)

    def next(self):
        """The next converted batch, or ``_END`` once the generator is exhausted."""
        if self.done:
            return _END
        while True:
            try:
                item = self.queue.get(timeout=_POLL)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    try:
                        item = self.queue.get_nowait()
                        break
                    except queue.Empty:
                        self.done = True
                        raise ReaderError(f"{self.label}: its producer thread ended without a "
                                          f"batch or an error") from None
        if item is _END:
            self.done = True
            return _END
        if isinstance(item, _Failure):
            self.done = True
            e = item.error
            if isinstance(e, FeedError):
                raise FeedError(f"{self.label}, batch {item.index}: {e}") from e
            if isinstance(e, PdjitError):
                raise e
            raise ReaderError(f"{self.label}: the generator raised {type(e).__name__}: {e} "
                              f"(while producing batch {item.index})") from e
        return item

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the producer (at the generator's next ``yield``) and wait for it."""
        self.stop_event.set()
        self.done = True
        while True:  # unblock a producer waiting on a full queue
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)


# -- the loader -----------------------------------------------------------------------------------
def _check_places(places):
    if places is None:
        return None
    if isinstance(places, (list, tuple)):
        if not places:
            raise ValueError("DataLoader: places is an empty list")
        return list(places)
    return places


def _batched(reader, batch_size: int, drop_last: bool):
    """Groups the samples of ``reader()`` into lists of ``batch_size``."""
    def batch_reader():
        buf = []
        for sample in reader():
            buf.append(sample)
            if len(buf) == batch_size:
                yield buf
                buf = []
        if buf and not drop_last:
            yield buf
    return batch_reader


def check_batch_size(batch_size, what: str) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"{what}: batch_size must be a positive int, got {batch_size!r}")
    return batch_size


def check_reader(reader, what: str):
    """A reader creator: a callable returning an iterable of items."""
    if not callable(reader):
        hint = ""
        if hasattr(reader, "__next__"):
            hint = " (pass the generator function itself, not the generator it returns)"
        raise TypeError(f"{what}: expected a callable that returns an iterator (a reader "
                        f"creator, e.g. a generator function), got {type(reader).__name__}{hint}")
    return reader


def _convert_batch(names, specs, item) -> dict:
    """One batch from a batch generator -> ``{name: checked value}``."""
    if isinstance(item, dict):
        missing = [n for n in names if n not in item]
        if missing:
            raise FeedError(f"the batch dict lacks {missing} (it has {list(item)})")
        values = [item[n] for n in names]
    elif isinstance(item, (list, tuple)):
        if len(item) != len(names):
            raise FeedError(f"the batch has {len(item)} value(s), expected {len(names)} "
                            f"(one per variable of feed_list {names})")
        values = item
    else:
        raise FeedError(f"a batch must be a list/tuple of arrays in feed_list order or a "
                        f"dict by name, got {type(item).__name__}")
    return {n: feed_fetch.check_feed_spec(spec, v) for n, spec, v in zip(names, specs, values)}


class GeneratorLoader:
    """Feeds ``feed_list`` from a Python generator, prefetching in a background thread.

    Made by ``DataLoader.from_generator`` / ``PyReader`` / ``layers.py_reader``; see the module
    docstring. ``capacity`` is the number of batches kept ready.
    """

    def __init__(self, feed_list, capacity, use_double_buffer: bool = True,
                 iterable: bool = True, return_list: bool = False, drop_last: bool = True,
                 name: str | None = None, kind: str = "DataLoader"):
        if feed_list is None:
            raise ValueError(f"{kind}: feed_list is required (the data variables it feeds)")
        if isinstance(feed_list, Variable):
            feed_list = [feed_list]
        feed_list = list(feed_list)
        if not feed_list:
            raise ValueError(f"{kind}: feed_list is empty")
        for i, v in enumerate(feed_list):
            if not isinstance(v, Variable):
                raise TypeError(f"{kind}: feed_list[{i}] must be a Variable (from "
                                f"fluid.data / layers.data), got {type(v).__name__}: {v!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"{kind}: capacity must be a positive int (the number of batches "
                             f"kept ready), got {capacity!r}")
        self._feed_list = feed_list
        self._names = [v.name for v in feed_list]
        self._specs = [feed_fetch.feed_spec(v) for v in feed_list]
        self._capacity = capacity
        self._use_double_buffer = bool(use_double_buffer)
        self._iterable = bool(iterable)
        self._return_list = bool(return_list)
        self._drop_last = bool(drop_last)
        self._kind = kind
        self.name = name
        self._label = (f"{kind}{'' if name is None else ' ' + repr(name)} feeding "
                       f"{', '.join(repr(n) for n in self._names)}")
        self._make = None          # the batch generator creator: () -> iterator of batches
        self._convert = None       # (item, index) -> {name: value}
        self._places = None
        self._pass: _Prefetcher | None = None
        self._lock = threading.Lock()
        self._program = feed_list[0].block.program
        if not self._iterable:
            _attach(self._program, self)

    # -- configuration --------------------------------------------------------------------------
    @property
    def iterable(self) -> bool:
        return self._iterable

    def set_sample_generator(self, reader, batch_size, drop_last: bool = True, places=None):
        """Batches of ``batch_size`` samples from ``reader()`` (each sample: one field per
        variable); an incomplete last batch is dropped when ``drop_last``."""
        check_reader(reader, f"{self._kind}.set_sample_generator")
        check_batch_size(batch_size, f"{self._kind}.set_sample_generator")
        return self.set_sample_list_generator(_batched(reader, batch_size, drop_last), places)

    def set_sample_list_generator(self, reader, places=None):
        """Each item of ``reader()`` is a list of samples: converted as ``DataFeeder.feed``
        does (LoD from nested lists for variables with ``lod_level > 0``)."""
        from pdjit.runtime.data_feeder import DataFeeder  # (framework + runtime.tensor only)
        check_reader(reader, f"{self._kind}.set_sample_list_generator")
        feeder = DataFeeder(self._feed_list, program=self._program)

        def convert(item, index):
            try:
                return feeder.feed(item)
            except TypeError as e:
                raise FeedError(f"a sample list was expected: {e}") from None
        self._configure(reader, convert, places)
        return self

    def set_batch_generator(self, reader, places=None):
        """Each item of ``reader()`` is a whole batch: a list/tuple of values (arrays or
        LoDTensors) in ``feed_list`` order, or a dict by variable name."""
        check_reader(reader, f"{self._kind}.set_batch_generator")
        # the producer thread must not hold the loader: a loader nobody holds stops it
        names, specs = self._names, self._specs

        def convert(item, index):
            return _convert_batch(names, specs, item)
        self._configure(reader, convert, places)
        return self

    def _configure(self, make, convert, places):
        self._stop_pass()
        self._make, self._convert = make, convert
        self._places = _check_places(places) if self._iterable else None

    # -- passes ---------------------------------------------------------------------------------
    def _new_pass(self) -> _Prefetcher:
        if self._make is None:
            raise ReaderError(f"{self._label}: no generator is set; call set_sample_generator, "
                              f"set_sample_list_generator or set_batch_generator first")
        self._stop_pass()
        self._pass = _Prefetcher(self._make, self._convert, self._capacity, self._label)
        return self._pass

    def _stop_pass(self) -> None:
        p, self._pass = self._pass, None
        if p is not None:
            p.stop()

    # iterable mode -----------------------------------------------------------------------------
    def __call__(self):
        return self.__iter__()

    def __iter__(self):
        if not self._iterable:
            raise ReaderError(f"{self._label} is not iterable (iterable=False): call start() "
                              f"and run the program without feeding it, until EOFException")
        self._new_pass()
        return self

    def __next__(self):
        p = self._pass
        if p is None:
            raise StopIteration
        places = self._places
        if isinstance(places, list):
            group = []
            for _ in places:
                batch = p.next()
                if batch is _END:
                    break
                group.append(self._shape_out(batch))
            if len(group) == len(places) or (group and not self._drop_last):
                return group
            self._finish(p)
            raise StopIteration
        batch = p.next()
        if batch is _END:
            self._finish(p)
            raise StopIteration
        return self._shape_out(batch)

    def _finish(self, p) -> None:
        if self._pass is p:
            self._pass = None
        p.stop()

    def _shape_out(self, batch: dict):
        if self._return_list:
            return [batch[n] for n in self._names]
        return batch

    # non-iterable mode -------------------------------------------------------------------------
    def start(self) -> None:
        """Start producing batches for runs of the program (non-iterable mode)."""
        if self._iterable:
            raise ReaderError(f"{self._label}: start() is for non-iterable loaders; iterate "
                              f"this one (for feed in loader(): ...)")
        with self._lock:
            if self._pass is not None:
                raise ReaderError(f"{self._label} is already started: call reset() after "
                                  f"EOFException (or to abandon the pass) before start()")
            self._new_pass()

    def reset(self) -> None:
        """End the current pass (stopping its producer); ``start()`` begins the next."""
        if self._iterable:
            raise ReaderError(f"{self._label}: reset() is for non-iterable loaders")
        with self._lock:
            self._stop_pass()

    def _take_for_run(self, fed: set) -> dict:
        """The next batch for a run of the program (``pending_feed``)."""
        p = self._pass
        if p is None:
            if all(n in fed for n in self._names):
                return {}
            raise ReaderError(f"{self._label} is not started: call start() before "
                              f"Executor.run (and reset() then start() after EOFException), "
                              f"or feed {self._names} explicitly")
        batch = p.next()
        if batch is _END:
            raise EOFException(f"{self._label} has no more batches: call reset(), then start() "
                               f"for the next pass")
        return batch

    def __del__(self):
        p = self.__dict__.get("_pass")
        if p is not None:
            p.stop_event.set()


class PyReaderLoader(GeneratorLoader):
    """A loader with the older ``decorate_*`` names (``PyReader``, ``layers.py_reader``)."""

    def decorate_sample_generator(self, sample_generator, batch_size, drop_last: bool = True,
                                  places=None):
        return self.set_sample_generator(sample_generator, batch_size, drop_last, places)

    def decorate_sample_list_generator(self, reader, places=None):
        return self.set_sample_list_generator(reader, places)

    def decorate_batch_generator(self, reader, places=None):
        return self.set_batch_generator(reader, places)

    # the names of Fluid 1.x before 1.5
    decorate_paddle_reader = decorate_sample_list_generator
    decorate_tensor_provider = decorate_batch_generator
