"""The examples run as a user runs them, and print what they promise."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(name: str, *args, env=None, stderr: list | None = None) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    if stderr is not None:
        stderr.append(proc.stderr)
    return proc.stdout


def test_fit_a_line_trains_and_prints_predictions_and_cost_the_same_every_run():
    out = _run("fit_a_line.py")
    costs = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step")]
    assert len(costs) == 6 and costs[-1] < costs[0] / 100  # the loss decreases
    tail = out[out.index("[array([["):]
    assert "dtype=float32)" in tail and tail.count("array(") == 2
    assert _run("fit_a_line.py") == out   # the programs' random_seed: reproducible


EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))
HEAVY = ("numpy", "numba", "pdjit", "sklearn", "matplotlib", "scipy")
_HELP_DRIVER = """
import contextlib, io, json, runpy, sys, time
examples = sys.argv[1]
sys.path.insert(0, examples)
report = {}
for name in sys.argv[2:]:
    before, out, t0 = set(sys.modules), io.StringIO(), time.perf_counter()
    sys.argv = [examples + "/" + name, "--help"]
    code = "no exit"
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as e:
            code = e.code
    report[name] = {"code": code, "help": out.getvalue(), "seconds": time.perf_counter() - t0,
                    "imported": sorted({m.split(".")[0] for m in set(sys.modules) - before})}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def help_pages():
    """Every example's ``--help``, asked in one process (cheap: no example imports anything
    heavy before its arguments are parsed)."""
    import json

    proc = subprocess.run([sys.executable, "-c", _HELP_DRIVER, str(ROOT / "examples"),
                           *EXAMPLES], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_answers_help_at_once_without_training(help_pages, name):
    page = help_pages[name]
    assert page["code"] == 0, page
    assert page["help"].startswith("usage:") and "--help" in page["help"], page["help"]
    assert not set(page["imported"]) & set(HEAVY), page["imported"]  # nothing heavy imported
    assert page["seconds"] < 2.0, page["seconds"]


def _check_plot(path):
    """``check_plot_path``'s verdict on ``path``: ``None`` if accepted, else its message."""
    import argparse
    import contextlib
    import io

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from _plotting import check_plot_path
    finally:
        sys.path.pop(0)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            check_plot_path(argparse.ArgumentParser(prog="example"), str(path))
        except SystemExit as e:
            assert e.code == 2
            return err.getvalue()
    return None


def test_a_plot_path_that_cannot_be_written_is_refused_with_its_reason(tmp_path):
    missing = tmp_path / "no-such-dir" / "loss.png"
    assert "does not exist" in _check_plot(missing) and str(missing.parent) in _check_plot(missing)
    (tmp_path / "a-file").write_text("")
    assert "is not a directory" in _check_plot(tmp_path / "a-file" / "loss.png")
    assert "is a directory" in _check_plot(tmp_path)
    if os.geteuid() != 0:                      # root writes anywhere: nothing to refuse
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "cannot be written" in _check_plot(locked / "loss.png")
    if importlib.util.find_spec("matplotlib") is None:  # (the examples extra brings it)
        assert "needs matplotlib" in _check_plot(tmp_path / "loss.png")
        return
    assert "cannot write .xyz files" in _check_plot(tmp_path / "loss.xyz")
    assert _check_plot(tmp_path / "loss.png") is None
    assert not (tmp_path / "loss.png").exists()   # the check leaves nothing behind


def test_a_bad_plot_path_fails_before_training():
    missing = "/nonexistent-pdjit-dir/loss.png"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "digits_mlp.py"),
                           "--plot", missing], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout   # nothing trained
    assert "--plot '/nonexistent-pdjit-dir/loss.png'" in proc.stderr
    assert "does not exist" in proc.stderr


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
