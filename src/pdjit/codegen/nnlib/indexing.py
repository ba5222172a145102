"""Indexing kernels: gathers, scatters, scans and sorts that op lowerings call."""
__all__: list = []
