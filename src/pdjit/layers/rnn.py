"""Fluid 1.x's recurrent layers: ``dynamic_lstm``, ``dynamic_gru``, ``lstm`` (the ``rnn`` op) and
``sequence_conv``."""
__all__: list = []
