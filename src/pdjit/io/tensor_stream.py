"""PaddlePaddle's serialized tensors and combined parameter files (``.pdiparams``).

A combined file is the tensors of a program's persistable variables, one after another in the
order of their sorted names, with no header. One tensor is (little-endian):

    uint32 version (0) | uint64 lod_level | per level: uint64 byte length, then uint64 offsets |
    uint32 tensor version (0) | int32 desc length | VarType.TensorDesc bytes | raw C-order data

See ``shared/facts/paddle_formats.md``. Every read is bounds-checked: a truncated or corrupt
file is a clear :class:`ModelFileError` (a ``ValueError``), never a crash or a silent short read,
and a size the file claims (dims, LoD lengths) is checked against the bytes it has left before
anything is allocated for it.
"""
from __future__ import annotations

import struct

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ModelFileError
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime.tensor import LoDTensor, check_lod

_SKIP_TYPES = {pb.VarType.FEED_MINIBATCH, pb.VarType.FETCH_LIST, pb.VarType.READER,
               pb.VarType.RAW}


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = memoryview(data), 0, what

    @property
    def left(self) -> int:
        """Bytes not read yet."""
        return len(self.data) - self.pos

    def take(self, n: int, field: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ModelFileError(f"{self.what}: truncated at byte {self.pos} while reading "
                                 f"{field} ({n} bytes wanted, {len(self.data) - self.pos} left)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, field: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), field))[0]

    def array(self, count: int, dt: np.dtype, field: str) -> np.ndarray:
        """The next ``count`` little-endian elements of ``dt``, as a new native array."""
        raw = self.take(count * dt.itemsize, field)
        return np.frombuffer(raw, dtype=dt.newbyteorder("<")).astype(dt)


class _FileReader:
    """:class:`_Reader`'s interface over an open regular file of ``size`` bytes: each ``take``
    reads what it returns, so a file of many tensors is never held whole (the largest tensor
    bounds what reading keeps besides the values)."""

    def __init__(self, f, size: int, what: str):
        self.f, self.size, self.pos, self.what = f, size, 0, what

    @property
    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, field: str) -> memoryview:
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(f"{self.what}: truncated at byte {self.pos} while reading "
                                 f"{field} ({n} bytes wanted, {self.size - self.pos} left)")
        out = self.f.read(n)
        if len(out) != n:
            raise ModelFileError(f"{self.what}: the file changed while it was read (at byte "
                                 f"{self.pos}: {n} bytes wanted, {len(out)} read)")
        self.pos += n
        return memoryview(out)

    def unpack(self, fmt: str, field: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), field))[0]

    def array(self, count: int, dt: np.dtype, field: str) -> np.ndarray:
        """The next ``count`` little-endian elements of ``dt``, read straight into the array
        they become (no second copy of a large parameter)."""
        n = count * dt.itemsize
        if n > self.size - self.pos:
            self.take(n, field)  # (raises: truncated)
        arr = np.empty(count, dt.newbyteorder("<"))
        view, got = memoryview(arr).cast("B"), 0
        while got < n:
            k = self.f.readinto(view[got:got + (1 << 24)])
            if not k:
                raise ModelFileError(f"{self.what}: the file changed while it was read (at "
                                     f"byte {self.pos + got}: {n - got} bytes missing)")
            got += k
        view.release()
        self.pos += n
        return arr if dt.isnative == arr.dtype.isnative else arr.astype(dt)


def read_tensor(reader: _Reader, name: str = "tensor"):
    """One tensor from ``reader``: an ndarray, or a LoDTensor when it carries LoD."""
    version = reader.unpack("<I", f"{name}: version")
    if version != 0:
        raise ModelFileError(f"{reader.what}: {name}: unsupported tensor version {version}")
    levels = reader.unpack("<Q", f"{name}: lod_level")
    if levels > 16:
        raise ModelFileError(f"{reader.what}: {name}: implausible lod_level {levels}")
    lod = []
    for lvl in range(levels):
        nbytes = reader.unpack("<Q", f"{name}: LoD level {lvl} size")
        if nbytes % 8:
            raise ModelFileError(f"{reader.what}: {name}: LoD level {lvl} has {nbytes} bytes, "
                                 f"not a multiple of 8")
        lod.append(np.frombuffer(reader.take(nbytes, f"{name}: LoD"), "<u8").tolist())
    tversion = reader.unpack("<I", f"{name}: tensor version")
    if tversion != 0:
        raise ModelFileError(f"{reader.what}: {name}: unsupported tensor version {tversion}")
    desc_len = reader.unpack("<i", f"{name}: desc length")
    desc = pb.VarType.TensorDesc()
    try:
        desc.ParseFromString(bytes(reader.take(desc_len, f"{name}: TensorDesc")))
        if not desc.IsInitialized():
            raise ValueError(f"missing {desc.FindInitializationErrors()}")
        dt = dtypes.to_numpy(desc.data_type)
    except Exception as e:
        raise ModelFileError(f"{reader.what}: {name}: bad TensorDesc: {e}") from None
    shape = tuple(desc.dims)
    if any(d < 0 for d in shape):
        raise ModelFileError(f"{reader.what}: {name}: negative dim in {list(shape)}")
    count = 1
    for d in shape:  # Python ints: a product of huge claimed dims must not wrap around (take()
        # compares it with the bytes left before anything is read or allocated)
        count *= int(d)
    arr = reader.array(count, dt, f"{name}: data of shape {list(shape)}").reshape(shape)
    if lod:
        try:
            return LoDTensor(arr, check_lod(lod, shape[0] if shape else 1, f"{name} LoD"))
        except ValueError as e:
            raise ModelFileError(f"{reader.what}: {e}") from None
    return arr


def write_tensor(value) -> bytes:
    """One tensor in Paddle's layout."""
    lod = value.lod() if isinstance(value, LoDTensor) else []
    arr = np.asarray(value)
    desc = pb.VarType.TensorDesc(data_type=dtypes.to_code(arr.dtype), dims=list(arr.shape))
    d = desc.SerializeToString()
    parts = [struct.pack("<IQ", 0, len(lod))]
    for level in lod:
        parts.append(struct.pack("<Q", 8 * len(level)))
        parts.append(np.asarray(level, "<u8").tobytes())
    parts.append(struct.pack("<Ii", 0, len(d)))
    parts.append(d)
    parts.append(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
                 .tobytes())
    return b"".join(parts)


def persistable_names(program) -> list:
    """The names a combined parameter file of ``program`` holds, in file order (sorted)."""
    names = {v.name for v in program.list_vars() if v.persistable and v.type not in _SKIP_TYPES}
    return sorted(names)


def load_combined_params(data: bytes, names, what: str = "parameters") -> dict:
    """``{name: value}`` from a combined file holding ``names`` in that order."""
    reader = _Reader(data, what)
    out = {n: read_tensor(reader, n) for n in names}
    if reader.left:
        raise ModelFileError(f"{what}: {reader.left} bytes left after the "
                             f"{len(out)} expected tensors: the file does not match the program")
    return out


def save_combined_params(values: dict, names) -> bytes:
    missing = [n for n in names if n not in values]
    if missing:
        raise KeyError(f"no value for {missing}")
    return b"".join(write_tensor(values[n]) for n in names)
