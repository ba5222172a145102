"""The ``pdjit`` command line: ``run``, ``bench``, ``inspect``, ``graph``, ``ops``, ``version``.

Commands run in-process through ``pdjit.cli.main(argv)`` (one subprocess smoke test). Oracles:
the forward pass in NumPy from the parameters the test trained, PaddlePaddle's outputs stored
with the fixtures, and counts computed here from the arrays. Native code must run: the test
session is strict (``PDJIT_STRICT=1``, conftest) and a reference step is an error here.
"""
import argparse
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from google.protobuf import text_format

import pdjit as fluid
import pdjit.static as static
from pdjit.cli import main
from pdjit.framework.errors import ReferenceStepWarning
from pdjit.proto import framework_pb2 as pb
from pdjit.tools.bench import Progress
from pdjit.tools.graph import quote, to_dot

L = fluid.layers
ROOT = pathlib.Path(__file__).resolve().parents[2]
PADDLE = ROOT / "tests" / "fixtures" / "paddle"
CORPUS = PADDLE / "models"
RNG = np.random.default_rng(17)


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A two-input MLP built with pdjit's layers, saved with ``pdjit.static``; its parameters
    (for the NumPy oracle) and the names of its outputs."""
    d = tmp_path_factory.mktemp("model")
    main_p, startup = fluid.Program(), fluid.Program()
    scope = fluid.Scope()
    with fluid.program_guard(main_p, startup), fluid.unique_name.guard(), \
            fluid.scope_guard(scope):
        x = L.data("x", [8])
        extra = L.data("extra", [16])
        h = L.fc(x, 16, act="relu")
        y = L.fc(L.elementwise_add(h, extra), 4, act="softmax")
        exe = fluid.Executor()
        exe.run(startup)
        static.save_inference_model(str(d / "mlp2"), [x, extra], [y, h], exe, program=main_p)
        params = {n: np.array(scope.find_var(n).value)
                  for n in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0")}
    return {"prefix": str(d / "mlp2"), "dir": d, "params": params, "outputs": [y.name, h.name]}


def _forward(params, x, extra):
    h = np.maximum(x @ params["fc_0.w_0"] + params["fc_0.b_0"], 0)
    return _softmax((h + extra) @ params["fc_1.w_0"] + params["fc_1.b_0"]), h


def _cli(capsys, *argv) -> tuple:
    """``(status, stdout, stderr)`` of ``pdjit argv`` in this process; a compiled plan that runs
    an op with its NumPy reference fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceStepWarning)
        code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _save(tmp_path, name, array) -> str:
    path = tmp_path / name
    np.save(path, array)
    return str(path)


# -- run ------------------------------------------------------------------------------------------
def test_run_two_inputs_matches_numpy(saved, tmp_path, capsys):
    x = RNG.standard_normal((3, 8)).astype("float32")
    extra = RNG.standard_normal((3, 16)).astype("float32")
    out = tmp_path / "out.npz"
    code, stdout, err = _cli(capsys, "run", saved["prefix"], "--input",
                             f"x={_save(tmp_path, 'x.npy', x)}", "--input",
                             f"extra={_save(tmp_path, 'e.npy', extra)}", "--output", out)
    assert code == 0, err
    want_y, want_h = _forward(saved["params"], x, extra)
    got = np.load(out)
    assert sorted(got.files) == sorted(saved["outputs"])
    np.testing.assert_allclose(got[saved["outputs"][0]], want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[saved["outputs"][1]], want_h, rtol=1e-5, atol=1e-6)
    lines = stdout.splitlines()
    assert len(lines) == 2
    y_line = next(s for s in lines if s.startswith(saved["outputs"][0]))
    assert "[3, 4]" in y_line and "float32" in y_line
    m = re.search(r"min (\S+)  max (\S+)  mean (\S+)  first \[(.*), \.\.\.\]$", y_line)
    assert m, y_line
    np.testing.assert_allclose([float(v) for v in m.groups()[:3]],
                               [want_y.min(), want_y.max(), want_y.mean()], rtol=1e-5)
    np.testing.assert_allclose([float(v) for v in m.group(4).split(", ")],
                               want_y.reshape(-1)[:6], rtol=1e-5)
    # the inputs also come from one .npz holding both names
    np.savez(tmp_path / "both.npz", x=x, extra=extra)
    code, _, err = _cli(capsys, "run", saved["dir"], "--input", tmp_path / "both.npz",
                        "--no-ir-optim", "--threads", 1, "-o", tmp_path / "o2.npz")
    assert code == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "o2.npz")[saved["outputs"][0]], want_y,
                               rtol=1e-5, atol=1e-6)


