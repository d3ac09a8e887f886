# shellcheck shell=bash
# shellcheck disable=SC2034   # NAMES, RESULTS, TIMES and FAILED are read by the scripts that source this file
# tests/gpu/lib.sh — the steps that tests/gpu/run.sh and tests/gpu/session.sh share (sourced).
#
# The caller sets B (the build directory, holding tfuse and tests/), CACHE (the cubin cache),
# TARGET (cuda, or cuda-emu for a rehearsal without a GPU) and ROOT, and may set STEP_LIMIT
# (seconds, for the next step only; see step).

declare -a NAMES=() RESULTS=() TIMES=()

# deadline_args SCRIPT DEFAULT_BUDGET MIN_BUDGET ARGS...: session.sh's and followup.sh's flags, into DRY,
# BUDGET and DEST (default $OUT, the device tool's folder); T0 is the start; left, upto and min below
deadline_args() {
    local me=$1
    T0=$SECONDS DRY=0 BUDGET=$2 DEST=${OUT:-}
    local least=$3
    shift 3
    while [ $# -gt 0 ]; do
        case "$1" in
            --dry-run) DRY=1; shift ;;
            --budget) BUDGET="${2:-}"; shift 2 || shift
                      [[ "$BUDGET" =~ ^[0-9]+$ ]] && [ "$BUDGET" -ge "$least" ] ||
                          { echo "$me: --budget wants whole seconds, at least $least" >&2; exit 2; } ;;
            --out) DEST="${2:-}"; shift 2 || shift ;;
            -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
            *) echo "$me: unknown argument $1 (try --help)" >&2; exit 2 ;;
        esac
    done
}
# left: seconds to the deadline; upto N: seconds a step may take so that N are left after it
left() { echo $((BUDGET - (SECONDS - T0))); }
upto() { local l; l=$(( $(left) - $1 )); [ "$l" -gt 0 ] && echo "$l" || echo 0; }
min() { [ "$1" -lt "$2" ] && echo "$1" || echo "$2"; }
FAILED=0
STEP_LIMIT=""

# step NAME COMMAND...: run, time and record PASS, FAIL (exit not 0), SKIP (it printed "SKIP: why"
# and exited 0) or, with STEP_LIMIT set, FAIL (timed out). STEP_LIMIT under 5 s: NOT RUN, with
# the reason, so that a deadline cuts a step rather than the whole script. A COMMAND that is a
# function of this file runs in a child bash (timeout cannot run a function): export -f below.
step() {
    local name=$1 limit=${STEP_LIMIT:-}
    shift
    STEP_LIMIT=""
    echo
    echo "=== $name: $*"
    if [ -n "$limit" ] && [ "$limit" -lt 5 ]; then
        echo "=== $name: NOT RUN (the session's deadline)"
        NAMES+=("$name"); RESULTS+=("NOT RUN (deadline)"); TIMES+=("0.0")
        return
    fi
    local t0 t1 rc log
    log=$(mktemp)
    t0=$(date +%s.%N)
    if [ -n "$limit" ]; then
        if [ "$(type -t "$1")" = function ]; then
            timeout --kill-after=5 "$limit" bash -c '"$@"' step "$@" 2>&1 | tee "$log"
        else
            timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$log"
        fi
    else
        "$@" 2>&1 | tee "$log"
    fi
    rc=${PIPESTATUS[0]}
    t1=$(date +%s.%N)
    local result=PASS
    if [ -n "$limit" ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }; then result="FAIL (timed out after $limit s)"; FAILED=1
    elif [ "$rc" -ne 0 ]; then result="FAIL (exit $rc)"; FAILED=1
    elif grep -q '^SKIP:' "$log"; then result="SKIP ($(sed -n 's/^SKIP: //p' "$log" | head -n 1))"
    fi
    rm -f "$log"
    NAMES+=("$name")
    RESULTS+=("$result")
    TIMES+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')")
    echo "=== $name: $result"
}

# summary_table: the steps so far as a markdown table
summary_table() {
    echo "| test | result | seconds |"
    echo "| --- | --- | --- |"
    local i
    for i in "${!NAMES[@]}"; do echo "| ${NAMES[$i]} | ${RESULTS[$i]} | ${TIMES[$i]} |"; done
}

