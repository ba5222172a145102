"""A Predictor for saved inference models, with Paddle Inference's names.

    config = pdjit.inference.Config("model_dir")          # or Config("m.pdmodel", "m.pdiparams")
    predictor = pdjit.inference.create_predictor(config)
    x = predictor.get_input_handle(predictor.get_input_names()[0])
    x.reshape(batch.shape); x.copy_from_cpu(batch)
    predictor.run()
    out = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
    # or: outs = predictor.run([batch])

Creating a predictor reads and checks the whole model (``pdjit.io.inference_model.load_model``),
applies the inference passes (``pdjit.passes.inference``; ``switch_ir_optim(False)`` turns them
off, ``delete_pass(name)`` drops one) and keeps the parameters in a Scope of its own. What the
passes made of a model is kept in the disk cache (``pdjit.io.optimized_cache``: the program and
the folded parameters, keyed by the model's files, the passes and pdjit's sources), so a later
process reads it instead of checking and optimizing the model again. The first
run of each input signature compiles (kernels come from the disk cache when they were compiled
before). Each compiled step of a few short kernel calls also gets its driver as one native
function, compiled on a thread of its own while the runs go on (none waits for it), and once
it is ready the next runs of each batch size keep the faster of the two
(``switch_native_drivers``). Inputs are checked
against the model's variables when they are given (name, dtype, rank and the known dims), so a
wrong input is an error naming the variable before anything runs. ``clone()`` gives a
predictor sharing the model and parameters, for another thread.
"""
from __future__ import annotations

import enum
import os

import numpy as np

from pdjit.framework.errors import FeedError, ModelFileError, named_errors
from pdjit.io.inference_model import InferenceModel, load_model, resolve
from pdjit.io.variables import _read_file
from pdjit.passes.verify import verify
from pdjit.runtime.checks import env_flag
from pdjit.runtime.executor import Executor
from pdjit.runtime.feed_fetch import changed_persistables, check_feed, check_feed_spec, feed_spec
from pdjit.runtime.place import CPUPlace, CUDAPlace
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor

__all__ = ["Config", "Predictor", "Tensor", "DataType", "PrecisionType", "create_predictor",
           "get_version"]


class DataType(enum.IntEnum):
    """The dtype of an input or output handle (``Tensor.type()``)."""
    FLOAT32 = 0
    INT64 = 1
    INT32 = 2
    UINT8 = 3
    INT8 = 4
    FLOAT16 = 5
    BOOL = 6
    FLOAT64 = 7


_TO_TYPE = {np.dtype(k): v for k, v in (
    ("float32", DataType.FLOAT32), ("int64", DataType.INT64), ("int32", DataType.INT32),
    ("uint8", DataType.UINT8), ("int8", DataType.INT8), ("float16", DataType.FLOAT16),
    ("bool", DataType.BOOL), ("float64", DataType.FLOAT64))}


class PrecisionType(enum.IntEnum):
    Float32 = 0
    Int8 = 1
    Half = 2


def get_version() -> str:
    from pdjit.version import __version__
    return f"pdjit {__version__}"


