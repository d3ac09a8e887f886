#!/usr/bin/env bash
# test_cli.sh TFUSE REPO TMPDIR — the tfuse command as a user meets it: help
# for every command, exit codes, messages for misuse, reproducible runs.
set -u
tfuse=$1 repo=$2 tmp=$3
ex=$repo/examples
mkdir -p "$tmp"
. "$(dirname "$0")/lib.sh"
cd "$tmp"   # `tfuse compile` writes its package in the current directory

for c in print opt compile run train bench; do
  expect 0 "usage: tfuse $c" -- "$tfuse" "$c" --help
done
expect 0 "usage:" -- "$tfuse" --help
expect 0 "^tfuse [0-9]" -- "$tfuse" --version
expect 2 "unknown command 'frobnicate'" -- "$tfuse" frobnicate
expect 2 "no model file given" -- "$tfuse" print
expect 2 "unknown or incomplete option '--bogus'" -- "$tfuse" print "$ex/mlp.ir" --bogus
expect 2 "--dim expects NAME=VALUE" -- "$tfuse" print "$ex/mlp.ir" --dim B
expect 2 "--dim value must be an integer" -- "$tfuse" print "$ex/mlp.ir" --dim B=0
expect 2 "--mode expects train or infer" -- "$tfuse" compile "$ex/mlp.ir" --mode=eval
expect 1 "declares no dim named 'Q'" -- "$tfuse" print "$ex/mlp.ir" --dim Q=3
expect 0 "input  x : f32\[B, F\]" -- "$tfuse" print "$ex/mlp.ir" --dim B=128
expect 0 "^dim B = 128" -- "$tfuse" print "$ex/mlp.ir" --dim B=128
expect 2 "no training data: give --data" -- "$tfuse" train "$ex/mlp.ir"
expect 0 "^kernels: [0-9]+" -- "$tfuse" compile "$ex/mlp.ir" --target=cuda --stats
# step_flops: 2 per multiply-add of the matmuls (mlp: B=64, 784 -> 256 -> 10; train adds both weight
# gradients and the hidden layer's dX, not the input's)
expect 0 "^step_flops: 52363264$" -- "$tfuse" compile "$ex/mlp.ir" --stats
expect 0 "^step_flops: 26017792$" -- "$tfuse" compile "$ex/mlp.ir" --stats --mode=infer
# fused_bytes: the generated kernels' least traffic (relu over 16384 floats: read once, written once)
printf 'input x : f32[256, 64]\ny = relu(x)\noutput y\n' > "$tmp/relu.ir"
expect 0 "^fused_bytes: 131072$" -- "$tfuse" compile "$tmp/relu.ir" --mode=infer --stats -o "$tmp/relu.tfp"
# every counter is there with --checkpoint=auto's three besides (a full table once dropped the last ones)
expect 0 "recompute_overhead_permille: [0-9]+.*outputs: 3.*fused_bytes: [0-9]+" -- sh -c "'$tfuse' compile '$ex/transformer.ir' --checkpoint=auto --memory-budget=90% --stats -o '$tmp/t.tfp' | tr '\n' ' '"
if ! nvidia-smi >/dev/null 2>&1; then
  expect 1 "target 'cuda' cannot run here" -- "$tfuse" run "$ex/mlp.ir" --target=cuda --random-inputs
fi
# compile -o DIR for cuda: cubins without a GPU (where NVRTC is present)
rm -rf "$tmp/art"
if out=$("$tfuse" compile "$ex/mlp.ir" --target=cuda --arch=sm_90 -o "$tmp/art" 2>&1); then
  n=$(ls "$tmp/art/cuda/"*.sm_90.cubin 2>/dev/null | wc -l)
  m=$(grep -c " cuda tf_" "$tmp/art/manifest.txt")
  if [ "$n" -gt 0 ] && [ -s "$tmp/art/program.ir" ] && grep -qE "$n cubins holding [0-9]+ kernels for sm_90" <<<"$out" && [ "$m" -ge "$n" ]; then ok; else bad "compile -o for cuda: $out ($n cubins, $m launches)"; fi
  # cubins.txt: every cubin written, and every kernel the manifest launches (tf_X or its second entry tf_X_b) in one of them
  miss=0
  for k in $(sed -n 's/.* cuda \(tf_[0-9a-f]*\)\(_b\)\{0,1\} .*/\1/p' "$tmp/art/manifest.txt" | sort -u); do
    grep -q " $k\( \|$\)" "$tmp/art/cubins.txt" || miss=$((miss + 1))
  done
  files=0
  while read -r f rest; do [ -s "$tmp/art/$f" ] && files=$((files + 1)); done < "$tmp/art/cubins.txt"
  if [ "$miss" = 0 ] && [ "$files" = "$n" ]; then ok; else bad "cubins.txt: $miss kernels in no cubin, $files of $n cubins listed"; fi
