"""Fuzzed model files: seeded mutations (bit flips, truncation, duplicated and zeroed spans, random
bytes) of real ``ProgramDesc`` bytes (models PaddlePaddle wrote, and an MLP pdjit saved) and of
their ``.pdiparams``, each parsed, verified, loaded and run with feeds of the declared shapes
(reference mode; a small sample compiled as well). Only pdjit's own errors may escape, nothing
may crash, and nothing may allocate gigabytes because a file claims a size.

Structural edits of the programs (``edit``: attributes, slots, op types, variable descs) add
what byte mutations rarely reach. The CI run tries ``CI_CASES`` byte mutants and a fifth as many
edits; ``PDJIT_FUZZ_CASES=N`` (or ``HYPOTHESIS_PROFILE=dev``: ``DEV_CASES``) tries more.
``python tests/e2e/hardening/test_fuzz.py N [SEED]`` prints the outcome counts by class (parse
error / verify error / parameter error / feed too large / run error / ok).

Both executors (``compare``): every mutant of the small models that verifies runs in the
reference and the compiled executor (strict), which must agree: equal values (floats within
``close``: relative to each fetched tensor's magnitude), or the same pdjit error class. CI runs
``CI_BOTH`` of them; ``PDJIT_FUZZ_CASES=N`` runs ``N // 10``;
``python tests/e2e/hardening/test_fuzz.py both N [SEED] [all]`` runs N over the small models (or
every model, loops bounded at 1,000 iterations) and prints the disagreements.
"""
import collections
import os
import pathlib
import random
import resource
import struct
import sys
import time
import traceback
import tracemalloc
import warnings

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import registry
from pdjit.framework.errors import ModelFileError, PdjitError, ProgramError
from pdjit.io import inference_model as inf
from pdjit.io.tensor_stream import _Reader, load_combined_params, read_tensor, write_tensor
from pdjit.proto import framework_pb2 as pb
from pdjit.testing.op_test import assert_native

FIXTURES = os.path.join(pathlib.Path(__file__).parents[2], "fixtures", "paddle")
PADDLE_MODELS = ("models/mlp", "models/cond_while", "models/transformer", "models/lstm",
                 "fit_a_line_infer", "mlp_infer")
CI_CASES, DEV_CASES = 2500, 20000
CI_BOTH = 40  # mutants run in both executors in CI (each distinct one may compile kernels)
MAX_FEED_ELEMENTS = 1 << 16
MAX_ALLOC = 1 << 28  # what one op output may take while mutants run
OUTCOMES = ("parse error", "verify error", "params error", "feed too large", "run error", "ok")


def _cases() -> int:
    n = os.environ.get("PDJIT_FUZZ_CASES")
    if n:
        return int(n)
    return DEV_CASES if os.environ.get("HYPOTHESIS_PROFILE") == "dev" else CI_CASES


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def pdjit_mlp() -> tuple:
    """An MLP pdjit builds and saves itself: x[-1, 6] -> fc 8 tanh -> fc 3 softmax."""
    import tempfile
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[6], dtype="float32")
        h = fluid.layers.fc(x, size=8, act="tanh")
        y = fluid.layers.fc(h, size=3, act="softmax")
    scope = fluid.Scope()
    exe = fluid.Executor(mode="reference")
    exe.run(startup, scope=scope)
    with tempfile.TemporaryDirectory() as d:
        fluid.io.save_inference_model(d, ["x"], [y], exe, main_program=main,
                                      params_filename="params", scope=scope)
        return "pdjit_mlp", _read(os.path.join(d, "__model__")), _read(os.path.join(d, "params"))


def sources() -> list:
    """``[(name, model bytes, params bytes)]``: the models the mutants come from."""
    out = [(name, _read(os.path.join(FIXTURES, name + ".pdmodel")),
            _read(os.path.join(FIXTURES, name + ".pdiparams"))) for name in PADDLE_MODELS]
    return out + [pdjit_mlp()]


# -- mutations -----------------------------------------------------------------------------------
def mutate(data: bytes, rng: random.Random) -> tuple:
    """``(kind, mutant)`` of ``data``."""
    b = bytearray(data)
    kind = rng.choice(("bit flips", "truncation", "duplicated span", "zeroed span",
                       "random bytes"))
    if kind == "bit flips":
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == "truncation":
        del b[rng.randrange(len(b)):]
    elif kind == "duplicated span":
        i = rng.randrange(len(b))
        b[i:i] = b[i:i + rng.randint(1, 32)]
    elif kind == "zeroed span":
        i = rng.randrange(len(b))
        n = min(rng.randint(1, 16), len(b) - i)
        b[i:i + n] = bytes(n)
    else:
        i = rng.randrange(len(b))
        n = rng.randint(1, 8)
        b[i:i + n] = bytes(rng.randrange(256) for _ in range(n))
    return kind, bytes(b)


