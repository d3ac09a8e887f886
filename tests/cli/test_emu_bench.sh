#!/usr/bin/env bash
# test_emu_bench.sh TFUSE SRC — `tfuse bench --target=cuda-emu` on every example
# and every model in bench/models, train and infer: each starts, runs a step,
# and reports kernels_fallback: 0 (nothing of the step runs on the host) and
# the step as one CUDA graph. The bench models run at small sizes (--dim): what
# runs where does not depend on the sizes, and cuda-emu runs every thread.
set -u
tfuse=$1 src=$2
. "$src/tests/cli/lib.sh"
export TFUSE_CACHE_DIR="${TFUSE_CACHE_DIR:-$PWD/emu-cache}"
check() {   # check LABEL -- tfuse bench ARGS...
  local label=$1; shift 2
  local out
  out=$("$tfuse" bench "$@" --target=cuda-emu --iters 1 --warmup 0 --cuda-explain 2>&1)
  local rc=$?
  if [ $rc -ne 0 ]; then bad "$label: exit $rc: $(tail -n 3 <<<"$out")"; return; fi
  if ! grep -q '^kernels_fallback: 0$' <<<"$out"; then
    bad "$label: $(grep -E '^kernels_fallback|runs (its library op )?on the host' <<<"$out" | head -n 5)"
  elif ! grep -q 'each step runs as one CUDA graph' <<<"$out"; then
    bad "$label: not one CUDA graph: $(grep -E 'launched kernel by kernel' <<<"$out")"
  else ok; fi
}
for f in "$src"/examples/*.ir; do
  for mode in train infer; do check "$(basename "$f") $mode" -- "$f" --mode=$mode; done
done
declare -A small=(
  [mlp]="--dim B=8 --dim H=32"
  [gpt]="--dim B=2 --dim T=16 --dim V=64 --dim E=64 --dim H=2 --dim D=32 --dim F=128"
  [gpt2]="--dim B=1 --dim T=16 --dim V=64 --dim E=64 --dim H=2 --dim D=32 --dim F=128"
  [resnet]="--dim N=2 --dim C1=8 --dim C2=8 --dim C3=16"
  [resnet18]="--dim N=2 --dim C1=8 --dim C2=8 --dim C3=16 --dim C4=16"
)
for f in "$src"/bench/models/*.ir; do
  name=$(basename "$f" .ir)
  # shellcheck disable=SC2086
  for mode in train infer; do check "bench/models/$name.ir $mode" -- "$f" --mode=$mode ${small[$name]:-}; done
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
