"""Records PaddlePaddle 3.3.1's legacy ``chunk_eval`` outputs for test_chunk_eval.py into
``tests/fixtures/paddle/chunk_eval.npz``: for each scheme, a LoD batch (an empty sequence
included) and a padded batch with SeqLength and an excluded chunk type; the tags are drawn so
that inference and label share some chunks.

Run: ``python tests/api/make_chunk_eval_fixture.py`` (needs paddlepaddle)."""
import os

os.environ["FLAGS_enable_pir_api"] = "0"

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle.base.layer_helper import LayerHelper  # noqa: E402

SCHEMES = {"IOB": 2, "IOE": 2, "IOBES": 4, "plain": 1}
TYPES = 3
LENGTHS = [7, 0, 9, 4]
WIDTH = 9
OUTS = ["Precision", "Recall", "F1-Score", "NumInferChunks", "NumLabelChunks",
        "NumCorrectChunks"]
OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle", "chunk_eval.npz")


def tags(rng, n, scheme):
    """Tags whose chunk type often repeats (so the scheme's letters decide where chunks
    split), with about one O in five."""
    ntt = SCHEMES[scheme]
    kind = rng.integers(0, TYPES + 1, n)
    for k in range(1, n):
        if rng.random() < 0.6:
            kind[k] = kind[k - 1]
    kind[rng.random(n) < 0.2] = TYPES
    t = kind * ntt + rng.integers(0, ntt, n)
    return np.where(kind == TYPES, TYPES * ntt, t).astype(np.int64)


def perturb(rng, t, scheme):
    out = t.copy()
    flip = rng.random(t.size) < 0.25
    out[flip] = rng.integers(0, TYPES * SCHEMES[scheme] + 1, int(flip.sum()))
    return out


def run(scheme, feed, padded, excluded):
    main, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, start):
        shape, lod = ([-1, WIDTH], 0) if padded else ([-1, 1], 1)
        inputs = {"Inference": [paddle.static.data("inf", shape, "int64", lod_level=lod)],
                  "Label": [paddle.static.data("lab", shape, "int64", lod_level=lod)]}
        if padded:
            inputs["SeqLength"] = [paddle.static.data("len", [-1], "int64")]
        helper = LayerHelper("chunk_eval")
        outs = [helper.create_variable_for_type_inference("float32" if k < 3 else "int64")
                for k in range(6)]
        helper.append_op(type="chunk_eval", inputs=inputs,
                         outputs={slot: [v] for slot, v in zip(OUTS, outs)},
                         attrs={"num_chunk_types": TYPES, "chunk_scheme": scheme,
                                "excluded_chunk_types": excluded})
    exe = paddle.static.Executor(paddle.CPUPlace())
    return exe.run(main, feed=feed, fetch_list=outs)


def main():
    paddle.enable_static()
    rng = np.random.default_rng(22)
    place = paddle.CPUPlace()
    record = {}
    for scheme in SCHEMES:
        lab = tags(rng, sum(LENGTHS), scheme)
        inf = perturb(rng, lab, scheme)
        feed = {name: paddle.base.create_lod_tensor(v.reshape(-1, 1), [LENGTHS], place)
                for name, v in (("inf", inf), ("lab", lab))}
        got = run(scheme, feed, False, [])
        record.update({f"{scheme}/lod/inf": inf, f"{scheme}/lod/lab": lab})
        record.update({f"{scheme}/lod/{slot}": v for slot, v in zip(OUTS, got)})
        labp = np.stack([tags(rng, WIDTH, scheme) for _ in LENGTHS])
        infp = np.stack([perturb(rng, row, scheme) for row in labp])
        lens = np.array(LENGTHS, np.int64)
        got = run(scheme, {"inf": infp, "lab": labp, "len": lens}, True, [1])
        record.update({f"{scheme}/pad/inf": infp, f"{scheme}/pad/lab": labp,
                       f"{scheme}/pad/len": lens})
        record.update({f"{scheme}/pad/{slot}": v for slot, v in zip(OUTS, got)})
    np.savez_compressed(OUT, **record)
    print(f"wrote {len(record)} arrays to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
