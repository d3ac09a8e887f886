#!/usr/bin/env bash
# test_train.sh TFUSE REPO TMPDIR — the mechanics of `tfuse train` that hold
# whatever a step computes: flags and their errors, the data checks, progress
# lines and the CSV log, checkpoints (byte-identical when resumed, with
# shuffling and dropout, whatever the number of loader threads), evaluation,
# and a non-finite loss. Learning itself is test_train_digits.sh.
set -u
tfuse=$1 repo=$2 tmp=$3
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "$0")/lib.sh"
same() { if cmp -s "$1" "$2"; then ok; else bad "$3: $1 and $2 differ"; fi; }
differ() { if cmp -s "$1" "$2"; then bad "$3: $1 and $2 are identical"; else ok; fi; }

# A small model whose state records the data order and the dropout masks:
# `last` is the last batch after dropout, `acc` a decaying (so order-
# dependent) sum of batch means. Its train block makes w learn once autodiff
# is in; the checks below hold either way.
cat >"$tmp/tiny.ir" <<'EOF'
module tiny
dim B = 4
input  x : f32[B, 3]
input  y : i64[B]
param  w : f32[3, 5] = kaiming_uniform()
buffer acc : f32[3] = zeros()
buffer last : f32[B, 3] = zeros()
d    = dropout(x, p=0.5)
lg   = linear(d, w)
loss = cross_entropy(lg, y)
m    = reduce_mean(d, axes=[0])
h    = mul(acc, 0.5)
na   = add(h, m)
update acc = na
update last = d
output loss
output logits = lg
train {
  optimizer = adam(lr=0.01)
  precision = fp32
}
EOF
# Its loss turns nan at the 4th step (a counter buffer c: log(2.5 - c)).
cat >"$tmp/nan.ir" <<'EOF'
module nan_at_step_4
dim B = 4
input  x : f32[B, 3]
input  y : i64[B]
param  w : f32[3, 5] = kaiming_uniform()
buffer c : f32[] = zeros()
lg   = linear(x, w)
ce   = cross_entropy(lg, y)
z    = mul(ce, 0.0)
r    = sub(2.5, c)
l    = log(r)
loss = add(l, z)
c1   = add(c, 1.0)
update c = c1
output loss
output logits = lg
train {
  optimizer = sgd(lr=0.1)
  precision = fp32
}
EOF
# An input without a batch axis.
cat >"$tmp/literal.ir" <<'EOF'
input  x : f32[4, 3]
input  y : i64[4]
param  w : f32[3, 5] = kaiming_uniform()
lg   = linear(x, w)
loss = cross_entropy(lg, y)
output loss
train {
  optimizer = sgd(lr=0.1)
}
EOF
cat >"$tmp/scalar.ir" <<'EOF'
input  x : f32[]
param  w : f32[] = ones()
loss = mul(x, w)
output loss
train {
  optimizer = sgd(lr=0.1)
}
EOF
# 22 samples: batches of 4 leave 2 out of each epoch's order (5 steps an epoch).
python3 - "$tmp" <<'EOF' || { echo "FAILED: making the test data"; exit 1; }
import json, struct, sys
import numpy as np
d = sys.argv[1]
rng = np.random.RandomState(1)
np.save(f"{d}/x.npy", rng.normal(size=(22, 3)).astype(np.float32))
np.save(f"{d}/y.npy", rng.randint(0, 5, size=22).astype(np.int64))
np.save(f"{d}/y21.npy", rng.randint(0, 5, size=21).astype(np.int64))
np.save(f"{d}/x4.npy", rng.normal(size=(22, 4)).astype(np.float32))
np.save(f"{d}/x64.npy", rng.normal(size=(22, 3)))                      # float64
np.save(f"{d}/x3.npy", rng.normal(size=(3, 3)).astype(np.float32))     # fewer than a batch
np.save(f"{d}/y3.npy", rng.randint(0, 5, size=3).astype(np.int64))
np.save(f"{d}/ex.npy", rng.normal(size=(9, 3)).astype(np.float32))     # eval: 2 batches + 1
np.save(f"{d}/ey.npy", rng.randint(0, 5, size=9).astype(np.int64))
# early stopping: an MLP overfitting random labels (train 256, eval 64)
for name, n in (("es", 256), ("ev", 64)):
    np.save(f"{d}/{name}x.npy", rng.normal(size=(n, 64)).astype(np.float32))
    np.save(f"{d}/{name}y.npy", rng.randint(0, 10, size=n).astype(np.int64))
