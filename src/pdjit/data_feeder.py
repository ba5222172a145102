"""``DataFeeder``: a minibatch of samples (lists of fields) -> the feed dict of a run.

(Being written: see issue 22.)
"""
from __future__ import annotations

__all__: list = []
