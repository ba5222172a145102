"""LoD recurrent kernels: the time loops of Fluid 1.x's ``lstm`` and ``gru`` over the sequences of a
LoD batch, and ``sequence_conv``, with their gradients."""
__all__: list = []
