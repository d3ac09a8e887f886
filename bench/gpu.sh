#!/usr/bin/env bash
# bench/gpu.sh — the GPU benchmark (issue 7): tfuse's cuda target against
# PyTorch eager, torch.compile (default) and torch.compile(mode="max-autotune")
# on the same models, batch and precision, in one run, with one table of ratios.
#
#   bench/gpu.sh                          # everything below (long: max-autotune compiles take minutes)
#   bench/gpu.sh --configs mlp:bf16 --peers "eager compile" --no-record --out bench/results/today
#   bench/gpu.sh --report-only --out bench/results/today     # table (and RESULTS.md) of what is there
#   bench/gpu.sh --dry-run                # no GPU needed: tiny sizes on the CPU, checks the script
#
# Configurations (MODEL:PRECISION), each in train and infer mode:
#   mlp:fp32 mlp:bf16            MLP 784-4096-4096-10, batch 1024 (--dim B=1024 --dim H=4096)
#   resnet18:fp32 resnet18:bf16  ResNet-18 for 32x32 images, batch 256
#   gpt2:bf16                    GPT-2 small shape: 12 layers, E=768, T=1024, V=50257, batch 8
#
# For each: `tfuse bench MODEL --target=cuda --precision=P` twice (an empty
# kernel cache, then the cache it left), once with --profile (bytes and GB/s
# per kernel against a device-to-device copy) and, training, once at
# --checkpoint=auto --memory-budget=50%; and bench/peers.py --device cuda for
# eager, compile and compile-max; the compile peers also run twice (an empty
# TORCHINDUCTOR_CACHE_DIR, then the same directory again) for compile time
# cold and cached. The order is by passes, so that --deadline cuts the least
# wanted: (1) tfuse and compile, (2) the cached runs and eager, (3) tfuse's
# profile and checkpointed runs, (4) max-autotune. Step times are medians
# of --iters (>= 50) steps after --warmup steps (peers: CUDA events; tfuse
# bench: the host clock until its first output can be read); peak
# memory is torch.cuda.max_memory_allocated (tfuse: device_bytes, what
# its session allocated). Where tfuse's cuda target does not work yet, its
# cells say "n/a (reason)" and the peers are measured all the same.
#
# Everything lands in bench/results/<date>-<gpu>/: nvidia-smi.txt, build logs,
# one MODEL__PRECISION__MODE__PEER.txt per measurement (the raw key: value
# output; stderr beside it as .err), table.md; a dated section goes to
# bench/RESULTS.md. Runs into the same --out directory add up, so the work
# can be split over several calls and reported once with --report-only.
#
# Options:
#   --configs "M:P ..."  default "mlp:fp32 mlp:bf16 resnet18:fp32 resnet18:bf16 gpt2:bf16"
#   --modes "A B"        default "train infer"
#   --peers "A B"        default "eager compile compile-max"
#   --no-cached          skip the second (warm-cache) runs of tfuse and torch.compile
#   --no-profile         skip tfuse's --profile run (per-kernel bytes, GB/s, share of a device copy)
#   --no-ckpt            skip tfuse's train step at --checkpoint=auto --memory-budget=50%
#   --deadline S         start nothing after S seconds (20 s of slack), cut the running measurement
#                        at S, and mark what was not run: for a device call with a hard limit.
#                        Measurements go in passes, most wanted first (below)
#   --iters N            timed steps (default 50)       --warmup N   untimed steps first (default 10)
#   --dim MODEL:K=V      override a dim of one model (repeatable)
#   --python PATH        the Python with CUDA torch (default: python3 if it has torch, else a venv)
#   --venv DIR           venv made when python3 has no torch ($TFUSE_BENCH_VENV or ~/.cache/tfuse-bench-venv-gpu)
#   --no-install         do not pip-install into that venv
#   --tfuse PATH         use this binary instead of building build-bench/ (-DTFUSE_WITH_LLVM=OFF)
#   --out DIR            default bench/results/<date>-<gpu name>
#   --timeout S          limit for each measurement (default 1800 s)
#   --no-record          do not append to bench/RESULTS.md
#   --report-only        only print (and record) the table of --out DIR
#   --dry-run            no GPU checks: peers on the CPU at tiny dims, 2 steps, nvidia-smi skipped,
#                        tfuse on --target=cuda-emu (the generated CUDA C run on the host); records nothing
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
COMMAND="bench/gpu.sh$(printf ' %q' "$@")"
BENCH_NAME=bench/gpu.sh
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

