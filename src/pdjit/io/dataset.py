"""Fluid 1.x's datasets: ``fluid.DatasetFactory().create_dataset("InMemoryDataset" |
"QueueDataset")``, fed to ``Executor.train_from_dataset`` / ``infer_from_dataset``.

A dataset reads text files in Fluid's *MultiSlot* format. Each file goes through the pipe command
(``set_pipe_command``, default ``cat``), run as a real shell subprocess with the file as its
standard input; each line of its output is one instance holding, for each variable of
``set_use_var`` in that order, a count ``n >= 1`` and then ``n`` values::

    3 11 52 7 1 0.25 1 1        # slot "ids": 3 values; slot "dense": 1; slot "label": 1

Variables of dtype ``int64`` read integers (Fluid's ``uint64`` feature signs: values past
``2**63 - 1`` wrap to negative ``int64``, as a C cast does), ``float32`` ones read floats. A
variable with ``lod_level >= 1`` becomes a LoD tensor ``[total values, 1]`` whose one level
holds each instance's values; a ``lod_level == 0`` one a dense ``[batch] + shape[1:]`` tensor,
each instance giving exactly ``prod(shape[1:])`` values (when those dims are known). Blank lines
are skipped. A line that does not fit raises :class:`DatasetError` naming the file, the line
number, the slot and what was expected; a pipe command that fails names the file and the
command with its standard error.

``InMemoryDataset`` reads every file into memory with ``load_into_memory()`` (files in parallel,
``set_thread`` subprocesses at a time; the instances keep the files' order), then may
``local_shuffle()`` / ``global_shuffle()`` (in one process both shuffle the instances held here),
and serves them until ``release_memory()``. ``QueueDataset`` streams the files again on each
run and cannot shuffle. Batches hold ``set_batch_size`` instances (the last one fewer) and run in
order on the executor's thread: one schedule of the ``set_thread`` Hogwild threads Fluid would
run, giving one sequence of parameter updates.
"""
from __future__ import annotations

import concurrent.futures
import subprocess
import threading
from typing import Iterator

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import PdjitError
from pdjit.framework.program import Variable
from pdjit.runtime.tensor import LoDTensor

__all__ = ["DatasetFactory", "DatasetBase", "InMemoryDataset", "QueueDataset", "DatasetError"]

_KINDS = {"float32": ("float", np.float32), "int64": ("uint64", np.int64)}


class DatasetError(PdjitError, ValueError):
    """A dataset's files, lines or settings do not fit what it was told to read."""


class DatasetFactory:
    """``DatasetFactory().create_dataset(name)``: a new ``InMemoryDataset`` or
    ``QueueDataset`` (the default)."""

    def create_dataset(self, datafeed_class="QueueDataset"):
        kinds = {"InMemoryDataset": InMemoryDataset, "QueueDataset": QueueDataset}
        kind = kinds.get(datafeed_class)
        if kind is None:
            raise DatasetError(f"DatasetFactory.create_dataset: datafeed_class "
                               f"{datafeed_class!r} does not exist: expected one of "
                               f"{', '.join(kinds)}")
        return kind()


class _Slot:
    """One used variable: its name, how its values parse and the tensor they make."""

    def __init__(self, var: Variable, index: int):
        dt = dtypes.dtype_str(var.dtype) if var.dtype is not None else None
        if dt not in _KINDS:
            raise DatasetError(f"set_use_var: variable {var.name!r} has dtype {dt}: a dataset "
                               f"reads float32 and int64 variables only")
        self.name, self.index = var.name, index
        self.kind, self.dtype = _KINDS[dt]
        self.dense = int(var.lod_level or 0) == 0
        self.dims = [int(d) for d in list(var.shape)[1:]]
        self.width = int(np.prod(self.dims)) if self.dense and all(d > 0 for d in self.dims) \
            else None

    def values(self, tokens, where: str) -> np.ndarray:
        """The tokens as this slot's values (``where``: the file, line and slot, for errors)."""
        try:
            return np.array(tokens, dtype=np.float64 if self.kind == "float" else np.int64) \
                .astype(self.dtype, copy=False)
        except (ValueError, OverflowError):
            pass
        out = []
        for t in tokens:  # find the bad token, or wrap feature signs past int64's range
            try:
                out.append(float(t) if self.kind == "float" else _wrap(int(t)))
            except ValueError:
                raise DatasetError(f"{where}: value {t!r} is not "
                                   f"{'a number' if self.kind == 'float' else 'an integer'} "
                                   f"(the slot reads {self.kind} values)") from None
        return np.array(out, dtype=self.dtype)


def _wrap(v: int) -> int:
    if not -2 ** 63 <= v < 2 ** 64:
        raise ValueError(v)
    return v - 2 ** 64 if v >= 2 ** 63 else v


