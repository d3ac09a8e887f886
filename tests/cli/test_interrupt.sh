#!/usr/bin/env bash
# test_interrupt.sh TFUSE REPO TMPDIR — Ctrl-C (SIGINT) and SIGTERM during
# `tfuse train`: the run stops between steps, writes the checkpoint of the
# steps really done (if --save), says so, exits 130, and the checkpoint
# resumes exactly (byte-identical to an uninterrupted run); the CSV log has
# each step once; a second interrupt while the checkpoint is written leaves
# it whole; no temporary file is left by any of it.
set -u
# Job control: without it a script's background jobs start with SIGINT
# ignored (and tfuse keeps a signal ignored by whoever started it).
set -m
tfuse=$1 repo=$2 tmp=$3
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "$0")/lib.sh"
: "$repo"

cat >"$tmp/tiny.ir" <<'EOF'
module tiny
dim B = 4
input  x : f32[B, 3]
input  y : i64[B]
param  w : f32[3, 5] = kaiming_uniform()
buffer acc : f32[3] = zeros()
d    = dropout(x, p=0.5)
lg   = linear(d, w)
loss = cross_entropy(lg, y)
m    = reduce_mean(d, axes=[0])
h    = mul(acc, 0.5)
na   = add(h, m)
update acc = na
output loss
output logits = lg
train {
  optimizer = adam(lr=0.01)
}
EOF
# The same with a 64 MiB buffer no op reads: steps stay fast, writing the
# checkpoint takes a while (a window for a second interrupt).
sed 's/^buffer acc .*/&\nbuffer big : f32[4096, 4096] = zeros()/' "$tmp/tiny.ir" >"$tmp/big.ir"
python3 - "$tmp" <<'EOF' || { echo "FAILED: making the test data"; exit 1; }
import sys
import numpy as np
d = sys.argv[1]
rng = np.random.RandomState(2)
np.save(f"{d}/x.npy", rng.normal(size=(22, 3)).astype(np.float32))
np.save(f"{d}/y.npy", rng.randint(0, 5, size=22).astype(np.int64))
EOF
m=$tmp/tiny.ir
data="x=$tmp/x.npy,y=$tmp/y.npy"

ckpt_step() {
  python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q", f.read(8))[0]; print(json.loads(f.read(n))["__metadata__"]["step"])' "$1" 2>/dev/null
}
no_temp_files() {   # no_temp_files WHAT: nothing like CKPT.tmp.PID or a probe is left in $tmp
  local left
  left=$(ls -a "$tmp" | grep -E '\.tmp\.|tfuse-probe')
  if [ -z "$left" ]; then ok; else bad "$1: temporary files left: $left"; fi
}
# Has process $1 (our child) exited? (A child not yet waited for is a zombie.)
finished() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -z "$st" ] || [ "$st" = Z ]
}
# stop_within PID SECONDS: wait for the run to end; past SECONDS kill it (a
# signal that did nothing must not hang the test). Sets $rc.
stop_within() {
  local k
  for ((k = 0; k < $2 * 10; k++)); do finished "$1" && break; sleep 0.1; done
  if ! finished "$1"; then
    kill -9 "$1" 2>/dev/null
    bad "the run ignored the signal for $2 s and was killed"
  fi
  wait "$1"
  rc=$?
}
# start_train OUT ERR ARGS...: a long run in the background (bounded, in case
# a signal is lost); sets $pid and waits until it has printed its second
# progress line (at most 60 s).
start_train() {
  local out=$1 err=$2
  shift 2
  "$tfuse" train "$@" --steps 2000000 --log-every 1 >"$out" 2>"$err" &
  pid=$!
  for _ in $(seq 600); do
    grep -q '^step 2/' "$out" 2>/dev/null && return 0
    finished "$pid" && break
    sleep 0.1
  done
  bad "the run did not reach step 2: $(cat "$out" "$err")"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 1
}

# ---- SIGINT after a few steps, with --save and --log
if start_train "$tmp/out1" "$tmp/err1" "$m" --data "$data" --save "$tmp/int.st" --log "$tmp/int.csv"; then
  kill -INT "$pid"
  stop_within "$pid" 60
  msg=$(cat "$tmp/err1")
  if [ "$rc" -eq 130 ]; then ok; else bad "exit code after SIGINT: $rc, wanted 130 ($msg)"; fi
  if [[ $msg =~ interrupted\ at\ step\ ([0-9]+):\ checkpoint\ written\ to\ $tmp/int.st ]]; then
    n=${BASH_REMATCH[1]}
    ok
  else
    n=0
    bad "message after SIGINT: $msg"
  fi
  if [ "$(ckpt_step "$tmp/int.st")" = "$n" ] && [ "$n" -ge 2 ]; then ok
  else bad "the checkpoint's step is '$(ckpt_step "$tmp/int.st")', the message said $n"; fi
  # the log has steps 1..n, each once: the steps really done
  if [ "$(tail -n +2 "$tmp/int.csv" | cut -d, -f1 | tr '\n' ' ')" = "$(seq 1 "$n" | tr '\n' ' ')" ]; then ok
  else bad "CSV after SIGINT at step $n: $(tail -n 3 "$tmp/int.csv")"; fi
  no_temp_files "SIGINT"
  # resuming continues exactly: n + 3 steps from the checkpoint == n + 3 straight
  expect 0 "resuming at step $n" -- "$tfuse" train "$m" --data "$data" --steps $((n + 3)) --resume "$tmp/int.st" \
    --save "$tmp/resumed.st" --log "$tmp/int.csv"
  expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps $((n + 3)) --save "$tmp/straight.st"
  if cmp -s "$tmp/resumed.st" "$tmp/straight.st"; then ok; else bad "interrupted at $n + resume to $((n + 3)) differs from $((n + 3)) straight steps"; fi
  if [ "$(tail -n +2 "$tmp/int.csv" | cut -d, -f1 | tr '\n' ' ')" = "$(seq 1 $((n + 3)) | tr '\n' ' ')" ]; then ok
  else bad "CSV after the resume: $(tail -n 5 "$tmp/int.csv")"; fi