class Config:
    """Where the model is and how to run it: ``Config(model_dir)``, ``Config(prog_file,
    params_file)``, or ``Config()`` then ``set_model``."""

    def __init__(self, model_dir_or_prog_file=None, params_file=None):
        self._model_dir = self._prog_file = self._params_file = None
        if model_dir_or_prog_file is not None:
            if params_file is None:
                self.set_model(model_dir_or_prog_file)
            else:
                self.set_model(model_dir_or_prog_file, params_file)
        self._ir_optim = True
        self._optimized_cache = True
        self._memory_optim = True  # (see enable_memory_optim)
        self._native_drivers = env_flag("PDJIT_NATIVE_DRIVERS", True)
        self._threads = None
        self._gpu = None            # (memory_mb, device_id) once enable_use_gpu was called
        self._deleted_passes: list = []

    # -- the model ---------------------------------------------------------------------------
    def set_model(self, model_dir_or_prog_file, params_file=None) -> None:
        path = os.fspath(model_dir_or_prog_file)
        if params_file is None:
            self._model_dir, self._prog_file, self._params_file = path, None, None
        else:
            self._model_dir, self._prog_file = None, path
            self._params_file = os.fspath(params_file)

    def set_prog_file(self, path) -> None:
        self._model_dir, self._prog_file = None, os.fspath(path)

    def set_params_file(self, path) -> None:
        self._params_file = os.fspath(path)

    def model_dir(self):
        return self._model_dir

    def prog_file(self):
        return self._prog_file

    def params_file(self):
        return self._params_file

    # -- options -------------------------------------------------------------------------------
    def switch_ir_optim(self, x: bool = True) -> None:
        """Run the inference passes (on by default)."""
        self._ir_optim = bool(x)

    def ir_optim(self) -> bool:
        return self._ir_optim

    def switch_optimized_cache(self, x: bool = True) -> None:
        """Keep what the inference passes made of the model in the disk cache, and read it
        from there in later processes (``pdjit.io.optimized_cache``; on by default: off, no
        copy of the folded parameters is written to ``PDJIT_CACHE_DIR``)."""
        self._optimized_cache = bool(x)

    def optimized_cache_enabled(self) -> bool:
        return self._optimized_cache

    def delete_pass(self, name: str) -> None:
        """Leave out one inference pass (its name as ``PDJIT_DUMP_AFTER`` knows it)."""
        from pdjit.passes.inference import INFERENCE_PASSES
        known = [n for n, _ in INFERENCE_PASSES]
        if name not in known:
            raise ValueError(f"delete_pass: no inference pass {name!r} (passes: {known})")
        self._deleted_passes.append(name)

    def enable_memory_optim(self, x: bool = True) -> None:
        """Let intermediate buffers be reused by liveness inside compiled steps
        (``pdjit.codegen.memplan``): on by default (unlike Paddle Inference, whose default is
        off), as it lowers the peak memory and never measured slower: a run's working set
        stays smaller and warmer in the caches (MobileNetV2 at batch 1, one thread: 9.3-10.0
        -> 8.6-8.9 ms in processes of their own, 0.93-0.97x alternating in one process;
        ResNet-50 and a BERT-like encoder at batch 1 and 16 within 2 %)."""
        self._memory_optim = bool(x)

    def memory_optim_enabled(self) -> bool:
        return self._memory_optim

    def switch_native_drivers(self, x: bool = True) -> None:
        """Compile each step's driver into one native function as well, and run whichever
        measures faster per batch size (on by default; ``PDJIT_NATIVE_DRIVERS=0`` turns the
        default off). The first process to run a model pays seconds of compile time for it;
        later ones load it from the disk cache."""
        self._native_drivers = bool(x)

    def native_drivers_enabled(self) -> bool:
        return self._native_drivers

    def set_cpu_math_library_num_threads(self, n: int) -> None:
        """Threads of compiled loops and BLAS (process-wide: ``pdjit.set_num_threads``)."""
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"set_cpu_math_library_num_threads: expected an int >= 1, got {n!r}")
        self._threads = int(n)

    def cpu_math_library_num_threads(self) -> int:
        from pdjit.codegen.cpu import threads

        return self._threads if self._threads is not None else threads.get_num_threads()

    def disable_gpu(self) -> None:
        self._gpu = None

    def enable_use_gpu(self, memory_pool_init_size_mb: int = 100, device_id: int = 0) -> None:
        self._gpu = (int(memory_pool_init_size_mb), int(device_id))

    def use_gpu(self) -> bool:
        return self._gpu is not None

    def gpu_device_id(self) -> int:
        return self._gpu[1] if self._gpu else 0

    def switch_use_feed_fetch_ops(self, x: bool = True) -> None:
        """Accepted for compatibility: feeds and fetches are always bound directly."""

    def switch_specify_input_names(self, x: bool = True) -> None:
        """Accepted for compatibility: inputs are always named."""

    def summary(self) -> str:
        model = self._model_dir or f"{self._prog_file} + {self._params_file}"
        return "\n".join([f"model: {model}", f"ir_optim: {self._ir_optim}",
                          f"deleted passes: {self._deleted_passes or '-'}",
                          f"optimized-model cache: {self._optimized_cache}",
                          f"memory_optim: {self._memory_optim}",
                          f"native drivers: {self._native_drivers}",
                          f"cpu threads: {self.cpu_math_library_num_threads()}",
                          f"use_gpu: {self.use_gpu()}"])

    def _model_args(self) -> tuple:
        """What names the model's files: ``(model_dir,)`` or ``(prog_file, params_file)``."""
        if self._model_dir is not None:
            return (self._model_dir,)
        if self._prog_file is None:
            raise ValueError("Config: no model set (Config(model_dir), Config(prog_file, "
                             "params_file) or set_model)")
        return self._prog_file, self._params_file

    def _optimized(self) -> tuple:
        """``(program, feed names, fetch names, params, key)`` of the model after the
        inference passes: from the disk cache of optimized models
        (``pdjit.io.optimized_cache``), else loaded, checked and optimized here, and kept
        there for the next process (``switch_optimized_cache(False)``: never kept nor read);
        ``key``: the entry's ``ModelKey`` (None where there is no entry)."""
        from pdjit.passes.inference import INFERENCE_PASSES, optimize

        names = [n for n, _ in INFERENCE_PASSES if n not in self._deleted_passes]
        # the target the model runs on: the passes that ask it (channels_last) differ by it
        target = "cuda" if self.use_gpu() else "cpu"
        key = None
        if self._optimized_cache:
            from pdjit.io import optimized_cache

            model_file, pdir, pname = resolve(*self._model_args())
            try:
                data = _read_file(model_file, "model")
                if pname is not None and not os.path.exists(os.path.join(pdir, pname)):
                    raise OSError(pname)
                key = optimized_cache.model_key(data, pdir, pname, names, target)
            except (OSError, ModelFileError):
                key = None  # the load below names what is wrong
            if key is not None:
                hit = optimized_cache.load(key)
                if hit is not None:
                    program, params, feeds, fetches = hit
                    return program, feeds, fetches, params, key
        # the bytes the entry will stand for, taken before they are read (racy files only)
        digest = optimized_cache.racy_digest(key) if key is not None else None
        model = self._load()
        # the values were just read and nothing else holds them: reused
        from pdjit.codegen.target import get_target

        try:
            runs_on = get_target(target)
        except (ImportError, NotImplementedError):  # (the Executor says what is missing)
            runs_on = None
        program, params = optimize(model.program, model.params, names, overwrite=True,
                                   target=runs_on)
        if key is not None:
            # the Executor's check of the program (it fills in attribute defaults) done here,
            # so that the entry holds the program a run sees (marked verified when loaded)
            verify(program)
            if optimized_cache.store(key, program, params, model.feed_names,
                                     model.fetch_names, digest) is None:
                key = None
        return program, list(model.feed_names), list(model.fetch_names), params, key

    def _load(self) -> InferenceModel:
        return load_model(*self._model_args())