else
  if grep -q "nvrtc\|NVRTC" <<<"$out"; then ok; else bad "compile -o for cuda failed without naming NVRTC: $out"; fi
fi
# a cuda package: cubins for two architectures, no GPU needed (where NVRTC is present)
if out=$("$tfuse" compile "$ex/mlp.ir" --target=cuda --mode=infer --arch=sm_80,sm_90 -o "$tmp/c.tfp" 2>&1); then
  if grep -qE "target cuda;.*" <<<"$out" && grep -qE "wrote $tmp/c.tfp: [1-9][0-9]* kernel binaries" <<<"$out"; then ok; else bad "cuda package: $out"; fi
else
  if grep -q "nvrtc\|NVRTC" <<<"$out"; then ok; else bad "a cuda package failed without naming NVRTC: $out"; fi
fi
expect 2 "writes one architecture's cubins into a directory; a package \(-o NAME.tfp\) holds several" -- "$tfuse" compile "$ex/mlp.ir" --target=cuda --arch=sm_80,sm_90 -o "$tmp/art3"
expect 2 "--arch expects GPU architectures such as sm_80 or sm_80,sm_90, found 'sm_80,'" -- "$tfuse" compile "$ex/mlp.ir" --target=cuda --arch=sm_80,
expect 2 "--arch expects GPU architectures" -- "$tfuse" compile "$ex/mlp.ir" --target=cuda --arch=90 -o "$tmp/art2"
expect 2 "--iters expects an integer" -- "$tfuse" bench "$ex/mlp.ir" --iters 0
expect 2 "--threads expects an integer" -- "$tfuse" run "$ex/mlp.ir" --threads=0
# bench on the interpreter works in every build: key: value lines, a median
expect 0 "^step_ms: [0-9.]+$" -- "$tfuse" bench "$ex/mlp.ir" --dim F=16 --target=interp --iters 3 --warmup 0
expect 0 "^gflops: [0-9.]+$" -- "$tfuse" bench "$ex/mlp.ir" --dim F=16 --target=interp --iters 2 --warmup 0
expect 0 "profile: none \(the interp target" -- "$tfuse" bench "$ex/mlp.ir" --dim F=16 --target=interp --iters 1 --profile
# the cpu target: the interpreter's numbers where the build has LLVM; a
# clear reason where it has none
if cpu=$("$tfuse" run "$ex/cnn.ir" --target=cpu --random-inputs --seed 5 2>&1); then
  ref=$("$tfuse" run "$ex/cnn.ir" --target=interp --random-inputs --seed 5 2>&1)
  l1=$(grep '^loss' <<<"$cpu" | awk '{print $5}') l2=$(grep '^loss' <<<"$ref" | awk '{print $5}')
  if python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-3 * max(1, abs(b)) else 1)" "$l1" "$l2"; then ok; else bad "cnn loss on cpu $l1 vs interp $l2"; fi
  # a bad id in the data: the cpu target names the op and its place, as interp does
  printf 'input i : i64[3]\nparam t : f32[4, 2] = normal()\ne = embedding(i, t)\noutput e\n' > "$tmp/emb.ir"
  python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.array([0, 7, 1], dtype=np.int64))" "$tmp/ids.npy"
  expect 1 "emb.ir:3:5: error: gather: id 7 at position 1 is out of range \[0, 4\)" -- "$tfuse" run "$tmp/emb.ir" --input i="$tmp/ids.npy" --target=cpu
  python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.array([0, 12, 1, 3], dtype=np.int64)); np.save(sys.argv[2], np.ones((4, 20), dtype=np.float32))" "$tmp/y.npy" "$tmp/x.npy"
  expect 1 "mlp.ir:16:8: error: one_hot: label 12 at position 1 is out of range \[0, 10\)" -- "$tfuse" run "$ex/mlp.ir" --dim B=4 --dim F=20 --input x="$tmp/x.npy" --input y="$tmp/y.npy" --target=cpu
  # ... and labels reaching one_hot through a reshape, checked by the kernel that reads them
  printf 'input y : i64[2, 3]\ninput l : f32[6, 4]\nr = reshape(y, shape=[6])\nloss = cross_entropy(l, r)\noutput loss\n' > "$tmp/lab.ir"
  python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.array([[0, 1, 2], [3, 9, 1]], dtype=np.int64)); np.save(sys.argv[2], np.ones((6, 4), dtype=np.float32))" "$tmp/yl.npy" "$tmp/ll.npy"
  expect 1 "lab.ir:4:8: error: one_hot: label 9 at position 4 is out of range \[0, 4\)" -- "$tfuse" run "$tmp/lab.ir" --input y="$tmp/yl.npy" --input l="$tmp/ll.npy" --target=cpu
  expect 0 "^kernels_fallback: [0-9]+" -- "$tfuse" bench "$ex/transformer.ir" --target=cpu --iters 2 --profile
  expect 0 "^k[0-9]+_matmul +gemm(_bf16)? " -- "$tfuse" bench "$ex/transformer.ir" --target=cpu --iters 2 --profile
  # each kernel's least traffic (relu over 16384 floats: 64 KiB read, 64 KiB written), its GB/s and its share of a copy's
  expect 0 "^k0_relu +jit +16384 +3 +[0-9.]+ +100.0% +0.131 +[0-9.]+ +[0-9]+%" -- "$tfuse" bench "$tmp/relu.ir" --mode=infer --target=cpu --iters 3 --profile
  expect 0 " copy_gbps: [0-9.]+ fused_kernels: 1 .*fused_of_copy: [0-9.]+" -- sh -c "'$tfuse' bench '$tmp/relu.ir' --mode=infer --target=cpu --iters 3 --profile | tr '\n' ' '"
  # --trace: Chrome trace-event JSON; every kernel call inside its step's span, and each kernel's calls adding up
  # to its --profile row (ms/step x iters)
  out=$("$tfuse" bench "$ex/transformer.ir" --target=cpu --iters 4 --profile --trace "$tmp/tr.json" 2>&1); rc=$?
  printf '%s\n' "$out" >"$tmp/tr.out"
  if [ $rc -eq 0 ] && grep -q "wrote the trace $tmp/tr.json: [0-9]* kernel calls and 4 spans" <<<"$out" &&
     python3 - "$tmp/tr.json" 4 "$tmp/tr.out" <<'PY'; then ok
