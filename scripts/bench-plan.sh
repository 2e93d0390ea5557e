#!/usr/bin/env bash
# Whole-process planning time (load, rewrite, search, print), median of N runs: VGG16 (ONNX)
# on 8 GPUs, PipeDream's ResNet-50 graph on 8 GPUs, and Megatron-LM's GPTs (generated,
# structure-only) on Selene: 1.7 B on 32 GPUs, 39.1 B on 512, 1 T on 3,072.
# Usage: scripts/bench-plan.sh [RUNS]   (run from the repository root; builds --release)
set -euo pipefail
runs="${1:-11}"
cargo build --release --quiet --bin ralpc --example gpt
bin=target/release/ralpc
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
time_case() {
  local name="$1"; shift
  local times=()
  for _ in $(seq "$runs"); do
    local start end
    start=$(date +%s%N)
    "$bin" "$@" --json > /dev/null
    end=$(date +%s%N)
    times+=($(( (end - start) / 1000 )))
  done
  printf '%-28s median %8.1f ms over %s runs\n' "$name" \
    "$(printf '%s\n' "${times[@]}" | median | awk '{print $1 / 1000}')" "$runs"
}
time_case "vgg16 on 8 (onnx)" plan fixtures/onnx/vgg16/model.onnx --gpus 8
anchors=fixtures/anchors/pipedream
if [ -f "$anchors/resnet50/graph.txt" ]; then
  time_case "resnet50 graph.txt on 8" plan "$anchors/resnet50/graph.txt" --gpus 8 --link-bandwidth 1GB/s
fi
gpts=$(mktemp -d)
trap 'rm -rf "$gpts"' EXIT
target/release/examples/gpt --layers 24 --hidden 2304 --heads 24 -o "$gpts/gpt-1.7b.onnx" > /dev/null
target/release/examples/gpt --layers 48 --hidden 8192 --heads 64 -o "$gpts/gpt-39b.onnx" > /dev/null
target/release/examples/gpt --layers 128 --hidden 25600 --heads 160 -o "$gpts/gpt-1t.onnx" > /dev/null
megatron=(--cluster selene --precision fp16 --optimizer adam)
time_case "gpt 1.7B on 32 (3d)" plan "$gpts/gpt-1.7b.onnx" --gpus 32 --batch 512 "${megatron[@]}"
time_case "gpt 39.1B on 512 (3d)" plan "$gpts/gpt-39b.onnx" --gpus 512 --batch 1536 "${megatron[@]}"
time_case "gpt 1T on 3072 (3d)" plan "$gpts/gpt-1t.onnx" --gpus 3072 --batch 3072 "${megatron[@]}"
