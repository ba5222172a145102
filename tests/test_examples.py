"""The examples run as a user runs them, and print what they promise."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(name: str, *args) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_fit_a_line_trains_and_prints_predictions_and_cost():
    out = _run("fit_a_line.py")
    costs = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step")]
    assert len(costs) == 6 and costs[-1] < costs[0] / 100  # the loss decreases
    tail = out[out.index("[array([["):]
    assert "dtype=float32)" in tail and tail.count("array(") == 2


def test_inspect_program_round_trips():
    out = _run("inspect_program.py")
    assert "parsed back identical: True" in out
    assert "ops: ['mul', 'elementwise_add', 'relu', 'mul', 'elementwise_add']" in out
    assert 'type: LOD_TENSOR' in out


def test_digits_mlp_learns_on_a_few_epochs():
    out = _run("digits_mlp.py", "--epochs", "3")
    acc = float(out.split("test accuracy:")[1].split()[0])
    assert acc > 0.85  # 3 of the default 25 epochs; the full run reaches ~0.99


def test_custom_op_example_fuses_and_trains():
    out = _run("custom_op.py")
    assert "output and gradient checked" in out
    assert "squareplus#" in out and "squareplus_grad#" in out
    first, last = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step")]
    assert last < first


def test_text_classification_learns_from_lod_batches():
    out = _run("text_classification.py", "--epochs", "2")
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("epoch")]
    assert len(losses) == 2 and losses[1] < losses[0]
    acc = float(out.split("test accuracy:")[1].split()[0])
    assert acc > 0.85  # 2 of the default 4 epochs; the full run reaches ~0.96


def test_digits_cnn_learns_in_one_epoch():
    out = _run("digits_cnn.py", "--epochs", "1")
    acc = float(out.split("test accuracy:")[1].split()[0])
    assert acc > 0.85  # 1 of the default 15 epochs; the full run reaches ~0.99
