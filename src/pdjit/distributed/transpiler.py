"""The collective transpiler: a training program -> its data-parallel version (a program pass).

The layout is PaddlePaddle 3.3.1's (what its ``GradAllReduce`` transpiler and fleet's
raw-program optimizer write on a CPU build; ``tests/distributed`` compares with programs Paddle
wrote):

startup program
    ``broadcast`` (``x`` = ``out`` = the parameter, ``root`` 0) per parameter, in the order the
    parameters were created, ``ring_id`` cycling over the rings, then one
    ``c_sync_comm_stream`` per ring: every rank starts from rank 0's initial values.
main program
    - after the loss gradient's ``fill_constant`` (role Backward|Loss), a ``scale`` of it by
      ``1/nranks`` (in place): summing the ranks' gradients then averages them;
    - unfused (``fuse=False``, ``GradAllReduce``): after each backward op that produces
      parameter gradients (the ops with ``op_role_var``), a ``c_sync_calc_stream`` and one
      ``all_reduce`` (``reduce_type`` 0, sum, in place) per gradient, ``ring_id`` cycling over
      the rings in reverse program order; before the first optimizer op one
      ``c_sync_comm_stream`` per ring;
    - fused (``fuse=True``, fleet's default): the gradients, in backward order, grouped into
      buckets per dtype of at most ``fuse_grad_size_in_num`` gradients (and
      ``fuse_grad_size_in_MB`` megabytes); before the backward ops one ``coalesce_tensor``
      per bucket (``Input`` the parameters, ``Output`` the gradients, ``FusedOutput`` the flat
      buffer, ``copy_data`` false, ``use_align`` true); after the last op writing a gradient of
      the bucket a ``c_sync_calc_stream`` and the bucket's ``all_reduce``; before the first
      optimizer op one ``c_sync_comm_stream`` of every buffer (Paddle's layout with
      ``FLAGS_sync_before_allreduce``). A model with many parameters makes few collective calls.

Every inserted op has role Backward (startup ops: Forward), as Paddle writes them. Gradient
clipping, regularisation and the optimizer's update ops come after the all-reduce (they have role
Optimize), so they see the averaged gradients: every optimizer works unchanged.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes, registry, unique_name
from pdjit.ops.collective import SUM

BACKWARD, FORWARD, OPTIMIZE, LOSS = (registry.OP_ROLE_BACKWARD, registry.OP_ROLE_FORWARD,
                                     registry.OP_ROLE_OPTIMIZE, registry.OP_ROLE_LOSS)


def _role(op) -> int:
    return int(op.attr("op_role")) if op.has_attr("op_role") else 0


def _is_backward(op) -> bool:
    return bool(_role(op) & BACKWARD)


def _is_loss_grad(op) -> bool:
    return bool(_role(op) & BACKWARD) and bool(_role(op) & LOSS)


def _is_optimizer(op) -> bool:
    return bool(_role(op) & OPTIMIZE)


def _role_var(op) -> list:
    if not (_is_backward(op) and op.has_attr("op_role_var")):
        return []
    rv = list(op.attr("op_role_var"))
    if len(rv) % 2:
        raise ValueError(f"{op._describe()}: op_role_var must pair parameters with their "
                         f"gradients, got an odd number of names {rv}")
    return rv


def _distributed(var) -> bool:
    return bool(getattr(var, "is_distributed", False))


class GradAllReduce:
    """Rewrites a startup and a main program for data-parallel training on ``nranks`` ranks.

    ``nrings``: how many communicator rings the ops cycle over (Paddle's ``GradAllReduce``
    default is 2; fleet uses ``strategy.nccl_comm_num``, 1). ``fuse``: bucketed all-reduce
    (see the module docstring), ``fuse_grad_size_in_num`` / ``fuse_grad_size_in_MB`` its limits.
    """

    def __init__(self, nrings: int = 2, fuse: bool = False, fuse_grad_size_in_num: int = 8,
                 fuse_grad_size_in_MB: float = 32):
        if int(nrings) < 1:
            raise ValueError(f"GradAllReduce: nrings must be >= 1, got {nrings}")
        if int(fuse_grad_size_in_num) < 1:
            raise ValueError(f"GradAllReduce: fuse_grad_size_in_num must be >= 1, got "
                             f"{fuse_grad_size_in_num}")
        if not float(fuse_grad_size_in_MB) > 0:
            raise ValueError(f"GradAllReduce: fuse_grad_size_in_MB must be > 0, got "
                             f"{fuse_grad_size_in_MB}")
        self.nrings, self.fuse = int(nrings), bool(fuse)
        self.fuse_num, self.fuse_bytes = int(fuse_grad_size_in_num), \
            float(fuse_grad_size_in_MB) * (1 << 20)
        self.buckets: list = []  # fused: [(dtype, [grad names], FusedOutput name)]

    def transpile(self, startup_program, main_program, nranks: int) -> None:
        """Rewrite both programs in place (``nranks`` >= 2; with one rank nothing changes)."""
        if int(nranks) < 1:
            raise ValueError(f"GradAllReduce.transpile: nranks must be >= 1, got {nranks}")
        self.nranks = int(nranks)
        if self.nranks == 1:
            return
        if any(op.type in ("all_reduce", "c_allreduce_sum") for op in
               main_program.global_block().ops):
            raise ValueError("GradAllReduce.transpile: the main program already has all-reduce "
                             "ops (transpiled twice?)")
        self._broadcast_params(startup_program.global_block(), main_program.global_block())
        block = main_program.global_block()
        self._scale_loss_grad(block)
        if self.fuse:
            self._fused_allreduce(block)
        else:
            self._allreduce(block)

    # -- startup -------------------------------------------------------------------------------
    def _broadcast_params(self, block, main_block) -> None:
        """The parameters: those of the startup block, else (pdjit's layers declare them as
        parameters in the main program only) the main program's that the startup makes."""
        params = list(block.iter_parameters()) or [
            block.var(p.name) for p in main_block.iter_parameters() if block.has_var(p.name)]
        ring, param = -1, None
        for param in params:
            if _distributed(main_block.var(param.name) if main_block.has_var(param.name)
                            else param):
                continue
            ring = (ring + 1) % self.nrings
            block.append_op("broadcast", inputs={"x": [param]}, outputs={"out": [param]},
                            attrs={"ring_id": ring, "root": 0, "op_role": FORWARD})
        if param is None:
            return
        for ring in range(self.nrings):
            block.append_op("c_sync_comm_stream", inputs={"X": [param]},
                            outputs={"Out": [param]}, attrs={"ring_id": ring,
                                                             "op_role": FORWARD})

    # -- main ----------------------------------------------------------------------------------
    def _scale_loss_grad(self, block) -> None:
        for idx in reversed(range(len(block.ops))):
            op = block.ops[idx]
            if _is_loss_grad(op):
                g = op.output_arg_names[0]
                block._insert_op(idx + 1, "scale", inputs={"X": [g]}, outputs={"Out": [g]},
                                 attrs={"scale": 1.0 / self.nranks, "op_role": BACKWARD})

    def _allreduce(self, block) -> None:
        ring, grad = -1, None
        for idx in reversed(range(len(block.ops))):
            rv = _role_var(block.ops[idx])
            offset = idx
            for i in range(0, len(rv), 2):
                param, grad = block.var(rv[i]), rv[i + 1]
                if _distributed(param):
                    continue
                if offset == idx:
                    offset += 1
                    block._insert_op(offset, "c_sync_calc_stream", inputs={"X": [grad]},
                                     outputs={"Out": [grad]}, attrs={"op_role": BACKWARD})
                    offset += 1
                ring = (ring + 1) % self.nrings
                block._insert_op(offset, "all_reduce", inputs={"x": [grad]},
                                 outputs={"out": [grad]},
                                 attrs={"ring_id": ring, "reduce_type": SUM,
                                        "op_role": BACKWARD})
        if grad is None:
            return
        for idx, op in enumerate(block.ops):
            if _is_optimizer(op):
                for ring in range(self.nrings):
                    block._insert_op(idx + ring, "c_sync_comm_stream", inputs={"X": [grad]},
                                     outputs={"Out": [grad]},
                                     attrs={"ring_id": ring, "op_role": BACKWARD})
                break

    def _written_at(self, block, first_backward: int) -> dict:
        """{name: (index of its first writer, of its last writer)} over the backward ops."""
        at: dict = {}
        for idx in range(first_backward, len(block.ops)):
            op = block.ops[idx]
            if _is_optimizer(op):
                break
            for n in op.output_arg_names:
                if n != registry.EMPTY_VAR_NAME:
                    at[n] = (at[n][0], idx) if n in at else (idx, idx)
        return at

    def _fused_allreduce(self, block) -> None:
        pairs, first_backward = [], -1
        for idx, op in enumerate(block.ops):
            if first_backward < 0 and _is_backward(op):
                first_backward = idx
            rv = _role_var(op)
            for i in range(0, len(rv), 2):
                param = block.var(rv[i])
                if not _distributed(param):
                    pairs.append((param, block.var(rv[i + 1])))
        if not pairs:
            return
        at = self._written_at(block, first_backward)
        by_dtype: dict = {}
        for param, grad in pairs:  # buckets per dtype, limited in count and bytes
            segs = by_dtype.setdefault(np.dtype(grad.dtype).str, [([], [], 0)])
            grads, params, nbytes = segs[-1]
            size = int(np.prod([max(int(d), 1) for d in grad.shape])) * \
                np.dtype(grad.dtype).itemsize
            if len(grads) == self.fuse_num or (grads and nbytes + size > self.fuse_bytes):
                segs.append(([], [], 0))
                grads, params, nbytes = segs[-1]
            grads.append(grad)
            params.append(param)
            segs[-1] = (grads, params, nbytes + size)
        segments = [(g, p) for segs in by_dtype.values() for g, p, _ in segs]
        segments.sort(key=lambda s: max(at[g.name][1] for g in s[0]))
        fused = []
        for grads, _ in segments:
            fused.append(block.create_var(
                name=unique_name.generate(f"FusedOutput_{grads[0].name}"), dtype=grads[0].dtype,
                shape=[-1], persistable=False, stop_gradient=True).name)
        for i in reversed(range(len(segments))):
            after = max(at[g.name][1] for g in segments[i][0])
            block._insert_op(after + 1, "all_reduce", inputs={"x": [fused[i]]},
                             outputs={"out": [fused[i]]},
                             attrs={"ring_id": 0, "reduce_type": SUM, "op_role": BACKWARD})
            block._insert_op(after + 1, "c_sync_calc_stream", inputs={"X": [fused[i]]},
                             outputs={"Out": [fused[i]]}, attrs={"op_role": BACKWARD})
        for i in reversed(range(len(segments))):
            grads, params = segments[i]
            block._insert_op(first_backward, "coalesce_tensor", inputs={"Input": params},
                             outputs={"Output": grads, "FusedOutput": [fused[i]]},
                             attrs={"copy_data": False, "use_align": True,
                                    "dtype": dtypes.to_code(grads[0].dtype),
                                    "op_role": BACKWARD})
        for idx, op in enumerate(block.ops):
            if _is_optimizer(op):
                block._insert_op(idx, "c_sync_comm_stream", inputs={"X": fused},
                                 outputs={"Out": fused},
                                 attrs={"ring_id": 0, "op_role": BACKWARD})
                break
        self.buckets = [(np.dtype(g[0].dtype), [v.name for v in g], f)
                        for (g, _), f in zip(segments, fused)]