def test_run_paddle_saved_mlp_matches_paddle(tmp_path, capsys):
    io = np.load(PADDLE / "mlp_infer_io.npz")
    out = tmp_path / "o.npz"
    code, stdout, err = _cli(capsys, "run", PADDLE / "mlp_infer.pdmodel", "--input",
                             _save(tmp_path, "x.npy", io["x"]), "-o", out)
    assert code == 0, err
    np.testing.assert_allclose(np.load(out)["softmax_0.tmp_0"], io["softmax_0.tmp_0"],
                               rtol=1e-5, atol=1e-6)
    assert stdout.startswith("softmax_0.tmp_0  [5, 4]")


CORPUS_CASES = ["mlp_dir", "mlp_combined_dir", "lenet", "mobilenet", "cond_while"]


@pytest.mark.parametrize("name", CORPUS_CASES)
def test_run_corpus_models_match_paddle(name, tmp_path, capsys):
    model = CORPUS / (name if name.endswith("_dir") else f"{name}.pdmodel")
    base = name.replace("_combined_dir", "").replace("_dir", "")
    io_file = CORPUS / f"{base}_io.npz"
    if not model.exists() or not io_file.exists():
        pytest.skip(f"{model.name} is not in the corpus")
    io = np.load(io_file)
    case = "batch2"
    feeds = {k.split("/")[-1]: io[k] for k in io.files if k.startswith(f"{case}/feed/")}
    args = ["run", model, "-o", tmp_path / "o.npz", "--threads", 1]
    for n, v in feeds.items():
        args += ["--input", f"{n}={_save(tmp_path, n + '.npy', v)}"]
    code, _, err = _cli(capsys, *args)
    assert code == 0, err
    got = np.load(tmp_path / "o.npz")
    for k in io.files:
        if k.startswith(f"{case}/fetch/"):
            np.testing.assert_allclose(got[k.split("/")[-1]], io[k], rtol=1e-5, atol=1e-5)


def _damaged_copy(saved, tmp_path, cut: int) -> str:
    prefix = tmp_path / "bad"
    shutil.copy(saved["prefix"] + ".pdmodel", str(prefix) + ".pdmodel")
    data = pathlib.Path(saved["prefix"] + ".pdiparams").read_bytes()
    pathlib.Path(str(prefix) + ".pdiparams").write_bytes(data[:cut])
    return str(prefix)


