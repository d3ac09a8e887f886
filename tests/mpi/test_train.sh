#!/usr/bin/env bash
# test_train.sh TFUSE MPIRUN REPO TMPDIR — `mpirun -np N tfuse train`:
#   - N ranks with batch b end where one process with batch N*b does, within
#     fp32 rounding (docs/distributed.md states the bound: 1e-5 of each
#     tensor's largest element after 20 steps), for N = 2 and 3;
#   - every rank ends with the same params and buffers, bit for bit (the
#     command compares the ranks' hashes and says so), on the examples and a
#     model with batch norm and dropout, in fp32, bf16 and fp16;
#   - two runs write the same checkpoint, byte for byte, and k steps then
#     --resume to n write the checkpoint n straight steps write;
#   - ranks that disagree refuse to start and say in what; a killed rank and
#     a hung rank end the job with a message, within the timeout; Ctrl-C on
#     the launcher stops every rank at one step and rank 0 writes the
#     checkpoint once.
set -u
tfuse=$1 mpirun=$2 repo=$3 tmp=$4
rm -rf "$tmp"
mkdir -p "$tmp"
. "$repo/tests/cli/lib.sh"
root=""
[ "$(id -u)" = 0 ] && root=--allow-run-as-root
mpi() { local np=$1; shift; "$mpirun" $root --oversubscribe -np "$np" "$@"; }
cd "$tmp"

python3 - <<'EOF'
import numpy as np
r = np.random.default_rng(7)
np.save("x.npy", r.standard_normal((240, 64)).astype(np.float32))
np.save("y.npy", r.integers(0, 10, 240).astype(np.int64))
np.save("img.npy", r.standard_normal((96, 3, 32, 32)).astype(np.float32))
np.save("lab.npy", r.integers(0, 10, 96).astype(np.int64))
np.save("tok.npy", r.integers(0, 64, (48, 16)).astype(np.int64))
np.save("tgt.npy", r.integers(0, 64, (48, 16)).astype(np.int64))
EOF
cat >cmp.py <<'EOF'
# cmp.py A B BOUND [SKIP...]: every tensor of two checkpoints (but SKIP) within BOUND of its largest element
import json, struct, sys, numpy as np
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        dt = {'F32': np.float32, 'I64': np.int64, 'F16': np.float16, 'BF16': np.uint16, 'F64': np.float64}[v['dtype']]
        s, e = v['data_offsets']; out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt).reshape(v['shape'])
    return out
a, b, bound = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys(), (a.keys(), b.keys())
worst = max(np.abs(a[k].astype(np.float64) - b[k]).max() / max(np.abs(a[k]).max(), 1e-30) for k in a if k not in sys.argv[4:])
print(f"worst difference {worst:.3g} of a tensor's largest element (bound {bound:g})")
sys.exit(0 if worst <= bound else 1)
EOF
D="--data x=x.npy,y=y.npy"
mlp=$repo/examples/mlp.ir

# one process with the global batch against N ranks (fp32: the rounding is the only difference)
for n in 2 3; do
  $tfuse train "$mlp" --precision=fp32 --dim F=64 --dim B=$((24 * n)) --steps 20 $D --save one$n.ckpt >one$n.out 2>&1 ||
    bad "one process, B=$((24 * n)): $(cat one$n.out)"
  if mpi $n "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=24 --steps 20 $D --save dp$n.ckpt >dp$n.out 2>&1 &&
     grep -q "identical on all $n ranks" dp$n.out && grep -q "training .* on $n ranks: 240 samples, global batches of $((24 * n))" dp$n.out; then
    ok
  else
    bad "$n ranks: $(cat dp$n.out)"
  fi
  if python3 cmp.py one$n.ckpt dp$n.ckpt 1e-5 >cmp$n.out; then ok; else bad "$n ranks against one process: $(cat cmp$n.out)"; fi
done
# the step is the global batch's: without data parallel averaging, the ranks' params would differ
grep -q "per step .* MB averaged" dp2.out && ok || bad "no all-reduce figures: $(cat dp2.out)"

