#!/bin/bash
# The interleaved before/after runs behind bench/RESULTS.md's 2026-11-24
# "cpu: reduced precision" section. BASE: tfuse built at 6289657 (main before
# the branch), NEW: this branch; both Release, same machine, same flags.
# Usage: run.sh BASE_TFUSE NEW_TFUSE OUTDIR [REPS]
set -u
base=$1 new=$2 out=$3 reps=${4:-5}
mkdir -p "$out"
for r in $(seq 1 "$reps"); do
  for model in mlp gpt; do
    if [ $model = mlp ]; then it="--iters 20 --warmup 3"; else it="--iters 5 --warmup 1"; fi
    for prec in fp32 bf16 fp16; do
      for which in base new; do
        bin=$base; [ $which = new ] && bin=$new
        f="$out/$model.$prec.$which.$r.txt"
        { echo "loadavg: $(cat /proc/loadavg)"; "$bin" bench bench/models/$model.ir --target=cpu --precision=$prec $it; } > "$f" 2>&1
        echo "$r $model $prec $which $(grep '^step_ms:' "$f")"
      done
    done
  done
done