# build_gpu [TARGETS...]: the GPU image has nvcc and CMake but no LLVM: Release, without the JIT
build_gpu() {
    mkdir -p "$B"
    local t0=$SECONDS
    cmake -S . -B "$B" -DTFUSE_WITH_LLVM=OFF -DCMAKE_BUILD_TYPE=Release >"$B/cmake.log" 2>&1 || { cat "$B/cmake.log"; return 1; }
    echo "configured in $((SECONDS - t0)) s"
    cmake --build "$B" -j "$(nproc 2>/dev/null || echo 4)" --target "$@" || return 1
    echo "configured and built in $((SECONDS - t0)) s"
}

# train_example NAME DIMS MUST_FALL [LOG]: tfuse train --target=$TARGET for 30 steps on seeded
# random .npy data (written with python3 alone, no numpy); the loss must be finite, and fall when
# MUST_FALL=1 (the transformer warms its learning rate up over 200 steps and accumulates 4
# micro-batches: 30 steps barely move it; its curve is checked against the interpreter in test_gpu).
# The log goes to LOG (default $B/train-NAME/log.csv).
train_example() {
    local name=$1 dims=$2 must_fall=$3 tmp=$B/train-$1 out first last
    local log=${4:-$tmp/log.csv}
    rm -rf "$tmp"
    mkdir -p "$tmp"
    local spec
    spec=$(python3 - "$name" "$tmp" $dims <<'PY'
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
PY
) || { echo "SKIP: python3 is needed to write the data"; return 0; }
    local dflags="" kv
    for kv in $dims; do dflags="$dflags --dim $kv"; done
    # shellcheck disable=SC2086
    out=$(TFUSE_CACHE_DIR="$CACHE" "$B/tfuse" train "examples/$name.ir" --target="${TARGET:-cuda}" $dflags --steps 30 --log "$log" \
        --data "$spec" 2>&1) || { echo "$out"; return 1; }
    echo "$out" | tail -n 5
    read -r first last < <(awk -F, 'NR > 1 && NR <= 6 { a += $3 } NR > 26 { b += $3; n++ } END { printf "%f %f\n", a / 5, b / n }' "$log")
    echo "mean loss over steps 1-5: $first, over steps 26-30: $last"
    if awk -F, 'NR > 1 && ($3 != $3 + 0 || $3 ~ /nan|inf/) { bad = 1 } END { exit !bad }' "$log"; then
        echo "FAILED: a loss that is not a finite number"; return 1
    fi
    [ "$must_fall" = 1 ] || return 0
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f) }' || { echo "FAILED: the loss did not fall"; return 1; }
}

# find_sanitizer: compute-sanitizer's path, or nothing
find_sanitizer() {
    local cs
    cs=$(command -v compute-sanitizer || true)
    [ -z "$cs" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && cs=/usr/local/cuda/bin/compute-sanitizer
    echo "$cs"
}

# sanitize TOOL "tfuse ARGS" ...: compute-sanitizer's TOOL on each tfuse run given (default: a
# short inference run and two training steps of the transformer and the cnn: attention,
# layernorm, the multi-tensor AdamW launch, a CUDA graph replay), each bounded by
# SANITIZE_TIMEOUT (default 150 s), so that a tool that slows a run past it fails the step
# with that reason.
sanitize() {
    local tool=$1 cs run rc
    shift
    cs=$(find_sanitizer)
    if [ -z "$cs" ]; then echo "SKIP: compute-sanitizer is not installed"; return 0; fi
    local runs=("$@")
    [ ${#runs[@]} -gt 0 ] || runs=("run examples/mlp.ir --target=cuda --random-inputs --dim B=8"
        "bench examples/transformer.ir --mode=train --target=cuda --warmup 0 --iters 2"
        "bench examples/cnn.ir --mode=train --target=cuda --warmup 0 --iters 2 --dim N=4")
    for run in "${runs[@]}"; do
        # shellcheck disable=SC2086
        TFUSE_CACHE_DIR="$CACHE" timeout "${SANITIZE_TIMEOUT:-150}" "$cs" --tool "$tool" --error-exitcode 9 "$B/tfuse" $run
        rc=$?
        [ $rc -eq 124 ] && echo "FAILED: $tool on tfuse $run ran past ${SANITIZE_TIMEOUT:-150} s"
        [ $rc -eq 0 ] || return 1
    done
}
export -f build_gpu train_example find_sanitizer sanitize