CONFIGS="mlp:fp32 mlp:bf16 resnet18:fp32 resnet18:bf16 gpt2:bf16"
MODES="train infer" PEERS="eager compile compile-max" CACHED=1 ITERS=50 WARMUP=10
PYTHON="" VENV="${TFUSE_BENCH_VENV:-$HOME/.cache/tfuse-bench-venv-gpu}" INSTALL=1 TFUSE="" OUT="" TIMEOUT=1800
RECORD=1 REPORT_ONLY=0 DRY=0 PROFILE=1 CKPT=1 DEADLINE=""
declare -A DIMS=([mlp]="B=1024 H=4096")

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --configs) CONFIGS="$2"; shift 2 ;;
        --modes) MODES="$2"; shift 2 ;;
        --peers) PEERS="$2"; shift 2 ;;
        --no-cached) CACHED=0; shift ;;
        --no-profile) PROFILE=0; shift ;;
        --no-ckpt) CKPT=0; shift ;;
        --deadline) DEADLINE="$2"; shift 2
                    [[ "$DEADLINE" =~ ^[0-9]+$ ]] && [ "$DEADLINE" -ge 60 ] || die "--deadline wants whole seconds, at least 60 (got $2)" ;;
        --iters) ITERS="$2"; shift 2 ;;
        --warmup) WARMUP="$2"; shift 2 ;;
        --dim) m="${2%%:*}"; kv="${2#*:}"; [ "$m" != "$2" ] || die "--dim wants MODEL:K=V, got $2"
               DIMS[$m]="${DIMS[$m]:-} $kv"; shift 2 ;;
        --python) PYTHON="$2"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        --tfuse) TFUSE="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --no-record) RECORD=0; shift ;;
        --report-only) REPORT_ONLY=1; shift ;;
        --dry-run) DRY=1; RECORD=0; shift ;;
        -h|--help) usage ;;
        *) echo "bench/gpu.sh: unknown option $1" >&2; usage ;;
    esac
done
for p in $PEERS; do
    case "$p" in eager|compile|compile-max) ;; *) die "unknown peer $p (eager, compile, compile-max)" ;; esac
done

DEVICE=cuda TARGET=cuda
if [ "$DRY" = 1 ]; then
    DEVICE=cpu TARGET=cuda-emu ITERS=2 WARMUP=1
    DIMS[mlp]="B=8 H=32"
    DIMS[resnet18]="N=2 C1=8 C2=8 C3=16 C4=16 ${DIMS[resnet18]:-}"
    DIMS[gpt2]="B=1 T=16 V=64 E=32 H=2 D=16 F=128 ${DIMS[gpt2]:-}"
fi

[ "$REPORT_ONLY" = 0 ] || [ -n "$OUT" ] || die "--report-only needs --out DIR (the directory the measurements went to)"

# ---- the machine ------------------------------------------------------------
GPU_NAME="dry-run"
if [ "$DRY" = 0 ] && [ "$REPORT_ONLY" = 0 ]; then
    command -v nvidia-smi >/dev/null || die "no nvidia-smi: is this a GPU machine? (--dry-run tests the script without one)"
    GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    [ -n "$GPU_NAME" ] || die "nvidia-smi lists no GPU"
fi
SLUG="$(tr '[:upper:]' '[:lower:]' <<<"$GPU_NAME" | sed 's/nvidia//; s/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//')"
OUT="${OUT:-bench/results/$(date -u +%Y-%m-%d)-$SLUG}"
mkdir -p "$OUT"
echo "== raw output: $OUT" >&2

# ---- Python with torch ------------------------------------------------------
if [ -n "$PYTHON" ]; then
    PY="$PYTHON"
elif [ "$REPORT_ONLY" = 1 ]; then
    PY=python3   # report.py needs the standard library only
elif python3 -c 'import torch, numpy' 2>/dev/null; then
    PY="$(command -v python3)"
else
    ensure_venv "$VENV" "$INSTALL" default numpy
fi
[ "$REPORT_ONLY" = 1 ] || "$PY" -c 'import torch, numpy' 2>/dev/null || die "$PY cannot import torch and numpy"

