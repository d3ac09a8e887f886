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
  # kernels are counted one way: bench, compile --stats and kernels.txt agree
  local dir; dir=$(mktemp -d)
  local stats; stats=$("$tfuse" compile "$@" --target=cuda-emu --stats --dump-kernels="$dir" 2>&1)
  local kb ks kd multi parts=0
  kb=$(sed -n 's/^kernels: //p' <<<"$out") ks=$(sed -n 's/^kernels: //p' <<<"$stats")
  kd=$(sed -n '1s/^# \([0-9]*\) kernels.*/\1/p' "$dir/kernels.txt" 2>/dev/null)
  if [ -n "$kb" ] && [ "$kb" = "$ks" ] && [ "$kb" = "$kd" ]; then ok; else bad "$label: kernels: bench $kb, --stats $ks, kernels.txt $kd"; fi
  # an optimizer's update chains (kernels.txt: one entry each) run as one multi-tensor launch
  multi=$("$tfuse" compile "$@" --explain 2>&1 | sed -n 's/.*: \(fuse\.[0-9]*\) (multi):.*/\1/p' | head -n 1)
  [ -n "$multi" ] && parts=$(grep -c "(region $multi)" "$dir/kernels.txt")
  rm -rf "$dir"
  if [ "$parts" -ge 2 ]; then   # one launch, or a few when the buffers pass 4 KiB of parameters
    local launched
    launched=$(grep 'one multi-tensor launch of' <<<"$out" | sort -u | awk '{ for (i = 1; i < NF; i++) if ($i == "of") n += $(i + 1) } END { print n + 0 }')
    if [ "${launched:-0}" -eq "$parts" ]; then ok
    else bad "$label: $multi's $parts update chains, ${launched:-0} in multi-tensor launches"; fi
  fi
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