import json, re, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
iters = int(sys.argv[2])
steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "step")
ks = [e for e in ev if e.get("ph") == "X" and e.get("cat") != "step"]
assert len(steps) == iters and ks, (len(steps), len(ks))
assert all(any(a <= k["ts"] and k["ts"] + k["dur"] <= b + 1e-3 for a, b in steps) for k in ks), "a kernel call outside every step"
sums = {}
for k in ks:
    sums[k["name"]] = sums.get(k["name"], 0) + k["dur"] / 1e3
rows = {m[0]: float(m[1]) for m in re.findall(r"^(k\d+_\w+) +\S+ +\d+ +\d+ +([0-9.]+) ", open(sys.argv[3]).read(), re.M)}
assert rows and set(rows) == set(sums), (sorted(set(rows) ^ set(sums)))
bad = [(n, sums[n] / iters, rows[n]) for n in rows if abs(sums[n] / iters - rows[n]) > 1e-4 + 1e-3 * rows[n]]
assert not bad, bad
PY
  else bad "bench --trace (rc $rc): $out"; fi
  expect 0 "wrote the trace $tmp/run.json: [1-9][0-9]* kernel calls and 1 spans" -- "$tfuse" run "$ex/mlp.ir" --target=cpu --random-inputs --trace "$tmp/run.json"
  expect 1 "--trace /nonexistent/t.json" -- "$tfuse" bench "$ex/mlp.ir" --iters 1 --trace /nonexistent/t.json
  expect 2 "--trace" -- "$tfuse" compile "$ex/mlp.ir" --trace "$tmp/c.json"
  expect 0 "^target: cpu" -- "$tfuse" bench "$ex/mlp.ir" --iters 2
  expect 0 "^compile_ms: [0-9.]+" -- "$tfuse" bench "$ex/mlp.ir" --iters 2 --threads 1
  expect 0 "^threads: 1$" -- "$tfuse" bench "$ex/mlp.ir" --iters 2 --threads 1
  rm -rf "$tmp/llvm"
  expect 0 "" -- "$tfuse" compile "$ex/mlp.ir" --dump-llvm="$tmp/llvm"
  # --llvm-pipeline reaches the JIT: a pipeline LLVM cannot parse fails the run, with LLVM's message
  expect 1 "LLVM optimization failed" -- "$tfuse" run "$ex/mlp.ir" --target=cpu --random-inputs --llvm-pipeline=no-such-pass
  expect 0 "" -- "$tfuse" run "$ex/mlp.ir" --target=cpu --random-inputs --llvm-pipeline="default<O1>"
  if grep -q "^define void @k" "$tmp/llvm/kernels.ll" && grep -qE "<[0-9]+ x (float|double|i16)>" "$tmp/llvm/kernels.ll"; then ok; else bad "--dump-llvm: no vectorized kernels in $tmp/llvm/kernels.ll"; fi
