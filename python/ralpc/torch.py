"""Apply a ralpc plan to your own ``nn.Module`` with PyTorch's distributed APIs.

``ralpc.plan(...)`` places every layer of an ONNX export; each layer carries the PyTorch
module it came from (``blocks.3.fc``). :func:`parallelize` applies that placement to the
module the export was made from:

=====================================  ==================================================
ralpc plan                             PyTorch
=====================================  ==================================================
samples split ``d`` ways, ZeRO 0       ``DistributedDataParallel`` over the ``dp`` mesh
ZeRO 1, 2                              FSDP2 ``fully_shard(reshard_after_forward=False)``
ZeRO 3                                 FSDP2 ``fully_shard(reshard_after_forward=True)``
ZeRO in R shard groups (hybrid)        FSDP2 over the 2-d mesh ``("dp_replicate",
                                       "dp_shard")`` (HSDP): sharded inside a group,
                                       replicated across the R groups
dense layer split by output features   ``ColwiseParallel`` on its ``nn.Linear``
dense layer split by input features    ``RowwiseParallel`` on its ``nn.Linear``
embedding split over the ``tp`` group  ``RowwiseParallel`` (rows: the vocabulary)
attention split by heads               its ``nn.Module``'s head count divided by ``t``
LayerNorm split by sequence positions  ``SequenceParallel`` (not in pipelined plans)
pipeline stages                        ``torch.distributed.pipelining``: split points at
                                       the stages' first modules; GPipe, 1F1B,
                                       interleaved 1F1B or zero-bubble ZB-H1
                                       (``ScheduleInterleavedZeroBubble``, one stage a
                                       rank: the order ralpc prices and lowers) as the
                                       plan schedules them
recomputed runs of whole modules       ``torch.utils.checkpoint`` around those modules
=====================================  ==================================================

What PyTorch cannot express is refused with :class:`Unsupported`, which names the reason
and the nearest plan it can express (as ``ralpc.plan`` options): per-layer GPU counts (a
burst plan), a convolution split by rows or channels, PipeDream's asynchronous schedule,
stages of unequal GPU counts, attention heads split behind a fused q/k/v projection. Megatron-LM's sequence parallelism (LayerNorms split by sequence positions) is applied
with ``SequenceParallel``, the row-parallel products reduce-scattering into it and the
column-parallel ones gathering from it, the residual stream cut from the first block on
(``PrepareModuleInput``); in a pipelined plan the traced stages expect whole tensors, so
there the LayerNorms run replicated over the tensor-parallel group (as many bytes move,
more activations are held). Every such difference is listed in
:attr:`Parallelized.notes`, never made silently.

The mesh has the dimensions ``("pp", "dp", "tp")`` in that order (tensor parallelism
fastest-varying, as Megatron-LM numbers ranks); the world size must equal their product.
A hybrid-sharded plan's mesh cuts ``dp`` in two: ``("pp", "dp_replicate", "dp_shard",
"tp")``, the groups of consecutive data-parallel ranks along ``dp_shard``, as ralpc
numbers them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Unsupported", "Layout", "Parallelized", "layout", "parallelize"]

_HEAD_ATTRIBUTES = ("n_heads", "n_head", "num_heads", "heads", "num_attention_heads")
_KV_HEAD_ATTRIBUTES = ("n_kv_heads", "num_key_value_heads")


class Unsupported(ValueError):
    """A plan that PyTorch's APIs cannot express.

    ``reason`` says why; ``nearest`` is a dict of ``ralpc.plan`` options for the nearest
    plan that they can (for example ``{"strategy": "dp"}``).
    """

    def __init__(self, reason: str, nearest: dict[str, Any]):
        self.reason = reason
        self.nearest = nearest
        options = ", ".join(f"{k}={v!r}" for k, v in nearest.items())
        super().__init__(f"{reason}; the nearest plan PyTorch can run: ralpc.plan(..., {options})")


@dataclass
class Layout:
    """How a plan maps onto PyTorch: the mesh's sizes and each module's style."""

    pp: int
    dp: int
    tp: int
    virtual_stages: int
    schedule: str
    microbatches: int
    zero: int
    #: Module path of each pipeline stage's first module (stage 0's is ``""``).
    split_points: list[str]
    #: Module path → ``"colwise"``, ``"colwise_gather"`` (output replicated),
    #: ``"rowwise"``, ``"embedding"`` or ``"heads"``.
    styles: dict[str, str]
    #: Module paths to recompute (wrapped in ``torch.utils.checkpoint``).
    recompute: list[str]
    #: With sequence parallelism, the module whose input is cut by sequence positions (the
    #: first block); ``None`` without.
    sequence_entry: str | None = None
    notes: list[str] = field(default_factory=list)
    #: Under ZeRO, the groups the data-parallel ranks are cut into, each sharding a whole
    #: copy of the state (hybrid sharding, FSDP2's HSDP); 1: one.
    shard_groups: int = 1


def _nearest_aligned(plan: dict) -> dict[str, Any]:
    """The nearest plan whose layers all split alike over one mesh: Megatron-LM's layout for
    a transformer (a plan that considered it), data parallelism for any other model."""
    if any(c.get("strategy") == "3d" for c in plan.get("candidates", [])):
        return {"strategy": "3d"}
    return {"strategy": "dp"}


def _nearest_unsplit(plan: dict) -> dict[str, Any]:
    """The nearest plan without tensor parallelism: the transformer's own layout at degree
    1, data parallelism for any other model."""
    if _nearest_aligned(plan) == {"strategy": "3d"}:
        return {"tensor_parallel": 1}
    return {"strategy": "dp"}


def _placement(plan: dict) -> dict:
    placement = plan.get("placement")
    if placement is None:
        why = plan.get("not_lowered") or "the plan has no per-layer placement"
        raise Unsupported(
            f"this plan cannot be applied layer by layer: {why}", {"strategy": "dp"}
        )
    return placement


def _ancestors(path: str) -> list[str]:
    """``a.b.c`` → ``["a", "a.b", "a.b.c"]``."""
    parts = path.split(".") if path else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _within(module: str, ancestor: str) -> bool:
    return module == ancestor or module.startswith(ancestor + ".")


def _members(layers: list[dict], ancestor: str) -> list[int]:
    """Indices of the layers inside module ``ancestor``."""
    return [j for j, l in enumerate(layers) if _within(l.get("module", ""), ancestor)]


def _whole_modules(layers: list[dict], first: int, last: int) -> list[str] | None:
    """The fewest modules that hold exactly layers ``first..=last`` of ``layers``, or None
    when some of them share a module with a layer outside the run."""
    chosen: list[str] = []
    i = first
    while i <= last:
        module = layers[i].get("module", "")
        best = None
        for a in _ancestors(module):
            members = _members(layers, a)
            if members and members[0] == i and members[-1] <= last and members == list(
                range(i, members[-1] + 1)
            ):
                best = (a, members[-1])
                break
        if best is None:
            return None
        chosen.append(best[0])
        i = best[1] + 1
    return chosen


def layout(plan: dict) -> Layout:
    """How ``plan`` (from ``ralpc.plan``) maps onto PyTorch, or :class:`Unsupported`.

    Needs no process group: it reads the plan alone.
    """
    placement = _placement(plan)
    stages = placement["stages"]
    layers = placement["layers"]
    names = [l["name"] for l in layers]
    index = {n: i for i, n in enumerate(names)}
    if placement.get("schedule") == "async":
        raise Unsupported(
            "PipeDream's asynchronous schedule (weight stashing) has no PyTorch schedule",
            {"schedule": "1f1b"},
        )
    m, depth = placement.get("microbatches", 1), len(stages)
    if placement.get("schedule") == "zb-h1" and m % max(1, m // depth):
        raise Unsupported(
            f"PyTorch's zero-bubble schedule runs {m} microbatches in rounds of its {depth} "
            "stages, which they do not fill",
            {"schedule": "1f1b"},
        )
    replicas = {s["replicas"] for s in stages}
    if len(replicas) != 1:
        raise Unsupported(
            f"stages run on different GPU counts ({[s['replicas'] for s in stages]}); a "
            "PyTorch device mesh gives every stage the same",
            _nearest_aligned(plan),
        )
    (r,) = replicas
    v = placement.get("virtual_stages", 1)
    pp = len(stages) // v
    stage_of = [0] * len(layers)
    for k, s in enumerate(stages):
        for i in range(index[s["first_layer"]], index[s["last_layer"]] + 1):
            stage_of[i] = k
    # Tensor-parallel degree: what a layer splits besides samples.
    t = 1
    for l in layers:
        split = l["split"]
        t = max(t, split["attribute"] * split["parameter"])
    d = r // t
    if d * t != r:
        raise Unsupported(
            f"a stage's {r} GPUs do not divide into tensor-parallel groups of {t}",
            {"strategy": "dp"},
        )
    styles: dict[str, str] = {}
    notes: list[str] = []
    sequence_split: list[str] = []
    for i, l in enumerate(layers):
        split, kind, module = l["split"], l.get("kind"), l.get("module", "")
        degree = split["sample"] * split["attribute"] * split["parameter"]
        label = module or l["name"]
        if degree != r:
            raise Unsupported(
                f"layer {label!r} runs on {degree} of its stage's {r} GPUs (burst "
                "parallelism): PyTorch runs every module on the whole mesh",
                {"strategy": "dp"},
            )
        if split["sample"] != d:
            raise Unsupported(
                f"layer {label!r} splits samples {split['sample']} ways where the plan's "
                f"tensor-parallel layers split them {d} ways: PyTorch gives every module of "
                "a tensor-parallel group the same samples",
                _nearest_aligned(plan),
            )
        tp = split["attribute"] * split["parameter"]
        if tp == 1:
            continue
        if kind in ("conv", "pool", "norm"):
            what = "rows" if split["attribute"] > 1 else "channels"
            raise Unsupported(
                f"layer {label!r} ({kind}) is split by {what}: PyTorch's tensor "
                "parallelism has no convolution or pooling styles",
                {"strategy": "dp"},
            )
        if kind == "dense":
            if not module:
                raise Unsupported(
                    f"layer {l['name']!r} names no PyTorch module (export with "
                    "torch.onnx.export so that nodes record their modules)",
                    {"strategy": "dp"},
                )
            style = "colwise" if split["parameter"] > 1 else "rowwise"
            if styles.setdefault(module, style) != style:
                raise Unsupported(
                    f"module {module!r} holds products split both by rows and columns",
                    {"strategy": "dp"},
                )
        elif kind == "embedding":
            styles[module] = "embedding"
        elif kind == "attention":
            styles[module] = "heads"
        elif kind == "layer_norm" and split["attribute"] > 1:
            sequence_split.append(label)
    # Heads are split by giving each rank whole q, k and v columns: a fused projection
    # ([q; k; v] in one Linear) would be cut into contiguous thirds, not heads.
    for i, l in enumerate(layers):
        if styles.get(l.get("module", "")) != "heads":
            continue
        projections = []
        for earlier in reversed(layers[:i]):
            if earlier.get("kind") in ("layer_norm", "norm", "attention"):
                break
            if styles.get(earlier.get("module", "")) == "colwise":
                projections.append(earlier["module"])
        if len(projections) != 3:
            raise Unsupported(
                f"attention {l.get('module')!r} splits its heads {t} ways, fed by "
                f"{len(projections)} column-parallel projection(s) {projections[::-1]}: "
                "ColwiseParallel gives each rank contiguous output columns, which are its "
                "heads only with separate q, k and v Linear modules (split a fused one)",
                {"tensor_parallel": 1},
            )
    # A column-parallel product keeps its output split only where every reader takes it
    # split: a row-parallel product or an attention splitting heads, directly or through
    # elementwise layers (an activation, SwiGLU's product) in its stage. Otherwise (the LM
    # head, a product feeding another column-parallel one) it gathers its output, as
    # ralpc's own plan does between such layers.
    readers: dict[str, list[int]] = {n: [] for n in names}
    for j, row in enumerate(layers):
        for source in row.get("inputs", []):
            if source in readers:
                readers[source].append(j)
    # Each layer's verdict once: True, every reader takes its output split; False, none
    # does (or it has none); None, both. A layer reached again reuses its verdict.
    verdict: dict[int, bool | None] = {}

    def split_readers(i: int) -> bool | None:
        if i in verdict:
            return verdict[i]
        verdict[i] = False  # in progress (the layer graph has no cycles)
        verdicts = set()
        for j in readers[layers[i]["name"]]:
            reader = layers[j]
            style = styles.get(reader.get("module", ""))
            if stage_of[j] != stage_of[i]:
                verdicts.add(False)
            elif style in ("rowwise", "heads"):
                verdicts.add(True)
            elif reader.get("kind") in ("dense", "attention", "embedding", "norm", "layer_norm", "conv", "pool"):
                verdicts.add(False)
            else:
                verdicts.add(split_readers(j))
        verdict[i] = verdicts.pop() if len(verdicts) == 1 else (None if verdicts else False)
        return verdict[i]

    def kept_split_by_scan(i: int) -> bool:
        """Without the dataflow (a placement from before it was recorded): split when a
        row-parallel product follows before the next norm or stage."""
        for later in layers[i + 1 :]:
            if later.get("kind") in ("layer_norm", "norm") or stage_of[index[later["name"]]] != stage_of[i]:
                return False
            if styles.get(later.get("module", "")) == "rowwise":
                return True
        return False

    has_dataflow = any("inputs" in l for l in layers)
    # Every call of a module decides together: one style applies to the module.
    kept_by_module: dict[str, set] = {}
    for i, l in enumerate(layers):
        module = l.get("module", "")
        if styles.get(module) == "colwise":
            kept = split_readers(i) if has_dataflow else kept_split_by_scan(i)
            kept_by_module.setdefault(module, set()).add(kept)
    for module, kept in kept_by_module.items():
        if kept == {True}:
            continue
        if kept == {False}:
            styles[module] = "colwise_gather"
            continue
        raise Unsupported(
            f"module {module!r} is split by output features, and some of its readers take "
            "its output split while others need it whole: one PyTorch style cannot give both",
            _nearest_unsplit(plan),
        )
    # Megatron's sequence parallelism: LayerNorms split by sequence positions, reached by
    # reduce-scatters of the row-parallel sums, left by all-gathers before the column-
    # parallel products. The residual stream is cut by sequence from the module holding the
    # first such LayerNorm on; stage boundaries would carry the cut (the traced stages
    # expect whole tensors), so pipelined plans run it replicated.
    sequence_entry = None
    first_norm = next(
        (l.get("module", "") for l in layers if l.get("kind") == "layer_norm" and l["split"]["attribute"] > 1),
        "",
    )
    entry = first_norm.rpartition(".")[0]
    if not plan.get("sequence_parallel", True):
        sequence_split = []  # the plan replicates them too (Megatron without it)
    if sequence_split and pp == 1 and v == 1 and entry:
        sequence_entry = entry
        for l in layers:
            if l.get("kind") == "layer_norm" and l["split"]["attribute"] > 1 and l.get("module"):
                styles[l["module"]] = "sequence"
        sequence_split = []
    if sequence_split:
        notes.append(
            f"sequence parallelism not applied: {len(sequence_split)} LayerNorm layers "
            f"(first {sequence_split[0]!r}) run replicated over each tensor-parallel group "
            "(the same bytes move, as all-reduces; their activations are held whole)"
        )
    if "heads" in styles.values() and t > 1:
        notes.append(f"attention modules compute {1}/{t} of their heads on each rank")
    split_points = [""]
    for s in stages[1:]:
        first = index[s["first_layer"]]
        module = layers[first].get("module", "")
        point = None
        for a in _ancestors(module):
            members = _members(layers, a)
            if members and members[0] == first:
                point = a
                break
        if point is None:
            raise Unsupported(
                f"stage boundary before layer {module or s['first_layer']!r} falls inside a "
                "module: PyTorch's pipeline splits at module boundaries",
                {"pipeline_parallel": 1},
            )
        split_points.append(point)
    recompute: list[str] = []
    for run in placement.get("recompute", []):
        first, last = index[run["first_layer"]], index[run["last_layer"]]
        modules = _whole_modules(layers, first, last)
        if modules is None:
            raise Unsupported(
                f"recomputed run {run['first_layer']}..{run['last_layer']} is not a whole "
                "module: torch.utils.checkpoint wraps modules",
                {"recompute": "full"},
            )
        recompute.extend(modules)
    zero = placement.get("zero", 0)
    if zero == 0 and d > 1 and placement.get("schedule") in ("zb-h1", "zb-v"):
        # PyTorch's zero-bubble schedule reads its traced stages' graphs, which a
        # DistributedDataParallel wrapper hides; FSDP2 shards in place.
        notes.append(
            f"data parallelism of a {placement['schedule']} pipeline as FSDP2 without resharding after "
            "forward (PyTorch's zero-bubble schedule cannot run DistributedDataParallel "
            "stages): the same numbers, gradients and optimizer state sharded"
        )
        zero = 2
    elif zero in (1, 2) and d > 1:
        notes.append(
            f"ZeRO-{zero} as FSDP2 without resharding after forward: gradients and "
            "optimizer state sharded (ZeRO-2), weights kept whole between passes"
        )
    groups = placement.get("shard_groups", 1) if zero > 0 and d > 1 else 1
    return Layout(
        pp=pp,
        dp=d,
        tp=t,
        virtual_stages=v,
        schedule=placement.get("schedule", "1f1b"),
        microbatches=placement.get("microbatches", 1),
        zero=zero,
        split_points=split_points,
        styles=styles,
        recompute=recompute,
        sequence_entry=sequence_entry,
        notes=notes,
        shard_groups=groups,
    )


class _Checkpointed(nn.Module):
    """Runs ``inner`` under ``torch.utils.checkpoint``: its activations are recomputed in
    backward."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return torch.utils.checkpoint.checkpoint(
            self.inner, *args, use_reentrant=False, **kwargs
        )


