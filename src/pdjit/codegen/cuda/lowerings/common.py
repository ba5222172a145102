"""Ops whose definitions' own target-neutral lowerings run on this target as they are."""
from pdjit.codegen.cuda.lowerings import generic

generic("adam", "momentum", "sgd",
        "softmax",
        # convolutions, pooling and matrix products: their definitions hold both targets'
        # lines (being rewritten)
        "bmm", "bmm_grad", "conv2d", "conv2d_grad", "conv2d_transpose",
        "conv2d_transpose_grad", "depthwise_conv2d", "depthwise_conv2d_grad",
        "depthwise_conv2d_transpose", "depthwise_conv2d_transpose_grad", "matmul",
        "matmul_grad", "matmul_v2", "matmul_v2_grad", "mul", "mul_grad", "pool2d",
        "pool2d_grad")
