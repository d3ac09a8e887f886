"""The model zoo's speed: every real architecture of tests/zoo/models.py,
exported with tfuse.export and timed on the cpu target against PyTorch eager
in the same process, inference and one AdamW training step. No numerics are
checked here (tests/zoo/run.py does that); this is the speed half, quick
enough to run over the whole zoo (about 15 s a model).

    .venv/bin/python bench/zoo.py                       # every zoo model -> bench/results/DATE-zoo/
    .venv/bin/python bench/zoo.py --models resnet50,mobilenet_v2 --reps 7

Per model and mode: `reps` interleaved repetitions, each the mean of n
steps of tfuse then n of eager after two warm-up steps of each, with n the
larger of `iters` and what makes each side's share of a repetition at least
`--min-ms` (a 0.2 ms inference step timed 4 times is mostly the hand-over
between the two runtimes' threads: PyTorch's OpenMP workers spin after
its call while tfuse's wake, and the other way round); the
ratio is tfuse/eager (below 1: tfuse is faster), the median of the
per-repetition ratios with its range. The summary is the geometric mean of
the ratios per mode and the worst model of each; a model slower than eager
gets the profile line of tests/zoo/run.py (kernel kinds by share of the
step). Each model runs in a child process of its own; one that fails to
export or compile is listed with its reason and left out of the means.

Written: raw.jsonl (one line a model), table.md (the table and summary).
"""
import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ZOO = os.path.join(ROOT, "tests", "zoo")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, ZOO)


