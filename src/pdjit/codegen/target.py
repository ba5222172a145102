"""Targets: who renders kernel descriptions and compiles them, chosen by the plan's Place.

A target is a module under ``pdjit.codegen`` that provides ``NAME``, ``render(kernel,
parallel)`` (a :class:`~pdjit.codegen.kernel.LoopKernel` as source), ``call_site(...)`` (the
driver lines that allocate and call), ``HostDriver`` (a segment's driver, runnable) and
``PARALLEL_MIN_SIZE``; optionally ``module_text(source, fn_name, header)`` (the module its
kernels are compiled in; the CPU's is ``compiler.module_text``), ``PARALLEL_VARIANTS`` and
``PRECOMPILE`` (False: no ``prange`` variants, no compiling ahead of the first call),
``INPLACE_FORMS``, ``BLOCK_FORMS`` and ``NativeDriver`` (what the target supports of the
CPU's memory plan, blocked epilogues and native drivers). Targets: ``cpu``
(``pdjit.codegen.cpu.target``) and ``cuda`` (``pdjit.codegen.cuda.target``, registered when
first asked for: it imports ``numba.cuda``). Opaque lowerings name the targets their lines are
written for
(``Opaque.targets``); an op with no lowering for the plan's target runs its reference, and the
plan report says so. The target's name is part of every kernel's text, hence of its cache key.
"""
from __future__ import annotations

from types import ModuleType

_TARGETS: dict = {}


def register_target(module: ModuleType) -> None:
    _TARGETS[module.NAME] = module


def get_target(name: str) -> ModuleType:
    if not _TARGETS:
        from pdjit.codegen.cpu import target as cpu
        register_target(cpu)
    if name == "cuda" and name not in _TARGETS:  # imports numba.cuda: only when asked for
        from pdjit.codegen.cuda import target as cuda
        register_target(cuda)
    target = _TARGETS.get(name)
    if target is None:
        raise NotImplementedError(f"no code generation target {name!r} (targets: "
                                  f"{sorted(_TARGETS)})")
    return target


def target_name(place) -> str:
    """The target that runs plans for ``place`` (``None``: the CPU)."""
    return "cpu" if place is None else place.kind
