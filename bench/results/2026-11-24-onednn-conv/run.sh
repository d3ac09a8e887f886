#!/usr/bin/env bash
# The oneDNN-vs-im2col convolution measurement of 2026-11-24 (bench/RESULTS.md):
# resnet train and infer, both paths interleaved, REPS repetitions each, one
# raw `tfuse bench` output per run here, /proc/loadavg before each.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/2026-11-24-onednn-conv
tfuse=${TFUSE:-build/tfuse}
reps=${REPS:-5}
for r in $(seq 1 "$reps"); do
  for mode in train infer; do
    for conv in onednn im2col; do
      f=$out/resnet-$mode-$conv-$r.txt
      { echo "loadavg: $(cat /proc/loadavg)"; "$tfuse" bench bench/models/resnet.ir --target=cpu --mode=$mode --iters 20 --warmup 3 --cpu-conv=$conv; } > "$f" 2>&1
      echo "$mode $conv $r $(grep '^step_ms:' "$f")"
    done
  done
done