def edit(data: bytes, rng: random.Random) -> tuple:
    """``(kind, mutant)``: one structural edit of a ProgramDesc's bytes (an attribute dropped,
    retyped or given an odd value, a slot emptied or pointed at another variable, an op type
    swapped, a variable's dims or dtype changed) that byte mutations rarely make."""
    A, VT = pb.AttrType, pb.VarType
    d = pb.ProgramDesc.FromString(data)
    b = d.blocks[rng.randrange(len(d.blocks))]
    if not b.ops:
        return "no op", data
    op = b.ops[rng.randrange(len(b.ops))]
    names = [v.name for v in b.vars] + [v.name for v in d.blocks[0].vars]
    kind = rng.choice(("drop attr", "attr value", "attr type", "rename input", "empty input",
                       "op type", "var desc", "rename output", "extra input"))
    attr = op.attrs[rng.randrange(len(op.attrs))] if op.attrs else None
    slots = op.inputs if kind != "rename output" else op.outputs
    slot = slots[rng.randrange(len(slots))] if len(slots) else None
    if kind == "drop attr" and attr is not None:
        kept = [a for a in op.attrs if a.name != attr.name]
        del op.attrs[:]
        op.attrs.extend(kept)
    elif kind == "attr value" and attr is not None:
        if attr.type in (A.INT, A.LONG, A.BLOCK):
            v = rng.choice([-1, 0, 2, 7, -100, 2 ** 31 - 1, len(d.blocks)])
            setattr(attr, {A.INT: "i", A.LONG: "l", A.BLOCK: "block_idx"}[attr.type], v)
        elif attr.type == A.FLOAT:
            attr.f = rng.choice([0.0, -1.0, float("nan"), 1e30])
        elif attr.type == A.INTS:
            del attr.ints[:]
            attr.ints.extend(rng.choice([[], [0], [-1, 5], [3, 2, 1, 0], [2 ** 30, 2 ** 30]]))
        elif attr.type == A.BOOLEAN:
            attr.b = not attr.b
        elif attr.type == A.STRING:
            attr.s = rng.choice(["", "NHWC", "bogus", "AnyLayout"])
    elif kind == "attr type" and attr is not None:
        attr.type = rng.choice([A.INT, A.FLOAT, A.INTS, A.STRING, A.BOOLEAN, A.LONG, A.FLOATS])
    elif kind in ("rename input", "rename output") and slot is not None and slot.arguments:
        slot.arguments[rng.randrange(len(slot.arguments))] = rng.choice(names)
    elif kind == "empty input" and slot is not None:
        del slot.arguments[:]
    elif kind == "op type":
        op.type = rng.choice(_OP_TYPES)
    elif kind == "var desc" and b.vars:
        v = b.vars[rng.randrange(len(b.vars))]
        if v.type.type == VT.LOD_TENSOR:
            td = v.type.lod_tensor.tensor
            del td.dims[:]
            td.dims.extend(rng.choice([[], [1], [-1, 3], [2, 2, 2, 2], [0]]))
            td.data_type = rng.choice([VT.FP32, VT.INT64, VT.FP64, VT.BOOL, VT.INT32])
    elif kind == "extra input" and slot is not None:
        slot.arguments.append(rng.choice(names))
    return kind, d.SerializeToString()


_OP_TYPES = sorted(registry.all_ops())


def _feeds(program, names, rng) -> dict:
    gb = program.global_block()
    feeds = {}
    for n in names:
        v = gb.var(n)
        shape = [2 if d < 0 else int(d) for d in v.shape]
        if int(np.prod(shape, dtype=object)) > MAX_FEED_ELEMENTS:
            return None
        dt = v.dtype if v.dtype is not None else np.dtype(np.float32)
        if dt.kind in "iub":
            feeds[n] = rng.integers(0, 2, size=shape).astype(dt)
        else:
            feeds[n] = rng.standard_normal(shape).astype(dt)
    return feeds