def test_run_bad_input_is_one_line_naming_it(saved, tmp_path, capsys):
    x = RNG.standard_normal((2, 8)).astype("float32")
    e = RNG.standard_normal((2, 16)).astype("float32")
    xf, ef = _save(tmp_path, "x.npy", x), _save(tmp_path, "e.npy", e)
    garbage = tmp_path / "garbage.pdmodel"
    garbage.write_bytes(b"\xff\xfe not a program")
    not_npy = tmp_path / "text.npy"
    not_npy.write_text("hello")
    ok = ["--input", f"x={xf}", "--input", f"extra={ef}"]
    objects = tmp_path / "objects.npz"
    np.savez(objects, x=np.array([x, None], dtype=object), extra=e)
    p = saved["prefix"]
    cases = [
        (["run", p, "--input", objects], ["objects.npz", "'x'", "not a plain NumPy array"]),
        (["run", tmp_path / "nowhere"], ["nowhere"]),
        (["run", garbage, "--input", xf], ["garbage.pdmodel", "ProgramDesc"]),
        (["run", _damaged_copy(saved, tmp_path, 100)] + ok, ["bad.pdiparams", "fc_"]),
        (["run", p, "--input", f"nope={xf}", "--input", f"extra={ef}"], ["'nope'", "'x'"]),
        (["run", p, "--input", f"x={_save(tmp_path, 'x64.npy', x.astype('float64'))}",
          "--input", f"extra={ef}"], ["'x'", "float32", "float64"]),
        (["run", p, "--input", f"x={_save(tmp_path, 'x7.npy', x[:, :7])}",
          "--input", f"extra={ef}"], ["'x'", "[2, 7]"]),
        (["run", p, "--input", f"x={tmp_path / 'missing.npy'}", "--input", f"extra={ef}"],
         ["missing.npy"]),
        (["run", p, "--input", f"x={not_npy}", "--input", f"extra={ef}"], ["text.npy"]),
        (["run", p, "--input", f"x={xf}"], ["'extra'"]),
        (["run", p, "--input", xf], ["2 inputs", "NAME=FILE.npy"]),
        (["run", p] + ok + ["-o", tmp_path / "no" / "dir" / "o.npz"], ["o.npz"]),
    ]
    for argv, names in cases:
        code, out, err = _cli(capsys, *argv)
        assert code == 2, (argv, out, err)
        assert err.startswith("pdjit run: ") and err.count("\n") == 1, err
        assert "Traceback" not in err
        for n in names:
            assert n in err, (argv, err)


# -- inspect --------------------------------------------------------------------------------------
def test_inspect_saved_model_histogram_and_parameters(saved, capsys):
    code, out, err = _cli(capsys, "inspect", saved["prefix"])
    assert code == 0, err
    assert "mul(inputs={X=['x'], Y=['fc_0.w_0']}" in out
    assert "# inputs:  x [-1, 8] float32; extra [-1, 16] float32" in out
    hist = out[out.index("# op histogram"):]
    assert "#   block 0: 11 ops" in hist  # 2 feed, 2 mul, 3 add, relu, softmax, 2 fetch
    counts = {line.split()[1]: int(line.split()[2]) for line in hist.splitlines()
              if line.startswith("#     ") and len(line.split()) == 3}
    assert counts == {"feed": 2, "mul": 2, "elementwise_add": 3, "relu": 1, "softmax": 1,
                      "fetch": 2}
    params = saved["params"]
    n_elems = sum(v.size for v in params.values())
    n_bytes = sum(v.nbytes for v in params.values())
    assert f"#   4 variables, {n_elems:,} elements, {n_bytes:,} bytes" in out
    largest = max(params, key=lambda n: params[n].nbytes)
    assert out.index(f"#     {largest} ") < out.index("#     fc_1.b_0 ")


def test_inspect_training_program_and_text(capsys):
    code, out, err = _cli(capsys, "inspect", PADDLE / "fit_a_line_main.pb")
    assert code == 0 and err == "", err
    assert "sgd(inputs=" in out and "# persistable variables (declared sizes" in out
    assert "#   3 variables, 3 elements, 12 bytes" in out  # w [1, 1], b [1], learning rate [1]
    assert " 1 element " in out and "1 elements" not in out
    code, out, err = _cli(capsys, "inspect", PADDLE / "mlp_infer.pdmodel", "--text")
    assert code == 0, err
    desc = text_format.Parse(out, pb.ProgramDesc())  # the summary lines are text comments
    assert [op.type for op in desc.blocks[0].ops].count("mul") == 2
    assert "#   4 variables, 212 elements, 848 bytes" in out


def test_inspect_optimized_folds_batch_norm(capsys):
    model = CORPUS / "mobilenet.pdmodel"
    if not model.exists():
        pytest.skip("no mobilenet in the corpus")
    code, before, err = _cli(capsys, "inspect", model)
    assert code == 0 and "batch_norm(" in before, err
    code, after, err = _cli(capsys, "inspect", model, "--optimized")
    assert code == 0, err
    assert "batch_norm(" not in after and "# after the inference passes:" in after
    assert "batch_norm" not in after[after.index("# op histogram"):]


