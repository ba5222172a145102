"""Fluid 1.x's datasets (``fluid.DatasetFactory``) and ``Executor.train_from_dataset`` /
``infer_from_dataset``.

A DeepFM-style CTR program written as Fluid 1.x's models write it (sparse int64 slots through
shared embeddings, a dense float slot, first- and second-order FM terms plus a deep part,
sigmoid cross entropy) is fed from MultiSlot text files written here, through InMemoryDataset
(``cat`` as the pipe command, shuffled) and QueueDataset; the loss printed every
``print_period`` batches falls. The batches themselves are checked against the lines written
(LoD offsets of the sparse slots, dense shapes), and bad lines get errors naming the file and
the line.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import pdjit as fluid
from pdjit.dataset import DatasetError
from pdjit.runtime.executor import FetchHandler
from pdjit.testing.op_test import assert_native

SPARSE = ["C1", "C2", "C3"]
DICT, DENSE = 20, 4


def write_files(tmp_path, n_files=3, lines=48, seed=0, bad=None):
    """MultiSlot files: per line C1..C3 (1-3 ids each), dense_input (4 floats), label (1 int).
    The label is 1 when C1's first id is even or the dense values sum above 0."""
    rng = np.random.default_rng(seed)
    files, rows = [], []
    for f in range(n_files):
        text = []
        for _line in range(lines):
            ids = [rng.integers(0, DICT, rng.integers(1, 4)) for _ in SPARSE]
            dense = rng.normal(size=DENSE).round(4)
            label = int(ids[0][0] % 2 == 0 or dense.sum() > 0.5)
            parts = [f"{len(x)} " + " ".join(str(v) for v in x) for x in ids]
            parts += [f"{DENSE} " + " ".join(repr(float(v)) for v in dense), f"1 {label}"]
            text.append(" ".join(parts))
            rows.append((ids, dense, label))
        if bad is not None and f == bad[0]:
            text[bad[1] - 1] = bad[2]
        path = tmp_path / f"part-{f}.txt"
        path.write_text("\n".join(text) + "\n")
        files.append(str(path))
    return files, rows


