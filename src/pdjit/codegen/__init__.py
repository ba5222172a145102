"""Code generation: turning fused op groups into Numba kernels."""