def attempt(model: bytes, params: bytes, executor, name: str = "m", keep=None) -> tuple:
    """``(outcome, fetched values or None)``: the mutant parsed, verified, loaded and run
    (the program appended to ``keep`` when given). Anything but a pdjit error propagates."""
    try:
        program = inf.parse_model(model, name + ".pdmodel")
    except ModelFileError:
        return "parse error", None
    except ProgramError:
        return "verify error", None
    try:
        values = inf.params_from_bytes(program, params, name + ".pdiparams")
    except ModelFileError:
        return "params error", None
    feeds = _feeds(program, inf.feed_target_names(program), np.random.default_rng(0))
    if feeds is None:
        return "feed too large", None
    scope = fluid.Scope()
    inf.commit_values(values, scope)
    if keep is not None:
        keep.append(program)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = executor.run(program, feed=feeds, fetch_list=inf.fetch_target_names(program),
                               scope=scope)
    except PdjitError:
        return "run error", None
    return "ok", out


def fuzz(srcs, cases: int, seed: int = 0, params_share: float = 0.2, executor=None,
         mutator=mutate) -> tuple:
    """``(Counter of outcomes, [failures])`` of ``cases`` mutants spread over ``srcs``; a
    failure is ``(source, case, kind, traceback)`` of an error that is not pdjit's."""
    executor = executor or fluid.Executor(mode="reference")
    counts, failures = collections.Counter(), []
    for i in range(cases):
        name, model, params = srcs[i % len(srcs)]
        rng = random.Random(f"{seed}/{name}/{i}")
        if mutator is edit:
            kind, model = edit(model, rng)
        elif rng.random() < params_share:
            kind, params = mutate(params, rng)
            kind = "params: " + kind
        else:
            kind, model = mutate(model, rng)
        try:
            outcome, _ = attempt(model, params, executor, name)
        except Exception:  # noqa: BLE001 - what the test is looking for
            failures.append((name, i, kind, traceback.format_exc()))
            continue
        counts[outcome] += 1
    return counts, failures


# -- both executors on every mutant that verifies -----------------------------------------------
def _outcome(executor, program, feeds, values):
    """``("ok", [arrays])`` or ``("error", class name)`` of one run; a non-pdjit error
    propagates."""
    scope = fluid.Scope()
    inf.commit_values(values, scope)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = executor.run(program, feed=feeds,
                               fetch_list=inf.fetch_target_names(program), scope=scope)
    except PdjitError as e:
        return "error", type(e).__name__
    return "ok", [np.asarray(o) for o in out]


#: float agreement between the executors: relative to each fetched tensor's magnitude
RTOL, ATOL = 1e-4, 1e-5


def close(x, y) -> bool:
    """Whether float arrays ``x`` (the reference's) and ``y`` agree: the same non-finite
    values at the same places, and every finite difference within ``ATOL + RTOL * m``, ``m``
    the largest finite magnitude of ``x``.

    Why relative to the tensor's magnitude and not to each element: the executors sum in
    different orders (NumPy's BLAS vs generated loops, blocked and split reductions), so each
    result carries rounding of the order of float32's epsilon times the magnitude of the terms
    it sums, not of itself. An element that comes out small by cancellation (a row of an
    attention output summing terms of +-100 to 0.97) keeps that absolute error, a large one
    relative to its own size; an ill-conditioned op a mutant puts in (``reciprocal`` where a
    ``softmax`` was, of values near 0) magnifies it further downstream. Error bounds of
    floating-point linear algebra are normwise for this reason. ``RTOL`` 1e-4 is ~840 ulps of
    the largest value: far above reordering noise in these small models, far below any wrong
    result (a wrong index, axis or formula changes values by their own magnitude)."""
    fx, fy = np.isfinite(x), np.isfinite(y)
    if not np.array_equal(fx, fy) or not np.array_equal(x[~fx], y[~fy], equal_nan=True):
        return False
    if not fx.any():
        return True
    xf, yf = x[fx].astype(np.float64), y[fy].astype(np.float64)
    scale = np.abs(xf).max()
    return bool((np.abs(xf - yf) <= ATOL + RTOL * scale).all())


def scratch_fetches(program) -> set:
    """The indices of fetched variables that an op writes only through an ``intermediate``
    output (an ``rnn``'s ``Reserve``: the op's scratch for its gradient, laid out by each
    executor its own way: the reference's values, the native kernel's bytes), which a
    mutant's rename may fetch: their contents are not compared."""
    block = program.global_block()
    plain, scratch = set(), set()
    for op in block.ops:
        opdef = registry.lookup(op.type)
        for slot_name in op.output_names:
            slot = next((s for s in opdef.outputs if s.name == slot_name), None) \
                if opdef is not None else None
            (scratch if slot is not None and slot.intermediate else plain).update(
                op.output(slot_name))
    return {i for i, n in enumerate(inf.fetch_target_names(program))
            if n in scratch and n not in plain}


