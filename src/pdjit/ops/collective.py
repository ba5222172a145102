"""Collective ops for data-parallel training across processes (``pdjit.distributed``)."""
