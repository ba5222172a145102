"""``pdjit run``: a saved model on inputs from ``.npy`` files, through ``pdjit.inference``."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from pdjit.framework.errors import ModelFileError
from pdjit.tools import CliError, plural


def make_predictor(path: str, ir_optim: bool = True, threads: int | None = None):
    from pdjit.inference import Config, create_predictor
    config = Config(path)
    config.switch_ir_optim(ir_optim)
    config.disable_gpu()
    if threads is not None:
        config.set_cpu_math_library_num_threads(threads)
    return create_predictor(config)


def _load_array(path: str, what: str):
    """An ``.npy`` file's array or an ``.npz`` archive (``pdjit.io.npyfile``: sizes checked
    before anything is allocated or inflated)."""
    from pdjit.io import npyfile
    if not os.path.exists(path):
        raise CliError(f"{what}: no such file: {path}")
    try:
        return npyfile.load(path)
    except ModelFileError as e:
        raise CliError(f"{what}: {e}") from None


def _member(arrays, name: str, path: str):
    """Array ``name`` of an open .npz archive (read when asked: an object array, which would
    need pickle, a damaged member or one beyond the bounds fails here)."""
    try:
        return arrays[name]
    except ModelFileError as e:
        raise CliError(f"--input {e}") from None


def read_inputs(specs: list, input_names: list) -> dict:
    """``{input name: array}`` from ``NAME=FILE.npy`` items (``FILE.npy`` alone for a model with
    one input; ``FILE.npz`` alone supplies every input named by one of its keys)."""
    feeds = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path = spec
            if path.endswith(".npz"):
                arrays = _load_array(path, "--input")
                for n in input_names:
                    if n in arrays.files:
                        feeds[n] = _member(arrays, n, path)
                if not any(n in arrays.files for n in input_names):
                    raise CliError(f"--input {path}: holds none of the model's inputs "
                                   f"{input_names} (its keys: {arrays.files})")
                continue
            if len(input_names) != 1:
                raise CliError(f"--input {spec}: the model has {len(input_names)} inputs "
                               f"{input_names}: give NAME=FILE.npy for each")
            name = input_names[0]
        if name not in input_names:
            raise CliError(f"--input {spec}: the model has no input {name!r} "
                           f"(its inputs: {input_names})")
        if name in feeds:
            raise CliError(f"--input {spec}: input {name!r} is given twice")
        value = _load_array(path, f"--input {name}")
        if not isinstance(value, np.ndarray):
            raise CliError(f"--input {name}: {path} is an .npz archive; give a .npy file")
        feeds[name] = value
    missing = [n for n in input_names if n not in feeds]
    if missing:
        raise CliError(f"no data for input(s) {missing}: give --input NAME=FILE.npy")
    return feeds


def summary(value) -> str:
    """``min max mean`` and the first values of an output."""
    a = np.asarray(value)
    if a.size == 0:
        return "empty"
    flat = a.reshape(-1)
    fmt = (lambda v: f"{v:.6g}") if a.dtype.kind in "fc" else str
    first = "[" + ", ".join(fmt(v) for v in flat[:6].tolist()) + \
        (", ...]" if flat.size > 6 else "]")
    if a.dtype.kind in "fc":
        finite = np.isfinite(a)
        bad = int(a.size - np.count_nonzero(finite))
        vals = a[finite] if bad else a
        stats = (f"min {vals.min():.6g}  max {vals.max():.6g}  mean {vals.mean():.6g}"
                 if vals.size else "no finite values")
        if bad:
            stats += f"  non-finite {bad}"
    elif a.dtype.kind in "biu":
        stats = f"min {a.min()}  max {a.max()}  mean {a.astype(np.float64).mean():.6g}"
    else:
        stats = ""
    return f"{stats}  first {first}".strip()


def run(path: str, inputs: list, output: str | None = None, ir_optim: bool = True,
        threads: int | None = None, out=None) -> int:
    out = out or sys.stdout
    if output and not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise CliError(f"--output: cannot write {output}: no such directory")
    predictor = make_predictor(path, ir_optim, threads)
    names = predictor.get_input_names()
    feeds = read_inputs(inputs or [], names)
    for n in names:
        handle = predictor.get_input_handle(n)
        handle.reshape(np.shape(feeds[n]))
        handle.copy_from_cpu(feeds[n])
    t0 = time.perf_counter()
    predictor.run()
    seconds = time.perf_counter() - t0
    results = {}
    for n in predictor.get_output_names():
        results[n] = predictor.get_output_handle(n).copy_to_cpu()
    width = max((len(n) for n in results), default=0)
    for n, v in results.items():
        shape = "[" + ", ".join(str(d) for d in np.shape(v)) + "]"
        print(f"{n:{width}s}  {shape:14s} {str(np.asarray(v).dtype):8s} {summary(v)}", file=out)
    print(f"# ran in {seconds * 1e3:.2f} ms (the first run of a shape compiles, or loads its "
          f"kernels from the cache)", file=sys.stderr)
    if output:
        try:
            np.savez(output, **results)
        except OSError as e:
            raise CliError(f"--output: cannot write {output}: {e.strerror}") from None
        saved = output if output.endswith(".npz") else output + ".npz"
        print(f"# saved {plural(len(results), 'output')} to {saved}", file=sys.stderr)
    return 0

