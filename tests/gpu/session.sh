#!/usr/bin/env bash
# tests/gpu/session.sh — the whole first visit to a GPU in one device call (issue 35): a session
# gets 15 minutes of device time in all, the machine's start included, so this runs in at most
# --budget seconds (default 520, for a call with timeout_s 560) with its own deadlines, most
# wanted first, and always ends with a table.
#
#   tests/gpu/session.sh                 on the GPU machine (the device tool: results under $OUT)
#   tests/gpu/session.sh --dry-run       anywhere: the same steps on cuda-emu and the CPU peers
#
# Parts, in order (each line: the share of the budget it may use at most):
#   nvidia-smi    the card as found
#   build         build-gpu/ (-DTFUSE_WITH_LLVM=OFF, Release: the GPU image has no LLVM), timed
#   test_gpu      every op family (fp32/bf16/fp16, inference and a training step) against the
#                 interpreter, one training step per example and 50-step loss curves, a step
#                 replayed as a CUDA graph against its kernels launched one by one, the cuBLASLt
#                 epilogues, the session's contract; TF32 GEMMs, an empty cubin cache
#   train-*       tfuse train --target=cuda, 30 steps of each example on seeded random data
#                 (finite losses, falling for mlp and cnn); mlp once more with CUDA graphs off:
#                 the same losses bit for bit
#   bench         bench/gpu.sh: tfuse against torch.compile (default mode) and eager, bf16, on the
#                 MLP, GPT-2 small and ResNet-18 configurations, train then infer; passes: tfuse and
#                 torch.compile on all, then eager, then tfuse's --profile (GB/s per kernel
#                 against a device copy); --deadline cuts what is left, and the table comes back
#   memcheck      compute-sanitizer --tool memcheck on one training step of the MLP, if 45 s are left
#
# What comes back (at most 8 files, the device tool's limit): session.log (everything printed),
# summary.md (the steps' table, then the benchmark's), nvidia-smi.txt, bench.tgz (bench/gpu.sh's
# raw directory: one file per measurement; unpack under bench/results/ and run
# `bench/gpu.sh --report-only --out DIR` to record the table). They go to --out DIR, else $OUT
# (set by the device tool), else bench/results/<date>-<gpu>-session/.
#
# tests/gpu/followup.sh is the shorter second call, for a session with time left.
#
# Options:
#   --dry-run        no GPU: test_gpu --emu, --target=cuda-emu, bench/gpu.sh --dry-run, no sanitizer
#   --budget S       the whole run's deadline in seconds (default 520)
#   --out DIR        where the files above go
# Exit status: 0 when every step passed or was skipped for a stated reason, 1 otherwise.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=tests/gpu/lib.sh
. "$ROOT/tests/gpu/lib.sh"
deadline_args session.sh 520 120 "$@"

if [ $DRY -eq 0 ]; then
    command -v nvidia-smi >/dev/null 2>&1 || { echo "session.sh: no nvidia-smi here: no NVIDIA driver (--dry-run rehearses without one)" >&2; exit 1; }
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr -c 'A-Za-z0-9.\n' '-' | sed 's/-\{2,\}/-/g; s/^-//; s/-$//')
    TARGET=cuda
else
    GPU=nogpu-dryrun
    TARGET=cuda-emu
fi
DEST=${DEST:-bench/results/$(date -u +%Y-%m-%d-%H%M)-${GPU:-unknown-gpu}-session}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd) || exit 1
exec > >(tee -a "$DEST/session.log") 2>&1
echo "tests/gpu/session.sh $* — $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)$(git diff --quiet 2>/dev/null || echo ' (with local changes)'), budget $BUDGET s"

B=build-gpu
export B CACHE="$ROOT/$B/cubin-cache" TARGET ROOT TFUSE_EXAMPLES="$ROOT/examples"
# ---- the card ----
if [ $DRY -eq 0 ]; then
    nvidia-smi | tee "$DEST/nvidia-smi.txt"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee -a "$DEST/nvidia-smi.txt"
fi

# ---- build (at most 40% of the budget; about a minute on 16 cores) ----
STEP_LIMIT=$(min $((BUDGET * 2 / 5)) "$(upto 60)")
step build build_gpu tfuse_cli test_gpu
if [ "${RESULTS[0]}" != PASS ]; then
    echo "the build failed: nothing else can run"
