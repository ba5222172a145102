"""Fluid 1.x's beam search: ``beam_search`` and ``beam_search_decode`` over LoD tensors, and
``gather_tree`` for the dense ``BeamSearchDecoder``. Slots and attributes are Fluid 1.8's.

- ``beam_search`` (pre_ids, pre_scores, ids?, scores -> selected_ids, selected_scores,
  parent_idx; ``level``, ``beam_size``, ``end_id``, ``is_accumulated``): the rows of ``scores``
  are the live prefixes, grouped by source sentence by LoD level ``level`` (taken to row
  offsets). For each source, the ``beam_size`` best candidates over all its prefixes: a prefix
  whose last id (``pre_ids``) is ``end_id`` offers only ``(end_id, pre_score)``; another offers
  each column ``d`` of its row, id ``ids[row, d]`` (``d`` without ``ids``), score
  ``scores[row, d]`` (``pre_score + log(scores[row, d])`` unless ``is_accumulated``). Ties
  prefer the later row. A source whose every selected candidate is ``end_id`` after an
  ``end_id`` prefix is finished and selects nothing. The selected candidates go out prefix by
  prefix, best first within a prefix, as ``[n, 1]`` tensors with the LoD ``[row offsets of
  the sources, offsets of each prefix's selected candidates]``; ``parent_idx`` (int32) is each
  one's prefix row.
- ``beam_search_decode`` (Ids, Scores: tensor arrays of the steps' selected ids and scores ->
  SentenceIds, SentenceScores; ``beam_size``, ``end_id``): each source's hypotheses traced
  back from the last step through the steps' LoDs (an ``end_id`` repeated after a hypothesis
  ended is kept once), ordered best first by their final score; the result has two LoD levels
  (sources -> hypotheses -> ids), ids and scores 1-D.
- ``gather_tree`` (Ids, Parents -> Out; all ``[time, batch, beam]``): each final beam's ids
  traced back through the parent beams of every step.
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import OPAQUE, SEQUENCE, Bool, Int, VarMeta, register_op

_TINY = 1e-45


def _abs_offsets(lod, level: int) -> list:
    """LoD level ``level`` as row offsets (the levels below applied)."""
    offs = list(lod[level])
    for below in lod[level + 1:]:
        offs = [below[o] for o in offs]
    return offs


def _less(a, b) -> bool:
    """Whether candidate ``a`` = (score, row, id) ranks below ``b`` (equal scores: the earlier
    row ranks below)."""
    return a[0] < b[0] or (a[0] == b[0] and a[1] < b[1])


def _insert(top: list, item, beam_size: int) -> None:
    """Keep ``top`` the best ``beam_size`` items, best first. An item equal to the last kept
    one (same score and row) takes its place when the beam is full, as Fluid's does."""
    if len(top) < beam_size:
        top.append(None)
    elif _less(item, top[-1]):
        return
    k = len(top) - 2
    while k >= 0 and _less(top[k], item):
        top[k + 1] = top[k]
        k -= 1
    top[k + 1] = item


