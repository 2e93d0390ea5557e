#!/usr/bin/env python3
"""A background job in the plan's spare GPU time against static partitions of the GPUs
(issue 64 item 1; DeepPool, MLSys'22, "burst parallelism vs. cluster partition").

For DeepPool's own measured A100 profiles (fixtures/anchors/deeppool: VGG16, WideResNet-101-2,
Inception-v3; MIT, seojinpark/DeepPool @ 7922cac and DeepPoolML/DeepPool @ 7f823f2), the
foreground is planned at global batch 32 on the 8 A100s of a DGX A100 (its NVLink network,
and DeepPool's planner's flat network of 2.66e5 bytes/µs and 240 µs), and the same model at
batch 16 (DeepPool's default background batch) runs on one GPU each in its spare time. The
cluster's samples/s (foreground plus background) is printed against the plan on 1, 2, 4
and half of the GPUs with the background alone on the rest, and the plan alone on 8.

DeepPool's published figures for this input that ralpc has: its planner's VGG16 plan at
batch 32 on 8 GPUs of its network, 12.03 ms data parallel and 10.73 ms burst parallel, and
a measured data-parallel iteration of 13.57 ms (fixtures/anchors/deeppool/SOURCE.md). The
paper's cluster-throughput points are not in any source ralpc's tools can read, so they
are not printed.

Usage (from the repository root, after `cargo build --release`):
    python3 benches/background.py [--ralpc target/release/ralpc]
"""

import argparse
import json
import subprocess
import sys

MODELS = ["vgg", "wrn", "inception"]
NETWORKS = [
    ("dgx-a100", []),
    ("deeppool", ["--link-bandwidth", "266GB/s", "--link-latency", "240us"]),
]


def plan(ralpc, model, network):
    profile = f"fixtures/anchors/deeppool/A100_{model}.prof"
    out = subprocess.run(
        [ralpc, "plan", profile, "--gpus", "8", "--batch", "32", "--json",
         "--background", profile, *network],
        capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{model}: ralpc failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ralpc", default="target/release/ralpc")
    args = parser.parse_args()
    print(f"{'model':<10} {'network':<9} {'split':<14} {'plan/s':>9} {'bg/s':>9} "
          f"{'cluster/s':>10}  vs beside")
    for model in MODELS:
        for name, network in NETWORKS:
            r = plan(args.ralpc, model, network)
            b = r["background"]
            beside = b["cluster_samples_per_second"]
            print(f"{model:<10} {name:<9} {'beside':<14} "
                  f"{b['foreground_samples_per_second']:>9.1f} {b['samples_per_second']:>9.1f} "
                  f"{beside:>10.1f}  1.000  ({r['strategy']}, "
                  f"{b['gpu_equivalents']:.2f} GPUs' worth of background)")
            for p in b["partitions"]:
                split = f"{p['foreground_gpus']} + {p['background_gpus']}"
                print(f"{'':<10} {'':<9} {split:<14} "
                      f"{p['foreground_samples_per_second']:>9.1f} "
                      f"{p['background_samples_per_second']:>9.1f} "
                      f"{p['cluster_samples_per_second']:>10.1f}  "
                      f"{p['cluster_samples_per_second'] / beside:.3f}")
    print("\nDeepPool's published VGG16 figures at batch 32 on 8 GPUs (its planner, its "
          "network): data parallel 12.03 ms, burst parallel 10.73 ms; measured data "
          "parallel 13.57 ms.")


if __name__ == "__main__":
    main()
