#!/usr/bin/env bash
# bench/data_parallel.sh [--tfuse PATH] [--reps N] [--steps N] [--out DIR]
#
# Data parallel training on the CPU (docs/distributed.md): the step of 2
# ranks, each with batch b, against 1 rank with batch b (weak scaling: the
# ideal is the same step time while twice the samples go through), and the
# share of the all-reduce's time the backward pass hid. One thread per rank,
# so that 2 ranks use the cores 1 rank with 2 threads would.
#
# The model: 4 linear layers of 512 (4.2 MB of gradients, 4 buckets at the
# default 1 MiB), fp32, sgd with momentum, at batch 32 per rank (little
# compute per gradient byte: the exchange costs as much CPU as the step) and
# 256 (8x the compute for the same bytes). Repetitions are interleaved (1
# rank, 2 ranks, 1 rank, ...); each prints tfuse train's samples/s over the
# run and, for 2 ranks, its all-reduce summary. The raw output goes to
# OUT/raw.txt and a summary (median and range over the repetitions) to
# OUT/summary.txt and stdout. Then the bucket size (--allreduce-bucket
# 256K, 1M, 4M, 32M; 2 ranks, batch 256), interleaved the same way: the
# step time and the share of the all-reduce hidden, which is what the
# default (1M) is chosen by.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tfuse=$here/../build/tfuse reps=5 steps=400 out=""
while [ $# -gt 0 ]; do
  case $1 in
    --tfuse) tfuse=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: bench/data_parallel.sh [--tfuse PATH] [--reps N] [--steps N] [--out DIR]" >&2; exit 2 ;;
  esac
done
mpirun=$(command -v mpirun.openmpi || command -v mpirun || true)
[ -n "$mpirun" ] || { echo "bench/data_parallel.sh: no mpirun (install openmpi-bin: scripts/setup.sh)" >&2; exit 1; }
[ -x "$tfuse" ] || { echo "bench/data_parallel.sh: $tfuse is not an executable tfuse" >&2; exit 1; }
tfuse=$(cd "$(dirname "$tfuse")" && pwd)/$(basename "$tfuse")
[ -n "$out" ] || out=$here/results/$(date -u +%Y-%m-%d-%H%M)-data-parallel
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=""
[ "$(id -u)" = 0 ] && root=--allow-run-as-root

python3 - "$work" <<'EOF'
import sys, numpy as np
d = sys.argv[1]; L, W = 4, 512
s = ["dim B = 32", f"input x : f32[B, {W}]", "input y : i64[B]"]
s += [f"param w{i} : f32[{W}, {W}] = kaiming_uniform()" for i in range(1, L + 1)]
s += [f"param wo : f32[{W}, 10] = kaiming_uniform()"]
prev = "x"
for i in range(1, L + 1):
    s += [f"l{i} = linear({prev}, w{i})", f"h{i} = relu(l{i})"]; prev = f"h{i}"
s += [f"lg = linear({prev}, wo)", "loss = cross_entropy(lg, y)", "output loss",
      "train {", "  optimizer = sgd(lr=0.01, momentum=0.9)", "  precision = fp32", "}"]
open(f"{d}/deep.ir", "w").write("\n".join(s) + "\n")
r = np.random.default_rng(0)
np.save(f"{d}/x.npy", r.standard_normal((8192, W)).astype(np.float32))
np.save(f"{d}/y.npy", r.integers(0, 10, 8192).astype(np.int64))
EOF

raw=$out/raw.txt
{
  echo "# bench/data_parallel.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg); $("$mpirun" --version 2>&1 | head -1)"
} >"$raw"
for b in 32 256; do
  n=$(( b == 32 ? steps : steps / 4 ))
  args=(train "$work/deep.ir" --dim B=$b --threads 1 --steps "$n" --log-every "$n" --data "x=$work/x.npy,y=$work/y.npy")
  for r in $(seq "$reps"); do
    echo "== batch $b rep $r: 1 rank" >>"$raw"
    "$tfuse" "${args[@]}" 2>&1 | grep -E "^step $n/|data parallel" >>"$raw"
    echo "== batch $b rep $r: 2 ranks" >>"$raw"
    "$mpirun" $root --oversubscribe -np 2 "$tfuse" "${args[@]}" 2>&1 | grep -E "^step $n/|data parallel" >>"$raw"
  done
done

buckets="256K 1M 4M 32M"
n=$(( steps / 4 ))
for r in $(seq "$reps"); do
  for bk in $buckets; do
    echo "== bucket $bk rep $r" >>"$raw"
    "$mpirun" $root --oversubscribe -np 2 "$tfuse" train "$work/deep.ir" --dim B=256 --threads 1 --steps "$n" --log-every "$n" \
      --data "x=$work/x.npy,y=$work/y.npy" --allreduce-bucket=$bk 2>&1 | grep -E "^step $n/|data parallel" >>"$raw"
  done
done

python3 - "$raw" "$out/summary.txt" <<'EOF'
import re, statistics as st, sys
raw, summ = sys.argv[1], sys.argv[2]
runs = {}   # batch -> lists
sweep = {}  # bucket -> lists
cur = None
bk = None
for line in open(raw):
    m = re.match(r"== bucket (\S+) rep", line)
    if m: bk = m.group(1); cur = None; sweep.setdefault(bk, {"sps": [], "hid": []}); continue
    if bk is not None and cur is None:
        m = re.search(r"samples/s ([0-9.]+)", line)
        if m: sweep[bk]["sps"].append(float(m.group(1)))
        m = re.search(r"\(([0-9]+)% overlapped", line)
        if m: sweep[bk]["hid"].append(float(m.group(1)))
        continue
    m = re.match(r"== batch (\d+) rep \d+: (\d) rank", line)
    if m: bk = None; B, cur = int(m.group(1)), int(m.group(2)); runs.setdefault(B, {"one": [], "two": [], "hid": [], "comm": [], "wait": []}); continue
    if cur is None: continue
    m = re.search(r"samples/s ([0-9.]+)", line)
    if m: runs[B]["one" if cur == 1 else "two"].append(float(m.group(1)))
    m = re.search(r"all-reduce ([0-9.]+) ms, of it waited for ([0-9.]+) ms \(([0-9]+)% overlapped", line)
    if m: runs[B]["comm"].append(float(m.group(1))); runs[B]["wait"].append(float(m.group(2))); runs[B]["hid"].append(float(m.group(3)))
def f(xs, p=3): return f"{st.median(xs):.{p}g} (range {min(xs):.{p}g}-{max(xs):.{p}g})"
lines = []
for B, r in runs.items():
    t1 = [B / s * 1e3 for s in r["one"]]; t2 = [2 * B / s * 1e3 for s in r["two"]]
    eff = [a / b for a, b in zip(t1, t2)]
    lines += [f"batch {B} per rank, {len(eff)} interleaved repetitions:",
              f"  step, 1 rank:   {f(t1)} ms",
              f"  step, 2 ranks:  {f(t2)} ms",
              f"  weak scaling efficiency (1 rank's step time / 2 ranks'): {f(eff)}",
              f"  all-reduce per step (4.2 MB): {f(r['comm'])} ms, waited for {f(r['wait'])} ms; hidden behind the backward pass: {f(r['hid'])} %"]
if sweep:
    lines.append("bucket size, 2 ranks, batch 256 each:")
    for k, r in sweep.items():
        t = [512 / s * 1e3 for s in r["sps"]]
        lines.append(f"  --allreduce-bucket={k}: step {f(t)} ms; hidden behind the backward pass {f(r['hid'])} %")
open(summ, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
echo "raw output: $raw"
