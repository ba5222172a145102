"""Generated Python source to code objects: the one place that calls Python's compiler on
text pdjit generated (kernel modules, host drivers), so that text it cannot take is a named
error.

The code object of a long text (a host driver of a large model: ResNet-50's is compiled in
~15 ms) is kept in the cache directory (``<cache dir>/code/<hash>.marshal``, keyed by the
text, the file name and the interpreter's bytecode version), so a later process reads it
instead of compiling the text again. A file whose header or SHA-256 does not match is
ignored and written again; one that cannot be written is not kept.
"""
from __future__ import annotations

import hashlib
import marshal
import sys

from pdjit.framework.errors import ProgramLimitError
from pdjit.framework.files import read_checked, write_checked

#: texts shorter than this (characters) are compiled each time (faster than a file's read)
CACHED_MIN_CHARS = 8000
CODE_DIR = "code"


def compile_source(text: str, filename: str):
    """``compile(text, filename, "exec")``, refusing generated code that Python's compiler
    cannot take (nested too deeply for its recursion limit or its 20 static blocks) with a
    :class:`ProgramLimitError` instead of a bare ``RecursionError`` / ``SyntaxError``. A long
    text's code object comes from the disk cache when it is there (see the module's
    docstring)."""
    path = _code_path(text, filename) if len(text) >= CACHED_MIN_CHARS else None
    if path is not None:
        code = _read_code(path)
        if code is not None:
            return code
    code = _compile(text, filename)
    if path is not None:
        _write_code(path, code)
    return code


def compile_rewritten(text: str, filename: str, rewrite):
    """``rewrite(text)``: a code object made from ``text`` (or why it cannot be: not kept),
    kept in the cache directory as :func:`compile_source` keeps a long text's, keyed by
    ``text`` and ``filename`` (which names the rewrite and its version)."""
    path = _code_path(text, filename) if len(text) >= CACHED_MIN_CHARS else None
    if path is not None:
        code = _read_code(path)
        if code is not None:
            return code
    code = rewrite(text)
    if path is not None and isinstance(code, type(_read_code.__code__)):
        _write_code(path, code)
    return code


def _compile(text: str, filename: str):
    try:
        return compile(text, filename, "exec")
    except RecursionError as e:
        problem = f"nested too deeply for Python's compiler ({e})"
    except SyntaxError as e:
        if "nested" not in str(e) and "too many" not in str(e):
            raise
        problem = f"{e.msg}"
    except MemoryError:
        problem = f"too large for Python's compiler ({len(text)} characters)"
    raise ProgramLimitError(
        f"the generated code {filename} is {problem}: the program's ops or ranks exceed what "
        f"one generated function can hold; lower PDJIT_MAX_FUSED_OPS (ops fused into one "
        f"kernel) or split the program") from None


def _magic() -> bytes:
    import importlib.util

    return importlib.util.MAGIC_NUMBER + sys.implementation.cache_tag.encode()


def _code_path(text: str, filename: str):
    from pdjit.codegen.diskcache import cache_dir

    h = hashlib.sha256(_magic() + b"\0" + filename.encode() + b"\0" + text.encode())
    return cache_dir() / CODE_DIR / f"{h.hexdigest()[:40]}.marshal"


def _read_code(path):
    """The code object kept at ``path``, or ``None`` (none there, or not right)."""
    payload = read_checked(path, _magic())
    if payload is None:
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, type(_read_code.__code__)) else None


def _write_code(path, code) -> None:
    write_checked(path, marshal.dumps(code), _magic())
