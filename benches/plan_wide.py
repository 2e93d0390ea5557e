#!/usr/bin/env python3
"""Planning time against width and depth (issue 62): N parallel branches of one ReLU each
summed (an ONNX file of ~30 B a branch), PipeDream `graph.txt` chains of N layers, and a
recurrent `Loop` of N iterations (unrolled at binding), planned for 8 GPUs (the loop for
2: for 8 its unrolled graph's wide frontier makes the search dominate, as for branches). Each row prints the time and its ratio to the previous size: a ratio
near the size ratio is linear, its square quadratic.

Measured on the 2-core development machine (release build): 1,000 branches 5.7 s, 2,000
19.5 s (before, about 3 and over 10 minutes: the layered search looked frontier layers up
by a linear search); a 100,000-layer graph.txt 17 s (before, 134 s: the reader's
topological sort and the lowering scanned every edge per layer); a Loop of 4,096
iterations 15.7 s (before, 176 s: each iteration was its own round of inference over the
whole graph; rounds now double what they unroll).

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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind, sizes, make, suffix, extra in [
            ("branches", args.branches, branches, ".onnx", ["--gpus", "8"]),
            ("graph.txt layers", args.layers, pipedream_chain, ".txt",
             ["--gpus", "8", "--batch", "32"]),
            ("loop iterations", args.steps, loop_steps, ".onnx", ["--gpus", "2"]),
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
