#!/usr/bin/env bash
# tests/gpu/followup.sh — the second, shorter device call of a GPU session (issue 35), run only when
# tests/gpu/session.sh left time: what the first call leaves out, most wanted first, each cut by
# the --budget (default 240 s).
#
#   tests/gpu/followup.sh [--budget S] [--out DIR]
#   tests/gpu/followup.sh --dry-run       anywhere: cuda-emu, no sanitizer, no ncu, CPU peers
#
# Parts, in order:
#   build       build-gpu/ again (a fresh machine keeps nothing from the first call)
#   attention   bench/attention.py --target cuda: the flash-attention kernels alone at GPT-2 small's
#               shape (B=8 H=12 T=1024 D=64, causal, bf16), inference and a training step, against
#               PyTorch's SDPA and cuDNN's, 3 repetitions (issue 30: >= 0.6 of cuDNN's TFLOP/s)
#   ops-fp32    test_gpu with TFUSE_NO_TF32=1: the strict fp32 tolerances
#   racecheck   compute-sanitizer --tool racecheck, then synccheck, on two training steps of the
#   synccheck   transformer (attention's and the reductions' shared-memory tiles)
#   ncu         GPT-2 small bf16, two training steps: every kernel's duration (ncu's
#               gpu__time_duration; the heaviest twelve of any kind in the log, cuBLASLt's too),
#               then `ncu --set full` on the three slowest generated ones (clock control off:
#               the card's clocks are left as found)
#   max-autotune  bench/gpu.sh --peers compile-max on the MLP in bf16
# Files: followup.log, summary.md, ncu.tgz (the reports, when ncu ran), bench.tgz.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=tests/gpu/lib.sh
. "$ROOT/tests/gpu/lib.sh"
deadline_args followup.sh 240 60 "$@"

TARGET=cuda
[ $DRY -eq 1 ] && TARGET=cuda-emu
DEST=${DEST:-bench/results/$(date -u +%Y-%m-%d-%H%M)-followup}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd) || exit 1
exec > >(tee -a "$DEST/followup.log") 2>&1
echo "tests/gpu/followup.sh $* — $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?), budget $BUDGET s"

