#!/usr/bin/env bash
# bench/run.sh — the CPU benchmark: tfuse against PyTorch eager, torch.compile
# and ONNX Runtime on the same models, batch, precision and thread count, in
# one run.
#
#   bench/run.sh                      # everything: venv, build, all models, train and infer
#   bench/run.sh --models gpt --modes infer --iters 10
#   bench/run.sh --precision bf16     # mixed precision only: tfuse --precision=bf16, the peers under autocast
#   bench/run.sh --quick              # tiny sizes, 3 steps, 1 repetition: checks the harness, records nothing
#
# It makes (or reuses) a virtual environment with torch (CPU), onnx, onnxscript
# and onnxruntime; builds tfuse in Release (build-bench/; where Release does not
# build, RelWithDebInfo, and the results say so); measures this machine's fp32
# FMA peak (bench/peak.c); then, --reps times over (default 5), for each model
# (bench/models/{mlp,resnet,gpt}.ir at their own sizes, and the small models
# small_{conv,mlp,gpt}.ir, steps of 0.2-2 ms), mode (train, infer) and
# precision (fp32, bf16, fp16), one after the other so that a slow spell of
# the machine hits every tool alike:
#
#   tfuse    build-bench/tfuse bench MODEL --mode=M --target=cpu --iters N
#   eager    bench/peers.py --peer eager   (the twin in bench/twins.py)
#   compile  bench/peers.py --peer compile (torch.compile, Inductor; in train the whole
#            step: the model, its backward through AOTAutograd, clipping and the optimizer)
#   ORT      bench/peers.py --peer ort     (the twin exported with torch.onnx; inference only)
#
# tfuse runs first; the peers then get the thread count tfuse reports
# (`threads:`), so all use the same number. Each repetition's ratio
# tfuse/peer compares two measurements taken moments apart; the table gives
# the median over repetitions and its spread, and flags a spread too wide to
# trust. Raw outputs go to bench/results/<date>-cpu/, the markdown table to
# stdout, and a dated section with the machine, the command and the table to
# bench/RESULTS.md.
#
# Options:
#   --reps N           repetitions of every measurement, interleaved (default 5)
#   --precision "P.."  of fp32, bf16 and fp16 (default all three), for tfuse and the peers
#   --peers "A B"      default "eager compile ort" (ort: inference only)
#   --iters N          timed steps per measurement (default 20); the median is reported
#   --warmup N         untimed steps before them (default 3; tfuse gets --warmup N
#                      where its `bench --help` lists it)
#   --threads N        threads to ask for (default: nproc); tfuse gets it as
#                      --threads N where its `bench --help` lists that flag, and
#                      always as OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, TFUSE_NUM_THREADS
#   --models "A B"     default "mlp resnet gpt small_conv small_mlp small_gpt"
#   --modes "A B"      default "train infer"
#   --dim MODEL:K=V    override a dim for one model, for every tool (repeatable)
#   --venv DIR         default $TFUSE_BENCH_VENV or $HOME/.cache/tfuse-bench-venv
#   --no-install       use the venv as it is (fail if a package is missing)
#   --tfuse PATH       use this tfuse binary instead of building build-bench/
#   --peers-only       time the peers even though `tfuse bench` does not work
#                      (its column says n/a and why); otherwise that is an error
#   --quick            tiny dims, 3 steps, 1 warm-up; implies --no-record
#   --no-record        do not append to bench/RESULTS.md
#   --out DIR          raw output directory (default bench/results/<date>-cpu)
#   --timeout S        limit for each single measurement (default 1800 s)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
COMMAND="bench/run.sh$(printf ' %q' "$@")"
LOAD_AT_START="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || true)"
awk -v l="${LOAD_AT_START:-0}" 'BEGIN { exit !(l + 0 > 0.5) }' &&
    echo "bench/run.sh: warning: load average $LOAD_AT_START: other work is running, CPU timings will be skewed" >&2

ITERS=20 WARMUP=3 THREADS="$(nproc)" MODELS="mlp resnet gpt small_conv small_mlp small_gpt" MODES="train infer" REPS=5 PRECISION="fp32 bf16 fp16" PEERS="eager compile ort"
VENV="${TFUSE_BENCH_VENV:-$HOME/.cache/tfuse-bench-venv}"
INSTALL=1 TFUSE="" PEERS_ONLY=0 QUICK=0 RECORD=1 OUT="" TIMEOUT=1800
declare -A DIMS=()