class Tensor:
    """An input or output of a predictor."""

    def __init__(self, predictor: "Predictor", name: str, is_input: bool):
        self._p, self._name, self._input = predictor, name, is_input
        self._var = predictor._program.global_block().var(name)

    def name(self) -> str:
        return self._name

    def type(self) -> DataType:
        return _TO_TYPE.get(np.dtype(self._var.dtype), DataType.FLOAT32)

    def shape(self) -> list:
        """The shape of the value it holds, else the declared one (-1 for unknown dims)."""
        v = self._value()
        return list(np.shape(v)) if v is not None else list(self._var.shape)

    def reshape(self, shape) -> None:
        """Declare the shape of the next input (checked against the model's variable)."""
        if not self._input:
            raise RuntimeError(f"reshape: {self._name!r} is an output")
        shape = [int(d) for d in shape]
        want = list(self._var.shape)
        if len(shape) != len(want) or any(w >= 0 and w != d for w, d in zip(want, shape)) or \
                any(d < 0 for d in shape):
            raise FeedError(f"input {self._name!r}: shape {shape} does not fit the model's "
                            f"{want} (-1: any size)")
        self._p._shapes[self._name] = tuple(shape)

    def copy_from_cpu(self, data) -> None:
        """Set the input (a copy of ``data``), checked against the model's variable."""
        if not self._input:
            raise RuntimeError(f"copy_from_cpu: {self._name!r} is an output")
        arr = np.array(data, copy=True, order="C") if isinstance(data, np.ndarray) else data
        value = check_feed(self._var, arr)
        shape = self._p._shapes.get(self._name)
        if shape is not None and tuple(np.shape(value)) != shape:
            raise FeedError(f"input {self._name!r}: the data has shape {list(np.shape(value))}, "
                            f"reshape() said {list(shape)}")
        self._p._feeds[self._name] = value

    def set_lod(self, lod) -> None:
        value = self._p._feeds.get(self._name)
        if value is None:
            raise RuntimeError(f"set_lod: copy data into {self._name!r} first")
        arr = value._array if isinstance(value, LoDTensor) else value
        self._p._feeds[self._name] = check_feed(self._var, LoDTensor(arr, lod))

    def lod(self) -> list:
        v = self._value()
        return [list(level) for level in v.lod()] if isinstance(v, LoDTensor) else []

    def copy_to_cpu(self) -> np.ndarray:
        v = self._value()
        if v is None:
            what = "copy data into it" if self._input else "run the predictor"
            raise RuntimeError(f"copy_to_cpu: {self._name!r} holds no value yet ({what} first)")
        return np.array(v, copy=True)

    def _value(self):
        return (self._p._feeds if self._input else self._p._outputs).get(self._name)