def test_inspect_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.pdmodel"
    bad.write_bytes(b"\xff\xfe garbage")
    for argv, names in ((["inspect", bad], ["bad.pdmodel", "cannot parse a ProgramDesc"]),
                        (["inspect", tmp_path / "none.pb"], ["none.pb"]),
                        (["inspect", PADDLE], [str(PADDLE), "*.pdmodel"])):
        code, out, err = _cli(capsys, *argv)
        assert code == 2 and err.startswith("pdjit inspect: ") and err.count("\n") == 1, err
        assert all(n in err for n in names), err


# -- graph ----------------------------------------------------------------------------------------
def _control_flow_program():
    """A while loop (Fluid 1.x ``While``) then a ``cond`` with a nested ``cond``."""
    main_p, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main_p, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[3], dtype="float32", append_batch_size=False)
        i = L.fill_constant([1], "int64", 0)
        limit = L.fill_constant([1], "int64", 3)
        acc = L.fill_constant([3], "float32", 0.0)
        c = L.less_than(i, limit)
        loop = L.While(c)
        with loop.block():
            L.assign(acc + x, acc)
            L.increment(i, 1.0, in_place=True)
            L.less_than(i, limit, cond=c)
        s = L.reduce_sum(acc)
        zero = L.fill_constant([1], "float32", 0.0)
        L.cond(L.less_than(s, zero), lambda: acc * -1.0,
               lambda: L.cond(L.less_than(s, zero + 10.0), lambda: acc + 1.0, lambda: acc))
    return main_p


def _dot_node_ids(text: str) -> set:
    ids = set()
    for line in text.splitlines():
        t = line.strip()
        if "[" in t and "->" not in t.split("[")[0]:
            ids.add(t.split("[")[0].strip())
    return ids


def test_graph_control_flow_clusters(tmp_path, capsys):
    program = _control_flow_program()
    path = tmp_path / "cf.pb"
    path.write_bytes(program.serialize_to_string())
    code, text, err = _cli(capsys, "graph", path)
    assert code == 0, err
    assert text.startswith("digraph program {") and text.rstrip().endswith("}")
    depth = 0
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', text):  # braces outside quoted strings
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    nodes = _dot_node_ids(text)
    for b in program.blocks:
        for i, _ in enumerate(b.ops):
            assert f"op_{b.idx}_{i}" in nodes, (b.idx, i)
    owners = [(b.idx, i, op) for b in program.blocks for i, op in enumerate(b.ops)
              if op.type in ("while", "conditional_block")]
    assert {op.type for _, _, op in owners} == {"while", "conditional_block"}
    for bidx, i, op in owners:
        sub = op.attr("sub_block")
        assert f"subgraph cluster_{sub} {{" in text
        assert f"op_{bidx}_{i} -> anchor_{sub} [lhead=cluster_{sub}" in text
    assert len(program.blocks) >= 5  # the while body, two branches, the nested cond's two
    # a sub-block's ops are drawn inside its cluster; a nested cond's cluster inside its parent's
    inner = [b for b in program.blocks if b.parent_idx > 0]
    assert inner, "the nested cond's blocks"
    for b in inner:
        outer_at = text.index(f"subgraph cluster_{b.parent_idx} {{")
        inner_at = text.index(f"subgraph cluster_{b.idx} {{")
        assert outer_at < inner_at
    # every edge joins declared nodes
    for line in text.splitlines():
        if "->" in line:
            a, rest = line.strip().split(" -> ", 1)
            assert a in nodes and rest.split(" ")[0] in nodes, line


def test_graph_names_are_escaped():
    assert quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    main_p = fluid.Program()
    with fluid.program_guard(main_p, fluid.Program()):
        x = L.data(name='in"put\\x', shape=[2], dtype="float32", append_batch_size=False)
        L.scale(x, 2.0)
    text = to_dot(main_p, title='a "title"')
    assert 'label="in\\"put\\\\x\\n[2] float32"' in text
    assert 'label="a \\"title\\""' in text


