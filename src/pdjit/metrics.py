"""Fluid's host-side metrics: ``Accuracy``, ``Precision``, ``Recall``, ``Auc``,
``ChunkEvaluator``, ``EditDistance``, ``CompositeMetric``.

(Being written: see issue 22.)
"""
from __future__ import annotations

__all__: list = []
