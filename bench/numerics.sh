#!/usr/bin/env bash
# bench/numerics.sh [--reps N] [--threads N] [--out DIR] — 16-bit steps against fp32 on the cpu target (issue 33's
# lever 2): bench/models/gpt.ir and mlp.ir, train and infer, in fp32 and in bf16 and fp16 under --numerics=fast (the
# default) and --numerics=exact. Each repetition runs every row once, one after the other (`tfuse bench`, 10 steps
# after 3 of warm-up, the median); the table gives each row's median step over repetitions and, per repetition, the
# 16-bit step against the fp32 one of the same repetition (median and range of the ratios; below 1 is faster than
# fp32). Targets (issue 33): bf16 fast at most 1/1.3 = 0.77 of fp32; fp16 fast at most 1.2. Raw output: DIR (default
# bench/results/<date>-numerics/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
reps=5 threads=$(nproc) out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) reps=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: bench/numerics.sh [--reps N] [--threads N] [--out DIR]" >&2; exit 2 ;;
    esac
done
out=${out:-$ROOT/bench/results/$(date -u +%Y-%m-%d-%H%M)-numerics}
mkdir -p "$out"
tfuse=$ROOT/build/tfuse
rows=("fp32:fast" "bf16:fast" "bf16:exact" "fp16:fast" "fp16:exact")
{
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD), $(uname -m), $threads threads, $reps repetitions, $(date -u +%Y-%m-%dT%H:%MZ)"
    for r in $(seq 1 "$reps"); do
        for model in gpt mlp; do
            for mode in train infer; do
                for row in "${rows[@]}"; do
                    IFS=: read -r prec num <<<"$row"
                    ms=$("$tfuse" bench "$ROOT/bench/models/$model.ir" --target=cpu --mode=$mode --precision=$prec \
                         --numerics=$num --iters 10 --warmup 3 --threads "$threads" | sed -n 's/^step_ms: //p')
                    echo "rep $r $model $mode $prec $num $ms"
                done
            done
        done
    done
} | tee "$out/raw.txt"
python3 - "$out/raw.txt" <<'PY' | tee "$out/table.md"
import collections, statistics, sys
t = collections.defaultdict(dict)   # (model, mode, rep) -> {row: ms}
for line in open(sys.argv[1]):
    f = line.split()
    if f and f[0] == "rep":
        t[(f[2], f[3], int(f[1]))][f[4] + " " + f[5]] = float(f[6])
print("| model | mode | precision | numerics | step ms (median) | / fp32 (median, range) |\n|---|---|---|---|---|---|")
for model in ("gpt", "mlp"):
    for mode in ("train", "infer"):
        reps = [v for (m, md, _), v in sorted(t.items()) if m == model and md == mode]
        if not reps:
            continue
        for row in ("fp32 fast", "bf16 fast", "bf16 exact", "fp16 fast", "fp16 exact"):
            ms = [v[row] for v in reps]
            r = [v[row] / v["fp32 fast"] for v in reps]
            p, n = row.split()
            ratio = "—" if p == "fp32" else f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"
            print(f"| {model} | {mode} | {p} | {n if p != 'fp32' else '—'} | {statistics.median(ms):.2f} | {ratio} |")
PY
