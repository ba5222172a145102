"""A disk cache of optimized inference models: what the inference passes make of a model.

The passes (``pdjit.passes.inference``: test mode, no-op removal, batch-norm folding, constant
folding) and the check of the model before them (``pdjit.verify``) give the same program and
parameters every time for the same model files, passes and pdjit sources; a Predictor that
finds their result here reads it instead of redoing them (measured on ResNet-50: ~0.17 s of
CPU less per process, the folding of 25 M weights among them).

An entry is one file, ``<cache dir>/models/<key>.pdopt`` (the cache directory of
``pdjit.codegen.diskcache.cache_dir``, ``PDJIT_CACHE_DIR``; ``clear_cache()`` removes it with
the rest). Its key is a SHA-256 of:

- the model file's bytes;
- the parameter file's size and modification and change times (per-variable files: every
  file of the model's directory); a parameter file changed in place is a new key, and its
  bytes are not hashed (that would cost as much as the folding saved). A file system's
  times are coarse (a tick of milliseconds): a file written again within the tick of its last
  write, at the same size, would look unchanged. So an entry made while a parameter file was
  modified less than two seconds ago (``racy``, as Git calls its index entries) holds a
  SHA-256 of the parameter files' bytes, which a load compares with the files until it
  matched once while they were no longer racy (a marker file records that; a change after
  that shows in their times);
- the passes applied, in order;
- pdjit's version and the size and modification time of every source file of the packages
  that decide the result (``framework``, ``ops``, ``passes``, ``io``, ``proto``, and the
  targets' lowerings and library that answer the passes which ask the target).

The file: a magic line, the length of a JSON header and the header (feed and fetch names,
each parameter's name, dtype, shape and offset, the key, the lengths of the parts and the
SHA-256 of the program's bytes), the SHA-256 of the header, the optimized program's
``ProgramDesc`` bytes, then each parameter's raw bytes at an offset aligned to 64 bytes. It is
written to a temporary file and renamed into place, so a reader never sees half of it. A file
whose magic, header, header digest, program digest, key or size is not right is ignored and
written again (the parameters' bytes are not checksummed on load: reading 100 MB through a
hash costs about what the cache saves). The parameters are mapped from the file copy-on-write:
the arrays are writable, and writing one never changes the file. With
``Config.switch_optimized_cache(False)`` a Predictor neither reads nor writes entries. A
program stored as ``pdjit.verify`` left it is marked verified when loaded (the Executor does
not check it again).

Beside an entry, ``<entry>-derived.pdvals`` (:class:`DerivedValues`, the same layout) holds
what the CPU kernels derived from its parameters (packed and transformed filters): a warm
ResNet-50's first run packed 15 M values in 55-70 ms, where mapping them costs a few
(anonymous memory's page faults were most of it).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import pathlib
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from pdjit.framework.files import write_whole
from pdjit.version import __version__

MAGIC = b"pdjit-optimized-model 2\n"
SUBDIR = "models"
_ALIGN = 64
#: a parameter file changed less than this many seconds ago is racy: its entry holds the
#: files' digest (``model_key``, ``_content_matches``)
RACY_SECONDS = 2.0
_SOURCE_PACKAGES = ("framework", "ops", "passes", "io", "proto",
                    # (the targets' answers to the passes that ask them: which convolutions
                    # run channels-last, which attention fuses)
                    "codegen", "codegen/cpu", "codegen/cpu/lowerings", "codegen/cpu/lib",
                    "codegen/cuda", "codegen/cuda/lowerings", "codegen/cuda/lib")
_stamp: list = []
#: what reading an entry that is not right may raise (it is then made again)
_NOT_RIGHT = (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError,
              RecursionError, struct.error)


def _cache_dir() -> pathlib.Path:
    from pdjit.codegen.diskcache import cache_dir

    return cache_dir() / SUBDIR


def sources_stamp() -> str:
    """pdjit's version and the size and modification time of the sources the result depends
    on (once per process)."""
    if not _stamp:
        root = pathlib.Path(__file__).resolve().parents[1]
        h = hashlib.sha256(__version__.encode())
        for pkg in _SOURCE_PACKAGES:
            for f in sorted((root / pkg).glob("*.py")):
                st = f.stat()
                h.update(f"{pkg}/{f.name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
        _stamp.append(h.hexdigest())
    return _stamp[0]


@dataclass(frozen=True)
class ModelKey:
    """An optimized model's key (``key``), the parameter files it stands for (``files``),
    whether one of them was modified less than :data:`RACY_SECONDS` ago (``racy``) and a
    digest of where they are (``where``: the entries of one location replace each other)."""
    key: str
    files: tuple
    racy: bool
    where: str = ""  # the parameters' location: an entry replaces older ones of the same


def _file_identity(path: str, now: float) -> tuple:
    """``(the file's identity, whether it is racy)``: device, inode, size and modification
    and change times (two files of one size written in one tick of a coarse clock differ by
    their inodes); racy when modified or changed (``cp -p`` keeps an old mtime) less than
    :data:`RACY_SECONDS` ago."""
    st = os.stat(path)
    ident = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    return ident, now - max(st.st_mtime, st.st_ctime) < RACY_SECONDS


def model_key(model_bytes: bytes, params_dir: str, params_name: str | None,
              passes, target: str = "cpu") -> ModelKey:
    """The key of the optimized form of a model (see the module's docstring) for the passes
    ``passes`` and the ``target`` the model runs on (a pass may ask it)."""
    h = hashlib.sha256(sources_stamp().encode())
    h.update(b"\0passes:" + ",".join(passes).encode() + b"\0")
    h.update(b"target:" + target.encode() + b"\0")
    h.update(b"dir:" + os.path.realpath(params_dir).encode() + b"\0")
    h.update(hashlib.sha256(model_bytes).digest())
    now, racy, files = time.time(), False, []
    if params_name is not None:
        names = [params_name]
    else:  # one file per variable: every file beside the model
        names = [n for n in sorted(os.listdir(params_dir))
                 if os.path.isfile(os.path.join(params_dir, n))]
    for name in names:
        path = os.path.join(params_dir, name)
        ident, fresh = _file_identity(path, now)
        h.update(f"{name}:{ident}\0".encode())
        racy = racy or fresh
        files.append(path)
    where = hashlib.sha256(os.path.realpath(params_dir).encode() + b"\0"
                           + (params_name or "").encode()).hexdigest()[:16]
    return ModelKey(h.hexdigest(), tuple(files), racy, where)


def content_digest(files) -> str:
    """A SHA-256 of the parameter files' names and bytes."""
    h = hashlib.sha256()
    for path in files:
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def _stem(mk: ModelKey) -> str:
    """``<where>-<key>``: the name every file of ``mk``'s entry begins with (the entry, its
    derived values, its markers; :func:`_entry_name` reads it back from a file's name)."""
    return f"{mk.where}-{mk.key[:40]}"


def _checked_marker(mk: ModelKey, digest: str) -> pathlib.Path:
    """The file saying that the parameter files of ``mk`` were found to hold the bytes of
    ``digest`` at a time their modification times were old enough to tell a later change."""
    return _cache_dir() / f"{_stem(mk)}-{digest[:32]}.checked"


def entry_path(mk: ModelKey) -> pathlib.Path:
    return _cache_dir() / f"{_stem(mk)}.pdopt"


#: the most bytes the entries of the cache's ``models`` directory take together (with their
#: derived values and markers): after an entry is written, the least recently used others
#: (by modification time, which a load moves on) are removed until the rest fit. One entry is
#: kept per model location, but a program that loads models from new directories (temporary
#: ones, a benchmark's) would otherwise add one at each load: ResNet-50's entry and its derived
#: values take ~160 MB, and a day of benchmarks had left 1.7 GB
MAX_BYTES = 2 << 30


def _entry_name(path: pathlib.Path) -> str:
    """``<where>-<key>``: the entry a file of the directory belongs to (the entry itself, its
    derived values, its markers)."""
    return "-".join(path.name.split(".", 1)[0].split("-", 2)[:2])


def _trim(keep: pathlib.Path) -> None:
    """Remove the least recently used entries of ``keep``'s directory, each with its derived
    values and markers, until the rest take at most :data:`MAX_BYTES` (``keep`` stays)."""
    groups: dict = {}  # "<where>-<key>" -> [newest modification time, bytes, paths]
    try:
        names = list(keep.parent.iterdir())
    except OSError:
        return
    for path in names:
        if path.name.startswith("."):  # (a file being written: write_whole's)
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        g = groups.setdefault(_entry_name(path), [0.0, 0, []])
        g[0], g[1] = max(g[0], st.st_mtime), g[1] + st.st_size
        g[2].append(path)
    total = sum(g[1] for g in groups.values())
    mine = _entry_name(keep)
    for name, (_, size, paths) in sorted(groups.items(), key=lambda kv: kv[1][0]):
        if total <= MAX_BYTES:
            break
        if name == mine:
            continue
        for path in paths:
            try:
                path.unlink()
            except OSError:
                pass
        total -= size


def _evict_others(mk: ModelKey, keep: pathlib.Path) -> None:
    """Remove the older entries (and markers) of the parameters' location of ``mk``: one
    entry per model location (a script that saves and loads a model every epoch keeps one
    copy of its weights, not one per epoch)."""
    for old in keep.parent.glob(f"{mk.where}-*"):
        if old != keep and not old.name.startswith(f"{_stem(mk)}-"):
            try:
                old.unlink()
            except OSError:
                pass


def racy_digest(mk: ModelKey):
    """The parameter files' :func:`content_digest` where ``mk`` is racy (taken before they are
    read, so that a rewrite while they are read and optimized cannot be taken for them), else
    ``None``; ``False`` where they cannot be read."""
    if not mk.racy:
        return None
    try:
        return content_digest(mk.files)
    except OSError:
        return False


def builtin_only(program) -> bool:
    """Whether every op of ``program`` has pdjit's own definition: a user's op (``define_op``)
    may change with the user's code, which no key here sees."""
    from pdjit.framework import registry

    return all(registry.is_builtin(op.type) for b in program.blocks for op in b.ops)


def _plain(value) -> bool:
    """Whether ``value`` is an array an entry can hold (its bytes are all of it)."""
    return type(value) is np.ndarray and not value.dtype.hasobject and \
        np.dtype(value.dtype.str) == value.dtype


def _write(path: pathlib.Path, magic: bytes, meta: dict, blob: bytes, arrays) -> bool:
    """Write an entry: ``magic``, the length of the JSON header (``meta`` with each array's
    dtype, shape and offset as ``arrays``, ``blob``'s length and digest and the data's
    length), the header's SHA-256, ``blob``, then the arrays' bytes, each at an offset
    aligned to :data:`_ALIGN`; durable (the header's digests do not cover the arrays)."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    layout, offset = [], 0
    for a in arrays:
        offset = -(-offset // _ALIGN) * _ALIGN
        layout.append([a.dtype.str, list(a.shape), offset])
        offset += a.nbytes
    header = json.dumps({**meta, "arrays": layout, "program_len": len(blob),
                         "program_sha256": hashlib.sha256(blob).hexdigest(),
                         "data_len": offset}, separators=(",", ":")).encode()
    head = magic + struct.pack("<Q", len(header)) + header + hashlib.sha256(header).digest()
    start = -(-(len(head) + len(blob)) // _ALIGN) * _ALIGN

    def write(f):
        f.write(head + blob + b"\0" * (start - len(head) - len(blob)))
        pos = 0
        for (_, _, off), a in zip(layout, arrays):
            f.write(b"\0" * (off - pos))
            f.write(memoryview(a.reshape(-1)).cast("B"))
            pos = off + a.nbytes

    return write_whole(path, write, durable=True)


def _read(path: pathlib.Path, magic: bytes, accept):
    """``(meta, blob, arrays)`` of the entry :func:`_write` wrote at ``path``, or ``None``
    where there is none or it is not right (magic, header digest, ``accept(meta)``, blob
    digest, size, arrays overlapping or past the data). The arrays are views of the file
    mapped copy-on-write (:func:`_data`)."""
    try:
        f = open(path, "rb")
    except OSError:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(len(magic) + 8)
        if len(head) != len(magic) + 8 or head[:len(magic)] != magic:
            return None
        (n,) = struct.unpack("<Q", head[len(magic):])
        if n > size:
            return None
        header = f.read(n)
        digest = f.read(32)
        if len(header) != n or hashlib.sha256(header).digest() != digest:
            return None
        meta = json.loads(header)
        if type(meta) is not dict or not accept(meta):
            return None
        blob = f.read(meta["program_len"])
        if hashlib.sha256(blob).hexdigest() != meta["program_sha256"]:
            return None
        start = -(-(len(magic) + 8 + n + 32 + len(blob)) // _ALIGN) * _ALIGN
        if size != start + meta["data_len"]:
            return None
        data = _data(f, start, meta["data_len"])
    arrays, end = [None] * len(meta["arrays"]), 0
    for i, (dtype, shape, offset) in sorted(enumerate(meta["arrays"]), key=lambda e: e[1][2]):
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if offset < end or count < 0 or offset + count * dt.itemsize > meta["data_len"]:
            return None  # (arrays overlapping, or past the data)
        end = offset + count * dt.itemsize
        arrays[i] = data[offset:end].view(dt).reshape(shape)
    return meta, blob, arrays


def store(mk: ModelKey, program, params: dict, feed_names, fetch_names,
          digest=None) -> pathlib.Path | None:
    """Write the optimized model under ``mk``; the path, or ``None`` where it cannot be kept
    (a parameter that is not a plain array, an op a user defined, a directory that cannot be
    written). A racy key's entry holds ``digest``, the parameter files' :func:`racy_digest`
    taken before they were read (checked by :func:`load`)."""
    if digest is False or (mk.racy and digest is None) or not builtin_only(program) or \
            not all(_plain(v) for v in params.values()):
        return None
    prog = program.serialize_to_string()
    meta = {"key": mk.key, "feed": list(feed_names), "fetch": list(fetch_names),
            "is_test": bool(getattr(program, "_is_test", False)), "params": list(params),
            "verified": program.__dict__.get("_verified_version") == program.version,
            "params_sha256": digest if mk.racy else None}
    path = entry_path(mk)
    if not _write(path, MAGIC, meta, prog, params.values()):
        return None
    _evict_others(mk, path)
    _trim(path)
    return path


def _content_matches(mk: ModelKey, digest) -> bool:
    """Whether the parameter files hold the bytes an entry written while they were racy was
    made from (``digest``; ``None``: the entry was not written racy)."""
    if digest is None:
        return True
    marker = _checked_marker(mk, digest)
    if marker.exists():
        return True
    try:
        if content_digest(mk.files) != digest:
            return False
    except OSError:
        return False
    if not mk.racy:  # old enough now: a later change would show in the times
        try:
            marker.touch()
        except OSError:
            pass
    return True


def _data(f, start: int, length: int) -> np.ndarray:
    """The parameters' bytes: the file mapped copy-on-write (pages read from the page cache as
    the arrays are first touched, never written back; the file is only ever replaced whole,
    never truncated), else read."""
    if length == 0:
        return np.empty(0, np.uint8)
    try:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return np.frombuffer(mm, np.uint8, length, start)
    except (OSError, ValueError, AttributeError):
        f.seek(start)
        data = np.empty(length, np.uint8)
        if f.readinto(memoryview(data)) != length:
            raise ValueError("the file is shorter than its header says") from None
        return data


def load(mk: ModelKey):
    """``(program, params, feed_names, fetch_names)`` of the entry under ``mk``, or ``None``
    when there is none or it is not right (see the module's docstring). An entry written
    while its parameter files were racy holds their digest: their bytes are hashed and
    compared, once they are no longer racy only until a match is recorded
    (:func:`_checked_marker`)."""
    from pdjit.framework.errors import ProgramError
    from pdjit.framework.program import Program

    def accept(meta):
        return meta.get("key") == mk.key and _content_matches(mk, meta.get("params_sha256"))

    try:
        path = entry_path(mk)
        found = _read(path, MAGIC, accept)
        if found is None:
            return None
        try:  # (used now: the last its directory's trim removes, see MAX_BYTES)
            os.utime(path)
        except OSError:
            pass
        meta, prog, arrays = found
        if len(meta["params"]) != len(arrays):
            return None
        params = dict(zip(meta["params"], arrays))
        program = Program.parse_from_string(prog)
        if not builtin_only(program):  # (an op type a user has redefined since)
            return None
        program._is_test = bool(meta.get("is_test"))
        if meta.get("verified"):  # stored as ``pdjit.verify`` left it: not checked again
            program.__dict__["_verified_version"] = program.version
        return program, params, list(meta["feed"]), list(meta["fetch"])
    except (*_NOT_RIGHT, ProgramError):
        return None  # (an entry that is not right is made again)


DERIVED_MAGIC = b"pdjit-derived-values 1\n"
_derived_lock = threading.Lock()
#: entry key -> the (parameter, key) pairs of the derived values its file holds, as this
#: process last read or wrote it; the keys of files being written
_derived_held: dict = {}
_derived_writing: set = set()


def derived_path(mk: ModelKey) -> pathlib.Path:
    """The file of the values derived from the parameters of the entry under ``mk`` (kept
    and evicted with it)."""
    return _cache_dir() / f"{_stem(mk)}-derived.pdvals"


def _library() -> str:
    from pdjit.codegen.diskcache import library_stamp

    return library_stamp()


def _key_json(key):
    """A derived value's key as JSON holds it (strings, numbers, tuples of them), or
    ``None`` where it holds no such key."""
    if isinstance(key, tuple):
        items = [_key_json(k) for k in key]
        return None if any(k is None for k in items) else items
    return key if type(key) in (str, int, bool) else None


def _key_back(key):
    return tuple(_key_back(k) for k in key) if isinstance(key, list) else key


class DerivedValues:
    """The values derived from an optimized model's parameters (the CPU kernels' packed
    filters, :mod:`pdjit.codegen.params`) kept in a file beside its entry, so that a process
    that loads the entry does not make them again: read (mapped copy-on-write) when a
    Predictor is made, written after a run that made new ones (on a thread of its own; the
    whole set, replacing the file). The file's key is the entry's and the library kernels'
    stamp (which says how values are derived). Only the parameters no op writes and no run
    feeds (``arrays``: name -> the array the runs read, as the entry gave it) take part: a
    value derived from another array never stands for the entry's."""

    def __init__(self, mk: ModelKey, arrays: dict):
        from pdjit.codegen import params

        self._mk, self._params = mk, params
        self._arrays = {n: a for n, a in arrays.items() if _plain(a)}
        self._seen = params.made()
        loaded = set()
        try:
            found = _read(derived_path(mk), DERIVED_MAGIC,
                          lambda meta: meta.get("key") == mk.key and
                          meta.get("library") == _library())
            if found is not None and len(found[0]["values"]) == len(found[2]):
                for (name, key), value in zip(found[0]["values"], found[2]):
                    a = self._arrays.get(name)
                    if a is not None:
                        params.keep(a, _key_back(key), value)
                        loaded.add((name, repr(_key_back(key))))
        except _NOT_RIGHT:
            pass  # (a file that is not right is written again)
        with _derived_lock:  # (what the file holds now)
            _derived_held[mk.key] = loaded

    def update(self) -> None:
        """After a run: where values were derived since the last look, and the file does not
        hold all of this model's, write them all on a thread of its own."""
        made = self._params.made()
        if made == self._seen:
            return
        values = []
        for name, a in self._arrays.items():
            for key, value in self._params.of(a).items():
                if _key_json(key) is not None and _plain(value):
                    values.append((name, key, value))
        have = {(n, repr(k)) for n, k, _ in values}
        with _derived_lock:
            if self._mk.key in _derived_writing:
                return  # (looked at again after a later run)
            self._seen = made
            if have <= _derived_held.get(self._mk.key, set()):
                return
            _derived_writing.add(self._mk.key)
        threading.Thread(target=self._write, args=(values, have),
                         name="pdjit-derived-values").start()

    def _write(self, values, have) -> None:
        meta = {"key": self._mk.key, "library": _library(),
                "values": [[n, _key_json(k)] for n, k, _ in values]}
        done = False
        try:
            done = _write(derived_path(self._mk), DERIVED_MAGIC, meta, b"",
                          [v for _, _, v in values])
        finally:
            with _derived_lock:
                _derived_writing.discard(self._mk.key)
                if done:
                    _derived_held[self._mk.key] = have