class Predictor:
    """Runs one loaded, optimized model; create it with :func:`create_predictor`."""

    @named_errors("Predictor")
    def __init__(self, config: Config, _shared=None):
        self._config = config
        if _shared is None:
            _shared = config._optimized() if config._ir_optim else None
        if _shared is None:
            model = config._load()
            _shared = (model.program, list(model.feed_names), list(model.fetch_names),
                       model.params, None)
        self._shared = _shared
        self._program, self._inputs, self._output_names, params, key = _shared
        self._scope = Scope()
        for name, value in params.items():
            self._scope.var(name).value = value
        # what the kernels derive from the parameters (packed filters) kept beside the cached
        # model: those of the parameters no run changes
        self._derived = None
        if key is not None:
            from pdjit.io.optimized_cache import DerivedValues

            changed = changed_persistables(self._program, self._inputs, params)
            self._derived = DerivedValues(
                key, {n: v for n, v in params.items() if n not in changed})
        if config._threads is not None:
            from pdjit.codegen.cpu import threads

            threads.set_num_threads(config._threads)
        place = CUDAPlace(config.gpu_device_id()) if config.use_gpu() else CPUPlace()
        # native drivers compiled on a thread of their own, never in a run (plan.py)
        self._exe = Executor(place, memory_optim=config._memory_optim,
                             native_drivers="background" if config._native_drivers else False)
        self._feeds: dict = {}
        self._shapes: dict = {}
        self._outputs: dict = {}
        gb = self._program.global_block()
        self._in = {n: Tensor(self, n, True) for n in self._inputs}
        self._specs = [feed_spec(gb.var(n)) for n in self._inputs]
        self._out = {n: Tensor(self, n, False) for n in self._output_names if gb.has_var(n)}

    def get_input_names(self) -> list:
        return list(self._inputs)

    def get_output_names(self) -> list:
        return list(self._output_names)

    def get_input_handle(self, name: str) -> Tensor:
        return self._handle(self._in, name, "input")

    def get_output_handle(self, name: str) -> Tensor:
        return self._handle(self._out, name, "output")

    @staticmethod
    def _handle(table, name, what):
        h = table.get(name)
        if h is None:
            raise KeyError(f"the model has no {what} {name!r} (its {what}s: {list(table)})")
        return h

    @named_errors("Predictor.run")
    def run(self, inputs=None):
        """Run on the inputs given to the handles; or, given a list of arrays (in
        ``get_input_names()`` order), run on them and return the outputs as arrays."""
        if inputs is not None:
            if not isinstance(inputs, (list, tuple)) or len(inputs) != len(self._inputs):
                n = len(inputs) if isinstance(inputs, (list, tuple)) else type(inputs).__name__
                raise FeedError(f"run: expected a list of {len(self._inputs)} arrays "
                                f"({self._inputs}), got {n}")
            feeds = {n: check_feed_spec(spec, v)
                     for n, spec, v in zip(self._inputs, self._specs, inputs)}
            return self._run(feeds)
        missing = [n for n in self._inputs if n not in self._feeds]
        if missing:
            raise FeedError(f"run: no data for input(s) {missing}: copy_from_cpu first")
        self._run(self._feeds)
        return True

    def _run(self, feeds) -> list:
        outs = self._exe.run(self._program, feed=feeds, fetch_list=self._output_names,
                             scope=self._scope)
        self._outputs = dict(zip(self._output_names, outs))
        if self._derived is not None:
            self._derived.update()
        return outs

    def clone(self) -> "Predictor":
        """A predictor sharing this one's model and parameters, with its own inputs, outputs
        and executor: one per thread."""
        return Predictor(self._config, self._shared)

    def program(self):
        """The program it runs (after the inference passes)."""
        return self._program

    def try_shrink_memory(self) -> int:
        return 0


@named_errors("pdjit.inference.create_predictor")
def create_predictor(config: Config) -> Predictor:
    if not isinstance(config, Config):
        raise TypeError(f"create_predictor: expected a pdjit.inference.Config, got "
                        f"{type(config).__name__}")
    return Predictor(config)

