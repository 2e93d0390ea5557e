"""ralpc's plans applied to PyTorch modules, checked against one process.

Each case exports a small model with ``torch.onnx.export``, plans it with ``ralpc.plan``
(the Python package, in-process), applies the plan with ``ralpc.torch.parallelize`` on
4 CPU processes (gloo), trains 3 steps of SGD, and compares every step's loss with the
same model trained in one process (relative difference at most 1e-5). Other cases check
that ``ralpc.plan`` errors and plans PyTorch cannot express are refused with their reason.

    python python/tests/check_torch.py            # every case
    python python/tests/check_torch.py gpt-pp2-tp2

Exits 1 when a case fails. Needs torch, onnx, onnxscript and the ralpc package
(``maturin develop`` in python/).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models  # noqa: E402
import ralpc  # noqa: E402
import ralpc.torch as rt  # noqa: E402

WORLD = 4
STEPS = 3
LR = 0.1
BATCH = 8
TOLERANCE = 1e-5

MODELS = {
    "cnn": (models.Cnn, models.cnn_batch, models.cnn_loss, "images"),
    "gpt": (models.Gpt, models.gpt_batch, models.gpt_loss, "idx"),
    "mlp": (models.Mlp, models.mlp_batch, models.cnn_loss, "x"),
}


def exported(kind: str, folder: str) -> str:
    path = os.path.join(folder, f"{kind}.onnx")
    if not os.path.exists(path):
        make, batch, _, name = MODELS[kind]
        torch.manual_seed(0)
        models.export(make(), batch(0)[0], path, name)
    return path


def reference(kind: str) -> list[float]:
    make, batch, loss_fn, _ = MODELS[kind]
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def worker(rank: int, port: int, kind: str, plan: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        make, batch, loss_fn, _ = MODELS[kind]
        torch.manual_seed(0)
        model = make()
        lay = rt.layout(plan)
        microbatch = BATCH // lay.dp // lay.microbatches
        example = batch(0)[0][:microbatch]
        p = rt.parallelize(model, plan, loss_fn=loss_fn, example_inputs=example)
        opt = torch.optim.SGD(p.parameters(), lr=LR)
        losses = []
        for step in range(STEPS):
            x, y = batch(step)
            losses.append(p.step(x, y))
            opt.step()
            opt.zero_grad()
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"losses": losses, "notes": p.notes}, f)
        # Every rank done communicating before any tears the group down (gloo aborts a
        # process whose peer closes a connection under a pending operation).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A worker killed by a signal, not by an error of ours: gloo has aborted a process while
# tearing its connections down ("terminate called without an active exception") on a
# loaded machine, after training right. Such a run is tried once more; an exception raised
# in a worker, or wrong losses, fail at once.
SIGNALLED = "killed by a signal"


def trained(kind: str, plan: dict, folder: str) -> list[dict]:
    out = os.path.join(folder, "result")
    for attempt in (1, 2):
        try:
            mp.spawn(worker, args=(free_port(), kind, plan, out), nprocs=WORLD, join=True)
            break
        except mp.ProcessExitedException as e:
            if attempt == 2 or e.exit_code >= 0:
                raise
            print(f"note: a worker was {SIGNALLED} ({-e.exit_code}); once more", flush=True)
    results = []
    for rank in range(WORLD):
        with open(f"{out}.{rank}") as f:
            results.append(json.load(f))
        os.remove(f"{out}.{rank}")
    return results


def same(ours: list[float], theirs: list[float]) -> bool:
    return len(ours) == len(theirs) and all(
        abs(a - b) <= TOLERANCE * max(abs(b), 1e-12) for a, b in zip(ours, theirs)
    )


def training_case(kind: str, options: dict, expect: dict, edit=None):
    """Plans `kind` with `options` (optionally re-priced after `edit` changes its
    placement), checks the layout, trains, compares."""

    def run(folder: str) -> str:
        model = exported(kind, folder)
        plan = ralpc.plan(model, batch=BATCH, **options)
        if edit is not None:
            placement = plan["placement"]
            edit(placement)
            path = os.path.join(folder, "edited.strategy.json")
            with open(path, "w") as f:
                json.dump(placement, f)
            plan = ralpc.plan(model, batch=BATCH, gpus=options["gpus"], strategy_file=path)
        lay = rt.layout(plan)
        got = {k: getattr(lay, k) for k in expect}
        assert got == expect, f"layout {got}, expected {expect}"
        results = trained(kind, plan, folder)
        want = reference(kind)
        for rank, r in enumerate(results):
            assert same(r["losses"], want), f"rank {rank}: losses {r['losses']}, one process {want}"
        notes = "; ".join(results[0]["notes"]) or "no differences"
        return f"losses {['%.6f' % l for l in want]} on every rank ({notes})"

    return run


def hybrid(zero: int, groups: int):
    """ZeRO-`zero` over `groups` shard groups of the data-parallel ranks (HSDP)."""

    def edit(placement: dict) -> None:
        placement["zero"] = zero
        placement["shard_groups"] = groups

    return edit


def with_zero(zero: int):
    def edit(placement: dict) -> None:
        placement["zero"] = zero

    return edit


def burst(placement: dict) -> None:
    """Gives the classifier one GPU of four: a per-layer GPU count."""
    for layer in placement["layers"]:
        if layer.get("module") == "classifier":
            layer["gpus"] = 1
            layer.pop("split", None)


def two_stages_before(module: str):
    """Two stages of two GPUs each, the second from `module`'s layer on."""

    def edit(placement: dict) -> None:
        names = [l["name"] for l in placement["layers"]]
        cut = next(i for i, l in enumerate(placement["layers"]) if l.get("module") == module)
        placement["stages"] = [
            {"first_layer": names[0], "last_layer": names[cut - 1], "replicas": 2},
            {"first_layer": names[cut], "last_layer": names[-1], "replicas": 2},
        ]
        for layer in placement["layers"]:
            layer["gpus"] = 2
            layer.pop("split", None)

    return edit


