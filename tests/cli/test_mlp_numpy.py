#!/usr/bin/env python3
"""examples/mlp.ir run by `tfuse run` against an independent NumPy computation.

Makes fresh random parameters and inputs (seed printed; replay with
TFUSE_TEST_SEED), writes them as .safetensors (by its own writer, not
tfuse's) and .npy, runs the CLI in fp32 and in the model's own bf16, and
compares logits and loss with a float64 NumPy forward pass of the same model. Usage: test_mlp_numpy.py TFUSE MLP.ir TMPDIR
"""
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    tfuse, model, tmp = sys.argv[1:4]
    os.makedirs(tmp, exist_ok=True)
    seed = int(os.environ.get("TFUSE_TEST_SEED", time.time_ns() % 2**31))
    print(f"seed {seed} (replay with TFUSE_TEST_SEED)")
    rng = np.random.default_rng(seed)
    B = 37  # odd batch through --dim
    p = {
        "w1": rng.normal(0, 0.05, (784, 256)).astype(np.float32),
        "b1": rng.normal(0, 0.1, (256,)).astype(np.float32),
        "w2": rng.normal(0, 0.1, (256, 10)).astype(np.float32),
        "b2": rng.normal(0, 0.1, (10,)).astype(np.float32),
    }
    x = rng.normal(0, 1, (B, 784)).astype(np.float32)
    y = rng.integers(0, 10, (B,)).astype(np.int64)
    write_safetensors(f"{tmp}/params.safetensors", p)
    np.save(f"{tmp}/x.npy", x)
    np.save(f"{tmp}/y.npy", y)
    def run(tag, *extra):
        cmd = [tfuse, "run", model, "--dim", f"B={B}", "--params", f"{tmp}/params.safetensors",
               "--input", f"x={tmp}/x.npy", "--input", f"y={tmp}/y.npy",
               "--output", f"logits={tmp}/logits{tag}.npy", "--output", f"loss={tmp}/loss{tag}.npy", *extra]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print("tfuse run failed:", r.returncode, r.stderr)
        return r.returncode == 0

    # the model's train block asks for bf16: run it so, and in fp32
    if not run("", "--precision=fp32") or not run("_bf16"):
        print("0 passed, 1 failed")
        return 1

    # the same model in float64, written from its definition
    f64 = {k: v.astype(np.float64) for k, v in p.items()}
    h = np.maximum(x.astype(np.float64) @ f64["w1"] + f64["b1"], 0)
    lg = h @ f64["w2"] + f64["b2"]
    z = lg - lg.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(B), y].mean()

    got_lg = np.load(f"{tmp}/logits.npy")
    got_loss = np.load(f"{tmp}/loss.npy")
    passed = failed = 0
    bf_lg = np.load(f"{tmp}/logits_bf16.npy")
    bf_loss = float(np.load(f"{tmp}/loss_bf16.npy"))
    scale = float(np.abs(lg).max())
    checks = [
        ("logits dtype/shape", got_lg.dtype == np.float32 and got_lg.shape == (B, 10)),
        # bf16 matmuls: inputs rounded to 8 significant bits; the error stays
        # within a few units of 2^-8 of the logits' scale
        ("bf16 logits near", float(np.abs(bf_lg - lg).max()) <= scale / 32),
        ("bf16 loss near", abs(bf_loss - loss) <= max(1.0, abs(loss)) / 32),
        ("loss is a scalar", got_loss.shape == ()),
        # f32 storage of every intermediate: a few ulps of the values involved
        ("logits match", np.allclose(got_lg, lg, rtol=1e-5, atol=1e-5)),
        ("loss matches", abs(float(got_loss) - loss) <= 1e-5 * max(1.0, abs(loss))),
    ]
    for name, ok in checks:
        if ok:
            passed += 1
        else:
            failed += 1
            print("FAILED:", name)
    print("max |logits diff|:", float(np.abs(got_lg - lg).max()), "loss", float(got_loss), "vs", loss)
    print("bf16: max |logits diff|:", float(np.abs(bf_lg - lg).max()), "of scale", scale, "loss", bf_loss)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
