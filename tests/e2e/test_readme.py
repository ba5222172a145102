"""The README's Python blocks run as written, in order, in one fresh process (they build on each
other, as a reader running the tour does), in an empty directory.

A block preceded by ``<!-- not run by tests/e2e/test_readme.py: REASON -->`` is left out. The shell
blocks (the command line on the model the tour saves, the C build) are not run here; the same
commands are tested by tests/tools/test_cli.py and tests/codegen/aot.
"""
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_BLOCK = re.compile(r"(?P<skip><!-- not run by tests/e2e/test_readme\.py:[^>]*-->\s*\n)?"
                    r"^```python\n(?P<code>.*?)^```", re.S | re.M)
_DRIVER = """
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for line, code in blocks:
    exec(compile(code, f"README.md, the block at line {line}", "exec"), namespace)
    print(f"-- block at line {line} ran", flush=True)
"""


def python_blocks(text: str) -> list:
    """``[(line, code)]`` of the README's runnable Python blocks."""
    return [(text.count("\n", 0, m.start("code")) + 1, m.group("code"))
            for m in _BLOCK.finditer(text) if not m.group("skip")]


def test_the_readme_python_blocks_run(tmp_path):
    text = README.read_text()
    blocks = python_blocks(text)
    assert len(blocks) >= 4, blocks  # the tour: train, explain, save and load, Predictor
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p])}
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(tmp_path / "blocks.json")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ran\n") == len(blocks)
    loss, accuracy = map(float, re.search(r"loss ([\d.]+), accuracy ([\d.]+)",
                                          proc.stdout).groups())
    assert loss < 0.2 and accuracy > 0.9, proc.stdout   # the tour's model learns
    assert "group elementwise: elementwise [elementwise_add#1, relu#2]" in proc.stdout
    for name in ("model/clf.pdmodel", "model/clf.pdiparams", "x.npy"):  # what the shell uses
        assert (tmp_path / name).is_file(), name


def test_the_readme_names_what_exists():
    """Files and commands the README points at are there."""
    text = README.read_text()
    for path in re.findall(r"`((?:examples|benchmarks|tests|docs)/[\w/.]+\.(?:py|md))`", text):
        assert (ROOT / path).is_file(), path
    assert (ROOT / "docs" / "reference.md").is_file()
    for command in ("run", "bench", "check", "inspect", "graph", "compile", "ops", "version"):
        assert f"`pdjit {command}" in text, command
