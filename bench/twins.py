"""PyTorch twins of the benchmark models in bench/models/*.ir.

A twin computes the same function as its tfuse model for the same weights:

- its state_dict() keys are the IR names of the model's params and buffers,
  with the IR's shapes and layouts (linear weights [in, out], conv weights
  [out, in, kh, kw]), so a safetensors file tfuse writes loads into it and
  one written from it loads into tfuse;
- the ops follow tfuse's op table (ir/ops.def, ir/ops_attrs.h,
  ir/interp_kernels.c): layernorm and batchnorm eps 1e-5, batchnorm momentum
  0.1 with the unbiased batch variance in the running variance (the biased
  one to normalize), GELU in the form the IR names (the GPT models say
  approx="tanh"), attention scaled by 1/sqrt(head size) with key j visible to
  query i when j <= i, cross-entropy as the mean over every position;
- the train step is the IR's train block: the same optimizer with tfuse's
  defaults (which are PyTorch's formulas, see passes/autodiff.c), the same
  learning-rate schedule evaluated at the same 0-based step, and
  clip_grad_norm (min(1, clip / (norm + 1e-6)), as torch.nn.utils does).

Sizes come from the .ir file's `dim` declarations, overridable as with
`tfuse --dim`; the structure (layers, blocks) from gen_models.MODELS. The
same code builds the CPU sizes and the GPU ones (MLP 784-4096-4096-10,
ResNet-18, GPT-2 small).

Also here: a safetensors reader/writer in plain numpy (no safetensors
package), and a reader of the parts of the text format the twins need
(dims, inputs, params, buffers, initializers, the train block).
"""
import json
import math
import os
import re
import struct
import zlib

import numpy as np

import gen_models

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:   # the safetensors and IR helpers work without torch
    torch = None
    nn = None
    F = None

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, a JSON header
# {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
# then the raw little-endian data (offsets relative to its start).

_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
              "U8": "u1", "BOOL": "?"}
_NP_TO_ST = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64",
             np.dtype("<i4"): "I32", np.dtype("<i2"): "I16", np.dtype("i1"): "I8", np.dtype("u1"): "U8",
             np.dtype("?"): "BOOL"}


def read_safetensors(path):
    """Returns ({name: numpy array}, metadata dict). BF16 comes back as float32
    (exactly: bf16 is the top half of an f32)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        shape = tuple(h["shape"])
        raw = data[begin:end]
        if h["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif h["dtype"] in _ST_DTYPES:
            arr = np.frombuffer(raw, dtype=_ST_DTYPES[h["dtype"]])
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {h['dtype']}")
        count = int(np.prod(shape)) if shape else 1
        if arr.size != count:
            raise ValueError(f"{path}: {name}: {arr.size} elements for shape {list(shape)}")
        out[name] = arr.reshape(shape).copy()
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: numpy array} (float64/32/16, int64/32/16/8, uint8, bool)."""
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        dt = _NP_TO_ST.get(a.dtype)
        if dt is None:
            raise ValueError(f"{name}: dtype {a.dtype} has no safetensors name here")
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * (-len(hj) % 8)   # the data starts 8-aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        f.writelines(chunks)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# The parts of a model file the twins read.

_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$")


def parse_call(text):
    """'adamw(lr=3e-4, beta2=0.95)' -> ('adamw', {'lr': 3e-4, 'beta2': 0.95})."""
    m = _CALL.match(text)
    if not m:
        raise ValueError(f"cannot read call {text!r}")
    args = {}
    if m.group(2) and m.group(2).strip():
        for part in m.group(2).split(","):
            k, v = (s.strip() for s in part.split("=", 1))
            if v in ("true", "false"):
                args[k] = v == "true"
            else:
                try:
                    args[k] = float(v)
                except ValueError:
                    args[k] = v.strip('"')
    return m.group(1), args


