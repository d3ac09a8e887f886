#!/usr/bin/env python3
"""make_digits.py [--images] OUTDIR — the 8x8 handwritten digits that ship with
scikit-learn (sklearn.datasets.load_digits: 1797 images, 10 classes; bundled
with the package, nothing is downloaded), as .npy files for `tfuse train`:

  OUTDIR/train_x.npy  float32 [1500, 64]   pixels / 16, in [0, 1]
  OUTDIR/train_y.npy  int64   [1500]       labels 0..9
  OUTDIR/test_x.npy   float32 [297, 64]
  OUTDIR/test_y.npy   int64   [297]

--images also writes them as 32x32 RGB images for examples/cnn.ir (each
pixel a 4x4 block, the same in the three channels):

  OUTDIR/train_images.npy  float32 [1500, 3, 32, 32]
  OUTDIR/test_images.npy   float32 [297, 3, 32, 32]

The split is deterministic: one shuffle with a fixed seed (0), then the first
1500 samples train and the other 297 are held out.

  python3 scripts/make_digits.py data/digits
  tfuse train examples/mlp.ir --dim F=64 --data x=data/digits/train_x.npy,y=data/digits/train_y.npy \\
      --eval-data x=data/digits/test_x.npy,y=data/digits/test_y.npy --steps 300
"""
import os
import sys

import numpy as np
from sklearn.datasets import load_digits

N_TRAIN = 1500
SEED = 0


def main():
    args = sys.argv[1:]
    images = "--images" in args
    args = [a for a in args if a != "--images"]
    if len(args) != 1 or args[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = args[0]
    os.makedirs(out, exist_ok=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)   # [1797, 64], pixels 0..16
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(SEED).permutation(len(y))
    x, y = x[order], y[order]
    parts = {"train_x": x[:N_TRAIN], "train_y": y[:N_TRAIN], "test_x": x[N_TRAIN:], "test_y": y[N_TRAIN:]}
    if images:
        for part in ("train", "test"):
            px = parts[part + "_x"].reshape(-1, 1, 8, 8).repeat(4, axis=2).repeat(4, axis=3)
            parts[part + "_images"] = np.repeat(px, 3, axis=1)
    for name, arr in parts.items():
        np.save(os.path.join(out, name + ".npy"), np.ascontiguousarray(arr))
    print(f"{out}: {N_TRAIN} training and {len(y) - N_TRAIN} held-out digits (8x8 = 64 pixels, 10 classes)"
          + ("; also as 3x32x32 images" if images else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
