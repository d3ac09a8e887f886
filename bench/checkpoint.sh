#!/usr/bin/env bash
# bench/checkpoint.sh — what activation checkpointing costs in step time on
# the cpu target: each bench model's train step unconstrained and at a
# memory budget (--checkpoint=auto --memory-budget=PCT%), the lowest of the
# budgets asked for that compiles (50% first, then the next), timed in
# interleaved repetitions (both configurations once per repetition, one
# after the other), so that a machine whose load drifts skews both alike.
#
#   bench/checkpoint.sh [--tfuse PATH] [--reps N] [--iters N] [--warmup N]
#                       [--budgets "50 55 60"] [--models "gpt resnet"] [--out DIR]
#
# Prints per model: planned peaks, the budget met, recomputed ops and FLOP
# overhead, the median step time of each configuration over the repetitions
# (with the lowest and highest), and the median per-repetition ratio
# (checkpointed / unconstrained) with its range. DIR (default
# bench/results/DATE-HHMM-checkpoint, UTC, so that a second run on the same
# day does not overwrite the first) keeps every run's raw output and
# summary.txt.
set -eu
cd "$(dirname "$0")/.."
TFUSE=build/tfuse REPS=5 ITERS=10 WARMUP=2 BUDGETS="50 55 60 65 70" MODELS="gpt resnet"
OUT=bench/results/$(date -u +%Y-%m-%d-%H%M)-checkpoint
while [ $# -gt 0 ]; do
    case "$1" in
    --tfuse) TFUSE=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --budgets) BUDGETS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "checkpoint.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$TFUSE" ] || { echo "checkpoint.sh: no tfuse at $TFUSE: build it (cmake -DCMAKE_BUILD_TYPE=Release) or pass --tfuse" >&2; exit 1; }
mkdir -p "$OUT"
work=$(mktemp -d)   # compile writes MODEL.tfp beside the working directory: keep that out of the tree
trap 'rm -rf "$work"' EXIT
top=$PWD
abs() { case "$1" in /*) echo "$1" ;; *) echo "$top/$1" ;; esac; }
TFUSE=$(abs "$TFUSE") OUT=$(abs "$OUT")
stat() { sed -n "s/^$1: //p" "$2" | head -1; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
{
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -srm); $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# tfuse $($TFUSE --version 2>&1 | head -1), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
echo "# $REPS interleaved repetitions of --iters $ITERS --warmup $WARMUP; budgets tried: $BUDGETS"
} | tee "$OUT/summary.txt"
for model in $MODELS; do
    file=$top/bench/models/$model.ir
    pct=""
    for b in $BUDGETS; do   # the lowest budget that compiles
        if (cd "$work" && "$TFUSE" compile "$file" --checkpoint=auto --memory-budget="$b%" --stats) > "$OUT/$model-compile-$b.txt" 2>&1; then
            pct=$b
            break
        fi
    done
    (cd "$work" && "$TFUSE" compile "$file" --stats) > "$OUT/$model-compile-none.txt" 2>&1
    [ -n "$pct" ] || { echo "$model: no budget of $BUDGETS compiles" | tee -a "$OUT/summary.txt"; continue; }
    : > "$work/base" && : > "$work/ck" && : > "$work/ratio"
    for r in $(seq 1 "$REPS"); do
        (cd "$work" && "$TFUSE" bench "$file" --iters "$ITERS" --warmup "$WARMUP") > "$OUT/$model-none-rep$r.txt" 2>&1
        (cd "$work" && "$TFUSE" bench "$file" --iters "$ITERS" --warmup "$WARMUP" --checkpoint=auto \
            --memory-budget="$pct%") > "$OUT/$model-ck$pct-rep$r.txt" 2>&1
        a=$(stat step_ms "$OUT/$model-none-rep$r.txt") c=$(stat step_ms "$OUT/$model-ck$pct-rep$r.txt")
        echo "$a" >> "$work/base"; echo "$c" >> "$work/ck"
        awk -v a="$a" -v c="$c" 'BEGIN {printf "%.4f\n", c / a}' >> "$work/ratio"
        echo "$model rep $r: unconstrained $a ms, at $pct% $c ms" >&2
    done
    p0=$(stat peak_bytes "$OUT/$model-compile-none.txt") p1=$(stat peak_bytes "$OUT/$model-compile-$pct.txt")
    {
    echo
    echo "model: $model"
    echo "peak_bytes: $p0 unconstrained, $p1 at --memory-budget=$pct% ($(awk -v a="$p0" -v b="$p1" 'BEGIN {printf "%.1f%%", 100 * b / a}'))"
    echo "recomputed_ops: $(stat recomputed_ops "$OUT/$model-compile-$pct.txt"), recompute_overhead_permille: $(stat recompute_overhead_permille "$OUT/$model-compile-$pct.txt")"
    echo "step_ms unconstrained: $(median < "$work/base") ($(sort -g "$work/base" | head -1)-$(sort -g "$work/base" | tail -1))"
    echo "step_ms at $pct%: $(median < "$work/ck") ($(sort -g "$work/ck" | head -1)-$(sort -g "$work/ck" | tail -1))"
    echo "ratio: $(median < "$work/ratio") ($(sort -g "$work/ratio" | head -1)-$(sort -g "$work/ratio" | tail -1))"
    } | tee -a "$OUT/summary.txt"
done