def _beam_search_ref(pre_ids, pre_scores, scores, *, level, beam_size, end_id, is_accumulated,
                     ctx, ids=None):
    lod = ctx.input_lod("scores")
    if not lod:
        raise ShapeMismatch("beam_search: scores must be a LoD tensor (its LoD groups the "
                            "prefixes by source sentence), got one without LoD")
    if not 0 <= level < len(lod):
        raise ShapeMismatch(f"beam_search: level {level} is out of range for scores' LoD of "
                            f"{len(lod)} level(s)")
    if beam_size < 1:
        raise ValueError(f"beam_search: beam_size must be >= 1, got {beam_size}")
    sc = np.asarray(scores)
    rows = sc.shape[0]
    width = int(np.prod(sc.shape[1:])) if sc.ndim > 1 else 1
    sc2 = sc.reshape(rows, width)
    pid = np.asarray(pre_ids).reshape(-1)
    psc = np.asarray(pre_scores).reshape(-1)
    if pid.size != rows or psc.size != rows:
        raise ShapeMismatch(f"beam_search: pre_ids and pre_scores need one value per row of "
                            f"scores ({rows}), got {pid.size} and {psc.size}")
    id2 = None
    if ids is not None:
        id2 = np.asarray(ids).reshape(rows, -1)
        if id2.shape[1] != width:
            raise ShapeMismatch(f"beam_search: ids must be shaped as scores, got "
                                f"{list(np.shape(ids))} and {list(sc.shape)}")
    high = _abs_offsets(lod, level)
    if high[-1] != rows:
        raise ShapeMismatch(f"beam_search: the LoD of scores spans {high[-1]} rows, scores has "
                            f"{rows}")
    chosen: list = [[] for _ in range(rows)]
    for s in range(len(high) - 1):
        top: list = []
        for row in range(high[s], high[s + 1]):
            if int(pid[row]) == end_id:
                _insert(top, (float(psc[row]), row, end_id), beam_size)
                continue
            for d in range(width):
                v = float(sc2[row, d])
                score = v if is_accumulated else float(psc[row]) + math.log(max(v, _TINY))
                _insert(top, (score, row, int(id2[row, d]) if id2 is not None else d),
                        beam_size)
        for item in top:
            chosen[item[1]].append(item)
        # a source whose every selected candidate is end_id after an ended prefix is
        # finished (prefixes that selected nothing do not count)
        if all(int(pid[r]) == end_id and it[2] == end_id
               for r in range(high[s], high[s + 1]) for it in chosen[r]):
            for r in range(high[s], high[s + 1]):
                chosen[r] = []
    low = [0]
    sel_ids, sel_scores, parents = [], [], []
    for row in range(rows):
        for score, r, i in chosen[row]:
            sel_ids.append(i)
            sel_scores.append(score)
            parents.append(r)
        low.append(len(sel_ids))
    out_lod = [list(high), low]
    ctx.set_output_lod("selected_ids", out_lod)
    ctx.set_output_lod("selected_scores", out_lod)
    return {"selected_ids": np.array(sel_ids, np.int64).reshape(-1, 1),
            "selected_scores": np.array(sel_scores, sc.dtype).reshape(-1, 1),
            "parent_idx": np.array(parents, np.int32)}


def _beam_search_infer(pre_ids, pre_scores, scores, ids=None, **_):
    return {"selected_ids": VarMeta((-1, 1), np.int64, lod_level=2),
            "selected_scores": scores.with_(shape=(-1, 1), lod_level=2),
            "parent_idx": VarMeta((-1,), np.int32)}


register_op(
    "beam_search", inputs=["pre_ids", "pre_scores", "ids?", "scores"],
    outputs=["selected_ids", "selected_scores", "parent_idx?"],
    attrs={"level": Int(0), "beam_size": Int(1), "end_id": Int(0),
           "is_accumulated": Bool(True)},
    traits=[OPAQUE, SEQUENCE], infer_shape=_beam_search_infer, reference=_beam_search_ref,
    emit=None, grad=None,
    doc="One step of beam search: per source sentence the beam_size best (prefix, id) "
        "candidates; LoD [sources -> prefixes, prefixes -> selected].")


def _lod_of(v) -> list:
    lod = getattr(v, "lod", None)
    return lod() if callable(lod) else []