else
    # ---- correctness (until 300 s before the deadline) ----
    rm -rf "$CACHE"
    EMU=()
    [ $DRY -eq 1 ] && EMU=(--emu)
    STEP_LIMIT=$(min 180 "$(upto 320)")
    step test_gpu env TFUSE_CACHE_DIR="$CACHE" "$B/tests/test_gpu" "${EMU[@]}"

    # graphs_same: the mlp's 30 losses with CUDA graphs off equal those with them on, bit for bit
    graphs_same() {
        [ -f "$B/train-mlp/log.csv" ] || { echo "SKIP: train-mlp did not run"; return 0; }
        cp "$B/train-mlp/log.csv" "$B/graphs-on.csv"
        TFUSE_CUDA_GRAPHS=0 train_example mlp "" 1 "$B/graphs-off.csv" || return 1
        if cmp -s <(cut -d, -f1,3 "$B/graphs-on.csv") <(cut -d, -f1,3 "$B/graphs-off.csv"); then
            echo "the same 30 losses with and without CUDA graphs"
        else
            diff <(cut -d, -f1,3 "$B/graphs-on.csv") <(cut -d, -f1,3 "$B/graphs-off.csv") | head -n 8
            echo "FAILED: CUDA graphs change the losses"; return 1
        fi
    }
    export -f graphs_same
    STEP_LIMIT=$(min 60 "$(upto 270)"); step train-mlp train_example mlp "" 1
    STEP_LIMIT=$(min 60 "$(upto 260)"); step train-mlp-graphs-off graphs_same
    STEP_LIMIT=$(min 60 "$(upto 250)"); step train-cnn train_example cnn "" 1
    STEP_LIMIT=$(min 60 "$(upto 240)"); step train-transformer train_example transformer "" 0

    # ---- speed (until 45 s before the deadline, which memcheck may use) ----
    bench() {
        local deadline=$1 py=() dry=()
        [ "$deadline" -ge 60 ] || { echo "SKIP: $deadline s left, bench/gpu.sh needs 60"; return 0; }
        if [ $DRY -eq 1 ]; then
            dry=(--dry-run)
            [ -x "$ROOT/.venv/bin/python" ] && py=(--python "$ROOT/.venv/bin/python")
        fi
        bench/gpu.sh "${dry[@]}" "${py[@]}" --tfuse "$B/tfuse" --configs "mlp:bf16 gpt2:bf16 resnet18:bf16" \
            --peers "compile eager" --no-cached --no-ckpt --iters 30 --warmup 5 --timeout 150 \
            --deadline "$deadline" --no-record --no-install --out "$DEST/bench"
    }
    export -f bench
    export DRY DEST
    D=$(upto 45)
    STEP_LIMIT=$((D + 30))   # gpu.sh cuts its own measurements at the deadline; this is the backstop
    step bench bench "$D"

    # ---- memcheck, if there is time ----
    memcheck() {
        [ $DRY -eq 0 ] || { echo "SKIP: a dry run has no GPU to check"; return 0; }
        SANITIZE_TIMEOUT=$1 sanitize memcheck "bench examples/mlp.ir --mode=train --target=cuda --warmup 0 --iters 1"
    }
    export -f memcheck
    L=$(upto 8)
    if [ "$L" -ge 37 ]; then
        STEP_LIMIT=$L; step memcheck memcheck $((L - 5))
    else
        STEP_LIMIT=0; step memcheck memcheck 0
    fi
fi

# ---- what comes back ----
{
    echo "# tests/gpu/session.sh — $(date -u +%Y-%m-%dT%H:%M:%SZ), ${GPU:-unknown GPU}, $((SECONDS - T0)) s of a $BUDGET s budget"
    echo
    summary_table
    if [ -f "$DEST/bench/table.md" ]; then
        echo
        cat "$DEST/bench/table.md"
    fi
} > "$DEST/summary.md"
if [ -d "$DEST/bench" ]; then
    tar czf "$DEST/bench.tgz" -C "$DEST" bench && rm -rf "$DEST/bench"
fi
echo
cat "$DEST/summary.md"
echo "files: $(cd "$DEST" && ls | tr '\n' ' ')"
if [ $FAILED -eq 0 ]; then echo "all passed ($DEST)"; else echo "FAILURES above ($DEST)"; fi
exit $FAILED
