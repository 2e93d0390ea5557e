"""torchtitan's own loader and checks on the job files `ralpc plan --emit torchtitan` writes.

    python check_torchtitan.py WORLD:DIR/torchtitan_plan.py [...]

For each file: torchtitan 0.3's ConfigManager loads it as `torchtitan.train` does (imports
the module, calls `ralpc_plan()`, re-parses the Trainer.Config through tyro, whose
dataclasses check their fields; tyro's warnings of a wrong type or value are errors here),
then the checks torchtitan makes when it starts on WORLD ranks: `ParallelDims` (the degrees'
product is the world), the pipeline schedule's name and stage count
(`_get_pipeline_metadata`), the global batch against the local batch and data-parallel
degree, the sequence against tensor and context parallelism (torchtitan/trainer.py), the
expert degree against the ranks that hold experts. Prints `PATH: accepted ...` per file and
exits 1 at the first refusal, printing torchtitan's message.

Runs on a CPU: only the configuration path is imported. torchtitan's data, tokenizer,
metrics and Triton kernel modules, which it imports eagerly and which need packages the
test environment leaves out (datasets, tokenizers, tensorboard, triton), are stubbed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
import warnings

STUBBED = (
    "torchtitan.distributed.minimal_async_ep.kernels",
    "datasets",
    "tokenizers",
    "tensorboard",
    "torch.utils.tensorboard",
)


class _Anything:
    """Stands for any name of a stubbed module: callable, a decorator, subscriptable, a
    base class."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __getitem__(self, key):
        return _Anything()

    def __class_getitem__(cls, key):
        return cls

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    __path__: list[str] = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Anything,), {}) if name[:1].isupper() else _Anything()


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == s or fullname.startswith(s + ".") for s in STUBBED):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__version__ = "0.0.0+stub"
        return module

    def exec_module(self, module):
        pass


def check(path: str, world: int) -> str:
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims

    folder, name = os.path.split(os.path.abspath(path))
    module = os.path.splitext(name)[0]
    sys.path.insert(0, folder)
    sys.modules.pop(module, None)
    try:
        importlib.import_module(module)  # its own ImportError, which the loader would hide
        try:
            config = ConfigManager().parse_args(["--module", module, "--config", "ralpc_plan"])
        except SystemExit as e:
            raise AssertionError(f"torchtitan's ConfigManager refused it (exit {e.code})")
    finally:
        sys.path.remove(folder)
    p, t = config.parallelism, config.training
    dims = ParallelDims.from_config(p, world)
    get_schedule_class(p.pipeline_parallel_schedule)
    data = dims.dp_replicate * dims.dp_shard
    assert t.global_batch_size % (t.local_batch_size * data) == 0, (
        f"global batch {t.global_batch_size} is not a multiple of the local batch "
        f"{t.local_batch_size} × data-parallel degree {data} (torchtitan/trainer.py)"
    )
    divisor = (dims.tp if p.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)
    assert t.seq_len % divisor == 0, f"sequence {t.seq_len} is not a multiple of {divisor}"
    if dims.ep > 1:
        assert (dims.dp_shard * dims.cp * dims.tp) % dims.ep == 0, (
            f"expert degree {dims.ep} does not divide dp_shard × cp × tp"
        )
    stages = ""
    if dims.pp > 1:
        from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

        virtual, layers, _, _ = _get_pipeline_metadata(dims, p, config.model_spec.model)
        stages = f", {virtual} stages over {layers} blocks"
    return (
        f"accepted: {config.model_spec.name} {config.model_spec.flavor} on {world} ranks, "
        f"dp_shard {dims.dp_shard} tp {dims.tp} cp {dims.cp} pp {dims.pp} ep {dims.ep}{stages}, "
        f"batch {t.global_batch_size} ({t.local_batch_size} a rank and step), "
        f"activation checkpointing {type(config.activation_checkpoint).__qualname__}"
    )


def main(arguments: list[str]) -> int:
    sys.meta_path.insert(0, _Stubs())
    warnings.filterwarnings("error", module=r"tyro(\.|$)")
    for argument in arguments:
        world, _, path = argument.partition(":")
        try:
            print(f"{path}: {check(path, int(world))}", flush=True)
        except Exception as e:  # noqa: BLE001 -- torchtitan's own refusal, printed
            print(f"{path}: refused: {type(e).__name__}: {e}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
