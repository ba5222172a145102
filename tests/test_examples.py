"""The examples run as a user runs them, and print what they promise."""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(name: str, *args, env=None, stderr: list | None = None) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    if stderr is not None:
        stderr.append(proc.stderr)
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


# The suite runs a test process per core: the examples' own loop threads would only contend
# (transformer_digits, 3 epochs, load average ~6 on 2 cores: 18.5 s at the default threads,
# 2.7 s at one).
_ONE_THREAD = {"PDJIT_STRICT": "1", "PDJIT_NUM_THREADS": "1"}


def _no_reference_steps(stderr: str, ops) -> None:
    """None of ``ops`` ran its NumPy reference in the run's compiled plans (pdjit warns once
    per op type that does)."""
    ran = set(re.findall(r"op '(\w+)' runs its NumPy reference", stderr))
    assert not ran & set(ops), stderr


def test_transformer_digits_learns_in_a_few_epochs_natively():
    err = []
    out = _run("transformer_digits.py", "--epochs", "3", env=_ONE_THREAD, stderr=err)
    ops = ("mul", "matmul", "softmax", "layer_norm", "gelu", "dropout", "reshape2",
           "transpose2", "elementwise_add", "reduce_mean")
    _no_reference_steps(err[0], ops + tuple(f"{op}_grad" for op in ops))
    acc = float(out.split("test accuracy:")[1].split()[0])
    assert acc > 0.85  # 3 of the default 12 epochs; the full run reaches ~0.97


def test_lstm_digits_learns_with_the_rnn_op_and_dynamic_lstm_natively():
    err = []
    out = _run("lstm_digits.py", "--epochs", "3", env=_ONE_THREAD, stderr=err)
    ops = ("rnn", "lstm", "mul", "elementwise_add", "sequence_pool", "reshape2", "transpose2")
    _no_reference_steps(err[0], ops + tuple(f"{op}_grad" for op in ops))
    for name in ("rnn", "dynamic_lstm"):
        acc = float(out.split(f"{name} test accuracy:")[1].split()[0])
        assert acc > 0.85, (name, acc)  # 3 of the default 10 epochs; the full run: ~0.98 each
