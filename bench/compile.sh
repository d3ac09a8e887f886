#!/usr/bin/env bash
# bench/compile.sh — cold compile speed (issue 15): how long tfuse takes
# before it computes anything, cold (an empty $TFUSE_CACHE_DIR) and from its
# caches, as medians of --reps runs (default 5), cold and cached runs
# interleaved so that a slow spell of this shared machine hits both alike.
#
#   bench/compile.sh                    # Release build in build-bench/, 5 repetitions
#   bench/compile.sh --tfuse build/tfuse --reps 3 --no-record
#
# The figures, and their targets:
#
#   gpt2 cuda     `tfuse compile bench/models/gpt2.ir --mode=train --target=cuda
#                 --arch=sm_90 -o DIR` (NVRTC, no GPU needed): wall time, cold
#                 (< 1.5 s) and again from the cubin cache (< 100 ms)
#   gpt cpu       `tfuse bench bench/models/gpt.ir --mode=train --target=cpu
#                 --iters 1 --warmup 0`: from exec to the first step, i.e.
#                 the process's wall time less its step (step_ms) and less the
#                 second session bench makes (jit_ms_cached); cold (< 0.8 s)
#                 and from the object cache (< 100 ms); the same from a
#                 package (gpt.tfp, `tfuse compile --mode=train`) (< 100 ms)
#   mlp package   `tfuse run mlp.tfp --random-inputs` (examples/mlp.ir,
#                 `tfuse compile --mode=infer`): the process's CPU time, user +
#                 sys (< 50 ms)
#
# Where `tfuse compile` writes no .tfp the package lines say "not measured".
# Raw output (every run's output and times) goes to
# bench/results/<date>-compile/, the table to stdout and, unless
# --no-record, a dated section to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=compile.sh
# shellcheck source=bench/lib.sh
. bench/lib.sh

REPS=5
TFUSE_BIN=
RECORD=1
OUT=
while [ $# -gt 0 ]; do
    case "$1" in
    --reps) REPS="$2"; shift 2 ;;
    --tfuse) TFUSE_BIN="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --no-record) RECORD=0; shift ;;
    -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done
[ -n "$OUT" ] || OUT="bench/results/$(date -u +%Y-%m-%d)-compile"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
if [ -n "$TFUSE_BIN" ]; then
    TFUSE="$TFUSE_BIN"
    BUILD_TYPE="given ($TFUSE_BIN)"
else
    build_tfuse "$OUT"
fi
TFUSE="$(cd "$(dirname "$TFUSE")" && pwd)/$(basename "$TFUSE")"
[ -x "$TFUSE" ] || die "no tfuse at $TFUSE"

WORK="$(mktemp -d /tmp/tfuse-compile-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
RAW="$OUT/raw.txt"
: > "$RAW"

now_ns() { date +%s%N; }

# run_timed NAME CACHE_DIR CMD...: runs CMD with TFUSE_CACHE_DIR=CACHE_DIR,
# its output into $OUT/NAME.out; sets WALL_MS and CPU_MS (user + sys); 1
# when CMD fails (set -e then stops the script, except where the caller tests it).
run_timed() {
    local name="$1" cache="$2"; shift 2
    local t0 t1 rc=0
    t0=$(now_ns)
    TFUSE_CACHE_DIR="$cache" /usr/bin/time -f '%U %S' -o "$WORK/time" "$@" > "$OUT/$name.out" 2>&1 || rc=$?
    t1=$(now_ns)
    [ $rc -eq 0 ] || { tail -5 "$OUT/$name.out" >&2; echo "$name failed (exit $rc): $*" >&2; return 1; }
    WALL_MS=$(( (t1 - t0) / 1000000 ))
    CPU_MS=$(awk '{printf "%d", ($1 + $2) * 1000}' "$WORK/time")
    echo "$name wall_ms=$WALL_MS cpu_ms=$CPU_MS load=$(cut -d' ' -f1 /proc/loadavg)" >> "$RAW"
}

field() { awk -v k="$1:" '$1 == k {print $2; exit}' "$2"; }

# to the first step of a `tfuse bench --iters 1 --warmup 0` run (run_timed's last)
first_step_ms() {
    local out="$OUT/$1.out"
    awk -v w="$WALL_MS" -v s="$(field step_ms "$out")" -v c="$(field jit_ms_cached "$out")" 'BEGIN {printf "%d", w - s - c}'
}