def test_graph_file_svg_and_bad_input(saved, tmp_path, capsys, monkeypatch):
    out = tmp_path / "m.dot"
    code, _, err = _cli(capsys, "graph", saved["prefix"], "-o", out)
    assert code == 0, err
    text = out.read_text()
    assert text.count("shape=box") == 11 and 'style="filled", fillcolor="#d9d9d9"' in text
    if shutil.which("dot"):
        code, _, err = _cli(capsys, "graph", saved["prefix"], "-o", out, "--svg")
        assert code == 0, err
        assert "<svg" in (tmp_path / "m.svg").read_text()
    monkeypatch.setenv("PATH", str(tmp_path))  # no Graphviz here: the .dot, and how to install
    out.unlink()
    (tmp_path / "m.svg").unlink(missing_ok=True)
    code, _, err = _cli(capsys, "graph", saved["prefix"], "-o", out, "--svg")
    assert code == 1 and out.read_text() == text and not (tmp_path / "m.svg").exists()
    (line,) = [s for s in err.splitlines() if not s.startswith("# wrote")]
    assert line.startswith("pdjit graph: ") and "apt-get install graphviz" in line, err
    for argv, names in ((["graph", saved["prefix"], "--svg"], ["-o"]),
                        (["graph", tmp_path / "none"], ["none"]),
                        (["graph", saved["prefix"], "-o", tmp_path / "x" / "y.dot"], ["y.dot"])):
        code, _, err = _cli(capsys, *argv)
        assert code == 2 and err.startswith("pdjit graph: ") and err.count("\n") == 1, err
        assert all(n in err for n in names), err


# -- bench ----------------------------------------------------------------------------------------
def test_bench_table_json_and_a_missing_peer(saved, tmp_path, capsys, monkeypatch):
    """A peer that is not installed is one line on stderr and appears nowhere else."""
    import pdjit.tools.bench as bench_mod

    monkeypatch.setitem(bench_mod._MODULES, "paddle", "pdjit_test_no_such_module")
    out = tmp_path / "b.json"
    code, stdout, err = _cli(capsys, "bench", saved["prefix"], "--batch", "1,2", "--repeat", 3,
                             "--warmup", 1, "--threads", 1, "--compare", "paddle",
                             "--json", out)
    assert code == 0, err
    assert "paddle" not in stdout
    (line,) = [s for s in err.splitlines() if "paddle" in s]
    assert line.startswith("pdjit bench: paddle is not installed") and "pip install" in line
    rows = [line.split() for line in stdout.splitlines() if line[:5].strip().isdigit()]
    assert [(r[0], r[1]) for r in rows] == [("1", "pdjit"), ("2", "pdjit")]
    assert "batch 2" in err and "/10]" in err  # the progress on stderr: 2 x (1 + 1 + 3) runs
    report = json.loads(out.read_text())
    assert report["threads"] == 1 and report["batches"] == [1, 2]
    assert list(report["engines"]) == ["pdjit"] and report["engines"]["pdjit"]["status"] == "ok"
    assert report["inputs"]["x"] == {"shape": [-1, 8], "dtype": "float32"}
    # pdjit's warm-up went on until it served each batch size as it goes on serving it
    settled = report["engines"]["pdjit"]["settled"]
    assert sorted(settled) == ["1", "2"] and all(ok for _, _, ok in settled.values()), settled
    assert all(runs >= bench_mod.SETTLED_RUNS for runs, _, _ in settled.values()), settled
    assert "batch 1: settled after" in stdout and "batch 2: settled after" in stdout
    for r, batch in zip(report["results"], [1, 2]):
        assert r["engine"] == "pdjit" and r["batch"] == batch and r["runs"] == 3
        assert 0 < r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
        assert r["samples_per_s"] == pytest.approx(batch / (r["median_ms"] / 1e3))
        assert r["first_run_s"] > 0