def _same(a, b, skip=()) -> str | None:
    """Why two outcomes differ, or None (fetches whose index is in ``skip`` not compared)."""
    if a[0] != b[0] or a[0] == "error":
        return None if a == b else f"reference {a[0]} {a[1] if a[0] == 'error' else ''} vs " \
                                   f"compiled {b[0]} {b[1] if b[0] == 'error' else ''}"
    for i, (x, y) in enumerate(zip(a[1], b[1])):
        if i in skip:
            continue
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"fetch {i}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        ok = close(x, y) if x.dtype.kind in "fc" else np.array_equal(x, y)
        if not ok:
            d = np.abs(x.astype(np.float64) - y.astype(np.float64))
            d = np.where(np.isnan(d), np.inf, d)
            k = np.unravel_index(np.argmax(d), d.shape) if d.size else ()
            return f"fetch {i}: values differ: max |diff| {d.max():.3g} at {list(k)} " \
                   f"({x[k]!r} vs {y[k]!r}), max |reference| {np.nanmax(np.abs(x)):.3g}"
    return None


#: the local bound of :func:`_each_op_agrees`: an op run by its reference on the compiled run's
#: own inputs gives outputs this close (relative to each output's largest value; ~80 ulps of
#: float32) to the compiled run's
LOCAL_RTOL = 1e-5


def _each_op_agrees(program, feeds, values) -> bool:
    """Whether every op of the global block, run by its NumPy reference on the values the
    compiled run gave its inputs, gives the compiled run's outputs within ``LOCAL_RTOL``: then
    the two executors differ only by rounding that later ops magnify (a ``reciprocal`` of
    values near 0), not by a wrong result, which an op computes wrong on its own inputs. Only
    a global block without control flow is judged (False otherwise: the disagreement stands;
    a random op whose streams differ between the executors fails the check the same way)."""
    from pdjit.runtime import interpreter
    from pdjit.runtime.context import Env

    block = program.global_block()
    ops = []
    for op in block.ops:
        d = registry.lookup(op.type)
        if d is None or d.has(registry.CONTROL_FLOW) or op.sub_block_indices():
            return False
        if not d.has(registry.FEED_FETCH):
            ops.append(op)
    def results(op):  # its outputs but the intermediate ones (scratch each executor lays out)
        d = registry.lookup(op.type)
        return [n for s in d.outputs if not s.intermediate and s.name in op.output_names
                for n in op.output(s.name) if n != registry.EMPTY_VAR_NAME]

    names = sorted({n for op in ops for n in results(op)
                    if block._find_var_recursive(n) is not None})
    scope = fluid.Scope()
    inf.commit_values(values, scope)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = fluid.Executor(mode="compiled", strict=False).run(
                program, feed=feeds, fetch_list=names, scope=scope)
    except PdjitError:
        return False
    seen = dict(zip(names, (np.asarray(g) for g in got)))
    reference = fluid.Executor(mode="reference")
    for i, op in enumerate(block.ops):
        if op not in ops:
            continue
        env = Env(scope, block)
        env.values.update(feeds)
        env.values.update({n: v for n, v in seen.items() if n in op.input_arg_names})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                interpreter.run_op(reference, op, i, env, 0)
        except PdjitError:
            return False
        for n in results(op):
            if n not in seen or n not in env.values:
                continue
            a, b = np.asarray(env.values[n]), seen[n]
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            if a.dtype.kind in "fc":
                fa, fb = np.isfinite(a), np.isfinite(b)
                if not np.array_equal(fa, fb):
                    return False
                if fa.any():
                    x, y = a[fa].astype(np.float64), b[fb].astype(np.float64)
                    if not (np.abs(x - y) <= ATOL + LOCAL_RTOL * np.abs(x).max()).all():
                        return False
            elif not np.array_equal(a, b):
                return False
    return True