def parse_multislot(text: str, slots: list, filename: str) -> list:
    """The instances of ``text`` (a pipe command's output for ``filename``): per line, one
    array per slot."""
    out = []
    n = len(slots)
    for lineno, line in enumerate(text.splitlines(), 1):
        toks = line.split()
        if not toks:
            continue
        where = f"file {filename!r}, line {lineno}"
        pos, inst = 0, []
        for slot in slots:
            what = f"slot {slot.name!r} ({slot.index + 1} of {n})"
            if pos >= len(toks):
                raise DatasetError(f"{where}: {what} is missing: the line ends after "
                                   f"{len(toks)} tokens; expected a count and values for each "
                                   f"of {[s.name for s in slots]}")
            try:
                count = int(toks[pos])
            except ValueError:
                count = None
            if count is None or count < 1:
                raise DatasetError(f"{where}: {what}: expected a count of values >= 1, got "
                                   f"{toks[pos]!r} (pad an empty slot with a value)")
            vals = toks[pos + 1:pos + 1 + count]
            if len(vals) < count:
                raise DatasetError(f"{where}: {what} declares {count} values, the line holds "
                                   f"{len(vals)} after it")
            if slot.width is not None and count != slot.width:
                raise DatasetError(f"{where}: {what} is dense of shape {[-1] + slot.dims}: "
                                   f"expected {slot.width} values per instance, got {count}")
            inst.append(slot.values(vals, f"{where}: {what}"))
            pos += 1 + count
        if pos != len(toks):
            raise DatasetError(f"{where}: {len(toks) - pos} tokens after the last slot "
                               f"{slots[-1].name!r}: expected exactly the slots "
                               f"{[s.name for s in slots]}")
        out.append(inst)
    return out


def make_batch(instances: list, slots: list) -> dict:
    """The feed dict of a batch of instances: LoD tensors for sequence slots, dense arrays for
    the others."""
    feed = {}
    b = len(instances)
    for i, slot in enumerate(slots):
        parts = [inst[i] for inst in instances]
        data = np.concatenate(parts) if parts else np.zeros(0, slot.dtype)
        if slot.dense:
            if slot.width is None and len({len(p) for p in parts}) > 1:
                raise DatasetError(f"dataset: dense slot {slot.name!r} of shape "
                                   f"{[-1] + slot.dims}: its instances in one batch hold "
                                   f"{sorted({len(p) for p in parts})} values: expected one "
                                   f"count for all (or declare lod_level=1)")
            feed[slot.name] = data.reshape([b] + (slot.dims if slot.width is not None
                                                  else [-1]))
        else:
            offs = np.zeros(b + 1, np.int64)
            np.cumsum([len(p) for p in parts], out=offs[1:])
            feed[slot.name] = LoDTensor(data.reshape(-1, 1), [offs])
    return feed