def test_bench_compares_installed_peers(tmp_path, capsys):
    code, stdout, err = _cli(capsys, "bench", PADDLE / "mlp_infer", "--batch", "2", "--repeat",
                             2, "--warmup", 0, "--threads", 1, "--compare",
                             "onnxruntime,paddle", "--json", tmp_path / "b.json")
    assert code == 0, err
    report = json.loads((tmp_path / "b.json").read_text())
    onnx_ready = importlib.util.find_spec("onnxruntime") is not None and \
        importlib.util.find_spec("pdjit.io.onnx_export") is not None
    for peer, ready in (("onnxruntime", onnx_ready),
                        ("paddle", importlib.util.find_spec("paddle") is not None)):
        if importlib.util.find_spec(peer) is None:
            assert peer not in report["engines"] and f"{peer} is not installed" in err
            continue
        st = report["engines"][peer]
        if not ready:
            assert st["status"] == "failed" and st["reason"], st
            continue
        assert st["status"] == "ok", st
        (row,) = [r for r in report["results"] if r["engine"] == peer]
        assert row["max_abs_diff_vs_pdjit"] < 1e-5
        pd = next(r for r in report["results"] if r["engine"] == "pdjit")
        assert row["pdjit_over_peer"] == pytest.approx(pd["median_ms"] / row["median_ms"])
        assert f"{row['pdjit_over_peer']:.2f}x" in stdout


def test_bench_bad_input(saved, tmp_path, capsys):
    main_p = fluid.Program()
    with fluid.program_guard(main_p, fluid.Program()), fluid.unique_name.guard():
        s = L.data(name="s", shape=[-1, -1], dtype="float32", append_batch_size=False)
        y = L.scale(s, 2.0)
    exe = fluid.Executor()
    static.save_inference_model(str(tmp_path / "dyn"), [s], [y], exe, program=main_p)
    p = saved["prefix"]
    for argv, names in ((["bench", p, "--batch", "0"], ["--batch", "0"]),
                        (["bench", p, "--batch", "a,b"], ["--batch", "a,b"]),
                        (["bench", p, "--shape", "nope=1,2"], ["'nope'", "'x'"]),
                        (["bench", p, "--shape", "x=-1,9"], ["x=-1,9", "[-1, 8]"]),
                        (["bench", tmp_path / "dyn"], ["'s'", "--shape s="]),
                        (["bench", tmp_path / "none"], ["none"]),
                        (["bench", p, "--compare", "nope"], ["'nope'", "onnxruntime"])):
        code, _, err = _cli(capsys, *argv)
        assert code == 2 and err.startswith("pdjit bench: ") and err.count("\n") == 1, err
        assert all(n in err for n in names), (argv, err)
    with pytest.raises(SystemExit) as e:  # argparse's own check
        main(["bench", p, "--repeat", "0"])
    assert e.value.code == 2 and "--repeat: expected an integer >= 1, got 0" in \
        capsys.readouterr().err
    code, stdout, err = _cli(capsys, "bench", tmp_path / "dyn", "--shape", "s=-1,3",
                             "--batch", "2", "--repeat", 1, "--warmup", 0, "--no-progress")
    assert code == 0 and "s [-1, 3] float32" in stdout and err == "", err


def test_progress_bar_on_a_terminal():
    class Tty:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    t = Tty()
    bar = Progress(4, stream=t, width=8)
    bar.update(0, "batch 1")
    bar.update(2)
    bar.update(2, "batch 2")
    bar.close()
    assert "\r[........] 0/4  batch 1" in t.text and "\r[########] 4/4  batch 2" in t.text
    assert t.text.endswith("\r")


# -- ops, version, and the installed command ------------------------------------------------------
def test_ops_and_version(capsys):
    code, out, _ = _cli(capsys, "ops", "mul")
    assert code == 0 and "attr x_num_col_dims: INT = 1" in out
    code, _, err = _cli(capsys, "ops", "nope")
    assert code == 2 and "'nope' is not registered" in err
    code, out, _ = _cli(capsys, "version")
    assert code == 0 and out.strip() == fluid.__version__


