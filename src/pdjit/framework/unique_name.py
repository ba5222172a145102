"""Unique variable and layer names, the Fluid way: ``fc_0``, ``fc_0.tmp_0``, ``fc_0.w_0``.

``generate(key)`` returns ``key_N`` with a counter per key. ``guard()`` switches to a fresh
generator (so two programs built under two guards get the same names), and restores the old one.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict


class UniqueNameGenerator:
    def __init__(self, prefix: str = ""):
        self.prefix = prefix
        self.ids: defaultdict[str, int] = defaultdict(int)

    def __call__(self, key: str) -> str:
        n = self.ids[key]
        self.ids[key] += 1
        return f"{self.prefix}{key}_{n}"


_generator = UniqueNameGenerator()


def generate(key: str) -> str:
    return _generator(key)


def switch(new_generator: UniqueNameGenerator | None = None) -> UniqueNameGenerator:
    """Install ``new_generator`` (a fresh one if ``None``); return the previous one."""
    global _generator
    old = _generator
    _generator = new_generator if new_generator is not None else UniqueNameGenerator()
    return old


@contextlib.contextmanager
def guard(new_generator=None):
    """Names generated inside start from fresh counters (a string argument is a prefix)."""
    if isinstance(new_generator, str):
        new_generator = UniqueNameGenerator(new_generator)
    old = switch(new_generator)
    try:
        yield
    finally:
        switch(old)
