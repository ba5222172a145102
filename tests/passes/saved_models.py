"""A program saved as an inference model with drawn parameters, and its ahead-of-time
artifact (the inference passes' tests)."""
import importlib.util

import numpy as np

import pdjit as fluid
import pdjit.static as static


def save_drawn(main, startup, feeds, fetches, d, draw):
    """The model saved at ``d / "m"`` with every parameter drawn by ``draw(name, shape)``
    (float32); the values saved (float64)."""
    scope = fluid.Scope()
    values = {}
    with fluid.scope_guard(scope):
        exe = fluid.Executor()
        exe.run(startup)
        for p in main.global_block().all_parameters():
            a = draw(p.name, scope.find_var(p.name).value.shape).astype("float32")
            scope.find_var(p.name).value = a
            values[p.name] = a.astype(np.float64)
        static.save_inference_model(str(d / "m"), feeds, fetches, exe,
                                    program=main.clone(for_test=True))
    return values


def load_artifact(d, name: str, batch: int = 2):
    """The model saved at ``d / "m"`` compiled ahead of time for ``batch`` into ``d / "out"``
    and loaded (``artifact.load()``), as module ``name``."""
    from pdjit.aot import compile_model

    compile_model(str(d / "m.pdmodel"), str(d / "out"), batch=batch,
                  params_file=str(d / "m.pdiparams"))
    spec = importlib.util.spec_from_file_location(name, d / "out" / "__init__.py",
                                                  submodule_search_locations=[str(d / "out")])
    artifact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(artifact)
    return artifact.load()
