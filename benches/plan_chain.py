#!/usr/bin/env python3
"""Planning time and peak memory against graph size (issue 22): chains of 1 k, 10 k and
100 k ReLUs, planned for 2 GPUs. Memory must grow linearly: before the fused units were
bounded (passes/src/rewrite/rules.rs, MAX_UNIT_OPS), 1 k nodes took 3.0 GB and 9.7 s.

Usage (from the repository root, after `cargo build --release`; needs `pip install onnx`):
    python3 benches/plan_chain.py [--ralpc target/release/ralpc] [--sizes 1000,10000,100000]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import onnx
from onnx import TensorProto, helper


def chain(n, path):
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"x{i + 1}"], name=f"relu{i}") for i in range(n)]
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info(f"x{n}", TensorProto.FLOAT, ["N", 64])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ralpc", default="target/release/ralpc")
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    print(f"{'nodes':>8} {'seconds':>8} {'peak MiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in map(int, args.sizes.split(",")):
            model = os.path.join(tmp, f"chain{n}.onnx")
            chain(n, model)
            start = time.perf_counter()
            # A child of its own, so that its peak is the only one this rusage sees.
            done = subprocess.run(
                [sys.executable, "-c",
                 "import resource, subprocess, sys; "
                 "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r)",
                 args.ralpc, model, "--gpus", "2", "--quiet", "-o", os.path.join(tmp, f"p{n}")],
                capture_output=True, text=True)
            seconds = time.perf_counter() - start
            if done.returncode != 0:
                print(f"{n:>8} failed: {done.stderr.strip()}")
                continue
            print(f"{n:>8} {seconds:>8.2f} {int(done.stdout) / 1024:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