fi

# ---- SIGTERM is the same; without --save the message says no checkpoint was written
if start_train "$tmp/out2" "$tmp/err2" "$m" --data "$data"; then
  kill -TERM "$pid"
  stop_within "$pid" 60
  if [ "$rc" -eq 130 ] && grep -qE "interrupted at step [0-9]+: no checkpoint written \(no --save given\)" "$tmp/err2"; then ok
  else bad "SIGTERM without --save: exit $rc, $(cat "$tmp/err2")"; fi
fi

# ---- SIGINT ignored by whoever started tfuse (nohup, a script's background
# job) stays ignored; SIGTERM still stops the run
(trap '' INT; exec "$tfuse" train "$m" --data "$data" --steps 2000000 --log-every 1 >"$tmp/out5" 2>"$tmp/err5") &
pid=$!
for _ in $(seq 600); do grep -q '^step 2/' "$tmp/out5" 2>/dev/null && break; finished "$pid" && break; sleep 0.1; done
kill -INT "$pid" 2>/dev/null
sleep 0.3
if finished "$pid"; then bad "an ignored SIGINT stopped the run: $(cat "$tmp/err5")"; else ok; fi
kill -TERM "$pid" 2>/dev/null
stop_within "$pid" 60
if [ "$rc" -eq 130 ] && grep -qE "interrupted at step [0-9]+" "$tmp/err5"; then ok
else bad "SIGTERM after an ignored SIGINT: exit $rc, $(cat "$tmp/err5")"; fi

# ---- an interrupt before training starts (while compiling) writes nothing:
# an existing file at the --save path is kept as it was. The signal goes as
# soon as tfuse catches SIGINT (SigCgt in /proc), while it sets up.
catches_sigint() {
  local m
  m=$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null)
  [ -n "$m" ] && (((16#$m & 2) != 0))
}
cp "$tmp/int.st" "$tmp/keep.st"
"$tfuse" train "$tmp/big.ir" --data "$data" --steps 2000000 --save "$tmp/keep.st" >"$tmp/out3" 2>"$tmp/err3" &
pid=$!
for _ in $(seq 2000); do catches_sigint "$pid" && break; finished "$pid" && break; sleep 0.005; done
kill -INT "$pid" 2>/dev/null
stop_within "$pid" 60
if [ "$rc" -ne 130 ]; then bad "SIGINT at the start: exit $rc: $(cat "$tmp/err3")"
elif grep -q "interrupted before training started: nothing trained, no checkpoint written" "$tmp/err3"; then
  if cmp -s "$tmp/int.st" "$tmp/keep.st"; then ok; else bad "interrupted before training, yet --save's file changed"; fi
elif grep -qE "interrupted (at|before) step [0-9]+" "$tmp/err3"; then ok   # setup was quicker than the signal
else bad "SIGINT at the start: $(cat "$tmp/err3")"
fi
no_temp_files "SIGINT at the start"

# ---- a second interrupt while the checkpoint is being written: it is
# finished whole (it loads and resumes), nothing half-written, no temporary file
for delay in 0.01 0.05 0.2; do
  rm -f "$tmp/big.st"
  if start_train "$tmp/out4" "$tmp/err4" "$tmp/big.ir" --data "$data" --save "$tmp/big.st"; then
    kill -INT "$pid"
    sleep "$delay"
    kill -INT "$pid" 2>/dev/null
    stop_within "$pid" 60
    step=$(ckpt_step "$tmp/big.st")
    if [ "$rc" -ne 130 ]; then bad "two interrupts ($delay s apart): exit $rc: $(cat "$tmp/err4")"
    elif [ -z "$step" ]; then
      bad "two interrupts ($delay s apart): no whole checkpoint ($(ls -l "$tmp/big.st" 2>&1); $(python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q", f.read(8))[0]; print(json.loads(f.read(n))["__metadata__"])' "$tmp/big.st" 2>&1 | tail -n 2)): $(cat "$tmp/err4")"
    elif ! grep -q "interrupted at step $step: checkpoint written to" "$tmp/err4"; then
      bad "two interrupts ($delay s apart): checkpoint at step $step, message: $(cat "$tmp/err4")"
    elif "$tfuse" train "$tmp/big.ir" --data "$data" --steps $((step + 1)) --resume "$tmp/big.st" >/dev/null 2>&1; then ok
    else bad "two interrupts ($delay s apart): the checkpoint does not resume"; fi
    no_temp_files "two interrupts ($delay s apart)"
  fi
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
