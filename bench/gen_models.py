#!/usr/bin/env python3
"""The benchmark models: one structural description per model, the tfuse IR
written from it, and the place twins.py reads the same description from.

    python3 bench/gen_models.py            # (re)write bench/models/*.ir
    python3 bench/gen_models.py --check    # exit 1 if a file differs from what it would write

Only the structure (how many layers, blocks and stages) lives here; every size
is a `dim` in the .ir file, so `tfuse ... --dim H=4096` and
`twins.build(name, dims={"H": 4096})` change the same numbers. The standard
library is all this file needs.

Names of params and buffers are paths a PyTorch module tree can have
(`h.0.attn.wq`, `s2.b0.bn1.mean`): twins.py builds modules whose
state_dict() keys are exactly these names, so a safetensors file written by
tfuse loads into the twin with strict name checking, and the other way round.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = os.path.join(HERE, "models")

# Structure of each model. "dims" are the defaults written into the file;
# "dim_notes" are the comments beside them.
MODELS = {
    "mlp": {
        "kind": "mlp",
        "hidden_layers": 2,
        "dims": {"B": 128, "F": 784, "H": 1024, "C": 10},
        "dim_notes": {"B": "batch", "F": "input features (28x28)", "H": "hidden width (GPU benchmark: --dim H=4096 --dim B=1024)",
                      "C": "classes"},
        "train": {"optimizer": "adamw(lr=1e-3, weight_decay=0.01)", "precision": "fp32"},
        "doc": ["An MLP 784-H-H-10 (H = 1024 here; the GPU benchmark uses H = 4096, batch 1024):",
                "linear -> relu twice, a linear classifier and the mean cross-entropy."],
    },
    "resnet": {
        "kind": "resnet",
        "blocks": [1, 1, 1],
        "dims": {"N": 32, "C1": 32, "C2": 64, "C3": 128, "K": 10},
        "dim_notes": {"N": "batch", "C1": "stage 1 width (32x32)", "C2": "stage 2 width (16x16)", "C3": "stage 3 width (8x8)",
                      "K": "classes"},
        "train": {"optimizer": "sgd(lr=0.1, momentum=0.9, nesterov=true, weight_decay=5e-4)",
                  "schedule": "cosine(total_steps=10000, warmup_steps=200)", "precision": "fp32"},
        "doc": ["A small ResNet for 32x32 RGB images, sized for a 2-core CPU: a 3x3 stem, three stages of",
                "one basic block each (conv-batchnorm-relu, conv-batchnorm, residual add, relu); stages 2",
                "and 3 start with a stride-2 block whose shortcut is a 1x1 stride-2 conv + batchnorm;",
                "global average pooling and a linear classifier. Convs before a batchnorm have no bias."],
    },
    "resnet18": {
        "kind": "resnet",
        "blocks": [2, 2, 2, 2],
        "dims": {"N": 256, "C1": 64, "C2": 128, "C3": 256, "C4": 512, "K": 10},
        "dim_notes": {"N": "batch", "C1": "stage 1 width (32x32)", "C2": "stage 2 width (16x16)", "C3": "stage 3 width (8x8)",
                      "C4": "stage 4 width (4x4)", "K": "classes"},
        "train": {"optimizer": "sgd(lr=0.1, momentum=0.9, nesterov=true, weight_decay=5e-4)",
                  "schedule": "cosine(total_steps=10000, warmup_steps=200)", "precision": "fp32"},
        "doc": ["ResNet-18 for 32x32 images (the CIFAR variant: a 3x3 stem and no max-pool): four stages",
                "of two basic blocks, widths 64-128-256-512, stride-2 downsampling at stages 2-4 with",
                "1x1 conv + batchnorm shortcuts, global average pooling and a linear classifier."],
    },
    "gpt": {
        "kind": "gpt",
        "layers": 4,
        "dims": {"B": 8, "T": 128, "V": 512, "E": 256, "H": 4, "D": 64, "F": 1024},
        "dim_notes": {"B": "batch", "T": "sequence length (= positions)", "V": "vocabulary", "E": "model width = H * D",
                      "H": "heads", "D": "head size", "F": "MLP width = 4 * E"},
        "train": {"optimizer": "adamw(lr=3e-4, beta2=0.95, weight_decay=0.1)",
                  "schedule": "cosine(total_steps=5000, warmup_steps=200)", "precision": "fp32", "clip_grad_norm": "1.0"},
        "doc": ["A 4-layer GPT-style decoder: token + position embeddings, pre-norm blocks (layernorm,",
                "causal multi-head attention with biased q/k/v/out projections, residual; layernorm,",
                "GELU (tanh form, as GPT-2) MLP of width 4E, residual), a final layernorm and an untied",
                "output projection to the vocabulary; mean cross-entropy over every position."],
    },
    "gpt2": {
        "kind": "gpt",
        "layers": 12,
        "dims": {"B": 8, "T": 1024, "V": 50257, "E": 768, "H": 12, "D": 64, "F": 3072},
        "dim_notes": {"B": "batch", "T": "sequence length (= positions)", "V": "vocabulary (GPT-2's)", "E": "model width = H * D",
                      "H": "heads", "D": "head size", "F": "MLP width = 4 * E"},
        "train": {"optimizer": "adamw(lr=3e-4, beta2=0.95, weight_decay=0.1)",
                  "schedule": "cosine(total_steps=5000, warmup_steps=200)", "precision": "fp32", "clip_grad_norm": "1.0"},
        "doc": ["GPT-2 small's shape (12 layers, E = 768, 12 heads of 64, T = 1024, V = 50257), built as",
                "gpt.ir is. One difference from GPT-2: the output projection is its own param (head.w),",
                "not tied to the token embedding; the FLOPs are the same."],
    },
    # Small models, the sizes people fine-tune and serve on CPUs (steps of 0.2-2 ms): issue 33's small rows
    "small_conv": {
        "kind": "resnet",
        "blocks": [1, 1],
        "image": 16,
        "dims": {"N": 16, "C1": 16, "C2": 32, "K": 10},
        "dim_notes": {"N": "batch", "C1": "stage 1 width (16x16)", "C2": "stage 2 width (8x8)", "K": "classes"},
        "train": {"optimizer": "sgd(lr=0.1, momentum=0.9, nesterov=true, weight_decay=5e-4)", "precision": "fp32"},
        "doc": ["A small conv-batchnorm net for 16x16 RGB images, batch 16: a 3x3 stem and two stages of",
                "one basic block (the second stride 2 with a 1x1 conv + batchnorm shortcut), global average",
                "pooling and a linear classifier."],
    },
    "small_mlp": {
        "kind": "mlp",
        "hidden_layers": 3,
        "residual": True,
        "dims": {"B": 32, "F": 64, "H": 256, "C": 10},
        "dim_notes": {"B": "batch", "F": "input features", "H": "hidden width", "C": "classes"},
        "train": {"optimizer": "adamw(lr=1e-3, weight_decay=0.01)", "precision": "fp32"},
        "doc": ["A residual MLP 64-256-256-256-10 at batch 32: linear -> relu, then two residual",
                "layers a = a + relu(linear(a)), a linear classifier and the mean cross-entropy."],
    },
    "small_gpt": {
        "kind": "gpt",
        "layers": 1,
        "dims": {"B": 4, "T": 32, "V": 256, "E": 128, "H": 4, "D": 32, "F": 512},
        "dim_notes": {"B": "batch", "T": "sequence length (= positions)", "V": "vocabulary", "E": "model width = H * D",
                      "H": "heads", "D": "head size", "F": "MLP width = 4 * E"},
        "train": {"optimizer": "adamw(lr=3e-4, beta2=0.95, weight_decay=0.1)", "precision": "fp32", "clip_grad_norm": "1.0"},
        "doc": ["One GPT block at T = 32 (gpt.ir's structure with one layer, E = 128, 4 heads of 32):",
                "the transformer block people fine-tune and serve on CPUs."],
    },
}


class Writer:
    def __init__(self):
        self.lines = []

    def __call__(self, text=""):
        self.lines.append(text)

    def text(self):
        return "\n".join(self.lines) + "\n"


def header(w, name, cfg):
    for line in cfg["doc"]:
        w("# " + line)
    w("# Written by bench/gen_models.py: edit that file and run it, not this one.")
    w("module " + name)
    width = max(len(f"dim {k} = {v}") for k, v in cfg["dims"].items())
    for k, v in cfg["dims"].items():
        decl = f"dim {k} = {v}"
        w(f"{decl:<{width}}   # {cfg['dim_notes'][k]}")
    w()


def train_block(w, cfg):
    w()
    w("train {")
    for k in ("optimizer", "schedule", "precision", "clip_grad_norm"):
        if k in cfg["train"]:
            w(f"  {k} = {cfg['train'][k]}")
    w("}")


def emit_mlp(name, cfg):
    w = Writer()
    header(w, name, cfg)
    n = cfg["hidden_layers"]
    w("input  x : f32[B, F]")
    w("input  y : i64[B]")
    fan_in = "F"
    for i in range(1, n + 1):
        w(f"param  fc{i}.w : f32[{fan_in}, H] = kaiming_uniform()")
        w(f"param  fc{i}.b : f32[H] = zeros()")
        fan_in = "H"
    w(f"param  fc{n + 1}.w : f32[H, C] = xavier_uniform()")
    w(f"param  fc{n + 1}.b : f32[C] = zeros()")
    w()
    prev = "x"
    for i in range(1, n + 1):
        w(f"h{i} = linear({prev}, fc{i}.w, fc{i}.b)")
        if cfg.get("residual") and i > 1:   # a = a + relu(linear(a))
            w(f"r{i} = relu(h{i})")
            w(f"a{i} = add({prev}, r{i})")
        else:
            w(f"a{i} = relu(h{i})")
        prev = f"a{i}"
    w(f"lg = linear({prev}, fc{n + 1}.w, fc{n + 1}.b)")
    w("loss = cross_entropy(lg, y)")
    w()
    w("output loss")
    w("output logits = lg")
    train_block(w, cfg)
    return w.text()


def resnet_stages(cfg):
    """[(stage name, width dim, stride of its first block, blocks)]; the
    spatial size halves at every stage after the first."""
    out = []
    for i, nb in enumerate(cfg["blocks"]):
        out.append((f"s{i + 1}", f"C{i + 1}", 1 if i == 0 else 2, nb))
    return out


def emit_resnet(name, cfg):
    w = Writer()
    header(w, name, cfg)
    img = cfg.get("image", 32)
    w(f"input  images : f32[N, 3, {img}, {img}]")
    w("input  labels : i64[N]")
    w()

    def conv_bn_decls(prefix, conv, bn, cout, cin, k):
        w(f"param  {prefix}{conv}.w : f32[{cout}, {cin}, {k}, {k}] = kaiming_uniform()")
        w(f"param  {prefix}{bn}.g : f32[{cout}] = ones()")
        w(f"param  {prefix}{bn}.b : f32[{cout}] = zeros()")
        w(f"buffer {prefix}{bn}.mean : f32[{cout}] = zeros()")
        w(f"buffer {prefix}{bn}.var : f32[{cout}] = ones()")

    stages = resnet_stages(cfg)
    w("# stem")
    conv_bn_decls("stem.", "conv", "bn", "C1", 3, 3)
    cin = "C1"
    for sname, width, stride, nb in stages:
        for b in range(nb):
            p = f"{sname}.b{b}."
            s = stride if b == 0 else 1
            w(f"# stage {sname[1:]}, block {b}" + (f" (stride {s})" if s != 1 else ""))
            conv_bn_decls(p, "conv1", "bn1", width, cin, 3)
            conv_bn_decls(p, "conv2", "bn2", width, width, 3)
            if s != 1 or cin != width:
                conv_bn_decls(p + "down.", "conv", "bn", width, cin, 1)
            cin = width
    w(f"param  fc.w : f32[{cin}, K] = xavier_uniform()")
    w("param  fc.b : f32[K] = zeros()")
    w()

    w("x0.c = conv2d(images, stem.conv.w, padding=1)")
    w("x0.n = batchnorm(x0.c, stem.bn.g, stem.bn.b, stem.bn.mean, stem.bn.var)")
    w("x0 = relu(x0.n)")
    prev, cin = "x0", "C1"
    for sname, width, stride, nb in stages:
        for b in range(nb):
            p = f"{sname}.b{b}."
            v = f"{sname}b{b}"
            s = stride if b == 0 else 1
            sa = f", stride={s}" if s != 1 else ""
            w(f"{v}.c1 = conv2d({prev}, {p}conv1.w{sa}, padding=1)")
            w(f"{v}.n1 = batchnorm({v}.c1, {p}bn1.g, {p}bn1.b, {p}bn1.mean, {p}bn1.var)")
            w(f"{v}.r1 = relu({v}.n1)")
            w(f"{v}.c2 = conv2d({v}.r1, {p}conv2.w, padding=1)")
            w(f"{v}.n2 = batchnorm({v}.c2, {p}bn2.g, {p}bn2.b, {p}bn2.mean, {p}bn2.var)")
            if s != 1 or cin != width:
                w(f"{v}.dc = conv2d({prev}, {p}down.conv.w{sa})")
                w(f"{v}.dn = batchnorm({v}.dc, {p}down.bn.g, {p}down.bn.b, {p}down.bn.mean, {p}down.bn.var)")
                short = f"{v}.dn"
            else:
                short = prev
            w(f"{v}.sum = add({v}.n2, {short})")
            w(f"{v} = relu({v}.sum)")
            prev, cin = v, width
    w(f"pool = global_avgpool({prev})")
    w("lg = linear(pool, fc.w, fc.b)")
    w("loss = cross_entropy(lg, labels)")
    w()
    w("output loss")
    w("output logits = lg")
    train_block(w, cfg)
    return w.text()


def emit_gpt(name, cfg):
    w = Writer()
    header(w, name, cfg)
    L = cfg["layers"]
    # GPT-2's init: N(0, 0.02), residual projections scaled by 1/sqrt(2 L)
    std_res = 0.02 / (2 * L) ** 0.5
    w("input  tokens  : i64[B, T]")
    w("input  targets : i64[B, T]")
    w()
    w("param  wte : f32[V, E] = normal(std=0.02)")
    w("param  wpe : f32[T, E] = normal(std=0.02)")
    for i in range(L):
        p = f"h.{i}."
        w(f"# layer {i}")
        w(f"param  {p}ln1.g : f32[E] = ones()")
        w(f"param  {p}ln1.b : f32[E] = zeros()")
        for q in ("q", "k", "v"):
            w(f"param  {p}attn.w{q} : f32[E, E] = normal(std=0.02)")
            w(f"param  {p}attn.b{q} : f32[E] = zeros()")
        w(f"param  {p}attn.wo : f32[E, E] = normal(std={std_res:.6g})")
        w(f"param  {p}attn.bo : f32[E] = zeros()")
        w(f"param  {p}ln2.g : f32[E] = ones()")
        w(f"param  {p}ln2.b : f32[E] = zeros()")
        w(f"param  {p}mlp.w1 : f32[E, F] = normal(std=0.02)")
        w(f"param  {p}mlp.b1 : f32[F] = zeros()")
        w(f"param  {p}mlp.w2 : f32[F, E] = normal(std={std_res:.6g})")
        w(f"param  {p}mlp.b2 : f32[E] = zeros()")
    w("param  lnf.g : f32[E] = ones()")
    w("param  lnf.b : f32[E] = zeros()")
    w("param  head.w : f32[E, V] = normal(std=0.02)")
    w()
    w("te = embedding(tokens, wte)                  # [B, T, E]")
    w("x0 = add(te, wpe)                            # positions broadcast over the batch")
    prev = "x0"
    for i in range(L):
        p, v = f"h.{i}.", f"l{i}"
        w(f"# layer {i}")
        w(f"{v}.h1 = layernorm({prev}, {p}ln1.g, {p}ln1.b)")
        for q in ("q", "k", "v"):
            w(f"{v}.{q} = linear({v}.h1, {p}attn.w{q}, {p}attn.b{q})")
        for q in ("q", "k", "v"):
            w(f"{v}.{q}4 = reshape({v}.{q}, shape=[B, T, H, D])")
        for q in ("q", "k", "v"):
            w(f"{v}.{q}h = transpose({v}.{q}4, perm=[0, 2, 1, 3])   # [B, H, T, D]")
        w(f"{v}.att = attention({v}.qh, {v}.kh, {v}.vh, causal=true)")
        w(f"{v}.at = transpose({v}.att, perm=[0, 2, 1, 3])")
        w(f"{v}.ac = reshape({v}.at, shape=[B, T, E])")
        w(f"{v}.ao = linear({v}.ac, {p}attn.wo, {p}attn.bo)")
        w(f"{v}.x1 = add({prev}, {v}.ao)")
        w(f"{v}.h2 = layernorm({v}.x1, {p}ln2.g, {p}ln2.b)")
        w(f"{v}.m1 = linear({v}.h2, {p}mlp.w1, {p}mlp.b1)")
        w(f'{v}.m2 = gelu({v}.m1, approx="tanh")')
        w(f"{v}.m3 = linear({v}.m2, {p}mlp.w2, {p}mlp.b2)")
        w(f"{v}.out = add({v}.x1, {v}.m3)")
        prev = f"{v}.out"
    w(f"hf = layernorm({prev}, lnf.g, lnf.b)")
    w("lg = linear(hf, head.w)                      # [B, T, V]")
    w("loss = cross_entropy(lg, targets)")
    w()
    w("output loss")
    w("output logits = lg")
    train_block(w, cfg)
    return w.text()


EMITTERS = {"mlp": emit_mlp, "resnet": emit_resnet, "gpt": emit_gpt}


def model_text(name):
    cfg = MODELS[name]
    return EMITTERS[cfg["kind"]](name, cfg)


def model_path(name):
    return os.path.join(MODELS_DIR, name + ".ir")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args()
    os.makedirs(MODELS_DIR, exist_ok=True)
    stale = []
    for name in MODELS:
        text, path = model_text(name), model_path(name)
        if args.check:
            try:
                with open(path) as f:
                    same = f.read() == text
            except FileNotFoundError:
                same = False
            if not same:
                stale.append(path)
        else:
            with open(path, "w") as f:
                f.write(text)
            print("wrote", os.path.relpath(path))
    if stale:
        print("out of date (run python3 bench/gen_models.py):", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
