#!/usr/bin/env python3
"""The CUDA backend's validation on one NVIDIA GPU (issue #7), printed as a table and
written as JSON:

* numerics: a one-rank plan of the CNN fixture, one training step on CUDA and on the CPU
  backend (relative loss difference; goal 1e-3, TF32 off);
* multi-rank: a 4-rank data-parallel plan on the one GPU (ranks as threads, and as
  processes under `ralpc launch`) against one rank;
* families: every plan family through the plan interpreter with its ranks as threads on
  the one GPU, meeting at the same-device hub — burst, SOAP, rows (halo exchanges), 1F1B
  and GPipe on the CNN fixture's 4 ranks, and GPT-2 in tensor 2 × pipeline 2 × data 2 with
  ZeRO-1 on 8 — against the same plan on the CPU backend (relative loss difference; goal
  1e-3);
* NCCL (on a machine with 8 GPUs; reported as not run on fewer): GPT-2 in tensor 2 ×
  pipeline 2 × data 2 with ZeRO-1 as 8 processes under `ralpc launch`, one GPU each, every
  collective and message through NCCL, against the CPU backend;
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


def cnn_strategies():
    """The CNN fixture's plans on 4 ranks, one per family (as the host-kernel tests'
    `cnn_plans`), as `ralpc-strategy/1` files by name."""
    def split(layer, s, a, p):
        return {"name": layer, "split": {"sample": s, "attribute": a, "parameter": p}}
    one = [{"first_layer": "conv0", "last_layer": "fc1", "replicas": 4}]
    two = [{"first_layer": "conv0", "last_layer": "pool0", "replicas": 2},
           {"first_layer": "conv1", "last_layer": "fc1", "replicas": 2}]
    def strategy(stages, layers, schedule="1f1b", microbatches=1):
        return {"format": "ralpc-strategy/1", "schedule": schedule,
                "microbatches": microbatches, "stages": stages, "layers": layers}
    return {
        "burst": strategy(one, [split("conv1", 2, 1, 1), split("pool1", 2, 1, 1),
                                split("fc0", 1, 1, 1), split("fc1", 1, 1, 1)]),
        "soap": strategy(one, [split("conv1", 2, 1, 2), split("pool1", 2, 1, 2),
                               split("fc0", 1, 1, 4), split("fc1", 1, 4, 1)]),
        "rows": strategy(one, [split("conv0", 1, 2, 1), split("pool0", 1, 4, 1),
                               split("conv1", 1, 2, 2), split("pool1", 2, 1, 1)]),
        "1f1b": strategy(two, [], "1f1b", 2),
        "gpipe": strategy(two, [], "gpipe", 2),
    }


def families(binary, tmp, steps=3):
    """Every family's losses on CUDA (ranks as threads on the one GPU) and on the CPU."""
    cnn = os.path.join(ROOT, "fixtures/train/cnn.onnx")
    plans = []
    for name, strategy in cnn_strategies().items():
        path = os.path.join(tmp, f"{name}.strategy.json")
        with open(path, "w") as f:
            json.dump(strategy, f)
        plan_dir = os.path.join(tmp, f"family-{name}")
        plan(binary, cnn, 4, 8, plan_dir, "--strategy-file", path)
        plans.append((name, plan_dir))
    gpt = os.path.join(ROOT, "fixtures/onnx/gpt2/model.onnx")
    plan_dir = os.path.join(tmp, "family-gpt2-3d")
    plan(binary, gpt, 8, 8, plan_dir, "--strategy", "3d", "--tensor-parallel", "2",
         "--pipeline-parallel", "2", "--micro-batch-size", "2", "--zero", "1")
    plans.append(("gpt2 t2 p2 d2 zero-1", plan_dir))
    out = {}
    for name, plan_dir in plans:
        gpu = losses(binary, "run", plan_dir, "--backend", "cuda", "--steps", str(steps))
        cpu = losses(binary, "run", plan_dir, "--backend", "cpu", "--steps", str(steps))
        worst = max(abs(g - c) / abs(c) for g, c in zip(gpu["losses"], cpu["losses"]))
        print(f"{name}: CUDA {gpu['losses']}, CPU {cpu['losses']}, worst relative {worst:.2e}",
              flush=True)
        out[name] = {"cuda": gpu["losses"], "cpu": cpu["losses"], "relative": worst}
    return out


def gpu_count():
    """The GPUs nvidia-smi lists (0 without it)."""
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    except OSError:
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def nccl(binary, tmp, steps=3):
    """GPT-2 t2 p2 d2 across 8 GPUs through NCCL against the CPU backend."""
    gpus = gpu_count()
    if gpus < 8:
        return {"not_run": f"needs 8 GPUs (one per rank; NCCL refuses ranks sharing one), has {gpus}"}
    gpt = os.path.join(ROOT, "fixtures/onnx/gpt2/model.onnx")
    plan_dir = os.path.join(tmp, "nccl-gpt2-3d")
    plan(binary, gpt, 8, 8, plan_dir, "--strategy", "3d", "--tensor-parallel", "2",
         "--pipeline-parallel", "2", "--micro-batch-size", "2", "--zero", "1")
    gpu = losses(binary, "launch", plan_dir, "--backend", "cuda", "--steps", str(steps))
    cpu = losses(binary, "run", plan_dir, "--backend", "cpu", "--steps", str(steps))
    worst = max(abs(g - c) / abs(c) for g, c in zip(gpu["losses"], cpu["losses"]))
    print(f"NCCL gpt2 t2 p2 d2: CUDA {gpu['losses']}, CPU {cpu['losses']}, "
          f"worst relative {worst:.2e}", flush=True)
    return {"cuda": gpu["losses"], "cpu": cpu["losses"], "relative": worst}


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
        results["families"] = families(binary, tmp)
        results["nccl"] = nccl(binary, tmp)
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
