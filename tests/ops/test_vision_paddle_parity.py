"""PaddlePaddle 3.3.1 as the oracle for the vision ops: outputs and input gradients.

The cases (``tests/fixtures/paddle/vision_zoo.json``, made by ``make_vision_zoo`` in
``tests/fixtures/make_paddle_fixtures.py``) are legacy ops in many attribute configurations,
run by Paddle's legacy executor on small fixed inputs. For each case the npz holds the inputs,
the outputs Paddle computed, fixed weights ``W`` and Paddle's gradients of
``L = sum(W * out[grad_of])`` with respect to the case's float inputs.

Each case here builds one pdjit program the same way (the op with the case's attrs, in-place
outputs where Paddle writes them in place, then ``gradients(out, inputs, target_gradients=[W])``),
runs it compiled and with the references, and compares every recorded output and gradient.
A second, cheap test hands the op exactly as Paddle serialised it (``vision_zoo.pb``, all of
Paddle's attrs) to pdjit's ``infer_shape``. Ops pdjit does not register yet are skipped.

Some cases carry ``quirks``: what Paddle 3.3.1 does there that pdjit may choose not to copy (a
bug, attrs it ignores, a gradient that is not its forward's derivative). A mismatch in such a
case is an expected failure that names the quirk; a match passes.
"""
import json
import pathlib

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import registry
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import assert_native

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "paddle"
ZOO = json.loads((FIXTURES / "vision_zoo.json").read_text())
CASES = ZOO["cases"]

#: (rtol, atol) per dtype. Paddle's kernels do some float64 arithmetic in float32: float attrs
#: are FLOAT in its op descs (a momentum of 0.9 acts as 0.8999999761581421), selu's gradient
#: adds a float32 ``scale * alpha``, adaptive avg-pool's gradient a float32 ``1 / pool size``.
#: So float64 is compared at 1e-7, not tighter.
TOL = {np.dtype("float64"): (1e-7, 1e-7), np.dtype("float32"): (1e-4, 1e-5)}
#: Paddle computes interpolation source coordinates and weights in float32, whatever the data's
#: dtype: float64 results carry errors of a few 1e-7.
COARSE_OPS = {"bilinear_interp_v2", "bilinear_interp", "nearest_interp_v2", "nearest_interp"}
COARSE = {np.dtype("float64"): (1e-6, 1e-6), np.dtype("float32"): (1e-4, 1e-5)}
MODES = ("compiled", "reference")


@pytest.fixture(scope="module")
def io():
    return np.load(FIXTURES / "vision_zoo_io.npz")


def _opdef(case):
    opdef = registry.lookup(case["op"])
    if opdef is None:
        pytest.skip(f"{case['op']} not registered yet")
    return opdef


def _build(case, opdef, io, with_grad=True):
    """The case's program: returns (program, feed, [(label, var, expected)])."""
    prog = fluid.Program()
    block = prog.global_block()
    in_slots = {s.name for s in opdef.inputs}
    out_slots = {s.name for s in opdef.outputs}
    missing = sorted(set(case["inputs"]) - in_slots) + sorted(set(case["outputs"]) - out_slots)
    assert not missing, f"pdjit's {case['op']} has no slot(s) {missing} (Paddle's has)"
    feed, ins = {}, {}
    for slot, keys in case["inputs"].items():
        ins[slot] = []
        for i, key in enumerate(keys):
            a = io[key]
            name = f"{slot.lower()}{i}"
            ins[slot].append(block.create_var(name=name, shape=list(a.shape), dtype=a.dtype,
                                              need_check_feed=True))
            feed[name] = a
    outs = {}
    for slot in case["outputs"]:
        src = case["inplace"].get(slot)
        outs[slot] = ins[src][0] if src else block.create_var(name=f"out_{slot.lower()}")
    for slot in case["unfetched_outputs"]:  # ReserveSpace, XShape: given where pdjit has them
        if slot in out_slots:
            outs[slot] = block.create_var(name=f"out_{slot.lower()}")
    block.append_op(case["op"], inputs=ins, outputs={s: [v] for s, v in outs.items()},
                    attrs=dict(case["attrs"]))
    checks = [(f"out {slot}", outs[slot], io[info["key"]])
              for slot, info in case["outputs"].items()]
    wanted = [(slot, i, key) for slot, keys in case["grads"].items()
              for i, key in enumerate(keys) if key]
    if with_grad and wanted:
        w = io[case["weights"]]
        wv = block.create_var(name="vision_w", shape=list(w.shape), dtype=w.dtype,
                              need_check_feed=True)
        feed["vision_w"] = w
        gs = gradients([outs[case["grad_of"]]], [ins[s][i] for s, i, _ in wanted],
                       target_gradients=[wv])
        for (slot, i, key), g in zip(wanted, gs):
            label = f"d{case['grad_of']}/d{slot}" + (f"[{i}]" if len(case["inputs"][slot]) > 1
                                                    else "")
            assert g is not None, f"{case['name']}: pdjit's backward gives no {label}"
            checks.append((label, g, io[key]))
    return prog, feed, checks


