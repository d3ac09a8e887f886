#!/usr/bin/env bash
# run.sh [--seconds N] [--build DIR] [--no-build] [TARGET...] — build the
# libFuzzer targets (clang, -DTFUSE_FUZZ=ON, in DIR, default build-fuzz) and
# run each TARGET (model, npy, safetensors, onnx; default all four), one after the
# other: first over its seed corpus, then N seconds of fuzzing (default 20).
#
# Seeds: tests/fuzz/corpus/TARGET (and, for model, examples/ and tests/ir/).
# New inputs go to DIR/fuzz-corpus/TARGET, kept between runs, so repeated or
# long runs build on each other; crashes, leaks, timeouts and out-of-memory
# inputs go to DIR/fuzz-artifacts/TARGET/ (reproduce one with
# DIR/tests/fuzz/fuzz_TARGET FILE). The model target uses the dictionary
# generated from the op table (DIR/tests/fuzz/model.dict).
#
# Exit status 1 if any target found something. scripts/test.sh (CI) runs
# this with the defaults; a long run is e.g.
#     nice -n 19 tests/fuzz/run.sh --seconds 1800 model
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=20
build=build-fuzz
do_build=1
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    model|npy|safetensors|onnx) targets+=("$1"); shift ;;
    *) echo "run.sh: unknown argument '$1' (targets: model npy safetensors onnx)" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(model npy safetensors onnx)
if ! [[ $seconds =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "run.sh: --seconds must be a positive integer, got '$seconds'" >&2
  exit 2
fi

if [ $do_build = 1 ]; then
  cc=$(command -v clang-14 || command -v clang || true)
  if [ -z "$cc" ]; then
    echo "run.sh: clang not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
    exit 1
  fi
  mkdir -p "$build"
  # A configured directory keeps its compiler (naming another would make
  # CMake drop the cache). No LLVM JIT here: compiling is all the model
  # target does, and the library builds faster without it.
  ccopt=(-DCMAKE_C_COMPILER="$cc")
  grep -q '^CMAKE_C_COMPILER:' "$build/CMakeCache.txt" 2>/dev/null && ccopt=()
  cmake -S . -B "$build" "${ccopt[@]}" -DTFUSE_FUZZ=ON -DTFUSE_WITH_LLVM=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/cmake.log" 2>&1 ||
    { cat "$build/cmake.log" >&2; exit 1; }
  t=(fuzz_dict)
  for x in "${targets[@]}"; do t+=("fuzz_$x"); done
  cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target "${t[@]}" >"$build/build.log" 2>&1 ||
    { tail -n 40 "$build/build.log" >&2; exit 1; }
fi

failed=0
for x in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$x
  work=$build/fuzz-corpus/$x
  art=$build/fuzz-artifacts/$x
  mkdir -p "$work" "$art"
  seeds=(tests/fuzz/corpus/"$x")
  opts=(-max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512
        -print_final_stats=1 -artifact_prefix="$art/")
  case $x in
    # a model compiled with --checkpoint=auto and a budget it cannot meet
    # takes ~0.2 s natively, several seconds under the sanitizers on a busy
    # machine: a hang is what the timeout is for
    model) seeds+=(examples tests/ir); opts+=(-max_len=16384 -timeout=30 -dict="$build/tests/fuzz/model.dict") ;;
    onnx) opts+=(-max_len=16384 -timeout=10) ;;
    *) opts+=(-max_len=4096 -timeout=10) ;;
  esac
  log=$build/fuzz-$x.log
  start=$(date +%s)
  rc=0
  TIMEFORMAT='%U %S'
  { time "$bin" "${opts[@]}" "$work" "${seeds[@]}" >"$log" 2>&1; } 2>"$build/fuzz-$x.cpu" || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -a -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
  cpu=$(awk '{printf "%.0f", $1 + $2}' "$build/fuzz-$x.cpu" 2>/dev/null || echo "?")
  echo "fuzz_$x: ${runs:-?} executions in $(($(date +%s) - start)) s wall, $cpu s CPU, ${cov:-cov: ?}," \
       "corpus $(ls "$work" | wc -l) inputs"
  if [ $rc -ne 0 ]; then
    failed=1
    echo "fuzz_$x FAILED (exit $rc); the report (from $log):"
    awk '/^==[0-9]+==|runtime error|^fuzz_(model|npy|safetensors|onnx): /{on=1} on' "$log" | head -n 60
    grep -a 'Test unit written' "$log" || true
  fi
done
exit $failed
