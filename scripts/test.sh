#!/usr/bin/env bash
# test.sh — build tfuse twice (plain, and with ASan+UBSan) and run the whole
# ctest suite on each. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
for variant in build build-asan; do
  flags=()
  [ "$variant" = build-asan ] && flags=(-DTFUSE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug)
  echo "== $variant"
  cmake -S . -B "$variant" "${flags[@]}" >/dev/null
  cmake --build "$variant" -j "$jobs" >/dev/null
  ctest --test-dir "$variant" --output-on-failure -j "$jobs"
done
