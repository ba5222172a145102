"""Batched matrix products (``matmul``/``matmul_v2``/``bmm`` of any rank) and their gradients."""
__all__: list = []
