/* help.c — each command's synopsis and help text, as `tfuse --help` and
 * `tfuse COMMAND --help` print them (main.c's usage). train's and bench's
 * live beside their code (train.c, bench.c). */
#include "cli.h"

const cli_command cli_commands[] = {
    {"print", "FILE [--dim K=V]",
     "Parse and verify a model, then print its canonical text (every value typed)."},
    {"opt", "FILE [--passes=a,b,...] [--mode=train|infer] [--explain] [--dim K=V]",
     "Run passes (default: lower) and print the module; --explain writes each decision to stderr."},
    {"compile", "FILE [--mode=train|infer] [--target=interp|cpu|cuda|cuda-emu] [--arch=sm_90] [--precision=fp32|fp16|bf16] [--O0] [--disable-pass=NAME]\n"
     "                     [--explain] [--dim K=V|K=auto --memory-limit=BYTES] [--checkpoint=none|auto --memory-budget=BYTES|PCT%]\n"
     "                     [--dump-ir=all|PASS] [--dump-dir=DIR] [--dump-kernels=DIR] [--dump-llvm=DIR] [--stats] [-o OUT]",
     "Run the full pipeline. --stats prints key: value lines (ops, kernels, fused_regions, casts, params,\n"
     "peak_bytes, ...); --explain prints one line per decision and why; --O0 runs no optimizing pass;\n"
     "--dim B=auto picks the largest B whose planned peak fits --memory-limit (512M, 16G, ...);\n"
     "train mode (the model needs an output 'loss', one floating number): --checkpoint=auto recomputes\n"
     "forward values (cheapest per byte first) until the step's planned peak fits --memory-budget (bytes or 50%);\n"
     "--dump-ir writes DIR/NN-PASS.ir after each pass (each parses again); --dump-kernels writes\n"
     "DIR/kernels.txt, the kernel IR of every kernel; --dump-llvm writes DIR/kernels.ll, the optimized\n"
     "LLVM IR the cpu target runs; -o writes the compiled IR. With --target=cuda, -o DIR writes a directory:\n"
     "program.ir, kernels.txt, cuda/*.cu for every generated kernel, cuda/*.<arch>.cubin (NVRTC programs of\n"
     "several kernels; no GPU needed; --arch picks the GPU, default sm_90), cubins.txt (which cubin holds\n"
     "which kernel) and manifest.txt. The default target is cpu when this\n"
     "build has LLVM, else interp."},
    {"run", "FILE [--input NAME=FILE.npy ...] [--random-inputs] [--params FILE.safetensors] [--output NAME=FILE.npy ...]\n"
     "                     [--seed N] [--target=...] [--threads N] [--precision=...] [--O0] [--disable-pass=NAME] [--stats]\n"
     "                     [--trace FILE.json]",
     "Inference: bind inputs from .npy files, load params (names = IR names; params the file lacks\n"
     "keep their seeded initial values), run, and write outputs to .npy (or print them). --stats prints\n"
     "key: value lines: the target, its kernels, those JIT-compiled now and those this process had, and the\n"
     "disk cache's hits and misses (kernels found in $TFUSE_CACHE_DIR, and compiled now; see 'tfuse cache')."},
    {"train", train_synopsis, train_help},
    {"bench", bench_synopsis, bench_help},
    {"doctor", "[target settings]", "What this build and machine can run: the targets (and why one cannot run here), the cpu\n"
                   "target's GEMM library and threads, the CUDA libraries found (or where the search looked) and the GPUs;\n"
                   "then each target setting, its value and where it came from (default, env VAR=VALUE, or option:\n"
                   "a flag given here)."},
    {"cache", "stats | clear [cpu|cuda|cuda-emu]",
     "The compile cache on disk: $TFUSE_CACHE_DIR (default ~/.cache/tfuse), where each process leaves what it\n"
     "compiled for the next: cpu/ the cpu target's object code, cuda/ cubins and cuBLASLt and cuDNN algorithm\n"
     "choices, cuda-emu/ cuda-emu's host objects. Its parts share one bound, $TFUSE_CACHE_MAX bytes (a\n"
     "number, or one with K, M, G or T: powers of 1024), 2G by default; a write that passes it evicts the least\n"
     "recently used entries until 90% of it is left.\n"
     "  stats   the directory, each part's entries and bytes, the total and the bound\n"
     "  clear   remove the entries of every part, or of the one named, and say what went (files that\n"
     "          another process is writing stay)"},
    {"import", "MODEL.onnx [-o MODEL.ir] [--dim NAME=N ...]",
     "An ONNX model as tfuse's text and its initializers as safetensors beside it (docs/onnx.md);\n"
     "`tfuse import --help` says more."},
    {"plot", "LOG.csv [LOG.csv ...] [-o OUT.svg] [--title TEXT]",
     "Training logs (tfuse train --log) drawn as an SVG: loss, evaluation loss and accuracy, learning rate\n"
     "and any other column against the step; several logs compare runs. `tfuse plot --help` says more."},
};

const size_t cli_ncommands = sizeof cli_commands / sizeof *cli_commands;