def one(name, threads, reps, iters, min_ms):
    """Times one model; prints one JSON line ("ZOO-SPEED {...}")."""
    import copy
    import torch
    import tfuse
    import models
    from run import _feed, _time_pair, _where_time_goes, call
    torch.set_num_threads(threads)
    spec = models.by_name(name)
    res = {"name": name, "family": spec.family, "source": spec.source}
    stage = "build"
    try:
        case = spec.build(0)
        model = case.model.eval()
        stage = "export (infer)"
        ex = tfuse.export(model, case.inputs)
        stage = "compile (infer)"
        sess = tfuse.compile(ex, mode="infer", target="cpu", threads=threads).session()
        feed = _feed(ex, case.inputs)
        stage = "infer"
        with torch.no_grad():
            res["infer"] = _time_pair(lambda: sess.run(**feed), lambda: call(model, case.inputs), reps, iters, min_ms)
        if res["infer"][2] > 1:
            res["infer_why"] = _where_time_goes(sess, lambda: sess.run(**feed))
        sess = None
        case = spec.build(0)
        model = case.model.train()
        mt = copy.deepcopy(model)
        stage = "export (train)"
        ex = tfuse.export(model, case.inputs, loss_fn=case.loss_fn, targets=case.targets,
                          optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01))
        stage = "compile (train)"
        sess = tfuse.compile(ex, mode="train", target="cpu", threads=threads).session()
        feed = _feed(ex, case.inputs, case.targets)
        ot = torch.optim.AdamW(mt.parameters(), lr=1e-3, weight_decay=0.01)

        def eager_step():
            ot.zero_grad()
            case.loss_fn(call(mt, case.inputs), *case.targets).backward()
            ot.step()
        stage = "train"
        res["train"] = _time_pair(lambda: sess.train_step(**feed), eager_step, reps, max(1, iters // 2), min_ms)
        if res["train"][2] > 1:
            res["train_why"] = _where_time_goes(sess, lambda: sess.train_step(**feed), 2)
    except Exception as e:   # the model's failure, reported in its row
        res["error"] = f"{stage}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    print("ZOO-SPEED " + json.dumps(res), flush=True)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def cell(r):
    if not r:
        return "—"
    t, e, ratio, (lo, hi) = r
    return f"{t:.2f} / {e:.2f} = **{ratio:.2f}** ({lo:.2f}–{hi:.2f})"


def report(results, head):
    rows = ["| model | family | infer ms tfuse / eager = ratio (range) | train ms tfuse / eager = ratio (range) |",
            "|---|---|---|---|"]
    for r in results:
        if "error" in r and "infer" not in r:
            rows.append(f"| {r['name']} | {r.get('family', '')} | not timed: {r['error']} | — |")
            continue
        tr = cell(r.get("train")) if "train" in r else f"not timed: {r.get('error', '')}"
        rows.append(f"| {r['name']} | {r.get('family', '')} | {cell(r.get('infer'))} | {tr} |")
    lines = [head, ""] + rows + [""]
    for mode in ("infer", "train"):
        timed = [r for r in results if r.get(mode)]
        if not timed:
            continue
        g = geomean([r[mode][2] for r in timed])
        worst = max(timed, key=lambda r: r[mode][2])
        slower = sum(r[mode][2] > 1 for r in timed)
        lines.append(f"- {mode}: geometric mean of tfuse/eager {g:.2f} over {len(timed)} models; worst "
                     f"{worst['name']} {worst[mode][2]:.2f}; {slower} slower than eager")
    slow = [f"- {r['name']} {m}: {r[m + '_why']}" for r in results for m in ("infer", "train") if r.get(m + "_why")]
    if slow:
        lines += ["", "Where tfuse is slower than eager, its profile (kernel kinds by share of the step):", ""] + slow
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated names (default: every zoo model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    ap.add_argument("--iters", type=int, default=4, help="inference steps per repetition (training: half)")
    ap.add_argument("--min-ms", type=float, default=50.0,
                    help="each side's least time per repetition, in ms (default 50): sets the steps for fast models")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per model (default 300)")
    ap.add_argument("--out", help="results directory (default bench/results/DATE-zoo)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.reps < 1 or a.iters < 1 or a.threads < 1:
        ap.error("--reps, --iters and --threads must be at least 1")
    if a.one:
        one(a.one, a.threads, a.reps, a.iters, a.min_ms)
        return 0
    import models
    known = [s.name for s in models.ZOO]
    names = known
    if a.models:
        names = [n.strip() for n in a.models.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            print(f"error: no zoo model named {', '.join(unknown)} (tests/zoo/models.py lists them)", file=sys.stderr)
            return 2
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-%H%M")
    out = a.out or os.path.join(HERE, "results", f"{stamp}-zoo")
    os.makedirs(out, exist_ok=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    load = os.getloadavg()[0]
    results = []
    t_all = time.time()
    with open(os.path.join(out, "raw.jsonl"), "w") as raw:
        for n in names:
            t0 = time.time()
            cmd = [sys.executable, os.path.abspath(__file__), "--one", n, "--threads", str(a.threads),
                   "--reps", str(a.reps), "--iters", str(a.iters), "--min-ms", str(a.min_ms)]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                line = next((ln for ln in p.stdout.splitlines() if ln.startswith("ZOO-SPEED ")), None)
                if line is None:
                    tail = (p.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
                    r = {"name": n, "error": f"exit {p.returncode}: {tail}"}
                else:
                    r = json.loads(line[len("ZOO-SPEED "):])
            except subprocess.TimeoutExpired:
                r = {"name": n, "error": f"timeout after {a.timeout} s"}
            r["seconds"] = round(time.time() - t0, 1)
            raw.write(json.dumps(r) + "\n")
            raw.flush()
            results.append(r)
            fi = f"{r['infer'][2]:.2f}" if r.get("infer") else "—"
            ft = f"{r['train'][2]:.2f}" if r.get("train") else "—"
            print(f"{n:28s} infer {fi:>5s}  train {ft:>5s}  {r['seconds']:6.1f} s  {r.get('error', '')}", flush=True)
    head = (f"tfuse {commit}, {platform.machine()}, {os.cpu_count()} CPUs, {a.threads} threads; load average "
            f"{load:.2f} at the start; `bench/zoo.py --reps {a.reps} --iters {a.iters} --min-ms {a.min_ms:g}`"
            f"{' --models ' + a.models if a.models else ''}; {time.time() - t_all:.0f} s")
    text = report(results, head)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    print("\n" + text + f"\nwritten: {out}/table.md, raw.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
