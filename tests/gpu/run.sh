#!/usr/bin/env bash
# tests/gpu/run.sh — the cuda target on a machine with an NVIDIA GPU, in one
# command (under 10 minutes on an H100):
#
#   tests/gpu/run.sh              build, check against the interpreter, train, memcheck, time
#   tests/gpu/run.sh --dry-run    no GPU needed: build, the no-driver message, the fake-driver test
#
# Steps (each a row of the summary table at the end):
#   build          cmake -S . -B build-gpu -DTFUSE_WITH_LLVM=OFF -DCMAKE_BUILD_TYPE=Release, and
#                  the test programs below against its static libraries
#   nodriver       test_cuda_nodriver: with the driver search pinned to an empty directory the
#                  target says why it cannot run (on a machine without a driver: also the plain case)
#   fake           test_gpu --fake: fake_libcuda.c stands in for the driver (host memory, no
#                  kernels) and every kernel runs through the host fallback: placement, copies,
#                  updates, state, the cubin cache, leaks and out-of-bounds copies, exact results
#   ops-tf32       test_gpu: every op family (fp32/bf16/fp16, inference and a training step), one
#                  training step per example and 50-step loss curves, the session's contract,
#                  against the interpreter; fp32 GEMMs on TF32 (tolerances in test_gpu.c); from an
#                  empty cubin cache
#   ops-fp32       the same with TFUSE_NO_TF32=1 (strict fp32 tolerances), from the warm cache
#   digits         tfuse train examples/mlp.ir --target=cuda --dim F=64 on scikit-learn's digits:
#                  held-out accuracy >= 0.9
#   train-EXAMPLE  tfuse train --target=cuda on each example, 30 steps of seeded random data
#                  (.npy files this script writes with python3 alone): finite losses, falling
#                  for mlp and cnn
#   bench-EXAMPLE  tfuse bench --target=cuda --profile (train mode): step time, kernels, fallbacks
#   memcheck       compute-sanitizer --tool memcheck on tfuse run examples/mlp.ir --target=cuda and
#                  two training steps of the transformer and the cnn (skipped when compute-sanitizer
#                  is not on PATH or in /usr/local/cuda/bin)
#   racecheck      the same runs under --tool racecheck (shared-memory races)
#   synccheck      the same runs under --tool synccheck (barriers in divergent code)
# --dry-run runs build, nodriver, fake and "cli-nodriver" (tfuse run --target=cuda exits 1 with
# the no-driver message) on a machine without a GPU.
#
# Everything printed also goes to bench/results/<date>-<gpu>-tests/run.log (plus nvidia-smi.txt
# and summary.md); the directory is left for the lead to commit. Exit status: 0 when every step
# passed or was skipped for a stated reason, 1 otherwise.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
DRY=0
for a in "$@"; do
    case "$a" in
        --dry-run) DRY=1 ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument $a (try --help)" >&2; exit 2 ;;
    esac
done

B=build-gpu
STAMP=$(date +%Y-%m-%d-%H%M)
if [ $DRY -eq 0 ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "run.sh: nvidia-smi is not here: no NVIDIA driver on this machine (use --dry-run to check the script)" >&2
        exit 1
    fi
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr -c 'A-Za-z0-9.\n' '-' | sed 's/-\{2,\}/-/g; s/^-//; s/-$//')
    GPU=${GPU:-unknown-gpu}
else
    GPU=nogpu-dryrun
fi
OUT="bench/results/$STAMP-$GPU-tests"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
echo "tests/gpu/run.sh $* — $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
echo "results: $OUT"

export B CACHE="$ROOT/$B/cubin-cache" TARGET=cuda ROOT
# shellcheck source=tests/gpu/lib.sh
. "$ROOT/tests/gpu/lib.sh"

# ---- the GPU ----
if [ $DRY -eq 0 ]; then
    nvidia-smi | tee "$OUT/nvidia-smi.txt"
fi

# ---- build ----
# the CLI, the GPU test (tests/gpu/test_gpu.c), the no-driver test and the stand-in driver
step build build_gpu tfuse_cli test_gpu test_cuda_nodriver fake_cuda
if [ "${RESULTS[0]}" != PASS ]; then
    echo "the build failed: nothing else can run"
else
    export TFUSE_EXAMPLES="$ROOT/examples"
    step nodriver "$B/tests/test_cuda_nodriver"
    step fake "$B/tests/test_gpu" --fake "$ROOT/$B/tests/fakecuda"

    if [ $DRY -eq 1 ]; then
        cli_nodriver() {
            local out rc
            out=$("$B/tfuse" run examples/mlp.ir --target=cuda --random-inputs 2>&1)
            rc=$?
            echo "$out"
            if [ $rc -eq 1 ] && grep -q "cannot run here: no CUDA driver (libcuda.so.1 not found)" <<<"$out"; then return 0; fi
            if nvidia-smi >/dev/null 2>&1; then echo "SKIP: this machine has a GPU"; return 0; fi
            echo "FAILED: expected exit 1 and the no-driver message, got exit $rc"
            return 1
        }
        step cli-nodriver cli_nodriver
    else
        rm -rf "$CACHE"
        step ops-tf32 env TFUSE_CACHE_DIR="$CACHE" "$B/tests/test_gpu"
        step ops-fp32 env TFUSE_CACHE_DIR="$CACHE" TFUSE_NO_TF32=1 "$B/tests/test_gpu"

        digits() {
            local tmp=$B/digits out acc
            rm -rf "$tmp"
            mkdir -p "$tmp"
            if ! python3 scripts/make_digits.py "$tmp/data" 2>"$tmp/make_digits.err"; then
                cat "$tmp/make_digits.err"
                echo "SKIP: scripts/make_digits.py needs python3 with numpy and scikit-learn"
                return 0
            fi
            local d=$tmp/data
            out=$(TFUSE_CACHE_DIR="$CACHE" "$B/tfuse" train examples/mlp.ir --target=cuda --dim F=64 --steps 300 --log-every 50 \
                --data "x=$d/train_x.npy,y=$d/train_y.npy" --eval-data "x=$d/test_x.npy,y=$d/test_y.npy" 2>&1) || { echo "$out"; return 1; }
            echo "$out"
            acc=$(sed -n 's/^eval after step 300: .* accuracy \([0-9.]*\) .*/\1/p' <<<"$out")
            [ -n "$acc" ] || { echo "FAILED: no held-out accuracy in the output"; return 1; }
            echo "held-out accuracy $acc (>= 0.9 required)"
            awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || { echo "FAILED: accuracy $acc < 0.9"; return 1; }
        }
        step digits digits

        step train-mlp train_example mlp "" 1
        step train-cnn train_example cnn "" 1
        step train-transformer train_example transformer "" 0

        for ex in mlp cnn transformer; do
            step "bench-$ex" env TFUSE_CACHE_DIR="$CACHE" TFUSE_CUDA_EXPLAIN=1 "$B/tfuse" bench "examples/$ex.ir" --mode=train --target=cuda --iters 20 --profile
        done

        step memcheck sanitize memcheck
        step racecheck sanitize racecheck
        step synccheck sanitize synccheck
    fi
fi

# ---- summary ----
{ echo; summary_table; } | tee "$OUT/summary.md"
if [ $FAILED -eq 0 ]; then echo "all passed ($OUT)"; else echo "FAILURES above ($OUT)"; fi
exit $FAILED
