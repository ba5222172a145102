"""The examples run as a user runs them, and print what they promise."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


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


def test_fit_a_line_plots_its_loss_alone(tmp_path):
    """A regression has no accuracy: its figure is the loss panel only."""
    if importlib.util.find_spec("matplotlib") is None:
        return
    out = _run("fit_a_line.py", "--plot", str(tmp_path / "loss.png"))
    assert out.splitlines()[-1] == f"figure saved to {tmp_path / 'loss.png'}"
    data = (tmp_path / "loss.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"Description\x00panels: Training loss" in data and b"Accuracy" not in data


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
        from _training import check_plot_path
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


def _check_figure(path, title_words) -> None:
    """``path`` is a PNG (its signature, decoded by matplotlib) of two panels side by side,
    a loss and an accuracy panel (the panel titles the figure's PNG metadata records; ink in
    each half of the image)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    text = {}
    pos = 8
    while pos < len(data):  # the PNG's chunks: length, type, data, crc
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + n
    assert text.get("Description") == "panels: Training loss; Accuracy", text
    assert all(w in text.get("Title", "") for w in title_words), text
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    assert img.ndim == 3 and img.shape[1] > img.shape[0] > 200, img.shape
    dark = img[..., :3].mean(axis=2) < 0.5
    half = img.shape[1] // 2
    assert dark[:, :half].sum() > 500 and dark[:, half:].sum() > 500  # both panels drawn


def _plot_args(path) -> tuple:
    """``--plot PATH`` where matplotlib is installed (the examples extra); without it an example
    refuses the option before training (tested in
    ``test_a_plot_path_that_cannot_be_written_is_refused_with_its_reason``)."""
    return ("--plot", str(path)) if importlib.util.find_spec("matplotlib") is not None else ()


def test_digits_mlp_learns_on_a_few_epochs_and_plots(tmp_path):
    err = []
    out = _run("digits_mlp.py", "--epochs", "3", *_plot_args(tmp_path / "c.png"), stderr=err)
    acc = float(out.split("test accuracy:")[1].split()[0])
    assert acc > 0.85  # 3 of the default 25 epochs; the full run reaches ~0.99
    # the progress: tqdm's bar, or a line per epoch, with the running loss and accuracy
    assert re.search(r"69/69.*loss \d\.\d{4}  acc \d+\.\d%", err[0]), err[0]
    if importlib.util.find_spec("matplotlib") is not None:
        _check_figure(tmp_path / "c.png", ["MLP"])
        assert f"figure saved to {tmp_path / 'c.png'}" in out


def test_the_plain_progress_line_without_tqdm():
    """Without tqdm: one line per epoch on a stream that is not a terminal."""
    import io

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import _training
    finally:
        sys.path.pop(0)
    stream = io.StringIO()
    p = _training.Progress(4, "demo", stream=stream, use_tqdm=False)
    for loss, acc in ((2.0, 0.25), (1.0, 0.75)):
        p.step(loss, acc)
    p.end_epoch()
    p.step(0.5, 1.0)
    p.end_epoch()
    p.close()
    assert stream.getvalue() == ("demo: epoch 1  step 2/4  loss 1.5000  acc 50.0%\n"
                                 "demo: epoch 2  step 3/4  loss 0.5000  acc 100.0%\n")
    assert p.losses == [2.0, 1.0, 0.5] and p.epoch_ends == [2, 3]
    # span 3: weight 0.5; the last mean 0.5 * 0.875 + 0.5 * 4, over 1 - 0.5 ** 4 (bias)
    sm = _training.smooth([1.0, 1.0, 1.0, 4.0], span=3)
    assert sm[:3] == [1.0, 1.0, 1.0] and abs(sm[3] - 2.4375 / 0.9375) < 1e-12


def test_the_distributed_example_names_its_extra_when_mpi_is_missing():
    driver = ("import runpy, sys\n"
              "sys.modules['mpi4py'] = None  # import mpi4py fails, as when not installed\n"
              "sys.path.insert(0, sys.argv[1])\n"
              "sys.argv = [sys.argv[1] + '/distributed_digits.py', '--epochs', '1']\n"
              "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", driver, str(ROOT / "examples")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "pip install -e '.[distributed]'" in proc.stderr


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


def test_lstm_digits_learns_with_the_rnn_op_and_dynamic_lstm_natively(tmp_path):
    err = []
    out = _run("lstm_digits.py", "--epochs", "3", *_plot_args(tmp_path / "lstm.png"),
               env=_ONE_THREAD, stderr=err)
    ops = ("rnn", "lstm", "mul", "elementwise_add", "sequence_pool", "reshape2", "transpose2")
    _no_reference_steps(err[0], ops + tuple(f"{op}_grad" for op in ops))
    for name in ("rnn", "dynamic_lstm"):
        acc = float(out.split(f"{name} test accuracy:")[1].split()[0])
        assert acc > 0.85, (name, acc)  # 3 of the default 10 epochs; the full run: ~0.98 each
    if importlib.util.find_spec("matplotlib") is not None:  # both models' curves, one figure
        _check_figure(tmp_path / "lstm.png", ["LSTM", "dynamic_lstm"])
