"""Writes ``paddle_loss_ops.npz`` (used by ``test_loss_ops.py``): a program of the loss and
utility ops built and run by PaddlePaddle 3.3.1 in legacy static mode, its serialised
``ProgramDesc``, the feeds, Paddle's fetched results and the text its ``print`` op wrote.

Run from the repository root: ``python tests/ops/make_paddle_loss_fixture.py``.
"""
import os
import pathlib
import tempfile

os.environ["FLAGS_enable_pir_api"] = "0"

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle.base.layer_helper import LayerHelper  # noqa: E402

PRINT_ATTRS = {"first_n": -1, "message": "pp", "summarize": 3, "print_tensor_name": True,
               "print_tensor_type": True, "print_tensor_shape": True,
               "print_tensor_layout": True, "print_tensor_lod": True, "print_phase": "BOTH",
               "is_forward": True}


def main():
    paddle.enable_static()
    rng = np.random.default_rng(3)
    feeds = {"x": rng.normal(size=(3, 4)).astype("float32"),
             "y": rng.uniform(0.05, 0.95, size=(3, 4)).astype("float32"),
             "s": np.array([0.0], "float32"), "e": np.array([3.0], "float32"),
             "n": np.array([7], "int32"), "i0": np.array([0], "int64"),
             "i1": np.array([10], "int64"), "n4": np.array([4], "int32")}
    prog, startup = paddle.static.Program(), paddle.static.Program()
    fetch = []
    with paddle.static.program_guard(prog, startup):
        v = {k: paddle.static.data(k, list(a.shape), str(a.dtype)) for k, a in feeds.items()}

        def op(t, ins, outs, attrs=None):
            h = LayerHelper(t)
            ov = {k: [h.create_variable_for_type_inference(dt)] for k, dt in outs.items()}
            h.append_op(type=t, inputs={k: [v[n]] for k, n in ins.items()}, outputs=ov,
                        attrs=attrs or {})
            fetch.extend(ov[k][0] for k in outs)

        op("sigmoid_cross_entropy_with_logits", {"X": "x", "Label": "y"}, {"Out": "float32"},
           {"ignore_index": -100, "normalize": True})
        op("sigmoid_cross_entropy_with_logits", {"X": "x", "Label": "y", "pos_weight": "y"},
           {"Out": "float32"})
        op("bce_loss", {"X": "y", "Label": "y"}, {"Out": "float32"})
        op("huber_loss", {"X": "x", "Y": "y"}, {"Out": "float32", "Residual": "float32"},
           {"delta": 0.3})
        op("kldiv_loss", {"X": "x", "Target": "y"}, {"Loss": "float32"},
           {"reduction": "batchmean"})
        op("kldiv_loss", {"X": "x", "Target": "y"}, {"Loss": "float32"},
           {"reduction": "none", "log_target": True})
        op("norm", {"X": "x"}, {"Out": "float32", "Norm": "float32"},
           {"axis": 0, "epsilon": 1e-6})
        op("log_softmax", {"X": "x"}, {"Out": "float32"}, {"axis": 0})
        op("linspace", {"Start": "s", "Stop": "e", "Num": "n"}, {"Out": "float32"},
           {"dtype": 5})
        op("linspace", {"Start": "i0", "Stop": "i1", "Num": "n4"}, {"Out": "int64"},
           {"dtype": 3})
        op("print", {"In": "x"}, {"Out": "float32"}, PRINT_ATTRS)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    with tempfile.TemporaryFile() as f:  # Paddle's print op writes to the C++ stdout
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            results = exe.run(prog, feed=feeds, fetch_list=fetch)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        printed = f.read().decode()
    out = pathlib.Path(__file__).with_name("paddle_loss_ops.npz")
    np.savez(out, desc=np.frombuffer(prog.desc.serialize_to_string(), np.uint8),
             fetch=np.array([f.name for f in fetch]), printed=np.array(printed),
             **{f"feed_{k}": a for k, a in feeds.items()},
             **{f"out_{i}": r for i, r in enumerate(results)})
    print(f"wrote {out} ({len(fetch)} results)")


if __name__ == "__main__":
    main()