# gradient accumulation (2 micro-batches) and clipping see the global gradient: 2 ranks of 12 against one
# process of 24, each accumulating 2
sed 's/accumulate = 1/accumulate = 2/' "$mlp" >acc.ir
$tfuse train acc.ir --precision=fp32 --dim F=64 --dim B=24 --steps 12 $D --save acc1.ckpt >/dev/null 2>&1 || bad "accumulate, one process"
if mpi 2 "$tfuse" train acc.ir --precision=fp32 --dim F=64 --dim B=12 --steps 12 $D --save acc2.ckpt >acc.out 2>&1 &&
   python3 cmp.py acc1.ckpt acc2.ckpt 1e-5 >>acc.out; then ok; else bad "accumulate = 2 on 2 ranks: $(cat acc.out)"; fi

# --eval-data: the ranks share the batches and gather the sums; what one process says of the same params
mpi 3 "$tfuse" train "$mlp" --dim F=64 --dim B=16 --steps 20 $D --eval-data x=x.npy,y=y.npy --eval-every 10 --save ev.ckpt \
  >ev3.out 2>&1 || bad "eval on 3 ranks: $(cat ev3.out)"
$tfuse train "$mlp" --dim F=64 --dim B=48 --steps 20 $D --eval-data x=x.npy,y=y.npy --resume ev.ckpt >ev1.out 2>&1
if [ "$(grep -c '^eval after step' ev3.out)" = 2 ] && [ -n "$(grep '^eval after step 20' ev1.out)" ] &&
   [ "$(grep '^eval after step 20' ev3.out)" = "$(grep '^eval after step 20' ev1.out)" ]; then ok
else bad "eval on 3 ranks against one process: $(cat ev3.out ev1.out)"; fi

# the cuda target (on cuda-emu): NCCL's path, in buckets on a stream of its own inside the step's CUDA
# graph (the stand-in averages through the job's communicator, as the cpu target does), against the cpu
# target; the host's path (TFUSE_CUDA_NCCL=0, outside any graph) gives the same bytes as NCCL's; synchronized
# batch norm's statistics (each allreduce at once) on the cnn
mpi 2 "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=24 --steps 5 $D --save cpu5.ckpt >/dev/null 2>&1 || bad "cpu, 5 steps"
if TFUSE_CUDA_EXPLAIN=1 mpi 2 "$tfuse" train "$mlp" --target=cuda-emu --precision=fp32 --dim F=64 --dim B=24 --steps 5 $D \
     --allreduce-bucket=1000 --save emu5.ckpt >emu.out 2>&1 && grep -q "identical on all 2 ranks" emu.out &&
   grep -q "cuda: allreduce: NCCL (cuda-emu.*) over 2 ranks, rank 1; 3 buckets, 76840 bytes, on a stream of their own; each step one CUDA graph" emu.out &&
   python3 cmp.py cpu5.ckpt emu5.ckpt 1e-4 >>emu.out; then ok
else bad "cuda-emu's NCCL path on 2 ranks: $(cat emu.out)"; fi
if TFUSE_CUDA_NCCL=0 TFUSE_CUDA_EXPLAIN=1 mpi 2 "$tfuse" train "$mlp" --target=cuda-emu --precision=fp32 --dim F=64 --dim B=24 --steps 5 $D \
     --allreduce-bucket=1000 --save host5.ckpt >host.out 2>&1 &&
   grep -q "cuda: allreduce: on the host, through the job's communicator (TFUSE_CUDA_NCCL=0)" host.out && cmp -s emu5.ckpt host5.ckpt; then ok
else bad "cuda-emu's host path against its NCCL path: $(cat host.out)"; fi
mpi 2 "$tfuse" train "$repo/examples/cnn.ir" --precision=fp32 --dim N=4 --steps 3 --data images=img.npy,labels=lab.npy --sync-batchnorm=on \
  --save bn-cpu.ckpt >/dev/null 2>&1 || bad "cnn, synchronized batch norm, cpu"
if mpi 2 "$tfuse" train "$repo/examples/cnn.ir" --target=cuda-emu --precision=fp32 --dim N=4 --steps 3 --data images=img.npy,labels=lab.npy \
     --sync-batchnorm=on --save bn-emu.ckpt >bn.out 2>&1 && grep -q "identical on all 2 ranks" bn.out &&
   python3 cmp.py bn-cpu.ckpt bn-emu.ckpt 1e-4 >>bn.out; then ok