class IRInfo:
    """dims (with overrides), inputs, params and buffers (in file order), the train block."""

    def __init__(self, path, dims=None):
        self.path = path
        self.dims = {}
        self.inputs = []    # (name, dtype, shape)
        self.decls = []     # (kind 'param'|'buffer', name, dtype, shape, init call text)
        self.train = {}
        overrides = dict(dims or {})
        unknown = set(overrides)
        in_train = False
        with open(path) as f:
            lines = [ln.split("#", 1)[0].strip() for ln in f]
        for ln in lines:
            if not ln:
                continue
            if in_train:
                if ln.startswith("}"):
                    in_train = False
                else:
                    k, v = (s.strip() for s in ln.split("=", 1))
                    self.train[k] = v
                continue
            word = ln.split()[0]
            if word == "dim":
                m = re.match(r"dim\s+(\w+)\s*=\s*(\d+)$", ln)
                name = m.group(1)
                self.dims[name] = int(overrides.get(name, m.group(2)))
                unknown.discard(name)
            elif word in ("input", "param", "buffer"):
                m = re.match(r"(input|param|buffer)\s+([\w.]+)\s*:\s*(\w+)\[([^\]]*)\]\s*(?:=\s*(.*))?$", ln)
                kind, name, dtype, shape_s, init = m.groups()
                shape = tuple(self._size(s.strip()) for s in shape_s.split(",") if s.strip())
                if kind == "input":
                    self.inputs.append((name, dtype, shape))
                else:
                    self.decls.append((kind, name, dtype, shape, (init or "zeros()").strip()))
            elif word == "train" and ln.rstrip().endswith("{"):
                in_train = True
        if unknown:
            raise ValueError(f"{path}: no dim named {', '.join(sorted(unknown))}")

    def _size(self, s):
        return int(s) if s.isdigit() else self.dims[s]

    def precision(self):
        return self.train.get("precision", "fp32")

    def optimizer(self):
        return parse_call(self.train["optimizer"]) if "optimizer" in self.train else ("sgd", {"lr": 0.01})

    def schedule(self):
        return parse_call(self.train["schedule"]) if "schedule" in self.train else ("constant", {})

    def clip(self):
        return float(self.train["clip_grad_norm"]) if "clip_grad_norm" in self.train else None


def model_path(name):
    return os.path.join(HERE, "models", name + ".ir")


def init_values(info, seed=0, perturb=False):
    """numpy float32 values for every param and buffer, drawn as the IR's
    initializers say (the same families, not tfuse's exact numbers). With
    perturb, the constant ones (zeros, ones, const) get random values around
    them and normal() weights at least std 1/sqrt(rows), so that a check sees
    every param and buffer do its part and every nonlinearity bend."""
    out = {}
    for kind, name, dtype, shape, init in info.decls:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        fn, a = parse_call(init)
        fan_in = fan_out = 1
        if len(shape) == 2:
            fan_in, fan_out = shape
        elif len(shape) >= 3:
            rf = int(np.prod(shape[2:]))
            fan_in, fan_out = shape[1] * rf, shape[0] * rf
        if fn in ("zeros", "ones", "const"):
            base = {"zeros": 0.0, "ones": 1.0}.get(fn, a.get("value", 0.0))
            v = np.full(shape, base)
            if perturb:
                if name.endswith(".var"):
                    v = rng.uniform(0.5, 1.5, shape)   # a variance stays positive
                else:
                    v = base + 0.2 * rng.standard_normal(shape)
        elif fn == "normal":
            std = a.get("std", 1.0)
            if perturb and len(shape) == 2:
                std = max(std, 1.0 / math.sqrt(shape[0]))   # unit-scale activations: nonlinearities matter
            v = a.get("mean", 0.0) + std * rng.standard_normal(shape)
        elif fn == "uniform":
            v = rng.uniform(a.get("low", -1.0), a.get("high", 1.0), shape)
        elif fn == "kaiming_uniform":
            bound = a.get("gain", math.sqrt(2.0)) * math.sqrt(3.0 / fan_in)
            v = rng.uniform(-bound, bound, shape)
        elif fn == "xavier_uniform":
            bound = a.get("gain", 1.0) * math.sqrt(6.0 / (fan_in + fan_out))
            v = rng.uniform(-bound, bound, shape)
        else:
            raise ValueError(f"{name}: initializer {fn} not known to twins.py")
        out[name] = np.asarray(v, dtype=np.float32)
    return out


