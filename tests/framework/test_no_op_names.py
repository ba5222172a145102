"""Passes, code generation, the runtime, ahead-of-time compilation and ONNX export name no op
(issue 33): what they need to know of an op they read from its declaration (traits, ``RowWise``,
``Select``, ``ChannelAffine``, the ``test_mode`` attribute, an ONNX rule...), never from its
type or slot names.

The scan parses every ``.py`` file under ``src/pdjit/{passes,codegen,runtime,aot}/`` and the
ONNX exporter ``src/pdjit/io/onnx_{export,rules}.py`` (the AST: comments, docstrings and the
text of f-strings never count) and counts, line by line, the string constants that are

- **op-type literals**: equal to a registered op type (grad ops included) and standing where an
  op type stands: compared (``==``, ``!=``, ``in``, ``not in``) with an ``x.type`` attribute or a
  name ending in ``type``; the value of a ``type=``/``op_type=`` keyword; the first argument of
  ``GradOpSpec``, ``Rewrite``, ``append``, ``append_op``/``_append_op``/``_insert_op`` and
  ``registry.get``/``registry.lookup``; a key of a dict literal whose string keys are all op
  types; or a name bound (``NAME = ...``) to a string, or a tuple/list/set of strings, that are
  all op types (in each place directly, as either branch of ``a if c else b``, or as an element
  of a tuple/list/set). Python and NumPy names that happen to be op types (``"range"``,
  ``"shape"``, ``"abs"``) in generated code or in tables of generated names stand in none of
  these places, so they do not count.
- **slot-name literals**: equal to a registered slot name (``X``, ``Out``, ``Condition``...) and
  used as a slot: the first argument of ``input``, ``output``, ``has_input``, ``has_output``,
  ``input_slot``, ``output_slot``, ``set_input``, ``set_output``, ``inp``, ``out``; a subscript
  of, or the first argument of ``get`` on, an ``inputs``/``outputs`` attribute; or a key of a
  dict literal given as an ``inputs=``/``outputs=`` keyword (or positionally to ``GradOpSpec``/
  ``Rewrite``).

Declaration sites are exempt. A target's lowering modules (``codegen/<target>/lowerings/``) and
the ONNX rules (``io/onnx_rules.py``) are registration tables per op type: the arguments of
the registering call (``lowering(...)``, ``onnx_rule(...)``) are op types by design, and a
registered function's body is written for the ops it registers for, so slot names there are
that op's own. An op-type literal in such a body, though (a function shared by several ops that
switches on which it is), counts: register one function per op (or give the difference as an
argument at registration) or declare the difference on the op.

``KNOWN`` is ``{file: count}`` of the offenders not moved yet; counts only shrink (a file over
its count fails, and one under it must have its entry lowered, so that fixed lines stay fixed).
"""
from __future__ import annotations

import ast
import pathlib

from pdjit.framework import registry

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "pdjit"
SCANNED = ("passes", "codegen", "runtime", "aot", "io/onnx_export.py", "io/onnx_rules.py")
# registration modules: a table of functions registered per op type, and the registering call
_REGISTRATIONS = (("/lowerings/", "lowering"), ("io/onnx_rules.py", "onnx_rule"))

_TYPE_CALLS = frozenset({"GradOpSpec", "Rewrite", "append", "append_op", "_append_op",
                         "_insert_op"})
_SLOT_CALLS = frozenset({"input", "output", "has_input", "has_output", "input_slot",
                         "output_slot", "set_input", "set_output", "inp", "out"})
_SLOT_DICT_CALLS = frozenset({"GradOpSpec", "Rewrite"})
_SLOT_DICT_KWS = frozenset({"inputs", "outputs"})

# file (relative to src/pdjit) -> number of offending literals; only shrinks
KNOWN: dict = {}


def _names():
    ops = registry.all_ops()
    types = frozenset(ops)
    slots = frozenset(s.name for d in ops.values() for s in (*d.inputs, *d.outputs))
    return types, slots


