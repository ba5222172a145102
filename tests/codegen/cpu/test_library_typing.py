"""Library kernels called from compiled code (a native driver, an ``overload`` passing its
arguments on) with constant arguments compile for the constants' types, as the host driver's
calls from Python do, not once per constant value. Oracle: the gate counts of the cells, by
hand (LSTM 4, GRU 3, plain RNN 1)."""
import numba
from numba.core import types

from pdjit.codegen.cpu.lib import rnn


def test_a_constant_argument_compiles_the_kernel_for_its_type_once():
    @numba.njit
    def gates():
        return rnn.rnn_gates(0), rnn.rnn_gates(1), rnn.rnn_gates(mode=2)

    assert gates() == (4, 3, 1)
    assert rnn.rnn_gates(3) == 1  # from Python: the same signature
    sigs = list(rnn.rnn_gates.signatures)
    assert sigs and all(not isinstance(t, types.Literal) for sig in sigs for t in sig), sigs
    assert len(sigs) == 1, sigs