else
  if grep -q "has no LLVM" <<<"$cpu"; then ok; else bad "--target=cpu failed without saying why: $cpu"; fi
  expect 1 "needs a build with LLVM" -- "$tfuse" compile "$ex/mlp.ir" --dump-llvm="$tmp/llvm"
fi
expect 0 "^peak_bytes: [0-9]+" -- "$tfuse" compile "$ex/cnn.ir" --stats
expect 0 "^params: 203530" -- "$tfuse" compile "$ex/mlp.ir" --stats
expect 1 "input 'x' \(f32\) has no data: pass --input x=FILE.npy" -- "$tfuse" run "$ex/mlp.ir"
expect 1 "cannot open" -- "$tfuse" run "$ex/mlp.ir" --input x=/nonexistent.npy --random-inputs
if python3 -c "import numpy" 2>/dev/null; then
  # .npy dtypes tfuse does not take: the list it does take, and the one-line remedy (no list of types it then refuses)
  python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.zeros(4, np.int16)); np.save(sys.argv[2], np.zeros(4, np.complex64))" "$tmp/i16.npy" "$tmp/c64.npy"
  expect 1 "i16.npy: the array is i16, a dtype tfuse does not use: save it as one of f32 f16 f64 i64 i32 bool" -- "$tfuse" run "$ex/mlp.ir" --input x="$tmp/i16.npy" --random-inputs
  expect 1 "unsupported descr '<c8' \(tfuse reads <f4 <f2 <f8 <i8 <i4 \|b1, and these with byte order" -- "$tfuse" run "$ex/mlp.ir" --input x="$tmp/c64.npy" --random-inputs
fi
expect 1 "no such|cannot open" -- "$tfuse" print /nonexistent/model.ir

# reproducible: the same seed gives the same numbers, another seed others
a=$("$tfuse" run "$ex/cnn.ir" --random-inputs --seed 3 2>&1)
b=$("$tfuse" run "$ex/cnn.ir" --random-inputs --seed 3 2>&1)
c=$("$tfuse" run "$ex/cnn.ir" --random-inputs --seed 4 2>&1)
if [ "$a" = "$b" ] && [ "$a" != "$c" ] && grep -q "^loss : f32\[\] = " <<<"$a"; then ok; else bad "seeded runs: $a / $b / $c"; fi

# outputs written as .npy, inputs read back from one: logits of a run fed
# into a model whose input is that tensor
expect 0 "" -- "$tfuse" run "$ex/mlp.ir" --random-inputs --seed 1 --output "logits=$tmp/lg.npy"
printf 'input x : f32[64, 10]\ny = relu(x)\ns = reduce_sum(y, axes=[])\noutput s\n' > "$tmp/sum.ir"
expect 0 "^s : f32\[\] = [0-9]" -- "$tfuse" run "$tmp/sum.ir" --input "x=$tmp/lg.npy"
expect 1 "'x' is f32\[64, 784\], the data given is f32\[64, 10\]" -- "$tfuse" run "$ex/mlp.ir" --input "x=$tmp/lg.npy" --random-inputs
printf 'not a numpy file' > "$tmp/junk.npy"
expect 1 "junk.npy" -- "$tfuse" run "$tmp/sum.ir" --input "x=$tmp/junk.npy"
expect 1 "has no input named 'nope'" -- "$tfuse" run "$tmp/sum.ir" --input "nope=$tmp/lg.npy" --input "x=$tmp/lg.npy"

# run --output computes what was asked for and nothing else: logits needs x,
# not the labels y, and the loss is not computed (fewer kernels, not printed)
python3 - "$tmp/x784.npy" <<'PY'
import struct, sys
h = "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 784), }"
h += " " * (-(len(h) + 11) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() +
                              struct.pack("<%df" % (64 * 784), *[(i % 13) / 13.0 - 0.5 for i in range(64 * 784)]))
PY
rm -f "$tmp/lgx.npy"
expect 0 "^kernels: " -- "$tfuse" run "$ex/mlp.ir" --mode=infer --output "logits=$tmp/lgx.npy" --input "x=$tmp/x784.npy" --stats
if [ -s "$tmp/lgx.npy" ]; then ok; else bad "run --output logits=FILE without y wrote no $tmp/lgx.npy"; fi
all=$("$tfuse" run "$ex/mlp.ir" --random-inputs --stats 2>&1 | sed -n 's/^kernels: //p')
one=$("$tfuse" run "$ex/mlp.ir" --random-inputs --stats --output "logits=$tmp/lgx.npy" 2>&1)
# (the interpreter, where a build has no cpu target, counts no kernels: there the loss's absence says it)
if [ "${all:-0}" -gt 0 ]; then fewer=$([ "$(sed -n 's/^kernels: //p' <<<"$one")" -lt "$all" ] && echo yes); else fewer=yes; fi
if [ -n "$all" ] && [ "$fewer" = yes ] && ! grep -q "loss" <<<"$one"; then ok
else bad "run --output logits still computes the loss ($all kernels with it): $one"; fi
expect 0 "output loss is not asked for: not computed" -- "$tfuse" run "$ex/mlp.ir" --random-inputs --explain --output "logits=$tmp/lgx.npy"
expect 0 "input y: nothing asked for reads it" -- "$tfuse" run "$ex/mlp.ir" --random-inputs --explain --output "logits=$tmp/lgx.npy"
# asking for the loss still asks for the labels
expect 1 "input 'y' \(i64\) has no data" -- "$tfuse" run "$ex/mlp.ir" --input "x=$tmp/x784.npy" --output "loss=$tmp/l.npy"

