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
cd "$ROOT"
DRY=0
for a in "$@"; do
    case "$a" in
        --dry-run) DRY=1 ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument $a (try --help)" >&2; exit 2 ;;
    esac
done

B=build-gpu
JOBS=$(nproc 2>/dev/null || echo 4)
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

declare -a NAMES RESULTS TIMES
FAILED=0
# step NAME COMMAND...: run, time, record PASS/FAIL (exit 0 / not 0), or SKIP when it prints "SKIP:" and exits 0
step() {
    local name=$1
    shift
    echo
    echo "=== $name: $*"
    local t0 t1 rc log
    log=$(mktemp)
    t0=$(date +%s.%N)
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    t1=$(date +%s.%N)
    local result=PASS
    if [ "$rc" -ne 0 ]; then result="FAIL (exit $rc)"; FAILED=1
    elif grep -q '^SKIP:' "$log"; then result="SKIP ($(sed -n 's/^SKIP: //p' "$log" | head -n 1))"
    fi
    rm -f "$log"
    NAMES+=("$name")
    RESULTS+=("$result")
    TIMES+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')")
    echo "=== $name: $result"
}

# ---- the GPU ----
if [ $DRY -eq 0 ]; then
    nvidia-smi | tee "$OUT/nvidia-smi.txt"
fi

