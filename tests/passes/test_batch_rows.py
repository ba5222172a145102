"""The batch-row analysis (``pdjit.passes.batch_rows``) on programs built here: the ops that
declare themselves row-wise (``registry.RowWise``) are separable exactly when their slots and
attributes keep batch rows apart. No compilation: the analysis reads the program only.

Oracle: what each op computes, by hand — e.g. a softmax over axis 0 mixes the rows of a batch,
a batch norm with batch statistics divides by a mean over every row.
"""
import pytest

import pdjit as fluid
from pdjit.passes.batch_rows import BATCH, CONST, NONE, row_states


def _states(build, shape=(4, 6)):
    main_p, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main_p, startup):
        x = fluid.layers.data("x", list(shape), dtype="float32")
        out = build(fluid.layers, x)
    block = main_p.global_block()
    ops = [op for op in block.ops if op.type not in ("feed", "fetch")]
    states = row_states(block, ops, lambda n: BATCH if n == "x" else CONST)
    refused = [(op.type, states[id(op)][0]) for op in ops if states[id(op)][0]]
    return refused, states, ops, out


def _bn(is_test):
    return lambda L, x: L.batch_norm(L.conv2d(x, 3, 3), is_test=is_test)


_BN_TEST, _BN_TRAIN = _bn(True), _bn(False)


@pytest.mark.parametrize("build, refused_by, why", [
    # separable
    (lambda L, x: L.fc(x, 5, num_flatten_dims=2), None, ""),
    (_BN_TEST, None, ""),
    (lambda L, x: L.layer_norm(x, begin_norm_axis=1), None, ""),
    (lambda L, x: L.concat([x, L.relu(x)], axis=1), None, ""),
    (lambda L, x: L.split(x, 2, dim=1)[0], None, ""),
    (lambda L, x: L.slice(x, axes=[1], starts=[0], ends=[2]), None, ""),
    (lambda L, x: L.matmul(x, L.transpose(x, [0, 2, 1])), None, ""),
    (lambda L, x: L.squeeze(L.unsqueeze(x, [1]), [1]), None, ""),
    (lambda L, x: L.cumsum(x, axis=1), None, ""),
    # not separable, and why
    (_BN_TRAIN, "batch_norm", "batch statistics"),
    (lambda L, x: L.concat([x, L.create_parameter([1, 4, 6], "float32")], axis=1), "concat",
     "does not carry the batch"),
    (lambda L, x: L.concat([x, x], axis=0), "concat", "axis=0 is the batch axis"),
    (lambda L, x: L.split(x, 2, dim=0)[0], "split", "is the batch axis"),
    (lambda L, x: L.slice(x, axes=[0], starts=[0], ends=[1]), "slice", "axes=[0]"),
    (lambda L, x: L.matmul(L.create_parameter([4, 4], "float32"), x), "matmul",
     "Y carrying the batch"),
    (lambda L, x: L.transpose(x, [1, 0, 2]), "transpose2", "moves the batch axis"),
    (lambda L, x: L.pad(x, [1, 0, 0, 0, 0, 0]), "pad", "pads the batch axis"),
])
def test_declared_row_wise_ops(build, refused_by, why):
    refused, *_ = _states(build, (3, 4, 6) if build in (_BN_TEST, _BN_TRAIN) else (4, 6))
    if refused_by is None:
        assert refused == [], refused
    else:
        assert refused and refused[0][0] == refused_by and why in refused[0][1], refused


def test_image_ops_keep_rows_and_drop_statistics():
    """A conv → batch norm (test mode) → pool chain keeps the batch; the norm's running
    statistics are values a split run does not keep."""
    def build(L, x):
        return L.pool2d(L.batch_norm(L.conv2d(x, 2, 3), is_test=True), 2)

    refused, states, ops, _ = _states(build, (3, 6, 6))
    assert refused == []
    bn = next(op for op in ops if op.type == "batch_norm")
    wrote = states[id(bn)][2]
    assert wrote[bn.output("Y")[0]] == BATCH
    assert wrote[bn.output("MeanOut")[0]] == NONE


def test_an_op_without_a_declaration_is_refused():
    refused, *_ = _states(lambda L, x: L.shape(x))
    assert refused == [("shape", "is not known to keep batch rows independent")]


def test_the_analysis_names_no_op():
    """The rules live on the ops (``RowWise``), not in a table of op names in the pass."""
    import pathlib

    import pdjit.passes.batch_rows as m
    from pdjit.framework import registry

    text = pathlib.Path(m.__file__).read_text()
    declared = [t for t, d in registry.all_ops().items() if d.row_wise is not None]
    assert len(declared) >= 30
    assert [t for t in declared if f'"{t}"' in text] == []
