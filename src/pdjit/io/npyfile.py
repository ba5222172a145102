"""NumPy ``.npy`` files and ``.npz`` archives read within bounds (the inputs of ``pdjit run``).

``np.load`` trusts what a file says: an ``.npy`` header claiming ``2**40`` elements is allocated
before the data is found missing, and an ``.npz`` member of a few kilobytes may inflate to
gigabytes of zeros (a zip bomb). Here every size is checked before anything is allocated or
decompressed, each with a :class:`ModelFileError` naming the file (and member), what it claims
and the bound:

- an array's bytes (its header's shape times its dtype's size) must fit what holds them: the
  rest of an ``.npy`` file, or the uncompressed size the archive declares for the member (which
  ``zipfile`` enforces while it inflates: it never returns more);
- what one load inflates or allocates stays within the allocation limit
  (``PDJIT_MAX_ALLOC_BYTES``, by default the memory available: ``pdjit.runtime.checks``), the
  members of an archive together;
- a member whose declared size is more than ``MAX_RATIO`` times its compressed size is refused
  (deflate cannot compress beyond about 1,032:1, so such a member is damaged or forged);
- object arrays (which would need pickle) are refused; the data is read in chunks into the
  array, which is allocated once its size is known to fit.
"""
from __future__ import annotations

import os
import zipfile

import numpy as np

from pdjit.framework.errors import ModelFileError

#: the largest uncompressed-to-compressed size ratio of an archive member (deflate's bound)
MAX_RATIO = 1100
_CHUNK = 1 << 20


def _limit() -> int | None:
    from pdjit.runtime.checks import alloc_limit
    return alloc_limit()


def _read_header(f, what: str):
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, EOFError, OSError, SyntaxError, TypeError, zipfile.BadZipFile) as e:
        raise ModelFileError(f"{what}: not a NumPy .npy array: {e}") from None
    if dtype.hasobject:
        raise ModelFileError(f"{what}: holds an object array (dtype {dtype}), not a plain "
                             f"NumPy array: reading it would need pickle")
    return shape, fortran, dtype


def _read_array(f, size: int, what: str, budget: int | None) -> np.ndarray:
    """The array of the ``.npy`` stream ``f`` holding ``size`` bytes (header included)."""
    start = f.tell()
    shape, fortran, dtype = _read_header(f, what)
    left = size - (f.tell() - start)
    count = 1
    for d in shape:
        count *= int(d)
    nbytes = count * dtype.itemsize
    if nbytes > left:
        raise ModelFileError(f"{what}: its header claims shape {list(shape)} of {dtype} "
                             f"({nbytes} bytes), but only {max(left, 0)} bytes follow it")
    if budget is not None and nbytes > budget:
        raise ModelFileError(f"{what}: shape {list(shape)} of {dtype} takes {nbytes} bytes, "
                             f"more than the {budget} the allocation limit leaves "
                             f"(PDJIT_MAX_ALLOC_BYTES)")
    out = np.empty(count, dtype=dtype)
    view = memoryview(out.view(np.uint8).reshape(-1)) if nbytes else memoryview(b"")
    done = 0
    try:
        while done < nbytes:
            n = f.readinto(view[done:done + _CHUNK])
            if not n:
                break
            done += n
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        raise ModelFileError(f"{what}: cannot read its data: {e}") from None
    if done != nbytes:
        raise ModelFileError(f"{what}: truncated: {done} of the {nbytes} data bytes its "
                             f"header claims")
    return out.reshape(shape, order="F" if fortran else "C")


def load_npy(path: str, what: str | None = None) -> np.ndarray:
    """The array of the ``.npy`` file ``path``, its size checked against the file's and the
    allocation limit before anything is allocated."""
    what = what or path
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise ModelFileError(f"{what}: cannot open: {e.strerror or e}") from None
    with f:
        return _read_array(f, size, what, _limit())


class NpzArchive:
    """An ``.npz`` archive read member by member within bounds (``files``: the array names;
    ``archive[name]``: one array). The members read through one archive share one
    allocation budget."""

    def __init__(self, path: str, what: str | None = None):
        self.path, self.what = path, what or path
        try:
            self._zip = zipfile.ZipFile(path)
            infos = self._zip.infolist()
        except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
            raise ModelFileError(f"{self.what}: not a NumPy .npz archive: {e}") from None
        self._info = {}
        for info in infos:
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            self._info[name] = info
        self.files = list(self._info)
        self._budget = _limit()

    def __contains__(self, name) -> bool:
        return name in self._info

    def __getitem__(self, name: str) -> np.ndarray:
        info = self._info.get(name)
        if info is None:
            raise KeyError(name)
        what = f"{self.what}: member {name!r}"
        if info.compress_type != zipfile.ZIP_STORED and \
                info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise ModelFileError(f"{what}: declares {info.file_size} bytes from "
                                 f"{info.compress_size} compressed, a ratio beyond "
                                 f"{MAX_RATIO}:1 (a damaged or forged archive)")
        if self._budget is not None and info.file_size > self._budget:
            raise ModelFileError(f"{what}: inflates to {info.file_size} bytes, more than "
                                 f"the {self._budget} the allocation limit leaves "
                                 f"(PDJIT_MAX_ALLOC_BYTES)")
        try:
            f = self._zip.open(info)
        except (OSError, zipfile.BadZipFile, NotImplementedError, RuntimeError,
                ValueError) as e:
            raise ModelFileError(f"{what}: cannot read it: {e}") from None
        with f:
            tell = _Counted(f)
            arr = _read_array(tell, info.file_size, what, self._budget)
        if self._budget is not None:
            self._budget -= arr.nbytes
        return arr

    def close(self) -> None:
        self._zip.close()


class _Counted:
    """A read-only stream that knows its position (a zip member's may not ``tell``)."""

    def __init__(self, f):
        self.f, self.pos = f, 0

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.pos += len(b)
        return b

    def readinto(self, buf) -> int:
        n = self.f.readinto(buf)
        self.pos += n or 0
        return n

    def tell(self) -> int:
        return self.pos


def load(path: str, what: str | None = None):
    """An ``.npy`` file's array, or an :class:`NpzArchive` for a zip archive (``.npz``)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise ModelFileError(f"{what or path}: not a regular file (a FIFO or a device would be "
                             f"read for ever)")
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as e:
        raise ModelFileError(f"{what or path}: cannot open: {e.strerror or e}") from None
    return NpzArchive(path, what) if is_zip else load_npy(path, what)
