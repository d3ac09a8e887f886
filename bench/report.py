#!/usr/bin/env python3
"""Turn a directory of raw benchmark outputs into the markdown table.

    python3 bench/report.py cpu DIR      # the table bench/run.sh prints
    python3 bench/report.py gpu DIR      # the table bench/gpu.sh prints

DIR holds one file per measurement, named MODEL__PRECISION__MODE__PEER.txt
(PEER: tfuse, eager, compile, compile-max, ort; a second run of tfuse or a
compile peer with a warm cache is PEER-cached), or, repeated,
MODEL__PRECISION__MODE__PEER__rN.txt for repetition N; each holds the
`key: value` lines of `tfuse bench` or peers.py. A file whose output has no
`step_ms` counts as not measured and its reason (an `error:` line, the last
line, or a `reason:` line the scripts write) is shown as `n/a (reason)`.

Ratios are tfuse / peer of median step times: below 1 tfuse is faster. With
repetitions (the CPU table), a time is the median over repetitions of each
repetition's median step, a ratio the median of the per-repetition ratios
(tfuse and the peer measured moments apart), each with its spread (lowest to
highest); a spread wider than SPREAD_WARN of the median is flagged. DIR's
peak.txt (bench/peak.c) gives the machine's fp32 FMA peak, against which the
tfuse step's GFLOP/s (its matmuls and convolutions, `gflops`) is shown.
Standard library only.
"""
import os
import re
import sys

FILE_RE = re.compile(r"^(?P<model>[A-Za-z0-9_]+?)__(?P<prec>[a-z0-9]+)__(?P<mode>train|infer)__(?P<peer>[a-z-]+)"
                     r"(?:__r(?P<rep>[0-9]+))?\.txt$")
SPREAD_WARN = 0.30


def read_kv(path):
    kv, last = {}, ""
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.strip():
                last = line.strip()
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):\s?(.*)$", line)
            if m and m.group(1) not in kv:
                kv[m.group(1)] = m.group(2).strip()
    kv.setdefault("_last", last)
    return kv


def load(d):
    """{(model, prec, mode, peer): kv} of the first (or only) repetition, and
    {(model, prec, mode, peer): {rep: kv}} of all of them."""
    runs, reps = {}, {}
    for fn in sorted(os.listdir(d)):
        m = FILE_RE.match(fn)
        if m:
            key = (m["model"], m["prec"], m["mode"], m["peer"])
            kv = read_kv(os.path.join(d, fn))
            reps.setdefault(key, {})[int(m["rep"] or 0)] = kv
    for key, by_rep in reps.items():
        runs[key] = by_rep[min(by_rep)]
    return runs, reps


def number(kv, key):
    try:
        return float(kv[key])
    except (KeyError, ValueError, TypeError):
        return None


def reason(kv):
    if kv is None:
        return "not run"
    for k in ("reason", "error"):
        if kv.get(k):
            return kv[k]
    return kv.get("_last") or "no step_ms in its output"


def short(text, n=60):
    text = text.replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def fmt(v):
    """3 significant digits, at most 2 decimals above 1: 1234.5, 12.35, 0.0421."""
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}" if v < 100 else f"{v:.1f}"
    return f"{v:.3g}"


# Reasons for n/a cells, numbered as footnotes under the table (one per distinct reason).
NA_REASONS = []


def na(kv):
    r = short(reason(kv), 300)
    if r not in NA_REASONS:
        NA_REASONS.append(r)
    return f"n/a ({'abcdefghijklmnopqrstuvwxyz'[NA_REASONS.index(r) % 26]})"


def na_notes():
    return [f"({'abcdefghijklmnopqrstuvwxyz'[i % 26]}) not measured: {r}" for i, r in enumerate(NA_REASONS)]


def ms(kv):
    v = number(kv, "step_ms") if kv else None
    return fmt(v) if v is not None else na(kv)


def ratio(a, b):
    x = number(a, "step_ms") if a else None
    y = number(b, "step_ms") if b else None
    return fmt(x / y) if x and y else "—"


def mib(kv):
    """Memory in MiB: tfuse on a GPU, what its session holds (device_bytes), else its plan's peak;
    a peer: torch.cuda.max_memory_allocated (peak_bytes)."""
    v = (number(kv, "device_bytes") or number(kv, "peak_bytes")) if kv else None
    return fmt(v / 2**20) if v is not None else "—"


def secs(kv):
    v = number(kv, "compile_ms") if kv and number(kv, "step_ms") is not None else None
    return fmt(v / 1e3) if v is not None else "—"