def compare(srcs, cases: int, seed: int = 0) -> tuple:
    """``(Counter, [disagreements], [failures])``: ``cases`` mutants (byte mutants and
    structural edits alternating) spread over ``srcs``; each that parses, verifies and loads
    runs in the reference and the compiled executor (strict: a native step that gives up on
    input the reference takes is checked again without strict mode: the same result as the
    reference's is counted as a fallback, not a disagreement), which must return equal values
    or raise the same pdjit error class; where both return values, every native step must
    have run natively. A disagreement / failure is ``(source, case, kind, detail)``; the
    Counter also counts the native steps that ran (``"native steps"``)."""
    reference = fluid.Executor(mode="reference")
    counts, disagreements, failures = collections.Counter(), [], []
    started = None

    def timed():  # the case just done: the slowest one's seconds, and those over 30 s
        if started is not None:
            took = time.perf_counter() - started
            counts["slowest case, ms"] = max(counts["slowest case, ms"], int(took * 1e3))
            counts["cases over 30 s"] += took > 30

    for i in range(cases):
        timed()
        started = time.perf_counter()
        name, model, params = srcs[i % len(srcs)]
        rng = random.Random(f"both/{seed}/{name}/{i}")
        kind, model = (edit if i % 2 else mutate)(model, rng)
        try:
            try:
                program = inf.parse_model(model, name + ".pdmodel")
                values = inf.params_from_bytes(program, params, name + ".pdiparams")
            except PdjitError:
                counts["refused before running"] += 1
                continue
            feeds = _feeds(program, inf.feed_target_names(program), np.random.default_rng(0))
            if feeds is None:
                counts["feed too large"] += 1
                continue
            want = _outcome(reference, program, feeds, values)
            compiled = fluid.Executor(mode="compiled", strict=True)
            got = _outcome(compiled, program, feeds, values)
        except Exception:  # noqa: BLE001 - what the test is looking for
            failures.append((name, i, kind, traceback.format_exc()))
            continue
        skip = scratch_fetches(program)
        why = _same(want, got, skip)
        if why is None and want[0] == "ok":
            try:
                counts["native steps"] += assert_native(compiled, require=False)
            except AssertionError as e:
                why = f"the compiled run fell back to the references: {e}"
        if why is not None and (got[0] == "error" and got[1] == "FallbackError" or
                                why.startswith("the compiled run fell back")):
            # strict mode refused a fallback (a native step gave up on input it cannot take,
            # e.g. a loop-carried value that changes shape): the result is the default mode's,
            # which falls back to the references, and that must equal the reference's
            try:
                lenient = _outcome(fluid.Executor(mode="compiled", strict=False), program,
                                   feeds, values)
            except Exception:  # noqa: BLE001 - what the test is looking for
                failures.append((name, i, kind, traceback.format_exc()))
                continue
            if _same(want, lenient, skip) is None:
                counts["fell back, same result"] += 1
                continue
            why = f"{why}; without strict mode: {_same(want, lenient, skip)}"
        if why is not None and "values differ" in why:
            try:
                local = _each_op_agrees(program, feeds, values)
            except Exception:  # noqa: BLE001 - what the test is looking for
                failures.append((name, i, kind, traceback.format_exc()))
                continue
            if local:
                counts["rounding magnified downstream (each op agrees on its inputs)"] += 1
                continue
        if why is not None:
            disagreements.append((name, i, kind, why))
            continue
        counts[f"agree ({want[0]})"] += 1
    timed()
    return counts, disagreements, failures


# -- the tests -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def srcs():
    return sources()


@pytest.fixture
def alloc_limit(monkeypatch):
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", str(MAX_ALLOC))


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_the_sources_run_unmutated(srcs, alloc_limit):
    exe = fluid.Executor(mode="reference")
    for name, model, params in srcs:
        outcome, out = attempt(model, params, exe, name)
        assert outcome == "ok", name
        assert all(np.isfinite(np.asarray(o, dtype=np.float64)).all() for o in out), name


def test_mutants_raise_only_pdjit_errors(srcs, alloc_limit):
    rss = _max_rss_bytes()
    counts, failures = fuzz(srcs, _cases())
    print(f"fuzz outcomes of {_cases()} mutants: {dict(counts)}")
    assert not failures, "".join(f"\n--- {n} case {i} ({k})\n{tb}" for n, i, k, tb in
                                 failures[:5]) + f"\n({len(failures)} failures)"
    # every class is reached, so the mutants test every stage
    for outcome in ("parse error", "verify error", "params error", "run error", "ok"):
        assert counts[outcome] > 0, (outcome, counts)
    assert _max_rss_bytes() - rss < 1 << 30  # no file made the process take a gigabyte


