"""``.npy`` files and ``.npz`` archives (``pdjit run --input``) are read within bounds: a header
claiming more data than the file holds, a zip bomb (a small member inflating past the
allocation limit) and a member forging its uncompressed size are named errors that allocate
nothing; valid files read as ``np.load`` reads them."""
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest

from pdjit.framework.errors import ModelFileError
from pdjit.io import npyfile
from pdjit.tools import CliError
from pdjit.tools.run import read_inputs


def _peak(fn):
    """(what ``fn`` raised, the peak bytes traced while it ran)."""
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError) as e:
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return str(e.value), peak


def _npy_header(shape, descr="<f4") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": tuple(shape)}).encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def test_valid_files_read_as_numpy_reads_them(tmp_path):
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4),
              "f": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
              "s": np.array(2.5), "e": np.zeros((0, 3), np.float64),
              "b": np.array([True, False])}
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    np.savez(tmp_path / "p.npz", **arrays)
    for name in ("c.npz", "p.npz"):
        archive = npyfile.load(str(tmp_path / name))
        assert sorted(archive.files) == sorted(arrays)
        for k, want in arrays.items():
            got = archive[k]
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    np.save(tmp_path / "f.npy", arrays["f"])
    got = npyfile.load(str(tmp_path / "f.npy"))
    np.testing.assert_array_equal(got, arrays["f"])
    assert got.flags.f_contiguous
    feeds = read_inputs([str(tmp_path / "c.npz")], ["a", "s"])
    np.testing.assert_array_equal(feeds["a"], arrays["a"])


def test_headers_claiming_more_than_the_file_allocate_nothing(tmp_path):
    path = tmp_path / "big.npy"
    path.write_bytes(_npy_header([1 << 33]) + bytes(16))  # 32 GiB claimed, 16 bytes held
    msg, peak = _peak(lambda: npyfile.load(str(path)))
    assert "big.npy: its header claims shape [8589934592] of float32 (34359738368 bytes), " \
           "but only 16 bytes follow it" in msg
    assert peak < 1 << 20
    with zipfile.ZipFile(tmp_path / "big.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", _npy_header([1 << 20, 1 << 20]) + bytes(64))
    archive = npyfile.load(str(tmp_path / "big.npz"))
    msg, peak = _peak(lambda: archive["x"])
    assert "member 'x': its header claims shape [1048576, 1048576]" in msg
    assert peak < 1 << 20
    with pytest.raises(CliError, match=r"--input .*big.npz: member 'x': its header claims"):
        read_inputs([str(tmp_path / "big.npz")], ["x"])
    np.save(tmp_path / "o.npy", np.array([{}, 1], dtype=object))
    with pytest.raises(ModelFileError, match="object array .* would need pickle"):
        npyfile.load(str(tmp_path / "o.npy"))


def test_a_zip_bomb_is_refused_before_it_inflates(tmp_path, monkeypatch):
    """64 MiB of zeros deflated to ~64 KiB: beyond a 16 MiB allocation limit, refused from the
    archive's directory, nothing inflated."""
    path = tmp_path / "bomb.npz"
    n = 1 << 26
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            f.write(_npy_header([n], "|u1"))
            zeros = bytes(1 << 20)
            for _ in range(n >> 20):
                f.write(zeros)
    assert path.stat().st_size < 1 << 20
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", str(16 << 20))
    archive = npyfile.load(str(path))
    msg, peak = _peak(lambda: archive["x"])
    assert f"member 'x': inflates to {n + 128} bytes, more than the {16 << 20} the " \
           f"allocation limit leaves (PDJIT_MAX_ALLOC_BYTES)" in msg
    assert peak < 1 << 20


def test_a_member_forging_its_size_is_refused(tmp_path):
    """A member whose directory entries claim 2 GiB from a few bytes (beyond deflate's ratio),
    and one claiming fewer bytes than it inflates to (zipfile stops at the claim)."""
    data = _npy_header([4]) + np.arange(4, dtype=np.float32).tobytes()
    path = tmp_path / "forged.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", data)
    raw = bytearray(path.read_bytes())
    local, central = raw.index(b"PK\x03\x04"), raw.index(b"PK\x01\x02")
    struct.pack_into("<I", raw, local + 22, 1 << 31)
    struct.pack_into("<I", raw, central + 24, 1 << 31)
    path.write_bytes(bytes(raw))
    msg, peak = _peak(lambda: npyfile.load(str(path))["x"])
    assert "member 'x': declares 2147483648 bytes from" in msg and "ratio beyond 1100:1" in msg
    assert peak < 1 << 20
    struct.pack_into("<I", raw, local + 22, len(data) - 8)
    struct.pack_into("<I", raw, central + 24, len(data) - 8)
    path.write_bytes(bytes(raw))
    with pytest.raises(ModelFileError, match=r"member 'x': .*(Bad CRC-32|but only 8 bytes)"):
        npyfile.load(str(path))["x"]