def deepfm():
    """The program, its data variables (in slot order) and the loss."""
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 11
    with fluid.program_guard(main, startup):
        sparse_input_ids = [fluid.layers.data(name=n, shape=[1], lod_level=1, dtype="int64")
                            for n in SPARSE]
        dense_input = fluid.layers.data(name="dense_input", shape=[DENSE], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        # first order: a weight per feature, summed per slot
        first = [fluid.layers.sequence_pool(
            fluid.layers.embedding(input=ids, size=[DICT, 1], is_sparse=True,
                                   param_attr=fluid.ParamAttr(name="w1")), "sum")
            for ids in sparse_input_ids]
        y_first = fluid.layers.reduce_sum(fluid.layers.concat(first, axis=1), dim=1,
                                          keep_dim=True)
        # second order: 0.5 * ((sum v)^2 - sum v^2) over the slots' pooled factors
        embs = [fluid.layers.sequence_pool(
            fluid.layers.embedding(input=ids, size=[DICT, 4], is_sparse=True,
                                   param_attr=fluid.ParamAttr(name="SparseFeatFactors")), "sum")
            for ids in sparse_input_ids]
        summed = fluid.layers.sums(embs) if hasattr(fluid.layers, "sums") else \
            fluid.layers.elementwise_add(fluid.layers.elementwise_add(embs[0], embs[1]), embs[2])
        sq_sum = fluid.layers.square(summed)
        sum_sq = fluid.layers.elementwise_add(
            fluid.layers.elementwise_add(fluid.layers.square(embs[0]),
                                         fluid.layers.square(embs[1])),
            fluid.layers.square(embs[2]))
        y_second = fluid.layers.scale(fluid.layers.reduce_sum(
            fluid.layers.elementwise_sub(sq_sum, sum_sq), dim=1, keep_dim=True), scale=0.5)
        # deep part
        deep = fluid.layers.concat(embs + [dense_input], axis=1)
        deep = fluid.layers.fc(input=deep, size=16, act="relu")
        y_deep = fluid.layers.fc(input=deep, size=1)
        logit = fluid.layers.elementwise_add(fluid.layers.elementwise_add(y_first, y_second),
                                             y_deep)
        label_float = fluid.layers.cast(label, dtype="float32")
        loss = fluid.layers.reduce_mean(
            fluid.layers.sigmoid_cross_entropy_with_logits(x=logit, label=label_float))
        fluid.optimizer.Adam(learning_rate=0.02).minimize(loss)
    return main, startup, sparse_input_ids + [dense_input, label], loss


@pytest.fixture(scope="module")
def model():
    return deepfm()


PRINTED = re.compile(r"^time: \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\], batch: \[(\d+)\], "
                     r"loss\[1\]:\[([-+.\deE]+)\]$")


def printed_losses(out: str) -> list:
    found = [PRINTED.match(line) for line in out.splitlines()]
    return [(int(m.group(1)), float(m.group(2))) for m in found if m]


def test_in_memory_dataset_trains(tmp_path, model, capsys):
    main, startup, slots, loss = model
    files, rows = write_files(tmp_path)
    dataset = fluid.DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_use_var(slots)
    dataset.set_pipe_command("cat")
    dataset.set_batch_size(16)
    dataset.set_thread(2)
    dataset.set_filelist(files)
    dataset.load_into_memory()
    assert dataset.get_memory_data_size() == len(rows) == 144
    dataset.local_shuffle()
    dataset.global_shuffle()
    assert dataset.get_memory_data_size() == 144
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    capsys.readouterr()
    for _ in range(6):
        exe.train_from_dataset(program=main, dataset=dataset, scope=scope, fetch_list=[loss],
                               fetch_info=["loss"], print_period=3)
    assert_native(exe)
    losses = printed_losses(capsys.readouterr().out)
    assert [b for b, _ in losses] == [3, 6, 9] * 6  # 9 batches (144 / 16) per pass
    first, last = np.mean([v for _, v in losses[:3]]), np.mean([v for _, v in losses[-3:]])
    assert last < 0.7 * first, losses
    # inference reads the parameters and changes none
    before = {p.name: np.array(scope.find_var(p.name).get_tensor())
              for p in main.all_parameters()}
    exe.infer_from_dataset(program=main, dataset=dataset, scope=scope, fetch_list=[loss],
                           fetch_info=["loss"], print_period=9)
    infer = printed_losses(capsys.readouterr().out)
    assert [b for b, _ in infer] == [9]
    for name, value in before.items():
        np.testing.assert_array_equal(np.array(scope.find_var(name).get_tensor()), value,
                                      err_msg=name)
    dataset.release_memory()
    with pytest.raises(DatasetError, match="load_into_memory"):
        exe.train_from_dataset(program=main, dataset=dataset, scope=scope)


def test_queue_dataset_trains(tmp_path, model, capsys):
    main, startup, slots, loss = model
    files, _ = write_files(tmp_path, seed=1)
    dataset = fluid.DatasetFactory().create_dataset("QueueDataset")
    dataset.set_use_var(slots)
    dataset.set_batch_size(12)
    dataset.set_thread(3)
    dataset.set_filelist(files)
    with pytest.raises(DatasetError, match="does not support local_shuffle"):
        dataset.local_shuffle()
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    capsys.readouterr()
    for _ in range(5):
        exe.train_from_dataset(main, dataset, scope, thread=2, fetch_list=[loss.name],
                               print_period=4)
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("time: ")]
    assert len(lines) == 15 and all(f"{loss.name}[1]:[" in ln for ln in lines)  # 12 batches
    values = [float(ln.rsplit(":[", 1)[1][:-1]) for ln in lines]
    assert np.mean(values[-3:]) < 0.7 * np.mean(values[:3]), values

    # a CompiledProgram runs as the program it wraps
    exe.train_from_dataset(fluid.CompiledProgram(main), dataset, scope)
    # a FetchHandler sees its variables' values as the runs go; debug reports the pass
    seen = []

    class Handler(FetchHandler):
        def handler(self, res_dict):
            seen.append({k: np.array(v) for k, v in res_dict.items()})

    exe.train_from_dataset(main, dataset, scope, fetch_list=[loss], print_period=100,
                           debug=True, fetch_handler=Handler({"loss": loss, "w": "w1"},
                                                             period_secs=0))
    assert len(seen) == 13  # after each of the 12 batches, and after the last one
    assert seen[-1]["w"].shape == (DICT, 1) and seen[-1]["loss"].size == 1
    assert re.search(r"^train_from_dataset: 12 batches in [\d.]+ s", capsys.readouterr().out,
                     re.M)