def _swap_in(traced: nn.Module, original: nn.Module, prefix: str = "") -> None:
    """Replaces the traced stage's submodules by the user's own modules (same parameters,
    eager code), so that tensor parallelism and head counts apply to them."""
    for name, child in list(traced.named_children()):
        # A module called again is traced as `name@k`, its k-th call: the same module.
        path = prefix + name.split("@")[0]
        own = original.get_submodule(path)
        if isinstance(own, (nn.ModuleList, nn.ModuleDict)):
            _swap_in(child, original, path + ".")
        else:
            setattr(traced, name, own)


def _set_heads(module: nn.Module, path: str, t: int) -> None:
    found = False
    for attr in _HEAD_ATTRIBUTES + _KV_HEAD_ATTRIBUTES:
        heads = getattr(module, attr, None)
        if isinstance(heads, int) and not isinstance(heads, bool):
            if heads % t:
                raise Unsupported(
                    f"module {path!r} has {attr}={heads}, which {t} tensor-parallel ranks "
                    "do not divide",
                    {"tensor_parallel": 1},
                )
            setattr(module, attr, heads // t)
            found = found or attr in _HEAD_ATTRIBUTES
    if not found:
        raise Unsupported(
            f"module {path!r} splits its attention heads {t} ways, but has none of the "
            f"attributes {', '.join(_HEAD_ATTRIBUTES)} to say how many it computes",
            {"tensor_parallel": 1},
        )


def _tensor_parallel(module: nn.Module, lay: Layout, tp_mesh) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    # Under sequence parallelism products read sequence-cut inputs and row-parallel ones
    # reduce-scatter into them.
    seq = lay.sequence_entry is not None
    into = {"input_layouts": Shard(1)} if seq else {}
    out_of = {"output_layouts": Shard(1)} if seq else {}

    present = dict(module.named_modules())
    plan = {}
    for path, style in lay.styles.items():
        if path not in present:
            continue  # another pipeline stage's
        target = present[path]
        if style == "heads":
            _set_heads(target, path, lay.tp)
            continue
        kind = {"embedding": nn.Embedding, "sequence": nn.LayerNorm}.get(style, nn.Linear)
        if not isinstance(target, kind):
            raise Unsupported(
                f"module {path!r} is a {type(target).__name__}, where its plan splits it as "
                f"an {kind.__name__} ({style})",
                {"tensor_parallel": 1},
            )
        if style == "sequence":
            plan[path] = SequenceParallel()
            continue
        plan[path] = {
            "colwise": lambda: ColwiseParallel(**into),
            "colwise_gather": lambda: ColwiseParallel(**into, output_layouts=Replicate()),
            "rowwise": lambda: RowwiseParallel(**out_of),
            "embedding": lambda: RowwiseParallel(input_layouts=Replicate()),
        }[style]()
    if seq and lay.sequence_entry in present:
        plan[lay.sequence_entry] = PrepareModuleInput(
            input_layouts=(Replicate(),),
            desired_input_layouts=(Shard(1),),
            use_local_output=True,
        )
    if plan:
        parallelize_module(module, tp_mesh, plan)


def _recompute(module: nn.Module, paths: Sequence[str]) -> None:
    present = dict(module.named_modules())
    for path in paths:
        if path not in present or not path:
            continue
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        setattr(parent, name, _Checkpointed(present[path]))


def _data_parallel(module: nn.Module, lay: Layout, mesh) -> nn.Module:
    if lay.dp == 1:
        return module
    dp_mesh = mesh["dp"]
    if lay.zero == 0:
        from torch.nn.parallel import DistributedDataParallel

        if lay.tp > 1:
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

            _pre_dp_module_transform(module)
        return DistributedDataParallel(module, process_group=dp_mesh.get_group())
    from torch.distributed.fsdp import fully_shard

    reshard = lay.zero == 3
    if lay.shard_groups > 1:
        # HSDP: FSDP2 shards over the mesh's second dimension, replicates over its first.
        dp_mesh = mesh["dp_replicate", "dp_shard"]
    # Each child its own FSDP unit (a container's members: a ModuleList has no forward).
    units = []
    for child in module.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            units.extend(child.children())
        else:
            units.append(child)
    for unit in units:
        if any(True for _ in unit.parameters()):
            fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard)
    return module