median() { sort -n | awk '{a[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%d\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

cp bench/models/gpt.ir bench/models/gpt2.ir examples/mlp.ir "$WORK/"
# packages: tfuse compile writes MODEL.tfp beside MODEL.ir where this build has them
PKG=0
mkdir -p "$WORK/pkg-train" "$WORK/pkg-infer"
cp bench/models/gpt.ir "$WORK/pkg-train/"
cp examples/mlp.ir "$WORK/pkg-infer/"
if (cd "$WORK/pkg-train" && TFUSE_CACHE_DIR="$WORK/cache-pkg" "$TFUSE" compile gpt.ir --mode=train --target=cpu > "$OUT/pkg-compile-gpt.out" 2>&1) &&
   (cd "$WORK/pkg-infer" && TFUSE_CACHE_DIR="$WORK/cache-pkg" "$TFUSE" compile mlp.ir --mode=infer --target=cpu > "$OUT/pkg-compile-mlp.out" 2>&1) &&
   [ -f "$WORK/pkg-train/gpt.tfp" ] && [ -f "$WORK/pkg-infer/mlp.tfp" ]; then
    PKG=1
fi

declare -a CUDA_COLD CUDA_WARM CPU_COLD CPU_WARM PKG_GPT PKG_MLP
CUDA=1
for r in $(seq 1 "$REPS"); do
    echo "== repetition $r of $REPS" >&2
    # gpt2, cuda, through NVRTC
    if [ $CUDA -eq 1 ]; then
        rm -rf "$WORK/cache-cuda" "$WORK/gpt2-cuda"
        if run_timed "cuda-cold-$r" "$WORK/cache-cuda" "$TFUSE" compile "$WORK/gpt2.ir" --mode=train --target=cuda --arch=sm_90 -o "$WORK/gpt2-cuda"; then
            CUDA_COLD+=("$WALL_MS")
            run_timed "cuda-cached-$r" "$WORK/cache-cuda" "$TFUSE" compile "$WORK/gpt2.ir" --mode=train --target=cuda --arch=sm_90 -o "$WORK/gpt2-cuda" ||
                die "cuda-cached-$r failed"
            CUDA_WARM+=("$WALL_MS")
        else
            echo "   the cuda compile failed (no NVRTC? see $OUT/cuda-cold-$r.out): the cuda lines are not measured" >&2
            CUDA=0
        fi
    fi
    # gpt, cpu, to the first step
    rm -rf "$WORK/cache-cpu"
    run_timed "cpu-cold-$r" "$WORK/cache-cpu" "$TFUSE" bench "$WORK/gpt.ir" --mode=train --target=cpu --iters 1 --warmup 0
    CPU_COLD+=("$(first_step_ms "cpu-cold-$r")")
    run_timed "cpu-cached-$r" "$WORK/cache-cpu" "$TFUSE" bench "$WORK/gpt.ir" --mode=train --target=cpu --iters 1 --warmup 0
    CPU_WARM+=("$(first_step_ms "cpu-cached-$r")")
    if [ $PKG -eq 1 ]; then   # an empty cache: the package alone
        rm -rf "$WORK/cache-empty"
        run_timed "pkg-gpt-$r" "$WORK/cache-empty" "$TFUSE" bench "$WORK/pkg-train/gpt.tfp" --iters 1 --warmup 0
        PKG_GPT+=("$(first_step_ms "pkg-gpt-$r")")
        rm -rf "$WORK/cache-empty"
        run_timed "pkg-mlp-$r" "$WORK/cache-empty" "$TFUSE" run "$WORK/pkg-infer/mlp.tfp" --random-inputs
        PKG_MLP+=("$CPU_MS")
    fi
done

med() { if [ $# -eq 0 ]; then echo "not measured"; else printf '%s\n' "$@" | median; fi; }
all() { if [ $# -eq 0 ]; then echo "-"; else echo "$*"; fi; }
line() {   # what, target, values...
    local what="$1" target="$2"; shift 2
    local m; m=$(med "$@")
    [ "$m" = "not measured" ] && { echo "| $what | $target | not measured | - |"; return; }
    echo "| $what | $target | **$m** | $(all "$@") |"
}
{
    echo "| figure | target | median ms | runs (ms) |"
    echo "|---|---|---|---|"
    line "gpt2 train, cuda sm_90 compile, cold (wall)" "< 1500" "${CUDA_COLD[@]+"${CUDA_COLD[@]}"}"
    line "gpt2 train, cuda sm_90 compile, from the cache (wall)" "< 100" "${CUDA_WARM[@]+"${CUDA_WARM[@]}"}"
    line "gpt train, cpu, to the first step, cold (wall)" "< 800" "${CPU_COLD[@]+"${CPU_COLD[@]}"}"
    line "gpt train, cpu, to the first step, from the cache (wall)" "< 100" "${CPU_WARM[@]+"${CPU_WARM[@]}"}"
    if [ $PKG -eq 1 ]; then
        line "gpt train, cpu, to the first step, from a package (wall)" "< 100" "${PKG_GPT[@]+"${PKG_GPT[@]}"}"
        line "mlp infer, \`tfuse run mlp.tfp --random-inputs\` (user + sys)" "< 50" "${PKG_MLP[@]+"${PKG_MLP[@]}"}"
    else
        echo "| package | | not measured (\`tfuse compile\` wrote no .tfp) | - |"
    fi
} > "$OUT/table.md"
cat "$OUT/table.md"

if [ $RECORD -eq 1 ]; then
    {
        echo
        echo "## $(date -u '+%Y-%m-%d %H:%M') UTC — compile speed (bench/compile.sh)"
        echo
        echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs; load average (1 min) at the end: $(cut -d' ' -f1 /proc/loadavg)"
        echo "- tfuse: commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $TFUSE ($BUILD_TYPE)"
        echo "- command: \`bench/compile.sh --reps $REPS\`; raw output: \`${OUT#"$PWD"/}/\`"
        echo "- to the first step = the process's wall time less its step's (step_ms) and less bench's second session (jit_ms_cached)"
        echo
        cat "$OUT/table.md"
    } >> bench/RESULTS.md
fi
