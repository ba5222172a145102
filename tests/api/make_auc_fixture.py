"""Prints PaddlePaddle 3.3.1's legacy ``auc`` outputs for test_metrics.PADDLE_AUC: the global
AUC, the batch AUC (slide_steps=2) and the batch counter after each of three batches.

Run: ``python tests/api/make_auc_fixture.py`` (needs paddlepaddle)."""
import os

os.environ["FLAGS_enable_pir_api"] = "0"

import numpy as np  # noqa: E402
import paddle  # noqa: E402

paddle.enable_static()
main, start = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, start):
    x = paddle.static.data("x", [-1, 2], "float32")
    y = paddle.static.data("y", [-1, 1], "int64")
    auc, batch_auc, stats = paddle.static.auc(x, y, num_thresholds=4095, slide_steps=2)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(start)
rng = np.random.default_rng(0)
rows = []
for _ in range(3):
    p = rng.random((8, 1)).astype("float32")
    lab = rng.integers(0, 2, (8, 1)).astype("int64")
    g, b, bpos = exe.run(main, feed={"x": np.concatenate([1 - p, p], 1), "y": lab},
                         fetch_list=[auc, batch_auc, stats[0]])
    rows.append((float(g), float(b), int(bpos[-1])))
print(rows)
