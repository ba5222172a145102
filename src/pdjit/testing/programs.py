"""``assert_programs_equivalent``: a whole program, compiled vs the reference interpreter."""
from __future__ import annotations

import numpy as np

from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.op_test import assert_native, tolerance


def _copy_scope(scope: Scope | None) -> Scope:
    out = Scope()
    if scope is not None:
        for name in scope.local_var_names():
            v = scope.find_var(name).value
            out.var(name).value = np.array(v, copy=True) if isinstance(v, np.ndarray) else v
    return out


def assert_programs_equivalent(program, feed, fetch_list, scope: Scope | None = None,
                               runs: int = 1, modes=("compiled", "reference"), rtol=None,
                               atol=None) -> list:
    """Run ``program`` ``runs`` times in each mode from copies of ``scope`` and compare every
    fetched value and every persistable value left in the scope. Returns the first mode's
    fetches of the last run."""
    results, scopes = {}, {}
    for mode in modes:
        s = _copy_scope(scope)
        exe = Executor(mode=mode, cold_runs="compile")
        for _ in range(runs):
            results[mode] = exe.run(program, feed=feed, fetch_list=fetch_list, scope=s)
        if mode == "compiled":
            assert_native(exe, "assert_programs_equivalent", require=False)
        scopes[mode] = s
    base = modes[0]
    for mode in modes[1:]:
        for i, (a, b) in enumerate(zip(results[base], results[mode])):
            _compare(a, b, f"fetch #{i} ({_name(fetch_list[i])}): {base} vs {mode}", rtol, atol)
        for name in scopes[base].local_var_names():
            a, b = scopes[base].find_var(name).value, scopes[mode].find_var(name).value
            if isinstance(a, np.ndarray):
                _compare(a, b, f"scope variable {name!r}: {base} vs {mode}", rtol, atol)
    return results[base]


def _name(v):
    return v if isinstance(v, str) else getattr(v, "name", repr(v))


def _compare(a, b, where, rtol, atol):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, \
        f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    r, t = tolerance(a.dtype)
    np.testing.assert_allclose(a, b, rtol=r * 10 if rtol is None else rtol,
                               atol=t * 10 if atol is None else atol, equal_nan=True,
                               err_msg=where)
