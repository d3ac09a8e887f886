#!/usr/bin/env python3
"""Check that each PyTorch twin (twins.py) computes what its tfuse model does.

For every benchmark model, at small --dim sizes so the interpreter is quick:

  1. random params and buffers, drawn as the IR's initializers say, with the
     constant ones (biases, norm gains, running statistics) made random too,
     written as safetensors by twins.write_safetensors; random inputs as .npy;
  2. inference: `tfuse run --params --input --output loss=... --output
     logits=...` against the twin in eval mode (batchnorm on its running
     statistics);
  3. training: `tfuse train --params --data --steps 1 --save CKPT --log CSV`
     (one batch of exactly B samples) against one twins.TrainStep: the
     step's loss, and every tensor of the checkpoint: the updated params, the
     batchnorm running statistics, the optimizer state (Adam's m and v,
     SGD's momentum: on the first step these are the clipped gradients, so
     this compares gradients too) and the step counter.

Reference and tolerance. The twin runs in float64 and is the reference.
tfuse's interpreter computes every op in float64 but rounds each op's result
to the model's f32, so its error is f32 rounding carried through the graph.
To know what that amounts to for each model, the same twin is also run in
float32 from the same values: its error against float64 (e32) is PyTorch's
own f32 error for that computation. A tensor passes when

    max|tfuse - ref| / max|ref|  <=  max(TOL_FACTOR * e32, TOL_FLOOR)

with TOL_FACTOR = 10 and TOL_FLOOR = 1e-5 (about 170 f32 ulps of the
tensor's largest element), i.e. tfuse must be about as accurate as PyTorch
in f32. A different formula (the other GELU, another eps, the biased
running variance, a missing 1/sqrt(D), a sum instead of a mean) moves the
results by far more than that; --self-test shows it by checking twins with
such a change against the real ones (those checks must fail).

Exit status: 0 all checks passed, 1 some failed, 2 it could not run (no
torch, no tfuse binary). Needs torch and numpy (bench/run.sh makes a venv
with them).
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("check_twins: needs torch (pip install torch, or run bench/run.sh once for its venv)", file=sys.stderr)
    sys.exit(2)

import twins  # after the torch check, which says what is missing

TOL_FACTOR = 10.0
TOL_FLOOR = 1e-5

# small sizes for the interpreter; every structure of the benchmark is kept
SMALL = {
    "mlp": {"B": 8, "F": 24, "H": 32, "C": 10},
    "resnet": {"N": 4, "C1": 4, "C2": 8, "C3": 8, "K": 10},
    "resnet18": {"N": 2, "C1": 4, "C2": 4, "C3": 8, "C4": 8, "K": 10},
    "gpt": {"B": 2, "T": 8, "V": 32, "E": 16, "H": 2, "D": 8, "F": 64},
    "gpt2": {"B": 2, "T": 8, "V": 32, "E": 16, "H": 2, "D": 8, "F": 64},
    "small_conv": {"N": 4, "C1": 4, "C2": 8, "K": 10},
    "small_mlp": {"B": 8, "F": 24, "H": 32, "C": 10},
    "small_gpt": {"B": 2, "T": 8, "V": 32, "E": 16, "H": 2, "D": 8, "F": 64},
}

# torch optimizer state slot -> tfuse buffer prefix
OPT_SLOTS = {"exp_avg": "opt.m.", "exp_avg_sq": "opt.v.", "momentum_buffer": "opt.momentum."}


def rel_err(a, ref):
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if a.shape != ref.shape:
        return float("inf")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(a - ref))) if ref.size else 0.0
    if not np.all(np.isfinite(a)):
        return float("inf")
    return diff / scale if scale > 0 else diff


def run_tfuse(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def twin_infer(name, dims, values, arrays, dtype, patch=None):
    model, info = twins.build(name, dims, dtype=dtype)
    twins.load_numpy_state(model, values)
    if patch:
        patch(model)
    model.eval()
    ins = [torch.from_numpy(arrays[n]) for n, _, _ in info.inputs]
    ins = [t.to(dtype) if t.is_floating_point() else t for t in ins]
    with torch.no_grad():
        loss, logits = model(*ins)
    return {"loss": loss.double().numpy(), "logits": logits.double().numpy()}


def twin_train(name, dims, values, arrays, dtype, patch=None):
    model, info = twins.build(name, dims, dtype=dtype)
    twins.load_numpy_state(model, values)
    if patch:
        patch(model)
    model.train()
    ins = [torch.from_numpy(arrays[n]) for n, _, _ in info.inputs]
    ins = [t.to(dtype) if t.is_floating_point() else t for t in ins]
    step = twins.TrainStep(model, info)
    loss = step(*ins)
    out = {"loss": np.float64(loss.item()), "train.step": np.int64(step.step)}
    out.update(twins.state_numpy(model))
    names = {id(p): k for k, p in model.named_parameters()}
    for p, st in step.opt.state.items():
        for slot, prefix in OPT_SLOTS.items():
            if slot in st and st[slot] is not None:
                out[prefix + names[id(p)]] = st[slot].detach().double().numpy()
    return out


def make_inputs(name):
    dims = SMALL[name]
    info = twins.IRInfo(twins.model_path(name), dims)
    values = twins.init_values(info, seed=7, perturb=True)
    probe, _ = twins.build(name, dims)
    _, arrays = twins.random_inputs(probe, info, batch_seed=3)
    return dims, info, values, arrays


def check_model(name, tfuse, target, workdir, verbose):
    dims, info, values, arrays = make_inputs(name)
    path = info.path
    dim_args = [a for k, v in dims.items() for a in ("--dim", f"{k}={v}")]
    d = os.path.join(workdir, name)
    os.makedirs(d, exist_ok=True)
    params = os.path.join(d, "params.safetensors")
    twins.write_safetensors(params, values)
    for n, a in arrays.items():
        np.save(os.path.join(d, n + ".npy"), a)

    results = []   # (what, err, e32, tol)

    def compare(what, got, ref64, ref32):
        e = rel_err(got, ref64)
        e32 = rel_err(ref32, ref64)
        tol = max(TOL_FACTOR * e32, TOL_FLOOR)
        results.append((what, e, e32, tol))

    # inference
    cmd = [tfuse, "run", path, *dim_args, f"--target={target}", "--params", params]
    cmd += [a for n in arrays for a in ("--input", f"{n}={os.path.join(d, n + '.npy')}")]
    cmd += ["--output", f"loss={os.path.join(d, 'loss.npy')}", "--output", f"logits={os.path.join(d, 'logits.npy')}"]
    run_tfuse(cmd)
    got = {k: np.load(os.path.join(d, k + ".npy")) for k in ("loss", "logits")}
    r64 = twin_infer(name, dims, values, arrays, torch.float64)
    r32 = twin_infer(name, dims, values, arrays, torch.float32)
    for k in ("loss", "logits"):
        compare(f"infer {k}", got[k], r64[k], r32[k])

    # one training step
    ckpt, log = os.path.join(d, "step1.safetensors"), os.path.join(d, "train.csv")
    if os.path.exists(log):
        os.remove(log)
    data = ",".join(f"{n}={os.path.join(d, n + '.npy')}" for n in arrays)
    run_tfuse([tfuse, "train", path, *dim_args, f"--target={target}", "--params", params, "--data", data, "--steps", "1",
               "--save", ckpt, "--log", log])
    with open(log) as f:
        rows = list(csv.DictReader(f))
    tl = float(rows[-1]["loss"])
    state, _ = twins.read_safetensors(ckpt)
    t64 = twin_train(name, dims, values, arrays, torch.float64)
    t32 = twin_train(name, dims, values, arrays, torch.float32)
    compare("train loss", tl, t64["loss"], t32["loss"])
    missing = sorted(k for k in t64 if k not in state and k != "loss")
    extra = sorted(k for k in state if k not in t64)
    if missing or extra:
        results.append((f"checkpoint names: twin-only {missing[:5]}, tfuse-only {extra[:5]}", float("inf"), 0.0, 0.0))
    groups = {}
    for k in sorted(state):
        if k not in t64:
            continue
        if k == "train.step":
            ok = int(state[k]) == int(t64[k])
            results.append(("train step counter", 0.0 if ok else float("inf"), 0.0, 0.0))
            continue
        kind = next((p for p in OPT_SLOTS.values() if k.startswith(p)), None)
        if kind is None:
            kind = "buffers" if k.endswith((".mean", ".var")) else "params"
        e = rel_err(state[k], t64[k])
        e32 = rel_err(t32[k], t64[k])
        tol = max(TOL_FACTOR * e32, TOL_FLOOR)
        worst = groups.get(kind)
        if worst is None or e / tol > worst[1] / worst[3]:
            groups[kind] = (k, e, e32, tol)
        if verbose:
            print(f"    {k:40s} err {e:.2e}  f32 twin {e32:.2e}")
    labels = {"params": "updated params", "buffers": "bn running stats", "opt.m.": "adam m (= 0.1 grad)",
              "opt.v.": "adam v (= 0.001 grad^2)", "opt.momentum.": "sgd momentum (= grad + wd p)"}
    for kind, (k, e, e32, tol) in groups.items():
        results.append((f"{labels[kind]} (worst: {k})", e, e32, tol))
    return results


# ---- self-test: twins with one formula changed must fail the same bounds

def _wrap_loss(scale_of):
    def patch(model):
        fwd = model.forward

        def scaled(*ins):
            loss, logits = fwd(*ins)
            return loss * scale_of(logits), logits
        model.forward = scaled
    return patch


def _erf_gelu(model):
    F = torch.nn.functional
    for blk in model.h:
        m = blk.mlp
        m.forward = lambda x, m=m: F.linear(F.gelu(F.linear(x, m.w1.t(), m.b1)), m.w2.t(), m.b2)


def _set_eps(cls, eps):
    def patch(model):
        for mod in model.modules():
            if isinstance(mod, cls):
                mod.eps = eps
    return patch


def _attention(causal, scale):
    F = torch.nn.functional

    def patch(model):
        for blk in model.h:
            a = blk.attn

            def fwd(x, a=a):
                B, T, E = x.shape

                def heads(w, b):
                    return F.linear(x, w.t(), b).view(B, T, a.H, a.D).transpose(1, 2)
                o = F.scaled_dot_product_attention(heads(a.wq, a.bq), heads(a.wk, a.bk), heads(a.wv, a.bv),
                                                   is_causal=causal, scale=scale(a.D))
                return F.linear(o.transpose(1, 2).reshape(B, T, E), a.wo.t(), a.bo)
            a.forward = fwd
    return patch


def _biased_running_var(model):
    for mod in model.modules():
        if isinstance(mod, twins.BatchNorm):
            def fwd(x, bn=mod):
                if not bn.training:
                    return torch.nn.functional.batch_norm(x, bn.mean, bn.var, bn.g, bn.b, False, 0.0, bn.eps)
                m = x.mean(dim=(0, 2, 3))
                v = x.var(dim=(0, 2, 3), unbiased=False)
                with torch.no_grad():
                    bn.mean.mul_(1 - bn.momentum).add_(bn.momentum * m)
                    bn.var.mul_(1 - bn.momentum).add_(bn.momentum * v)
                sh = (1, -1, 1, 1)
                return (x - m.view(sh)) / torch.sqrt(v.view(sh) + bn.eps) * bn.g.view(sh) + bn.b.view(sh)
            mod.forward = fwd


def _variants(name):
    v = {"cross-entropy summed over positions, not averaged": _wrap_loss(lambda lg: lg.numel() // lg.shape[-1])}
    if name.startswith("gpt"):
        v["GELU erf form instead of tanh"] = _erf_gelu
        v["layernorm eps 1e-6 instead of 1e-5"] = _set_eps(twins.LayerNorm, 1e-6)
        v["attention without the causal mask"] = _attention(False, lambda d: d ** -0.5)
        v["attention scaled by 1/D instead of 1/sqrt(D)"] = _attention(True, lambda d: 1.0 / d)
    if name.startswith("resnet"):
        v["batchnorm eps 1e-3 instead of 1e-5"] = _set_eps(twins.BatchNorm, 1e-3)
        v["running variance biased instead of unbiased"] = _biased_running_var
    return v


def self_test(name):
    """Returns [(variant, worst err/bound over all tensors, tensor, caught)]."""
    dims, _, values, arrays = make_inputs(name)
    ref64 = {**twin_infer(name, dims, values, arrays, torch.float64),
             **{"train " + k: x for k, x in twin_train(name, dims, values, arrays, torch.float64).items()}}
    ref32 = {**twin_infer(name, dims, values, arrays, torch.float32),
             **{"train " + k: x for k, x in twin_train(name, dims, values, arrays, torch.float32).items()}}
    bound = {k: max(TOL_FACTOR * rel_err(ref32[k], ref64[k]), TOL_FLOOR) for k in ref64}
    out = []
    for what, patch in _variants(name).items():
        alt = {**twin_infer(name, dims, values, arrays, torch.float64, patch),
               **{"train " + k: x for k, x in twin_train(name, dims, values, arrays, torch.float64, patch).items()}}
        ratio, worst = max((rel_err(alt[k], ref64[k]) / bound[k], k) for k in ref64 if k != "train train.step")
        out.append((what, ratio, worst, ratio > 1.0))
    return out


def main():
    ap = argparse.ArgumentParser(description="check the PyTorch twins against tfuse")
    ap.add_argument("--tfuse", default=os.path.join(ROOT, "build", "tfuse"), help="the tfuse binary (default build/tfuse)")
    ap.add_argument("--target", default="interp", help="tfuse target to check (default interp, the reference)")
    ap.add_argument("--models", default=",".join(SMALL), help="comma-separated (default: all)")
    ap.add_argument("--keep", metavar="DIR", help="keep the files (params, inputs, outputs, checkpoints) in DIR")
    ap.add_argument("--self-test", action="store_true", help="also show that wrong formulas fail the tolerance")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every tensor's error")
    args = ap.parse_args()
    if not (os.path.isfile(args.tfuse) and os.access(args.tfuse, os.X_OK)):
        print(f"check_twins: no tfuse binary at {args.tfuse} (build it: cmake -S . -B build && cmake --build build)",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    workdir = args.keep or tempfile.mkdtemp(prefix="tfuse-twins-")
    os.makedirs(workdir, exist_ok=True)
    passed = failed = 0
    try:
        for name in args.models.split(","):
            print(f"{name}  (dims {' '.join(f'{k}={v}' for k, v in SMALL[name].items())}, target {args.target})")
            try:
                res = check_model(name, args.tfuse, args.target, workdir, args.verbose)
            except Exception as e:   # a tfuse failure is a failed check, with its message
                print(f"  FAIL  {e}")
                failed += 1
                continue
            for what, e, e32, tol in res:
                ok = e <= tol
                passed += ok
                failed += not ok
                if tol == 0:
                    print(f"  {'ok  ' if ok else 'FAIL'}  {what:58s} {'exact' if ok else 'differs'}")
                else:
                    print(f"  {'ok  ' if ok else 'FAIL'}  {what:58s} err {e:.2e}  (f32 twin {e32:.2e}, bound {tol:.1e})")
            if args.self_test:
                for what, ratio, worst, caught in self_test(name):
                    passed += caught
                    failed += not caught
                    print(f"  {'ok  ' if caught else 'FAIL'}  self-test: {what:50s} {'caught' if caught else 'NOT CAUGHT'}: "
                          f"{worst} off by {ratio:.3g}x its bound")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