# ---------------------------------------------------------------------------
# The twins. Every module keeps its tensors under the IR's names: a linear
# layer is a module with `w` [in, out] (and `b`), a conv a module with `w`,
# a norm a module with `g`, `b` (and batchnorm's buffers `mean`, `var`).

if torch is not None:

    class Linear(nn.Module):
        """y = x @ w + b with w [in, out] (tfuse's layout). F.linear with the
        transposed view runs the same GEMM as nn.Linear, with no copy."""

        def __init__(self, fin, fout, bias=True):
            super().__init__()
            self.w = nn.Parameter(torch.empty(fin, fout))
            self.b = nn.Parameter(torch.empty(fout)) if bias else None

        def forward(self, x):
            return F.linear(x, self.w.t(), self.b)

    class Conv(nn.Module):
        def __init__(self, cin, cout, k, stride=1, padding=0):
            super().__init__()
            self.w = nn.Parameter(torch.empty(cout, cin, k, k))
            self.stride, self.padding = stride, padding

        def forward(self, x):
            return F.conv2d(x, self.w, None, self.stride, self.padding)

    class BatchNorm(nn.Module):
        """tfuse's batchnorm: channel axis 1, momentum 0.1, eps 1e-5; training
        normalizes with the batch's biased variance and moves the running
        variance toward the unbiased one (PyTorch's rule too)."""

        def __init__(self, c, momentum=0.1, eps=1e-5):
            super().__init__()
            self.g = nn.Parameter(torch.empty(c))
            self.b = nn.Parameter(torch.empty(c))
            self.register_buffer("mean", torch.zeros(c))
            self.register_buffer("var", torch.ones(c))
            self.momentum, self.eps = momentum, eps

        def forward(self, x):
            return F.batch_norm(x, self.mean, self.var, self.g, self.b, self.training, self.momentum, self.eps)

    class LayerNorm(nn.Module):
        def __init__(self, d, eps=1e-5):
            super().__init__()
            self.g = nn.Parameter(torch.empty(d))
            self.b = nn.Parameter(torch.empty(d))
            self.eps = eps

        def forward(self, x):
            return F.layer_norm(x, (x.shape[-1],), self.g, self.b, self.eps)

    class ConvBN(nn.Module):
        def __init__(self, cin, cout, k, stride=1, padding=0):
            super().__init__()
            self.conv = Conv(cin, cout, k, stride, padding)
            self.bn = BatchNorm(cout)

        def forward(self, x):
            return self.bn(self.conv(x))

    class MLP(nn.Module):
        def __init__(self, cfg, d):
            super().__init__()
            n = cfg["hidden_layers"]
            fin = d["F"]
            for i in range(1, n + 1):
                setattr(self, f"fc{i}", Linear(fin, d["H"]))
                fin = d["H"]
            setattr(self, f"fc{n + 1}", Linear(d["H"], d["C"]))
            self.n = n
            self.residual = cfg.get("residual", False)
            self.label_bounds = {"y": d["C"]}

        def forward(self, x, y):
            for i in range(1, self.n + 1):
                a = F.relu(getattr(self, f"fc{i}")(x))
                x = x + a if self.residual and i > 1 else a
            logits = getattr(self, f"fc{self.n + 1}")(x)
            return F.cross_entropy(logits.float(), y), logits

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = Conv(cin, cout, 3, stride, 1)
            self.bn1 = BatchNorm(cout)
            self.conv2 = Conv(cout, cout, 3, 1, 1)
            self.bn2 = BatchNorm(cout)
            self.down = ConvBN(cin, cout, 1, stride, 0) if stride != 1 or cin != cout else None

        def forward(self, x):
            h = F.relu(self.bn1(self.conv1(x)))
            h = self.bn2(self.conv2(h))
            return F.relu(h + (self.down(x) if self.down is not None else x))

    class ResNet(nn.Module):
        def __init__(self, cfg, d):
            super().__init__()
            self.stem = ConvBN(3, d["C1"], 3, 1, 1)
            cin = d["C1"]
            self.stages = []
            for sname, width, stride, nb in gen_models.resnet_stages(cfg):
                stage = nn.Module()
                for b in range(nb):
                    stage.add_module(f"b{b}", BasicBlock(cin, d[width], stride if b == 0 else 1))
                    cin = d[width]
                self.add_module(sname, stage)
                self.stages.append(sname)
            self.fc = Linear(cin, d["K"])
            self.label_bounds = {"labels": d["K"]}

        def forward(self, images, labels):
            x = F.relu(self.stem(images))
            for sname in self.stages:
                for blk in getattr(self, sname).children():
                    x = blk(x)
            logits = self.fc(x.mean(dim=(2, 3)))
            return F.cross_entropy(logits.float(), labels), logits

    class Attention(nn.Module):
        def __init__(self, d):
            super().__init__()
            E = d["E"]
            for q in ("q", "k", "v", "o"):
                setattr(self, "w" + q, nn.Parameter(torch.empty(E, E)))
                setattr(self, "b" + q, nn.Parameter(torch.empty(E)))
            self.H, self.D = d["H"], d["D"]

        def forward(self, x):
            B, T, E = x.shape

            def heads(w, b):
                return F.linear(x, w.t(), b).view(B, T, self.H, self.D).transpose(1, 2)   # [B, H, T, D]

            q, k, v = heads(self.wq, self.bq), heads(self.wk, self.bk), heads(self.wv, self.bv)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # scale 1/sqrt(D)
            a = a.transpose(1, 2).reshape(B, T, E)
            return F.linear(a, self.wo.t(), self.bo)

    class GeluMLP(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.w1 = nn.Parameter(torch.empty(d["E"], d["F"]))
            self.b1 = nn.Parameter(torch.empty(d["F"]))
            self.w2 = nn.Parameter(torch.empty(d["F"], d["E"]))
            self.b2 = nn.Parameter(torch.empty(d["E"]))

        def forward(self, x):
            h = F.gelu(F.linear(x, self.w1.t(), self.b1), approximate="tanh")
            return F.linear(h, self.w2.t(), self.b2)

    class GPTBlock(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln1 = LayerNorm(d["E"])
            self.attn = Attention(d)
            self.ln2 = LayerNorm(d["E"])
            self.mlp = GeluMLP(d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class Head(nn.Module):
        def __init__(self, E, V):
            super().__init__()
            self.w = nn.Parameter(torch.empty(E, V))

        def forward(self, x):
            return F.linear(x, self.w.t())

    class GPT(nn.Module):
        def __init__(self, cfg, d):
            super().__init__()
            if d["H"] * d["D"] != d["E"]:
                raise ValueError(f"E = {d['E']} is not H * D = {d['H']} * {d['D']}")
            self.wte = nn.Parameter(torch.empty(d["V"], d["E"]))
            self.wpe = nn.Parameter(torch.empty(d["T"], d["E"]))
            self.h = nn.ModuleList(GPTBlock(d) for _ in range(cfg["layers"]))
            self.lnf = LayerNorm(d["E"])
            self.head = Head(d["E"], d["V"])
            self.label_bounds = {"tokens": d["V"], "targets": d["V"]}

        def forward(self, tokens, targets):
            x = F.embedding(tokens, self.wte) + self.wpe
            for blk in self.h:
                x = blk(x)
            logits = self.head(self.lnf(x))
            V = logits.shape[-1]
            return F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1)), logits

    TWIN_CLASSES = {"mlp": MLP, "resnet": ResNet, "gpt": GPT}


def build(name, dims=None, seed=0, perturb=False, dtype=None, path=None):
    """The twin of bench/models/<name>.ir (or of `path`, a file of the same
    structure) with `dims` overriding the file's dims. Params and buffers get
    values drawn as the IR's initializers say (init_values). Returns
    (module, IRInfo). Raises if the twin's state names or shapes differ from
    the file's params and buffers."""
    if torch is None:
        raise RuntimeError("twins.build needs torch")
    info = IRInfo(path or model_path(name), dims)
    cfg = gen_models.MODELS[name]
    model = TWIN_CLASSES[cfg["kind"]](cfg, info.dims)
    check_names(model, info)
    load_numpy_state(model, init_values(info, seed, perturb))
    if dtype is not None:
        model.to(dtype)
    return model, info


def check_names(model, info):
    mine = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ir = {name: shape for _, name, _, shape, _ in info.decls}
    if mine != ir:
        only_t = sorted(set(mine) - set(ir))
        only_ir = sorted(set(ir) - set(mine))
        shapes = sorted(k for k in set(mine) & set(ir) if mine[k] != ir[k])
        raise AssertionError(f"twin and {info.path} differ: only in the twin {only_t}, only in the IR {only_ir}, "
                             f"shapes differ {[(k, mine[k], ir[k]) for k in shapes]}")


def load_numpy_state(model, values, strict=True):
    """Copy {IR name: numpy array} into the twin (extra names such as optimizer
    state in a tfuse checkpoint are ignored; missing ones are an error when strict)."""
    sd = model.state_dict()
    missing = [k for k in sd if k not in values]
    if strict and missing:
        raise KeyError(f"no values for {missing}")
    with torch.no_grad():
        for k, t in sd.items():
            if k in values:
                src = torch.from_numpy(np.ascontiguousarray(values[k]))
                if tuple(src.shape) != tuple(t.shape):
                    raise ValueError(f"{k}: shape {tuple(src.shape)}, the twin has {tuple(t.shape)}")
                t.copy_(src.to(t.dtype))


def state_numpy(model):
    return {k: v.detach().cpu().double().numpy() for k, v in model.state_dict().items()}


def random_inputs(model, info, batch_seed=0, device="cpu"):
    """Inputs in the IR's order: floats ~ N(0, 1), integer labels/ids uniform
    in their valid range. Returns (list of tensors, {name: numpy array}); the
    arrays have the IR's dtypes, the float tensors the twin's param dtype."""
    rng = np.random.default_rng(1000 + batch_seed)
    arrays = {}
    for name, dtype, shape in info.inputs:
        if dtype.startswith("f"):
            arrays[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            arrays[name] = rng.integers(0, model.label_bounds[name], shape).astype(np.int64)
    fdt = next(model.parameters()).dtype
    tensors = [torch.from_numpy(arrays[n]).to(device=device, dtype=fdt if arrays[n].dtype.kind == "f" else None)
               for n, _, _ in info.inputs]
    return tensors, arrays


# ---------------------------------------------------------------------------
# The train block as PyTorch: optimizer, schedule, clipping.

def lr_at(info, step):
    """The learning rate of 0-based step `step`, by passes/autodiff.c's formulas."""
    opt_name, oa = info.optimizer()
    sched, sa = info.schedule()
    base = oa.get("lr", 0.001 if opt_name != "sgd" else 0.01)
    s = float(step)
    if sched == "constant":
        return base
    if sched == "step":
        return base * sa.get("gamma", 0.1) ** math.floor(s / sa["step_size"])

    def anneal(x, a, b):
        return a + (b - a) * 0.5 * (1.0 - math.cos(math.pi * x))

    def clamp01(x):
        return min(max(x, 0.0), 1.0)

    if sched == "cosine":
        total, warm, lo = sa["total_steps"], sa.get("warmup_steps", 0.0), sa.get("min_lr", 0.0)
        if warm > 0 and s < warm:
            return (s + 1) * base / warm
        x = clamp01((s - warm) / max(total - warm, 1.0))
        return anneal(x, base, lo)
    if sched == "onecycle":
        mx, total = sa["max_lr"], sa["total_steps"]
        init = mx / sa.get("div_factor", 25.0)
        fin = init / sa.get("final_div_factor", 1e4)
        up = math.floor(sa.get("pct_start", 0.3) * total) - 1
        down = total - 1 - up
        up, down = max(up, 1.0), max(down, 1.0)
        if s <= up:
            return anneal(clamp01(s / up), init, mx)
        return anneal(clamp01((s - up) / down), mx, fin)
    raise ValueError(f"schedule {sched} not known to twins.py")


def make_optimizer(model, info, **torch_kwargs):
    """The train block's optimizer over the twin's params. Extra keyword
    arguments (foreach=..., fused=...) pick PyTorch's implementation only."""
    name, a = info.optimizer()
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=a["lr"], momentum=a.get("momentum", 0.0), nesterov=bool(a.get("nesterov", False)),
                               weight_decay=a.get("weight_decay", 0.0), **torch_kwargs)
    betas = (a.get("beta1", 0.9), a.get("beta2", 0.999))
    if name == "adam":
        return torch.optim.Adam(params, lr=a.get("lr", 1e-3), betas=betas, eps=a.get("eps", 1e-8),
                                weight_decay=a.get("weight_decay", 0.0), **torch_kwargs)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=a.get("lr", 1e-3), betas=betas, eps=a.get("eps", 1e-8),
                                 weight_decay=a.get("weight_decay", 0.01), **torch_kwargs)
    raise ValueError(f"optimizer {name} has no twin here (lamb is not in torch.optim)")


