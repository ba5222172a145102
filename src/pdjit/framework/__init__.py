"""The compile-time program model: Program/Block/Variable/Operator, dtypes, the op registry."""
from pdjit.framework import dtypes, registry, unique_name
from pdjit.framework.errors import (
                                    FeedError,
                                    OpError,
                                    OpRunError,
                                    OpShapeError,
                                    PdjitError,
                                    ProgramError,
                                    ShapeMismatch,
                                    UnregisteredOpError,
)
from pdjit.framework.program import (
                                    Block,
                                    Operator,
                                    Parameter,
                                    Program,
                                    Variable,
                                    default_main_program,
                                    default_startup_program,
                                    program_guard,
                                    switch_main_program,
                                    switch_startup_program,
)

__all__ = [
    "Block", "Operator", "Parameter", "Program", "Variable", "default_main_program",
    "default_startup_program", "program_guard", "switch_main_program", "switch_startup_program",
    "dtypes", "registry", "unique_name", "FeedError", "OpError", "OpRunError", "OpShapeError",
    "PdjitError", "ProgramError", "ShapeMismatch", "UnregisteredOpError", "in_dygraph_mode",
]


def in_dygraph_mode() -> bool:
    """Fluid's ``framework.in_dygraph_mode``: pdjit builds static programs only."""
    return False
