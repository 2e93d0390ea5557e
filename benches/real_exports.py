#!/usr/bin/env python3
"""Exports of models the fixtures do not have train on 4 ranks as on one.

    python3 benches/real_exports.py [--out DIR] [--only NAME,...] [--plan "ARGS"]

Each model (torchvision and Hugging Face transformers, small random configurations: no hub
access) is exported with both of PyTorch's ONNX exporters (TorchScript `_ts`, dynamo
`_dy`), planned by ralpc for 1 GPU and for 4 (default plans, or the 4-GPU plan `--plan`
asks for, e.g. `--plan "--strategy 3d --tensor-parallel 2"` for Megatron's split of the
decoders), and each plan runs 2 steps with `ralpc run`; the losses are printed side by
side with their largest relative difference. An export PyTorch itself cannot write is
reported and skipped. `RALPC` names another ralpc binary.

Needs torch 2.15 with torchvision, transformers, onnx==1.22.0 and onnxscript (about 3 GB;
CI never installs them) and a release build (`cargo build --release`). On 2026-11-29,
afternoon, its 51 models gave 93 exports matching on default plans (largest difference
4.2e-7 relative; PyTorch could not export 12; BART's dynamo export is refused by name) and,
with `--plan "--strategy 3d --tensor-parallel 2"`, 23 exports of the 20 decoders matching
(largest 3.1e-9; the others refused by name: docs/testing.md).
"""
import argparse
import json
import os
import subprocess
import sys
import warnings

import torch
import torch.nn as nn

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RALPC = os.environ.get("RALPC", os.path.join(ROOT, "target", "release", "ralpc"))


class Output(nn.Module):
    """The first tensor a model returns (a dict's `key`, a tuple's first)."""

    def __init__(self, model, key=None, arg=None):
        super().__init__()
        # `arg`: the keyword the model takes its input by (`input_ids`).
        self.model, self.key, self.arg = model, key, arg

    def forward(self, x):
        out = self.model(**{self.arg: x}) if self.arg else self.model(x)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out[self.key] if self.key in out else list(out.values())[0]
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out


def vision():
    import torchvision.models as m
    import torchvision.models.segmentation as seg
    import torchvision.models.video as vid

    image, clip = torch.randn(4, 3, 64, 64), torch.randn(2, 3, 4, 32, 32)
    return {
        "mobilenet_v3_small": (lambda: m.mobilenet_v3_small(num_classes=10), image),
        "shufflenet_v2": (lambda: m.shufflenet_v2_x0_5(num_classes=10), image),
        "squeezenet1_1": (lambda: m.squeezenet1_1(num_classes=10), image),
        "googlenet": (lambda: m.googlenet(num_classes=10, aux_logits=False, init_weights=True), image),
        "regnet_y_400mf": (lambda: m.regnet_y_400mf(num_classes=10), image),
        "mnasnet0_5": (lambda: m.mnasnet0_5(num_classes=10), image),
        "resnext_tiny": (lambda: m.resnet.ResNet(m.resnet.Bottleneck, [1, 1, 1, 1], groups=8,
                                                 width_per_group=8, num_classes=10), image),
        "swin_t": (lambda: m.swin_t(num_classes=10), image),
        "swin_v2_t": (lambda: m.swin_v2_t(num_classes=10), image),
        "efficientnet_v2_s": (lambda: m.efficientnet_v2_s(num_classes=10), image),
        "alexnet": (lambda: m.alexnet(num_classes=10), image),
        "deeplabv3_mnv3": (lambda: Output(seg.deeplabv3_mobilenet_v3_large(
            num_classes=4, weights_backbone=None, aux_loss=False), "out"), image[:2]),
        "lraspp_mnv3": (lambda: Output(seg.lraspp_mobilenet_v3_large(
            num_classes=4, weights_backbone=None), "out"), image[:2]),
        "r3d_18": (lambda: vid.r3d_18(num_classes=5), clip),
        "r2plus1d_18": (lambda: vid.r2plus1d_18(num_classes=5), clip),
        "resnet18": (lambda: m.resnet18(num_classes=10), image),
        "vgg11_bn": (lambda: m.vgg11_bn(num_classes=10), image),
        "densenet121": (lambda: m.densenet121(num_classes=10), image),
        "mobilenet_v2": (lambda: m.mobilenet_v2(num_classes=10), image),
        "efficientnet_b0": (lambda: m.efficientnet_b0(num_classes=10), image),
        "convnext_tiny": (lambda: m.convnext_tiny(num_classes=10), image),
        "inception_v3": (lambda: m.inception_v3(num_classes=10, aux_logits=False,
                                                init_weights=True), torch.randn(2, 3, 96, 96)),
        "vit_small": (lambda: m.VisionTransformer(image_size=64, patch_size=16, num_layers=2,
                                                  num_heads=4, hidden_dim=64, mlp_dim=128,
                                                  num_classes=10), image),
    }


