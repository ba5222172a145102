"""Writes ``fixtures/paddle_layouts.json``: the programs PaddlePaddle 3.3.1 (legacy mode, CPU
build) writes for a two-layer MLP trained with Adam on 2 ranks, as
``{name: {"startup": [op], "main": [op]}}`` with each op
``[type, {slot: names}, {slot: names}, op_role, op_role_var, {collective attrs}]``:

- ``grad_allreduce``: ``paddle.distributed.transpiler.collective.GradAllReduce()`` (2 rings);
- ``fleet_fused``: ``fleet.distributed_optimizer(Adam, strategy).minimize`` with the default
  strategy (raw-program optimizer, fused all-reduce) and ``fuse_grad_size_in_num = 3``, with
  ``FLAGS_sync_before_allreduce=1`` (the layout with ``c_sync_calc_stream`` /
  ``c_sync_comm_stream``). Paddle's CPU build cannot make a communicator, so the script
  replaces the step that writes the communicator's ops (none on a CPU) with a no-op.

Also ``fixtures/paddle_collective/``: the ``grad_allreduce`` programs as Paddle serialised them
(``startup.pb``, ``main.pb``) and ``values.npz``: the parameters after Paddle's startup, a feed,
and the parameters after one step of the same program *before* the rewrite, run by Paddle (what
2 ranks fed the same batch must reach).

Run: ``python tests/distributed/make_paddle_layouts.py`` (needs paddlepaddle).
"""
import json
import os
import pathlib
import subprocess
import sys

KEEP = ("ring_id", "root", "reduce_type", "scale", "copy_data", "use_align", "dtype")


def _dump(prog):
    out = []
    for op in prog.global_block().ops:
        a = op.all_attrs()
        out.append([op.type, {k: op.input(k) for k in op.input_names if op.input(k)},
                    {k: op.output(k) for k in op.output_names if op.output(k)},
                    int(a.get("op_role", 0)), list(a.get("op_role_var", [])),
                    {k: (int(a[k]) if isinstance(a[k], bool) is False and not isinstance(
                        a[k], float) else a[k]) for k in KEEP if k in a}])
    return out


def _one(mode):
    os.environ["FLAGS_enable_pir_api"] = "0"
    import paddle
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    if mode == "fleet_fused":
        os.environ.update(PADDLE_TRAINER_ID="0", PADDLE_TRAINERS_NUM="2",
                          PADDLE_TRAINER_ENDPOINTS="127.0.0.1:6170,127.0.0.1:6171",
                          PADDLE_CURRENT_ENDPOINT="127.0.0.1:6170",
                          FLAGS_sync_before_allreduce="1")
        import paddle.distributed.fleet as fleet
        from paddle.distributed.fleet.meta_optimizers.common import CollectiveHelper
        CollectiveHelper._init_communicator = lambda *a, **k: None
        fleet.init(is_collective=True)
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        h = paddle.static.nn.fc(x, 3, activation="relu")
        p = paddle.static.nn.fc(h, 1)
        loss = paddle.mean(paddle.square(p - y))
        if mode == "fleet_fused":
            s = fleet.DistributedStrategy()
            s.fuse_grad_size_in_num = 3
            fleet.distributed_optimizer(paddle.optimizer.Adam(0.01), s).minimize(loss)
        else:
            paddle.optimizer.Adam(0.01).minimize(loss)
            _one_step(paddle, main, startup, x, y, loss)
            from paddle.distributed.transpiler.collective import GradAllReduce
            GradAllReduce().transpile(startup, main, 0, "127.0.0.1:6170,127.0.0.1:6171",
                                      "127.0.0.1:6170", False)
    if mode == "grad_allreduce":
        d = pathlib.Path(__file__).parent / "fixtures" / "paddle_collective"
        (d / "startup.pb").write_bytes(startup.desc.serialize_to_string())
        (d / "main.pb").write_bytes(main.desc.serialize_to_string())
    return {"startup": _dump(startup), "main": _dump(main)}


def _one_step(paddle, main, startup, x, y, loss):
    import numpy as np

    d = pathlib.Path(__file__).parent / "fixtures" / "paddle_collective"
    d.mkdir(exist_ok=True)
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    names = [p.name for p in main.global_block().all_parameters()]
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        init = {f"init/{n}": np.array(scope.find_var(n).get_tensor()) for n in names}
        rng = np.random.default_rng(0)
        feed = {"x": rng.normal(size=(6, 4)).astype("float32"),
                "y": rng.normal(size=(6, 1)).astype("float32")}
        exe.run(main, feed=feed, fetch_list=[loss])
        after = {f"after/{n}": np.array(scope.find_var(n).get_tensor()) for n in names}
    np.savez(d / "values.npz", **init, **after, **{f"feed/{k}": v for k, v in feed.items()})


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(_one(sys.argv[1])))
        sys.exit(0)
    layouts = {}
    for mode in ("grad_allreduce", "fleet_fused"):  # one process each (fleet's global state)
        r = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True,
                           check=True)
        layouts[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    path = pathlib.Path(__file__).parent / "fixtures" / "paddle_layouts.json"
    path.write_text(json.dumps(layouts, indent=1) + "\n")
    print("wrote", path)
