#!/usr/bin/env python3
"""node_tests.py — tfuse against the ONNX backend node tests (issue 32; docs/onnx.md).

The onnx wheel's `onnx/backend/test/data/node` (onnx==1.22.0, pinned by
scripts/setup.sh: the last release that ships the data; 1,765 cases) holds
one directory per case: model.onnx and test_data_set_*/input_*.pb,
output_*.pb. Each case is run as a user would run it:

    tfuse run CASE/model.onnx --target=T --input NAME=IN.npy ... --output NAME=OUT.npy ...

on each target asked (default interp and cpu), and each output compared
with the reference: the same dtype and shape, values within rtol 1e-3 and
atol 1e-5 (NaN where the reference has NaN). A case passes on a target when
every data set of it does.

    .venv/bin/python tests/onnx/node_tests.py                    # all cases, interp and cpu
    .venv/bin/python tests/onnx/node_tests.py --targets interp --filter conv
    .venv/bin/python tests/onnx/node_tests.py --write docs/onnx_node_tests.md   # and cuda-emu on every 10th case

The table gives, per ONNX op (a case counts for the op its name starts
with), the cases passed / run on each target and, for every case that did
not pass, why: the first line of tfuse's message (the import's reason for
an op, attribute or type it does not take), or the comparison that failed.
"Imported" ops are those runtime/onnx_import.c's table imports (docs/onnx.md's
table; the target is 95% of their cases on every target); "constants only"
ops are folded at import and refused when an input is computed by the model.
"""
import argparse
import collections
import concurrent.futures
import datetime
import glob
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYWORDS = {"module", "dim", "input", "param", "buffer", "output", "update", "train", "region", "yield", "inf", "nan", "true",
            "false"}


def tfuse_name(name):
    """An ONNX name as tfuse names it (runtime/onnx_import.c's sanitize)."""
    out = "" if name[:1].isascii() and (name[:1].isalpha() or name[:1] == "_") else "v"
    out += "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_.") else "_" for ch in name)
    return out + "_" if out in KEYWORDS else out


def claimed_ops():
    """The ops runtime/onnx_import.c imports (its table's names), and those it folds only when their inputs are constants."""
    src = open(os.path.join(ROOT, "runtime", "onnx_import.c")).read()
    table = src[src.index("static const op_entry ops[] = {"):]
    table = table[:table.index("};")]
    names = set(re.findall(r'\{"([A-Za-z]+)",', table))
    folds = src[src.index("static bool folds_only"):]
    return names, set(re.findall(r'"([A-Z][A-Za-z]+)"', folds[:folds.index("}")]))


def op_of(case, snake_ops):
    """The ONNX op a case tests: the longest op whose snake_case name starts the case's name."""
    name = case[len("test_"):]
    best = None
    for snake, op in snake_ops.items():
        if (name == snake or name.startswith(snake + "_")) and (best is None or len(snake) > len(best[0])):
            best = (snake, op)
    return best[1] if best else "(other)"


def snake(op):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", op).lower()


def compare(got, want):
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, the reference's {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape}, the reference's {want.shape}"
    if want.dtype.kind in "fc":
        ok = np.isclose(got, want, rtol=1e-3, atol=1e-5, equal_nan=True)
    else:
        ok = got == want
    if not np.all(ok):
        bad = np.argwhere(~ok)[0]
        return f"{int((~ok).sum())} of {want.size} values differ (at {tuple(int(i) for i in bad)}: {got[tuple(bad)]!r}, the reference's {want[tuple(bad)]!r})"
    return None


def load_pb(path):
    """A data set's tensor as an array; None for what is not one tensor numpy_helper reads (a sequence, an optional)."""
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    try:
        return t.name, numpy_helper.to_array(t)
    except Exception:
        return t.name, None


TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE,
         onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}
SKIP = "skipped: "