def tfuse_compile(kv, second=None):
    """tfuse's compile time, cold and cached, in seconds (as text): the passes
    (compile_ms) plus the JIT (jit_ms; jit_ms_cached from its kernel cache)
    where it reports them, else compile_ms of this run and of a second run."""
    if not kv or number(kv, "step_ms") is None:
        return "—", "—"
    c = number(kv, "compile_ms") or 0.0
    j, jc = number(kv, "jit_ms"), number(kv, "jit_ms_cached")
    cold = fmt((c + (j or 0.0)) / 1e3)
    if jc is not None:
        return cold, fmt((c + jc) / 1e3)
    return cold, secs(second)


def keys(runs):
    seen = []
    for (model, prec, mode, _peer) in runs:
        if (model, prec, mode) not in seen:
            seen.append((model, prec, mode))
    order = {"train": 0, "infer": 1}
    models = ["mlp", "resnet", "resnet18", "gpt", "gpt2"]
    return sorted(seen, key=lambda k: (models.index(k[0]) if k[0] in models else len(models), k[0], k[1], order[k[2]]))


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2) if n else None


def spread_text(xs, mid):
    """' (lo–hi)' over repetitions, flagged ⚠ when wider than SPREAD_WARN of the median."""
    if len(xs) < 2 or not mid:
        return ""
    lo, hi = min(xs), max(xs)
    flag = " ⚠" if (hi - lo) / mid > SPREAD_WARN else ""
    return f" ({fmt(lo)}–{fmt(hi)}{flag})"


def rep_times(reps, key):
    return {r: number(kv, "step_ms") for r, kv in (reps.get(key) or {}).items() if number(kv, "step_ms")}


def rep_ms(reps, runs, key):
    t = rep_times(reps, key)
    if not t:
        return ms(runs.get(key))
    mid = median(list(t.values()))
    return fmt(mid) + spread_text(list(t.values()), mid)


def rep_ratio(reps, a, b):
    ta, tb = rep_times(reps, a), rep_times(reps, b)
    rs = [ta[r] / tb[r] for r in ta if r in tb]
    if not rs:
        return "—", None
    mid = median(rs)
    return fmt(mid) + spread_text(rs, mid), mid


def peak_gflops(d):
    try:
        return number(read_kv(os.path.join(d, "peak.txt")), "peak_gflops")
    except OSError:
        return None


def rep_gflops(reps, key, peak):
    g = [number(kv, "gflops") for kv in (reps.get(key) or {}).values() if number(kv, "gflops")]
    if not g:
        return "—"
    mid = median(g)
    return f"{fmt(mid)} ({100 * mid / peak:.0f}%)" if peak else fmt(mid)


