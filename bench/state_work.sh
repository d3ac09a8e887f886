#!/usr/bin/env bash
# bench/state_work.sh [--reps N] [--threads N] [--out DIR] — inference work that depends on the params alone, done once
# per state (--cpu-state-work=once, the default) against in every step (every), on torchvision's ResNet-50 exported by
# tfuse.export at 64x64, batch 4 (issue 33's lever 4: its batch norms folded into the weights, its convolutions' weights
# reordered into oneDNN's layout), and on examples/mlp.ir in bf16 (its weights cast to bf16). Each repetition runs
# both settings, one after the other, `tfuse bench --mode=infer` (10 steps after 3 of warm-up, the median); the table
# gives each setting's median over repetitions and the ratio once / every per repetition (median, range). Raw output:
# DIR (default bench/results/<date>-state-work/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
reps=5 threads=$(nproc) out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) reps=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: bench/state_work.sh [--reps N] [--threads N] [--out DIR]" >&2; exit 2 ;;
    esac
done
out=${out:-$ROOT/bench/results/$(date -u +%Y-%m-%d-%H%M)-state-work}
mkdir -p "$out"
tfuse=$ROOT/build/tfuse
TFUSE_LIBRARY=$ROOT/build/libtfuse.so PYTHONPATH=$ROOT/python "$ROOT/.venv/bin/python" - "$out/resnet50.ir" <<'PY'
import sys, torch, torchvision, tfuse
m = torchvision.models.resnet50().eval()
open(sys.argv[1], "w").write(tfuse.export(m, (torch.randn(4, 3, 64, 64),)).text)
PY
models=("resnet50:$out/resnet50.ir:" "mlp-bf16:$ROOT/examples/mlp.ir:--dim B=64")
{
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD), $(uname -m), $threads threads, $reps repetitions, $(date -u +%Y-%m-%dT%H:%MZ)"
    for r in $(seq 1 "$reps"); do
        for spec in "${models[@]}"; do
            IFS=: read -r name file extra <<<"$spec"
            for mode in once every; do
                # shellcheck disable=SC2086
                ms=$("$tfuse" bench "$file" --mode=infer --iters 10 --warmup 3 --threads "$threads" --cpu-state-work=$mode $extra |
                     sed -n 's/^step_ms: //p')
                echo "rep $r $name $mode $ms"
            done
        done
    done
} | tee "$out/raw.txt"
python3 - "$out/raw.txt" <<'PY' | tee "$out/table.md"
import collections, statistics, sys
t = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = line.split()
    if f and f[0] == "rep":
        t[(f[2], int(f[1]))][f[3]] = float(f[4])
names = sorted({k[0] for k in t}, key=lambda n: n != "resnet50")
print("| model | once ms | every ms | once / every (median, range) |\n|---|---|---|---|")
for n in names:
    reps = [v for (m, _), v in t.items() if m == n]
    o, e = [v["once"] for v in reps], [v["every"] for v in reps]
    r = [a / b for a, b in zip(o, e)]
    print(f"| {n} | {statistics.median(o):.2f} | {statistics.median(e):.2f} | {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) |")
PY
