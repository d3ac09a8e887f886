"""The model zoo: real architectures from torchvision, timm and transformers
(tests/zoo/models.py), each exported with tfuse.export, compiled for the cpu
target, run against PyTorch in float64, and trained against PyTorch in
float64 (SGD with momentum, and AdamW).

    .venv/bin/python tests/zoo/run.py                    # the whole zoo; writes tests/zoo/RESULTS.md
    .venv/bin/python tests/zoo/run.py --subset ci        # what scripts/test.sh runs
    .venv/bin/python tests/zoo/run.py --models resnet18,hf_bert --speed

Each model runs in a child process of its own (a crash, a hang past
--timeout or an uncaught Python error there is that model's failure, not the
run's end). The verdict per model:

  pass     every checked tensor within tolerance
  refused  tfuse.export or tfuse.compile said no with a clear message (an
           ExportError or a tfuse.Error): listed with the reason
  WRONG    a number out of tolerance
  CRASH    anything else: a Python traceback from inside tfuse, a signal,
           a timeout

The tolerance (the issue's, and python/tests/test_export.py's): with ref the
float64 result and e32 PyTorch float32's own error against it, tfuse's error
must be at most max(10 * e32, 1e-5), each error max|x - ref| / max(max|ref|,
FLOOR) per tensor. FLOOR = 1e-3 judges a tensor that is exactly zero (a
padding row's gradient, a bias PyTorch leaves at zero) absolutely, where a
relative error would divide by zero.

PyTorch float32's own error is the largest of PERTURBED + 1 float32
results: PyTorch on the model as it is, and on the model and inputs with
every float moved by at most one float32 rounding (_perturbed, each with a
seed of its own). One sample is not enough: where a model amplifies rounding (a deep ResNet
with random weights normalizes its last blocks over a few values per
channel), one float32 result can land near the float64 one by luck. Measured
on ResNet-50 (batch 4, 64x64, seed 0): PyTorch float32 in channels_last
order, as valid a float32 computation as the default, has 9700x the
default's error on layer4.2.bn3.bias's gradient (7.0e-2 against 7.2e-6) and
32% error on layer4.0.conv1.weight's, so no float32 implementation but
PyTorch's own default could be held to 10x that one sample.

Exit status: 1 when a model gives WRONG or CRASH, or when a model expected
to pass (not in models.EXPECTED_REFUSALS) is refused; 0 otherwise.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

TOL_FACTOR, TOL_FLOOR, DENOM_FLOOR = 10.0, 1e-5, 1e-3


def rel(x, ref, keep=None):
    """max|x - ref| / max(max|ref|, DENOM_FLOOR), the numerator over the
    elements where keep is true (all when keep is None)."""
    import numpy as np
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape:
        return math.inf
    if x.size == 0:
        return 0.0
    d = np.abs(x - ref)
    same_inf = np.isinf(x) & np.isinf(ref) & (np.sign(x) == np.sign(ref))
    d = np.where(same_inf, 0.0, d)
    if np.isnan(d).any():
        return math.inf
    if keep is not None:
        d = np.where(keep, d, 0.0)
    fin = np.abs(np.where(np.isfinite(ref), ref, 0.0))
    return float(d.max() / max(fin.max(), DENOM_FLOOR))


def call(m, args):
    return m(**args) if isinstance(args, dict) else m(*args)


# ---------------------------------------------------------------------------
# One model, in a child process: prints one JSON line

def _leaves(torch, out):
    import torch.utils._pytree as pytree
    return [t.detach().numpy() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _to64(torch, args):
    f = (lambda t: t.double() if t.is_floating_point() else t)
    return {k: f(v) for k, v in args.items()} if isinstance(args, dict) else tuple(f(t) for t in args)


def _feed(ex, args, targets=()):
    vals = list(args.values()) if isinstance(args, dict) else list(args)
    vals += list(targets)
    return dict(zip(ex.inputs, [t.numpy() for t in vals]))


PERTURBED = 4   # float32 results with inputs and weights moved by one rounding, beside PyTorch's own


GRAD_LR = 2.0 ** 24   # the plain SGD step tfuse's gradient is read off (run_one)


def _param_grads(torch, m):
    """{state_dict key: gradient} of the model's parameters (a tied
    parameter under each of its keys)."""
    return {k: t.grad.detach().numpy().copy() for k, t in m.state_dict(keep_vars=True).items()
            if isinstance(t, torch.nn.Parameter) and t.grad is not None}


def _perturbed(torch, model, args, seed):
    """A copy of the model and inputs with every float multiplied by (1 + u),
    u uniform in [-2^-24, 2^-24]: the values a float32 rounding could have
    given. PyTorch float32 on them is a second, equally valid float32 result
    (module docstring: "PyTorch float32's own error")."""
    import copy
    g = torch.Generator().manual_seed(12345 + seed)

    def jig(t):
        if not t.is_floating_point():
            return t
        u = (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1) * 2.0 ** -24
        return (t.double() * (1 + u)).to(t.dtype)
    m = copy.deepcopy(model)
    with torch.no_grad():
        for t in list(m.parameters()) + list(m.buffers()):
            t.copy_(jig(t))
    a = {k: jig(v) for k, v in args.items()} if isinstance(args, dict) else tuple(jig(t) for t in args)
    return m, a


def _compare(pairs):
    """pairs: (name, got, ref64, (ref32, ...)[, free, reach]) -> (worst error / tolerance, name, err, e32, flips),
    with e32 the largest error of the float32 results (or given in their place, as a number).

    free (a boolean array, or None) marks the elements an optimizer step
    leaves open (_sign_free): they are left out of err and e32, each must
    lie within reach of the float64 value, and flips counts, over all
    pairs, the elements that moved more than reach / 2 from it (a sign
    taken the other way): [tfuse's, each float32 run's...]."""
    import numpy as np
    worst, flips = (0.0, None, 0.0, 0.0), None
    for name, got, r64, r32s, *rest in pairs:
        free, reach = rest if rest else (None, 0.0)
        keep = None if free is None else ~free
        e = rel(got, r64, keep)
        e32 = r32s if isinstance(r32s, float) else max(rel(r, r64, keep) for r in r32s)
        tol = max(TOL_FACTOR * e32, TOL_FLOOR)
        ratio = e / tol if math.isfinite(e) else math.inf
        if free is not None:
            n = [int((np.abs(np.asarray(x, np.float64) - r64) > reach / 2).sum()) for x in list(r32s)]
            out = np.abs(np.asarray(got, np.float64) - r64)
            n = [int((out > reach / 2).sum())] + n
            flips = n if flips is None else [a + b for a, b in zip(flips, n)]
            out = out[free]
            slack = tol * max(float(np.abs(r64).max()), DENOM_FLOOR)   # the rounding of the stored result
            if out.size and not (out <= reach + slack).all():   # NaN too
                ratio, e = math.inf, float(np.nanmax(np.where(np.isnan(out), math.inf, out)))
        if ratio >= worst[0] or worst[1] is None:
            worst = (ratio, name, e, e32)
    return worst + (flips,)


def _adam_reach(opt, steps):
    """How far apart two Adam/AdamW runs can put one element after `steps`
    steps whatever their gradients: 2 * lr * sum over t of the largest
    |m_hat / sqrt(v_hat)| at step t. With m and v sums of a_k g_k and
    b_k g_k^2 (a_k = (1 - b1) b1^k, b_k = (1 - b2) b2^k), Cauchy-Schwarz
    bounds |m| / sqrt(v) by sqrt(sum a_k^2 / b_k); the bias corrections
    scale it by sqrt(1 - b2^t) / (1 - b1^t). At t = 1 the bound is 1 (the
    first step is lr * g / |g|), and about 1 for later steps at the usual
    betas. Weight decay (decoupled) is the same in both runs."""
    g = opt.param_groups[0]
    lr, (b1, b2) = g["lr"], g["betas"]
    total = 0.0
    for t in range(1, steps + 1):
        s = sum(((1 - b1) * b1 ** k) ** 2 / ((1 - b2) * b2 ** k) for k in range(t))
        total += math.sqrt(s) * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    return 2 * lr * total * (1 + 1e-6)


def _sign_free(g64s, e32s):
    """The elements of a parameter whose Adam step the gradient check leaves
    open. Adam's first step moves each element by lr * g / (|g| + eps): the
    sign of its gradient. The gradient check accepts an error up to
    max(TOL_FACTOR * e32, TOL_FLOOR) of the tensor's scale (e32 PyTorch
    float32's own error on that gradient), so an element whose float64
    gradient is smaller than that may have either sign in a gradient the
    check accepts; PyTorch float32's own runs flip such elements by the
    thousand (tests/zoo/README.md). g64s: the float64 gradient at each
    step; e32s: the float32 runs' error on it at each step."""
    import numpy as np
    free = np.zeros(np.shape(g64s[0]), dtype=bool)
    for g64, e32 in zip(g64s, e32s):
        scale = max(float(np.abs(g64).max()) if g64.size else 0.0, DENOM_FLOOR)
        free |= np.abs(g64) <= max(TOL_FACTOR * e32, TOL_FLOOR) * scale
    return free


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _time_pair(f_tfuse, f_eager, reps, iters, min_ms=0.0):
    """Interleaved repetitions: per repetition the mean time of n calls of
    each, n the larger of `iters` and what makes each side's share at least
    min_ms (a fast step timed a few times measures the hand-over between
    PyTorch's spinning OpenMP workers and tfuse's pool, bench/zoo.py);
    returns (median tfuse ms, median eager ms, median ratio, (min ratio,
    max ratio))."""
    for _ in range(2):   # warm
        f_tfuse(), f_eager()
    n = iters
    if min_ms > 0:
        t0 = time.perf_counter()
        f_tfuse()
        t1 = time.perf_counter()
        f_eager()
        t2 = time.perf_counter()
        n = max(iters, min(1000, math.ceil(min_ms / 1e3 / max(min(t1 - t0, t2 - t1), 1e-6))))
    ts, es, rs = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            f_tfuse()
        t1 = time.perf_counter()
        for _ in range(n):
            f_eager()
        t2 = time.perf_counter()
        ts.append((t1 - t0) / n * 1e3)
        es.append((t2 - t1) / n * 1e3)
        rs.append(ts[-1] / es[-1])
    return _median(ts), _median(es), _median(rs), (min(rs), max(rs))