def soap_split(placement: dict) -> None:
    """Splits fc1 and fc2 by output features and fc3 by input features over 4 GPUs: fc1's
    split output feeds fc2, which reads whole inputs, so fc1 must gather it."""
    splits = {"fc1": (1, 4), "fc2": (1, 4), "fc3": (4, 1)}
    for layer in placement["layers"]:
        if layer.get("module") in splits:
            attribute, parameter = splits[layer["module"]]
            layer["gpus"] = 4
            layer["split"] = {"sample": 1, "attribute": attribute, "parameter": parameter}


def refused_soap_cnn(folder: str) -> str:
    """VGG16's default plan (SOAP: convolutions split by samples, the classifier by
    features) is refused, and the nearest plan it names is one ralpc plans for a CNN and
    PyTorch runs."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    model = os.path.join(root, "fixtures/onnx/vgg16/model.onnx")
    plan = ralpc.plan(model, gpus=8)
    assert plan["strategy"] == "soap", plan["strategy"]
    try:
        rt.layout(plan)
    except rt.Unsupported as e:
        nearest = ralpc.plan(model, gpus=8, **e.nearest)
        lay = rt.layout(nearest)
        return f"refused: {e.reason[:60]}…; nearest {e.nearest} lays out as dp {lay.dp}"
    raise AssertionError("a SOAP plan splitting samples and features was accepted")


def emit_warns_as_layout_refuses(folder: str) -> str:
    """`--emit torch` warns exactly when ralpc.torch's layout refuses the plan for its
    structure (the two read the same rules): VGG16's SOAP plan and a burst plan warned and
    refused, data-parallel, SOAP-split MLP and tensor-parallel GPT plans neither."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    vgg = os.path.join(root, "fixtures/onnx/vgg16/model.onnx")
    cnn, mlp, gpt = (exported(k, folder) for k in ("cnn", "mlp", "gpt"))

    def edited(model: str, edit, **options) -> dict:
        plan = ralpc.plan(model, batch=BATCH, gpus=4, **options)
        edit(plan["placement"])
        path = os.path.join(folder, f"{edit.__name__}.strategy.json")
        with open(path, "w") as f:
            json.dump(plan["placement"], f)
        return {"strategy_file": path}

    cases = [
        ("vgg16 soap", vgg, {"gpus": 8}, True),
        ("vgg16 dp", vgg, {"gpus": 8, "strategy": "dp", "tolerance": float("inf")}, False),
        ("cnn burst", cnn, {"gpus": 4, **edited(cnn, burst, strategy="dp", tolerance=float("inf"))}, True),
        ("mlp soap", mlp, {"gpus": 4, **edited(mlp, soap_split, strategy="dp", tolerance=float("inf"))}, False),
        ("gpt tp2", gpt, {"gpus": 4, "tensor_parallel": 2, "pipeline_parallel": 1}, False),
    ]
    for name, model, options, refused in cases:
        out = os.path.join(folder, name.replace(" ", "-"))
        compiled = ralpc.compile(model, out=out, emit=["torch"], **options)
        warned = any("ralpc.torch will refuse" in w for w in compiled["warnings"])
        try:
            rt.layout(compiled)
            laid_out = True
        except rt.Unsupported:
            laid_out = False
        assert warned == refused and laid_out != refused, (name, compiled["warnings"], laid_out)
    return f"{len(cases)} plans: warned where refused, silent where laid out"


