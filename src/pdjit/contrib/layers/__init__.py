"""``fluid.contrib.layers``: Fluid 1.x's contributed layers that pdjit has.

Each is also where Fluid 1.x scripts reach it through ``fluid.contrib.layers``; layers Fluid
1.8 lists here that are not in this module do not exist in pdjit yet.
"""
from pdjit.layers.rnn_cells import basic_gru, basic_lstm

__all__ = ["basic_lstm", "basic_gru"]
