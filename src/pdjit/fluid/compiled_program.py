"""``CompiledProgram`` and its strategies, as Fluid spells them.

Every program pdjit runs is compiled already (the executor plans and compiles it on its first
run), so a ``CompiledProgram`` is a wrapper the executor unwraps: ``exe.run(compiled, ...)``
runs the wrapped ``Program`` exactly as ``exe.run(program, ...)`` would, with the same results.

``with_data_parallel(...)`` is accepted and runs the program as **one replica** using this
machine's cores (the compiled code's threads, see ``pdjit.set_num_threads``). Fluid would run
``CPU_NUM`` replicas, each on a slice of the batch, and return fetched values concatenated
per replica (a loss of shape ``[CPU_NUM]``); here a fetched loss is the one value of the whole
batch. The first run of a data-parallel ``CompiledProgram`` says so in a warning (once per
``CompiledProgram``).

``BuildStrategy`` and ``ExecutionStrategy`` accept Fluid 1.8's fields. Fields whose intent pdjit
fulfils anyway are silent: the fusion switches (pdjit fuses elementwise chains, epilogues and
optimizer updates itself), memory reuse and in-place, sequential execution (ops always run in
program order), the reduce and gradient-scale strategies other than ``Customized`` and
``sync_batch_norm`` (with one replica there is nothing to reduce, scale or synchronise),
``num_iteration_per_drop_scope``, ``use_experimental_executor`` (the compiled executor runs
either way). Setting any other field to a value other than its default
warns once per process and field, saying why it has no effect. Unknown field names raise
``AttributeError``.

``ParallelExecutor`` (Fluid 1.x's older spelling of the same thing) is an ``Executor`` running a
data-parallel ``CompiledProgram`` of ``main_program`` in ``scope``.
"""
from __future__ import annotations

import copy
import os
import warnings

from pdjit.framework.errors import user_stacklevel
from pdjit.framework.program import Program

__all__ = ["CompiledProgram", "BuildStrategy", "ExecutionStrategy", "ParallelExecutor"]

_warned_fields: set = set()


class _Strategy:
    """Fluid-style strategy object: a fixed set of fields with defaults. ``_FIELDS`` maps
    each field to ``(default, why)``: ``why`` is ``None`` for a field pdjit fulfils anyway,
    else the reason a non-default value has no effect (warned once per process and field)."""

    _FIELDS: dict = {}
    _SILENT_VALUES: dict = {}  # field -> values that are fulfilled although not the default

    def __init__(self):
        for name, (default, _) in self._FIELDS.items():
            object.__setattr__(self, name, copy.copy(default))  # no list shared by instances

    def __setattr__(self, name, value):
        if name not in self._FIELDS:
            known = ", ".join(sorted(self._FIELDS))
            raise AttributeError(f"{type(self).__name__} has no field {name!r} (its fields: "
                                 f"{known})")
        default, why = self._FIELDS[name]
        key = (type(self).__name__, name)
        if why is not None and value != default and value not in \
                self._SILENT_VALUES.get(name, ()) and key not in _warned_fields:
            _warned_fields.add(key)
            warnings.warn(f"{type(self).__name__}.{name} = {value!r} has no effect in pdjit: "
                          f"{why}", UserWarning, stacklevel=2)
        object.__setattr__(self, name, value)

    def __repr__(self):
        changed = {k: getattr(self, k) for k, (d, _) in self._FIELDS.items()
                   if getattr(self, k) != d}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


_ONE_REPLICA = "pdjit runs one replica on this machine (no distributed training)"


