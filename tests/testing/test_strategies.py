"""The test kit's strategies: valid by construction, and every op's attributes drawable."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pdjit as fluid
from pdjit.framework import registry
from pdjit.ops._common import broadcast_shapes
from pdjit.proto import framework_pb2 as pb
from pdjit.testing import assert_native
from pdjit.testing import strategies as S


@given(S.broadcast_pairs())
def test_broadcast_pairs_are_accepted_by_fluids_rule(pair):
    x, y, axis = pair
    out = broadcast_shapes(x, y, axis)
    assert len(out) == max(len(x), len(y))


@given(S.batch_shapes())
def test_batch_shapes(bs):
    declared, concrete = bs
    assert declared[0] == -1
    assert all(c[1:] == declared[1:] and c[0] >= 1 for c in concrete)


@pytest.mark.parametrize("op_type", sorted(registry.all_ops()))
def test_every_op_declares_drawable_attributes(op_type):
    """Registry-wide: each attribute of every op has values to draw (choices, a range, or a
    default), so property tests can cover it."""
    opdef = registry.get(op_type)
    block_attrs = [n for n, spec in opdef.attrs.items()
                   if spec.type in (pb.AttrType.BLOCK, pb.AttrType.BLOCKS)]
    if block_attrs:  # a sub-block belongs to a program: such ops are control flow, built in one
        assert opdef.has(registry.CONTROL_FLOW), (op_type, block_attrs)
        with pytest.raises(ValueError, match="names a block of a program"):
            S.attr_values(op_type)
        return
    S.attr_values(op_type)  # raises when an attribute has nothing to draw from


@given(st.sampled_from(["positive", "nonzero", "unit", None]), S.dtypes("fi"), st.data())
def test_arrays_respect_domains(domain, dtype, data):
    a = data.draw(S.arrays((3, 2), dtype, domain))
    assert a.shape == (3, 2) and a.dtype == dtype
    if domain == "positive":
        assert (a > 0).all()
    if domain == "nonzero":
        assert (a != 0).all()
    if domain == "unit" and dtype.kind == "f":
        assert (np.abs(a) < 1).all()


@settings(max_examples=15)
@given(S.elementwise_programs())
def test_random_elementwise_programs_compiled_equals_reference(case):
    prog, feed, fetch = case
    compiled = fluid.Executor(mode="compiled")
    got = compiled.run(prog, feed=feed, fetch_list=fetch, scope=fluid.Scope())
    assert_native(compiled)
    want = fluid.Executor(mode="reference").run(prog, feed=feed, fetch_list=fetch,
                                                scope=fluid.Scope())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, equal_nan=True)