report() {
    local table gpu
    table="$("$PY" bench/report.py gpu "$OUT")"
    echo "$table" > "$OUT/table.md"
    {
        gpu="$(cut -d, -f1 "$OUT/nvidia-smi-query.txt" 2>/dev/null | head -1 || true)"
        [ -n "$gpu" ] || gpu="$(sed -n 's/^gpu: //p' "$OUT"/*.txt 2>/dev/null | head -1 || true)"
        echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — GPU: ${gpu:-none (dry run on the CPU)}"
        echo
        if [ -f "$OUT/machine.md" ]; then cat "$OUT/machine.md"; else machine_lines; fi
        [ ! -f "$OUT/nvidia-smi-query.txt" ] || echo "- GPU (nvidia-smi): $(head -1 "$OUT/nvidia-smi-query.txt")"
        echo "- peers: torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" \
             "$("$PY" -c 'import triton; print("(triton " + triton.__version__ + ")")' 2>/dev/null || true)"
        echo "- commands (medians of --iters timed steps after --warmup; peers: CUDA events, tfuse: host clock to its first output):"
        # shellcheck disable=SC2016
        sed 's/^/  - `/; s/$/`/' "$OUT/commands.txt" 2>/dev/null || true
        echo "- raw output: \`$OUT/\`"
        echo
        echo "$table"
        echo
    } > "$OUT/section.md"
    cat "$OUT/section.md"
    [ "$RECORD" = 0 ] || append_results "$OUT/section.md"
}
if [ "$REPORT_ONLY" = 1 ]; then
    report
    exit 0
fi

echo "$COMMAND  # iters $ITERS, warmup $WARMUP" >> "$OUT/commands.txt"
if [ "$DRY" = 0 ]; then
    echo "== nvidia-smi" >&2
    nvidia-smi | tee "$OUT/nvidia-smi.txt"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/nvidia-smi-query.txt" || true
    "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
        die "$PY has torch $("$PY" -c 'import torch; print(torch.__version__)') but it sees no GPU"
else
    echo "== dry run: no GPU checks, peers on the CPU at tiny sizes" >&2
fi

# ---- tfuse ------------------------------------------------------------------
[ -n "$TFUSE" ] || build_tfuse "$OUT" -DTFUSE_WITH_LLVM=OFF
[ -x "$TFUSE" ] || die "no tfuse binary at $TFUSE"
TFUSE_FLAGS=()
grep -q -- '--warmup' <<<"$("$TFUSE" bench --help 2>&1 || true)" && TFUSE_FLAGS+=(--warmup "$WARMUP")
# Can tfuse run on the GPU at all? A tiny MLP says; if not, every tfuse cell says why.
TFUSE_NA=""
probe="$("$TFUSE" bench bench/models/mlp.ir --mode=infer --target="$TARGET" --iters 1 --dim B=2 --dim H=8 2>&1)" || true
if ! grep -q '^step_ms:' <<<"$probe"; then
    TFUSE_NA="$( (grep -i -m1 'error\|not available\|not part' <<<"$probe" || grep -m1 . <<<"$probe") | cut -c1-200)"
    TFUSE_NA="${TFUSE_NA:-no output}"
    echo "== tfuse: n/a ($TFUSE_NA); measuring the peers only" >&2
fi

# ---- the measurements -------------------------------------------------------
dim_flags() { local kv; for kv in ${DIMS[$1]:-}; do printf -- '--dim %s ' "$kv"; done; }

T_START=$SECONDS
# run_to FILE CMD...: run with the time limit (--timeout, and what --deadline leaves), stdout to FILE,
# stderr beside it; a failure is noted in FILE as `reason:` (report.py shows it).
run_to() {
    local file="$1"; shift
    local limit=$TIMEOUT
    if [ -n "$DEADLINE" ]; then
        local left=$((DEADLINE - (SECONDS - T_START)))
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    timeout "$limit" "$@" > "$file" 2> "${file%.txt}.err" ||
        echo "reason: exited with status $? ($(grep -v '^\s*$' "${file%.txt}.err" | tail -1 | cut -c1-160))" >> "$file"
}

