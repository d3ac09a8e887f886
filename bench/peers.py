#!/usr/bin/env python3
"""Time one benchmark model on one peer: PyTorch eager, torch.compile, or ONNX Runtime.

    python3 bench/peers.py --model gpt --mode train --peer eager --device cpu --threads 2 --iters 20
    python3 bench/peers.py --model resnet18 --mode infer --peer compile-max --device cuda --precision bf16

The model is the PyTorch twin of bench/models/<model>.ir (twins.py: the same
function, params and train block), at the file's dims or --dim K=V
overrides. The work per step is what `tfuse bench` times:

  train  forward, loss, backward, clip_grad_norm if the train block has it,
         the train block's optimizer at its schedule's learning rate
         (twins.TrainStep); gradients are set to None, not zeroed;
  infer  the forward pass in eval mode (batchnorm on running statistics)
         under torch.inference_mode, producing loss and logits.

Inputs are random (floats N(0, 1), labels in range), made once on the device
before timing. Precision bf16/fp16 runs the step under torch.autocast with
fp32 params (what tfuse's amp does); fp16 training adds a GradScaler.

Timing: `--warmup` steps, then `--iters` steps each timed alone (CUDA events
on a GPU, perf_counter on the CPU, both after the step's work is done); the
result is the median. Prints `key: value` lines, the same form as
`tfuse bench`:

  step_ms        median step time after warm-up (also step_ms_min, step_ms_max)
  first_step_ms  the first step alone
  compile_ms     torch.compile: time the warm-up steps took beyond steady
                 state (sum of max(0, t - median)), i.e. tracing, compiling,
                 autotuning and recompiles; ort: ONNX export + session
                 creation; eager: 0
  peak_bytes     cuda: torch.cuda.max_memory_allocated over the timed steps
                 (params, gradients, optimizer state, inputs and activations;
                 the counter is reset after warm-up so compile-time
                 autotuning buffers do not count); cpu: n/a
  threads        CPU threads (torch.set_num_threads / ORT intra-op threads)

A failure prints `error: ...` and exits 1 (2 for a usage mistake).
ONNX Runtime runs inference only: its training API (onnxruntime-training)
needs an offline artifact-generation step and is a separate package, so
training is not measured there.
"""
import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PEERS = ("eager", "compile", "compile-max", "ort")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="time a benchmark model on PyTorch or ONNX Runtime",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="mlp, resnet, resnet18, gpt, gpt2 (bench/models/NAME.ir)")
    ap.add_argument("--mode", choices=("train", "infer"), default="train")
    ap.add_argument("--peer", choices=PEERS, default="eager",
                    help="eager | compile (torch.compile default) | compile-max (mode='max-autotune') | ort")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None,
                    help="default: the model file's train block precision")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: os.cpu_count())")
    ap.add_argument("--iters", type=int, default=None, help="timed steps (default 20 on cpu, 50 on cuda)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3 on cpu, 10 on cuda)")
    ap.add_argument("--dim", action="append", default=[], metavar="K=V",
                    help="override a dim of the model file (repeatable, or K=V,K=V)")
    ap.add_argument("--dims", action="append", default=[], metavar="K=V,...", help="same as --dim")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tf32", action="store_true", help="cuda fp32: allow TF32 matmuls (PyTorch's default is off)")
    ap.add_argument("--onnx-file", help="ort: write the exported model here (default: a temporary file)")
    args = ap.parse_args(argv)
    dims = {}
    for item in args.dim + args.dims:
        for kv in item.split(","):
            if kv.strip():
                k, _, v = kv.partition("=")
                if not v.isdigit():
                    ap.error(f"--dim {kv}: expected NAME=INTEGER")
                dims[k.strip()] = int(v)
    args.dim_map = dims
    gpu = args.device == "cuda"
    args.iters = args.iters or (50 if gpu else 20)
    args.warmup = args.warmup if args.warmup is not None else (10 if gpu else 3)
    args.threads = args.threads or os.cpu_count()
    if args.peer == "ort" and args.mode == "train":
        ap.error("ONNX Runtime is timed for inference only (its training API is a separate package with an "
                 "offline artifact step)")
    if args.peer == "ort" and gpu:
        ap.error("ONNX Runtime is the CPU peer here; on a GPU the peers are eager, compile and compile-max")
    return args


def emit(key, value):
    print(f"{key}: {value}", flush=True)


class Timer:
    """Times one step: CUDA events around it on a GPU, perf_counter after a
    synchronize on the CPU. Returns milliseconds."""

    def __init__(self, torch, device):
        self.torch, self.gpu = torch, device == "cuda"

    def run(self, fn):
        if self.gpu:
            t = self.torch
            start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def main(argv=None):
    args = parse_args(argv)
    import torch

    import twins

    torch.manual_seed(args.seed)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
        with contextlib.suppress(RuntimeError):   # only settable before parallel work starts
            torch.set_num_interop_threads(1)
    else:
        if not torch.cuda.is_available():
            emit("error", "torch.cuda.is_available() is false")
            return 1
        torch.backends.cudnn.benchmark = True   # what users are told to set; tfuse autotunes too
        torch.backends.cuda.matmul.allow_tf32 = args.tf32

    model, info = twins.build(args.model, args.dim_map, seed=args.seed)
    precision = args.precision or info.precision()
    for k, v in (("peer", args.peer), ("model", args.model), ("mode", args.mode), ("device", args.device),
                 ("precision", precision), ("dims", " ".join(f"{k}={v}" for k, v in info.dims.items())),
                 ("threads", torch.get_num_threads() if args.device == "cpu" else "n/a"),
                 ("warmup", args.warmup), ("iters", args.iters), ("torch", torch.__version__)):
        emit(k, v)
    if args.device == "cuda":
        emit("gpu", torch.cuda.get_device_name())
        emit("tf32_matmul", str(args.tf32).lower())
        torch.cuda.reset_peak_memory_stats()
    model.to(args.device)
    inputs, arrays = twins.random_inputs(model, info, batch_seed=args.seed, device=args.device)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    compile_extra_ms = 0.0

    if args.peer == "ort":
        import onnxruntime as ort
        model.eval()
        path = args.onnx_file or os.path.join(tempfile.mkdtemp(prefix="tfuse-bench-"), args.model + ".onnx")
        t0 = time.perf_counter()
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            torch.onnx.export(model, tuple(inputs), path, input_names=[n for n, _, _ in info.inputs],
                              output_names=["loss", "logits"])
        t1 = time.perf_counter()
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        t2 = time.perf_counter()
        emit("ort", ort.__version__)
        emit("export_ms", f"{(t1 - t0) * 1e3:.1f}")
        emit("session_ms", f"{(t2 - t1) * 1e3:.1f}")
        compile_extra_ms = (t2 - t0) * 1e3
        out = sess.run(None, arrays)
        with torch.no_grad():
            ref_loss, _ = model(*inputs)
        emit("check_loss_abs_diff", f"{abs(float(out[0]) - float(ref_loss)):.3g}")   # the export computes the twin

        def step():
            sess.run(None, arrays)
    else:
        fwd = model
        if args.peer in ("compile", "compile-max"):
            fwd = torch.compile(model, mode="max-autotune" if args.peer == "compile-max" else None)
        cudagraphs = args.peer == "compile-max" and args.device == "cuda"
        if args.mode == "train":
            model.train()
            # torch.compile's peer compiles the whole step: the model (its backward through AOTAutograd)
            # and the update (clipping and the optimizer)
            train_step = twins.TrainStep(model, info, forward=fwd, precision=precision, device=args.device,
                                         compile_update=args.peer in ("compile", "compile-max"))

            def step():
                if cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                train_step(*inputs)
        else:
            model.eval()

            def step():
                if cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                with torch.inference_mode(), torch.autocast(args.device, dtype=amp, enabled=amp is not None):
                    fwd(*inputs)

    timer = Timer(torch, args.device)
    try:
        warm = [timer.run(step) for _ in range(max(args.warmup, 1))]
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = [timer.run(step) for _ in range(args.iters)]
    except Exception as e:   # out of memory, a compile error: say which, exit 1
        emit("error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
    med = statistics.median(times)
    emit("step_ms", f"{med:.3f}")
    emit("step_ms_min", f"{min(times):.3f}")
    emit("step_ms_max", f"{max(times):.3f}")
    emit("first_step_ms", f"{warm[0]:.3f}")
    if args.peer in ("compile", "compile-max"):
        emit("compile_ms", f"{sum(max(0.0, t - med) for t in warm):.1f}")
    elif args.peer == "ort":
        emit("compile_ms", f"{compile_extra_ms:.1f}")
    else:
        emit("compile_ms", "0")
    emit("peak_bytes", torch.cuda.max_memory_allocated() if args.device == "cuda" else "n/a")
    if args.mode == "train":
        emit("params", sum(p.numel() for p in model.parameters()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