else bad "cuda-emu, synchronized batch norm on 2 ranks: $(cat bn.out)"; fi

# ZeRO-1 (--shard-optimizer=on): each rank keeps its chunk of the optimizer state; the params, and the
# checkpoint (the chunks gathered in the params' shapes), are byte for byte those of an unsharded run, on
# 2 ranks and on 3 (chunks of unequal fill); a sharded checkpoint resumes sharded and unsharded alike
for n in 2 3; do
  mpi $n "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=16 --steps 8 $D --save u$n.ckpt >/dev/null 2>&1 || bad "unsharded, $n ranks"
  if mpi $n "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=16 --steps 8 $D --shard-optimizer=on --save z$n.ckpt >z$n.out 2>&1 &&
     grep -q "identical on all $n ranks.*but for each rank's chunk of the optimizer state" z$n.out && cmp -s u$n.ckpt z$n.ckpt; then ok
  else bad "sharded against unsharded, $n ranks: $(cat z$n.out)"; fi
done
mpi 3 "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=16 --steps 3 $D --shard-optimizer=on --save zr.ckpt >/dev/null 2>&1
cp zr.ckpt zu.ckpt
mpi 3 "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=16 --steps 8 $D --shard-optimizer=on --resume zr.ckpt --save zr.ckpt >zr.out 2>&1
mpi 3 "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=16 --steps 8 $D --resume zu.ckpt --save zu.ckpt >zu.out 2>&1
if cmp -s u3.ckpt zr.ckpt && cmp -s u3.ckpt zu.ckpt; then ok; else bad "a sharded checkpoint resumed: $(cat zr.out zu.out)"; fi
# the planned peak per rank falls; lamb and a job of another size are refused, and so is 'on' outside mpirun
peak() { "$tfuse" compile "$mlp" --dim F=64 --dim B=16 --data-parallel=on "$@" --stats -o "$PWD/peak.tfp" 2>&1 | sed -n 's/^peak_bytes: //p'; }
p1=$(peak) p3=$(peak --shard-optimizer=3)
if [ -n "$p1" ] && [ -n "$p3" ] && [ "$p3" -lt "$p1" ]; then ok; else bad "planned peak sharded over 3 ranks ($p3) is not under unsharded ($p1)"; fi
sed 's/optimizer = adamw(lr=1e-3, weight_decay=0.01)/optimizer = lamb(lr=1e-3)/' "$mlp" >lamb.ir
expect 1 "lamb with shard_optimizer" -- "$tfuse" compile lamb.ir --dim F=64 --data-parallel=on --shard-optimizer=2 -o "$PWD/l.tfp"
expect 1 "'on' is for tfuse train under mpirun" -- "$tfuse" compile "$mlp" --data-parallel=on --shard-optimizer=on -o "$PWD/l.tfp"
"$tfuse" compile "$mlp" --mode=train --dim F=64 --dim B=16 --data-parallel=on --shard-optimizer=2 -o "$PWD/sh2.tfp" >/dev/null 2>&1
out=$("$mpirun" $root --oversubscribe -np 3 "$tfuse" train sh2.tfp --steps 2 $D 2>&1)
if [ $? -ne 0 ] && grep -q "shards its optimizer state over 2 ranks (shard_optimizer), and this job has 3" <<<"$out"; then ok
else bad "a program sharded for 2 ranks on 3: $out"; fi

# the same bits run to run, and through a resume
mpi 2 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps 16 $D --save a.ckpt >/dev/null 2>&1 || bad "run a"
mpi 2 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps 16 $D --save b.ckpt >/dev/null 2>&1 || bad "run b"
mpi 2 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps 7 $D --save c.ckpt >/dev/null 2>&1 || bad "run c (7 steps)"
mpi 2 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps 16 $D --resume c.ckpt --save c.ckpt >c.out 2>&1 || bad "resume c: $(cat c.out)"
if cmp -s a.ckpt b.ckpt; then ok; else bad "two runs of 2 ranks wrote different checkpoints"; fi
if cmp -s a.ckpt c.ckpt; then ok; else bad "7 steps + --resume to 16 differ from 16 straight steps on 2 ranks"; fi