def test_edited_programs_raise_only_pdjit_errors(srcs, alloc_limit, monkeypatch):
    """Structural edits (attributes, slots, op types, variable descs) of the programs; a loop
    whose edited bound would run for ever stops at PDJIT_MAX_LOOP_ITERATIONS."""
    monkeypatch.setenv("PDJIT_MAX_LOOP_ITERATIONS", "50")
    counts, failures = fuzz(srcs, _cases() // 5, mutator=edit)
    print(f"edited programs: {dict(counts)}")
    assert not failures, "".join(f"\n--- {n} case {i} ({k})\n{tb}" for n, i, k, tb in
                                 failures[:5]) + f"\n({len(failures)} failures)"
    for outcome in ("verify error", "run error", "ok"):
        assert counts[outcome] > 0, (outcome, counts)


def test_a_sample_of_mutants_compiled_matches_the_reference(srcs, alloc_limit):
    """Mutants of the MLPs that run in reference mode, run compiled (native code asserted)."""
    reference, compiled = fluid.Executor(mode="reference"), fluid.Executor(mode="compiled",
                                                                           strict=True)
    chosen = [s for s in srcs if s[0] in ("models/mlp", "pdjit_mlp")]
    tried = agreed = 0
    programs = []  # alive, so that the executor's plans of them can be inspected
    for i in range(400):
        name, model, params = chosen[i % len(chosen)]
        _, model = mutate(model, random.Random(f"compiled/{i}"))
        outcome, want = attempt(model, params, reference, name)
        if outcome != "ok":
            continue
        tried += 1
        outcome, got = attempt(model, params, compiled, name, programs)
        assert outcome == "ok", (name, i)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        agreed += 1
        if tried == 12:
            break
    assert agreed >= 10
    assert_native(compiled)


def test_verified_mutants_agree_between_executors(srcs, alloc_limit):
    """Every mutant (byte mutant or structural edit) of the small models that verifies runs
    in both executors: equal results or the same named error class. ``PDJIT_FUZZ_CASES=N``
    runs N/10 of them."""
    small = [s for s in srcs if s[0] in ("models/mlp", "pdjit_mlp", "fit_a_line_infer",
                                         "mlp_infer")]
    n = int(os.environ["PDJIT_FUZZ_CASES"]) // 10 if os.environ.get("PDJIT_FUZZ_CASES") \
        else CI_BOTH
    counts, disagreements, failures = compare(small, n)
    print(f"both executors: {dict(counts)}")
    assert not failures, "".join(f"\n--- {s} case {i} ({k})\n{tb}" for s, i, k, tb in
                                 failures[:5])
    assert not disagreements, disagreements[:10]
    assert counts["agree (ok)"] >= n // 8 and counts["agree (error)"], counts
    assert counts["native steps"] > 0, counts


def test_float_agreement_is_relative_to_the_tensor_magnitude():
    """The executors' comparison (``close``): a small element made by cancellation in a
    tensor of magnitude ~100 may differ by float32 reordering noise of that magnitude (the
    transformer mutant with ``reciprocal`` for ``softmax``, seed 23 case 455: 0.97451174 vs
    0.97464454 in a row reaching 103, 1.3e-4 apart: 2e-6 of the magnitude, 1.4e-4 of the
    element); a wrong value, a moved NaN or Inf, is not close."""
    ref = np.array([[103.35980, 0.97451174, -50.0]], np.float32)
    got = np.array([[103.35972, 0.97464454, -50.00004]], np.float32)
    assert not np.allclose(got, ref, rtol=1e-4, atol=1e-5)  # elementwise: a false alarm
    assert close(ref, got)
    assert not close(ref, got * np.float32([1, 1, 1.01]))  # 0.5 off at magnitude 103
    wrong = ref.copy()
    wrong[0, 1] = 0.97451174 + 0.02
    assert not close(ref, wrong)
    specials = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert close(specials, specials.copy())
    assert not close(specials, specials[[1, 0, 2, 3]])
    assert close(np.zeros(3, np.float32), np.full(3, 1e-6, np.float32))  # ATOL near zero


def test_the_op_local_check_tells_magnified_rounding_from_a_wrong_op(monkeypatch,
                                                                    fresh_programs):
    """``_each_op_agrees``: a chain ``reciprocal`` of values near 0 then ``mul`` (which
    magnifies the compiled and reference executors' last-bit differences) agrees op by op on
    each op's own inputs; with one op's reference made wrong by 1e-3 (as a wrong native
    kernel would be on its inputs), it does not."""
    x = fluid.layers.data("x", [8])
    h = fluid.layers.reciprocal(fluid.layers.scale(x, scale=1e-3, bias=1e-4))
    y = fluid.layers.fc(h, 4)
    program = fluid.default_main_program()
    scope = fluid.Scope()
    fluid.Executor().run(fluid.default_startup_program(), scope=scope)
    values = {p.name: np.asarray(scope.find_var(p.name).get_tensor())
              for p in program.global_block().all_parameters()}
    feeds = {"x": np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)}
    assert y.name and _each_op_agrees(program, feeds, values)
    opdef = registry.get("reciprocal")
    right = opdef.reference
    monkeypatch.setattr(opdef, "reference", lambda X, **kw: right(X=X, **kw) * np.float32(1.001))
    assert not _each_op_agrees(program, feeds, values)


