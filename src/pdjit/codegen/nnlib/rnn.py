"""Recurrent kernels: the time loops of the ``rnn``, ``lstm`` and ``gru`` ops and their
gradients."""
__all__: list = []
