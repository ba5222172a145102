"""Readers that feed a program from Python generators (``py_reader``, non-iterable
``DataLoader``): the executor takes a started reader's next batch when a run is not fed.

(Being written: see issue 22.)
"""
from __future__ import annotations


def pending_feed(program, feed: dict) -> dict:
    """``feed`` with the next batch of each started reader attached to ``program`` added."""
    return feed
