"""``feed`` and ``fetch``: move values between the run's feed/fetch lists and variables."""
from __future__ import annotations

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import FEED_FETCH, SIDE_EFFECT, Column, Int, register_op


def _feed_ref(X, *, col):
    if not 0 <= col < len(X):
        raise ShapeMismatch(f"feed column {col} is out of range: {len(X)} values were fed")
    return {"Out": X[col]}


def _fetch_ref(X, *, col, ctx):
    out_name = ctx.op.output("Out")[0]
    fetched = list(ctx.env.get(out_name) or [])
    fetched += [None] * (col + 1 - len(fetched))
    fetched[col] = X
    return {"Out": fetched}


register_op(
    "feed", inputs=["X"], outputs=["Out"], attrs={"col": Int(0, low=0, high=8)},
    traits=[FEED_FETCH], infer_shape=lambda X, **_: {}, reference=_feed_ref, emit=None, grad=None,
    column=Column(holder="X", value="Out", fetch=False),
    doc="Out = the col-th value of the feed list X (a FEED_MINIBATCH variable).")

register_op(
    "fetch", inputs=["X"], outputs=["Out"], attrs={"col": Int(0, low=0, high=8)},
    traits=[FEED_FETCH, SIDE_EFFECT], infer_shape=lambda X, **_: {}, reference=_fetch_ref,
    column=Column(holder="Out", value="X", fetch=True),
    emit=None, grad=None,
    doc="Writes X into column col of the fetch list Out (a FETCH_LIST variable).")