class TrainStep:
    """One training step as tfuse's compiled step does it: forward, loss,
    backward, clip_grad_norm, the optimizer at the schedule's lr for this step.
    `forward` is the (possibly compiled) module to call; `precision` 'bf16' or
    'fp16' runs it under autocast (params stay fp32, as tfuse's amp does);
    fp16 adds a GradScaler starting at 65536 (tfuse's dynamic loss scale).
    `compile_update` compiles the rest of the step too, clipping and the
    optimizer (torch.compile of one function; the learning rate a tensor
    the schedule fills, so a new lr does not recompile), so that with a
    compiled `forward` (whose backward AOTAutograd compiles) the whole step
    is torch.compile's: what a user after speed compiles. Not with fp16's
    GradScaler, whose unscale/step stay eager."""

    def __init__(self, model, info, forward=None, precision="fp32", device="cpu", compile_update=False, **opt_kwargs):
        if int(float(info.train.get("accumulate", "1"))) != 1:
            raise ValueError(f"{info.path}: accumulate > 1 has no twin here")
        self.model, self.info = model, info
        self.forward = model if forward is None else forward
        self.opt = make_optimizer(model, info, **opt_kwargs)
        self.clip = info.clip()
        self.step = 0
        self.device = device
        self.amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device, init_scale=65536.0) if precision == "fp16" else None
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.update = None
        if compile_update and self.scaler is None:
            for g in self.opt.param_groups:
                g["lr"] = torch.tensor(float(g["lr"]), device=device)
            self.update = torch.compile(self._update)

    def _update(self):
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()

    def __call__(self, *inputs):
        for g in self.opt.param_groups:
            if isinstance(g["lr"], torch.Tensor):
                g["lr"].fill_(lr_at(self.info, self.step))
            else:
                g["lr"] = lr_at(self.info, self.step)
        with torch.autocast(self.device, dtype=self.amp, enabled=self.amp is not None):
            loss, _ = self.forward(*inputs)
        if self.update is not None:
            loss.backward()
            self.update()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            return loss
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)
        else:
            loss.backward()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return loss
