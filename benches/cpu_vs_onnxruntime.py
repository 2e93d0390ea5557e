#!/usr/bin/env python3
"""ralpc's CPU forward pass against onnxruntime's, same model, weights, inputs, batch and
thread count; prints each median and the ratio (goal: ralpc within 1.5x of onnxruntime).

    python3 benches/cpu_vs_onnxruntime.py [--repeats 5] [--threads N]

Needs onnx==1.22.0, onnxruntime==1.31.1 and numpy. Weights and inputs are seeded exactly
as fixtures/numerics/gen.py seeds them (the same rule as ralpc's CPU backend); onnxruntime
runs with its default graph optimizations (what users run) and intra-op threads = N.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("gen", os.path.join(ROOT, "fixtures", "numerics", "gen.py"))
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

CASES = [
    # (name, model, batch, input override or None)
    ("resnet50 b8", "fixtures/onnx/resnet50/model.onnx", 8, None),
    # The issue asks for VGG16 at 112x112; this export fixes its input at 1x3x224x224 and
    # its classifier at 7x7x512 features, so it runs at 224x224, batch 2 (the same FLOPs
    # as batch 8 at 112x112). ralpc re-batches the fixed-batch export; onnxruntime gets its
    # input's batch dimension set to the same batch (see `ort_ms`).
    ("vgg16 b2 224x224", "fixtures/onnx/vgg16/model.onnx", 2, None),
    ("vit_b_16 b2 (12 transformer blocks)", "fixtures/onnx/vit_b_16/model.onnx", 2, None),
]


def ralpc_ms(model, batch, shape, repeats, threads):
    exe = os.path.join(ROOT, "target", "release", "examples", "forward_time")
    args = [exe, os.path.join(ROOT, model), str(batch)]
    if shape:
        args.append("input=" + ",".join(map(str, shape)))
    args.append(str(repeats))
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run(args, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return json.loads(out.stdout)["median_ms"]


def ort_ms(model, batch, shape, repeats, threads):
    gen.BATCH = batch
    m = gen.seeded_model(os.path.join(ROOT, model))
    if shape:
        dims = m.graph.input[0].type.tensor_type.shape.dim
        for d, v in zip(dims, shape):
            d.ClearField("dim_param")
            d.dim_value = v
    if not shape:
        # A fixed-batch export runs at `batch` in both (ralpc re-batches it), not at the
        # export's batch in onnxruntime: the same work on both sides.
        for value in m.graph.input:
            dims = value.type.tensor_type.shape.dim
            if dims and dims[0].dim_value not in (0, batch):
                dims[0].dim_value = batch
    feeds = gen.inputs_of(m)
    if any(f.shape[:1] != (batch,) for f in feeds.values()):
        raise RuntimeError(f"onnxruntime's inputs are not at batch {batch}: {[f.shape for f in feeds.values()]}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "forward_time"], cwd=ROOT, check=True)
    print(f"{'case':<38} {'ralpc ms':>10} {'ort ms':>10} {'ratio':>7}   ({args.threads} threads, median of {args.repeats})")
    for name, model, batch, shape in CASES:
        try:
            r = ralpc_ms(model, batch, shape, args.repeats, args.threads)
            o = ort_ms(model, batch, shape, args.repeats, args.threads)
            print(f"{name:<38} {r:>10.1f} {o:>10.1f} {r / o:>6.2f}x", flush=True)
        except Exception as e:  # report and go on
            print(f"{name:<38} failed: {e}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
