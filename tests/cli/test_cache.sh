#!/usr/bin/env bash
# test_cache.sh TFUSE REPO TMPDIR — the compile cache on disk as a user
# meets it, in a cache directory of its own (never the user's): tfuse cache
# stats and clear, their usage errors, TFUSE_CACHE_MAX refused when
# malformed, run --stats counting the cpu target's disk hits and misses, a
# tiny bound holding, and a second compile --target=cuda -o DIR that
# compiles nothing (where NVRTC is present).
set -u
tfuse=$1 repo=$2 tmp=$3
ex=$repo/examples
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "$0")/lib.sh"
export TFUSE_CACHE_DIR=$tmp/cache
unset TFUSE_CACHE_MAX

expect 0 "usage: tfuse cache stats \| clear" -- "$tfuse" cache --help
expect 0 "usage: tfuse cache" -- "$tfuse" cache clear --help
expect 0 "tfuse cache" -- "$tfuse" --help
expect 2 "'tfuse cache' needs what to do: stats or clear" -- "$tfuse" cache
expect 2 "unknown cache command 'show'" -- "$tfuse" cache show
expect 2 "'tfuse cache stats' takes no arguments, found 'cpu'" -- "$tfuse" cache stats cpu
expect 2 "takes a part: cpu, cuda or cuda-emu .*found 'gpu'" -- "$tfuse" cache clear gpu
expect 2 "takes at most one part, found 'cuda'" -- "$tfuse" cache clear cpu cuda

# an empty cache
expect 0 "^dir: $TFUSE_CACHE_DIR$" -- "$tfuse" cache stats
expect 0 "^total: 0 entries, 0 bytes$" -- "$tfuse" cache stats
expect 0 "^max: 2147483648 bytes \(2.0 GiB\), the default" -- "$tfuse" cache stats
expect 0 "^max: 536870912 bytes \(512.0 MiB\), from TFUSE_CACHE_MAX" -- env TFUSE_CACHE_MAX=512M "$tfuse" cache stats

# a malformed bound is an error before anything is compiled or cached
for bad in 12X 0 -5 1.5G lots 2GG; do
  expect 2 "TFUSE_CACHE_MAX=$bad is not a size" -- env TFUSE_CACHE_MAX=$bad "$tfuse" cache stats
done
expect 2 "TFUSE_CACHE_MAX=12X is not a size" -- env TFUSE_CACHE_MAX=12X "$tfuse" run "$ex/mlp.ir" --random-inputs
expect 2 "TFUSE_CACHE_MAX=12X is not a size" -- env TFUSE_CACHE_MAX=12X "$tfuse" compile "$ex/mlp.ir"
expect 0 "removed 0 entries" -- env TFUSE_CACHE_MAX=12X "$tfuse" cache clear   # clearing needs no bound
expect 0 "setting cache_max: invalid: TFUSE_CACHE_MAX=12X is not a size" -- env TFUSE_CACHE_MAX=12X "$tfuse" doctor
expect 0 "setting cache_max: 1048576 bytes \(env TFUSE_CACHE_MAX=1M\)" -- env TFUSE_CACHE_MAX=1M "$tfuse" doctor
expect 0 "setting cache_max: 2147483648 bytes \(default\)" -- "$tfuse" doctor