def test_entry_points_raise_only_pdjit_errors(srcs, tmp_path, alloc_limit):
    """Mutant files through each public entry point (load_inference_model, the Predictor,
    pdjit.static.load_inference_model, Program.parse_from_string + verify): every exception
    that escapes is a PdjitError."""
    import pdjit.inference as pinf
    import pdjit.static as static
    chosen = [s for s in srcs if s[0] in ("models/mlp", "pdjit_mlp")]
    classes = collections.Counter()
    for i in range(24):
        name, model, params = chosen[i % len(chosen)]
        rng = random.Random(f"entry/{i}")
        if i % 3 == 2:
            kind, params = mutate(params, rng)
        else:
            kind, model = (edit if i % 2 else mutate)(model, rng)
        (tmp_path / "m.pdmodel").write_bytes(model)
        (tmp_path / "m.pdiparams").write_bytes(params)
        prefix = str(tmp_path / "m")
        calls = [
            lambda: fluid.io.load_inference_model(str(tmp_path), fluid.Executor(),
                                                  model_filename="m.pdmodel",
                                                  params_filename="m.pdiparams"),
            lambda prefix=prefix: static.load_inference_model(prefix, fluid.Executor()),
            lambda model=model: fluid.verify(fluid.Program.parse_from_string(model)),
        ]

        def predictor(prefix=prefix):
            p = pinf.create_predictor(pinf.Config(prefix + ".pdmodel", prefix + ".pdiparams"))
            feeds = _feeds(p.program(), p.get_input_names(), np.random.default_rng(0))
            if feeds is not None:
                p.run([feeds[n] for n in p.get_input_names()])
        calls.append(predictor)
        for call in calls:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    call()
                classes["ok"] += 1
            except PdjitError as e:
                classes[type(e).__name__] += 1
            except Exception as e:  # noqa: BLE001 - what the test is looking for
                raise AssertionError(f"case {i} ({kind}): {type(e).__name__}: {e}") from e
    assert classes["ok"] and len(classes) > 2, classes


def test_check_command_on_mutants(srcs, tmp_path, capsys):
    """``pdjit check`` says OK (status 0) or names the problem (status 1) for every mutant."""
    from pdjit.cli import main as cli_main
    name, model, params = next(s for s in srcs if s[0] == "models/mlp")
    statuses = collections.Counter()
    for i in range(60):
        rng = random.Random(f"check/{i}")
        m, p = (mutate(model, rng)[1], params) if i % 3 else (model, mutate(params, rng)[1])
        (tmp_path / "m.pdmodel").write_bytes(m)
        (tmp_path / "m.pdiparams").write_bytes(p)
        status = cli_main(["check", str(tmp_path / "m")])
        out, err = capsys.readouterr()
        assert (status, bool(out), bool(err)) in ((0, True, False), (1, False, True)), (i, err)
        assert status == 0 or err.startswith(f"pdjit check: {tmp_path / 'm'}: ")
        statuses[status] += 1
    assert statuses[0] and statuses[1]


# -- damaged tensor files ------------------------------------------------------------------------
def _tensor_bytes(lod=None):
    from pdjit.runtime.tensor import LoDTensor
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    return write_tensor(LoDTensor(value, lod) if lod else value)


def _with_desc(dims, dtype=pb.VarType.FP32, desc_len=None, lod=b""):
    d = pb.VarType.TensorDesc(data_type=dtype, dims=dims).SerializeToString()
    head = struct.pack("<IQ", 0, 1 if lod else 0) + lod + struct.pack("<I", 0)
    return head + struct.pack("<i", len(d) if desc_len is None else desc_len) + d + bytes(48)


