"""A program saved as an inference model with drawn parameters (the inference passes' tests)."""
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
