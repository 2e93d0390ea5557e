#!/usr/bin/env python3
"""What ralpc plans for one large LSTM layer: data parallelism, or its gates split over the
GPUs (each rank computes its hidden units of every gate; the state is all-reduced every
time step). Prints, per case, the plan `--strategy soap` chooses and data parallelism's
time, and the time of forced gate splits (strategy files).

    cargo build --release && python3 benches/recurrent_plans.py

Needs onnx==1.22.0 and numpy. The models are written into a temporary folder, structure
only (their weights point at a data file that does not exist; ralpc plans without it).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RALPC = os.path.join(ROOT, "target", "release", "ralpc")
F = TensorProto.FLOAT

# (hidden = input size, time steps, global batch, forced (sample, gates) splits)
CASES = [
    (8192, 16, 2, [(1, 8), (2, 4)]),
    (2048, 32, 16, [(1, 8), (4, 2)]),
]


def missing(name, dims):
    t = TensorProto()
    t.name, t.data_type = name, F
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", str(int(np.prod(dims)) * 4))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def lstm(path, hidden, steps):
    inits = [missing("W", [1, 4 * hidden, hidden]), missing("R", [1, 4 * hidden, hidden]),
             missing("B", [1, 8 * hidden]), missing("fc.weight", [10, hidden]),
             numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "yh"], name="lstm",
                              hidden_size=hidden),
             helper.make_node("Squeeze", ["yh", "axis0"], ["h"], name="last"),
             helper.make_node("Gemm", ["h", "fc.weight"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", F, [steps, "batch", hidden])],
                              [helper.make_tensor_value_info("logits", F, ["batch", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def plan(model, batch, *args):
    out = subprocess.run([RALPC, "plan", model, "--gpus", "8", "--batch", str(batch), *args],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr)
    text = out.stdout
    iteration = re.search(r"^iteration: ([0-9.]+) ms", text, re.M).group(1)
    dp = re.search(r"data parallel ([0-9.]+) ms", text).group(1)
    split = re.search(r"^0\S*\s+lstm\b.*?\s(\d+×\d+×\d+)\s", text, re.M)
    return float(iteration), float(dp), split.group(1) if split else "?"


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for hidden, steps, batch, forced in CASES:
            model = os.path.join(tmp, f"lstm{hidden}.onnx")
            lstm(model, hidden, steps)
            print(f"LSTM {hidden}x{hidden}, {steps} steps, batch {batch}, 8 GPUs of a DGX A100")
            t, dp, split = plan(model, batch, "--strategy", "soap", "--tolerance", "10")
            print(f"  soap chooses  {split:>7}  {t:8.3f} ms   (data parallel {dp:.3f} ms)")
            for sample, gates in forced:
                strategy = {
                    "format": "ralpc-strategy/1", "schedule": "1f1b", "microbatches": 1,
                    "stages": [{"first_layer": "lstm", "last_layer": "fc", "replicas": 8}],
                    "layers": [{"name": "lstm", "split": {"sample": sample, "attribute": 1,
                                                          "parameter": gates}}]
                    + [{"name": name, "split": {"sample": min(8, batch), "attribute": 1,
                                                "parameter": 1}} for name in ("last", "fc")],
                }
                path = os.path.join(tmp, "strategy.json")
                with open(path, "w") as f:
                    json.dump(strategy, f)
                t, _, split = plan(model, batch, "--strategy-file", path)
                print(f"  forced        {split:>7}  {t:8.3f} ms")


if __name__ == "__main__":
    main()