class BuildStrategy(_Strategy):
    """How Fluid would build the data-parallel graph; see the module docstring for which
    fields matter here (none change results)."""

    class ReduceStrategy:
        AllReduce = 0
        Reduce = 1

    class GradientScaleStrategy:
        CoeffNumDevice = 0
        One = 1
        Customized = 2

    _FIELDS = {
        "reduce_strategy": (0, None),
        "gradient_scale_strategy": (
            0, "one replica: the loss gradient is 1 as the backward pass makes it, never fed"),
        "debug_graphviz_path": ("", "pdjit builds no graph to draw (PDJIT_DUMP=1 prints the "
                                    "fusion report and plans)"),
        "enable_sequential_execution": (False, None),
        "fuse_broadcast_ops": (False, None),
        "fuse_elewise_add_act_ops": (False, None),
        "fuse_relu_depthwise_conv": (False, None),
        "fuse_bn_act_ops": (False, None),
        "fuse_bn_add_act_ops": (True, None),
        "fuse_all_optimizer_ops": (False, None),
        "fuse_all_reduce_ops": (False, None),
        "fuse_gemm_epilogue": (False, None),
        "enable_auto_fusion": (False, None),
        "enable_inplace": (None, None),
        "memory_optimize": (None, None),
        "sync_batch_norm": (False, None),
        "enable_backward_optimizer_op_deps": (True, None),
        "remove_unnecessary_lock": (True, None),
        "cache_runtime_context": (False, None),
        "num_trainers": (1, _ONE_REPLICA),
        "trainer_id": (0, _ONE_REPLICA),
        "trainers_endpoints": ([], _ONE_REPLICA),
        "nccl_comm_num": (1, _ONE_REPLICA),
        "use_hierarchical_allreduce": (False, _ONE_REPLICA),
        "hierarchical_allreduce_inter_nranks": (0, _ONE_REPLICA),
        "mkldnn_enabled_op_types": ([], "pdjit compiles its own kernels (no oneDNN)"),
        "is_distribution": (False, _ONE_REPLICA),
    }
    _SILENT_VALUES = {"gradient_scale_strategy": (0, 1)}


class ExecutionStrategy(_Strategy):
    """How Fluid would execute the data-parallel graph; see the module docstring."""

    _FIELDS = {
        "num_threads": (0, "the compiled code's threads are set process-wide with "
                           "pdjit.set_num_threads(n) or PDJIT_NUM_THREADS=n, before building "
                           "programs"),
        "num_iteration_per_drop_scope": (100, None),
        "num_iteration_per_run": (1, "each Executor.run runs the program once"),
        "use_thread_barrier": (False, "ops run in program order on one replica"),
        "allow_op_delay": (False, "ops run in program order on one replica"),
        "dry_run": (False, "the program runs (pdjit has no dry run)"),
        # Fluid's faster threaded executor: pdjit's compiled executor is what runs either way
        "use_experimental_executor": (False, None),
    }


class CompiledProgram:
    """A ``Program`` marked for compilation, as Fluid's ``fluid.CompiledProgram``: give it to
    ``Executor.run`` in place of the program. See the module docstring."""

    def __init__(self, program_or_graph, build_strategy=None):
        if not isinstance(program_or_graph, Program):
            raise TypeError(f"CompiledProgram: expected a Program, got "
                            f"{type(program_or_graph).__name__} (pdjit has no IrGraph: pass "
                            f"the Program itself)")
        if build_strategy is not None and not isinstance(build_strategy, BuildStrategy):
            raise TypeError(f"CompiledProgram: build_strategy must be a BuildStrategy, got "
                            f"{type(build_strategy).__name__}")
        self._program = program_or_graph
        self._build_strategy = build_strategy or BuildStrategy()
        self._exec_strategy = None
        self._loss_name = None
        self._places = None
        self._share_vars_from = None
        self._is_data_parallel = False
        self._warned = False

    def with_data_parallel(self, loss_name=None, build_strategy=None, exec_strategy=None,
                           share_vars_from=None, places=None) -> "CompiledProgram":
        """Accept Fluid's data-parallel settings and return ``self``; the program runs as one
        replica (see the module docstring)."""
        if self._is_data_parallel:
            raise RuntimeError("CompiledProgram.with_data_parallel: already called on this "
                               "CompiledProgram")
        if loss_name is not None:
            name = getattr(loss_name, "name", loss_name)
            if not isinstance(name, str) or self._program.global_block()._find_var_recursive(
                    name) is None:
                raise ValueError(f"CompiledProgram.with_data_parallel: loss_name {name!r} is "
                                 f"not a variable of the program's global block")
            loss_name = name
        if build_strategy is not None:
            if not isinstance(build_strategy, BuildStrategy):
                raise TypeError(f"with_data_parallel: build_strategy must be a BuildStrategy, "
                                f"got {type(build_strategy).__name__}")
            self._build_strategy = build_strategy
        if exec_strategy is not None and not isinstance(exec_strategy, ExecutionStrategy):
            raise TypeError(f"with_data_parallel: exec_strategy must be an ExecutionStrategy, "
                            f"got {type(exec_strategy).__name__}")
        if share_vars_from is not None and not isinstance(share_vars_from, CompiledProgram):
            raise TypeError(f"with_data_parallel: share_vars_from must be a CompiledProgram, "
                            f"got {type(share_vars_from).__name__}")
        self._exec_strategy = exec_strategy or ExecutionStrategy()
        self._loss_name, self._places, self._share_vars_from = loss_name, places, share_vars_from
        self._is_data_parallel = True
        return self

    def _as_program(self) -> Program:
        """The wrapped Program (what ``Executor.run`` runs)."""
        if self._is_data_parallel and not self._warned:
            self._warned = True
            n = len(self._places) if isinstance(self._places, (list, tuple)) else None
            asked = f"{n} places" if n else \
                f"CPU_NUM={os.environ['CPU_NUM']}" if os.environ.get("CPU_NUM") else \
                "one replica per core"
            warnings.warn(
                f"CompiledProgram.with_data_parallel runs the program as one replica on this "
                f"machine's cores (Fluid would run {asked}): fetched values are those of the "
                f"whole batch, not split or concatenated per device", UserWarning,
                stacklevel=user_stacklevel())
        return self._program

    @property
    def program(self) -> Program:
        return self._program

    def __repr__(self):
        return f"CompiledProgram({'data parallel, ' if self._is_data_parallel else ''}" \
               f"{self._program.num_blocks} block(s))"


