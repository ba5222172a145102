"""A saved pre-activation model (DenseNet's pattern: a concat, then batch norm and relu, then a
1x1 convolution) through the Predictor: the inference passes turn each batch norm into a
per-channel product and sum, and the convolutions read their image through them and the relu
(``pointwise_range_prologue``: no loop kernel of their own). Against a NumPy forward pass
written here, on one and two threads, batch 1 and 3."""
import numpy as np
import pytest
from saved_models import save_drawn

import pdjit as fluid
import pdjit.inference as inference

RNG = np.random.default_rng(29)
EPS = 1e-5


def _build():
    """x [16, 12, 12] -> bn-relu-conv1x1 (24) -> concat with x -> bn-relu-conv1x1 (32)."""
    L = fluid.layers
    x = L.data("x", [16, 12, 12])
    y = L.conv2d(L.batch_norm(x, act="relu", is_test=True, epsilon=EPS), 24, 1)
    h = L.concat([x, y], axis=1)
    out = L.conv2d(L.batch_norm(h, act="relu", is_test=True, epsilon=EPS), 32, 1,
                   bias_attr=False)
    return x, out


def _bn_relu(v, values, k):
    g, b, m, var = (values[f"batch_norm_{k}.{s}"] for s in ("w_0", "b_0", "w_1", "w_2"))
    c = (slice(None), None, None)
    return np.maximum((v - m[c]) / np.sqrt(var[c] + EPS) * g[c] + b[c], 0)


def _conv1x1(v, w):
    return np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], v)


def _oracle(xv, values):
    x = xv.astype(np.float64)
    y = _conv1x1(_bn_relu(x, values, 0), values["conv2d_0.w_0"]) + \
        values["conv2d_0.b_0"][:, None, None]
    h = np.concatenate([x, y], axis=1)
    return _conv1x1(_bn_relu(h, values, 1), values["conv2d_1.w_0"])


@pytest.mark.parametrize("threads", [1, 2])
def test_the_predictor_reads_through_the_batch_norms(fresh_programs, tmp_path, monkeypatch,
                                                     threads):
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    x, out = _build()

    def draw(name, shape):
        if name.endswith("w_2"):  # a variance
            return RNG.uniform(0.5, 2, shape)
        if name.startswith("batch_norm") and name.endswith("w_0"):  # a scale
            return RNG.uniform(0.5, 1.5, shape)
        return RNG.standard_normal(shape) * 0.5
    values = save_drawn(main, startup, [x], [out], tmp_path, draw)
    cfg = inference.Config(str(tmp_path / "m.pdmodel"), str(tmp_path / "m.pdiparams"))
    cfg.set_cpu_math_library_num_threads(threads)
    pred = inference.create_predictor(cfg)
    types = [op.type for op in pred.program().global_block().ops]
    assert "batch_norm" not in types
    for batch in (1, 3):
        xv = RNG.standard_normal((batch, 16, 12, 12)).astype(np.float32)
        (got,) = pred.run([xv])
        np.testing.assert_allclose(got, _oracle(xv, values), rtol=1e-4, atol=1e-4)
    texts = "\n".join(s.compiled.text for _, plan in pred._exe._plans.values()
                      for s in plan.walk() if s.kind == "native")
    assert texts.count("pointwise_range_prologue,") == 2
    assert texts.count("# (read through by the conv2d") == 2
    assert not any(ln.strip().startswith("K") for ln in texts.splitlines())  # no loop kernel
