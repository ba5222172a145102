"""``minimize()`` (append_backward and the optimizer) does work linear in the program's ops: a
chain four times as long builds its backward with about four times the work, counted as the
reads of ops' output names and the peak memory the pass allocates (no timing)."""
import tracemalloc

import pdjit as fluid
from pdjit.framework import operator

L = fluid.layers


def _work(n: int) -> tuple:
    """(output-name reads, peak bytes) of ``minimize`` on a chain of ``2 n`` elementwise ops
    inside an fc, with a mean loss and SGD."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[4], dtype="float32")
        h = L.fc(x, size=4)
        for _ in range(n):
            h = L.tanh(L.scale(h, scale=0.9))
        loss = L.mean(h)
        opt = fluid.optimizer.SGD(learning_rate=0.1)
        reads = [0]
        prop = operator.Operator.output_arg_names
        counted = property(lambda self: (reads.__setitem__(0, reads[0] + 1), prop.fget(self))[1])
        operator.Operator.output_arg_names = counted
        tracemalloc.start()
        try:
            opt.minimize(loss)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            operator.Operator.output_arg_names = prop
    ops = len(main.global_block().ops)
    assert ops > 4 * n  # forward, backward and update ops
    return reads[0], peak


def test_minimize_work_is_linear_in_the_ops():
    r1, m1 = _work(50)
    r2, m2 = _work(200)  # four times the ops: about four times the work (quadratic: 16)
    assert r2 < 5 * r1, (r1, r2)
    assert m2 < 5 * m1, (m1, m2)