# a checkpoint's data position is in global samples: resumed on 3 ranks of 16 (the same global batch of
# 48), 2 ranks of 24 go on with the same data order, and no note says otherwise
mpi 2 "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=24 --steps 16 $D --save g2.ckpt >/dev/null 2>&1 || bad "run g2"
mpi 2 "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=24 --steps 9 $D --save g3.ckpt >/dev/null 2>&1 || bad "run g3 (9 steps)"
if mpi 3 "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=16 --steps 16 $D --resume g3.ckpt --save g3.ckpt >g3.out 2>&1 &&
   ! grep -q "data order is not" g3.out && python3 cmp.py g2.ckpt g3.ckpt 1e-5 >>g3.out; then ok
else bad "2 ranks resumed on 3 with the same global batch: $(cat g3.out)"; fi
mpi 2 "$tfuse" train "$mlp" --precision=fp32 --dim F=64 --dim B=16 --steps 12 $D --resume g3.ckpt >g4.out 2>&1
if grep -q "batches of 48; now 240 in batches of 32: the data order is not the original run's" g4.out; then ok
else bad "a resume with another global batch: no note: $(cat g4.out)"; fi

# batch norm (per-rank statistics, averaged running statistics) and dropout, every precision
cat >bn.ir <<'EOF'
dim B = 8
input  x : f32[B, 64]
input  y : i64[B]
param  w1 : f32[64, 32] = kaiming_uniform()
param  g : f32[32] = ones()
param  b : f32[32] = zeros()
buffer rm : f32[32] = zeros()
buffer rv : f32[32] = ones()
param  w2 : f32[32, 10] = kaiming_uniform()
h    = linear(x, w1)
hb   = reshape(h, shape=[B, 32, 1, 1])
n    = batchnorm(hb, g, b, rm, rv)
r    = relu(n)
f    = reshape(r, shape=[B, 32])
d    = dropout(f, p=0.25)
lg   = linear(d, w2)
loss = cross_entropy(lg, y)
output loss
train {
  optimizer = adam(lr=1e-3)
}
EOF
for prec in fp32 bf16 fp16; do
  if mpi 3 "$tfuse" train bn.ir --precision=$prec --steps 12 $D --save bn_$prec.ckpt >bn_$prec.out 2>&1 &&
     grep -q "identical on all 3 ranks" bn_$prec.out; then ok; else bad "batch norm and dropout, $prec, 3 ranks: $(cat bn_$prec.out)"; fi
done
# synchronized batch norm: the global batch's statistics, so the params are one process's (the running
# variance is unbiased with the rank's count, docs/distributed.md; without it the params are 1.1 apart)
sed 's/d    = dropout(f, p=0.25)/d    = mul(f, 1.0)/' bn.ir >bnsync.ir
$tfuse train bnsync.ir --precision=fp32 --dim B=16 --steps 10 $D --save sync1.ckpt >/dev/null 2>&1 || bad "bnsync, one process"
if mpi 2 "$tfuse" train bnsync.ir --precision=fp32 --dim B=8 --steps 10 $D --save sync2.ckpt --sync-batchnorm=on >sync.out 2>&1 &&
   python3 cmp.py sync1.ckpt sync2.ckpt 1e-5 rv >>sync.out; then ok; else bad "synchronized batch norm: $(cat sync.out)"; fi
mpi 2 "$tfuse" train bnsync.ir --precision=fp32 --dim B=8 --steps 10 $D --save sync3.ckpt >/dev/null 2>&1
if python3 cmp.py sync1.ckpt sync3.ckpt 0.1 rv >/dev/null; then bad "per-rank batch norm matched one process's: the check above proves nothing"; else ok; fi
if mpi 2 "$tfuse" train "$repo/examples/cnn.ir" --dim N=8 --steps 6 --data images=img.npy,labels=lab.npy >cnn.out 2>&1 &&
   grep -q "identical on all 2 ranks" cnn.out; then ok; else bad "cnn.ir on 2 ranks: $(cat cnn.out)"; fi