def _where_time_goes(sess, step, calls=3):
    """One line from tfuse's profile: the kinds of kernel (how: jit, gemm,
    conv, conv_grad_weight, ...) by their share of the step, largest first,
    and the single slowest kernel."""
    sess.set_profiling(True)
    for _ in range(calls):
        step()
    prof = sess.profile()
    sess.set_profiling(False)
    total = sum(k["total_ms"] for k in prof) or 1.0
    by_how = {}
    for k in prof:
        h = k["how"].split(".")[0]
        n, t = by_how.get(h, (0, 0.0))
        by_how[h] = (n + 1, t + k["total_ms"])
    kinds = sorted(by_how.items(), key=lambda kv: -kv[1][1])[:3]
    top = max(prof, key=lambda k: k["total_ms"]) if prof else None
    line = ", ".join(f"{h} {100 * t / total:.0f}% ({n} kernels)" for h, (n, t) in kinds)
    if top:
        line += f"; slowest {top['name']} ({top['how']}) {100 * top['total_ms'] / total:.0f}%"
    return line


DYN_BATCH = 3   # the batch a dynamic-batch export is compiled at (the example's is models.BATCH)


def _dynamic_batch(torch, tfuse, model, case, threads):
    """The model exported with axis 0 of every input dynamic (dim B), compiled
    at DYN_BATCH and run against PyTorch there: {"ok", "err", "e32"}, or
    {"ok": True, "refused": why} when tfuse.export says it cannot."""
    import copy
    ins = case.inputs

    def cut(v):
        return v[:DYN_BATCH] if isinstance(v, torch.Tensor) and v.dim() >= 1 else v
    dyn = (lambda v: {0: "B"} if isinstance(v, torch.Tensor) and v.dim() >= 1 else None)
    if isinstance(ins, dict):
        spec, small = {k: dyn(v) for k, v in ins.items()}, {k: cut(v) for k, v in ins.items()}
    else:
        spec, small = tuple(dyn(v) for v in ins), tuple(cut(v) for v in ins)
    try:
        ex = tfuse.export(model, ins, dynamic_shapes=spec)
    except tfuse.ExportError as e:
        return {"ok": True, "refused": str(e).strip().splitlines()[0]}
    out = tfuse.compile(ex, mode="infer", target="cpu", threads=threads, dims={"B": DYN_BATCH}).session().run(
        **_feed(ex, small))
    with torch.no_grad():
        r32s = [_leaves(torch, call(model, small))] + \
            [_leaves(torch, call(*_perturbed(torch, model, small, k))) for k in range(PERTURBED)]
        r64 = _leaves(torch, call(copy.deepcopy(model).double(), _to64(torch, small)))
    if len(out) != len(r64):
        raise AssertionError(f"tfuse gives {len(out)} outputs at batch {DYN_BATCH}, PyTorch {len(r64)}")
    ratio, worst, e, e32, _ = _compare((n, g, a, [r[i] for r in r32s])
                                       for i, ((n, g), a) in enumerate(zip(out.items(), r64)))
    return {"ok": ratio <= 1.0, "err": e, "e32": e32, "tensor": worst}


