"""Every kernel the cuda tests generate (and the library kernels) compiles to PTX for compute
capability 8.0 and 9.0 without a GPU, when NVVM is installed (``numba-cuda[cu13]``); skipped
with the reason otherwise. The same process checks that each generated kernel, its module
loaded from a file, is compiled with numba-cuda's disk cache. The kernels run here on the
simulator with their launches recorded; a process without the simulator compiles what was
recorded."""
import importlib.util
import json
import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cuda import device
from pdjit.codegen.cuda import target as cuda_target

HERE = pathlib.Path(__file__).parent


def _launch_everything():
    import test_cuda_conv_transpose_prod as convt
    import test_cuda_kernels as kernels
    import test_cuda_ops as ops
    import test_cuda_random as rnd
    import test_cuda_sequence as seq
    import test_cuda_train as train
    import test_cuda_while as loop

    train._train(fluid.CUDAPlace(0), train.OPTIMIZERS["adam"], steps=1)
    rnd.test_dropout_and_grad_match_the_cpu("upscale_in_train")
    rnd.test_uniform_and_gaussian_random_draw_the_cpu_numbers()
    for name, fn in sorted(vars(ops).items()):  # the first case of each op test
        if name.startswith("test_"):
            kwargs = {}
            for m in getattr(fn, "pytestmark", []):
                if m.name == "parametrize":
                    names = [n.strip() for n in m.args[0].split(",")]
                    first = m.args[1][0]
                    kwargs.update(zip(names, first if len(names) > 1 else [first]))
            fn(**kwargs)
    main, acc, total, i = loop._program()
    fluid.Executor(fluid.CUDAPlace(0)).run(main, feed={"x": np.ones((3, 4), "float32")},
                                           fetch_list=[total])
    for form in sorted(kernels.FORMS):
        device.reset_transfers()
        kernels.test_elementwise_forms(form, device.transfers)
    kernels.test_strided_broadcast_and_math_helpers()
    kernels.test_reductions([1], True)
    kernels.test_reductions(None, False)
    for pooltype in ("SUM", "AVERAGE", "SQRT", "MAX", "LAST", "FIRST"):
        seq.test_sequence_pool_and_grad(pooltype)
    seq.test_sequence_softmax_and_grad()
    seq.test_sequence_expand_as_and_grad()
    seq.test_sequence_expand_and_grad([0, 1, 3, 3, 4])
    convt.test_conv2d_transpose_and_grad("conv2d_transpose", 2, False)
    convt.test_conv2d_transpose_and_grad("depthwise_conv2d_transpose", 2, True)
    convt.test_reduce_prod_grad([0, 2], True)


def test_generated_kernels_compile_to_ptx(tmp_path):
    if importlib.util.find_spec("numba_cuda") is None:  # (before launching everything)
        pytest.skip("no NVVM to compile PTX with: numba-cuda (the cuda extra) is not installed")
    cuda_target.RECORD = {}
    try:
        _launch_everything()
        records = list(cuda_target.RECORD.values())
    finally:
        cuda_target.RECORD = None
    assert len(records) >= 20, len(records)
    path = tmp_path / "kernels.pkl"
    path.write_bytes(pickle.dumps(records))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(HERE / "ptx_check.py"), str(path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    if not summary["nvvm"]:
        pytest.skip(f"no NVVM to compile PTX with: {summary['reason']}")
    assert not summary["failures"], "\n".join(summary["failures"])
    assert summary["compiled"] == 2 * summary["kernels"] >= 2 * (len(records) + 13)
    # every generated kernel, loaded from its module's file, has numba-cuda's disk cache (a
    # second process on a GPU loads it; the simulator ignores the cache: not testable here)
    assert summary["cached"] == summary["records"] == len(records), summary
    assert summary["library_cached"], summary
    print(f"PTX: {summary['kernels']} kernels x cc 8.0/9.0 in {summary['seconds']:.1f} s")
