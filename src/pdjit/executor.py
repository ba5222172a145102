"""``fluid.executor``: the module Fluid 1.x scripts import ``Executor`` from."""
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope, global_scope, scope_guard

__all__ = ["Executor", "Scope", "global_scope", "scope_guard"]
