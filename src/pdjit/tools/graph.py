"""``pdjit graph``: a program's global block as a Graphviz digraph.

Ops are boxes (type and index), variables ellipses (name, shape, dtype; persistables filled
grey, feed/fetch holders as notes), edges run variable -> op -> variable. The sub-block of a
control-flow op (``while``, ``conditional_block``, ...) is a ``subgraph cluster_<block idx>``
nested in its parent block's cluster, holding its ops and the variables it declares, linked
to the owning op by a dashed edge. Node ids are generated (``op_<block>_<index>``,
``var_<n>``); every name that reaches the dot text is a quoted, escaped string.
"""
from __future__ import annotations

import os
import shutil
import subprocess

from pdjit.framework.program import Program
from pdjit.proto import framework_pb2 as pb
from pdjit.tools import CliError
from pdjit.tools.model import dtype_name, shape_str

VarType = pb.VarType


def quote(text) -> str:
    """``text`` as a dot quoted string (backslashes, quotes and line breaks escaped)."""
    s = str(text).replace("\\", "\\\\").replace('"', '\\"')
    s = s.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")
    return f'"{s}"'


class _Dot:
    def __init__(self, program: Program):
        self.program = program
        self.var_ids: dict = {}     # (block idx that declares it, name) -> node id
        self.lines: list = []
        self.drawn_blocks: set = set()
        self.edges: list = []

    # -- variables ---------------------------------------------------------------------------
    def _declaring_block(self, block, name):
        b = block
        while b is not None:
            if name in b.vars:
                return b
            b = b.parent_block
        return None

    def _var_label(self, v) -> tuple:
        if v.type in (VarType.FEED_MINIBATCH, VarType.FETCH_LIST):
            kind = "feed" if v.type == VarType.FEED_MINIBATCH else "fetch"
            return f"{v.name}\n({kind} holder)", "note", 'style="filled", fillcolor="#fff4c2"'
        if v.type == VarType.LOD_TENSOR or v.type == VarType.SELECTED_ROWS:
            text = f"{v.name}\n{shape_str(v.shape)} {dtype_name(v.dtype)}"
            if v.type == VarType.LOD_TENSOR and v.lod_level:
                text += f" lod {v.lod_level}"
        else:
            from pdjit.framework import dtypes
            text = f"{v.name}\n{dtypes.type_name(v.type)}"
        style = 'style="filled", fillcolor="#d9d9d9"' if v.persistable else ""
        return text, "ellipse", style

    def var_node(self, block, name, pending: dict) -> str:
        """The node id of ``name`` as seen from ``block``; a new node is recorded in
        ``pending`` under the block that declares it (drawn in that block's cluster)."""
        owner = self._declaring_block(block, name)
        key = (owner.idx if owner is not None else -1, name)
        node = self.var_ids.get(key)
        if node is None:
            node = f"var_{len(self.var_ids)}"
            self.var_ids[key] = node
            if owner is None:
                label = quote(f"{name}\n(not declared)")
                attrs = f'label={label}, shape=ellipse, style="dashed"'
            else:
                text, shape, style = self._var_label(owner.vars[name])
                attrs = f"label={quote(text)}, shape={shape}" + (f", {style}" if style else "")
            pending.setdefault(key[0], []).append(f"{node} [{attrs}];")
        return node

    # -- blocks --------------------------------------------------------------------------------
    def block_body(self, idx: int, indent: str, pending: dict) -> list:
        """The dot lines of block ``idx``'s ops and clusters; its edges go to ``self.edges``
        (drawn at the top level: an edge written inside a cluster would pull its ends into it)
        and new variable nodes to ``pending`` (drawn by the cluster of the block declaring
        them)."""
        if idx in self.drawn_blocks:
            return [f"{indent}// block {idx} is drawn already"]
        self.drawn_blocks.add(idx)
        block = self.program.block(idx)
        lines = []
        for i, op in enumerate(block.ops):
            op_id = f"op_{idx}_{i}"
            label = quote(f"{op.type}\n#{i}" if idx == 0 else f"{op.type}\n#{i} (block {idx})")
            lines.append(f"{indent}{op_id} [label={label}, shape=box, "
                         f'style="rounded,filled", fillcolor="#cfe2ff"];')
            for slot, names in op.inputs.items():
                for n in names:
                    src = self.var_node(block, n, pending)
                    self.edges.append(f"{src} -> {op_id} [label={quote(slot)}];")
            for slot, names in op.outputs.items():
                for n in names:
                    dst = self.var_node(block, n, pending)
                    self.edges.append(f"{op_id} -> {dst} [label={quote(slot)}];")
            for sub in op.sub_block_indices():
                if sub <= 0 or sub >= self.program.num_blocks:
                    lines.append(f"{indent}// {op.type} #{i}: sub-block {sub} does not exist")
                    continue
                lines += self.cluster(sub, f"{op.type} #{i} (block {idx})", indent, pending)
                self.edges.append(f"{op_id} -> anchor_{sub} [lhead=cluster_{sub}, "
                                  f"style=dashed, arrowhead=odiamond, "
                                  f"label={quote('sub_block')}];")
        return lines

    def cluster(self, idx: int, owner: str, indent: str, pending: dict) -> list:
        inner = indent + "    "
        title = quote(f"block {idx} of {owner}")
        lines = [f"{indent}subgraph cluster_{idx} {{",
                 f"{inner}label={title};",
                 f'{inner}style="rounded,dashed"; color="#7f7f7f";',
                 f"{inner}anchor_{idx} [shape=point, style=invis];"]
        body = self.block_body(idx, inner, pending)
        lines += [inner + n for n in pending.pop(idx, [])]
        lines += body
        lines.append(f"{indent}}}")
        return lines