BENCH_NAME=bench/run.sh
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS="$2"; REPS_SET=1; shift 2 ;;
        --precision) PRECISION="$2"; shift 2 ;;
        --peers) PEERS="$2"; shift 2 ;;
        --iters) ITERS="$2"; shift 2 ;;
        --warmup) WARMUP="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --models) MODELS="$2"; shift 2 ;;
        --modes) MODES="$2"; shift 2 ;;
        --dim) m="${2%%:*}"; kv="${2#*:}"; [ "$m" != "$2" ] || die "--dim wants MODEL:K=V, got $2"
               DIMS[$m]="${DIMS[$m]:-} $kv"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        --tfuse) TFUSE="$2"; shift 2 ;;
        --peers-only) PEERS_ONLY=1; shift ;;
        --quick) QUICK=1; RECORD=0; shift ;;
        --no-record) RECORD=0; shift ;;
        --out) OUT="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "bench/run.sh: unknown option $1" >&2; usage ;;
    esac
done

case "$REPS" in ''|*[!0-9]*|0) die "--reps wants a positive integer, got '$REPS'" ;; esac
PRECISION="${PRECISION//,/ }"
for prec in $PRECISION; do
    case "$prec" in fp32|bf16|fp16) ;; *) die "--precision wants fp32, bf16 or fp16 (or a list of them), got '$prec'" ;; esac
done
for peer in $PEERS; do
    case "$peer" in eager|compile|ort) ;; *) die "--peers: unknown peer '$peer' (eager, compile, ort)" ;; esac
done

if [ "$QUICK" = 1 ]; then
    ITERS=3 WARMUP=1
    [ -n "${REPS_SET:-}" ] || REPS=1
    DIMS[mlp]="B=16 H=64 ${DIMS[mlp]:-}"
    DIMS[resnet]="N=2 C1=8 C2=16 C3=32 ${DIMS[resnet]:-}"
    DIMS[gpt]="B=1 T=32 ${DIMS[gpt]:-}"
fi

STAMP="$(date -u +%Y-%m-%d-%H%M)"
OUT="${OUT:-bench/results/$STAMP-cpu}"
mkdir -p "$OUT"
echo "== raw output: $OUT" >&2

# ---- 1. the Python environment, 2. tfuse --------------------------------
# ONNX's packages only where ORT is a peer (--peers without ort runs on a venv that lacks them)
case " $PEERS " in *" ort "*) ensure_venv "$VENV" "$INSTALL" cpu numpy onnx onnxscript onnxruntime ;;
                   *) ensure_venv "$VENV" "$INSTALL" cpu numpy ;; esac
if [ -z "$TFUSE" ]; then
    # -U: let the LLVM emitter follow detection again if gpu.sh configured build-bench without it
    build_tfuse "$OUT" -UTFUSE_WITH_LLVM
fi
[ -x "$TFUSE" ] || die "no tfuse binary at $TFUSE"

tfuse_env() { env OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS="$THREADS" TFUSE_NUM_THREADS="$THREADS" "$@"; }
# --threads and --warmup where this tfuse has them (its --help says); the environment above otherwise
TFUSE_FLAGS=()
bench_help="$("$TFUSE" bench --help 2>&1 || true)"
grep -q -- '--threads' <<<"$bench_help" && TFUSE_FLAGS+=(--threads "$THREADS")
grep -q -- '--warmup' <<<"$bench_help" && TFUSE_FLAGS+=(--warmup "$WARMUP")

# Does `tfuse bench` exist and run on the CPU target? A tiny MLP says.
TFUSE_NA=""
probe="$(tfuse_env "$TFUSE" bench bench/models/mlp.ir --mode=infer --target=cpu --iters 1 --dim B=2 --dim H=8 2>&1)" || true
if ! grep -q '^step_ms:' <<<"$probe"; then
    TFUSE_NA="$( (grep -i -m1 'error\|not available\|not part' <<<"$probe" || grep -m1 . <<<"$probe") | cut -c1-200)"
    TFUSE_NA="${TFUSE_NA:-no output}"
    if [ "$PEERS_ONLY" = 0 ]; then
        echo "bench/run.sh: 'tfuse bench --target=cpu' does not work in this build, so there is nothing to compare:" >&2
        echo "    $TFUSE bench bench/models/mlp.ir --mode=infer --target=cpu --iters 1  ->  $TFUSE_NA" >&2
        echo "  (run with --peers-only to time PyTorch and ONNX Runtime anyway)" >&2
        exit 1
    fi
    echo "== tfuse bench unavailable ($TFUSE_NA): timing the peers only" >&2
