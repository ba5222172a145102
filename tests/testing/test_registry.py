"""Registry-wide tests: no op can be registered without being tested.

For every op in ``pdjit.framework.registry.all_ops()``:

- the definition honours the op-definition contract (``registry.py``'s docstring);
- every forward op has at least one sample in ``op_samples.SAMPLES``, and each sample runs the
  same in every executor mode (``run_op`` also checks ``infer_shape`` against what ran);
- every sample naming input slots in ``grad`` is gradient-checked against finite differences,
  and every differentiable op has such a sample;
- no op is left with ``grad=NO_GRAD_YET``.

Grad ops (types ending in ``_grad``, or ``_grad2``...) are covered through their forward op's
gradient check; ``feed``/``fetch`` are the executor's own protocol. A sample found to expose a
bug is listed in ``KNOWN_FAILURES`` (strict xfail, with the symptom), so the lead can fix the op
and then delete the entry.
"""
from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
from op_samples import SAMPLES, materialize

import pdjit  # noqa: F401  (registers every op)
from pdjit.framework import registry
from pdjit.testing import TARGETS, assert_close, check_grad, run_op

PROTOCOL_OPS = frozenset({"feed", "fetch"})
_GRAD_OP = re.compile(r"_grad\d*$")


def is_grad_op(op_type: str) -> bool:
    """Grad op types: ``<fwd>_grad`` and Paddle's numbered variants (``cross_entropy_grad2``)."""
    return bool(_GRAD_OP.search(op_type))


ALL_OPS = registry.all_ops()
FORWARD_OPS = sorted(t for t in ALL_OPS if not is_grad_op(t) and t not in PROTOCOL_OPS)

# (op_type, sample index, "mode" | "grad") -> what is wrong. Each becomes a strict xfail: it
# must keep failing until the op is fixed, and then the entry must go.
KNOWN_FAILURES: dict = {}


def _has_real_grad(opdef) -> bool:
    return opdef.grad is not None and opdef.grad is not registry.NO_GRAD_YET


def _case(op_type, index, kind):
    reason = KNOWN_FAILURES.get((op_type, index, kind))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(op_type, index, id=f"{op_type}-{index}", marks=marks)


MODE_CASES = [_case(t, i, "mode") for t in sorted(SAMPLES) if t in ALL_OPS
              for i in range(len(SAMPLES[t]))]


def _grad_list(op_type, index):
    s = SAMPLES[op_type][index]
    return s.get("grad") if isinstance(s, dict) else None


GRAD_CASES = [_case(t, i, "grad") for t in sorted(SAMPLES) if t in ALL_OPS
              and _has_real_grad(ALL_OPS[t])
              for i in range(len(SAMPLES[t])) if _grad_list(t, i)]


def _rng(op_type: str, index: int) -> np.random.Generator:
    """A generator fixed per sample (stable across runs and processes)."""
    return np.random.default_rng(zlib.crc32(f"{op_type}/{index}".encode()))


def _sample(op_type: str, index: int):
    """The sample's values, with a fixed non-zero seed for random ops (so every mode draws the
    same numbers)."""
    opdef = registry.get(op_type)
    s = materialize(SAMPLES[op_type][index], _rng(op_type, index))
    if opdef.has(registry.RANDOM) and "seed" in opdef.attrs:
        if not s.attrs.get("seed"):
            s.attrs["seed"] = 1 + zlib.crc32(op_type.encode()) % 9973
        if "fix_seed" in opdef.attrs:
            s.attrs["fix_seed"] = True
    return s


# ---- coverage ----------------------------------------------------------------------------------
# Ops that cannot be sampled as one op fed by data variables, with the reason. Ops with the
# CONTROL_FLOW trait (sub-blocks as attributes) are exempt too; tests/layers/control_flow/ covers
# both.
NO_SAMPLE = {t: "takes or gives a tensor array (a list), which cannot be fed or fetched as one "
                "tensor" for t in ("write_to_array", "read_from_array", "lod_array_length",
                                   "tensor_array_to_tensor", "sum_array")}
NO_SAMPLE.update({t: "takes or gives a rank table (lod_rank_table), which cannot be fed or "
                     "fetched; tested in tests/layers/control_flow/test_dynamic_rnn.py" for t in (
                         "lod_rank_table", "max_sequence_len", "lod_tensor_to_array",
                         "array_to_lod_tensor", "shrink_rnn_memory",
                         "reorder_lod_tensor_by_rank")})
NO_SAMPLE["py_func"] = ("calls a Python function its layer registers, into output variables the "
                        "user declares; tested in tests/layers/test_fluid_gap_py_func.py")
NO_SAMPLE["beam_search_decode"] = ("takes tensor arrays of the steps; tested in "
                                  "tests/ops/test_beam_search.py")


def _exempt(op_type) -> bool:
    return op_type in NO_SAMPLE or ALL_OPS[op_type].has(registry.CONTROL_FLOW)


def test_every_forward_op_has_a_sample():
    missing = [t for t in FORWARD_OPS if not SAMPLES.get(t) and not _exempt(t)]
    assert not missing, (f"{len(missing)} registered op(s) without a sample in "
                         f"tests/testing/op_samples.py: {', '.join(missing)}")


