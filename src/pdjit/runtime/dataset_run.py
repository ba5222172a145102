"""``Executor.train_from_dataset`` / ``infer_from_dataset``: Fluid 1.x's trainer loop over a
dataset (``pdjit.io.dataset``).

The loop asks the dataset for the feed dicts of one pass (``dataset._feeds()``) and runs the
program once per batch through ``Executor.run``, so every run is compiled, checked and committed
as any other. Every ``print_period`` batches it prints, as Fluid's workers do,
``time: [%Y-%m-%d %H:%M:%S], batch: [n], <info>[<numel>]:[v v ...]`` for each fetched
variable (``fetch_info`` labels them; default: their names). ``fetch_handler`` (Fluid's
``FetchHandler``: ``var_dict``, ``period_secs``, ``handler(res)``) gets the values of its
variables after a batch once ``period_secs`` have passed since it last did, and after the last
batch. ``debug=True`` prints the number of batches and the time taken at the end.

Inference (``infer_from_dataset``) runs the program without its backward, optimizer and
learning-rate ops (``Program.clone(for_test=True)``): it reads the parameters and updates none.
This departs from Fluid on purpose: Fluid 1.8 documents only that the push of gradients to
parameter servers is disabled, and on one machine it runs every op of the program given
(PaddlePaddle 3.3.1's legacy executor, tried: a program with an SGD step changes its weights
under ``infer_from_dataset``). A test program (what evaluation scripts pass) computes the same
either way.
"""
from __future__ import annotations

import time

import numpy as np

from pdjit.framework.errors import PdjitError
from pdjit.framework.program import Program, default_main_program


class FetchHandler:
    """Fluid's ``fluid.executor.FetchHandler``: ``var_dict`` maps keys to variables (or
    names) whose values ``handler`` gets, as ``{key: ndarray}``, every ``period_secs`` seconds
    of a ``train_from_dataset`` / ``infer_from_dataset`` run (and after its last batch).
    Subclass it and override :meth:`handler`; this one prints each key and its value."""

    def __init__(self, var_dict=None, period_secs=60):
        if not isinstance(var_dict, dict) or not var_dict:
            raise PdjitError(f"FetchHandler: var_dict must be a dict of key -> Variable, got "
                             f"{var_dict!r}")
        self.var_dict = var_dict
        self.period_secs = period_secs

    def handler(self, res_dict):
        print(" ".join(f"{k}: {np.asarray(v).reshape(-1)[:1]}" for k, v in res_dict.items()),
              flush=True)


def _for_inference(program: Program) -> Program:
    cached = program.__dict__.get("_infer_clone")
    if cached is None or cached[0] != program.version:
        cached = program._infer_clone = (program.version, program.clone(for_test=True))
    return cached[1]


def _format(value) -> str:
    a = np.asarray(value).reshape(-1)
    fmt = (lambda v: format(float(v), "g")) if a.dtype.kind == "f" else str
    return f"[{a.size}]:[" + " ".join(fmt(v) for v in a) + "]"


def run_from_dataset(exe, program, dataset, scope, thread, is_infer, debug, fetch_list,
                     fetch_info, print_period, fetch_handler) -> None:
    what = "infer_from_dataset" if is_infer else "train_from_dataset"
    if dataset is None or not callable(getattr(dataset, "_feeds", None)):
        raise PdjitError(f"Executor.{what}: dataset must be a dataset made by "
                         f"fluid.DatasetFactory().create_dataset(...), got "
                         f"{type(dataset).__name__}")
    program = program if program is not None else default_main_program()
    plain = program
    if not isinstance(program, Program):
        as_program = getattr(program, "_as_program", None)  # a CompiledProgram
        if as_program is None:
            raise TypeError(f"Executor.{what}: program must be a Program, got "
                            f"{type(program).__name__}")
        plain = as_program()
    threads = thread if thread and thread > 0 else getattr(dataset, "thread_num", 0)
    if not threads or threads <= 0:
        raise PdjitError(f"Executor.{what}: set a thread count, in the dataset (set_thread) "
                         f"or with thread=")
    if isinstance(print_period, bool) or not isinstance(print_period, (int, np.integer)) or \
            print_period < 1:
        raise PdjitError(f"Executor.{what}: print_period must be an int >= 1, got "
                         f"{print_period!r}")
    fetch_list = list(fetch_list or [])
    names = [f if isinstance(f, str) else f.name for f in fetch_list]
    if fetch_info is None:
        fetch_info = names
    fetch_info = list(fetch_info)
    if len(fetch_info) != len(names):
        raise PdjitError(f"Executor.{what}: fetch_info has {len(fetch_info)} labels for "
                         f"{len(names)} variables of fetch_list: expected one per variable")
    handler_keys, handler_names = [], []
    if fetch_handler is not None:
        for key, var in dict(fetch_handler.var_dict).items():
            handler_keys.append(key)
            handler_names.append(var if isinstance(var, str) else var.name)
    run_program = _for_inference(plain) if is_infer else program  # (a CompiledProgram as is)
    fetch = names + handler_names
    start = last_handled = time.time()
    batches = 0
    values = None
    for feed in dataset._feeds():
        values = exe.run(run_program, feed=feed, fetch_list=fetch, scope=scope)
        batches += 1
        if names and batches % print_period == 0:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            items = ", ".join(info + _format(v) for info, v in zip(fetch_info, values))
            print(f"time: [{stamp}], batch: [{batches}], {items}", flush=True)
        if handler_keys and time.time() - last_handled >= fetch_handler.period_secs:
            fetch_handler.handler(dict(zip(handler_keys, values[len(names):])))
            last_handled = time.time()
    if handler_keys and values is not None:
        fetch_handler.handler(dict(zip(handler_keys, values[len(names):])))
    if debug:
        took = time.time() - start
        print(f"{what}: {batches} batches in {took:.3f} s"
              + (f" ({1000 * took / batches:.3f} ms per batch)" if batches else ""), flush=True)
