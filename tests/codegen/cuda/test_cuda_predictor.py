"""``Config.enable_use_gpu``: the Predictor runs the model on CUDAPlace, same outputs as on
the CPU."""
import numpy as np

import pdjit as fluid
from pdjit import inference
from pdjit.codegen.cuda import device


def test_predictor_on_the_gpu_matches_the_cpu(tmp_path):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [6])
        y = fluid.layers.fc(fluid.layers.fc(x, 8, act="tanh"), 3, act="softmax")
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=scope)
    with fluid.scope_guard(scope):
        fluid.io.save_inference_model(str(tmp_path), ["x"], [y], exe, main_program=main)
    xv = np.random.RandomState(5).randn(4, 6).astype("float32")
    outs = {}
    for gpu in (False, True):
        cfg = inference.Config(str(tmp_path))
        if gpu:
            cfg.enable_use_gpu(100, 0)
        predictor = inference.create_predictor(cfg)
        device.reset_transfers()
        (outs[gpu],) = predictor.run([xv])
        if gpu:
            assert cfg.use_gpu() and device.transfers()["h2d"] >= 1
            steps = [(s.kind, s.device is not None)
                     for _, plan in predictor._exe._plans.values() for s in plan.walk()]
            assert ("native", True) in steps, steps
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[True].sum(1), np.ones(4), rtol=1e-5)
