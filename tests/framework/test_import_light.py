"""``import pdjit`` and the command line's model tools stay light: Numba, llvmlite, SciPy and
the code generator are imported with the first compile or run, not before."""
import json
import pathlib
import subprocess
import sys
import textwrap

LENET = pathlib.Path(__file__).parents[1] / "fixtures" / "paddle" / "models" / "lenet"

SCRIPT = textwrap.dedent("""
    import contextlib, io, json, sys
    HEAVY = ("numba", "llvmlite", "scipy", "pdjit.codegen", "pdjit.runtime.plan")

    def heavy():
        return sorted(m for m in sys.modules if m.split(".")[0] in HEAVY or
                      any(m == h or m.startswith(h + ".") for h in HEAVY))

    seen = {}
    import pdjit
    seen["import pdjit"] = heavy()
    import pdjit.framework, pdjit.inference, pdjit.io, pdjit.layers, pdjit.optimizer
    seen["import pdjit.framework and the builders"] = heavy()
    from pdjit import cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        codes = [cli.main(["check", sys.argv[1]]), cli.main(["inspect", sys.argv[1]]),
                 cli.main(["ops"])]
        try:
            cli.main(["--help"])
        except SystemExit as e:
            codes.append(e.code)
    seen["pdjit check / inspect / ops / --help"] = heavy()
    import numpy as np
    main = pdjit.Program()
    with pdjit.program_guard(main, pdjit.Program()):
        x = pdjit.layers.data(name="x", shape=[3], dtype="float32")
        y = pdjit.layers.relu(x)
    pdjit.Executor().run(main, feed={"x": np.ones((2, 3), np.float32)}, fetch_list=[y])
    print(json.dumps({"seen": seen, "codes": codes, "after_run": "numba" in sys.modules}))
""")


def test_import_pdjit_does_not_import_numba_scipy_or_the_code_generator():
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(LENET)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for what, modules in got["seen"].items():
        assert modules == [], (what, modules)
    assert got["codes"] == [0, 0, 0, 0]
    assert got["after_run"]   # (the first run does load the compiler)