# ---- build ----
build() {
    mkdir -p "$B"
    cmake -S . -B "$B" -DTFUSE_WITH_LLVM=OFF -DCMAKE_BUILD_TYPE=Release >"$B/cmake.log" 2>&1 || { cat "$B/cmake.log"; return 1; }
    # the CLI, the GPU test (tests/gpu/test_gpu.c), the no-driver test and the stand-in driver
    cmake --build "$B" -j "$JOBS" --target tfuse_cli test_gpu test_cuda_nodriver fake_cuda || return 1
}
step build build
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
        CACHE="$ROOT/$B/cubin-cache"
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

        # seeded random .npy data for an example's inputs (no numpy needed)
        # train_example NAME DIMS MUST_FALL: 30 steps; the loss must be finite, and fall when MUST_FALL=1
        # (the transformer warms its learning rate up over 200 steps and accumulates 4 micro-batches:
        # 30 steps barely move it, and its curve is checked against the interpreter in test_gpu)
        train_example() {
            local name=$1 dims=$2 must_fall=$3 tmp=$B/train-$1 out first last
            rm -rf "$tmp"
            mkdir -p "$tmp"
            local spec
            spec=$(python3 - "$name" "$tmp" $dims <<'EOF'
import struct, sys, random
name, tmp, dims = sys.argv[1], sys.argv[2], dict(a.split("=") for a in sys.argv[3:])
random.seed(0)
# inputs of each example: (name, dtype, shape, integer upper bound)
ex = {
  "mlp": [("x", "f4", ["B", "F"], 0), ("y", "i8", ["B"], 10)],
  "cnn": [("images", "f4", ["N", 3, 32, 32], 0), ("labels", "i8", ["N"], 10)],
  "transformer": [("tokens", "i8", ["B", "T"], "V"), ("targets", "i8", ["B", "T"], "V")],
}[name]
defaults = {"mlp": {"B": 64, "F": 784}, "cnn": {"N": 8}, "transformer": {"B": 4, "T": 16, "V": 64}}[name]
def val(d): return int(dims.get(d, defaults.get(d))) if isinstance(d, str) else d
rows = 4 * val(ex[0][2][0])   # four batches
parts = []
for iname, dt, shape, hi in ex:
    shp = [rows] + [val(d) for d in shape[1:]]
    n = 1
    for s in shp: n *= s
    hdr = "{'descr': '<%s', 'fortran_order': False, 'shape': (%s), }" % (dt, ", ".join(map(str, shp)) + ("," if len(shp) == 1 else ""))
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    with open("%s/%s.npy" % (tmp, iname), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        if dt == "f4": f.write(struct.pack("<%df" % n, *[random.gauss(0, 1) for _ in range(n)]))
        else: f.write(struct.pack("<%dq" % n, *[random.randrange(val(hi)) for _ in range(n)]))
    parts.append("%s=%s/%s.npy" % (iname, tmp, iname))
print(",".join(parts))
EOF
) || { echo "SKIP: python3 is needed to write the data"; return 0; }
            local dflags="" kv
            for kv in $dims; do dflags="$dflags --dim $kv"; done
            out=$(TFUSE_CACHE_DIR="$CACHE" "$B/tfuse" train "examples/$name.ir" --target=cuda $dflags --steps 30 --log "$tmp/log.csv" \
                --data "$spec" 2>&1) || { echo "$out"; return 1; }
            echo "$out" | tail -n 5
            read -r first last < <(awk -F, 'NR > 1 && NR <= 6 { a += $3 } NR > 26 { b += $3; n++ } END { printf "%f %f\n", a / 5, b / n }' "$tmp/log.csv")
            echo "mean loss over steps 1-5: $first, over steps 26-30: $last"
            if awk -F, 'NR > 1 && ($3 != $3 + 0 || $3 ~ /nan|inf/) { bad = 1 } END { exit !bad }' "$tmp/log.csv"; then
                echo "FAILED: a loss that is not a finite number"; return 1
            fi
            [ "$must_fall" = 1 ] || return 0
            awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f) }' || { echo "FAILED: the loss did not fall"; return 1; }
        }
        step train-mlp train_example mlp "" 1
        step train-cnn train_example cnn "" 1
        step train-transformer train_example transformer "" 0

        for ex in mlp cnn transformer; do
            step "bench-$ex" env TFUSE_CACHE_DIR="$CACHE" TFUSE_CUDA_EXPLAIN=1 "$B/tfuse" bench "examples/$ex.ir" --mode=train --target=cuda --iters 20 --profile
        done

        # sanitize TOOL: compute-sanitizer's TOOL on a short inference run and a two-step training run
        # (the transformer: attention, layernorm, the multi-tensor AdamW launch, a CUDA graph replay)
        sanitize() {
            local tool=$1 cs
            cs=$(command -v compute-sanitizer || true)
            [ -z "$cs" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && cs=/usr/local/cuda/bin/compute-sanitizer
            if [ -z "$cs" ]; then echo "SKIP: compute-sanitizer is not installed"; return 0; fi
            # each run bounded (SANITIZE_TIMEOUT, default 150 s): a tool that slows a run past it fails the step
            # with that reason rather than the whole script's time limit
            local run rc
            for run in "run examples/mlp.ir --target=cuda --random-inputs --dim B=8" \
                       "bench examples/transformer.ir --mode=train --target=cuda --warmup 0 --iters 2" \
                       "bench examples/cnn.ir --mode=train --target=cuda --warmup 0 --iters 2 --dim N=4"; do
                # shellcheck disable=SC2086
                TFUSE_CACHE_DIR="$CACHE" timeout "${SANITIZE_TIMEOUT:-150}" "$cs" --tool "$tool" --error-exitcode 9 "$B/tfuse" $run
                rc=$?
                [ $rc -eq 124 ] && echo "FAILED: $tool on tfuse $run ran past ${SANITIZE_TIMEOUT:-150} s"
                [ $rc -eq 0 ] || return 1
            done
        }
        step memcheck sanitize memcheck
        step racecheck sanitize racecheck
        step synccheck sanitize synccheck
    fi
fi

# ---- summary ----
{
    echo
    echo "| test | result | seconds |"
    echo "| --- | --- | --- |"
    for i in "${!NAMES[@]}"; do echo "| ${NAMES[$i]} | ${RESULTS[$i]} | ${TIMES[$i]} |"; done
} | tee "$OUT/summary.md"
if [ $FAILED -eq 0 ]; then echo "all passed ($OUT)"; else echo "FAILURES above ($OUT)"; fi
exit $FAILED
