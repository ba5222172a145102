"""Recurrent ops: ``rnn`` (Paddle 2.x/3.x's LSTM/GRU/simple RNN op), Fluid 1.x's LoD ``lstm`` and
``gru``, and ``sequence_conv``, with their gradients."""