def refused_burst(folder: str) -> str:
    model = exported("cnn", folder)
    plan = ralpc.plan(model, batch=BATCH, gpus=4, strategy="dp", tolerance=float("inf"))
    placement = plan["placement"]
    burst(placement)
    path = os.path.join(folder, "burst.strategy.json")
    with open(path, "w") as f:
        json.dump(placement, f)
    plan = ralpc.plan(model, batch=BATCH, gpus=4, strategy_file=path)
    try:
        rt.layout(plan)
    except rt.Unsupported as e:
        assert "burst" in e.reason and "classifier" in e.reason, e.reason
        assert e.nearest == {"strategy": "dp"}, e.nearest
        return f"refused: {e}"
    raise AssertionError("a burst plan was not refused")


def errors(folder: str) -> str:
    try:
        ralpc.plan(os.path.join(folder, "missing.onnx"), gpus=4)
    except ralpc.RalpcError as e:
        assert e.exit_code == 1 and e.causes and "No such file" in e.causes[-1], (e, e.causes)
        assert isinstance(e.__cause__, ralpc.RalpcError), e.__cause__
    else:
        raise AssertionError("a missing model was planned")
    model = exported("cnn", folder)
    try:
        ralpc.plan(model, gpus=4, strategy="nope")
    except ralpc.RalpcError as e:
        assert e.exit_code == 2 and "nope" in str(e), e
    else:
        raise AssertionError("an unknown strategy was accepted")
    try:
        ralpc.plan(model, gpus=4, json=True)
    except ralpc.RalpcError as e:
        assert "compile" in str(e), e
    else:
        raise AssertionError("a command-line-only option was accepted")
    out = os.path.join(folder, "compiled")
    compiled = ralpc.compile(model, out=out, gpus=4, batch=BATCH, emit=["torch"])
    assert os.path.isfile(os.path.join(out, "plan.json")), compiled["files"]
    assert "train_torch.py" in compiled["files"], compiled["files"]
    try:
        ralpc.compile(model, out=out, gpus=4, batch=BATCH, emit="megatron")
    except ralpc.RalpcError as e:
        assert any("transformer (3d) plans" in c for c in e.causes), (e, e.causes)
    else:
        raise AssertionError("Megatron-LM arguments of a CNN plan were written")
    assert compiled["placement"]["layers"][0]["module"] == "features.0", compiled["placement"]
    return "missing model (exit 1, caused by the OS error), bad option (exit 2), compile writes " + ", ".join(
        compiled["files"]
    )


def emitted_torchrun(folder: str) -> str:
    """`ralpc plan --emit torch` (the command line: RALPC_BIN, else `ralpc` on PATH) writes
    train_torch.py; torchrun runs it on 4 processes; its losses are one process's."""
    import re
    import shutil
    import subprocess

    binary = os.environ.get("RALPC_BIN") or shutil.which("ralpc")
    assert binary, "set RALPC_BIN to the ralpc binary (cargo build) or put ralpc on PATH"
    model = exported("gpt", folder)
    out = os.path.join(folder, "emitted")
    subprocess.run(
        [binary, "plan", model, "--gpus", "4", "--batch", str(BATCH), "--tensor-parallel", "2",
         "--pipeline-parallel", "1", "--zero", "0", "--recompute", "none", "--emit", "torch",
         "-o", out, "-q"],
        check=True,
    )
    script = os.path.join(out, "train_torch.py")
    def torchrun():
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
             "--master-port", str(free_port()), script, "--model", "models:Gpt",
             "--batches", "models:gpt_batch", "--loss", "models:gpt_loss", "--steps",
             str(STEPS), "--lr", str(LR)],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
        )

    run = torchrun()
    # torchrun reports a worker killed by a signal as a negative exit code.
    if run.returncode != 0 and re.search(r"exitcode: -\d+", run.stderr):
        print(f"note: a worker was {SIGNALLED}; once more", flush=True)
        run = torchrun()
    assert run.returncode == 0, run.stdout + run.stderr
    losses = [float(m) for m in re.findall(r"^step \d+ loss (\S+)$", run.stdout, re.M)]
    want = reference("gpt")
    assert same(losses, want), f"torchrun losses {losses}, one process {want}\n{run.stdout}"
    return f"torchrun train_torch.py: losses {['%.6f' % l for l in losses]}"