# the cpu target: a first run compiles and leaves its kernels, a second finds them all
if "$tfuse" doctor | grep -q "^target cpu: available"; then
  out1=$("$tfuse" run "$ex/mlp.ir" --random-inputs --dim B=4 --stats 2>&1)
  out2=$("$tfuse" run "$ex/mlp.ir" --random-inputs --dim B=4 --stats 2>&1)
  m1=$(sed -n 's/^disk_cache_misses: //p' <<<"$out1") h1=$(sed -n 's/^disk_cache_hits: //p' <<<"$out1")
  m2=$(sed -n 's/^disk_cache_misses: //p' <<<"$out2") h2=$(sed -n 's/^disk_cache_hits: //p' <<<"$out2")
  if [ -n "$m1" ] && [ "$m1" -gt 0 ] && [ "$h1" = 0 ] && [ "$m2" = 0 ] && [ "$h2" = "$m1" ]; then ok
  else bad "run --stats: first $h1 hits, $m1 misses; second $h2 hits, $m2 misses"; fi
  # the kernels, and the host's target id (cpu_jit.c's host_target: later processes need no LLVM to read it)
  stats=$("$tfuse" cache stats)
  if grep -qE "^cpu: $((m1 + 1)) entries, [1-9][0-9]* bytes" <<<"$stats"; then ok; else bad "cache stats after the runs: $stats"; fi
  if ls "$TFUSE_CACHE_DIR"/cpu/host-* >/dev/null 2>&1; then ok; else bad "no cpu/host-* record in $TFUSE_CACHE_DIR"; fi
  expect 0 "^removed $((m1 + 1)) entries, [0-9]+ bytes .*\(cpu: $((m1 + 1))\)$" -- "$tfuse" cache clear cpu
  expect 0 "^cpu: 0 entries, 0 bytes$" -- "$tfuse" cache stats
  out3=$("$tfuse" run "$ex/mlp.ir" --random-inputs --dim B=4 --stats 2>&1)
  if grep -q "^disk_cache_misses: $m1$" <<<"$out3"; then ok; else bad "after clear, everything compiles again: $out3"; fi
  # a bound smaller than the model's kernels: the cache stays within it
  "$tfuse" cache clear >/dev/null
  TFUSE_CACHE_MAX=8K "$tfuse" run "$ex/mlp.ir" --random-inputs --dim B=4 >/dev/null 2>&1
  TFUSE_CACHE_MAX=8K "$tfuse" run "$ex/cnn.ir" --random-inputs --dim B=2 >/dev/null 2>&1
  total=$("$tfuse" cache stats | sed -n 's/^total: [0-9]* entries, \([0-9]*\) bytes.*/\1/p')
  if [ -n "$total" ] && [ "$total" -gt 0 ] && [ "$total" -le 8192 ]; then ok; else bad "TFUSE_CACHE_MAX=8K: $total bytes cached"; fi
  expect 0 "^max: 8192 bytes \(8.0 KiB\), from TFUSE_CACHE_MAX" -- env TFUSE_CACHE_MAX=8K "$tfuse" cache stats
else
  echo "skipped: the cpu target (this build has no LLVM)"
fi
expect 2 "takes no --stats \(it is a flag of: compile, run\)" -- "$tfuse" print "$ex/mlp.ir" --stats

# cuda: a second compile -o DIR takes every cubin from the cache
"$tfuse" cache clear >/dev/null
if out=$("$tfuse" compile "$ex/mlp.ir" --target=cuda -o "$tmp/art1" --stats 2>&1); then
  n=$(sed -n 's/^kernels_compiled: //p' <<<"$out")
  c=$(sed -n 's/^cubins: //p' <<<"$out")
  out2=$("$tfuse" compile "$ex/mlp.ir" --target=cuda -o "$tmp/art2" --stats 2>&1)
  if [ -n "$n" ] && [ "$n" -gt 0 ] && [ -n "$c" ] && [ "$c" -gt 0 ] && [ "$c" -le "$n" ] && grep -q "^kernels_compiled: 0$" <<<"$out2" &&
     grep -q "^kernels_cached: $n$" <<<"$out2" && grep -q "^cubins: $c$" <<<"$out2" &&
     grep -q "(0 compiled, $n from the disk cache)" <<<"$out2"; then ok; else bad "second compile -o for cuda: $out2 (first: $out)"; fi
  same=1
  for f in "$tmp"/art1/cuda/*.cubin "$tmp"/art1/cubins.txt; do cmp -s "$f" "${f/art1/art2}" || same=0; done
  if [ "$same" = 1 ]; then ok; else bad "cached cubins differ from compiled ones"; fi
  # one file per NVRTC program and one link per kernel
  expect 0 "^cuda: $((c + n)) entries" -- "$tfuse" cache stats
else
  if grep -q "nvrtc\|NVRTC" <<<"$out"; then echo "skipped: no NVRTC ($out)"; else bad "compile -o for cuda: $out"; fi
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
