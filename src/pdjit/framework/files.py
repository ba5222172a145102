"""Files written whole or not at all (the disk caches' entries)."""
from __future__ import annotations

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