def test_batches_hold_the_lines(tmp_path, model):
    """The feed of a batch against the lines written: sparse slots as LoD tensors of the ids
    ([total, 1], one sequence per instance), the dense slot [batch, 4], the label [batch, 1];
    the pipe command runs once per file (``head -n 2`` keeps two lines of each)."""
    _, _, slots, _ = model
    files, rows = write_files(tmp_path, n_files=2, lines=5)
    dataset = fluid.DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_use_var(slots)
    dataset.set_batch_size(3)
    dataset.set_filelist(files)
    dataset.set_pipe_command("head -n 2")
    dataset.load_into_memory()
    assert dataset.get_memory_data_size() == 4
    kept = rows[0:2] + rows[5:7]
    feeds = list(dataset._feeds())
    assert len(feeds) == 2  # 3 + 1
    for feed, part in zip(feeds, (kept[:3], kept[3:])):
        for k, name in enumerate(SPARSE):
            t = feed[name]
            seqs = [r[0][k] for r in part]
            assert t.lod() == [list(np.cumsum([0] + [len(s) for s in seqs]))]
            np.testing.assert_array_equal(np.asarray(t).reshape(-1), np.concatenate(seqs))
            assert np.asarray(t).dtype == np.int64 and np.asarray(t).shape[1] == 1
        np.testing.assert_allclose(feed["dense_input"], np.stack([r[1] for r in part]),
                                   rtol=1e-6)
        assert feed["dense_input"].dtype == np.float32
        np.testing.assert_array_equal(feed["label"], [[r[2]] for r in part])


@pytest.mark.parametrize("bad,match", [
    ("1 7", r"slot 'C2' \(2 of 5\) is missing"),
    ("1 3 1 4 1 5 4 0.1 0.2 0.3 0.4 1 x", r"slot 'label' \(5 of 5\): value 'x' is not an "
                                           r"integer"),
    ("1 3 1 4 1 5 3 0.1 0.2 0.3 1 1", r"slot 'dense_input' \(4 of 5\) is dense of shape "
                                      r"\[-1, 4\]: expected 4 values per instance, got 3"),
    ("0 1 4 1 5 4 0.1 0.2 0.3 0.4 1 1", r"slot 'C1' \(1 of 5\): expected a count of values "
                                        r">= 1, got '0'"),
    ("1 3 1 4 1 5 4 0.1 0.2 0.3 0.4 1 1 7", r"1 tokens after the last slot 'label'"),
    ("1 3 1 4 9 5", r"slot 'C3' \(3 of 5\) declares 9 values, the line holds 1"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, model, bad, match):
    _, _, slots, _ = model
    files, _ = write_files(tmp_path, n_files=2, lines=6, bad=(1, 4, bad))
    where = re.escape(f"file {files[1]!r}, line 4: ")
    dataset = fluid.DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_use_var(slots)
    dataset.set_filelist(files)
    with pytest.raises(DatasetError, match=where + match):
        dataset.load_into_memory()


def test_queue_dataset_bad_line_and_failing_command(tmp_path, model):
    main, startup, slots, _ = model
    files, _ = write_files(tmp_path, n_files=2, lines=4, bad=(0, 2, "1 2 3"))
    dataset = fluid.DatasetFactory().create_dataset()
    assert isinstance(dataset, fluid.QueueDataset)
    dataset.set_use_var(slots)
    dataset.set_filelist(files)
    exe = fluid.Executor(fluid.CPUPlace())
    with pytest.raises(DatasetError, match=re.escape(f"file {files[0]!r}, line 2: ")):
        exe.train_from_dataset(main, dataset, fluid.Scope())
    dataset.set_pipe_command("exit 3")
    with pytest.raises(DatasetError, match=r"the pipe command 'exit 3' failed on file .* "
                                           r"\(exit status 3\)"):
        exe.train_from_dataset(main, dataset, fluid.Scope())
    dataset.set_filelist([str(tmp_path / "missing.txt")])
    with pytest.raises(DatasetError, match="cannot open file .*missing.txt"):
        exe.train_from_dataset(main, dataset, fluid.Scope())


def test_settings_are_checked():
    factory = fluid.DatasetFactory()
    with pytest.raises(DatasetError, match="'FooDataset' does not exist"):
        factory.create_dataset("FooDataset")
    ds = factory.create_dataset("InMemoryDataset")
    with pytest.raises(DatasetError, match="set_batch_size: expected an int >= 1, got 0"):
        ds.set_batch_size(0)
    prog = fluid.Program()
    with fluid.program_guard(prog, fluid.Program()):
        x = fluid.layers.data(name="x", shape=[1], dtype="int32")
    with pytest.raises(DatasetError, match="variable 'x' has dtype int32"):
        ds.set_use_var([x])
    with pytest.raises(DatasetError, match="call set_use_var first"):
        ds.load_into_memory()
