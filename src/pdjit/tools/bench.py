"""``pdjit bench``: latency and throughput of a saved model through ``pdjit.inference``, side by
side with the peers that are installed (onnxruntime on the model exported by
``pdjit.io.onnx_export``, and Paddle Inference on the same files).

For each batch size every engine first runs once (pdjit compiles here, or loads its kernels
from the disk cache; the peers' model load is reported beside it), then ``warmup`` untimed runs
(pdjit's go on until it serves the batch size as it will go on serving it: its first runs load
kernels, try its drivers and threads, and make its recorded calls native; how many runs that
took is reported), then ``repeat`` timed runs, interleaved: the timed runs are split into
rounds and each round runs every engine in turn (rotating who goes first), so that a change in
the machine's load hits all of them alike. Each peer runs in a process of its own
(``_peer_worker.py``) that times its own runs; a peer that is missing or fails is reported as
skipped with the reason.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pickle
import select
import subprocess
import sys
import tempfile
import time

import numpy as np

from pdjit.tools import CliError

PEERS = ("onnxruntime", "paddle")
_MODULES = {"onnxruntime": "onnxruntime", "paddle": "paddle"}
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_peer_worker.py")
_LOAD_TIMEOUT_S = 300.0
# a pause before each engine's round: an OpenMP runtime's threads keep spinning for a while
# after a run (200 ms by default), and on a small machine they slowed the next engine's
# single thread (pdjit's LeNet at batch 1: 0.075 ms right after Paddle's round, 0.042 alone)
_SETTLE_S = 0.3
_REWARM = 5  # untimed runs of an engine before each of its timed rounds
#: pdjit's warm-up (``PdjitEngine.settle``): runs in a row served as later ones will be, and
#: the most seconds it goes on. Timed after 3 warm-up runs instead, MobileNetV2 at batch 1 on
#: two threads was timed in its thread trial and while its recordings' calls went native:
#: 7.5 ms median against 4.1 once settled (ONNX Runtime 5.1 in that run: "1.47x")
SETTLED_RUNS, SETTLE_MOST_S = 3, 30.0


# -- a progress bar on stderr ---------------------------------------------------------------------
class Progress:
    """``[#####.....] 12/40  label`` rewritten in place on a terminal; elsewhere one line per
    new label (so that logs stay readable)."""

    def __init__(self, total: int, stream=None, enabled: bool = True, width: int = 28):
        self.total, self.done, self.width = max(int(total), 1), 0, width
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.label, self._last = "", 0.0

    def update(self, n: int = 0, label: str | None = None) -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        new_label = label is not None and label != self.label
        if label is not None:
            self.label = label
        if self.tty:
            now = time.monotonic()
            if new_label or now - self._last > 0.1 or self.done == self.total:
                self._last = now
                filled = self.width * self.done // self.total
                bar = "#" * filled + "." * (self.width - filled)
                self.stream.write(f"\r[{bar}] {self.done}/{self.total}  {self.label:40.40s}")
                self.stream.flush()
        elif new_label:
            self.stream.write(f"[{self.done}/{self.total}] {self.label}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * (self.width + 52) + "\r")
            self.stream.flush()


# -- engines --------------------------------------------------------------------------------------
class EngineFailed(Exception):
    pass


class PdjitEngine:
    name = "pdjit"

    def __init__(self, path: str, threads: int, ir_optim: bool = True):
        from pdjit.tools.run import make_predictor
        t0 = time.perf_counter()
        self.predictor = make_predictor(path, ir_optim, threads)
        self.load_s = time.perf_counter() - t0
        self.info = f"pdjit.inference, ir optim {'on' if ir_optim else 'off'}, threads {threads}"
        self.inputs = None

    def set(self, inputs: dict) -> None:
        self.inputs = [inputs[n] for n in self.predictor.get_input_names()]

    def first(self) -> tuple:
        t0 = time.perf_counter()
        outs = self.predictor.run(self.inputs)
        return time.perf_counter() - t0, [np.asarray(o) for o in outs]

    def settle(self, batch: int, most_s: float = SETTLE_MOST_S) -> tuple:
        """Untimed runs until pdjit serves this batch size as it will go on serving it
        (``Executor.settled``, and :data:`SETTLED_RUNS` runs in a row that none of
        ``threads.marks`` moved in): its first runs load kernels, try its drivers and its
        threads, record its steps and make their calls native. ``(runs, seconds, whether it
        settled)``, at most ``most_s`` seconds."""
        exe = self.predictor._exe
        marks = exe._target.run_threads().marks
        t0, runs, quiet = time.perf_counter(), 0, 0
        while quiet < SETTLED_RUNS:
            if time.perf_counter() - t0 > most_s:
                return runs, time.perf_counter() - t0, False
            before = marks() if exe.settled(batch) else None
            self.predictor.run(self.inputs)
            runs += 1
            quiet = quiet + 1 if before is not None and before == marks() else 0
        return runs, time.perf_counter() - t0, True

    def time(self, n: int) -> list:
        run, inputs, clock = self.predictor.run, self.inputs, time.perf_counter
        times = []
        for _ in range(n):
            t0 = clock()
            run(inputs)
            times.append(clock() - t0)
        return times

    def close(self) -> None:
        pass


class PeerEngine:
    """A peer in its worker process."""

    def __init__(self, name: str, request: dict, threads: int):
        self.name = name
        self.proc = None
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ)
        env.update(FLAGS_enable_pir_api="0", GLOG_minloglevel="2", OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
        try:
            self.proc = subprocess.Popen([sys.executable, _WORKER], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.log, env=env)
        except OSError as e:
            raise EngineFailed(f"cannot start its worker process: {e}") from None
        reply = self.ask(dict(request, cmd="load", peer=name, threads=threads),
                         timeout=_LOAD_TIMEOUT_S)
        self.load_s, self.info = reply["seconds"], reply["info"]

    def ask(self, request: dict, timeout: float | None = None) -> dict:
        try:
            pickle.dump(request, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
            if timeout is not None:
                ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
                if not ready:
                    self.close()
                    raise EngineFailed(f"no answer in {timeout:.0f} s")
            reply = pickle.load(self.proc.stdout)
        except (BrokenPipeError, EOFError, pickle.UnpicklingError, OSError):
            code = self.proc.wait(timeout=10) if self.proc else None
            raise EngineFailed(f"its worker process exited (status {code}){self._log_tail()}") \
                from None
        if not reply.get("ok"):
            raise EngineFailed(reply.get("error", "failed"))
        return reply

    def _log_tail(self) -> str:
        try:
            self.log.seek(0)
            lines = [s for s in self.log.read().decode(errors="replace").splitlines()
                     if s.strip()]
        except OSError:
            return ""
        return f": {lines[-1].strip()[:300]}" if lines else ""

    def set(self, inputs: dict) -> None:
        self.ask({"cmd": "set", "inputs": inputs}, timeout=_LOAD_TIMEOUT_S)

    def first(self) -> tuple:
        r = self.ask({"cmd": "first"}, timeout=_LOAD_TIMEOUT_S)
        return r["seconds"], r["outputs"]

    def time(self, n: int) -> list:
        return self.ask({"cmd": "time", "n": n})["times"]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# -- inputs ---------------------------------------------------------------------------------------
def parse_batches(text: str) -> list:
    try:
        batches = [int(b) for b in str(text).split(",") if b.strip()]
    except ValueError:
        raise CliError(f"--batch {text!r}: expected sizes separated by commas, e.g. 1,64") \
            from None
    if not batches or any(b < 1 for b in batches):
        raise CliError(f"--batch {text!r}: expected sizes >= 1, e.g. 1,64")
    return batches


def parse_shapes(items: list, input_names: list) -> dict:
    out = {}
    for item in items or ():
        name, sep, dims = item.partition("=")
        if not sep:
            raise CliError(f"--shape {item!r}: expected NAME=d0,d1,... (-1: the batch)")
        if name not in input_names:
            raise CliError(f"--shape {item!r}: the model has no input {name!r} "
                           f"(its inputs: {input_names})")
        try:
            out[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise CliError(f"--shape {item!r}: the dims must be integers") from None
    return out


def input_specs(program, feed_names: list, shapes: dict) -> dict:
    """``{name: (declared or --shape dims, dtype)}``; a -1 is the batch, and only the first
    dim may be -1 unless ``--shape`` says otherwise."""
    from pdjit.proto import framework_pb2 as pb
    gb = program.global_block()
    specs = {}
    for n in feed_names:
        v = gb.var(n)
        if v.type == pb.VarType.LOD_TENSOR and v.lod_level:
            raise CliError(f"input {n!r} is a LoD tensor (lod_level {v.lod_level}): bench "
                           f"draws dense inputs only")
        declared = list(v.shape)
        dims = shapes.get(n, declared)
        if n in shapes:
            if len(dims) != len(declared) or any(
                    w >= 0 and d != w for w, d in zip(declared, dims)):
                raise CliError(f"--shape {n}={','.join(map(str, dims))}: does not fit the "
                               f"model's {declared} (-1: any size)")
        elif any(d < 0 for d in dims[1:]):
            raise CliError(f"input {n!r} has shape {declared}: the dims after the first that "
                           f"are -1 need --shape {n}=d0,d1,... (-1 for the batch)")
        if any(d < -1 for d in dims):
            raise CliError(f"input {n!r}: bad dims {dims}")
        specs[n] = (dims, np.dtype(v.dtype) if v.dtype is not None else np.dtype("float32"))
    return specs


def random_inputs(specs: dict, batch: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for n, (dims, dtype) in specs.items():
        shape = tuple(batch if d < 0 else d for d in dims)
        if dtype.kind == "f":
            a = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            a = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "iu":
            a = rng.integers(0, 2, shape).astype(dtype)  # valid as ids, labels and indices
        else:
            raise CliError(f"input {n!r}: bench cannot draw {dtype} values")
        out[n] = np.ascontiguousarray(a)
    return out


# -- peers ----------------------------------------------------------------------------------------
def _export_onnx(model, path: str) -> None:
    try:
        from pdjit.io.onnx_export import to_onnx
    except ImportError as e:
        raise EngineFailed(f"pdjit.io.onnx_export is not available ({e})") from None
    try:
        proto = to_onnx(model.program, model.params, list(model.feed_names),
                        list(model.fetch_names))
    except Exception as e:  # any refusal of the exporter is a reason to skip, not a crash
        msg = str(e).strip().splitlines()
        raise EngineFailed(f"ONNX export failed: {type(e).__name__}: "
                           f"{msg[0] if msg else ''}") from None
    data = proto if isinstance(proto, (bytes, bytearray)) else proto.SerializeToString()
    with open(path, "wb") as f:
        f.write(data)


def _peer_request(name: str, model, tmpdir: str) -> dict:
    req = {"feed_names": list(model.feed_names), "fetch_names": list(model.fetch_names)}
    if name == "onnxruntime":
        onnx_file = os.path.join(tmpdir, "model.onnx")
        _export_onnx(model, onnx_file)
        req["onnx_file"] = onnx_file
    else:
        if model.params_file is None and model.params and \
                os.path.basename(model.model_file) != "__model__":
            raise EngineFailed("Paddle Inference reads per-variable parameter files only from "
                               "a directory with __model__")
        if model.params_file is None and model.params:
            req["model_file"] = os.path.dirname(os.path.abspath(model.model_file))
            req["params_file"] = None
            req["model_dir"] = True
        else:
            req["model_file"] = os.path.abspath(model.model_file)
            req["params_file"] = os.path.abspath(model.params_file) if model.params_file else None
    return req


_PIP = {"onnxruntime": "onnxruntime onnx", "paddle": "paddlepaddle"}


def installed_peers(compare) -> list:
    """The peers named in ``compare`` that are installed, in order, each once; an unknown name
    is a :class:`CliError`; a missing one is a line on stderr (it is not in the report)."""
    peers = list(dict.fromkeys(c.strip() for c in compare if c.strip()))
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise CliError(f"--compare: unknown peer {unknown[0]!r} (known: {', '.join(PEERS)})")
    found = []
    for name in peers:
        if importlib.util.find_spec(_MODULES[name]) is None:
            print(f"pdjit bench: {name} is not installed, not compared (pip install "
                  f"{_PIP[name]}, or the compare extra: pip install -e '.[compare]')",
                  file=sys.stderr)
        else:
            found.append(name)
    return found


def start_peer(name: str, model, threads: int, tmpdir: str):
    """A started peer engine, or the reason it is skipped (a str)."""
    if name not in PEERS:
        return f"unknown peer {name!r} (known: {', '.join(PEERS)})"
    if importlib.util.find_spec(_MODULES[name]) is None:
        return f"{_MODULES[name]} is not installed"
    try:
        return PeerEngine(name, _peer_request(name, model, tmpdir), threads)
    except EngineFailed as e:
        return str(e)


# -- the benchmark --------------------------------------------------------------------------------
def _stats(times: list, batch: int) -> dict:
    t = np.asarray(times, dtype=np.float64)
    p10, med, p90 = np.percentile(t, [10, 50, 90])
    return {"median_ms": med * 1e3, "p10_ms": p10 * 1e3, "p90_ms": p90 * 1e3,
            "samples_per_s": batch / med if med > 0 else float("inf"), "runs": int(t.size)}


def _max_diff(ref: list, got: list):
    if len(ref) != len(got):
        return None
    worst = 0.0
    for a, b in zip(ref, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return None
        if a.size:
            d = np.abs(a.astype(np.float64) - b.astype(np.float64))
            worst = max(worst, float(np.nanmax(d)) if np.isfinite(d).any() else float("nan"))
    return worst


def bench(path: str, batches: list, threads: int | None = None, repeat: int = 30,
          warmup: int = 3, compare: list = (), shapes: list = (), json_path: str | None = None,
          ir_optim: bool = True, progress: bool = True, startup: bool = False,
          out=None) -> int:
    out = out or sys.stdout
    from pdjit.codegen.cpu import threads as pd_threads
    from pdjit.io.inference_model import load_model
    if repeat < 1 or warmup < 0:
        raise CliError(f"--repeat must be >= 1 and --warmup >= 0, got {repeat} and {warmup}")
    if threads is not None and threads < 1:
        raise CliError(f"--threads must be >= 1, got {threads}")
    model = load_model(path)
    specs = input_specs(model.program, model.feed_names,
                        parse_shapes(list(shapes), list(model.feed_names)))
    nthreads = threads if threads is not None else pd_threads.get_num_threads()
    engines, skipped, status = [], {}, {}
    pd = PdjitEngine(path, nthreads, ir_optim)
    engines.append(pd)
    status["pdjit"] = {"status": "ok", "load_s": pd.load_s, "info": pd.info}
    rounds = min(repeat, 5)
    chunks = [repeat // rounds + (1 if r < repeat % rounds else 0) for r in range(rounds)]
    results, first_outputs = [], {}
    peers = installed_peers(compare)
    with tempfile.TemporaryDirectory(prefix="pdjit-bench-") as tmpdir:
        bar = Progress(len(batches) * (1 + len(peers)) * (1 + warmup + repeat),
                       enabled=progress)
        try:
            for name in peers:
                bar.update(0, f"starting {name}")
                got = start_peer(name, model, nthreads, tmpdir)
                if isinstance(got, str):
                    skipped[name] = got
                    status[name] = {"status": "failed", "reason": got}
                else:
                    engines.append(got)
                    status[name] = {"status": "ok", "load_s": got.load_s, "info": got.info}
            per_engine = 1 + warmup + repeat
            bar.total = max(1, len(batches) * len(engines) * per_engine)
            for batch in batches:
                inputs = random_inputs(specs, batch)
                live, times = [], {}
                for e in engines:
                    if e.name in skipped:
                        continue
                    bar.update(0, f"batch {batch}: {e.name} first run")
                    try:
                        e.set(inputs)
                        first_s, outs = e.first()
                        if warmup:
                            e.time(warmup)
                        if isinstance(e, PdjitEngine):
                            bar.update(0, f"batch {batch}: pdjit settles")
                            status["pdjit"].setdefault("settled", {})[batch] = e.settle(batch)
                    except EngineFailed as err:
                        _fail(e, f"batch {batch}: {err}", skipped, status)
                        bar.update(per_engine)
                        continue
                    first_outputs[(e.name, batch)] = (first_s, outs)
                    times[e.name] = []
                    live.append(e)
                    bar.update(1 + warmup)
                for r, k in enumerate(chunks):
                    order = live[r % len(live):] + live[:r % len(live)] if live else []
                    for e in order:
                        if e.name in skipped:
                            continue
                        bar.update(0, f"batch {batch}: timing ({r + 1}/{rounds})")
                        time.sleep(_SETTLE_S)  # the previous engine's idle threads stop spinning
                        try:
                            e.time(_REWARM)  # after the pause: caches and clocks warm again
                            times[e.name] += e.time(k)
                        except EngineFailed as err:
                            _fail(e, f"batch {batch}: {err}", skipped, status)
                            bar.update(repeat - len(times[e.name]))
                            continue
                        bar.update(k)
                ref = first_outputs.get(("pdjit", batch))
                pd_row = None
                for e in live:
                    if e.name in skipped or len(times.get(e.name, ())) < repeat:
                        continue
                    first_s, outs = first_outputs[(e.name, batch)]
                    row = {"batch": batch, "engine": e.name, "first_run_s": first_s,
                           **_stats(times[e.name], batch)}
                    if e.name == "pdjit":
                        pd_row = row
                    elif ref is not None:
                        row["max_abs_diff_vs_pdjit"] = _max_diff(ref[1], outs)
                        if pd_row is not None:
                            row["pdjit_over_peer"] = pd_row["median_ms"] / row["median_ms"]
                    results.append(row)
        finally:
            bar.close()
            for e in engines:
                e.close()
    startup_s = _startup(path, specs, nthreads, ir_optim, tmp_batch=batches[0]) \
        if startup else None
    report = {"model": path, "model_file": model.model_file, "params_file": model.params_file,
              "threads": nthreads, "repeat": repeat, "warmup": warmup, "batches": batches,
              "inputs": {n: {"shape": d, "dtype": str(t)} for n, (d, t) in specs.items()},
              "engines": status, "results": results}
    if startup_s is not None:
        report["startup_s"] = startup_s
    print_report(report, out)
    if json_path:
        try:
            with open(json_path, "w") as f:
                json.dump(report, f, indent=2, default=_json_default)
                f.write("\n")
        except OSError as e:
            raise CliError(f"--json: cannot write {json_path}: {e.strerror}") from None
    return 0


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"cannot write {type(x).__name__} as JSON")


def _fail(engine, reason, skipped, status) -> None:
    skipped[engine.name] = reason
    status[engine.name] = {"status": "failed", "reason": reason,
                           **{k: v for k, v in status.get(engine.name, {}).items()
                              if k in ("load_s", "info")}}
    engine.close()


def _startup(path, specs, nthreads, ir_optim, tmp_batch) -> float | None:
    """Seconds from the start of a new process to the first result of the model (the kernel
    cache is warm: this process compiled the model a moment ago)."""
    code = ("import sys, numpy as np\n"
            "from pdjit.tools.run import make_predictor\n"
            "d = np.load(sys.argv[1])\n"
            "p = make_predictor(sys.argv[2], sys.argv[3] == '1', int(sys.argv[4]))\n"
            "p.run([d[n] for n in p.get_input_names()])\n")
    with tempfile.TemporaryDirectory(prefix="pdjit-startup-") as tmp:
        feeds = os.path.join(tmp, "inputs.npz")
        np.savez(feeds, **random_inputs(specs, tmp_batch))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code, feeds, path, "1" if ir_optim else "0",
                               str(nthreads)], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"# startup measurement failed: {proc.stderr.strip().splitlines()[-1:]}",
              file=sys.stderr)
        return None
    return seconds


def print_report(report: dict, out) -> None:
    ins = ", ".join(f"{n} {d} {t['dtype']}" if isinstance(d, list) else n
                    for n, t in report["inputs"].items() for d in [t["shape"]])
    print(f"model {report['model']}  inputs: {ins}", file=out)
    print(f"threads {report['threads']}, {report['repeat']} timed runs after "
          f"{report['warmup']} warm-up runs per batch and engine (interleaved); first ms: the "
          f"first run of a batch size (pdjit compiles or loads kernels from its cache); "
          f"loaded in: pdjit's predictor, a peer's import and model load", file=out)
    for name, st in report["engines"].items():
        if st["status"] == "ok":
            settled = "".join(
                f"; batch {b}: {'settled' if ok else 'not settled'} after {n} more runs "
                f"({s:.1f} s)" for b, (n, s, ok) in st.get("settled", {}).items())
            print(f"  {name:12s} {st['info']}; loaded in {st['load_s']:.3f} s{settled}",
                  file=out)
        else:
            print(f"  {name:12s} {st['status']}: {st['reason']}", file=out)
    head = (f"{'batch':>5s}  {'engine':12s} {'first ms':>10s} {'median ms':>10s} "
            f"{'p10 ms':>9s} {'p90 ms':>9s} {'samples/s':>11s}  {'pdjit/peer':>10s}  "
            f"{'max|diff|':>9s}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in report["results"]:
        ratio = f"{r['pdjit_over_peer']:.2f}x" if "pdjit_over_peer" in r else ""
        diff = r.get("max_abs_diff_vs_pdjit")
        diff_s = "" if r["engine"] == "pdjit" else ("shape?" if diff is None else f"{diff:.1e}")
        print(f"{r['batch']:5d}  {r['engine']:12s} {r['first_run_s'] * 1e3:10.1f} "
              f"{r['median_ms']:10.3f} {r['p10_ms']:9.3f} {r['p90_ms']:9.3f} "
              f"{r['samples_per_s']:11.1f}  {ratio:>10s}  {diff_s:>9s}", file=out)
    if "startup_s" in report:
        print(f"new process to the first result (warm kernel cache, batch "
              f"{report['batches'][0]}): {report['startup_s']:.2f} s", file=out)