def run_one(name, speed, threads, steps):
    import copy
    import numpy as np
    import torch
    import tfuse
    import models
    torch.set_num_threads(threads)
    spec = models.by_name(name)
    res = {"name": name, "source": spec.source, "family": spec.family}
    stage = "build"
    try:
        case = spec.build(0)
        stage = "export"
        model = case.model.eval()
        ex = tfuse.export(model, case.inputs)
        stage = "infer"
        prog = tfuse.compile(ex, mode="infer", target="cpu", threads=threads)
        sess = prog.session()
        out = sess.run(**_feed(ex, case.inputs))
        with torch.no_grad():
            r32s = [_leaves(torch, call(model, case.inputs))] + \
                [_leaves(torch, call(*_perturbed(torch, model, case.inputs, k))) for k in range(PERTURBED)]
            r64 = _leaves(torch, call(copy.deepcopy(model).double(), _to64(torch, case.inputs)))
        if len(out) != len(r64):
            raise AssertionError(f"tfuse gives {len(out)} outputs, PyTorch {len(r64)}")
        ratio, worst, e, e32, _ = _compare((n, g, a, [r[i] for r in r32s])
                                        for i, ((n, g), a) in enumerate(zip(out.items(), r64)))
        res["infer"] = {"ok": ratio <= 1.0, "err": e, "e32": e32, "tensor": worst}
        if speed:
            feed = _feed(ex, case.inputs)
            with torch.no_grad():
                res["infer"]["ms"] = _time_pair(lambda: sess.run(**feed), lambda: call(model, case.inputs), 5, 3, 50.0)
            if res["infer"]["ms"][2] > 1:
                res["infer"]["why"] = _where_time_goes(sess, lambda: sess.run(**feed))
        sess = prog = None   # freed before the training runs
        stage = "dynamic"
        res["dyn"] = _dynamic_batch(torch, tfuse, model, case, threads)
        torch_grads = {}
        for opt_name, make_opt in (("sgd", lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9,
                                                                       weight_decay=1e-4)),
                                   ("adamw", lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3,
                                                                         weight_decay=0.01))):
            stage = "train-" + opt_name
            case = spec.build(0)
            model = case.model.train()
            ex = tfuse.export(model, case.inputs, loss_fn=case.loss_fn, targets=case.targets,
                              optimizer=make_opt(model))
            prog = tfuse.compile(ex, mode="train", target="cpu", threads=threads)
            sess = prog.session()
            feed = _feed(ex, case.inputs, case.targets)
            tf_losses = [np.float64(sess.train_step(**feed)[0]) for _ in range(steps)]
            got = ex.to_torch(sess.state_dict())

            def torch_run(m, a, tg, g64=None, e32=None):
                """One PyTorch run (one after another, so that a big model is held once at a time): its state,
                losses and, the float64 run's (g64 None), its gradient at each step; a float32 run's gradient
                only raises e32[step][tensor], its error against g64 (held once: a VGG's are a gigabyte)."""
                o = make_opt(m)
                ls, gs = [], []
                for t in range(steps):
                    o.zero_grad()
                    lv = case.loss_fn(call(m, a), *tg)
                    lv.backward()
                    if g64 is None:
                        gs.append(_param_grads(torch, m))
                    else:
                        for k, g in _param_grads(torch, m).items():
                            e32[t][k] = max(e32[t].get(k, 0.0), rel(g, g64[t][k]))
                    o.step()
                    ls.append(np.float64(lv.item()))
                sd = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
                del m, o
                return sd, ls, gs
            sd64, l64, g64 = torch_run(copy.deepcopy(model).double(), _to64(torch, case.inputs),
                                       _to64(torch, case.targets))
            e32g = [{} for _ in range(steps)]
            runs = [torch_run(copy.deepcopy(model), case.inputs, case.targets, g64, e32g)]
            for k in range(PERTURBED):
                runs.append(torch_run(*_perturbed(torch, model, case.inputs, k), case.targets, g64, e32g))
            missing = sorted(set(sd64) - set(got))
            if missing:
                raise AssertionError(f"tfuse's state lacks {len(missing)} tensors, first {missing[0]}")
            reach = _adam_reach(make_opt(copy.deepcopy(model)), steps) if opt_name == "adamw" else 0.0
            pairs = []
            for k in sd64:
                if not np.issubdtype(sd64[k].dtype, np.floating):
                    continue
                free = None
                if opt_name == "adamw" and k in g64[0]:
                    free = _sign_free([g[k] for g in g64], [e[k] for e in e32g])
                pairs.append((k, got[k].numpy(), sd64[k], [sd[k] for sd, _, _ in runs], free, reach))
            pairs += [("loss", tf_losses[i], l64[i], [ls[i] for _, ls, _ in runs]) for i in range(steps)]
            ratio, worst, e, e32, flips = _compare(pairs)
            res[opt_name] = {"ok": ratio <= 1.0, "err": e, "e32": e32, "tensor": worst}
            if opt_name == "adamw":
                # The elements whose step went the other way: tfuse's count against PyTorch float32's own, with
                # the tolerance's factor (both scale with the gradient's rounding error).
                torch_flips = max(flips[1:])
                res[opt_name]["flips"] = [flips[0], min(flips[1:]), torch_flips]
                if flips[0] > TOL_FACTOR * max(torch_flips, 1):
                    res[opt_name].update(ok=False, tensor=f"{flips[0]} steps the other way")
                torch_grads = {"g64": g64[0], "e32": e32g[0]}
            if speed and opt_name == "adamw":
                mt = copy.deepcopy(model)
                ot = make_opt(mt)

                def eager_step():
                    ot.zero_grad()
                    case.loss_fn(call(mt, case.inputs), *case.targets).backward()
                    ot.step()
                res[opt_name]["ms"] = _time_pair(lambda: sess.train_step(**feed), eager_step, 5, 2, 50.0)
                if res[opt_name]["ms"][2] > 1:
                    res[opt_name]["why"] = _where_time_goes(sess, lambda: sess.train_step(**feed), 2)
            sess = prog = runs = sd64 = g64 = got = pairs = None
        # The gradient itself: tfuse's, read off one plain SGD step with lr 2^24 (exact to divide by, and large
        # enough that p - lr * g keeps g's digits), against the float64 and float32 gradients of the AdamW runs'
        # first step (the same model and batch).
        stage = "train-grad"
        case = spec.build(0)
        model = case.model.train()
        ex = tfuse.export(model, case.inputs, loss_fn=case.loss_fn, targets=case.targets,
                          optimizer=torch.optim.SGD(model.parameters(), lr=GRAD_LR))
        prog = tfuse.compile(ex, mode="train", target="cpu", threads=threads)
        sess = prog.session()
        before = {k: v.numpy().copy() for k, v in ex.to_torch(sess.state_dict()).items()}
        sess.train_step(**_feed(ex, case.inputs, case.targets))
        after = ex.to_torch(sess.state_dict())
        g64 = torch_grads["g64"]
        missing = sorted(set(g64) - set(after))
        if missing:
            raise AssertionError(f"tfuse's state lacks {len(missing)} params, first {missing[0]}")
        ratio, worst, e, e32, _ = _compare((k, (before[k].astype(np.float64) - after[k].numpy()) / GRAD_LR, g64[k],
                                            torch_grads["e32"][k]) for k in g64)
        res["grad"] = {"ok": ratio <= 1.0, "err": e, "e32": e32, "tensor": worst}
        sess = prog = None
        res["verdict"] = "pass" if all(res[k]["ok"] for k in ("infer", "dyn", "grad", "sgd", "adamw")) else "WRONG"
    except Exception as e:   # noqa: BLE001
        msg = str(e).strip().splitlines()
        first = msg[0] if msg else ""
        if isinstance(e, (tfuse.ExportError, tfuse.Error)):
            res["verdict"] = "refused"
            res["reason"] = f"{stage}: {first}"
            extra = [ln.strip() for ln in msg[1:3] if ln.strip()]
            if extra:
                res["reason"] += " (" + "; ".join(extra) + ")"
        else:
            import traceback
            res["verdict"] = "CRASH"
            res["reason"] = f"{stage}: {type(e).__name__}: {first}"
            res["traceback"] = traceback.format_exc()
        if any(k in res and not res[k]["ok"] for k in ("infer", "dyn", "grad", "sgd", "adamw")):
            res["verdict"] = "WRONG"
    print("ZOO-RESULT " + json.dumps(res, default=float), flush=True)


