"""A benchmark peer in a process of its own (run as a script by ``pdjit.tools.bench``).

It imports neither pdjit nor anything the other peers import: PaddlePaddle's import is heavy
and sets process-wide state (it needs ``FLAGS_enable_pir_api=0`` before it is imported), and a
peer that crashes takes only this process with it.

Protocol: pickled requests on stdin, pickled replies on the original stdout (fd 1 is pointed
at stderr, so that whatever a peer prints cannot corrupt the replies). Requests:

- ``{"cmd": "load", "peer": "onnxruntime" | "paddle", "threads": n, "feed_names": [...],
  "fetch_names": [...], "onnx_file" | "model_file", "params_file"}`` -> ``{"info": str}``
- ``{"cmd": "set", "inputs": {name: array}}``: the inputs of the next runs
- ``{"cmd": "first"}`` -> ``{"seconds": s, "outputs": [arrays in fetch order]}``
- ``{"cmd": "time", "n": k}`` -> ``{"times": [seconds of each of k runs]}``

Every reply is a dict with ``ok``; a failure is ``{"ok": False, "error": "Type: message"}``.
"""
import os  # (loaded at interpreter start: never a file of this directory)
import sys

# run as a script, this file's directory comes first on sys.path: its modules must not stand in
# for the standard library's or a peer's
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import pickle  # noqa: E402
import time  # noqa: E402


class OnnxRuntimePeer:
    def __init__(self, req):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(req["threads"])
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(req["onnx_file"], so,
                                         providers=["CPUExecutionProvider"])
        inputs = [i.name for i in self.sess.get_inputs()]
        outputs = [o.name for o in self.sess.get_outputs()]
        feeds, fetches = list(req["feed_names"]), list(req["fetch_names"])
        # the model's names when the graph kept them, else by position
        self.in_names = feeds if set(feeds) == set(inputs) else inputs
        self.out_names = fetches if set(fetches) <= set(outputs) else outputs
        self.feed_order = feeds
        self.info = f"onnxruntime {ort.__version__}, intra-op threads {so.intra_op_num_threads}"
        self.feeds = None

    def set(self, inputs):
        self.feeds = {n: inputs[f] for n, f in zip(self.in_names, self.feed_order)}

    def run(self):
        return self.sess.run(self.out_names, self.feeds)


class PaddlePeer:
    def __init__(self, req):
        os.environ["FLAGS_enable_pir_api"] = "0"
        import paddle
        import paddle.inference as pi
        if req.get("model_dir"):  # a Fluid 1.x directory: __model__ + one file per variable
            config = pi.Config(req["model_file"])
        else:
            config = pi.Config(req["model_file"], req.get("params_file") or "")
        config.disable_gpu()
        config.switch_ir_optim(True)
        config.set_cpu_math_library_num_threads(int(req["threads"]))
        if hasattr(config, "disable_glog_info"):
            config.disable_glog_info()
        self.pred = pi.create_predictor(config)
        self.in_names = self.pred.get_input_names()
        self.out_names = list(req["fetch_names"])
        if set(self.out_names) != set(self.pred.get_output_names()):
            self.out_names = self.pred.get_output_names()
        self.inputs = {n: self.pred.get_input_handle(n) for n in self.in_names}
        self.outputs = [self.pred.get_output_handle(n) for n in self.out_names]
        onednn = config.mkldnn_enabled() if hasattr(config, "mkldnn_enabled") else "?"
        self.info = (f"paddle.inference {paddle.__version__}, ir optim on, oneDNN {onednn}, "
                     f"threads {req['threads']}")
        self.feeds = None

    def set(self, inputs):
        missing = [n for n in self.in_names if n not in inputs]
        if missing:
            raise KeyError(f"the paddle predictor wants inputs {missing} that the model's "
                           f"feed ops do not name")
        self.feeds = {n: inputs[n] for n in self.in_names}

    def run(self):
        for n, h in self.inputs.items():
            a = self.feeds[n]
            h.reshape(a.shape)
            h.copy_from_cpu(a)
        self.pred.run()
        return [h.copy_to_cpu() for h in self.outputs]


PEERS = {"onnxruntime": OnnxRuntimePeer, "paddle": PaddlePeer}


def handle(state, req):
    cmd = req["cmd"]
    if cmd == "load":
        t0 = time.perf_counter()
        state["peer"] = PEERS[req["peer"]](req)
        return {"info": state["peer"].info, "seconds": time.perf_counter() - t0}
    peer = state["peer"]
    if cmd == "set":
        peer.set(req["inputs"])
        return {}
    if cmd == "first":
        t0 = time.perf_counter()
        outs = peer.run()
        return {"seconds": time.perf_counter() - t0, "outputs": [_array(o) for o in outs]}
    if cmd == "time":
        times = []
        clock = time.perf_counter
        for _ in range(int(req["n"])):
            t0 = clock()
            peer.run()
            times.append(clock() - t0)
        return {"times": times}
    raise ValueError(f"unknown request {cmd!r}")


def _array(x):
    import numpy as np
    return np.asarray(x)


def main():
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    state = {}
    while True:
        try:
            req = pickle.load(requests)
        except EOFError:
            return
        try:
            reply = handle(state, req)
            reply["ok"] = True
        except BaseException as e:  # a peer's failure is reported, never fatal to the bench
            msg = str(e).strip().splitlines()
            reply = {"ok": False, "error": f"{type(e).__name__}: {msg[-1] if msg else ''}"}
        pickle.dump(reply, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()


if __name__ == "__main__":
    main()