def text():
    import transformers as tf

    ids = torch.randint(0, 100, (4, 16))
    small = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=32)

    def lm(make):
        return lambda: Output(make(), "logits", arg="input_ids")

    cases = {
        "bert": lm(lambda: tf.BertForSequenceClassification(tf.BertConfig(**small, num_labels=5))),
        "distilbert": lm(lambda: tf.DistilBertForSequenceClassification(tf.DistilBertConfig(
            vocab_size=100, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
            max_position_embeddings=32, num_labels=5))),
        "albert": lm(lambda: tf.AlbertForSequenceClassification(tf.AlbertConfig(
            **small, embedding_size=32, num_labels=5))),
        "roberta": lm(lambda: tf.RobertaForSequenceClassification(tf.RobertaConfig(
            **small, num_labels=3, pad_token_id=1))),
        "electra": lm(lambda: tf.ElectraForSequenceClassification(tf.ElectraConfig(
            **small, embedding_size=32, num_labels=3))),
        "hf_gpt2": lm(lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32))),
        "opt": lm(lambda: tf.OPTForCausalLM(tf.OPTConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            ffn_dim=128, max_position_embeddings=32, word_embed_proj_dim=64))),
        "bloom": lm(lambda: tf.BloomForCausalLM(tf.BloomConfig(vocab_size=100, hidden_size=64,
                                                              n_layer=2, n_head=4))),
        "phi": lm(lambda: tf.PhiForCausalLM(tf.PhiConfig(**small))),
        "gpt_neox": lm(lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**small))),
        "llama": lm(lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**small, num_key_value_heads=2))),
        "qwen2": lm(lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**small, num_key_value_heads=2))),
        "gemma": lm(lambda: tf.GemmaForCausalLM(tf.GemmaConfig(**small, num_key_value_heads=1,
                                                              head_dim=16))),
        "mistral": lm(lambda: tf.MistralForCausalLM(tf.MistralConfig(
            **small, num_key_value_heads=2, sliding_window=8))),
        "qwen3": lm(lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**small, num_key_value_heads=2,
                                                              head_dim=16))),
        "phi3": lm(lambda: tf.Phi3ForCausalLM(tf.Phi3Config(**small, num_key_value_heads=2,
                                                           pad_token_id=0))),
        "gemma2": lm(lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(
            **small, num_key_value_heads=2, head_dim=16))),
        "stablelm": lm(lambda: tf.StableLmForCausalLM(tf.StableLmConfig(
            **small, num_key_value_heads=2))),
        "starcoder2": lm(lambda: tf.Starcoder2ForCausalLM(tf.Starcoder2Config(
            **small, num_key_value_heads=2))),
        "falcon": lm(lambda: tf.FalconForCausalLM(tf.FalconConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4))),
        "gptj": lm(lambda: tf.GPTJForCausalLM(tf.GPTJConfig(
            vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32, rotary_dim=8))),
        "codegen": lm(lambda: tf.CodeGenForCausalLM(tf.CodeGenConfig(
            vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32, rotary_dim=8))),
        "gpt_bigcode": lm(lambda: tf.GPTBigCodeForCausalLM(tf.GPTBigCodeConfig(
            vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32))),
        "gpt_neo": lm(lambda: tf.GPTNeoForCausalLM(tf.GPTNeoConfig(
            vocab_size=100, hidden_size=64, num_layers=2, num_heads=4, max_position_embeddings=32,
            attention_types=[[["global", "local"], 1]], window_size=8))),
        "mpt": lm(lambda: tf.MptForCausalLM(tf.MptConfig(
            vocab_size=100, d_model=64, n_layers=2, n_heads=4, max_seq_len=32))),
        "bart": lm(lambda: tf.BartForSequenceClassification(tf.BartConfig(
            vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, max_position_embeddings=32, num_labels=3))),
        "deberta_v2": lm(lambda: tf.DebertaV2ForSequenceClassification(tf.DebertaV2Config(
            **small, num_labels=3))),
        "mobilebert": lm(lambda: tf.MobileBertForSequenceClassification(tf.MobileBertConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, embedding_size=32, intra_bottleneck_size=32,
            max_position_embeddings=32, num_labels=3))),
    }
    cases = {name: (make, ids) for name, make in cases.items()}
    cases["t5enc"] = (lambda: Output(tf.T5EncoderModel(tf.T5Config(
        vocab_size=100, d_model=64, d_kv=16, num_layers=2, num_heads=4, d_ff=128)),
        "last_hidden_state", arg="input_ids"), ids)
    wav2vec2 = tf.Wav2Vec2Config(
        vocab_size=12, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    cases["wav2vec2"] = (lambda: Output(tf.Wav2Vec2ForCTC(wav2vec2), "logits",
                                        arg="input_values"), torch.randn(2, 1600))
    return cases


def export(make, x, path, dynamo):
    torch.manual_seed(0)
    model = make().eval()
    torch.onnx.export(model, (x,), path, dynamo=dynamo, input_names=["x"],
                      output_names=["out"], opset_version=18 if dynamo else 17,
                      external_data=False)


def ralpc(*args, cwd):
    return subprocess.run([RALPC, *args], cwd=cwd, capture_output=True, text=True)


def check(path, out, plan_args=()):
    """Losses of 2 steps of the plans for 1 and 4 GPUs (`plan_args` for 4), or why not."""
    losses = {}
    for gpus in (1, 4):
        plan = os.path.join(out, f"{os.path.basename(path)}.{gpus}")
        extra = list(plan_args) if gpus > 1 else []
        done = ralpc("plan", path, "--gpus", str(gpus), "-o", plan, "--force", "-q", *extra,
                     cwd=out)
        if done.returncode:
            return f"plan for {gpus} GPUs failed: {done.stderr.strip().splitlines()[-1]}"
        done = ralpc("run", plan, "--steps", "2", "--json", cwd=out)
        if done.returncode:
            return f"run on {gpus} ranks failed: {done.stderr.strip()[-300:]}"
        losses[gpus] = json.loads(done.stdout)["losses"]
    one, four = losses[1], losses[4]
    worst = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(one, four))
    return one, four, worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "target", "real_exports"))
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--plan", default="", help="ralpc plan options for 4 GPUs")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = {n for n in args.only.split(",") if n}
    worst, failures = 0.0, 0
    for name, (make, x) in {**vision(), **text()}.items():
        if only and name not in only:
            continue
        for tag, dynamo in (("ts", False), ("dy", True)):
            path = os.path.join(args.out, f"{name}_{tag}.onnx")
            try:
                if not os.path.exists(path):
                    export(make, x, path, dynamo)
            except Exception as e:  # PyTorch's own exporter refused the model
                print(f"{name}_{tag}: not exported ({type(e).__name__})", flush=True)
                continue
            result = check(path, args.out, args.plan.split())
            if isinstance(result, str):
                failures += 1
                print(f"{name}_{tag}: FAILED: {result}", flush=True)
                continue
            one, four, rel = result
            worst = max(worst, rel)
            print(f"{name}_{tag}: 1 GPU {one}  4 GPUs {four}  rel {rel:.1e}", flush=True)
    print(f"largest relative difference {worst:.1e}; {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