def skip_reason(m, case_dir):
    """Why a case is not run: an opset before 7 (the import's range), a graph input or output of a type tfuse has no
    tensors of, or data with a dim of 0 (tfuse's sizes are positive) or in bf16 (.npy has no bfloat16)."""
    opset = max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 7:
        return SKIP + f"opset {opset} (the import reads opsets 7 and later)"
    for ds in glob.glob(os.path.join(case_dir, "test_data_set_*")):
        for p in sorted(glob.glob(os.path.join(ds, "*.pb"))):
            _, a = load_pb(p)
            if a is not None and a.size == 0 and (a.dtype.kind in "fb" or os.path.basename(p).startswith("output")):
                return SKIP + f"{os.path.basename(p)} is empty (shape {a.shape}): tfuse's sizes are positive"
            if a is not None and a.dtype.kind == "V":
                return SKIP + f"{os.path.basename(p)} is bf16, which .npy (how tfuse run takes data) cannot hold"
    for v in list(m.graph.input) + list(m.graph.output):
        t = v.type
        if not t.HasField("tensor_type"):
            return SKIP + f"'{v.name}' is a {t.WhichOneof('value')} (tfuse has tensors only)"
        if t.tensor_type.elem_type not in TYPES:
            return SKIP + (f"'{v.name}' is {onnx.TensorProto.DataType.Name(t.tensor_type.elem_type).lower()} "
                           "(tfuse has f32 f16 bf16 f64 i64 i32 bool)")
    return None


STATIC = ("must be known when the model is imported", "imported only when its inputs are known at import", "has a dim of 0")
frozen = set()   # cases run with their integer inputs as initializers


def freeze(m, inputs, ds, args, tmp, every=False):
    """The model with its integer graph inputs (every input) turned into Constant nodes of data set ds's values; the
    --input args left."""
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    keep = []
    ints = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}
    for k, name in enumerate(inputs):
        v = next(i for i in m2.graph.input if i.name == name)
        p = os.path.join(ds, f"input_{k}.pb")
        if (every or v.type.tensor_type.elem_type in ints) and os.path.exists(p):
            _, a = load_pb(p)   # a Constant node: a value of the graph (an initializer of floats would be a weight)
            m2.graph.node.insert(0, onnx.helper.make_node("Constant", [], [name], value=numpy_helper.from_array(a, name)))
            m2.graph.input.remove(v)
        else:
            keep.append(tfuse_name(name))
    path = os.path.join(tmp, "frozen.onnx")
    onnx.save(m2, path)
    rest, i = [], 0
    while i < len(args):
        if args[i] == "--input" and args[i + 1].split("=", 1)[0] not in keep:
            i += 2
            continue
        rest.append(args[i])
        i += 1
    return path, rest


