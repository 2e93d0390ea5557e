#!/usr/bin/env python3
"""ZB-H1 against 1F1B on the same pipeline (issue 59): a chain of equal GEMMs cut into P
equal stages, each priced and simulated under both schedules. A GEMM's forward, input
gradient and weight gradient are one product each, so T_F = T_B = T_W: the setting of
Qi et al. (ICLR 2024) §2.1, where ZB-H1's bubble is a third of 1F1B's,
(P − 1)(T_F + T_B − T_W) against (P − 1)(T_F + T_B + T_W). The bubble printed is the
iteration less M microbatches of the slowest stage and its gradient step; `paper` is
(T_F + T_B − T_W)/(T_F + T_B + T_W) of that stage's priced passes, the ratio without
transfers between stages. The peak memory is the fullest GPU's from the plan's
instruction order: a weight pass keeps its GEMM's input and output gradient until it
runs, so stages after the first hold more than under 1F1B (for this chain of bare GEMMs,
whose backward keeps nothing else, the most).

Usage (from the repository root, after `cargo build --release`; needs `pip install onnx`):
    python3 benches/zero_bubble.py [--ralpc target/release/ralpc]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LAYERS, WIDTH, ROWS = 16, 4096, 2048


def gemm_chain(path):
    nodes, weights = [], []
    for i in range(LAYERS):
        w = numpy_helper.from_array(np.zeros((WIDTH, WIDTH), np.float32), f"w{i}")
        weights.append(w)
        nodes.append(helper.make_node("Gemm", [f"x{i}", f"w{i}"], [f"x{i + 1}"], name=f"fc{i}"))
    graph = helper.make_graph(
        nodes, "gemms",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info(f"x{LAYERS}", TensorProto.FLOAT, ["N", WIDTH])],
        initializer=weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def strategy(path, stages, schedule, microbatches):
    per = LAYERS // stages
    plan = {
        "format": "ralpc-strategy/1",
        "schedule": schedule,
        "microbatches": microbatches,
        "stages": [{"first_layer": f"fc{k * per}", "last_layer": f"fc{k * per + per - 1}",
                    "replicas": 1} for k in range(stages)],
    }
    with open(path, "w") as f:
        json.dump(plan, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ralpc", default="target/release/ralpc")
    args = parser.parse_args()
    print(f"{LAYERS} GEMMs of {WIDTH}x{WIDTH}, {ROWS} rows a microbatch, bf16 on dgx-h100; "
          "bubble: the iteration less M microbatches of the slowest stage and its sync")
    print(f"{'P':>2} {'M':>3} {'schedule':>8} {'iteration ms':>12} {'simulated ms':>12} "
          f"{'bubble ms':>9} {'bubble/1f1b':>11} {'paper':>6} {'peak GiB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "gemms.onnx")
        gemm_chain(model)
        for stages in (4, 8):
            for m in (8, 16, 32):
                bubble_1f1b = None
                for schedule in ("1f1b", "zb-h1"):
                    s = os.path.join(tmp, f"{schedule}-{stages}-{m}.json")
                    strategy(s, stages, schedule, m)
                    done = subprocess.run(
                        [args.ralpc, "plan", model, "--gpus", str(stages), "--cluster", "dgx-h100",
                         "--batch", str(ROWS * m), "--precision", "bf16", "--strategy-file", s,
                         "--json"], capture_output=True, text=True)
                    if done.returncode != 0:
                        print(f"{stages:>2} {m:>3} {schedule:>8} failed: {done.stderr.strip()}")
                        continue
                    d = json.loads(done.stdout)
                    t = d["iteration_time_us"]
                    slowest = max(d["stages"], key=lambda st: st["microbatch_us"])
                    bubble = t - m * slowest["microbatch_us"] - slowest["sync_us"]
                    # The paper's ratio for this stage's passes (Qi et al. §2.1).
                    own = [l for l in d["layers"] if l["stage"] == d["stages"].index(slowest)]
                    w = sum(l["weight_us"] for l in own)
                    f = sum(l["forward_us"] for l in own)
                    b = sum(l["backward_us"] for l in own) - w
                    paper = f"{(f + b - w) / (f + b + w):.3f}"
                    ratio = "" if bubble_1f1b is None else f"{bubble / bubble_1f1b:.3f}"
                    if bubble_1f1b is None:
                        bubble_1f1b, paper = bubble, ""
                    peak = max(d["simulated"]["peak_memory_bytes"]) / 2**30
                    print(f"{stages:>2} {m:>3} {schedule:>8} {t / 1e3:>12.3f} "
                          f"{d['simulated']['iteration_time_us'] / 1e3:>12.3f} "
                          f"{bubble / 1e3:>9.3f} {ratio:>11} {paper:>6} {peak:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
