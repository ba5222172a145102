"""The matrix products of :mod:`pdjit.ops.matmul` on the device run their definitions' own
GEMM lines: ``_rt.gemm`` is a tiled shared-memory GEMM, ``_cu.batched_gemm`` a batched one (the
batch on the grid's third axis, broadcast batches by strides of 0, a gradient's sum over the
batches its operand broadcast inside the kernel); a scaled product (``alpha``) takes the
batched kernel, which scales."""
from pdjit.codegen.cuda.lowerings import generic

generic("mul", "mul_grad", "matmul", "matmul_grad", "matmul_v2", "matmul_v2_grad", "bmm",
        "bmm_grad")