def _microbatches(batch, n: int) -> list:
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n))
    columns = [_microbatches(b, n) for b in batch]
    return [tuple(c[i] for c in columns) for i in range(n)]


def _shard(batch, index: int, parts: int):
    if isinstance(batch, torch.Tensor):
        size = batch.shape[0] // parts
        if size * parts != batch.shape[0]:
            raise ValueError(
                f"a batch of {batch.shape[0]} does not split into {parts} data-parallel shares"
            )
        return batch[index * size : (index + 1) * size]
    return tuple(_shard(b, index, parts) for b in batch)


@dataclass
class Parallelized:
    """A module parallelized by a plan, on this rank.

    ``step(inputs, target)`` runs one iteration's forward and backward on this rank's share
    of the *global* batch (every rank passes the same batch) and returns the global mean
    loss on every rank; step the optimizer over :meth:`parameters` after it.
    """

    module: nn.Module
    layout: Layout
    mesh: Any
    loss_fn: Callable
    notes: list[str]
    _schedule: Any = None
    _is_last: bool = True

    def parameters(self):
        return self.module.parameters()

    def step(self, inputs, target) -> float:
        lay = self.layout
        dp_rank = self.mesh["dp"].get_local_rank()
        inputs = _shard(inputs, dp_rank, lay.dp)
        target = _shard(target, dp_rank, lay.dp)
        if self._schedule is not None:
            losses: list = []
            first = self.mesh["pp"].get_local_rank() == 0
            args = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
            if first and self._is_last:
                self._schedule.step(*args, target=target, losses=losses)
            elif first:
                self._schedule.step(*args)
            elif self._is_last:
                self._schedule.step(target=target, losses=losses)
            else:
                self._schedule.step()
            local = torch.stack([l.detach() for l in losses]).mean() if losses else torch.zeros(())
            total = local.clone().float()
            dist.all_reduce(total, group=self.mesh["pp"].get_group())
        else:
            m = lay.microbatches
            total = torch.zeros(())
            xs = _microbatches(inputs, m)
            ys = _microbatches(target, m)
            for x, y in zip(xs, ys):
                out = self.module(x) if isinstance(x, torch.Tensor) else self.module(*x)
                loss = self.loss_fn(out, y) / m
                loss.backward()
                total += loss.detach().float()
        if lay.dp > 1:
            dist.all_reduce(total, group=self.mesh["dp"].get_group())
            total /= lay.dp
        return float(total)


