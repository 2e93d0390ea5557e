#!/usr/bin/env python3
"""The CUDA backend's validation on one NVIDIA GPU (issue #7), printed as a table and
written as JSON:

* numerics: a one-rank plan of the CNN fixture, one training step on CUDA and on the CPU
  backend (relative loss difference; goal 1e-3, TF32 off);
* multi-rank: a 4-rank data-parallel plan on the one GPU (ranks as threads, and as
  processes under `ralpc launch`) against one rank;
* speed: a training step of ResNet-50 and VGG16 at batch 64 against PyTorch training the
  same torchvision model (fp32, TF32 off, SGD with momentum; ratio of median step times;
  goal <= 1.25);
* fidelity: after `ralpc profile --device cuda:0`, the planner's predicted iteration time
  against the measured step (goal within 10%).

Usage (on the GPU machine; build ralpc first, `cargo build --release`):
    python3 benches/gpu_validation.py --ralpc target/release/ralpc [--out results.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ralpc(binary, *args):
    """Runs ralpc; returns its stdout, raising with its stderr on failure."""
    done = subprocess.run([binary, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ralpc {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def plan(binary, model, gpus, batch, out, *extra):
    ralpc(binary, model, "--gpus", str(gpus), "--batch", str(batch), "--cluster", "dgx-h100",
          "--quiet", "-o", out, *extra)


def losses(binary, command, plan_dir, *extra):
    out = ralpc(binary, command, plan_dir, "--json", *extra)
    return json.loads(out)


def step_seconds(binary, plan_dir, steps=12):
    """Seconds per training step on CUDA: the median of the steps after the first, each
    timed by ralpc from one loss to the next (start-up, kernel compilation, uploads and
    the first step's cuDNN algorithm choice left out)."""
    run = losses(binary, "run", plan_dir, "--backend", "cuda", "--steps", str(steps))
    return statistics.median(run["step_seconds"][1:])


def pytorch_step_seconds(name, batch, steps=10):
    import torch
    import torchvision

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = getattr(torchvision.models, name)(weights=None).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    times = []
    for i in range(steps + 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ralpc", default=os.path.join(ROOT, "target/release/ralpc"))
    parser.add_argument("--out", default=None)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--profiles", default=None,
                        help="keep the measured profiles (NAME.profile.json) in this folder")
    args = parser.parse_args()
    binary = args.ralpc
    results = {"doctor": json.loads(subprocess.run(
        [binary, "doctor", "--json", "--compile-kernels"], capture_output=True, text=True).stdout
        or "{}")}
    cnn = os.path.join(ROOT, "fixtures/train/cnn.onnx")
    with tempfile.TemporaryDirectory() as tmp:
        one, four = os.path.join(tmp, "cnn1"), os.path.join(tmp, "cnn4")
        plan(binary, cnn, 1, 8, one)
        plan(binary, cnn, 4, 8, four, "--strategy", "dp", "--tolerance", "inf")
        gpu = losses(binary, "run", one, "--backend", "cuda", "--steps", "1")["losses"][0]
        cpu = losses(binary, "run", one, "--backend", "cpu", "--steps", "1")["losses"][0]
        results["numerics"] = {"cuda": gpu, "cpu": cpu, "relative": abs(gpu - cpu) / abs(cpu)}
        ref = losses(binary, "run", one, "--backend", "cuda", "--steps", "3")["losses"]
        threads = losses(binary, "run", four, "--backend", "cuda", "--steps", "3")["losses"]
        procs = losses(binary, "launch", four, "--backend", "cuda", "--steps", "3")["losses"]
        results["multi_rank"] = {"one_rank": ref, "threads": threads, "processes": procs}
        if not args.skip_speed:
            for name in ["resnet50", "vgg16"]:
                model = os.path.join(ROOT, f"fixtures/onnx/{name}/model.onnx")
                plan_dir = os.path.join(tmp, name)
                plan(binary, model, 1, args.batch, plan_dir)
                ours = step_seconds(binary, plan_dir)
                theirs = pytorch_step_seconds(name, args.batch)
                profile = os.path.join(args.profiles or tmp, f"{name}.profile.json")
                ralpc(binary, "profile", model, "--device", "cuda:0", "--batch-sizes",
                      str(args.batch), "--repeats", "5", "-o", profile)
                predicted = json.loads(ralpc(
                    binary, model, "--gpus", "1", "--batch", str(args.batch), "--cluster",
                    "dgx-h100", "--profile", profile, "--json", "-o",
                    os.path.join(tmp, f"{name}-profiled")))["iteration_time_us"] / 1e6
                print(f"{name}: ralpc {ours:.4f} s, PyTorch {theirs:.4f} s, "
                      f"predicted {predicted:.4f} s", flush=True)
                results[name] = {
                    "ralpc_step_s": ours,
                    "pytorch_step_s": theirs,
                    "ratio": ours / theirs,
                    "predicted_step_s": predicted,
                    "prediction_error": (predicted - ours) / ours,
                }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