def _compare(label, got, want, coarse):
    """None when ``got`` matches ``want``; else a line saying by how much it does not."""
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{label}: got {got.dtype}{list(got.shape)}, Paddle {want.dtype}{list(want.shape)}"
    if want.dtype.kind not in "fc":
        bad = int(np.sum(got != want))
        return f"{label}: {bad} of {want.size} elements differ" if bad else None
    rtol, atol = (COARSE if coarse else TOL)[want.dtype]
    err = np.abs(got.astype(np.float64) - want)
    if np.all(err <= atol + rtol * np.abs(want)) and not np.isnan(got).any():
        return None
    rel = float(np.max(err / np.maximum(np.abs(want), atol)))
    return (f"{label}: max abs err {float(np.nanmax(err)):.3g}, max rel err {rel:.3g} "
            f"(rtol {rtol}, atol {atol})")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_vision_op_matches_paddle(case, io):
    opdef = _opdef(case)
    built, grad_problem = None, None
    try:
        built = _build(case, opdef, io)
    except Exception as e:  # no grad maker or a bad grad spec: check the forward anyway
        if not any(k for keys in case["grads"].values() for k in keys):
            raise
        grad_problem = f"gradient program: {type(e).__name__}: {e}"
    prog, feed, checks = built or _build(case, opdef, io, with_grad=False)
    coarse = case["op"] in COARSE_OPS
    problems = [grad_problem] if grad_problem else []
    for mode in MODES:
        exe = Executor(mode=mode)
        got = exe.run(prog, feed=feed, fetch_list=[v for _, v, _ in checks], scope=Scope())
        if mode == "compiled":
            assert_native(exe, case["name"], require=False)
        for (label, var, want), value in zip(checks, got):
            problem = _compare(label, value, want, coarse)
            if problem:
                problems.append(f"[{mode}] {problem}")
            elif label.startswith("out"):  # pdjit's compile-time shape agrees with the run
                shape = list(var.shape)
                if len(shape) != want.ndim or any(d not in (-1, w)
                                                  for d, w in zip(shape, want.shape)):
                    problems.append(f"{label}: infer_shape says {shape}, Paddle ran "
                                    f"{list(want.shape)}")
    report = (f"{case['name']}: {case['op']} attrs={case['attrs']}\n  "
              + "\n  ".join(dict.fromkeys(problems)))
    if problems and case["quirks"]:
        pytest.xfail("Paddle quirk: " + "; ".join(case["quirks"]) + "\n" + report)
    assert not problems, report


@pytest.fixture(scope="module")
def paddle_ops():
    """The forward op of every case, as Paddle serialised it (case order)."""
    prog = fluid.Program.parse_from_string((FIXTURES / "vision_zoo.pb").read_bytes())
    ops = prog.global_block().ops
    assert [op.type for op in ops] == [c["op"] for c in CASES]
    return prog.global_block(), ops


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_vision_infer_shape_of_paddles_op(index, paddle_ops):
    """pdjit's infer_shape on Paddle's own op desc (all of Paddle's attrs that pdjit declares)
    gives shapes the run agrees with, and the dtypes Paddle gave."""
    case = CASES[index]
    opdef = _opdef(case)
    block, ops = paddle_ops
    op = ops[index]
    metas = {}
    for slot in opdef.inputs:
        ms = [block.var(n).meta() for n in op.input(slot.name)]
        metas[slot.name] = ms if slot.duplicable else (ms[0] if ms else None)
    attrs = {k: v for k, v in op.all_attrs().items() if k in opdef.attrs}
    result = opdef.call_infer_shape(metas, attrs)
    for slot, info in case["outputs"].items():
        meta = result[slot][0] if isinstance(result[slot], list) else result[slot]
        shape = list(meta.shape)
        assert len(shape) == len(info["shape"]) and all(
            d in (-1, w) for d, w in zip(shape, info["shape"])), \
            f"{case['name']} {slot}: infer_shape says {shape}, Paddle ran {info['shape']}"
        assert np.dtype(meta.dtype) == np.dtype(info["dtype"]), \
            f"{case['name']} {slot}: infer_shape says {meta.dtype}, Paddle ran {info['dtype']}"