# params a --params file lacks keep their initial values, and run says which
python3 - "$tmp/partial.safetensors" <<'PY'
import json, struct, sys
w2 = [0.01] * (256 * 10)
h = json.dumps({"w2": {"dtype": "F32", "shape": [256, 10], "data_offsets": [0, 4 * len(w2)]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%df" % len(w2), *w2))
PY
expect 0 "note: .*partial.safetensors has no value for w1, b1, b2; they keep their initial values" -- \
  "$tfuse" run "$ex/mlp.ir" --random-inputs --params "$tmp/partial.safetensors"

# embedding ids and labels from --random-inputs stay in range
expect 0 "^loss : f32\[\] = " -- "$tfuse" run "$ex/transformer.ir" --random-inputs --dim B=2 --dim T=8

# ---- flags that would be ignored are errors (exit 2) that say what is missing
mlp=$ex/mlp.ir
expect 2 "--memory-limit sizes a dim declared auto.*--dim B=auto" -- "$tfuse" compile "$mlp" --memory-limit=1M
expect 2 "--dim B=auto picks the largest B .*--memory-limit=BYTES" -- "$tfuse" compile "$mlp" --dim B=auto
expect 2 "only one dim can be auto \(B and F are\)" -- "$tfuse" compile "$mlp" --dim B=auto --dim F=auto --memory-limit=1M
expect 2 "--dim B=auto is settled by compiling" -- "$tfuse" print "$mlp" --dim B=auto
expect 2 "--checkpoint=auto recomputes values until the step fits a budget: give one with --memory-budget" -- "$tfuse" compile "$mlp" --checkpoint=auto
expect 2 "--checkpoint=auto .* infer mode has none" -- "$tfuse" compile "$mlp" --checkpoint=auto --memory-budget=1M --mode=infer
expect 2 "'tfuse run' takes no --checkpoint: run is inference" -- "$tfuse" run "$mlp" --checkpoint=auto --memory-budget=1M
expect 2 "--memory-budget is the budget of --checkpoint=auto, which is not given" -- "$tfuse" compile "$mlp" --memory-budget=1M
expect 2 "--memory-budget is the budget of --checkpoint=auto" -- "$tfuse" compile "$mlp" --memory-budget=1M --checkpoint=none
expect 2 "--dump-dir says where --dump-ir=all\|PASS writes, and no --dump-ir is given" -- "$tfuse" compile "$mlp" --dump-dir="$tmp/dd"
expect 2 "--input x is given twice" -- "$tfuse" run "$mlp" --input "x=$tmp/a.npy" --input "x=$tmp/b.npy"
expect 2 "--output logits and --output loss write the same file" -- "$tfuse" run "$mlp" --random-inputs --output "logits=$tmp/o.npy" --output "loss=$tmp/o.npy"
expect 2 "--params is given twice" -- "$tfuse" run "$mlp" --params a.st --params b.st
expect 2 "--target is given twice" -- "$tfuse" compile "$mlp" --target=cpu --target=interp
expect 2 "--dim B is given twice" -- "$tfuse" compile "$mlp" --dim B=2 --dim B=3
expect 2 "--disable-pass=fuse is given twice" -- "$tfuse" compile "$mlp" --disable-pass=fuse --disable-pass=fuse
# compile writes a package: the summary, then run and bench start from it without compiling a kernel
rm -f "$tmp/mlp.tfp"
expect 0 "compiled .*mlp.ir: train, bf16, target (cpu|interp); [0-9]+ ops, [0-9]+ kernels .*planned peak" -- "$tfuse" compile "$mlp" --seed 3
if [ -s "$tmp/mlp.tfp" ]; then ok; else bad "compile wrote no mlp.tfp in the current directory"; fi
expect 0 "wrote $tmp/p.tfp: [0-9]+ kernel binaries .*initial params" -- "$tfuse" compile "$mlp" --mode=infer -o "$tmp/p.tfp"
expect 0 "kernels_jit_compiled: 0" -- "$tfuse" run "$tmp/p.tfp" --random-inputs --stats
if "$tfuse" doctor | grep -q "^target cpu: available"; then
  expect 0 "kernels_jit_package: [1-9]" -- "$tfuse" run "$tmp/p.tfp" --random-inputs --stats
  expect 0 "kernels_jit_package" -- "$tfuse" bench "$tmp/p.tfp" --mode=infer --iters 1 --warmup 0
  expect 0 "threads: 1" -- "$tfuse" bench "$tmp/p.tfp" --mode=infer --iters 1 --warmup 0 --threads 1
  expect 1 "TFUSE_CPU_PACKED_MB=lots: expected a number of MiB" -- env TFUSE_CPU_PACKED_MB=lots "$tfuse" run "$mlp" --mode=infer --random-inputs
  expect 1 "TFUSE_CPU_WIDE_CACHE_MB=-1: expected a number of MiB" -- env TFUSE_CPU_WIDE_CACHE_MB=-1 "$tfuse" run "$mlp" --random-inputs
  expect 2 "p.tfp was compiled with target cpu, and this asks for interp" -- "$tfuse" run "$tmp/p.tfp" --random-inputs --target=interp
  # a package starts without LLVM: objload.c links its code, and this machine's target id is remembered in the cache
  # (the runs above left it), so a module that cannot be opened (libtfuse.so itself, which is none) is never opened...
  lib=$(dirname "$tfuse")/libtfuse.so.0
  expect 0 "kernels_jit_package: [1-9]" -- env TFUSE_LLVM_MODULE="$lib" "$tfuse" run "$tmp/p.tfp" --random-inputs --stats
  # ... while compiling needs it, and says which file and why
  expect 1 "libtfuse.so.0 is not tfuse's LLVM JIT module" -- \
    env TFUSE_LLVM_MODULE="$lib" TFUSE_CACHE_DIR="$tmp/fresh-cache" "$tfuse" run "$mlp" --random-inputs
fi
"$tfuse" compile "$mlp" --mode=infer --no-params -o "$tmp/np.tfp" >/dev/null
c=$("$tfuse" run "$tmp/np.tfp" --random-inputs --seed 0 | grep loss)
d=$("$tfuse" run "$mlp" --random-inputs --seed 0 | grep loss)
if [ -n "$c" ] && [ "$c" = "$d" ]; then ok; else bad "a --no-params package runs the initializers: '$c' vs '$d'"; fi
expect 2 "p.tfp was compiled with mode infer, and the command's default is train: add --mode=infer \(the package's\), or compile the model with --mode=train" -- "$tfuse" bench "$tmp/p.tfp" --iters 1
expect 2 "p.tfp was compiled with mode infer, and this asks for train: give --mode=infer \(the package's\), or compile the model with --mode=train" -- "$tfuse" bench "$tmp/p.tfp" --iters 1 --mode=train
expect 2 "p.tfp is a compiled package: --dim changes what it holds" -- "$tfuse" run "$tmp/p.tfp" --random-inputs --dim B=2
expect 2 "p.tfp was compiled with precision bf16, and this asks for fp32" -- "$tfuse" run "$tmp/p.tfp" --random-inputs --precision=fp32
expect 2 "--no-params leaves out the initial params of a package, and this writes none" -- "$tfuse" compile "$mlp" --no-params -o "$tmp/x.ir"
expect 2 "--seed draws the package's initial params, and --no-params leaves them out" -- "$tfuse" compile "$mlp" --no-params --seed 2
head -c 1000 "$tmp/p.tfp" > "$tmp/cut.tfp"
expect 1 "cut.tfp: error: truncated or corrupted" -- "$tfuse" run "$tmp/cut.tfp" --random-inputs
expect 2 "'tfuse print' takes no --stats \(it is a flag of: compile, run\)" -- "$tfuse" print "$mlp" --stats
expect 2 "'tfuse run' takes no -o \(it is a flag of: compile\)" -- "$tfuse" run "$mlp" --random-inputs -o "$tmp/x.ir"
expect 2 "'tfuse compile' takes no --params" -- "$tfuse" compile "$mlp" --params a.st
expect 2 "'tfuse compile' takes no --input" -- "$tfuse" compile "$mlp" --input "x=$tmp/a.npy"
expect 2 "'tfuse bench' takes no --random-inputs" -- "$tfuse" bench "$mlp" --random-inputs
expect 2 "'tfuse opt' takes no --target" -- "$tfuse" opt "$mlp" --target=cpu
expect 2 "'tfuse run' takes no --passes" -- "$tfuse" run "$mlp" --passes=lower --random-inputs
expect 2 "'tfuse compile' takes no --threads" -- "$tfuse" compile "$mlp" --threads 2
expect 2 "--threads sets the cpu target's threads, and the target is interp" -- "$tfuse" bench "$mlp" --threads 2 --target=interp
expect 2 "--arch picks the GPU .* it needs --target=cuda and -o DIR" -- "$tfuse" compile "$mlp" --arch=sm_80
expect 2 "--dump-ir needs a value" -- "$tfuse" compile "$mlp" --dump-ir=
expect 2 "doctor takes no arguments, found 'x.ir'" -- "$tfuse" doctor x.ir
expect 2 "doctor takes no flags but --help and the target settings, found --dim" -- "$tfuse" doctor --dim B=2
# doctor lists the target settings and where each came from; a flag changes one
expect 0 "setting no_tf32: off \(default\)" -- env -u TFUSE_NO_TF32 "$tfuse" doctor
expect 0 "setting no_tf32: on \(env TFUSE_NO_TF32=1\)" -- env TFUSE_NO_TF32=1 "$tfuse" doctor
expect 0 "setting no_tf32: on \(option\)" -- env -u TFUSE_NO_TF32 "$tfuse" doctor --no-tf32
expect 0 "setting cuda_fallback: all \(option\)" -- env -u TFUSE_CUDA_FALLBACK "$tfuse" doctor --cuda-fallback=all
expect 0 "setting cuda_fallback: none \(option\)" -- env TFUSE_CUDA_FALLBACK=all "$tfuse" doctor --cuda-fallback=none
expect 0 "setting cuda_sync: on \(option\)" -- "$tfuse" doctor --cuda-sync
expect 0 "setting llvm_pipeline: default<O1> \(option\)" -- "$tfuse" doctor --llvm-pipeline="default<O1>"
expect 0 "setting jit_cache_kernels: 7 \(option\)" -- "$tfuse" doctor --jit-cache-kernels=7
expect 0 "setting cpu_conv: im2col \(option\)" -- "$tfuse" doctor --cpu-conv=im2col
expect 0 "setting cpu_conv: im2col \(env TFUSE_CPU_CONV=im2col\)" -- env TFUSE_CPU_CONV=im2col "$tfuse" doctor
expect 0 "setting cpu_explain: on \(option\)" -- "$tfuse" doctor --cpu-explain
expect 0 "cpu: convolutions " -- "$tfuse" doctor
expect 2 "--cpu-conv expects onednn or im2col, found 'winograd'" -- "$tfuse" doctor --cpu-conv=winograd
expect 0 "setting cpu_gemm: openblas \(option\)" -- "$tfuse" doctor --cpu-gemm=openblas
expect 0 "setting cpu_gemm: openblas \(env TFUSE_CPU_GEMM=openblas\)" -- env TFUSE_CPU_GEMM=openblas "$tfuse" doctor
expect 2 "--cpu-gemm expects onednn or openblas, found 'mkl'" -- "$tfuse" doctor --cpu-gemm=mkl
# --cpu-explain: how each convolution runs (oneDNN's implementation where the build has it)
if "$tfuse" doctor | grep -q "^target cpu: available"; then
  expect 0 "cpu: kernel k[0-9]+_conv2d: conv2d through im2col \+ GEMM .*: --cpu-conv=im2col" -- "$tfuse" run "$repo/bench/models/resnet.ir" --random-inputs --target=cpu --cpu-conv=im2col --cpu-explain
  if "$tfuse" doctor | grep -q "^cpu: convolutions through oneDNN"; then
    expect 0 "cpu: kernel k[0-9]+_conv2d: conv2d through oneDNN [a-z_0-9:]+" -- "$tfuse" run "$repo/bench/models/resnet.ir" --random-inputs --target=cpu --cpu-explain
    expect 0 "cpu: kernel k[0-9]+_matmul: matmul \(64 x 256\) through oneDNN matmul [a-z_0-9:]+, f32 operands, f32 result, weights packed once" -- "$tfuse" run "$ex/mlp.ir" --mode=infer --precision=fp32 --random-inputs --target=cpu --cpu-explain
    expect 0 "cpu: kernel k[0-9]+_matmul: matmul \(64 x 256\) through OpenBLAS: --cpu-gemm=openblas" -- "$tfuse" run "$ex/mlp.ir" --mode=infer --precision=fp32 --random-inputs --target=cpu --cpu-explain --cpu-gemm=openblas
    expect 0 "cpu: kernel k[0-9]+_matmul: matmul \(64 x 256\) through OpenBLAS: the step updates its weights \(w1\)" -- "$tfuse" bench "$ex/mlp.ir" --precision=fp32 --iters 1 --warmup 0 --target=cpu --cpu-explain
  fi
fi
expect 2 "--cuda-fallback expects none or all, found 'some'" -- "$tfuse" doctor --cuda-fallback=some
expect 2 "'tfuse print' takes no --no-tf32" -- "$tfuse" print "$ex/mlp.ir" --no-tf32
expect 0 "usage: tfuse doctor" -- "$tfuse" doctor --help

# ---- train mode needs an output named loss (exit 1, naming the file)
printf 'input x : f32[4]\nparam w : f32[4] = ones()\nh = mul(x, w)\noutput h\n' > "$tmp/noloss.ir"
expect 1 "noloss.ir: error: --mode=train needs a loss to minimize: an output named 'loss' \(or one floating number output\), and the model has neither" -- "$tfuse" compile "$tmp/noloss.ir" --mode=train
expect 0 "noloss.ir: note: the model has no loss .*: compile's default --mode=train compiled its forward pass alone, in train mode .*--mode=infer compiles it for inference" -- "$tfuse" compile "$tmp/noloss.ir" -o "$tmp/nl.tfp"
expect 1 "noloss.ir: error: bench's default --mode=train needs a loss to minimize" -- "$tfuse" bench "$tmp/noloss.ir" --iters 1
# compile applies --loss and --optimizer as train and bench do (they were once dropped without a word)
expect 0 "compiled .*noloss.ir: train" -- "$tfuse" compile "$tmp/noloss.ir" --loss "mse_loss(h, t)" --optimizer "sgd(lr=0.1)" -o "$tmp/nl.tfp"
expect 1 "unknown optimizer 'nonsense'" -- "$tfuse" compile "$tmp/noloss.ir" --loss "mse_loss(h, t)" --optimizer "nonsense" -o "$tmp/nl.tfp"
# the compiler's rule, said: a scalar output not named loss is what training minimizes
printf 'input x : f32[4]\nparam w : f32[4] = ones()\nh = mul(x, w)\nl = reduce_mean(h, axes=[0])\noutput l\n' > "$tmp/scalarl.ir"
expect 0 "scalarl.ir: note: no output named 'loss': --mode=train minimizes 'l'" -- "$tfuse" compile "$tmp/scalarl.ir" --mode=train -o "$tmp/sl.tfp"
expect 0 "^ops: " -- "$tfuse" compile "$tmp/noloss.ir" --mode=infer --stats
# ... and a loss that is not one floating number is an error at its output
printf 'input x : f32[4]\nparam w : f32[4] = ones()\nh = mul(x, w)\noutput loss = h\n' > "$tmp/vecloss.ir"
expect 1 "vecloss.ir:4:8: error: the loss 'h' is f32\[4\], and training minimizes one floating number" -- "$tfuse" compile "$tmp/vecloss.ir" --mode=train

# ---- files to write are checked before the work, and written whole
expect 1 "tfuse: error: --output /nonexistent/dir/lg.npy: cannot create a file in '/nonexistent/dir'" -- "$tfuse" run "$mlp" --random-inputs --output "logits=/nonexistent/dir/lg.npy"
expect 1 "tfuse: error: --output $tmp: is a directory" -- "$tfuse" run "$mlp" --random-inputs --output "logits=$tmp"
expect 1 "tfuse: error: the model has no output named 'lossy' to compute \(its outputs: loss, logits\)" -- "$tfuse" run "$mlp" --random-inputs --output "lossy=$tmp/l.npy"
expect 1 "tfuse: error: -o /nonexistent/dir/out.ir: cannot create a file in" -- "$tfuse" compile "$mlp" -o /nonexistent/dir/out.ir
expect 1 "tfuse: error: --input /nonexistent.npy: cannot open" -- "$tfuse" run "$mlp" --input x=/nonexistent.npy --random-inputs
expect 0 "" -- "$tfuse" compile "$mlp" -o "$tmp/out.ir"
if [ -s "$tmp/out.ir" ] && ! ls -a "$tmp" | grep -qE '\.tmp\.|tfuse-probe'; then ok; else bad "compile -o: $(ls -a "$tmp")"; fi

# ---- one error prefix: "tfuse: error: " for what the command finds, the
# library's "PLACE: error: " (a file, file:line:col) as it is
while IFS= read -r line; do
  read -r -a cmd <<<"$line"
  msg=$("$tfuse" "${cmd[@]}" 2>&1 >/dev/null | head -n 1)
  if [[ $msg =~ ^(tfuse|[^[:space:]]+):\ error:\  ]]; then ok; else bad "tfuse ${cmd[*]}: first line of stderr has no error prefix: $msg"; fi
done <<LIST
compile $mlp --bogus
run $mlp
run $mlp --input x=$tmp/lg.npy --random-inputs
run $mlp --input x=$tmp/junk.npy --random-inputs
compile $mlp --target=interp --disable-pass=nope
print /nonexistent/model.ir
compile $tmp/noloss.ir --mode=train
train $mlp --data x=/nonexistent.npy
LIST

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