def parallelize(
    module: nn.Module,
    plan: dict,
    mesh=None,
    *,
    loss_fn: Callable,
    example_inputs=None,
) -> Parallelized:
    """Applies ``plan`` (``ralpc.plan``'s result for an export of ``module``) to ``module``.

    ``mesh``: a ``DeviceMesh`` with dimensions ``("pp", "dp", "tp")``; ``None`` builds one
    over the default process group. ``loss_fn(output, target)`` averages over its samples.
    ``example_inputs``: one microbatch of inputs, needed to trace a pipelined plan's stages.
    Every rank must build ``module`` with the same initial weights.
    """
    from torch.distributed.device_mesh import init_device_mesh

    lay = layout(plan)
    world = dist.get_world_size()
    need = lay.pp * lay.dp * lay.tp
    r = lay.shard_groups
    names, shape = ("pp", "dp", "tp"), (lay.pp, lay.dp, lay.tp)
    if r > 1:
        names, shape = ("pp", "dp_replicate", "dp_shard", "tp"), (lay.pp, r, lay.dp // r, lay.tp)
    if mesh is None:
        if world != need:
            raise ValueError(
                f"the plan runs on {need} processes (pp {lay.pp} × dp {lay.dp} × tp "
                f"{lay.tp}); this group has {world}"
            )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        mesh = init_device_mesh(device, shape, mesh_dim_names=names)
    elif tuple(mesh.mesh_dim_names or ()) != names or tuple(mesh.shape) != shape:
        raise ValueError(
            f"the plan needs a mesh {names} of shape {shape}; "
            f"got {mesh.mesh_dim_names} of shape {tuple(mesh.shape)}"
        )
    if r > 1:
        # One `dp` dimension over both, for the batch's shards and the loss's mean.
        mesh["dp_replicate", "dp_shard"]._flatten("dp")
    notes = list(lay.notes)
    if lay.pp == 1 and lay.virtual_stages == 1:
        _tensor_parallel(module, lay, mesh["tp"])
        _recompute(module, lay.recompute)
        module = _data_parallel(module, lay, mesh)
        return Parallelized(module, lay, mesh, loss_fn, notes)
    return _pipelined(module, lay, mesh, loss_fn, example_inputs, notes)


def _pipelined(module, lay: Layout, mesh, loss_fn, example_inputs, notes) -> Parallelized:
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
        ScheduleZBVZeroBubble,
        SplitPoint,
        pipeline,
    )

    if example_inputs is None:
        raise ValueError(
            "a pipelined plan traces its stages: pass example_inputs (one microbatch)"
        )
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    split_spec = {p: SplitPoint.BEGINNING for p in lay.split_points[1:]}
    pipe = pipeline(copy.deepcopy(module), mb_args=args, split_spec=split_spec)
    pp_rank = mesh["pp"].get_local_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    stages = []
    owned = list(range(pp_rank, lay.pp * lay.virtual_stages, lay.pp))
    if lay.schedule == "zb-v":
        # ZB-V's V: pipeline rank g holds stages g and 2·pp − 1 − g.
        owned = [pp_rank, 2 * lay.pp - 1 - pp_rank]
    for k in owned:
        stage = pipe.build_stage(k, device, group=mesh["pp"].get_group())
        _swap_in(stage.submod, module)
        _tensor_parallel(stage.submod, lay, mesh["tp"])
        _recompute(stage.submod, lay.recompute)
        wrapped = _data_parallel(stage.submod, lay, mesh)
        stage.submod = wrapped
        stages.append(stage)
    n = lay.microbatches
    if lay.schedule == "zb-v":
        schedule = ScheduleZBVZeroBubble(stages, n_microbatches=n, loss_fn=loss_fn)
    elif lay.virtual_stages > 1:
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=n, loss_fn=loss_fn)
    elif lay.schedule == "gpipe":
        schedule = ScheduleGPipe(stages[0], n_microbatches=n, loss_fn=loss_fn)
    elif lay.schedule == "zb-h1":
        # With one stage a rank, PyTorch's zero-bubble schedule is ZB-H1: each rank's
        # weight passes as many backwards late as its pipeline rank.
        schedule = ScheduleInterleavedZeroBubble(stages, n_microbatches=n, loss_fn=loss_fn)
    else:
        schedule = Schedule1F1B(stages[0], n_microbatches=n, loss_fn=loss_fn)
    local = nn.ModuleList([s.submod for s in stages])
    last = (lay.pp * lay.virtual_stages - 1) in owned
    return Parallelized(local, lay, mesh, loss_fn, notes, schedule, last)
