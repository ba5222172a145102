"""Data-parallel training across processes on MPI (``pdjit.distributed.fleet``).

Not imported by ``import pdjit``: import ``pdjit.distributed`` explicitly.
"""
