#!/usr/bin/env bash
# bench/ab_lib.sh DIR_A DIR_B [--reps N] [--threads N] [--models "A B"] — the same tfuse binary (build/tfuse) over two
# builds of libtfuse (each DIR holds a libtfuse.so.0 and libtfuse-llvm.so, copied from build/ before and after a
# change), interleaved: every repetition times each model and mode with A, then with B (`tfuse bench --target=cpu`,
# 100 steps after 10 of warm-up, the median). Prints the raw lines and, per model and mode, B/A's median and range over
# the repetitions. How the pool and small-GEMM changes of 2026-11-28 were measured (bench/RESULTS.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bench/ab_lib.sh DIR_A DIR_B [--reps N] [--threads N] [--models \"A B\"]" >&2; exit 2; }
a=$1 b=$2; shift 2
reps=5 threads=2 models="small_gpt small_mlp small_conv mlp"
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) reps=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        *) echo "bench/ab_lib.sh: unknown flag $1" >&2; exit 2 ;;
    esac
done
for d in "$a" "$b"; do [ -f "$d/libtfuse.so.0" ] || { echo "bench/ab_lib.sh: no libtfuse.so.0 in $d" >&2; exit 1; }; done
raw=$(mktemp)
for r in $(seq 1 "$reps"); do
    for m in $models; do
        for mode in infer train; do
            for v in A B; do
                d=$a; [ $v = B ] && d=$b
                ms=$(LD_LIBRARY_PATH=$d "$ROOT/build/tfuse" bench "$ROOT/bench/models/$m.ir" --mode=$mode --target=cpu \
                     --threads "$threads" --iters 100 --warmup 10 | sed -n 's/^step_ms: //p')
                echo "$r $m $mode $v $ms" | tee -a "$raw"
            done
        done
    done
done
python3 - "$raw" <<'PY'
import collections, statistics, sys
t = collections.defaultdict(dict)
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) == 5: t[(f[1], f[2], f[0])][f[3]] = float(f[4])
print("| model | mode | A ms | B ms | B/A (median, range) |\n|---|---|---|---|---|")
for m, mode in sorted({(k[0], k[1]) for k in t}):
    reps = [v for (x, y, _), v in t.items() if x == m and y == mode and len(v) == 2]
    r = [v["B"] / v["A"] for v in reps]
    print(f"| {m} | {mode} | {statistics.median(v['A'] for v in reps):.4f} | {statistics.median(v['B'] for v in reps):.4f} | "
          f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) |")
PY
rm -f "$raw"
