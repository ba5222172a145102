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
  that decide the result (``framework``, ``ops``, ``passes``, ``io``, ``proto``).

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
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import pathlib
import struct
import time
from dataclasses import dataclass

import numpy as np

from pdjit.framework.files import write_whole
from pdjit.version import __version__

MAGIC = b"pdjit-optimized-model 1\n"
SUBDIR = "models"
_ALIGN = 64
#: a parameter file changed less than this many seconds ago is racy: its entry holds the
#: files' digest (``model_key``, ``_content_matches``)
RACY_SECONDS = 2.0
_SOURCE_PACKAGES = ("framework", "ops", "passes", "io", "proto")
_stamp: list = []


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


def _checked_marker(mk: ModelKey, digest: str) -> pathlib.Path:
    """The file saying that the parameter files of ``mk`` were found to hold the bytes of
    ``digest`` at a time their modification times were old enough to tell a later change."""
    return _cache_dir() / f"{mk.where}-{mk.key[:40]}-{digest[:32]}.checked"


def entry_path(mk: ModelKey) -> pathlib.Path:
    return _cache_dir() / f"{mk.where}-{mk.key[:40]}.pdopt"


def _evict_others(mk: ModelKey, keep: pathlib.Path) -> None:
    """Remove the older entries (and markers) of the parameters' location of ``mk``: one
    entry per model location (a script that saves and loads a model every epoch keeps one
    copy of its weights, not one per epoch)."""
    for old in keep.parent.glob(f"{mk.where}-*"):
        if old != keep and not old.name.startswith(f"{mk.where}-{mk.key[:40]}-"):
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


def store(mk: ModelKey, program, params: dict, feed_names, fetch_names,
          digest=None) -> pathlib.Path | None:
    """Write the optimized model under ``mk``; the path, or ``None`` where it cannot be kept
    (a parameter that is not a plain array, an op a user defined, a directory that cannot be
    written). A racy key's entry holds ``digest``, the parameter files' :func:`racy_digest`
    taken before they were read (checked by :func:`load`)."""
    key = mk.key
    if digest is False or (mk.racy and digest is None) or not builtin_only(program):
        return None
    arrays = []
    for name, value in params.items():
        if type(value) is not np.ndarray or value.dtype.hasobject or \
                np.dtype(value.dtype.str) != value.dtype:
            return None
        arrays.append((name, np.ascontiguousarray(value)))
    digest = digest if mk.racy else None
    prog = program.serialize_to_string()
    entries, offset = [], 0
    for name, a in arrays:
        offset = -(-offset // _ALIGN) * _ALIGN
        entries.append([name, a.dtype.str, list(a.shape), offset])
        offset += a.nbytes
    header = json.dumps({
        "key": key, "feed": list(feed_names), "fetch": list(fetch_names),
        "is_test": bool(getattr(program, "_is_test", False)), "params": entries,
        "verified": program.__dict__.get("_verified_version") == program.version,
        "params_sha256": digest,
        "program_len": len(prog), "program_sha256": hashlib.sha256(prog).hexdigest(),
        "data_len": offset}, separators=(",", ":")).encode()
    head = MAGIC + struct.pack("<Q", len(header)) + header + hashlib.sha256(header).digest()
    start = -(-(len(head) + len(prog)) // _ALIGN) * _ALIGN
    path = entry_path(mk)

    def write(f):
        f.write(head + prog + b"\0" * (start - len(head) - len(prog)))
        pos = 0
        for (_, _, _, off), (_, a) in zip(entries, arrays):
            f.write(b"\0" * (off - pos))
            f.write(memoryview(a.reshape(-1)).cast("B"))
            pos = off + a.nbytes

    # (durable: the header's digests do not cover the parameters' bytes)
    if not write_whole(path, write, durable=True):
        return None
    _evict_others(mk, path)
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
    key = mk.key
    from pdjit.framework.errors import ProgramError
    from pdjit.framework.program import Program

    path = entry_path(mk)
    try:
        f = open(path, "rb")
    except OSError:
        return None
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(len(MAGIC) + 8)
            if len(head) != len(MAGIC) + 8 or head[:len(MAGIC)] != MAGIC:
                return None
            (n,) = struct.unpack("<Q", head[len(MAGIC):])
            if n > size:
                return None
            header = f.read(n)
            digest = f.read(32)
            if len(header) != n or hashlib.sha256(header).digest() != digest:
                return None
            meta = json.loads(header)
            if type(meta) is not dict or meta.get("key") != key or \
                    not _content_matches(mk, meta.get("params_sha256")):
                return None
            prog = f.read(meta["program_len"])
            if hashlib.sha256(prog).hexdigest() != meta["program_sha256"]:
                return None
            start = -(-(len(MAGIC) + 8 + n + 32 + len(prog)) // _ALIGN) * _ALIGN
            if size != start + meta["data_len"]:
                return None
            data = _data(f, start, meta["data_len"])
        params, end = {}, 0
        for name, dtype, shape, offset in sorted(meta["params"], key=lambda e: e[3]):
            dt = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            if offset < end or count < 0 or offset + count * dt.itemsize > meta["data_len"]:
                return None  # (parameters overlapping, or past the data)
            end = offset + count * dt.itemsize
            params[name] = data[offset:end].view(dt).reshape(shape)
        program = Program.parse_from_string(prog)
        if not builtin_only(program):  # (an op type a user has redefined since)
            return None
        program._is_test = bool(meta.get("is_test"))
        if meta.get("verified"):  # stored as ``pdjit.verify`` left it: not checked again
            program.__dict__["_verified_version"] = program.version
        return program, params, list(meta["feed"]), list(meta["fetch"])
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError,
            RecursionError, struct.error, ProgramError):
        return None  # (an entry that is not right is made again)