class ParallelExecutor:
    """Fluid 1.x's ``fluid.ParallelExecutor``: ``run(fetch_list, feed)`` runs ``main_program``
    (default: the default main program) as ``Executor.run`` runs
    ``CompiledProgram(main_program, build_strategy).with_data_parallel(loss_name, ...)``, in
    ``scope`` (default: the global scope). ``use_cuda=True`` needs a CUDA build;
    ``num_trainers``/``trainer_id`` other than 1/0 (distributed training) are refused."""

    def __init__(self, use_cuda, loss_name=None, main_program=None, share_vars_from=None,
                 exec_strategy=None, build_strategy=None, num_trainers=1, trainer_id=0,
                 scope=None):
        from pdjit.framework.program import default_main_program
        from pdjit.runtime.executor import Executor
        from pdjit.runtime.place import CPUPlace, CUDAPlace, is_compiled_with_cuda
        from pdjit.runtime.scope import global_scope

        if use_cuda and not is_compiled_with_cuda():
            raise RuntimeError("ParallelExecutor: use_cuda=True, but this pdjit is not compiled "
                               "with CUDA (fluid.is_compiled_with_cuda() is False): pass "
                               "use_cuda=False")
        if num_trainers != 1 or trainer_id != 0:
            raise ValueError(f"ParallelExecutor: num_trainers={num_trainers}, "
                             f"trainer_id={trainer_id}: distributed training is not supported "
                             f"(expected 1 and 0)")
        if share_vars_from is not None and not isinstance(share_vars_from, ParallelExecutor):
            raise TypeError(f"ParallelExecutor: share_vars_from must be a ParallelExecutor, got "
                            f"{type(share_vars_from).__name__}")
        program = main_program if main_program is not None else default_main_program()
        self._compiled = CompiledProgram(program, build_strategy).with_data_parallel(
            loss_name=loss_name, exec_strategy=exec_strategy,
            share_vars_from=None if share_vars_from is None else share_vars_from._compiled)
        # variables are shared through the scope, as Fluid's share_vars_from shares them
        self._scope = scope if scope is not None else (
            share_vars_from._scope if share_vars_from is not None else global_scope())
        self._exe = Executor(CUDAPlace(0) if use_cuda else CPUPlace())

    @property
    def device_count(self) -> int:
        """The number of replicas run: one (see the module docstring)."""
        return 1

    def run(self, fetch_list, feed=None, feed_dict=None, return_numpy=True):
        """Run the program once; ``feed`` (or the older ``feed_dict``) is a dict, or a list of
        one dict per place. Returns the values of ``fetch_list``."""
        if feed is None and feed_dict is not None:
            feed = feed_dict
        return self._exe.run(self._compiled, feed=feed, fetch_list=fetch_list,
                             scope=self._scope, return_numpy=return_numpy)

    def drop_local_exe_scopes(self) -> None:
        """Nothing to drop: runs keep no local scopes between them."""