DAMAGED = {
    "empty": (b"", "truncated at byte 0 while reading t: version"),
    "version": (struct.pack("<IQ", 7, 0), "unsupported tensor version 7"),
    "lod_level": (struct.pack("<IQ", 0, 2 ** 40), "implausible lod_level"),
    "lod bytes not a multiple of 8": (struct.pack("<IQQ", 0, 1, 12) + bytes(12),
                                      "has 12 bytes, not a multiple of 8"),
    "lod length beyond the file": (struct.pack("<IQQ", 0, 1, 2 ** 62), "truncated at byte 20"),
    "desc length beyond the file": (_with_desc([4, 3], desc_len=10 ** 9), "truncated"),
    "negative desc length": (_with_desc([4, 3], desc_len=-5), "truncated"),
    "dims claim terabytes": (_with_desc([2 ** 20, 2 ** 20, 2 ** 10]), "bytes wanted, 48 left"),
    "dims whose product wraps": (_with_desc([2 ** 32, 2 ** 32]), "bytes wanted, 48 left"),
    "negative dim": (_with_desc([-4, 3]), "negative dim"),
    "unknown dtype": (_with_desc([4, 3], dtype=pb.VarType.BF16), "bad TensorDesc"),
    "lod disagrees with the rows": (_with_desc(
        [4, 3], lod=struct.pack("<QQQ", 16, 0, 9)), "LoD"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_tensor_is_a_named_error_allocating_nothing(case):
    data, message = DAMAGED[case]
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError, match=message):
            read_tensor(_Reader(data, "f.pdiparams"), "t")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_every_truncation_of_a_combined_file_is_a_named_error():
    blob = _tensor_bytes([[0, 1, 4]]) + _tensor_bytes()
    assert set(load_combined_params(blob, ["a", "b"])) == {"a", "b"}
    for n in range(len(blob)):
        with pytest.raises(ModelFileError, match="truncated|bytes left|LoD"):
            load_combined_params(blob[:n], ["a", "b"], "f.pdiparams")
    with pytest.raises(ModelFileError, match="4 bytes left after the 2 expected tensors"):
        load_combined_params(blob + bytes(4), ["a", "b"])


def _main_both(argv) -> None:
    n = int(argv[0]) if argv else 1000
    seed = int(argv[1]) if len(argv) > 1 else 1
    srcs = sources()  # (a loop an edit made endless stops at PDJIT_MAX_LOOP_ITERATIONS)
    if len(argv) < 3 or argv[2] != "all":
        srcs = [s for s in srcs if s[0] in ("models/mlp", "pdjit_mlp", "fit_a_line_infer",
                                            "mlp_infer")]
    counts, disagreements, failures = compare(srcs, n, seed=seed)
    print(f"{n} mutants in both executors: {dict(counts)}, disagreements "
          f"{len(disagreements)}, non-pdjit errors {len(failures)}")
    for d in disagreements[:20]:
        print("disagreement:", *d)
    for name, i, kind, tb in failures[:20]:
        print(f"--- {name} case {i} ({kind})\n{tb}")


if __name__ == "__main__" and sys.argv[1:2] == ["both"]:
    os.environ.setdefault("PDJIT_MAX_ALLOC_BYTES", str(MAX_ALLOC))
    os.environ.setdefault("PDJIT_MAX_LOOP_ITERATIONS", "1000")
    _main_both(sys.argv[2:])
elif __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else DEV_CASES
    os.environ.setdefault("PDJIT_MAX_ALLOC_BYTES", str(MAX_ALLOC))
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    srcs = sources()
    os.environ.setdefault("PDJIT_MAX_LOOP_ITERATIONS", "1000")  # an edited loop may not end
    for what, got in (("byte mutants", fuzz(srcs, n, seed=seed)),
                      ("edited programs", fuzz(srcs, n // 5, seed=seed, mutator=edit))):
        counts, failures = got
        total = sum(counts.values()) + len(failures)
        print(f"{total} {what}: " + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES)
              + f", non-pdjit errors {len(failures)}")
        for name, i, kind, tb in failures[:20]:
            print(f"--- {name} case {i} ({kind})\n{tb}")


MUTANTS = pathlib.Path(__file__).parents[2] / "fixtures" / "mutants"


@pytest.mark.parametrize("name", ["nonetype_shape", "syntaxerror_dminus1",
                                  "shapemismatch_lowering"])
def test_mutants_that_broke_compiled_plans(name):
    """Mutants (of the corpus models) that once escaped compiled plans as non-pdjit errors: a
    missing input passed to a native step as None, declared ranks that made the generated code
    a SyntaxError, a lowering's bare ShapeMismatch. Compiled mode now ends as the reference
    does, with the same values where both run."""
    model = (MUTANTS / f"{name}.pdmodel").read_bytes()
    params = (MUTANTS / f"{name}.pdiparams").read_bytes()
    ref, ref_out = attempt(model, params, fluid.Executor(mode="reference"))
    got, out = attempt(model, params, fluid.Executor(mode="compiled", strict=False))
    assert got == ref
    for a, b in zip(out or [], ref_out or []):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
