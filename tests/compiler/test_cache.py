"""The on-disk compile cache across processes: hits, invalidation, damaged entries."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import pdjit as fluid
    scale = float(sys.argv[1])
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        y = fluid.layers.sigmoid(fluid.layers.scale(x, scale=scale)) * 3.0
    exe = fluid.Executor()
    (out,) = exe.run(main, feed={"x": np.ones((2, 4), np.float32)}, fetch_list=[y],
                     scope=fluid.Scope())
    (prog, plan), = exe._plans.values()
    fn = plan.steps[0].compiled.fn
    print(json.dumps({"hits": sum(fn.stats.cache_hits.values()),
                      "misses": sum(fn.stats.cache_misses.values()),
                      "module": plan.steps[0].compiled.name, "out": out.tolist()}))
""")


def _run(tmp_path, scale):
    env = dict(os.environ, PDJIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CACHE_DIR", None)   # numba's compiled code must sit beside the modules
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(scale)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_disk_without_compiling(tmp_path):
    first = _run(tmp_path, 2.0)
    assert first["misses"] == 1 and first["hits"] == 0
    second = _run(tmp_path, 2.0)
    assert second["misses"] == 0 and second["hits"] == 1  # no compile happened
    assert second["module"] == first["module"] and second["out"] == first["out"]
    changed = _run(tmp_path, 2.5)                          # a changed program recompiles
    assert changed["module"] != first["module"] and changed["misses"] == 1


def test_damaged_cache_entry_is_rebuilt_not_a_crash(tmp_path):
    first = _run(tmp_path, 1.5)
    pycache = pathlib.Path(tmp_path / "cache" / "__pycache__")
    damaged = list(pycache.glob(f"{first['module']}*.nbc"))
    assert damaged
    for f in damaged:
        f.write_bytes(f.read_bytes()[:20])                 # truncate the compiled code
    again = _run(tmp_path, 1.5)
    assert again["out"] == first["out"]
    healed = _run(tmp_path, 1.5)
    assert healed["misses"] == 0 and healed["hits"] == 1
