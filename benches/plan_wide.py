#!/usr/bin/env python3
"""Planning time against width and depth (issue 62): N parallel branches of one ReLU each
summed (an ONNX file of ~30 B a branch), PipeDream `graph.txt` chains of N layers, and a
recurrent `Loop` of N iterations (unrolled at binding), planned for 8 GPUs (the loop for
2: for 8 its unrolled graph's wide frontier makes the search dominate, as for branches). Each row prints the time and its ratio to the previous size: a ratio
near the size ratio is linear, its square quadratic.

Measured on the 2-core development machine (release build), 2026-12-06: 500, 1,000, 2,000,
4,000 branches 0.72, 1.40, 3.10, 7.62 s (about 2.2x per doubling; before the layered
search's states became hash-consed trees, 1,000 took 3.8 s and 2,000 11.7 s, and before
that about 3 and over 10 minutes); 10,000 and 100,000-layer graph.txt chains 1.1 and 11.9 s
(100,000 took 134 s before the reader and lowering stopped scanning every edge per layer);
a Loop of 1,024, 2,048, 4,096 iterations 0.61, 1.38, 3.60 s (4,096 took 176 s when each
iteration was its own round of inference, 10.8 s with the flat-vector states); an
Inception-like graph.txt of 250 and 1,007 layers on 1,024 GPUs (`--tolerance inf`) 2.8 and
14.3 s (5.1 and 34.5 s before a consumer rank's producers were found from the pieces it
overlaps; the rest is mostly writing every rank's program: a 1 GB plan.json, issue 60).

Usage (from the repository root, after `cargo build --release`; needs `pip install onnx`):
    python3 benches/plan_wide.py [--ralpc target/release/ralpc] [--branches 250,500,1000]
        [--layers 10000,100000]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

from onnx import TensorProto, helper, load, save


def branches(n, path):
    nodes = [helper.make_node("Relu", ["x"], [f"r{i}"], name=f"relu{i}") for i in range(n)]
    nodes.append(helper.make_node("Sum", [f"r{i}" for i in range(n)], ["y"], name="sum"))
    graph = helper.make_graph(
        nodes, "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, path)


def pipedream_chain(n, path):
    metrics = ("forward_compute_time=0.010, backward_compute_time=0.020, "
               "activation_size=602112.0, parameter_size=0.000")
    lines = ["node1 -- Input0 -- " + metrics.replace("0.010", "0.000").replace("0.020", "0.000")]
    lines += [f"node{i} -- ReLU(inplace) -- {metrics}" for i in range(2, n + 1)]
    lines += [f"\tnode{i} -- node{i + 1}" for i in range(1, n)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def inception_like(n, path):
    """A PipeDream graph.txt of about n layers: a stem, then Inception-like modules (four
    branches of one to three layers, joined by a concatenation), then a classifier."""
    lines, edges = [], []
    def node(desc, fwd, bwd, act, params):
        i = len(lines) + 1
        lines.append(f"node{i} -- {desc} -- forward_compute_time={fwd:.3f}, "
                     f"backward_compute_time={bwd:.3f}, activation_size={act:.1f}, "
                     f"parameter_size={params:.1f}")
        return i
    def edge(a, b):
        edges.append(f"\tnode{a} -- node{b}")
    x = node("Input0", 0.0, 0.0, 25690112.0, 0.0)
    stem = node("Conv2d(3, 192, kernel_size=(3, 3))", 2.1, 4.0, 25690112.0, 20928.0)
    edge(x, stem)
    x = stem
    while len(lines) < n - 2:
        ends = []
        for depth in (1, 2, 3, 2):
            prev = x
            for d in range(depth):
                kind = "MaxPool2d(kernel_size=3)" if depth == 2 and d == 0 and ends else \
                    "Conv2d(192, 64, kernel_size=(3, 3))"
                params = 0.0 if kind.startswith("MaxPool") else 442624.0
                cur = node(kind, 0.4 + 0.1 * d, 0.8 + 0.2 * d, 6422528.0, params)
                edge(prev, cur)
                prev = cur
            ends.append(prev)
        cat = node("Concat(1)", 0.05, 0.05, 25690112.0, 0.0)
        for e in ends:
            edge(e, cat)
        x = cat
    head = node("Linear(in_features=768, out_features=1000)", 0.3, 0.6, 128000.0, 3076000.0)
    edge(x, head)
    with open(path, "w") as f:
        f.write("\n".join(lines + edges) + "\n")


def loop_steps(n, path):
    """fixtures/train/loop.onnx (TensorFlow's recurrent `Loop`) over n time steps."""
    model = load(os.path.join(os.path.dirname(__file__), "..", "fixtures", "train", "loop.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = n
    save(model, path)


def timed(ralpc, model, out, extra):
    start = time.perf_counter()
    done = subprocess.run([ralpc, "plan", model, "--quiet", "--force", "-o", out, *extra],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    return seconds, done.returncode, done.stderr.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ralpc", default="target/release/ralpc")
    parser.add_argument("--branches", default="250,500,1000")
    parser.add_argument("--layers", default="10000,100000")
    parser.add_argument("--steps", default="1024,4096")
    parser.add_argument("--inception", default="250,1007")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind, sizes, make, suffix, extra in [
            ("branches", args.branches, branches, ".onnx", ["--gpus", "8"]),
            ("graph.txt layers", args.layers, pipedream_chain, ".txt",
             ["--gpus", "8", "--batch", "32"]),
            ("loop iterations", args.steps, loop_steps, ".onnx", ["--gpus", "2"]),
            ("inception layers", args.inception, inception_like, ".txt",
             ["--gpus", "1024", "--batch", "4096", "--tolerance", "inf"]),
        ]:
            print(f"{kind:>18} {'seconds':>8} {'× previous':>11}")
            previous = None
            for n in map(int, sizes.split(",")):
                model = os.path.join(tmp, f"{n}{suffix}")
                make(n, model)
                seconds, code, err = timed(args.ralpc, model, os.path.join(tmp, f"o{n}"), extra)
                if code != 0:
                    print(f"{n:>18} failed: {err}")
                    continue
                ratio = f"{seconds / previous:.2f}" if previous else "-"
                print(f"{n:>18} {seconds:>8.2f} {ratio:>11}", flush=True)
                previous = seconds
    return 0


if __name__ == "__main__":
    sys.exit(main())