fi

# ---- 3. the measurements --------------------------------------------------
dim_flags() { local kv; for kv in ${DIMS[$1]:-}; do printf -- '--dim %s ' "$kv"; done; }

# the ceiling: this machine's fp32 FMA peak on the threads the tools get
PEAK_BIN="$(mktemp -d)/peak"
if cc -O3 -pthread bench/peak.c -o "$PEAK_BIN" 2> "$OUT/peak.err"; then
    "$PEAK_BIN" "$THREADS" > "$OUT/peak.txt" 2>> "$OUT/peak.err" || echo "reason: peak exited with status $?" >> "$OUT/peak.txt"
    rm -rf "$(dirname "$PEAK_BIN")"
else
    echo "reason: bench/peak.c did not compile ($(tail -1 "$OUT/peak.err"))" > "$OUT/peak.txt"
fi

for rep in $(seq 1 "$REPS"); do
for model in $MODELS; do
    [ -f "bench/models/$model.ir" ] || die "no model bench/models/$model.ir"
    for mode in $MODES; do
    for prec in $PRECISION; do
        TFUSE_PREC=()
        [ "$prec" = fp32 ] || TFUSE_PREC=(--precision="$prec")
        base="$OUT/${model}__${prec}__${mode}"
        sfx="__r$rep"
        threads="$THREADS"
        if [ -n "$TFUSE_NA" ]; then
            printf 'reason: %s\n' "$TFUSE_NA" > "${base}__tfuse${sfx}.txt"
        else
            echo "== [$rep/$REPS] $model $mode $prec: tfuse" >&2
            # shellcheck disable=SC2046
            tfuse_env timeout "$TIMEOUT" "$TFUSE" bench "bench/models/$model.ir" --mode="$mode" --target=cpu \
                --iters "$ITERS" "${TFUSE_FLAGS[@]}" "${TFUSE_PREC[@]}" $(dim_flags "$model") > "${base}__tfuse${sfx}.txt" 2>&1 ||
                echo "reason: tfuse bench exited with status $?" >> "${base}__tfuse${sfx}.txt"
            t="$(sed -n 's/^threads: *\([0-9][0-9]*\).*/\1/p' "${base}__tfuse${sfx}.txt" | head -1 || true)"
            if [ -n "$t" ] && [ "$t" != "$THREADS" ]; then
                echo "   note: tfuse used $t threads (asked for $THREADS); the peers use $t too" >&2
                threads="$t"
            fi
        fi
        for peer in $PEERS; do
            [ "$peer" = ort ] && [ "$mode" = train ] && continue   # ORT times inference only
            echo "== [$rep/$REPS] $model $mode $prec: $peer ($threads threads)" >&2
            # shellcheck disable=SC2046
            timeout "$TIMEOUT" "$PY" bench/peers.py --model "$model" --mode "$mode" --peer "$peer" --device cpu \
                --precision "$prec" --threads "$threads" --iters "$ITERS" --warmup "$WARMUP" $(dim_flags "$model") \
                > "${base}__${peer}${sfx}.txt" 2> "${base}__${peer}${sfx}.err" ||
                echo "reason: peers.py exited with status $? ($(tail -1 "${base}__${peer}${sfx}.err"))" >> "${base}__${peer}${sfx}.txt"
        done
    done
    done
done
done

# ---- 4. the report --------------------------------------------------------
TABLE="$("$PY" bench/report.py cpu "$OUT")"
{
    echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — CPU"
    echo
    machine_lines
    echo "- peers: torch $("$PY" -c 'import torch; print(torch.__version__)')" \
         "$("$PY" -c 'import onnxruntime; print(", onnxruntime", onnxruntime.__version__)' 2>/dev/null)"
    echo "- command: \`$COMMAND\` ($REPS interleaved repetitions of $ITERS timed steps after $WARMUP warm-up; $PRECISION)"
    echo "- raw output: \`$OUT/\`"
    echo
    echo "$TABLE"
    echo
} > "$OUT/section.md"
cat "$OUT/section.md"
[ "$RECORD" = 1 ] && append_results "$OUT/section.md"
exit 0
