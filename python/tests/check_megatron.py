"""Megatron-Core's own validation of the arguments `ralpc plan --emit megatron` writes.

Each `megatron.args` given is read as Megatron-LM's training script would hand it to
Megatron-Core: the flags that configure the model and its parallelism become a
`TransformerConfig` (an `MLATransformerConfig` with latent attention), whose
`__post_init__` checks them, as `core_transformer_config_from_args` does in
megatron/training/arguments.py. Flags that configure the data loader, the optimizer or the
distributed wrapper are left to `validate_args` (tests/plan_3d.rs transcribes its rules).

Usage: python check_megatron.py ARGS_FILE [ARGS_FILE ...]; prints one line per file and
exits 1 if Megatron-Core refuses one.
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from packaging.version import Version  # noqa: E402

import megatron.core.transformer.transformer_config as transformer_config  # noqa: E402
from megatron.core.transformer.transformer_config import (  # noqa: E402
    MLATransformerConfig,
    TransformerConfig,
)

# Transformer Engine needs CUDA and is not installed here: the configuration's checks that
# ask for its version are answered as a current one would (2.10, the newest any asks for),
# as on the GPUs the arguments are written for.
TE_VERSION = Version("2.10.0")
transformer_config.is_te_min_version = lambda version, check_equality=True: (
    TE_VERSION >= Version(version) if check_equality else TE_VERSION > Version(version)
)
transformer_config.get_te_version = lambda: TE_VERSION

# Flags that are not TransformerConfig fields (the training script's, the optimizer's, the
# distributed wrapper's, the model builder's).
NOT_CONFIG = {
    "seq_length",
    "max_position_embeddings",
    "micro_batch_size",
    "global_batch_size",
    "use_distributed_optimizer",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "fp8_param_gather",
    "untie_embeddings_and_output_weights",
    "position_embedding_type",
    "group_query_attention",
    "use_megatron_fsdp",
    "data_parallel_sharding_strategy",
    "no_gradient_accumulation_fusion",
    "ckpt_format",
    "num_layers_per_virtual_pipeline_stage",
    "swiglu",
    "disable_bias_linear",
    "multi_latent_attention",
    "num_experts",
    "optimizer_cpu_offload",
    "optimizer_offload_fraction",
    "use_precision_aware_optimizer",
    "overlap_cpu_optimizer_d2h_h2d",
    "num_distributed_optimizer_instances",
}


def parse(path):
    flags = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        flags[name[2:].replace("-", "_")] = value.strip() if value else True
    return flags


def number(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def config(flags):
    kw = {k: number(v) for k, v in flags.items() if k not in NOT_CONFIG}
    kw.setdefault("num_layers", 1)
    if "swiglu" in flags:
        kw["gated_linear_unit"] = True
        kw["activation_func"] = F.silu
    if "disable_bias_linear" in flags:
        kw["add_bias_linear"] = False
    if "num_experts" in flags:
        kw["num_moe_experts"] = int(flags["num_experts"])
    if "recompute_modules" in kw:
        kw["recompute_modules"] = str(kw["recompute_modules"]).split()
    if "moe_layer_freq" in kw:
        kw["moe_layer_freq"] = eval(kw["moe_layer_freq"])  # Megatron-LM's moe_freq_type
    if "window_size" in kw:
        kw["window_size"] = tuple(int(x) for x in str(kw["window_size"]).split(","))
    per = flags.get("num_layers_per_virtual_pipeline_stage")
    if per:
        pp = int(flags.get("pipeline_model_parallel_size", 1))
        # validate_args counts the embedding and the loss as layers where asked to.
        layers = int(flags["num_layers"])
        layers += "account_for_embedding_in_pipeline_split" in flags
        layers += "account_for_loss_in_pipeline_split" in flags
        kw["virtual_pipeline_model_parallel_size"] = layers // (pp * int(per))
    layout = flags.get("pipeline_model_parallel_layout")
    if layout:
        pp = int(flags.get("pipeline_model_parallel_size", 1))
        chunks = len(layout.split("|"))
        if chunks > pp:
            kw["virtual_pipeline_model_parallel_size"] = chunks // pp
    # validate_args turns the layer-wise offload on with its count.
    if int(kw.get("cpu_offloading_num_layers", 0)) > 0:
        kw["cpu_offloading"] = True
    if "fp8_format" in kw:
        # Megatron-LM's --fp8-format is the config's fp8.
        kw["fp8"] = kw.pop("fp8_format")
    if "fp8" in kw:
        kw.setdefault("fp8_recipe", "tensorwise")
    # The parameters' and pipeline sends' dtype, as core_transformer_config_from_args sets
    # them from --bf16 / --fp16.
    dtype = torch.bfloat16 if "bf16" in flags else torch.half if "fp16" in flags else None
    if dtype is not None:
        kw["params_dtype"] = dtype
        kw["pipeline_dtype"] = dtype
    else:
        kw["pipeline_dtype"] = torch.float32
    cls = MLATransformerConfig if "multi_latent_attention" in flags else TransformerConfig
    return cls(**kw)


def main(paths):
    refused = 0
    for path in paths:
        try:
            config(parse(path))
            print(f"{path}: accepted")
        except Exception as e:  # Megatron-Core raises ValueError, AssertionError, TypeError
            refused += 1
            print(f"{path}: refused: {type(e).__name__}: {e}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
