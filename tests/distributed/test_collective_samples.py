"""The collective ops through the test kit's ``run_op`` in every executor mode, one rank (no
communicator: the collectives are identities), against NumPy written here.

``COLLECTIVE_SAMPLES`` is in ``tests/testing/op_samples.py``'s format: once it joins that table,
``pdjit.ops.collective`` can register the ops with the built-in ones (``register()`` at import)
without leaving the registry-wide tests without samples.
"""
from __future__ import annotations

import numpy as np
import pytest

F64 = np.float64


def _x(r):
    return {"X": r.uniform(-1, 1, (2, 3)).astype(F64)}


def _x_low(r):
    return {"x": r.uniform(-1, 1, (2, 3)).astype(F64)}


COLLECTIVE_SAMPLES = {
    "broadcast": [{"inputs": _x_low, "attrs": {"root": 0}}],
    "c_broadcast": [{"inputs": _x, "attrs": {"root": 0, "ring_id": 0}}],
    "all_reduce": [{"inputs": _x_low, "attrs": {"reduce_type": t}} for t in (0, 1, 4)],
    "c_allreduce_sum": [{"inputs": _x}],
    "c_allreduce_max": [{"inputs": _x}],
    "c_allreduce_min": [{"inputs": _x}],
    "c_allreduce_prod": [{"inputs": _x}],
    "c_sync_calc_stream": [{"inputs": lambda r: {"X": [_x(r)["X"]]}, "outputs": {"Out": 1}}],
    "c_sync_comm_stream": [{"inputs": lambda r: {"X": [_x(r)["X"], _x(r)["X"]]},
                            "outputs": {"Out": 2}}],
    "depend": [{"inputs": lambda r: {"X": _x(r)["X"], "Dep": [_x(r)["X"]]}}],
    "coalesce_tensor": [
        {"inputs": lambda r: {"Input": [r.uniform(-1, 1, (2, 3)), r.uniform(-1, 1, (5,))]},
         "attrs": {"copy_data": True, "dtype": 6, "use_align": True, "align_size": 64},
         "outputs": {"Output": 2}},
        {"inputs": lambda r: {"Input": [r.uniform(-1, 1, (3,))]},
         "attrs": {"set_constant": True, "constant": 1.5, "dtype": 6, "use_align": False},
         "outputs": {"Output": 1}},
    ],
}


def _expected(op_type, inputs, attrs):
    """One rank: what each op gives, in NumPy."""
    if op_type == "coalesce_tensor":
        arrays = inputs["Input"]
        if attrs.get("copy_data"):
            outs = [a.copy() for a in arrays]
        else:
            outs = [np.full_like(a, attrs.get("constant", 0.0)) for a in arrays]
        align = attrs.get("align_size", 4096) // 8 if attrs.get("use_align", True) else 1
        size = sum(-(-a.size // align) * align for a in arrays)
        return {"Output": outs, "FusedOutputSize": size}
    if op_type in ("c_sync_calc_stream", "c_sync_comm_stream"):
        return {"Out": list(inputs["X"])}
    (value,) = [v for k, v in inputs.items() if k in ("x", "X")]
    return {"out" if "x" in inputs else "Out": value}


CASES = [(t, i) for t in sorted(COLLECTIVE_SAMPLES) for i in range(len(COLLECTIVE_SAMPLES[t]))]


@pytest.mark.parametrize("mode", ["reference", "compiled"])
@pytest.mark.parametrize("op_type, index", CASES, ids=[f"{t}-{i}" for t, i in CASES])
def test_collective_op_on_one_rank(op_type, index, mode):
    import pdjit.distributed  # noqa: F401 (registers the ops)
    from pdjit.ops import collective
    from pdjit.testing import run_op

    assert collective.current_communicator() is None
    sample = COLLECTIVE_SAMPLES[op_type][index]
    rng = np.random.default_rng(index)
    inputs = sample["inputs"](rng)
    attrs = sample.get("attrs", {})
    got = run_op(op_type, inputs, attrs, mode=mode, outputs=sample.get("outputs"))
    want = _expected(op_type, inputs, attrs)
    for slot, value in want.items():
        if slot == "FusedOutputSize":
            assert got["FusedOutput"].shape == (value,)
            continue
        for g, w in zip(got[slot] if isinstance(value, list) else [got[slot]],
                        value if isinstance(value, list) else [value]):
            np.testing.assert_array_equal(g, w)
