#!/usr/bin/env python3
"""Attention alone: tfuse's fused kernels against PyTorch's
scaled_dot_product_attention and tfuse's decomposed path, in one run.

    .venv/bin/python bench/attention.py                      # cpu: B=4 H=12 T=1024 D=64 causal, fp32 and bf16
    .venv/bin/python bench/attention.py --reps 3 --dim T=512 --precisions fp32
    python3 bench/attention.py --target cuda --precisions bf16 --reps 3   # a GPU: B=8 H=12 T=1024 D=64 (GPT-2 small)

On --target cuda the peers are PyTorch's SDPA on the GPU as it chooses
(its flash kernel for these shapes) and, where PyTorch has it, cuDNN's
(SDPBackend.CUDNN_ATTENTION), both timed with CUDA events; the table adds
each tool's TFLOP/s (the causal half of the two forward matmuls, 2 B H T^2 D
FLOPs, and twice that for the backward: 3x in a training step) and
cuDNN / fused, the share of cuDNN's speed tfuse reaches (issue 30's target:
0.6 or more). --target cuda-emu rehearses it on the CPU (PyTorch on the CPU,
no cuDNN; small shapes: its times mean nothing).

Work per step (the same for every tool):
  infer  O = attention(q, k, v), causal, q/k/v inputs in the precision
         (PyTorch: F.scaled_dot_product_attention under inference_mode, its
         CPU flash kernel);
  train  forward, loss = mse(O, target), backward, SGD (lr 0.1) on q, k, v
         as params. fp32: f32 params. bf16: tfuse trains f32 params with
         --precision=bf16 (casts to bf16, f32 master update); PyTorch gets
         bf16 leaf tensors (no casts at all: the kernel's cost alone, the
         peer's best case).

tfuse runs `tfuse bench FILE --target=cpu --threads N` with
--attention=fused and --attention=decomposed; PyTorch runs in a child
process with torch.set_num_threads(N). Each repetition runs every
(precision, mode, tool) once, in that order, so a slow spell of the machine
hits all alike; a step time is the median of --iters steps after warm-up.
The table gives, per row, the median over repetitions of each tool's step
time and of the ratios fused/SDPA and fused/decomposed taken within a
repetition, with their range. Raw outputs go to --out
(default bench/results/<date>-attention/), the table to stdout and, with
--record, to bench/RESULTS.md.
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TORCH_STEP = r'''
import contextlib, sys, time, torch, torch.nn.functional as F
B, H, T, D, prec, mode, threads, iters, warmup, device, backend = sys.argv[1:]
B, H, T, D, threads, iters, warmup = map(int, (B, H, T, D, threads, iters, warmup))
torch.set_num_threads(threads)
dt = torch.bfloat16 if prec == "bf16" else torch.float32
g = torch.Generator().manual_seed(0)
ctx = contextlib.nullcontext
if backend == "cudnn":
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ctx = lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
if mode == "infer":
    q, k, v = [torch.randn(B, H, T, D, generator=g).to(dt).to(device) for _ in range(3)]
    def step():
        with torch.inference_mode(), ctx():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
else:
    q, k, v = [torch.randn(B, H, T, D, generator=g).to(dt).to(device).requires_grad_() for _ in range(3)]
    t = torch.randn(B, H, T, D, generator=g).to(dt).to(device)
    opt = torch.optim.SGD([q, k, v], lr=0.1)
    def step():
        with ctx():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.mse_loss(o, t).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
for _ in range(warmup):
    step()
ts = []
cuda = device == "cuda"
for _ in range(iters):
    if cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        step()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    else:
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
ts.sort()
print("step_ms: %.4f" % ts[len(ts) // 2])
print("step_ms_min: %.4f" % ts[0])
print("step_ms_max: %.4f" % ts[-1])
print("torch: %s" % torch.__version__)
'''


def model_text(dims, prec, mode):
    dt = "bf16" if prec == "bf16" and mode == "infer" else "f32"
    lines = ["dim %s = %d" % (k, dims[k]) for k in ("B", "H", "T", "D")]
    if mode == "infer":
        lines += ["input %s : %s[B, H, T, D]" % (n, dt) for n in "qkv"]
        lines += ["o = attention(q, k, v, causal=true)", "output o"]
    else:
        lines += ["param %s : f32[B, H, T, D] = normal(std=1)" % n for n in "qkv"]
        lines += ["input t : f32[B, H, T, D]", "o = attention(q, k, v, causal=true)", "loss = mse_loss(o, t)",
                  "output loss", "train {", "  optimizer = sgd(lr=0.1)"]
        if prec == "bf16":
            lines.append("  precision = bf16")
        lines.append("}")
    return "\n".join(lines) + "\n"


def parse(text):
    out = {}
    for line in text.splitlines():
        if ": " in line:
            k, v = line.split(": ", 1)
            out[k.strip()] = v.strip()
    return out


def run(cmd, raw_path, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    with open(raw_path, "a") as f:
        f.write("$ %s\n%s%s\n" % (" ".join(cmd), p.stdout, p.stderr))
    if p.returncode != 0:
        sys.exit("error: %s failed (exit %d): %s" % (cmd[0], p.returncode, (p.stderr or p.stdout).strip()[-400:]))
    return float(parse(p.stdout)["step_ms"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--modes", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    ap.add_argument("--dim", action="append", default=[], help="K=V over B=4 H=12 T=1024 D=64 (cuda: B=8)")
    ap.add_argument("--target", default="cpu", choices=["cpu", "cuda", "cuda-emu"])
    ap.add_argument("--tools", nargs="+", default=None, choices=["fused", "decomposed", "sdpa", "cudnn"],
                    help="default: fused decomposed sdpa, and cudnn on cuda")
    ap.add_argument("--tfuse", default=os.path.join(ROOT, "build", "tfuse"))
    ap.add_argument("--python", default=sys.executable, help="the Python with torch for the peer")
    ap.add_argument("--out", default=None)
    ap.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    a = ap.parse_args()
    gpu = a.target != "cpu"
    dims = {"B": 8 if a.target == "cuda" else 4, "H": 12, "T": 1024, "D": 64}
    if a.target == "cuda-emu":
        dims.update(B=1, H=2, T=128)
    tools = a.tools or ["fused", "decomposed", "sdpa"] + (["cudnn"] if a.target == "cuda" else [])
    if "cudnn" in tools and a.target != "cuda":
        ap.error("--tools cudnn needs --target cuda")
    for kv in a.dim:
        k, _, v = kv.partition("=")
        if k not in dims or not v.isdigit():
            ap.error("--dim %s: expected one of B, H, T, D = a number" % kv)
        dims[k] = int(v)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = a.out or os.path.join(ROOT, "bench", "results", stamp + "-attention" + ("-" + a.target if gpu else ""))
    os.makedirs(out, exist_ok=True)
    rows = [(p, m) for p in a.precisions for m in a.modes]
    times = {(r, tool): [] for r in rows for tool in tools}
    for p, m in rows:
        with open(os.path.join(out, "%s-%s.ir" % (p, m)), "w") as f:
            f.write(model_text(dims, p, m))
    script = os.path.join(out, "sdpa_step.py")
    with open(script, "w") as f:
        f.write(TORCH_STEP)
    for rep in range(a.reps):
        for p, m in rows:
            ir = os.path.join(out, "%s-%s.ir" % (p, m))
            raw = os.path.join(out, "%s-%s.txt" % (p, m))
            for tool in tools:
                if tool in ("fused", "decomposed"):
                    cmd = [a.tfuse, "bench", ir, "--mode=" + m, "--target=" + a.target, "--iters", str(a.iters), "--warmup",
                           str(a.warmup), "--attention=" + tool] + ([] if gpu else ["--threads", str(a.threads)])
                else:
                    cmd = [a.python, script, str(dims["B"]), str(dims["H"]), str(dims["T"]), str(dims["D"]), p, m,
                           str(a.threads), str(a.iters), str(a.warmup), "cuda" if a.target == "cuda" else "cpu", tool]
                times[((p, m), tool)].append(run(cmd, raw))
        print("repetition %d of %d done" % (rep + 1, a.reps), file=sys.stderr)

    def med_range(xs):
        return "%.3g (%.3g-%.3g)" % (statistics.median(xs), min(xs), max(xs))
    names = {"fused": "tfuse fused", "decomposed": "tfuse decomposed", "sdpa": "PyTorch SDPA", "cudnn": "cuDNN (PyTorch)"}
    fwd_flops = 2 * dims["B"] * dims["H"] * dims["T"] * dims["T"] * dims["D"]   # the causal half of QK^T and PV
    cols = ["%s ms" % names[t] for t in tools]
    if gpu:
        cols += ["%s TFLOP/s" % names[t] for t in tools]
    cols += ["fused / %s" % t for t in tools if t != "fused" and "fused" in tools]
    if "cudnn" in tools and "fused" in tools:
        cols.append("cuDNN / fused (target >= 0.6)")
    lines = ["| precision | mode | %s |" % " | ".join(cols), "|---|---|%s" % ("---|" * len(cols))]
    for r in rows:
        cells = [med_range(times[(r, t)]) for t in tools]
        if gpu:
            flops = fwd_flops * (3 if r[1] == "train" else 1)
            cells += ["%.1f" % (flops / statistics.median(times[(r, t)]) / 1e9) for t in tools]
        if "fused" in tools:
            f = times[(r, "fused")]
            cells += [med_range([x / y for x, y in zip(f, times[(r, t)])]) for t in tools if t != "fused"]
            if "cudnn" in tools:
                cells.append(med_range([y / x for x, y in zip(f, times[(r, "cudnn")])]))
        lines.append("| %s | %s | %s |" % (r[0], r[1], " | ".join(cells)))
    table = "\n".join(lines)
    cmdline = "bench/attention.py " + " ".join(sys.argv[1:])
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    torch_version = parse(open(os.path.join(out, "fp32-infer.txt" if ("fp32", "infer") in rows else
                                            "%s-%s.txt" % rows[0])).read()).get("torch", "?")
    machine = "%s, %d threads, %s; target %s; tfuse %s (%s), torch %s" % (
        platform.processor() or platform.machine(), a.threads, platform.platform(), a.target, commit or "?", a.tfuse, torch_version)
    print(table)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("command: %s\nmachine: %s\ndims: %s, causal\n\n%s\n" % (cmdline, machine, dims, table))
    if a.record:
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write("\n## %s — attention alone, " + a.target + " (`%s`)\n\n%s; B=%d H=%d T=%d D=%d, causal; %d repetitions, median (range); "
                    "raw output: `%s`.\n\n%s\n" % (datetime.date.today(), cmdline, machine, dims["B"], dims["H"], dims["T"],
                                                 dims["D"], a.reps, os.path.relpath(out, ROOT), table))


if __name__ == "__main__":
    main()