# ---------------------------------------------------------------------------
# The table

def fmt_err(r):
    if not r:
        return "—"
    if "refused" in r:
        return "refused (below)"
    mark = "" if r["ok"] else f" **✗** `{r['tensor']}`"
    flips = ""
    if "flips" in r:
        t, lo, hi = r["flips"]
        flips = f"; flips {t} ({lo}–{hi})" if hi > lo else f"; flips {t} ({hi})"
    return f"{r['err']:.1e} ({r['e32']:.1e}){flips}{mark}"


def fmt_speed(r):
    if not r or "ms" not in r:
        return "—"
    t, e, ratio, (lo, hi) = r["ms"]
    return f"{ratio:.2f} ({lo:.2f}–{hi:.2f})"


def table(results, speed):
    head = ("| model | source | family | export | infer err (torch fp32) | dynamic batch, at 3 | gradient | SGD step | "
            "AdamW step | verdict |")
    sep = "|---|---|---|---|---|---|---|---|---|---|"
    if speed:
        head = head[:-len(" verdict |")] + " infer tfuse/eager | train tfuse/eager | verdict |"
        sep += "---|---|"
    rows = [head, sep]
    for r in results:
        exported = "no" if r.get("reason", "").startswith(("export", "build")) else "yes"
        cells = [r["name"], r["source"], r["family"], exported, fmt_err(r.get("infer")), fmt_err(r.get("dyn")), fmt_err(r.get("grad")),
                 fmt_err(r.get("sgd")),
                 fmt_err(r.get("adamw"))]
        if speed:
            cells += [fmt_speed(r.get("infer")), fmt_speed(r.get("adamw"))]
        v = r["verdict"] + (f": {r['reason']}" if r.get("reason") else "")
        cells.append(v.replace("|", "\\|"))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated names (default: all)")
    ap.add_argument("--subset", choices=["ci"], help="ci: the models scripts/test.sh runs")
    ap.add_argument("--speed", action="store_true", help="also time tfuse against eager (5 interleaved reps)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1, help="training steps compared (default 1: a second step starts from params that differ by rounding, and a ReLU or max-pool decision that flips there moves a whole gradient term, in tfuse or in PyTorch float32 alike)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per model (default 600)")
    ap.add_argument("--out", help="write the table (markdown) here")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        run_one(a.one, a.speed, a.threads, a.steps)
        return 0
    import models
    names = [s.name for s in models.ZOO]
    if a.subset == "ci":
        names = list(models.CI_SUBSET)
    if a.models:
        names = [n.strip() for n in a.models.split(",") if n.strip()]
        unknown = [n for n in names if n not in {s.name for s in models.ZOO}]
        if unknown:
            print(f"error: no zoo model named {', '.join(unknown)} (tests/zoo/models.py lists them)", file=sys.stderr)
            return 2
    results, bad = [], []
    t_all = time.time()
    for n in names:
        t0 = time.time()
        cmd = [sys.executable, os.path.abspath(__file__), "--one", n, "--threads", str(a.threads),
               "--steps", str(a.steps)] + (["--speed"] if a.speed else [])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("ZOO-RESULT ")), None)
            if line is None:
                tail = (p.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
                r = {"name": n, "source": models.by_name(n).source, "family": models.by_name(n).family,
                     "verdict": "CRASH", "reason": f"exit {p.returncode}: {tail}"}
            else:
                r = json.loads(line[len("ZOO-RESULT "):])
        except subprocess.TimeoutExpired:
            r = {"name": n, "source": models.by_name(n).source, "family": models.by_name(n).family,
                 "verdict": "CRASH", "reason": f"timeout after {a.timeout} s"}
        r["seconds"] = round(time.time() - t0, 1)
        results.append(r)
        expected_refusal = n in models.EXPECTED_REFUSALS
        failed = r["verdict"] in ("WRONG", "CRASH") or (r["verdict"] == "refused" and not expected_refusal)
        if failed:
            bad.append(n)
        print(f"{n:28s} {r['verdict']:8s} {r['seconds']:6.1f} s  {r.get('reason', '')}", flush=True)
        if r.get("traceback") and failed:
            print(r["traceback"], file=sys.stderr)
    passed = sum(r["verdict"] == "pass" for r in results)
    dyn_ok = sum(1 for r in results if r.get("dyn", {}).get("ok") and "refused" not in r["dyn"])
    summary = [f"{passed} of {len(results)} models infer and train within tolerance "
               f"({time.time() - t_all:.0f} s, {a.threads} threads, {a.steps} training steps); "
               f"{dyn_ok} also run at batch {DYN_BATCH} from one export with a dynamic batch."]
    if a.speed:
        gi = geomean([r["infer"]["ms"][2] for r in results if r.get("infer", {}).get("ms")])
        gt = geomean([r["adamw"]["ms"][2] for r in results if r.get("adamw", {}).get("ms")])
        summary.append(f"Geometric mean of tfuse/eager step time: inference {gi:.2f}, training (AdamW) {gt:.2f}.")
    text = table(results, a.speed)
    slow = [f"- {r['name']} {kind}: tfuse's step goes to {r[key]['why']}" for r in results
            for key, kind in (("infer", "inference"), ("adamw", "training")) if r.get(key, {}).get("why")]
    refused = [f"- {r['name']}: {r['dyn']['refused']}" for r in results if "refused" in r.get("dyn", {})]
    if refused:
        text += "\n\nWhere a dynamic batch is refused (tfuse.export's message):\n\n" + "\n".join(refused)
    if slow:
        text += "\n\nWhere tfuse is slower than eager, its profile (kernel kinds by share of the step):\n\n" + \
            "\n".join(slow)
    print("\n" + text + "\n\n" + "\n".join(summary))
    if a.out:
        with open(a.out, "w") as f:
            f.write("<!-- written by tests/zoo/run.py; see tests/zoo/README.md -->\n")
            f.write(" ".join(summary) + "\n\n" + text + "\n")
    if bad:
        print(f"\nzoo: {len(bad)} failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