def refused_fused_qkv(folder: str) -> str:
    """GPT-2's fused q/k/v projection cannot be column-split by heads."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    model = os.path.join(root, "fixtures/onnx/gpt2/model.onnx")
    plan = ralpc.plan(model, gpus=4, batch=8, tensor_parallel=2, pipeline_parallel=1)
    try:
        rt.layout(plan)
    except rt.Unsupported as e:
        assert "blocks.0.qkv" in e.reason and e.nearest == {"tensor_parallel": 1}, e
        return f"refused: {e.reason[:90]}…"
    raise AssertionError("a fused q/k/v projection was split by columns")


CASES = {
    "errors": errors,
    "cnn-ddp": training_case("cnn", {"gpus": 4, "strategy": "dp", "tolerance": float("inf")}, {"dp": 4, "tp": 1, "pp": 1, "zero": 0}),
    "cnn-fsdp": training_case(
        "cnn", {"gpus": 4, "strategy": "dp", "tolerance": float("inf")}, {"dp": 4, "tp": 1, "pp": 1, "zero": 3}, with_zero(3)
    ),
    "cnn-hsdp": training_case(
        "cnn",
        {"gpus": 4, "strategy": "dp", "tolerance": float("inf")},
        {"dp": 4, "tp": 1, "pp": 1, "zero": 3, "shard_groups": 2},
        hybrid(3, 2),
    ),
    "gpt-tp2-dp2": training_case(
        "gpt",
        {"gpus": 4, "tensor_parallel": 2, "pipeline_parallel": 1, "zero": 0, "recompute": "none",
         "sequence_parallel": True},
        {"dp": 2, "tp": 2, "pp": 1, "zero": 0, "sequence_entry": "blocks.0"},
    ),
    "gpt-tp2-dp2-fsdp": training_case(
        "gpt",
        {"gpus": 4, "tensor_parallel": 2, "pipeline_parallel": 1, "zero": 1, "recompute": "none",
         "sequence_parallel": False},
        {"dp": 2, "tp": 2, "pp": 1, "zero": 1, "sequence_entry": None},
    ),
    "gpt-pp2-tp2": training_case(
        "gpt",
        {
            "gpus": 4,
            "tensor_parallel": 2,
            "pipeline_parallel": 2,
            "virtual_stages": 1,
            "micro_batch_size": 2,
            "recompute": "none",
            "zero": 0,
        },
        {"dp": 1, "tp": 2, "pp": 2, "schedule": "1f1b", "microbatches": 4},
    ),
    "gpt-pp2-v2-dp2": training_case(
        "gpt",
        {
            "gpus": 4,
            "tensor_parallel": 1,
            "pipeline_parallel": 2,
            "virtual_stages": 2,
            "micro_batch_size": 2,
            "recompute": "full",
            "zero": 1,
        },
        {"dp": 2, "tp": 1, "pp": 2, "virtual_stages": 2, "microbatches": 2, "zero": 1},
    ),
    "gpt-zbv-pp2-dp2": training_case(
        "gpt",
        {
            "gpus": 4,
            "tensor_parallel": 1,
            "pipeline_parallel": 2,
            "micro_batch_size": 1,
            "schedule": "zb-v",
            "zero": 0,
        },
        {"dp": 2, "tp": 1, "pp": 2, "virtual_stages": 2, "schedule": "zb-v", "microbatches": 4},
    ),
    "mlp-soap-tp4": training_case(
        "mlp",
        {"gpus": 4, "strategy": "dp", "tolerance": float("inf")},
        {"dp": 1, "tp": 4, "styles": {"fc1": "colwise_gather", "fc2": "colwise", "fc3": "rowwise"}},
        soap_split,
    ),
    "mlp-zb-h1-pp2-dp2": training_case(
        "mlp",
        {"gpus": 4, "strategy": "pipeline", "schedule": "zb-h1", "microbatches": 4,
         "tolerance": float("inf")},
        {"dp": 2, "pp": 2, "schedule": "zb-h1", "microbatches": 4},
        two_stages_before("fc3"),
    ),
    "emitted-torchrun": emitted_torchrun,
    "refuses-soap-cnn": refused_soap_cnn,
    "emit-warns-as-layout-refuses": emit_warns_as_layout_refuses,
    "refuses-burst": refused_burst,
    "refuses-fused-qkv": refused_fused_qkv,
}


def main(names: list[str]) -> int:
    names = names or list(CASES)
    failed = 0
    print(f"torch {torch.__version__}, ralpc {ralpc.__version__}, {WORLD} processes (gloo)")
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            started = time.monotonic()
            try:
                what = CASES[name](folder)
                print(f"ok    {name:<14} {time.monotonic() - started:5.1f} s  {what}", flush=True)
            except Exception:  # noqa: BLE001 - every failure is reported, then counted
                failed += 1
                print(f"FAIL  {name:<14} {time.monotonic() - started:5.1f} s", flush=True)
                traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
