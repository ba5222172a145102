"""The examples run as a user runs them, and print what they promise."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(name: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_fit_a_line_prints_predictions_and_cost():
    out = _run("fit_a_line.py")
    assert out.startswith("[array([[") and "dtype=float32)" in out
    assert out.count("array(") == 2


def test_inspect_program_round_trips():
    out = _run("inspect_program.py")
    assert "parsed back identical: True" in out
    assert "ops: ['mul', 'elementwise_add', 'relu', 'mul', 'elementwise_add']" in out
    assert 'type: LOD_TENSOR' in out


def test_cli_inspect_and_ops(tmp_path):
    model = ROOT / "tests" / "fixtures" / "paddle" / "mlp_infer.pdmodel"
    cli = [sys.executable, "-m", "pdjit.cli"]
    out = subprocess.run(cli + ["inspect", str(model)], capture_output=True, text=True)
    assert out.returncode == 0 and "softmax(inputs={X=" in out.stdout
    out = subprocess.run(cli + ["ops", "mul"], capture_output=True, text=True)
    assert out.returncode == 0 and "attr x_num_col_dims: INT = 1" in out.stdout
    out = subprocess.run(cli + ["ops", "nope"], capture_output=True, text=True)
    assert out.returncode == 2 and "'nope' is not registered" in out.stderr
    bad = tmp_path / "bad.pdmodel"
    bad.write_bytes(b"\xff\xfe garbage")
    out = subprocess.run(cli + ["inspect", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "cannot parse a ProgramDesc" in out.stderr
