#!/usr/bin/env bash
# Whole-process planning time (load, rewrite, search, print), median of N runs, for the
# issue's cases: VGG16 (ONNX) on 8 GPUs and PipeDream's ResNet-50 graph on 8 GPUs.
# Usage: scripts/bench-plan.sh [RUNS]   (run from the repository root; builds --release)
set -euo pipefail
runs="${1:-11}"
cargo build --release --quiet
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
anchors=../shared/anchors/pipedream
if [ -f "$anchors/resnet50/graph.txt" ]; then
  time_case "resnet50 graph.txt on 8" plan "$anchors/resnet50/graph.txt" --gpus 8 --link-bandwidth 1GB/s
fi