def run_case(tfuse, case_dir, target, tmp):
    """None when the case passes on target, else the reason (SKIP...: not run)."""
    m = onnx.load(os.path.join(case_dir, "model.onnx"), load_external_data=False)
    why = skip_reason(m, case_dir)
    if why:
        return why
    inputs = [i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}]
    outputs = [o.name for o in m.graph.output]
    sets = sorted(glob.glob(os.path.join(case_dir, "test_data_set_*")))
    if not sets:
        return "no data set"
    for ds in sets:
        args = []
        for k, name in enumerate(inputs):
            p = os.path.join(ds, f"input_{k}.pb")
            if not os.path.exists(p):
                continue   # an optional input left out
            _, a = load_pb(p)
            if a is None:
                return "an input that is not a tensor (a sequence or an optional: tfuse has tensors only)"
            if a.dtype == object:
                return "string tensors (tfuse has none)"
            f = os.path.join(tmp, f"in{k}.npy")
            np.save(f, a)
            args += ["--input", f"{tfuse_name(name)}={f}"]
        outs = []
        for k, name in enumerate(outputs):
            f = os.path.join(tmp, f"out{k}.npy")
            if os.path.exists(f):
                os.unlink(f)
            outs.append(f)
            args += ["--output", f"{tfuse_name(name)}={f}"]
        model = os.path.join(case_dir, "model.onnx")
        all_args = list(args)
        for attempt in range(3):
            try:
                r = subprocess.run([tfuse, "run", model, f"--target={target}", *args], capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired:
                return "timed out (120 s)"
            except OSError as e:
                return f"could not run {tfuse}: {e}"
            if attempt == 2 or r.returncode != 1 or not any(w in r.stderr for w in STATIC):
                break
            # tfuse's shapes are static: the integer inputs (shapes, axes, indices) become constants holding this
            # data set's values, as a model made for tfuse would have them; then, if a size still depends on an
            # input (Range's bounds), every input
            model, args = freeze(m, inputs, ds, all_args, tmp, every=attempt == 1)
            frozen.add(os.path.basename(case_dir) + (" (every input)" if attempt == 1 else ""))
        if r.returncode != 0:
            msg = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[0]
            if r.returncode < 0 or r.returncode > 2:
                return f"crashed (exit {r.returncode}): {msg}"
            return msg
        for k, name in enumerate(outputs):
            _, want = load_pb(os.path.join(ds, f"output_{k}.pb"))
            if want is None:
                return "an output that is not a tensor (a sequence or an optional: tfuse has tensors only)"
            if want.dtype == object:
                return "string tensors (tfuse has none)"
            why = compare(np.load(outs[k]), want)
            if why:
                return f"output {name}: {why}"
    return None


def reason_class(why):
    """A short, stable form of a reason, for the summary of why cases fail."""
    why = re.sub(r"^.*?\(\w+, opset \d+\): ", "", why)
    why = re.sub(r"^tfuse: error: ", "", why)
    why = re.sub(r"/\S+model\.onnx(:\d+:\d+)?: (error: )?", "", why)
    why = re.sub(r"'[^']*'", "'…'", why)
    why = re.sub(r"\d+", "N", why)
    return why[:110]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tfuse", default=os.environ.get("TFUSE_CLI", os.path.join(ROOT, "build", "tfuse")))
    ap.add_argument("--targets", nargs="+", default=["interp", "cpu"])
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--write", help="write the table (markdown) to this file")
    ap.add_argument("--sample-target", default="cuda-emu", help="a target run on a sample of the cases ('' for none)")
    ap.add_argument("--sample", type=int, default=10, help="the sample: every N-th case that is run")
    a = ap.parse_args()
    data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
    if not os.path.isdir(data):
        sys.exit(f"error: {data} does not exist: onnx {onnx.__version__} ships no node test data (scripts/setup.sh pins 1.22.0)")
    cases = sorted(c for c in os.listdir(data) if c.startswith("test_") and a.filter in c)
    snake_ops = {snake(s.name): s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}
    claimed, folded = claimed_ops()
    results = {}   # (case, target) -> None or reason

    def one(job):
        case, target = job
        with tempfile.TemporaryDirectory() as tmp:
            return job, run_case(a.tfuse, os.path.join(data, case), target, tmp)

    sample = [c for c in cases if a.sample_target][::max(a.sample, 1)]
    jobs = [(c, t) for c in cases for t in a.targets] + [(c, a.sample_target) for c in sample]
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        for i, (job, why) in enumerate(ex.map(one, jobs)):
            results[job] = why
            if (i + 1) % 200 == 0:
                print(f"{i + 1} of {len(jobs)} runs", file=sys.stderr)

    by_op = collections.defaultdict(list)
    for c in cases:
        by_op[op_of(c, snake_ops)].append(c)
    lines = []
    total = {t: [0, 0] for t in a.targets}
    claimed_total = {t: [0, 0] for t in a.targets}
    rows = []
    all_skipped = [0]
    for op in sorted(by_op):
        cs = by_op[op]
        cells = []
        skipped = sum(results[(c, a.targets[0])] is not None and results[(c, a.targets[0])].startswith(SKIP) for c in cs)
        for t in a.targets:
            ok = sum(results[(c, t)] is None for c in cs)
            run = len(cs) - skipped
            total[t][0] += ok
            total[t][1] += run
            if op in claimed:
                claimed_total[t][0] += ok
                claimed_total[t][1] += run
            cells.append(f"{ok} / {run}")
        all_skipped[0] += skipped
        rows.append((op, "yes" if op in claimed else "constants only" if op in folded else "", cells + [str(skipped) if skipped else ""]))
    stamp = datetime.date.today().isoformat()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines.append(f"# ONNX backend node tests: tfuse {commit}, onnx {onnx.__version__}, {stamp}\n")
    lines.append("Made by `.venv/bin/python tests/onnx/node_tests.py --write docs/onnx_node_tests.md` "
                 "(tests/onnx/node_tests.py says how a case is run and compared).\n")
    for t in a.targets:
        ct, tt = claimed_total[t], total[t]
        lines.append(f"- **{t}**: {tt[0]} of {tt[1]} cases pass ({100 * tt[0] / max(tt[1], 1):.1f}%); of the ops tfuse imports, "
                     f"{ct[0]} of {ct[1]} ({100 * ct[0] / max(ct[1], 1):.1f}%).")
    lines.append(f"- {all_skipped[0]} cases are not run: a graph input or output of a type tfuse has no tensors of "
                 "(uint8, int8, int16, uint16, uint32, uint64, string, float8, int4, complex) or that is no tensor "
                 "(a sequence, an optional), data with a dim of 0 (tfuse's sizes are positive) or in bf16 (which .npy, "
                 "the files `tfuse run` reads, cannot hold), or a model of opset 1 to 6 (the import reads 7 and later).")
    if sample:
        ran = [c for c in sample if not (results[(c, a.sample_target)] or "").startswith(SKIP)]
        ok = [c for c in ran if results[(c, a.sample_target)] is None]
        imp = [c for c in ran if op_of(c, snake_ops) in claimed]
        lines.append(f"- **{a.sample_target}** (every {a.sample}th case): {len(ok)} of {len(ran)} cases run pass; of the ops tfuse "
                     f"imports, {sum(results[(c, a.sample_target)] is None for c in imp)} of {len(imp)}; its failures: "
                     + ("; ".join(f"{c}: {results[(c, a.sample_target)][:160]}" for c in ran if results[(c, a.sample_target)]
                                  and op_of(c, snake_ops) in claimed) or "none") + ".")
    lines.append("\n## Per op\n")
    lines.append("Cases passed / run per target; `skipped` counts the cases not run.\n")
    lines.append("| op | imported | " + " | ".join(a.targets) + " | skipped |")
    lines.append("|---|---|" + "---|" * (len(a.targets) + 1))
    for op, cl, cells in rows:
        lines.append(f"| {op} | {cl} | " + " | ".join(cells) + " |")
    lines.append("\n## Run with their integer inputs as constants\n")
    lines.append("tfuse's shapes are static: where an op reads a shape, axes, sizes or indices from a graph input (as "
                 "the node tests feed them), the case runs again with its integer inputs as Constant nodes holding the "
                 "data set's values, and if a size still depends on an input (Range's bounds), with every input so. "
                 f"{len(frozen)} cases ran so:\n")
    lines.append(", ".join(sorted(frozen)) + "\n")
    lines.append("\n## Why the others fail or are not run (ops tfuse imports)\n")
    lines.append("Each case that does not pass on some target, with the reason of the first target it failed on.\n")
    lines.append("| case | target | why |")
    lines.append("|---|---|---|")
    for op, cl, _ in rows:
        if cl != "yes":
            continue
        for c in by_op[op]:
            for t in a.targets:
                why = results[(c, t)]
                if why is not None:
                    lines.append(f"| {c} | {t} | {why.replace('|', '/')[:300]} |")
                    break
    lines.append("\n## Ops tfuse does not import\n")
    lines.append(", ".join(f"{op} ({len(by_op[op])})" for op, cl, _ in rows if cl != "yes") + "\n")
    lines.append("(\"constants only\": folded at import when every input is a constant, an error otherwise; the cases above "
                 "count them as they ran, frozen inputs included.)\n")
    summary = collections.Counter(reason_class(results[(c, t)]) for (c, t) in results if results[(c, t)] is not None
                                  and not results[(c, t)].startswith(SKIP) and op_of(c, snake_ops) in claimed)
    lines.append("## Reasons among the imported ops' failures, most frequent first\n")
    for why, n in summary.most_common(40):
        lines.append(f"- {n}: {why}")
    text = "\n".join(lines) + "\n"
    if a.write:
        with open(a.write, "w") as f:
            f.write(text)
    if sample:
        print(lines[[i for i, l in enumerate(lines) if l.startswith(f"- **{a.sample_target}**")][0]][:300])
    for t in a.targets:
        ct, tt = claimed_total[t], total[t]
        print(f"{t}: {tt[0]} / {tt[1]} cases ({100 * tt[0] / max(tt[1], 1):.1f}%); imported ops {ct[0]} / {ct[1]} "
              f"({100 * ct[0] / max(ct[1], 1):.1f}%)")
    for why, n in summary.most_common(25):
        print(f"  {n:4d}  {why}")


if __name__ == "__main__":
    main()