def _strs(node):
    """The string constants of ``node`` when it is one or a tuple/list/set of them (also inside
    ``frozenset(...)``/``set(...)``/``tuple(...)``); ``[]`` otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.Call) and _fname(node.func) in ("frozenset", "set", "tuple") and \
            len(node.args) == 1:
        return _strs(node.args[0])
    if isinstance(node, ast.IfExp):
        return [c for b in (node.body, node.orelse) for c in _strs(b)]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        out = []
        for e in node.elts:
            s = _strs(e) if not isinstance(e, (ast.Tuple, ast.List, ast.Set)) else []
            if not s:
                return []
            out += s
        return out
    return []


def _fname(func) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _is_type_expr(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "type") or \
        (isinstance(node, ast.Name) and node.id.endswith("type"))


def _is_registry_call(func) -> bool:
    return isinstance(func, ast.Attribute) and func.attr in ("get", "lookup") and \
        isinstance(func.value, ast.Name) and func.value.id == "registry"


def _is_slots_expr(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in _SLOT_DICT_KWS


def _offences(path: pathlib.Path, types, slots, registration: str = "") -> list:
    """``[(line, literal, kind)]`` of one file; ``registration``: the registering call's name
    when the file is a registration module."""
    tree = ast.parse(path.read_text())
    hits = {}  # id(node) -> (line, value, kind)
    exempt = set()

    def op_type(node):
        for c in _strs(node):
            if c.value in types and id(c) not in exempt:
                hits[id(c)] = (c.lineno, c.value, "op type")

    def slot(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value in slots and not registration:
            hits[id(node)] = (node.lineno, node.value, "slot")

    def slot_keys(d):
        if isinstance(d, ast.Dict):
            for k in d.keys:
                if k is not None:
                    slot(k)

    for node in ast.walk(tree):  # registrations first: their arguments are declarations
        if registration and isinstance(node, ast.Call) and _fname(node.func) == registration:
            for a in node.args:
                exempt.update(id(c) for c in _strs(a))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_type_expr(s) for s in sides):
                for s in sides:
                    op_type(s)
        elif isinstance(node, ast.Call):
            name = _fname(node.func)
            for kw in node.keywords:
                if kw.arg in ("type", "op_type"):
                    op_type(kw.value)
                if kw.arg in _SLOT_DICT_KWS:
                    slot_keys(kw.value)
            if node.args and (name in _TYPE_CALLS or _is_registry_call(node.func)):
                op_type(node.args[0])
            if name in _SLOT_DICT_CALLS:
                for a in node.args[1:3]:
                    slot_keys(a)
            if name in _SLOT_CALLS and node.args and isinstance(node.func, ast.Attribute):
                slot(node.args[0])
            if name == "get" and node.args and isinstance(node.func, ast.Attribute) and \
                    _is_slots_expr(node.func.value):
                slot(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_slots_expr(node.value):
            slot(node.slice)
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant)
                    and isinstance(k.value, str)]
            if keys and all(k.value in types for k in keys):
                for k in keys:
                    op_type(k)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id != "__all__" for t in targets):
                strs = _strs(node.value)
                if strs and all(c.value in types for c in strs):
                    op_type(node.value)
    return sorted(hits.values())


def scan() -> dict:
    """``{file: [(line, literal, kind)]}`` of every offending file."""
    types, slots = _names()
    found = {}
    for sub in SCANNED:
        p = SRC / sub
        for path in ([p] if p.is_file() else sorted(p.rglob("*.py"))):
            rel = path.relative_to(SRC).as_posix()
            registration = next((fn for where, fn in _REGISTRATIONS if where in "/" + rel), "")
            hits = _offences(path, types, slots, registration)
            if hits:
                found[rel] = hits
    return found


def test_no_new_op_or_slot_names():
    found = scan()
    over = {f: hits for f, hits in found.items() if len(hits) > KNOWN.get(f, 0)}
    assert not over, "op-type or slot-name literals outside op declarations (declare what is " \
        "needed on the op and read the declaration): " + "; ".join(
            f"{f} ({len(h)} > {KNOWN.get(f, 0)}): " + ", ".join(f"{ln}:{v!r}" for ln, v, _ in h)
            for f, h in over.items())


def test_known_offenders_only_shrink():
    found = scan()
    fewer = {f: (n, len(found.get(f, ()))) for f, n in KNOWN.items()
             if len(found.get(f, ())) < n}
    assert not fewer, f"fewer offenders than KNOWN says ({{file: (known, now)}}): lower KNOWN " \
                      f"to the counts now: {fewer}"


def test_scan_finds_what_it_should(tmp_path):
    """The rule on a small file: what counts and what does not."""
    src = tmp_path / "m.py"
    src.write_text(
        '"""docstring naming "conv2d" and "X"."""\n'
        'A = "elementwise_add"\n'                       # 1: a name bound to an op type
        'def f(op, ctx):\n'
        '    if op.type in ("relu", "softmax"):\n'     # 2, 3: compared with .type
        '        return op.input("X")\n'               # 4: a slot
        '    g = GradOpSpec("sum", {"X": []}, {})\n'   # 5, 6: op type, slot key
        '    code = f"for i in range(n): {ctx}"\n'     # f-string: no
        '    names = frozenset({"range", "abs", "np"})\n'  # not all op types: no
        '    return ctx.shape, "shape", names, g, code\n')  # a bare string: no
    types, slots = _names()
    hits = _offences(src, types, slots)
    assert [(v, k) for _, v, k in hits] == [
        ("elementwise_add", "op type"), ("relu", "op type"), ("softmax", "op type"),
        ("X", "slot"), ("X", "slot"), ("sum", "op type")], hits
    low = tmp_path / "low.py"
    low.write_text('@lowering("conv2d", "depthwise_conv2d")\n'
                   'def f(ctx):\n'
                   '    x = ctx.inp("Input")\n'
                   '    return ctx.op.type == "conv2d"\n')
    assert [v for _, v, _ in _offences(low, types, slots, "lowering")] == ["conv2d"]
