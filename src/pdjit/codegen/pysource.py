"""Generated Python source to code objects: the one place that calls Python's compiler on
text pdjit generated (kernel modules, host drivers), so that text it cannot take is a named
error."""
from __future__ import annotations

from pdjit.framework.errors import ProgramLimitError


def compile_source(text: str, filename: str):
    """``compile(text, filename, "exec")``, refusing generated code that Python's compiler
    cannot take (nested too deeply for its recursion limit or its 20 static blocks) with a
    :class:`ProgramLimitError` instead of a bare ``RecursionError`` / ``SyntaxError``."""
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
