"""pdjit's test kit: OpTest-style checks of op definitions and programs.

``check_output`` runs an op through every executor mode and compares with an independent
expected result; ``run_op`` runs one op; ``assert_close`` compares with per-dtype tolerances.
"""
from pdjit.testing.op_test import (
                                   TARGETS,
                                   assert_close,
                                   build_op_program,
                                   check_output,
                                   run_op,
                                   tolerance,
)

__all__ = ["TARGETS", "assert_close", "build_op_program", "check_output", "run_op", "tolerance"]