class DatasetBase:
    """What both datasets share: the settings of Fluid's ``DatasetBase``."""

    def __init__(self):
        self.pipe_command = "cat"
        self.batch_size = 1
        self.thread_num = 1
        self.filelist: list = []
        self.use_vars: list = []
        self._slots: list = []
        self.hdfs_config = None
        self.download_cmd = None

    # -- settings --------------------------------------------------------------------------------
    def set_pipe_command(self, pipe_command):
        """The shell command each file is piped through (its output: MultiSlot lines)."""
        if not isinstance(pipe_command, str) or not pipe_command.strip():
            raise DatasetError(f"set_pipe_command: expected a shell command (a non-empty str), "
                               f"got {pipe_command!r}")
        self.pipe_command = pipe_command

    def set_batch_size(self, batch_size):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
                batch_size < 1:
            raise DatasetError(f"set_batch_size: expected an int >= 1, got {batch_size!r}")
        self.batch_size = int(batch_size)

    def set_thread(self, thread_num):
        if isinstance(thread_num, bool) or not isinstance(thread_num, (int, np.integer)) or \
                thread_num < 1:
            raise DatasetError(f"set_thread: expected an int >= 1, got {thread_num!r}")
        self.thread_num = int(thread_num)

    def set_filelist(self, filelist):
        if isinstance(filelist, str) or not all(isinstance(f, str) for f in filelist):
            raise DatasetError(f"set_filelist: expected a list of file names, got "
                               f"{filelist!r}")
        self.filelist = list(filelist)

    def set_use_var(self, var_list):
        """The variables each line fills, in the order of the line's slots."""
        vars_ = list(var_list)
        for v in vars_:
            if not isinstance(v, Variable):
                raise DatasetError(f"set_use_var: expected Variables (fluid.data / "
                                   f"layers.data), got {type(v).__name__}")
        names = [v.name for v in vars_]
        if len(set(names)) != len(names):
            raise DatasetError(f"set_use_var: a variable is named twice in {names}")
        self.use_vars = vars_
        self._slots = [_Slot(v, i) for i, v in enumerate(vars_)]

    def set_hdfs_config(self, fs_name, fs_ugi):
        self.hdfs_config = (fs_name, fs_ugi)

    def set_download_cmd(self, download_cmd):
        self.download_cmd = download_cmd

    def desc(self) -> str:
        """The settings as text (Fluid prints its data feed's protobuf)."""
        slots = "".join(
            f"  slots {{\n    name: {s.name!r}\n    type: {s.kind!r}\n    is_dense: "
            f"{str(s.dense).lower()}\n    is_used: true\n  }}\n" for s in self._slots)
        return (f"name: {type(self).__name__!r}\nbatch_size: {self.batch_size}\n"
                f"multi_slot_desc {{\n{slots}}}\npipe_command: {self.pipe_command!r}\n"
                f"thread_num: {self.thread_num}\n")

    # -- reading -----------------------------------------------------------------------------------
    def _check_ready(self, what: str) -> None:
        if not self._slots:
            raise DatasetError(f"{what}: no variables to fill: call set_use_var first")
        if not self.filelist:
            raise DatasetError(f"{what}: no files to read: call set_filelist first")

    def _read_file(self, filename: str, slots: list) -> list:
        try:
            src = open(filename, "rb")
        except OSError as e:
            raise DatasetError(f"dataset: cannot open file {filename!r}: {e.strerror}") \
                from None
        with src:
            proc = subprocess.run(self.pipe_command, shell=True, stdin=src,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()[-500:]
            raise DatasetError(f"dataset: the pipe command {self.pipe_command!r} failed on "
                               f"file {filename!r} (exit status {proc.returncode})"
                               + (f": {err}" if err else ""))
        return parse_multislot(proc.stdout.decode(errors="replace"), slots, filename)

    def _read_all(self, files: list) -> Iterator:
        """Each file's instances, in the files' order; up to ``thread_num`` files read (and
        their subprocesses run) at once."""
        slots = list(self._slots)
        if self.thread_num <= 1 or len(files) <= 1:
            for f in files:
                yield self._read_file(f, slots)
            return
        with concurrent.futures.ThreadPoolExecutor(self.thread_num) as pool:
            for part in pool.map(lambda f: self._read_file(f, slots), files):
                yield part

    def _batched(self, parts) -> Iterator:
        pending: list = []
        for part in parts:
            pending.extend(part)
            while len(pending) >= self.batch_size:
                yield make_batch(pending[:self.batch_size], self._slots)
                del pending[:self.batch_size]
        if pending:
            yield make_batch(pending, self._slots)

    def _feeds(self) -> Iterator:
        """The feed dicts of one pass (``Executor.train_from_dataset`` reads them)."""
        raise NotImplementedError


class InMemoryDataset(DatasetBase):
    """Fluid's ``InMemoryDataset``: the instances of every file, held in memory."""

    def __init__(self):
        super().__init__()
        self._memory: list | None = None
        self._preload: threading.Thread | None = None
        self._preload_error: BaseException | None = None
        self._released = False
        self._rng = np.random.default_rng()

    def load_into_memory(self):
        """Read every file (through the pipe command) into memory."""
        self._check_ready("load_into_memory")
        self._memory = [inst for part in self._read_all(self.filelist) for inst in part]
        self._released = False

    def preload_into_memory(self, thread_num=None):
        """Start :meth:`load_into_memory` in the background; :meth:`wait_preload_done` waits."""
        if thread_num is not None:
            self.set_thread(thread_num)
        self._check_ready("preload_into_memory")

        def work():
            try:
                self.load_into_memory()
            except BaseException as e:  # noqa: BLE001 - handed to wait_preload_done
                self._preload_error = e

        self._preload_error = None
        self._preload = threading.Thread(target=work, daemon=True)
        self._preload.start()

    def wait_preload_done(self):
        if self._preload is not None:
            self._preload.join()
            self._preload = None
        if self._preload_error is not None:
            e, self._preload_error = self._preload_error, None
            raise e

    def _loaded(self, what: str) -> list:
        if self._memory is None:
            raise DatasetError(f"{what}: nothing is in memory: call load_into_memory() first"
                               + (" (its memory was released)" if self._released else ""))
        return self._memory

    def local_shuffle(self):
        """Shuffle the instances in memory."""
        mem = self._loaded("local_shuffle")
        order = self._rng.permutation(len(mem))
        self._memory = [mem[i] for i in order]

    def global_shuffle(self, fleet=None, thread_num=12):
        """Shuffle across trainers: in one process, the instances held here."""
        self._loaded("global_shuffle")
        self.local_shuffle()

    def release_memory(self):
        self._memory = None
        self._released = True

    def get_memory_data_size(self, fleet=None) -> int:
        """The number of instances in memory."""
        return len(self._loaded("get_memory_data_size"))

    def get_shuffle_data_size(self, fleet=None) -> int:
        return len(self._loaded("get_shuffle_data_size"))

    def _feeds(self):
        mem = self._loaded("train_from_dataset")
        return self._batched([mem])


class QueueDataset(DatasetBase):
    """Fluid's ``QueueDataset``: the files streamed again on every run."""

    def local_shuffle(self):
        raise DatasetError("QueueDataset does not support local_shuffle: use InMemoryDataset")

    def global_shuffle(self, fleet=None, thread_num=12):
        raise DatasetError("QueueDataset does not support global_shuffle: use "
                           "InMemoryDataset")

    def _feeds(self):
        self._check_ready("train_from_dataset")
        return self._batched(self._read_all(self.filelist))
