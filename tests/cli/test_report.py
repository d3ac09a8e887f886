#!/usr/bin/env python3
"""test_report.py — bench/report.py's GPU tables from raw files written here.

The figures a GPU session records go through report.py, and no GPU runs in
CI: so the table is checked on measurements made up for the purpose, one
per rule the report applies. The ratio against the faster torch.compile
run (default or max-autotune), tfuse's device memory before its planned
peak, MFU against the GPU's dense 16-bit peak (a bf16 row only), the
generated kernels' share of a copy, the checkpointed step against the
unconstrained one, and a measurement that did not run, with its reason.
Standard library only. Exit 0 when every check holds, 1 otherwise."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
failed = 0


def check(cond, what):
    global failed
    if not cond:
        failed += 1
        print("FAILED:", what)


def write(d, name, text):
    with open(os.path.join(d, name), "w") as f:
        f.write(text)


with tempfile.TemporaryDirectory() as d:
    write(d, "nvidia-smi-query.txt", "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 1980 MHz\n")
    # gpt2 bf16 train: tfuse 40 ms; compile 60 ms, max-autotune 50 ms (the faster: the yardstick)
    write(d, "gpt2__bf16__train__tfuse.txt",
          "step_ms: 40\nstep_gflop: 7000\ndevice_bytes: 2147483648\npeak_bytes: 4294967296\n"
          "compile_ms: 100\njit_ms: 1400\njit_ms_cached: 80\n")
    write(d, "gpt2__bf16__train__compile.txt", "step_ms: 60\npeak_bytes: 3221225472\ncompile_ms: 50000\n")
    write(d, "gpt2__bf16__train__compile-max.txt", "step_ms: 50\npeak_bytes: 3221225472\ncompile_ms: 300000\n")
    write(d, "gpt2__bf16__train__eager.txt", "reason: not run: the --deadline of 520 s was reached\n")
    write(d, "gpt2__bf16__train__tfuse-profile.txt",
          "step_ms: 45\ncopy_gbps: 3000\nfused_gbps: 2400\nfused_of_copy: 0.8\nfused_under_85pct: 12\nfused_kernels: 40\n")
    write(d, "gpt2__bf16__train__tfuse-ckpt.txt", "step_ms: 46\ndevice_bytes: 1073741824\n")
    # mlp fp32 train: no MFU percentage (fp32), a checkpoint run that could not meet its budget
    write(d, "mlp__fp32__train__tfuse.txt", "step_ms: 1\nstep_gflop: 116.5\npeak_bytes: 536870912\n")
    write(d, "mlp__fp32__train__compile.txt", "step_ms: 2\npeak_bytes: 536870912\n")
    write(d, "mlp__fp32__train__tfuse-ckpt.txt",
          "reason: exited with status 1 (tfuse: error: --memory-budget=256254272 cannot be met: it is under the floor)\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "report.py"), "gpu", d], capture_output=True, text=True)
    out = r.stdout
    check(r.returncode == 0, f"report.py exited {r.returncode}: {r.stderr}")
    main = [line for line in out.splitlines() if line.startswith("| gpt2 | bf16 | train | 40")]
    check(len(main) == 1, f"one main row for gpt2: {main}")
    if main:
        c = [x.strip() for x in main[0].split("|")[1:-1]]
        # tfuse/compile 0.667, tfuse/max-autotune 0.8; tfuse/best compile is against max-autotune: 0.8
        check(c[8] == "0.667" and c[9] == "0.8" and c[10] == "0.8", f"ratios: {c[8:11]}")
        check(c[4].startswith("n/a ("), f"eager not run shows its reason: {c[4]}")
        # memory: tfuse's device_bytes (2048 MiB), not its planned peak (4096)
        check(c[11].startswith("2048 / "), f"tfuse's memory is device_bytes: {c[11]}")
        # compile: passes + JIT cold 1.5 s, cached 0.18 s
        check(c[12].startswith("1.50 / 0.18"), f"tfuse's compile times: {c[12]}")
    check("not run: the --deadline of 520 s was reached" in out, "the reason under the table")
    targets = [line for line in out.splitlines() if line.startswith("| gpt2 | bf16 | train | 175")]
    check(len(targets) == 1, f"a targets row for gpt2 with 7000 GFLOP in 40 ms = 175 TFLOP/s: {out}")
    if targets:
        t = [x.strip() for x in targets[0].split("|")[1:-1]]
        check(t[3] == "175 TFLOP/s (18%)", f"MFU against the H100's 989 TFLOP/s: {t[3]}")
        check(t[4] == "2400 of 3000 GB/s (80%); 12 of 40 kernels under 85%", f"bandwidth: {t[4]}")
        check(t[5] == "1.15x the step; 1024 MiB vs 2048", f"checkpointed: {t[5]}")
    mlp = [line for line in out.splitlines() if line.startswith("| mlp | fp32 | train | 116")]
    check(len(mlp) == 1 and "(" not in mlp[0].split("|")[4], f"fp32: TFLOP/s with no MFU percentage: {mlp}")
    check(len(mlp) == 1 and "n/a (" in mlp[0].split("|")[6], f"an unmet budget shows as not measured: {mlp}")
    check("against NVIDIA H100 80GB HBM3's dense 16-bit peak of 989 TFLOP/s" in out, "the peak is named")

if failed:
    print(out)
    print(f"{failed} check(s) failed")
    sys.exit(1)
print("report.py: every check held")
