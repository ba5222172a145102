"""The declarations that code outside ``ops/`` reads instead of naming ops: ``Column`` (feed and
fetch), ``test_mode``, ``Reduce``'s slots, ``registry.having`` and what the backward pass builds
with (``registry.serving``)."""
from __future__ import annotations

import pytest

from pdjit.framework import registry


def _define(name, **kw):
    base = dict(inputs=["X"], outputs=["Out"], infer_shape=lambda X, **_: {"Out": X},
                reference=lambda X, **_: {"Out": X}, emit=None, grad=None)
    base.update(kw)
    return registry.register_op(name, **base)


def test_column_declares_feed_and_fetch():
    feed, fetch = registry.get("feed").column, registry.get("fetch").column
    assert (feed.fetch, fetch.fetch) == (False, True)

    class Op:  # what a Column reads of an operator
        def input(self, slot):
            return {"X": ["x_in"]}.get(slot, [])

        def output(self, slot):
            return {"Out": ["out"]}.get(slot, [])
    assert (feed.list_var(Op()), feed.value_var(Op())) == (["x_in"], ["out"])
    assert (fetch.list_var(Op()), fetch.value_var(Op())) == (["out"], ["x_in"])
    with pytest.raises(ValueError, match="Column declaration"):  # no FEED_FETCH trait
        _define("column_decl_bad", attrs={"col": registry.Int(0)},
                column=registry.Column("X", "Out", fetch=False))
    with pytest.raises(ValueError, match="Column declaration"):  # a list slot on the wrong side
        _define("column_decl_bad", attrs={"col": registry.Int(0)},
                traits=[registry.FEED_FETCH], column=registry.Column("X", "Out", fetch=True))
    assert registry.lookup("column_decl_bad") is None


def test_test_mode_of_and_having():
    assert registry.test_mode_of("batch_norm") == "is_test"
    assert registry.test_mode_of("no_such_op_type") == registry.TEST_MODE_ATTR
    assert registry.get("relu").test_mode is None
    adds = registry.having(registry.ADDITION, registry.BROADCAST)
    assert adds and all(d.has(registry.ADDITION) and d.has(registry.ELEMENTWISE) for d in adds)
    assert [d.type for d in adds] == sorted(d.type for d in adds)


def test_reduce_names_its_slots():
    r = registry.Reduce("{T}(0)", "{acc} + {x}")
    assert (r.x, r.out) == ("X", "Out")
    assert registry.Reduce("0", "{acc}", x="Input", out="Y").x == "Input"


def test_what_the_backward_pass_builds_with_is_declared():
    """Each role is declared by one op, whose first input and output slots the pass binds."""
    roles = {registry.SUMS: "sum", registry.SUMS_ARRAYS: "sum_array",
             registry.COPIES: "assign", registry.ZEROS_LIKE: "fill_zeros_like",
             registry.FILLS: "fill_constant"}
    assert {t: registry.serving(t).type for t in roles} == roles
    assert all(len(registry.having(t)) == 1 for t in roles)
    fill = registry.serving(registry.FILLS)
    assert {"shape", "value", "dtype"} <= set(fill.attrs)
    with pytest.raises(registry.UnregisteredOpError, match="declares the"):
        registry.serving("no_such_trait")