# measure MODEL PREC MODE RUN: one measurement into MODEL__PREC__MODE__RUN.txt. RUN: tfuse, tfuse-cached
# (a second process over the kernel cache the first left), tfuse-profile (--profile: per-kernel bytes
# and GB/s against a device copy), tfuse-ckpt (--checkpoint=auto --memory-budget=50%), or a peer
# (eager, compile, compile-max) and its -cached run (the same TORCHINDUCTOR_CACHE_DIR again).
measure() {
    local model=$1 prec=$2 mode=$3 run=$4 base="$OUT/${1}__${2}__${3}"
    local file="${base}__$run.txt"
    if [ -n "$DEADLINE" ] && [ $((SECONDS - T_START)) -ge $((DEADLINE - 20)) ]; then
        echo "reason: not run: the --deadline of $DEADLINE s was reached" > "$file"
        return
    fi
    echo "== $model $prec $mode: $run ($((SECONDS - T_START)) s in)" >&2
    case "$run" in
    tfuse*)
        if [ -n "$TFUSE_NA" ]; then echo "reason: $TFUSE_NA" > "$file"; return; fi
        local cache="$OUT/cache/tfuse-$model-$prec-$mode" extra=()
        case "$run" in
        tfuse) rm -rf "$cache"; mkdir -p "$cache" ;;
        tfuse-profile) extra=(--profile) ;;
        tfuse-ckpt) extra=(--checkpoint=auto --memory-budget=50%) ;;
        esac
        mkdir -p "$cache"
        # shellcheck disable=SC2046
        run_to "$file" env TFUSE_CACHE_DIR="$cache" XDG_CACHE_HOME="$cache" \
            "$TFUSE" bench "bench/models/$model.ir" --mode="$mode" --target="$TARGET" --precision="$prec" \
            --iters "$ITERS" "${TFUSE_FLAGS[@]}" "${extra[@]}" $(dim_flags "$model") ;;
    *)
        local peer=${run%-cached}
        local cache="$OUT/cache/inductor-$model-$prec-$mode-$peer"
        [ "$run" != "$peer" ] || { rm -rf "$cache"; mkdir -p "$cache"; }
        # shellcheck disable=SC2046
        run_to "$file" env TORCHINDUCTOR_CACHE_DIR="$cache" TRITON_CACHE_DIR="$cache/triton" \
            "$PY" bench/peers.py --model "$model" --mode "$mode" --peer "$peer" --device "$DEVICE" \
            --precision "$prec" --iters "$ITERS" --warmup "$WARMUP" $(dim_flags "$model") ;;
    esac
}

for cfg in $CONFIGS; do
    model="${cfg%%:*}" prec="${cfg#*:}"
    [ -f "bench/models/$model.ir" ] || die "no model bench/models/$model.ir"
    case "$prec" in fp32|bf16|fp16) ;; *) die "$cfg: precision must be fp32, bf16 or fp16" ;; esac
done
has_peer() { [[ " $PEERS " == *" $1 "* ]]; }
# In passes, most wanted first, so that a --deadline cuts what matters least: tfuse and
# torch.compile's step and cold compile on every configuration; then the warm-cache runs and
# eager; then tfuse's profile and checkpointed step; then max-autotune, whose compiles are long.
for pass in 1 2 3 4; do
    for cfg in $CONFIGS; do
        model="${cfg%%:*}" prec="${cfg#*:}"
        for mode in $MODES; do
            runs=()
            case $pass in
            1) runs=(tfuse); has_peer compile && runs+=(compile) ;;
            2) [ "$CACHED" = 1 ] && runs=(tfuse-cached) && has_peer compile && runs+=(compile-cached)
               has_peer eager && runs+=(eager) ;;
            3) [ "$PROFILE" = 1 ] && runs+=(tfuse-profile)
               [ "$CKPT" = 1 ] && [ "$mode" = train ] && runs+=(tfuse-ckpt) ;;
            4) has_peer compile-max && runs=(compile-max) && [ "$CACHED" = 1 ] && runs+=(compile-max-cached) ;;
            esac
            for r in "${runs[@]}"; do measure "$model" "$prec" "$mode" "$r"; done
        done
    done
done
rm -rf "$OUT/cache"   # compiled kernels: large, and not results
machine_lines > "$OUT/machine.md"   # for --report-only, which may run later

report