def test_every_differentiable_op_has_a_gradient_sample():
    missing = [t for t in FORWARD_OPS if _has_real_grad(ALL_OPS[t]) and SAMPLES.get(t)
               and not any(_grad_list(t, i) for i in range(len(SAMPLES[t])))]
    assert not missing, (f"differentiable op(s) whose samples check no gradient (give one a "
                         f"'grad' list in op_samples.py): {', '.join(missing)}")


def test_samples_check_gradients_only_where_one_flows():
    wrong = [t for t in sorted(SAMPLES) if t in ALL_OPS and ALL_OPS[t].grad is None
             and any(_grad_list(t, i) for i in range(len(SAMPLES[t])))]
    assert not wrong, f"samples with a 'grad' list for ops declared grad=None: {wrong}"


# ---- the contract ------------------------------------------------------------------------------
@pytest.mark.parametrize("op_type", sorted(ALL_OPS))
def test_every_op_declares_its_contract(op_type):
    d = ALL_OPS[op_type]
    assert d.type == op_type
    assert callable(d.reference), f"{op_type}: reference must be callable, got {d.reference!r}"
    assert callable(d.infer_shape), f"{op_type}: infer_shape must be callable, got " \
                                    f"{d.infer_shape!r}"
    emit_ok = (d.emit is None or isinstance(d.emit, (str, registry.Reduce, registry.Opaque))
               or callable(d.emit)
               # several outputs: {slot: template} (the contract's multi-output form)
               or (isinstance(d.emit, dict) and all(isinstance(v, str) for v in d.emit.values())
                   and set(d.emit) <= {s.name for s in d.outputs}))
    assert emit_ok, f"{op_type}: emit must be None, a template str, a callable, Reduce or " \
                    f"Opaque, got {d.emit!r}"
    assert d.grad is None or d.grad is registry.NO_GRAD_YET or callable(d.grad), \
        f"{op_type}: grad must be None, NO_GRAD_YET or a grad maker, got {d.grad!r}"
    assert d.traits, f"{op_type}: declares no traits"
    assert d.traits <= registry.ALL_TRAITS
    assert d.outputs, f"{op_type}: declares no output slot"
    for name, spec in d.attrs.items():
        assert isinstance(spec, registry.AttrSpec), f"{op_type}: attribute {name!r} is not an " \
                                                    f"AttrSpec"


# ---- every mode computes the same --------------------------------------------------------------
def _compare(got, want, where):
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), \
            f"{where}: {len(got)} arrays, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    else:
        assert_close(got, want, where)


def _finite(value, where):
    for a in (value if isinstance(value, (list, tuple)) else [value]):
        a = np.asarray(a)
        if a.dtype.kind in "fc":
            assert np.all(np.isfinite(a)), f"{where}: the sample gives non-finite values"


# every registered op's samples, in every mode: an op with no native code for a sample's dtypes,
# ranks or attributes runs its NumPy reference in compiled plans by design (said once per op
# by a ReferenceStepWarning); what runs natively is tested per op family
@pytest.mark.filterwarnings("ignore::pdjit.framework.errors.ReferenceStepWarning")
@pytest.mark.parametrize("op_type,index", MODE_CASES)
def test_op_runs_the_same_in_every_mode(op_type, index):
    s = _sample(op_type, index)
    results = {mode: run_op(op_type, s.inputs, s.attrs, mode, outputs=s.outputs)
               for mode in TARGETS}
    base_mode = TARGETS[0]
    base = results[base_mode]
    assert base, f"{op_type} sample {index}: produced no output"
    for slot, value in base.items():
        _finite(value, f"{op_type} sample {index} [{base_mode}] output {slot}")
    for mode in TARGETS[1:]:
        got = results[mode]
        assert set(got) == set(base), f"{op_type} sample {index}: {mode} gave outputs " \
                                      f"{sorted(got)}, {base_mode} {sorted(base)}"
        for slot, want in base.items():
            _compare(got[slot], want, f"{op_type} sample {index} output {slot}: {mode} vs "
                                      f"{base_mode}")


# ---- gradients ---------------------------------------------------------------------------------
# every registered op's samples, in every mode: an op with no native code for a sample's dtypes,
# ranks or attributes runs its NumPy reference in compiled plans by design (said once per op
# by a ReferenceStepWarning); what runs natively is tested per op family
@pytest.mark.filterwarnings("ignore::pdjit.framework.errors.ReferenceStepWarning")
@pytest.mark.parametrize("op_type,index", GRAD_CASES)
def test_differentiable_op_gradients(op_type, index):
    s = _sample(op_type, index)
    check_grad(op_type, s.inputs, s.attrs, s.grad, output_name=s.out, outputs=s.outputs)


# ---- no op waits for its gradient --------------------------------------------------------------
def test_no_op_is_left_without_a_gradient_decision():
    pending = sorted(t for t, d in registry.all_ops().items() if d.grad is registry.NO_GRAD_YET)
    assert not pending, (f"{len(pending)} op(s) still declare grad=NO_GRAD_YET (write the grad "
                         f"maker, or declare grad=None if no gradient flows): "
                         f"{', '.join(pending)}")
