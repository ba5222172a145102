"""The disk cache of long generated sources' code objects (``pdjit.codegen.pysource``).

Oracle: the generated function's result counted by hand (``n`` additions of 1)."""
import pytest

import pdjit as fluid
from pdjit.codegen import pysource


def _run(code, x):
    ns = {}
    exec(code, ns)  # noqa: S102
    return ns["f"](x)


def test_a_long_text_is_compiled_once_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path))
    n = pysource.CACHED_MIN_CHARS // 10
    text = "def f(x):\n" + "    x = x + 1\n" * n + "    return x\n"
    assert len(text) >= pysource.CACHED_MIN_CHARS
    assert _run(pysource.compile_source(text, "<gen f>"), 5) == 5 + n
    (kept,) = (tmp_path / pysource.CODE_DIR).glob("*.marshal")

    real = pysource._compile
    monkeypatch.setattr(pysource, "_compile", lambda *a: pytest.fail("compiled again"))
    code = pysource.compile_source(text, "<gen f>")
    assert _run(code, 1) == 1 + n and code.co_filename == "<gen f>"
    # another file name is another entry (it is part of the code object)
    monkeypatch.setattr(pysource, "_compile", real)
    pysource.compile_source(text, "<gen g>")
    assert len(list((tmp_path / pysource.CODE_DIR).glob("*.marshal"))) == 2

    # a damaged file is compiled again and rewritten; a short text is never kept
    data = bytearray(kept.read_bytes())
    data[-3] ^= 0xFF
    kept.write_bytes(bytes(data))
    assert pysource._read_code(kept) is None
    assert _run(pysource.compile_source(text, "<gen f>"), 0) == n
    assert pysource._read_code(kept) is not None
    pysource.compile_source("def f(x):\n    return x\n", "<short>")
    assert len(list((tmp_path / pysource.CODE_DIR).glob("*.marshal"))) == 2

    fluid.clear_cache()
    assert not (tmp_path / pysource.CODE_DIR).exists()