def _decode_ref(Ids, Scores, *, beam_size, end_id, ctx):
    if not isinstance(Ids, list) or not isinstance(Scores, list):
        raise TypeError("beam_search_decode: Ids and Scores must be tensor arrays")
    if not Ids:
        raise ValueError("beam_search_decode: the tensor array Ids is empty (no step ran)")
    if len(Ids) != len(Scores):
        raise ShapeMismatch(f"beam_search_decode: Ids has {len(Ids)} steps, Scores "
                            f"{len(Scores)}")
    lods = [_lod_of(v) for v in Ids]
    for t, lod in enumerate(lods):
        if len(lod) != 2:
            raise ShapeMismatch(f"beam_search_decode: step {t} of Ids must have 2 LoD levels "
                                f"(as beam_search writes), got {len(lod)}")
    ids = [np.asarray(v).reshape(-1) for v in Ids]
    scs = [np.asarray(v).reshape(-1) for v in Scores]
    n_src = len(lods[0][0]) - 1
    hyps = [[] for _ in range(n_src)]       # per source: [ids, scores] of each hypothesis
    where = [[] for _ in range(n_src)]      # per source: the candidate row each one is at
    for t in range(len(Ids) - 1, -1, -1):
        src_lod, cand_lod = lods[t]
        for s in range(n_src):
            start, end = src_lod[s], src_lod[s + 1]
            if not where[s]:   # ended (or pruned) at this step or after: start from here
                for p in range(start, end):
                    for c in range(cand_lod[p], cand_lod[p + 1]):
                        where[s].append(p)   # (its prefix: a candidate of the step before)
                        hyps[s].append(([int(ids[t][c])], [scs[t][c]]))
                continue
            for h, c in enumerate(where[s]):
                word, score = int(ids[t][c]), scs[t][c]
                h_ids, h_scores = hyps[s][h]
                if word != end_id or not h_ids:
                    h_ids.append(word)
                    h_scores.append(score)
                # the prefix this candidate extends: a candidate row of the step before
                p = start
                while not cand_lod[p] <= c < cand_lod[p + 1]:
                    p += 1
                where[s][h] = p
    src_offsets, hyp_offsets, out_ids, out_scores = [0], [0], [], []
    dtype = scs[0].dtype
    for s in range(n_src):
        found = hyps[s] + [([], [])] * max(beam_size - len(hyps[s]), 0)
        order = sorted(range(len(found)), key=lambda h: -found[h][1][0] if found[h][1]
                       else math.inf)   # best final score first (kept in order on ties)
        for h in order:
            h_ids, h_scores = found[h]
            out_ids.extend(reversed(h_ids))
            out_scores.extend(reversed(h_scores))
            hyp_offsets.append(hyp_offsets[-1] + len(h_ids))
        src_offsets.append(src_offsets[-1] + len(found))
    lod = [src_offsets, hyp_offsets]
    ctx.set_output_lod("SentenceIds", lod)
    ctx.set_output_lod("SentenceScores", lod)
    return {"SentenceIds": np.array(out_ids, np.int64),
            "SentenceScores": np.array(out_scores, dtype)}


register_op(
    "beam_search_decode", inputs=["Ids", "Scores"], outputs=["SentenceIds", "SentenceScores"],
    attrs={"beam_size": Int(1), "end_id": Int(0)},
    traits=[OPAQUE, SEQUENCE],
    infer_shape=lambda Ids, Scores, **_: {
        "SentenceIds": VarMeta((-1,), np.int64, lod_level=2),
        "SentenceScores": VarMeta((-1,), Scores.dtype, lod_level=2)},
    reference=_decode_ref, emit=None, grad=None,
    doc="The hypotheses of each source traced back through the beam_search steps' LoDs, best "
        "first; LoD [sources -> hypotheses, hypotheses -> ids].")



def _gather_tree_ref(Ids, Parents):
    ids, parents = np.asarray(Ids), np.asarray(Parents)
    if ids.shape != parents.shape or ids.ndim != 3:
        raise ShapeMismatch(f"gather_tree: Ids and Parents must both be [max_time, batch, "
                            f"beam], got {list(ids.shape)} and {list(parents.shape)}")
    steps, batch, beam = ids.shape
    out = np.empty_like(ids)
    if steps == 0:
        return {"Out": out}
    out[-1] = ids[-1]
    at = parents[-1].astype(np.int64)
    rows = np.arange(batch)[:, None]
    for t in range(steps - 2, -1, -1):
        if at.size and (at.min() < 0 or at.max() >= beam):
            raise IndexError(f"gather_tree: a parent index at step {t + 1} is outside "
                             f"[0, {beam})")
        out[t] = ids[t][rows, at]
        at = parents[t][rows, at].astype(np.int64)
    return {"Out": out}


register_op(
    "gather_tree", inputs=["Ids", "Parents"], outputs=["Out"],
    traits=[OPAQUE], infer_shape=lambda Ids, Parents: {"Out": Ids},
    reference=_gather_tree_ref, emit=None, grad=None,
    doc="Out[t, b, k] = the id at step t of the beam that beam k at the last step descends "
        "from, following Parents back from the last step (Ids, Parents: [time, batch, beam]).")