def cpu_table_reps(runs, reps, d):
    """The CPU table over repetitions: medians, spreads, the peers side by side."""
    peak = peak_gflops(d)
    nreps = max((len(v) for v in reps.values()), default=1)
    out = [("| model | dims | mode | prec | tfuse ms | eager ms | compile ms | ORT ms | tfuse/eager | tfuse/compile "
            "| tfuse/ORT | tfuse GFLOP/s (of peak) | tfuse compile s cold / cached | tfuse peak MiB |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, prec, mode in keys(runs):
        k = lambda p: (model, prec, mode, p)   # noqa: E731
        t, e = runs.get(k("tfuse")), runs.get(k("eager"))
        dims = (e or runs.get(k("compile")) or {}).get("dims", "")
        cells = []
        for p in ("eager", "compile", "ort"):
            if p == "ort" and mode == "train":
                cells.append("—¹")
            elif k(p) in reps:
                cells.append(rep_ms(reps, runs, k(p)))
            else:
                cells.append("not run")
        ratios = [rep_ratio(reps, k("tfuse"), k(p))[0] if k(p) in reps else "—" for p in ("eager", "compile", "ort")]
        cold, cached = tfuse_compile(t)
        out.append(f"| {model} | {dims} | {mode} | {prec} | {rep_ms(reps, runs, k('tfuse'))} | {cells[0]} | {cells[1]} | {cells[2]} "
                   f"| {ratios[0]} | {ratios[1]} | {ratios[2]} | {rep_gflops(reps, k('tfuse'), peak)} | {cold} / {cached} | {mib(t)} |")
    out.append("")
    out.append(f"{nreps} repetitions, interleaved (every tool once per repetition, one after the other). A time is the "
               "median over repetitions of each run's median step, with the lowest and highest in brackets; a ratio "
               "(below 1: tfuse is faster) is the median of the per-repetition ratios, each from two runs moments "
               f"apart, with its range; ⚠ marks a range wider than {SPREAD_WARN:.0%} of the median, too wide to trust. "
               "compile is torch.compile (Inductor); in train it compiles the whole step (model, backward through "
               "AOTAutograd, clipping and optimizer). GFLOP/s counts the step's matmuls and convolutions (2 per "
               "multiply-add, tfuse's step_flops)" + (f", against this machine's fp32 FMA peak of {fmt(peak)} GFLOP/s "
                                                      "on the same threads (bench/peak.c)." if peak else "."))
    for line in na_notes():
        out.append("")
        out.append(line)
    out.append("")
    out.append("¹ ONNX Runtime's training API (onnxruntime-training) is a separate package that needs an offline "
               "artifact-generation step and its own optimizer; only inference is timed there.")
    return "\n".join(out)


def cpu_table(runs):
    out = [("| model | dims | mode | threads | tfuse ms | PyTorch ms | ORT ms | tfuse/PyTorch | tfuse/ORT "
            "| tfuse compile s cold / cached | ORT export+session s | tfuse peak MiB |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = set()
    for model, prec, mode in keys(runs):
        t = runs.get((model, prec, mode, "tfuse"))
        e = runs.get((model, prec, mode, "eager"))
        o = runs.get((model, prec, mode, "ort"))
        dims = (e or {}).get("dims", "")
        threads = (t or {}).get("threads") if t and number(t, "step_ms") is not None else (e or {}).get("threads", "?")
        if mode == "train":
            ort_cell, ort_ratio = "not measured¹", "—"
            notes.add(1)
        else:
            ort_cell, ort_ratio = ms(o), ratio(t, o)
        cold, cached = tfuse_compile(t)
        ort_comp = secs(o) if mode == "infer" else "—"
        out.append(f"| {model} | {dims} | {mode} | {threads} | {ms(t)} | {ms(e)} | {ort_cell} | {ratio(t, e)} | {ort_ratio} "
                   f"| {cold} / {cached} | {ort_comp} | {mib(t)} |")
    out.append("")
    out.append("Times are medians of the timed steps after warm-up, fp32, the same batch and thread count for all; "
               "a ratio below 1 means tfuse is faster. tfuse's compile time is its passes plus the JIT of its kernels, "
               "cold and from its kernel cache (compile_ms + jit_ms, compile_ms + jit_ms_cached). tfuse's peak is its "
               "planned peak (arena + inputs + params + buffers); the peers' CPU memory is not measured.")
    for line in na_notes():
        out.append("")
        out.append(line)
    if 1 in notes:
        out.append("")
        out.append("¹ ONNX Runtime's training API (onnxruntime-training) is a separate package that needs an offline "
                   "artifact-generation step and its own optimizer; it is not part of the stock onnxruntime wheel, so "
                   "only inference is timed there.")
    return "\n".join(out)


# Dense bf16/fp16 tensor-core peaks (TFLOP/s, no sparsity) by the GPU's name as nvidia-smi gives it,
# most specific first; MFU is tfuse's counted FLOPs (step_gflop: matmuls and convolutions, attention's
# included) per second against it.
GPU_PEAKS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4), ("H800", 989.4),
             ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0)]


def gpu_name(d):
    try:
        with open(os.path.join(d, "nvidia-smi-query.txt")) as f:
            return f.readline().split(",")[0].strip()
    except OSError:
        return ""


def gpu_peak(name):
    for key, tflops in GPU_PEAKS:
        if key in name:
            return tflops
    return None


def best_compile(pr):
    """The faster of torch.compile's default and max-autotune runs (the issue's yardstick)."""
    got = [(number(pr[p], "step_ms"), p) for p in ("compile", "compile-max") if pr[p] and number(pr[p], "step_ms")]
    return min(got)[1] if got else None


def gpu_table(runs, d=""):
    peers = ("eager", "compile", "compile-max")
    head = ("| model | prec | mode | tfuse ms | eager ms | compile ms | max-autotune ms | tfuse/eager | tfuse/compile "
            "| tfuse/max-autotune | tfuse/best compile | peak MiB tfuse / eager / compile / max "
            "| compile s cold / cached: tfuse; compile; max |")
    out = [head, "|" + "---|" * 13]
    for model, prec, mode in keys(runs):
        t = runs.get((model, prec, mode, "tfuse"))
        pr = {p: runs.get((model, prec, mode, p)) for p in peers}
        cached = {p: runs.get((model, prec, mode, p + "-cached")) for p in ("tfuse",) + peers}
        mem = " / ".join(mib(x) for x in (t, *pr.values()))
        comp = "; ".join([" / ".join(tfuse_compile(t, cached["tfuse"]))] +
                         [f"{secs(pr[p])} / {secs(cached[p])}" for p in ("compile", "compile-max")])
        best = best_compile(pr)
        out.append(f"| {model} | {prec} | {mode} | {ms(t)} | {ms(pr['eager'])} | {ms(pr['compile'])} "
                   f"| {ms(pr['compile-max'])} | {ratio(t, pr['eager'])} | {ratio(t, pr['compile'])} "
                   f"| {ratio(t, pr['compile-max'])} | {ratio(t, pr[best]) if best else '—'} | {mem} | {comp} |")
    out.append("")
    out.append("Step times are medians of the timed steps after warm-up (the peers: CUDA events around the step; tfuse: "
               "the host's clock from tf_session_run until its first output, the loss, can be read, the step having "
               "finished on the GPU); a ratio below 1 means tfuse is "
               "faster; the target is tfuse/best compile <= 0.8, against the faster of torch.compile's default and "
               "max-autotune. Peak memory: tfuse's device_bytes (what its session holds for its steps: arena, state, "
               "workspaces; its plan's peak_bytes where a run predates that line); PyTorch's "
               "torch.cuda.max_memory_allocated over the timed steps. Compile time: the first run with an empty cache "
               "(cold) and a second process with the cache it left (cached); for torch.compile it is the warm-up time "
               "beyond steady-state steps. torch.compile wraps the model (forward and, through AOTAutograd, backward); "
               "the optimizer step runs eagerly (PyTorch's default foreach implementation); max-autotune also replays "
               "CUDA graphs.")
    targets = gpu_targets(runs, d)
    if targets:
        out.append("")
        out.extend(targets)
    for line in na_notes():
        out.append("")
        out.append(line)
    return "\n".join(out)


def gpu_targets(runs, d):
    """The issue's other targets, per configuration, from tfuse's own runs: MFU (16-bit rows), its
    generated kernels' bandwidth against a device copy (the --profile run), and the step at a 50%
    memory budget against the unconstrained one (the --checkpoint run)."""
    name = gpu_name(d)
    peak = gpu_peak(name)
    rows = []
    for model, prec, mode in keys(runs):
        t = runs.get((model, prec, mode, "tfuse"))
        prof = runs.get((model, prec, mode, "tfuse-profile"))
        ck = runs.get((model, prec, mode, "tfuse-ckpt"))
        if not (prof or ck or (t and number(t, "step_gflop"))):
            continue
        mfu = "—"
        g, st = (number(t, "step_gflop"), number(t, "step_ms")) if t else (None, None)
        if g and st:
            tflops = g / st  # GFLOP per ms = TFLOP/s
            mfu = f"{tflops:.0f} TFLOP/s" + (f" ({100 * tflops / peak:.0f}%)" if peak and prec in ("bf16", "fp16") else "")
        bw = "—"
        if prof is not None:
            fo, cg, fg = number(prof, "fused_of_copy"), number(prof, "copy_gbps"), number(prof, "fused_gbps")
            under, nk = number(prof, "fused_under_85pct"), number(prof, "fused_kernels")
            bw = (f"{fg:.0f} of {cg:.0f} GB/s ({100 * fo:.0f}%); {under:.0f} of {nk:.0f} kernels under 85%"
                  if fo is not None and cg and fg is not None and under is not None and nk else na(prof))
        cp = "—"
        if ck is not None:
            cs = number(ck, "step_ms")
            cm, tm = mib(ck), mib(t)
            cp = f"{fmt(cs / st)}x the step; {cm} MiB vs {tm}" if cs and st else na(ck)
        rows.append(f"| {model} | {prec} | {mode} | {mfu} | {bw} | {cp} |")
    if not rows:
        return []
    return ["Targets (tfuse alone): MFU counts tfuse's matmul and convolution FLOPs per second"
            + (f" against {name}'s dense 16-bit peak of {peak:.0f} TFLOP/s" if peak else "")
            + " (target: >= 50% on GPT-2 training); generated kernels: their bytes (each read or written once) over "
            "their time against a device-to-device copy measured in the same session, per kernel and all together "
            "(target: >= 85%); checkpointed: the train step at --checkpoint=auto --memory-budget=50% against the "
            "unconstrained one (target: <= 1.25x), with both sessions' device memory.",
            "",
            "| model | prec | mode | tfuse TFLOP/s (MFU) | generated kernels vs copy | checkpointed at 50% |",
            "|---|---|---|---|---|---|"] + rows


def main(argv):
    if len(argv) != 3 or argv[1] not in ("cpu", "gpu"):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    runs, reps = load(argv[2])
    if not runs:
        print(f"report.py: no MODEL__PRECISION__MODE__PEER.txt files in {argv[2]}", file=sys.stderr)
        return 1
    repeated = any(r for by_rep in reps.values() for r in by_rep)
    if argv[1] == "cpu":
        print(cpu_table_reps(runs, reps, argv[2]) if repeated else cpu_table(runs))
    else:
        print(gpu_table(runs, argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