# a safetensors file with w alone and no metadata (not a training checkpoint)
w = np.full((3, 5), 0.25, np.float32)
h = json.dumps({"w": {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 60]}}).encode()
h += b" " * (-len(h) % 8)
open(f"{d}/plain.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + w.tobytes())
EOF
m=$tmp/tiny.ir
data="x=$tmp/x.npy,y=$tmp/y.npy"

# ---- help and usage errors
expect 0 "usage: tfuse train FILE --data NAME=FILE.npy" -- "$tfuse" train --help
for f in --data --steps --epochs --eval-data --eval-every --early-stop --early-stop-metric --save --save-every --resume --params --log --log-every --workers --seed; do
  expect 0 "$f" -- "$tfuse" train --help
done
expect 2 "no training data: give --data" -- "$tfuse" train "$m"
expect 2 "no training data" -- "$tfuse" train "$m" --steps 3
expect 2 "--data expects NAME=FILE.npy" -- "$tfuse" train "$m" --data "$tmp/x.npy"
expect 2 "--data expects NAME=FILE.npy" -- "$tfuse" train "$m" --data "x=$tmp/x.npy,y="
expect 2 "input 'x' is given twice" -- "$tfuse" train "$m" --data "x=$tmp/x.npy,x=$tmp/x.npy"
expect 2 "--steps expects an integer in \[1, " -- "$tfuse" train "$m" --data "$data" --steps 0
expect 2 "--steps expects an integer" -- "$tfuse" train "$m" --data "$data" --steps ten
expect 2 "--workers expects an integer in \[1, 64\]" -- "$tfuse" train "$m" --data "$data" --workers 65
expect 2 "give --steps or --epochs, not both" -- "$tfuse" train "$m" --data "$data" --steps 3 --epochs 1
expect 2 "--eval-every needs --eval-data" -- "$tfuse" train "$m" --data "$data" --eval-every 2
expect 2 "--save-every needs --save" -- "$tfuse" train "$m" --data "$data" --save-every 2
expect 2 "--early-stop needs --eval-data: it watches the evaluation's loss or accuracy" -- "$tfuse" train "$m" --data "$data" --early-stop=3
expect 2 "--early-stop-metric needs --early-stop=PATIENCE" -- "$tfuse" train "$m" --data "$data" --early-stop-metric=accuracy
expect 2 "--early-stop-metric expects loss or accuracy, found 'f1'" -- "$tfuse" train "$m" --data "$data" --early-stop-metric=f1
expect 2 "--early-stop expects PATIENCE\[,MIN_DELTA\]: a whole number of evaluations from 1 to 1000000" -- "$tfuse" train "$m" --data "$data" --eval-data "$data" --early-stop=0
expect 2 "--early-stop's MIN_DELTA expects a finite number >= 0, found '-1'" -- "$tfuse" train "$m" --data "$data" --eval-data "$data" --early-stop=2,-1
expect 2 "train reads its data with --data" -- "$tfuse" train "$m" --input "x=$tmp/x.npy"
expect 2 "train compiles in train mode" -- "$tfuse" train "$m" --data "$data" --mode=infer
expect 2 "unknown or incomplete option '--data'" -- "$tfuse" run "$m" --data "$data"

# ---- data errors (exit 1), each naming the file and what was expected
expect 1 "the model has no input named 'z' \(its inputs: x, y\)" -- "$tfuse" train "$m" --data "$data,z=$tmp/x.npy"
expect 1 "gives no data for input 'y' \(i64\[4\]\): add y=FILE.npy" -- "$tfuse" train "$m" --data "x=$tmp/x.npy"
expect 1 "x4.npy: the array is f32\[22, 4\], so its samples are \[4\]; input 'x' is f32\[4, 3\], so each sample must be \[3\]" \
  -- "$tfuse" train "$m" --data "x=$tmp/x4.npy,y=$tmp/y.npy"
expect 1 "x.npy has 22 samples but .*y21.npy has 21" -- "$tfuse" train "$m" --data "x=$tmp/x.npy,y=$tmp/y21.npy"
expect 1 "x64.npy: the array is f64, input 'x' is f32 \(no silent conversion" -- "$tfuse" train "$m" --data "x=$tmp/x64.npy,y=$tmp/y.npy"
expect 1 "has 3 samples, fewer than one batch of 4 \(the inputs' first axis, dim B = 4; pick a smaller one with --dim B=3\)" \
  -- "$tfuse" train "$m" --data "x=$tmp/x3.npy,y=$tmp/y3.npy"
expect 1 "fewer than one batch of 4 \(the inputs' first axis, 4, is a number in the model: declare a dim" \
  -- "$tfuse" train "$tmp/literal.ir" --data "x=$tmp/x3.npy,y=$tmp/y3.npy"
expect 0 "3 samples, batches of 3" -- "$tfuse" train "$m" --data "x=$tmp/x3.npy,y=$tmp/y3.npy" --dim B=3 --steps 1
expect 1 "nope.npy.*cannot open" -- "$tfuse" train "$m" --data "x=$tmp/nope.npy,y=$tmp/y.npy"
expect 1 "'x' is a scalar" -- "$tfuse" train "$tmp/scalar.ir" --data "x=$tmp/x.npy"

# ---- a run of 5 steps: progress lines, a CSV row per step, a checkpoint
out=$("$tfuse" train "$m" --data "$data" --steps 5 --log-every 2 --log "$tmp/run.csv" --save "$tmp/s5.st" 2>&1); rc=$?
if [ $rc -eq 0 ]; then ok; else bad "train --steps 5 exited $rc: $out"; fi
if grep -q "22 samples, batches of 4, 5 steps per epoch (2 samples per epoch left out)" <<<"$out"; then ok; else bad "header: $out"; fi
n=$(grep -cE "^step [0-9]+/5  epoch 0  loss [0-9.]+  lr [0-9.e-]+  samples/s [0-9.]+  ETA [0-9:]+$" <<<"$out")
if [ "$n" -eq 3 ] && grep -q "^step 2/5 " <<<"$out" && grep -q "^step 4/5 " <<<"$out" && grep -q "^step 5/5 " <<<"$out"; then ok
else bad "progress lines (wanted steps 2, 4, 5): $out"; fi
if [ "$(head -n1 "$tmp/run.csv")" = "step,epoch,loss,lr,samples_per_s,eval_loss,eval_accuracy" ] && [ "$(wc -l <"$tmp/run.csv")" -eq 6 ] &&
   [ "$(tail -n +2 "$tmp/run.csv" | cut -d, -f1 | tr '\n' ' ')" = "1 2 3 4 5 " ] &&
   [ "$(tail -n +2 "$tmp/run.csv" | grep -cE '^[0-9]+,0,[0-9.e+-]+,[0-9.e+-]*,[0-9.]+,,$')" -eq 5 ]; then ok
else bad "CSV: $(cat "$tmp/run.csv")"; fi
if ls "$tmp" | grep -q '\.tmp\.'; then bad "a temporary file was left: $(ls "$tmp")"; else ok; fi
# the checkpoint's metadata
meta=$(python3 -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
print(json.dumps(h["__metadata__"], sort_keys=True), " ".join(sorted(k for k in h if k != "__metadata__")))' "$tmp/s5.st")
if grep -q '"batch": "4", "epoch": "0", "format": "tfuse-train-1", "model": "tiny.ir", "position": "20", "samples": "22", "seed": "0", "step": "5"' <<<"$meta" &&
   grep -qE '(^| )acc( |$)' <<<"$meta" && grep -qE '(^| )last( |$)' <<<"$meta" && grep -qE '(^| )w( |$)' <<<"$meta"; then ok
else bad "checkpoint metadata/tensors: $meta"; fi

# ---- resuming is byte-identical to an uninterrupted run: across the epoch
# boundary (5) and inside an epoch (7), with shuffling and dropout
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 13 --save "$tmp/s13.st"
expect 0 "resuming at step 5 \(epoch 0\)" -- "$tfuse" train "$m" --data "$data" --steps 13 --resume "$tmp/s5.st" --save "$tmp/r5_13.st"
same "$tmp/s13.st" "$tmp/r5_13.st" "5 steps + resume to 13 vs 13 steps"
# a package trains as its model does: the same 13 steps from tfuse compile's .tfp, byte for byte
(cd "$tmp" && "$tfuse" compile "$m" -o "$tmp/tiny.tfp" >/dev/null)
expect 0 "saved" -- "$tfuse" train "$tmp/tiny.tfp" --data "$data" --steps 13 --save "$tmp/p13.st"
# the same tensors (the metadata names the file trained, tiny.ir or tiny.tfp)
tensors() { python3 -c 'import json,struct,sys
b=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",b[:8])[0]; h=json.loads(b[8:8+n]); h.pop("__metadata__",None)
print(sorted((k,v["dtype"],v["shape"],b[8+n+v["data_offsets"][0]:8+n+v["data_offsets"][1]].hex()) for k,v in h.items()))' "$1"; }
if [ -n "$(tensors "$tmp/s13.st")" ] && [ "$(tensors "$tmp/s13.st")" = "$(tensors "$tmp/p13.st")" ]; then ok; else bad "13 steps from the model vs from its package: the tensors differ"; fi
expect 2 "tiny.tfp is a compiled package: --dim changes what it holds" -- "$tfuse" train "$tmp/tiny.tfp" --data "$data" --dim B=2
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 7 --save "$tmp/s7.st"
expect 0 "resuming at step 7 \(epoch 1\)" -- "$tfuse" train "$m" --data "$data" --steps 13 --resume "$tmp/s7.st" --save "$tmp/r7_13.st"
same "$tmp/s13.st" "$tmp/r7_13.st" "7 steps + resume to 13 vs 13 steps"
# a chain of resumes, and --save-every on the way
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 9 --resume "$tmp/s5.st" --save "$tmp/c9.st"
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 13 --resume "$tmp/c9.st" --save "$tmp/c13.st" --save-every 2
same "$tmp/s13.st" "$tmp/c13.st" "5 + 4 + 4 steps vs 13"
# the ring's batches do not depend on the thread count
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 13 --save "$tmp/w1.st" --workers 1
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 13 --save "$tmp/w7.st" --workers 7
same "$tmp/s13.st" "$tmp/w1.st" "--workers 1 vs 2"
same "$tmp/s13.st" "$tmp/w7.st" "--workers 7 vs 2"
# ... and the checks above are not vacuous: the state moves, and the seed
# (data order and dropout masks) shows in it
differ "$tmp/s5.st" "$tmp/s13.st" "the state after 5 and 13 steps"
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 13 --save "$tmp/seed1.st" --seed 1
differ "$tmp/s13.st" "$tmp/seed1.st" "seeds 0 and 1"
# resuming at or past the end trains nothing and keeps the state as it was
expect 0 "nothing to train: the checkpoint is at step 13 of 10" -- "$tfuse" train "$m" --data "$data" --steps 10 --resume "$tmp/s13.st" --save "$tmp/again.st"
same "$tmp/s13.st" "$tmp/again.st" "a resume with nothing to do"
# the log is appended to when resuming
cp "$tmp/run.csv" "$tmp/run2.csv"
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 8 --resume "$tmp/s5.st" --log "$tmp/run2.csv" --save "$tmp/tmp8.st"
if [ "$(tail -n +2 "$tmp/run2.csv" | cut -d, -f1 | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 " ] && [ "$(grep -c '^step' "$tmp/run2.csv")" -eq 1 ]; then ok
else bad "appended CSV: $(cat "$tmp/run2.csv")"; fi
# the seed comes with the checkpoint; another --seed is refused
expect 0 "seed 1" -- "$tfuse" train "$m" --data "$data" --steps 14 --resume "$tmp/seed1.st"
expect 2 "--seed 3 differs from the seed 0 of" -- "$tfuse" train "$m" --data "$data" --steps 14 --resume "$tmp/s13.st" --seed 3
# what --resume refuses
expect 1 "not a checkpoint of 'tfuse train'.*use --params" -- "$tfuse" train "$m" --data "$data" --resume "$tmp/plain.safetensors"
expect 2 "--params and --resume" -- "$tfuse" train "$m" --data "$data" --resume "$tmp/s5.st" --params "$tmp/s5.st"
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 2 --params "$tmp/plain.safetensors" --save "$tmp/p2.st"
expect 1 "tensor 'acc' matches no param or buffer" -- "$tfuse" train "$tmp/nan.ir" --data "$data" --resume "$tmp/s5.st"

# ---- what can be checked before training is checked before compiling, and
# nothing existing is touched by a run that stops there
echo "keep me" >"$tmp/keep.csv"
cp "$tmp/s5.st" "$tmp/keep.st"
out=$("$tfuse" train "$m" --data "$data" --steps 3 --save /nonexistent/dir/ck.st --log "$tmp/keep.csv" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q "^tfuse: error: --save /nonexistent/dir/ck.st: cannot create a file in '/nonexistent/dir'" <<<"$out" &&
   ! grep -q "^training" <<<"$out" && [ "$(cat "$tmp/keep.csv")" = "keep me" ]; then ok
else bad "an unwritable --save (rc $rc): $out"; fi
expect 1 "tfuse: error: --save $tmp: is a directory" -- "$tfuse" train "$m" --data "$data" --steps 3 --save "$tmp"
expect 1 "tfuse: error: --log /nonexistent/dir/l.csv: cannot create a file in" -- "$tfuse" train "$m" --data "$data" --steps 3 --log /nonexistent/dir/l.csv
expect 1 "tfuse: error: --eval-data $tmp/nope.npy: cannot open" -- "$tfuse" train "$m" --data "$data" --eval-data "x=$tmp/nope.npy,y=$tmp/y.npy"
expect 1 "tfuse: error: --resume $tmp/nope.st: cannot open" -- "$tfuse" train "$m" --data "$data" --resume "$tmp/nope.st"
expect 1 "tfuse: error: --params $tmp/nope.st: cannot open" -- "$tfuse" train "$m" --data "$data" --params "$tmp/nope.st"
# a data mismatch found after compiling still leaves --save's and --log's files as they were
out=$("$tfuse" train "$m" --data "x=$tmp/x4.npy,y=$tmp/y.npy" --steps 3 --save "$tmp/keep.st" --log "$tmp/keep.csv" 2>&1); rc=$?
if [ $rc -eq 1 ] && cmp -s "$tmp/s5.st" "$tmp/keep.st" && [ "$(cat "$tmp/keep.csv")" = "keep me" ]; then ok
else bad "a data error touched existing files (rc $rc): $out"; fi
expect 2 "--log .*x.npy is a data file of --data: it would be overwritten" -- "$tfuse" train "$m" --data "$data" --log "$tmp/x.npy"
expect 2 "--save .*y.npy is a data file of --data" -- "$tfuse" train "$m" --data "$data" --save "$tmp/y.npy"
expect 2 "--log .* is the checkpoint given to --resume" -- "$tfuse" train "$m" --data "$data" --resume "$tmp/s5.st" --log "$tmp/s5.st"
expect 2 "--log and --save name the same file" -- "$tfuse" train "$m" --data "$data" --save "$tmp/same" --log "$tmp/same"
expect 2 "--steps is given twice" -- "$tfuse" train "$m" --data "$data" --steps 3 --steps 4
expect 2 "--save is given twice" -- "$tfuse" train "$m" --data "$data" --save "$tmp/a.st" --save "$tmp/b.st"
expect 2 "--log needs a value" -- "$tfuse" train "$m" --data "$data" --log=
expect 2 "'tfuse train' takes no --stats" -- "$tfuse" train "$m" --data "$data" --stats
expect 2 "--checkpoint=auto recomputes values until the step fits a budget" -- "$tfuse" train "$m" --data "$data" --checkpoint=auto
# a resumed run continues only a log of ours, and leaves another file alone
expect 1 "--log .*keep.csv: not a log of 'tfuse train'" -- "$tfuse" train "$m" --data "$data" --steps 8 --resume "$tmp/s5.st" --log "$tmp/keep.csv"
if [ "$(cat "$tmp/keep.csv")" = "keep me" ]; then ok; else bad "a foreign log was changed"; fi

# ---- a resumed log has each step once: rows past the checkpoint's step
# (from a run that went on after its last checkpoint) are dropped and logged again
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 5 --log "$tmp/re.csv" --save "$tmp/re5.st"
expect 0 "saved" -- "$tfuse" train "$m" --data "$data" --steps 9 --resume "$tmp/re5.st" --log "$tmp/re.csv" --save "$tmp/re9.st"
expect 0 "note: .*re.csv: dropped 4 row\(s\) past step 5" -- "$tfuse" train "$m" --data "$data" --steps 12 --resume "$tmp/re5.st" --log "$tmp/re.csv"
if [ "$(tail -n +2 "$tmp/re.csv" | cut -d, -f1 | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 9 10 11 12 " ] && [ "$(grep -c '^step' "$tmp/re.csv")" -eq 1 ]; then ok
else bad "resumed CSV: $(cat "$tmp/re.csv")"; fi
# a row cut short (a run killed while writing it) is dropped too (with 10-12)
printf '13,2,1.5' >>"$tmp/re.csv"
expect 0 "dropped 4 row\(s\) past step 9" -- "$tfuse" train "$m" --data "$data" --steps 12 --resume "$tmp/re9.st" --log "$tmp/re.csv"
if [ "$(tail -n +2 "$tmp/re.csv" | cut -d, -f1 | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 9 10 11 12 " ]; then ok
else bad "CSV with a cut row, resumed: $(cat "$tmp/re.csv")"; fi

# ---- a checkpoint is accepted by tfuse run --params (training-only state skipped)
expect 0 "^loss : f32\[\] = " -- "$tfuse" run "$m" --params "$tmp/s13.st" --random-inputs
a=$("$tfuse" run "$m" --params "$tmp/s13.st" --random-inputs 2>&1)
b=$("$tfuse" run "$m" --random-inputs 2>&1)
if [ "$a" != "$b" ]; then ok; else bad "run --params CKPT changed nothing: $a"; fi

# ---- epochs, evaluation
expect 0 "^step 10/10 " -- "$tfuse" train "$m" --data "$data" --epochs 2
out=$("$tfuse" train "$m" --data "$data" --steps 6 --eval-data "x=$tmp/ex.npy,y=$tmp/ey.npy" --eval-every 3 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -qE "^eval after step 3:  loss [0-9.]+  accuracy [0-9.]+  \(9 samples\)$" <<<"$out" &&
   grep -qE "^eval after step 6:  loss [0-9.]+  accuracy [0-9.]+  \(9 samples\)$" <<<"$out"; then ok
else bad "eval (rc $rc): $out"; fi
expect 1 "x4.npy: the array is f32\[22, 4\]" -- "$tfuse" train "$m" --data "$data" --steps 1 --eval-data "x=$tmp/x4.npy,y=$tmp/y.npy"
# the log has a row per evaluation: step, epoch, empty training fields, eval_loss, eval_accuracy
"$tfuse" train "$m" --data "$data" --steps 6 --eval-data "x=$tmp/ex.npy,y=$tmp/ey.npy" --eval-every 3 --log "$tmp/ev.csv" >/dev/null 2>&1
if [ "$(grep -cE '^(3,0|6,1),,,,[0-9.e+-]+,[0-9.e+-]+$' "$tmp/ev.csv")" -eq 2 ] && [ "$(wc -l <"$tmp/ev.csv")" -eq 9 ]; then ok
else bad "eval rows in the CSV: $(cat "$tmp/ev.csv")"; fi

# ---- early stopping: a model that overfits random labels. The evaluation loss's best is kept in CKPT.best;
# PATIENCE evaluations without improvement stop the run (exit 0, last checkpoint written); a run stopped by
# --steps and resumed counts on, and ends byte-identical (both checkpoints) to the straight run.
es="$repo/examples/mlp.ir --dim F=64 --dim B=16 --data x=$tmp/esx.npy,y=$tmp/esy.npy --eval-data x=$tmp/evx.npy,y=$tmp/evy.npy --log-every 1000"
out=$("$tfuse" train $es --epochs 60 --early-stop=3 --save "$tmp/es.st" --log "$tmp/es.csv" 2>&1); rc=$?
stop=$(sed -n 's/^stopped early at step \([0-9]*\): the evaluation loss has not improved on [0-9.e+-]* (step \([0-9]*\)) by more than 0 in 3 evaluations; the best state is in .*es.best.st$/\1 \2/p' <<<"$out")
if [ $rc -eq 0 ] && [ -n "$stop" ] && [ "${stop% *}" -lt 960 ] && [ "$(grep -c '^early stop: evaluation loss .* 3 of 3$' <<<"$out")" -eq 1 ] &&
   [ -f "$tmp/es.best.st" ] && grep -q "saved .*es.st (step ${stop% *})" <<<"$out"; then ok
else bad "early stop (rc $rc, stop '$stop'): $out"; fi
# the best checkpoint holds the state of the best evaluation's step: its loss is the smallest eval_loss of the log
best=$(grep -E '^[0-9]+,[0-9]+,,,,' "$tmp/es.csv" | sort -t, -k6 -g | head -n1 | cut -d, -f1)
if [ "$best" = "${stop#* }" ] && python3 -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read(); h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
sys.exit(h["__metadata__"]["step"] != sys.argv[2])' "$tmp/es.best.st" "$best"; then ok
else bad "the best checkpoint is not the step of the least eval_loss ($best; stop line '$stop')"; fi
"$tfuse" train $es --steps $(( ${stop% *} - 24 )) --early-stop=3 --save "$tmp/esr.st" >/dev/null 2>&1
expect 0 "stopped early at step ${stop% *}:" -- "$tfuse" train $es --epochs 60 --early-stop=3 --save "$tmp/esr.st" --resume "$tmp/esr.st"
same "$tmp/es.st" "$tmp/esr.st" "early stopping, straight vs stopped by --steps and resumed (last)"
same "$tmp/es.best.st" "$tmp/esr.best.st" "early stopping, straight vs resumed (best)"
# ---- --trace: each step's span, the waits for its batch, the evaluations, the checkpoints; the kernels inside the steps
out=$("$tfuse" train $es --steps 12 --eval-every 8 --save "$tmp/trc.st" --save-every 5 --trace "$tmp/train.json" 2>&1); rc=$?
kernels=1   # the interp target (the default of a build without LLVM) has no kernels to record
"$tfuse" doctor | grep -q "^default target: interp" && kernels=0
if [ $rc -eq 0 ] && grep -q "wrote the trace $tmp/train.json" <<<"$out" && python3 - "$tmp/train.json" "$kernels" <<'PY'; then ok
import json, sys
from collections import Counter
ev = json.load(open(sys.argv[1]))["traceEvents"]
c = Counter(e.get("cat") for e in ev if e.get("ph") == "X")
steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "step"]
ks = [e for e in ev if e.get("ph") == "X" and e.get("cat") not in ("step", "data", "eval", "checkpoint")]
ok = c["step"] == 12 and c["data"] == 12 and c["eval"] == 1 and c["checkpoint"] == 2 and bool(ks) == (sys.argv[2] == "1")
ok = ok and all(any(a <= k["ts"] <= b for a, b in steps) for k in ks)
sys.exit(not ok)
PY
else bad "train --trace (rc $rc): $out"; fi

# ---- metrics: scalar outputs the train block names are logged (a CSV column each), shown and plotted
cat >"$tmp/met.ir" <<'EOF2'
module met
dim B = 16
input x : f32[B, 64]
input y : i64[B]
param w : f32[64, 10] = kaiming_uniform()
lg = matmul(x, w)
loss = cross_entropy(lg, y)
sq = mul(w, w)
wnorm = reduce_sum(sq, axes=[0, 1])
output loss
output wnorm
train {
  optimizer = sgd(lr=0.1)
  metrics = wnorm
}
EOF2
out=$("$tfuse" train "$tmp/met.ir" --data "x=$tmp/esx.npy,y=$tmp/esy.npy" --steps 8 --log-every 4 --log "$tmp/met.csv" --save "$tmp/met.st" 2>&1); rc=$?
if [ $rc -eq 0 ] && [ "$(grep -cE '^step [48]/8  epoch 0  loss [0-9.]+  wnorm [0-9.]+  lr ' <<<"$out")" -eq 2 ] &&
   [ "$(head -n1 "$tmp/met.csv")" = "step,epoch,loss,lr,samples_per_s,eval_loss,eval_accuracy,wnorm" ] &&
   [ "$(tail -n +2 "$tmp/met.csv" | grep -cE '^[0-9]+,0,[0-9.e+-]+,[0-9.e+-]+,[0-9.]+,,,[0-9.e+-]+$')" -eq 8 ]; then ok
else bad "metrics (rc $rc): $out $(cat "$tmp/met.csv")"; fi
expect 0 "wrote $tmp/met.svg: 3 panels" -- "$tfuse" plot "$tmp/met.csv" -o "$tmp/met.svg"
# a resumed run whose metrics differ from its log's columns: refused before any step, naming both
sed 's/  metrics = wnorm//' "$tmp/met.ir" >"$tmp/nomet.ir"
expect 1 "--log $tmp/met.csv: its columns are 'step,epoch,loss,lr,samples_per_s,eval_loss,eval_accuracy,wnorm', and this run's are 'step,epoch,loss,lr,samples_per_s,eval_loss,eval_accuracy'" -- "$tfuse" train "$tmp/nomet.ir" --data "x=$tmp/esx.npy,y=$tmp/esy.npy" --steps 12 --log "$tmp/met.csv" --resume "$tmp/met.st"

# ---- tfuse plot: the log as an SVG, one panel per quantity, a dot per evaluation; errors name file:line:col
out=$("$tfuse" plot "$tmp/es.csv" -o "$tmp/es.svg" 2>&1); rc=$?
nev=$(grep -cE '^[0-9]+,[0-9]+,,,,' "$tmp/es.csv")
if [ $rc -eq 0 ] && grep -q "wrote $tmp/es.svg: 3 panels, 1 log" <<<"$out" && python3 - "$tmp/es.svg" "$nev" <<'PY'; then ok
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
texts = [t.text for t in root.iter(ns + "text")]
dots = len(list(root.iter(ns + "circle")))
lines = [p for p in root.iter(ns + "polyline") if len(p.get("points").split()) > 10]
sys.exit(not ({"loss", "evaluation accuracy", "learning rate"} <= set(texts) and dots == 2 * int(sys.argv[2]) and len(lines) >= 2))
PY
else bad "plot (rc $rc): $out"; fi
expect 0 "wrote $tmp/two.svg: 3 panels, 2 logs" -- "$tfuse" plot "$tmp/es.csv" "$tmp/run.csv" -o "$tmp/two.svg" --title "two runs"
expect 2 "no log to draw" -- "$tfuse" plot
expect 2 "-o $tmp/es.csv is one of the logs" -- "$tfuse" plot "$tmp/es.csv" -o "$tmp/es.csv"
expect 1 "$tmp/none.csv: cannot open" -- "$tfuse" plot "$tmp/none.csv"
printf 'a,b\n1,2\n' >"$tmp/other.csv"
expect 1 "other.csv:1: not a training log" -- "$tfuse" plot "$tmp/other.csv"
printf 'step,epoch,loss\n1,0,0.5\n2,0,x1\n' >"$tmp/badrow.csv"
expect 1 "badrow.csv:3:5: expected a number in column 'loss', found 'x1'" -- "$tfuse" plot "$tmp/badrow.csv"
printf 'step,epoch,loss\n' >"$tmp/empty.csv"
expect 1 "empty.csv: no rows to plot \(only the header\)" -- "$tfuse" plot "$tmp/empty.csv"

grep -v "output logits" "$m" >"$tmp/nologits.ir"
expect 1 "--early-stop-metric=accuracy: the evaluation of .*nologits.ir gives no accuracy" -- "$tfuse" train "$tmp/nologits.ir" --data "$data" --eval-data "$data" --early-stop=2 --early-stop-metric=accuracy

# ---- a non-finite loss: fp32 stops naming the step; fp16 goes on
expect 1 "tfuse: error: loss is nan at step 4 \(in fp32" -- "$tfuse" train "$tmp/nan.ir" --data "$data" --steps 6 --log "$tmp/nan.csv"
if [ "$(tail -n1 "$tmp/nan.csv" | cut -d, -f1,3)" = "4,nan" ]; then ok; else bad "nan CSV: $(cat "$tmp/nan.csv")"; fi
out=$("$tfuse" train "$tmp/nan.ir" --data "$data" --steps 6 --precision fp16 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "note: step 4: loss is nan in fp16" <<<"$out" && grep -q "^step 6/6 " <<<"$out" &&
   grep -q "3 step(s) skipped" <<<"$out"; then ok
else bad "fp16 nan (rc $rc): $out"; fi

# ---- on a terminal: one line, redrawn in place (\r, erase to the end)
if command -v script >/dev/null; then
  cmd=$(printf '%q ' "$tfuse" train "$m" --data "$data" --steps 5)
  raw=$(script -qec "$cmd" /dev/null 2>&1)
  if [ "$(grep -c 'step ' <<<"$raw")" -eq 1 ] && grep -q $'\r\033\[Kstep 5/5  epoch 0  loss [0-9.]*  lr [0-9.]*  [0-9]* samples/s  ETA 0:00' <<<"$raw"; then ok
  else bad "terminal progress: $(od -c <<<"$raw" | head -20)"; fi
else
  bad "script(1) (util-linux) is missing: the terminal check cannot run"
fi

# ---- a save killed midway leaves the previous checkpoint loadable: saving
# every step, SIGKILL the run at some moment after its first save; the
# checkpoint at the path is whole (a resume from it works) whenever it was killed
for delay in 0.1 0.4 0.9; do
  rm -f "$tmp/killed.st"
  "$tfuse" train "$m" --data "$data" --steps 1000000 --save "$tmp/killed.st" --save-every 1 --log-every 100000 \
    >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 200); do [ -e "$tmp/killed.st" ] && break; sleep 0.1; done   # the first save
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if [ ! -e "$tmp/killed.st" ]; then bad "no checkpoint was written within 20 s"; continue; fi
  step=$(python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q", f.read(8))[0]; print(json.loads(f.read(n))["__metadata__"]["step"])' "$tmp/killed.st" 2>/dev/null)
  if [ -n "$step" ] && "$tfuse" train "$m" --data "$data" --steps $((step + 1)) --resume "$tmp/killed.st" \
      --save "$tmp/killed2.st" >/dev/null 2>&1; then ok
  else bad "killed after ${delay}s: the checkpoint (step '$step') does not resume"; fi
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