if mpi 2 "$tfuse" train "$repo/examples/transformer.ir" --steps 4 --data tokens=tok.npy,targets=tgt.npy >tr.out 2>&1 &&
   grep -q "identical on all 2 ranks" tr.out; then ok; else bad "transformer.ir on 2 ranks: $(cat tr.out)"; fi

# ranks that disagree (an MPMD job: two command lines)
out=$("$mpirun" $root --oversubscribe -np 1 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps 3 $D : \
      -np 1 "$tfuse" train "$mlp" --dim F=64 --dim B=12 --steps 3 $D 2>&1)
if [ $? -ne 0 ] && grep -q "rank 1 differs from rank 0 in the batch size" <<<"$out"; then ok; else bad "disagreeing ranks: $out"; fi
# each rank training its own model is refused
expect 2 "each rank would train a model of its own" -- mpi 2 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps 3 $D --data-parallel=off

# the pids of a job's ranks, found by the --log path only that job's command line holds (so that a
# test running beside this one is never hit), and a rank's number from its environment
rank_of() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }
ranks_of() { for p in $(pgrep -f -- "--log $PWD/$1.csv"); do [ -n "$(rank_of "$p")" ] && echo "$p"; done; }   # not mpirun
# strike NAME TIMEOUT SIGNAL: a long 2-rank job (output NAME.out), sent SIGNAL to one rank once it trains;
# sets job, victim, vrank, rc and took
strike() {
  local name=$1 timeout=$2 sig=$3 start
  start=$(date +%s)
  TFUSE_COMM_TIMEOUT=$timeout mpi 2 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps 300000 --log-every 300000 \
    --data "x=$PWD/x.npy,y=$PWD/y.npy" --log "$PWD/$name.out.csv" >"$name.out" 2>&1 &
  job=$!
  for _ in $(seq 50); do grep -q "^training" "$name.out" 2>/dev/null && break; sleep 0.2; done
  sleep 1
  victim=$(ranks_of "$name.out" | tail -1)
  vrank=$(rank_of "$victim")
  kill "-$sig" "$victim"
  wait $job
  rc=$?
  kill -9 "$victim" 2>/dev/null
  took=$(( $(date +%s) - start ))
}

# a rank killed: the launcher ends the job and names it
strike kill 20 KILL
if [ -n "$vrank" ] && [ $rc -ne 0 ] && [ $took -lt 40 ] && grep -q "rank $vrank" kill.out; then ok
else bad "a killed rank ($vrank, pid $victim): exit $rc after $took s: $(cat kill.out)"; fi

# a rank that hangs (stopped): the other gives up at the timeout, names it, and ends the job
strike hang 3 STOP
if [ -n "$vrank" ] && [ $rc -ne 0 ] && [ $took -lt 40 ] && grep -q "did not complete within 3 s: a rank has died or hangs" hang.out &&
   grep -q "the rank not answering: $vrank" hang.out; then ok
else bad "a hung rank: exit $rc after $took s: $(cat hang.out)"; fi

# Ctrl-C on the launcher: every rank stops after one step, rank 0 writes the checkpoint, once
rm -f int.ckpt
"$mpirun" $root --oversubscribe -np 2 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps 300000 --log-every 300000 $D \
  --save int.ckpt >int.out 2>&1 &
job=$!   # mpirun itself, which passes the signal on to the ranks
for _ in $(seq 50); do grep -q "^training" int.out && break; sleep 0.2; done
sleep 1
kill -INT $job
wait $job
if [ -s int.ckpt ] && [ "$(grep -c "checkpoint written to int.ckpt" int.out)" = 1 ] &&
   [ "$(grep -c "interrupt: stopping after the current step" int.out)" = 1 ]; then ok; else bad "Ctrl-C: $(cat int.out)"; fi
step=$(sed -n 's/.*interrupted at step \([0-9]*\).*/\1/p' int.out)
if mpi 2 "$tfuse" train "$mlp" --dim F=64 --dim B=24 --steps $((step + 2)) $D --resume int.ckpt >res.out 2>&1 &&
   grep -q "resuming at step $step" res.out; then ok; else bad "resume after Ctrl-C: $(cat res.out)"; fi

echo "mpi train: $pass passed, $fail failed"
[ "$fail" = 0 ]
