"""pdjit's test kit: OpTest-style checks of op definitions and programs.

- ``check_output`` runs an op through every executor mode and compares with an independent
  expected result (and the op's ``infer_shape`` with what ran); ``run_op`` runs one op;
- ``check_grad`` compares the backward pass's gradients with finite differences;
- ``assert_programs_equivalent`` compares a whole program compiled vs interpreted (and
  ``assert_native`` checks that the compiled side really ran native code);
- ``check_program_grad`` compares a whole program's gradients (control flow included) with
  finite differences;
- ``strategies``: Hypothesis strategies for shapes, attributes, arrays and random programs.
"""
from pdjit.testing import strategies
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import (
                                   TARGETS,
                                   assert_close,
                                   assert_native,
                                   build_op_program,
                                   check_output,
                                   run_op,
                                   tolerance,
)
from pdjit.testing.program_grad import check_program_grad
from pdjit.testing.programs import assert_programs_equivalent

__all__ = ["TARGETS", "assert_close", "assert_native", "assert_programs_equivalent",
           "build_op_program", "check_grad", "check_output", "check_program_grad", "run_op",
           "strategies", "tolerance"]