def to_dot(program: Program, title: str | None = None) -> str:
    """The global block of ``program`` (and the sub-blocks its ops own) in the dot language."""
    d = _Dot(program)
    pending: dict = {}
    body = d.block_body(0, "    ", pending)
    head = ["digraph program {",
            "    compound=true;",
            "    rankdir=TB;",
            '    node [fontname="Helvetica", fontsize=10];',
            '    edge [fontname="Helvetica", fontsize=8, color="#555555"];']
    if title:
        head.append(f"    label={quote(title)}; labelloc=t;")
    nodes = ["    " + n for key in sorted(pending) for n in pending[key]]
    return "\n".join(head + nodes + body + ["    " + e for e in d.edges] + ["}"]) + "\n"


INSTALL_GRAPHVIZ = ("install Graphviz (apt-get install graphviz, dnf install graphviz, "
                    "brew install graphviz or conda install graphviz)")


def _dot_exe() -> str:
    exe = shutil.which("dot")
    if exe is None:
        raise CliError(f"--svg: Graphviz's 'dot' is not on PATH; {INSTALL_GRAPHVIZ}")
    return exe


def write_svg(dot_path: str, svg_path: str) -> None:
    exe = _dot_exe()
    proc = subprocess.run([exe, "-Tsvg", dot_path, "-o", svg_path], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise CliError(f"--svg: dot -Tsvg {dot_path} failed (exit {proc.returncode}): "
                       f"{msg[-1] if msg else 'no message'}")


def graph(path: str, output: str | None, svg: bool = False, optimize: bool = False,
          out=None) -> int:
    """``pdjit graph``: write the dot text to ``output`` (stdout when None) and, with ``svg``,
    render ``FILE.svg`` beside it with Graphviz's ``dot``. Without ``dot`` on PATH the ``.dot``
    is still written and one line says how to install Graphviz (status 1)."""
    import sys

    from pdjit.tools.model import load_program
    if svg and not output:
        raise CliError("--svg needs -o FILE.dot (the svg is written beside it)")
    loaded = load_program(path)
    program = loaded.program
    if optimize:
        from pdjit.tools.inspect_program import optimized
        program, _ = optimized(loaded)
    text = to_dot(program, title=os.path.basename(loaded.model_file)
                  + (" (optimized)" if optimize else ""))
    if not output:
        (out or sys.stdout).write(text)
        return 0
    try:
        with open(output, "w") as f:
            f.write(text)
    except OSError as e:
        raise CliError(f"-o: cannot write {output}: {e.strerror}") from None
    print(f"# wrote {output}", file=sys.stderr)
    if svg:
        svg_path = (output[:-4] if output.endswith(".dot") else output) + ".svg"
        if shutil.which("dot") is None:
            print(f"pdjit graph: no {svg_path}: Graphviz's 'dot' is not on PATH; "
                  f"{INSTALL_GRAPHVIZ}, then run: dot -Tsvg {output} -o {svg_path}",
                  file=sys.stderr)
            return 1
        write_svg(output, svg_path)
        print(f"# wrote {svg_path}", file=sys.stderr)
    return 0
