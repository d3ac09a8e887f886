#!/usr/bin/env bash
# bench/package.sh [--reps N] [--target cpu|cuda] [--out DIR] — the time and peak memory of writing a package of a big
# model: `tfuse compile bench/models/gpt2.ir --mode=train -o gpt2.tfp` (124 M params, a 622 MiB package), with every
# kernel already in the compile cache (a first, untimed compile fills it), N times (default 3). --target=cuda writes
# cubins for sm_90 through NVRTC (no GPU needed). Prints each run's wall seconds, peak resident memory (GNU time's
# maximum RSS) and package bytes, and the medians; raw output in DIR (default bench/results/<date>-package/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
reps=3 target=cpu out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) reps=$2; shift 2 ;;
        --target) target=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: bench/package.sh [--reps N] [--target cpu|cuda] [--out DIR]" >&2; exit 2 ;;
    esac
done
[ -x /usr/bin/time ] || { echo "bench/package.sh: needs GNU time (/usr/bin/time; apt-get install time)" >&2; exit 1; }
out=${out:-$ROOT/bench/results/$(date -u +%Y-%m-%d-%H%M)-package}
mkdir -p "$out"
flags=(--mode=train --target="$target")
[ "$target" = cuda ] && flags+=(--arch=sm_90)
pkg=$(mktemp -d)/gpt2.tfp
"$ROOT/build/tfuse" compile "$ROOT/bench/models/gpt2.ir" "${flags[@]}" -o "$pkg" > "$out/warm.txt" 2>&1
{
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD), target $target, $reps repetitions, $(date -u +%Y-%m-%dT%H:%MZ)"
    for r in $(seq 1 "$reps"); do
        /usr/bin/time -f "rep $r wall_s %e max_rss_kb %M" "$ROOT/build/tfuse" compile "$ROOT/bench/models/gpt2.ir" "${flags[@]}" -o "$pkg" 2>&1
        echo "rep $r package_bytes $(stat -c %s "$pkg")"
    done
} | tee "$out/raw.txt"
python3 - "$out/raw.txt" <<'PY' | tee "$out/table.md"
import re, statistics, sys
t = open(sys.argv[1]).read()
w = [float(x) for x in re.findall(r"wall_s ([0-9.]+)", t)]
m = [int(x) / 1024 for x in re.findall(r"max_rss_kb ([0-9]+)", t)]
b = [int(x) / 1048576 for x in re.findall(r"package_bytes ([0-9]+)", t)]
print(f"| wall s (median, range) | peak RSS MiB (median) | package MiB | peak / package |\n|---|---|---|---|")
print(f"| {statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) | {statistics.median(m):.0f} | {statistics.median(b):.1f} | "
      f"{statistics.median(m) / statistics.median(b):.2f} |")
PY
rm -rf "$(dirname "$pkg")"