def test_module_entry_point_smoke():
    proc = subprocess.run([sys.executable, "-m", "pdjit.cli", "inspect",
                           str(PADDLE / "mlp_infer.pdmodel")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0 and "softmax(inputs={X=" in proc.stdout, proc.stderr
    assert "# op histogram" in proc.stdout


def test_compile_is_the_aot_command(capsys):
    """``pdjit compile`` takes the arguments of ``python -m pdjit.aot compile``
    (tests/codegen/aot runs the artifacts); a model it cannot read, or an output name that
    ``import`` cannot take, is one error line and status 2."""
    from pdjit.cli import build_parser

    args = build_parser().parse_args(["compile", "m", "-o", "out", "--batch", "4", "--cpu",
                                      "generic"])
    assert (args.model, args.output, args.batch, args.cpu) == ("m", "out", 4, "generic")
    assert main(["compile", "/nonexistent/model", "-o", "/tmp/pdjit_never_written"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pdjit compile: ") and "/nonexistent/model" in err, err
    for bad, fix in (("my-model.out", "my_model_out"), ("class", "m_class"), ("1st", "m_1st")):
        assert main(["compile", str(PADDLE / "mlp_infer"), "-o", f"/tmp/x/{bad}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"import {bad})" in err and f"-o /tmp/x/{fix}" in err
    assert not os.path.exists("/tmp/x/my-model.out")


# -- behaving like a Unix tool: help, exit statuses, closed pipes ---------------------------------
def test_every_command_and_argument_has_help(capsys):
    from pdjit.cli import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    top = capsys.readouterr().out
    assert e.value.code == 0 and "``" not in top and ":class:" not in top
    assert "exit status:" in top and "  2  bad input" in top
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help for c in commands._choices_actions}
    for name, sub in commands.choices.items():
        assert helps[name] and name in top, name
        assert sub.description and "``" not in sub.description, name
        for action in sub._actions:
            assert action.help, (name, action.dest)
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0 and capsys.readouterr().out.startswith(f"usage: pdjit {name}")


def test_exit_statuses(tmp_path, capsys):
    """0 success; 1 a model that fails ``check``; 2 bad input (argparse's own errors too)."""
    (tmp_path / "bad.pdmodel").write_bytes(b"not a program")
    for argv, status in ((["check", PADDLE / "fit_a_line_infer"], 0),
                         (["check", tmp_path / "bad.pdmodel"], 1),
                         (["check", tmp_path / "none"], 2),
                         (["inspect", tmp_path / "none"], 2),
                         (["run", tmp_path / "none"], 2),
                         (["ops", "nope"], 2)):
        code, out, err = _cli(capsys, *argv)
        assert code == status, (argv, out, err)
        assert (err == "") == (status == 0) and (status == 0 or err.count("\n") == 1), err
    assert "1 block, 4 ops of 4 types" in _cli(capsys, "check", PADDLE / "fit_a_line_infer")[1]
    for argv in (["nope"], ["run"], ["bench", "m", "--threads", "0"], []):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        capsys.readouterr()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("head") is None,
                    reason="needs bash and head")
def test_a_closed_pipe_ends_the_command_silently():
    """``pdjit ops | head -1``: the first line and nothing on stderr; a reader that reads
    nothing (``| true``) ends the command with 141 (128 + SIGPIPE), silently."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p])}
    cli = f"{shlex.quote(sys.executable)} -m pdjit.cli"
    model = shlex.quote(str(PADDLE / "mlp_infer"))
    script = (f"{cli} ops | head -1; {cli} ops | true; echo status ${{PIPESTATUS:-x}}; "
              f"{cli} inspect {model} | true; {cli} inspect {model} | head -1")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("abs ") and lines[2].startswith("{ // block 0")
    assert lines[1] in ("status 141", "status x"), lines
