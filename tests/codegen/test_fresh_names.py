"""Fresh locals of generated code never take a parameter's name (``a<n>``)."""
import re

from pdjit.codegen.lowering import _unreserved


def test_fresh_hints_cannot_make_parameter_names():
    for hint in ("a", "a1", "a12"):
        name = _unreserved(hint) + "2"     # what fresh() appends: its counter
        assert not re.fullmatch(r"a\d+", name), name
    assert _unreserved("acc") == "acc" and _unreserved("x") == "x"