B=build-gpu
export B CACHE="$ROOT/$B/cubin-cache" TARGET ROOT TFUSE_EXAMPLES="$ROOT/examples" DRY DEST
STEP_LIMIT=$(min 150 "$(upto 30)")
step build build_gpu tfuse_cli test_gpu
if [ "${RESULTS[0]}" = PASS ]; then
    EMU=()
    [ $DRY -eq 1 ] && EMU=(--emu)
    attention_bench() {
        local py=python3 args=(--target cuda --tools fused sdpa cudnn)
        if [ "$DRY" = 1 ]; then
            [ -x "$ROOT/.venv/bin/python" ] && py="$ROOT/.venv/bin/python"
            args=(--target cuda-emu --tools fused sdpa --iters 2 --warmup 1)
        fi
        TFUSE_CACHE_DIR="$CACHE" "$py" bench/attention.py "${args[@]}" --precisions bf16 --reps 3 --tfuse "$B/tfuse" \
            --python "$py" --out "$DEST/bench/attention"
    }
    export -f attention_bench
    STEP_LIMIT=$(min 100 "$(upto 40)"); step attention attention_bench
    STEP_LIMIT=$(min 120 "$(upto 60)")
    step ops-fp32 env TFUSE_CACHE_DIR="$CACHE" TFUSE_NO_TF32=1 "$B/tests/test_gpu" "${EMU[@]}"

    check_tool() {
        [ "$DRY" = 0 ] || { echo "SKIP: a dry run has no GPU to check"; return 0; }
        SANITIZE_TIMEOUT=$2 sanitize "$1" "bench examples/transformer.ir --mode=train --target=cuda --warmup 0 --iters 2"
    }
    export -f check_tool
    for tool in racecheck synccheck; do
        L=$(min 90 "$(upto 30)"); STEP_LIMIT=$L; step "$tool" check_tool "$tool" $((L > 5 ? L - 5 : 0))
    done

    # ncu_top3: the three slowest generated kernels of one GPT-2 small bf16 training step
    ncu_top3() {
        [ "$DRY" = 0 ] || { echo "SKIP: a dry run has no GPU to profile"; return 0; }
        local ncu
        ncu=$(command -v ncu || true)
        [ -n "$ncu" ] || { echo "SKIP: ncu is not installed"; return 0; }
        local run=(bench bench/models/gpt2.ir --mode=train --target=cuda --precision=bf16 --warmup 1 --iters 1)
        mkdir -p "$DEST/ncu"
        # every kernel of both steps, the libraries' too (cuBLASLt's names say their tile and alignment)
        TFUSE_CACHE_DIR="$CACHE" TFUSE_CUDA_GRAPHS=0 "$ncu" --clock-control none --csv --metrics gpu__time_duration.sum \
            "$B/tfuse" "${run[@]}" > "$DEST/ncu/durations.csv" 2> "$DEST/ncu/durations.err" || return 1
        local top
        top=$(python3 - "$DEST/ncu/durations.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
name, value = head.index("Kernel Name"), head.index("Metric Value")
total = collections.Counter()
for r in rows:
    total[r[name]] += float(r[value].replace(",", ""))
for k, ns in total.most_common(12):   # the log: the heaviest of every kind
    print("  %10.2f ms  %s" % (ns / 1e6, k[:150]), file=sys.stderr)
print("  %10.2f ms  all %d kernels" % (sum(total.values()) / 1e6, len(rows)), file=sys.stderr)
ours = [(k, ns) for k, ns in total.most_common() if k.startswith("tf_")]
for k, ns in ours[:3]:   # --set full on the three slowest generated ones
    print(k, ns)
PY
) || return 1
        echo "$top"
        local k
        while read -r k _; do
            TFUSE_CACHE_DIR="$CACHE" TFUSE_CUDA_GRAPHS=0 "$ncu" --clock-control none --set full -k "$k" -c 1 \
                "$B/tfuse" "${run[@]}" > "$DEST/ncu/$k.txt" 2>&1 || return 1
        done <<<"$top"
    }
    export -f ncu_top3
    STEP_LIMIT=$(min 150 "$(upto 40)"); step ncu ncu_top3

    autotune() {
        local deadline=$1 py=() dry=()
        [ "$deadline" -ge 60 ] || { echo "SKIP: $deadline s left, bench/gpu.sh needs 60"; return 0; }
        if [ "$DRY" = 1 ]; then
            dry=(--dry-run)
            [ -x "$ROOT/.venv/bin/python" ] && py=(--python "$ROOT/.venv/bin/python")
        fi
        bench/gpu.sh "${dry[@]}" "${py[@]}" --tfuse "$B/tfuse" --configs "mlp:bf16" --peers compile-max --no-cached \
            --no-profile --no-ckpt --iters 30 --warmup 5 --deadline "$deadline" --no-record --no-install --out "$DEST/bench"
    }
    export -f autotune
    D=$(upto 10); STEP_LIMIT=$((D + 20)); step max-autotune autotune "$D"
fi

{
    echo "# tests/gpu/followup.sh — $(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - T0)) s of a $BUDGET s budget"
    echo
    summary_table
    [ ! -f "$DEST/bench/attention/table.md" ] || { echo; cat "$DEST/bench/attention/table.md"; }
    [ ! -f "$DEST/bench/table.md" ] || { echo; cat "$DEST/bench/table.md"; }
} > "$DEST/summary.md"
for d in ncu bench; do
    [ ! -d "$DEST/$d" ] || { tar czf "$DEST/$d.tgz" -C "$DEST" "$d" && rm -rf "${DEST:?}/$d"; }
done
cat "$DEST/summary.md"
if [ $FAILED -eq 0 ]; then echo "all passed ($DEST)"; else echo "FAILURES above ($DEST)"; fi
exit $FAILED
