"""Files written whole or not at all (the disk caches' entries)."""
from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile


def write_whole(path, write, *, durable: bool = False) -> bool:
    """Write the file ``path`` whole or not at all: ``write(f)`` fills a temporary file beside
    it (readable by its owner only, as ``mkstemp`` makes it; with ``durable`` flushed to the
    disk first), which then replaces ``path`` at once, so a reader sees the old file or the
    new one, never a part. False where it cannot be written (the temporary file removed)."""
    path = pathlib.Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_checked(path, payload: bytes, magic: bytes = b"") -> bool:
    """:func:`write_whole` of ``magic``, the SHA-256 of ``payload``, then ``payload``: an entry
    :func:`read_checked` reads back whole or not at all."""
    return write_whole(path, lambda f: f.write(magic + hashlib.sha256(payload).digest() + payload))


def read_checked(path, magic: bytes = b""):
    """The payload of a file :func:`write_checked` wrote with ``magic``; None where there is
    none, it cannot be read, or its magic or digest is not right."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = len(magic) + 32
    if len(data) <= head or data[:len(magic)] != magic or \
            hashlib.sha256(data[head:]).digest() != data[len(magic):head]:
        return None
    return data[head:]
