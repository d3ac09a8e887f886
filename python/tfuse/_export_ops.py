"""tfuse.export's op handlers for the ops that compute: pointwise ops and
activations, arithmetic and comparisons, linear layers and matmuls,
convolutions and pooling, normalizations, softmax, embedding and dropout,
reductions and einsum, attention, losses. Each registers in the op table
(_OPS, _export_emit.py) under its ATen names; importing this module imports
_export_ops_layout.py as well (views, slices, padding, indexing, in-place
writes), so that the table is then whole."""
import math

import numpy as np

from ._export_emit import _OPS, _Val, _axis, _num, _op, _packet, _shape
from ._export_attention import _Masks, and_terms, check_attention, emit_attention
from ._export_ops_layout import _pad_list


# ---- pointwise ops, activations, arithmetic and comparisons

def _pointwise(op):
    def h(em, a):
        out_dt = em.dt(em.meta_val().dtype)
        v = em.cast(em.val(a["self"]), out_dt)
        return em.emit(op, [v])
    return h


for _n, _t in {"relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid", "exp": "exp", "log": "log", "sqrt": "sqrt",
               "rsqrt": "rsqrt", "neg": "neg", "abs": "abs", "erf": "erf", "sin": "sin", "cos": "cos",
               "silu": "silu", "softplus": "softplus"}.items():
    _OPS[_n] = _pointwise(_t)


def _pw(em, op, operands, hint, like):
    """One pointwise step of a decomposition, shaped and typed like `like`."""
    return em.emit(op, operands, shape=like.shape, dtype=like.dtype, name=f"{em.node.name}.{hint}")


@_op("hardswish", "hardsigmoid", "relu6")
def _hard(em, a):
    """hardsigmoid(x) = clamp(x / 6 + 1/2, 0, 1), hardswish(x) = x * clamp(x + 3, 0, 6) / 6, relu6 =
    clamp(x, 0, 6): maximum/minimum give PyTorch's gradients away from the corners."""
    x = em.cast(em.val(a["self"]), em.dt(em.meta_val().dtype))
    name = _packet(em.node.target)
    if name == "relu6":
        return em.emit("minimum", [_pw(em, "maximum", [x, _num(0.0)], "lo", x), _num(6.0)])
    if name == "hardsigmoid":
        t = _pw(em, "add", [_pw(em, "mul", [x, _num(1 / 6)], "s", x), _num(0.5)], "t", x)
        return em.emit("minimum", [_pw(em, "maximum", [t, _num(0.0)], "lo", x), _num(1.0)])
    c = _pw(em, "minimum", [_pw(em, "maximum", [_pw(em, "add", [x, _num(3.0)], "t", x), _num(0.0)], "lo", x), _num(6.0)], "hi", x)
    return em.emit("mul", [x, _pw(em, "mul", [c, _num(1 / 6)], "gate", x)])


@_op("leaky_relu")
def _leaky_relu(em, a):
    x = em.val(a["self"])
    slope = float(a.get("negative_slope", 0.01))
    pos = em.emit("gt", [x, _num(0.0)], shape=x.shape, dtype="bool", name=em.node.name + ".pos")
    return em.emit("where", [pos, x, _pw(em, "mul", [x, _num(slope)], "neg", x)])


@_op("elu")
def _elu(em, a):
    x = em.val(a["self"])
    alpha, scale, iscale = (float(a.get(k, 1.0)) for k in ("alpha", "scale", "input_scale"))
    pos = em.emit("gt", [x, _num(0.0)], shape=x.shape, dtype="bool", name=em.node.name + ".pos")
    xi = _pw(em, "mul", [x, _num(iscale)], "xi", x) if iscale != 1.0 else x
    neg = _pw(em, "mul", [_pw(em, "sub", [_pw(em, "exp", [xi], "exp", x), _num(1.0)], "em1", x), _num(alpha * scale)],
              "neg", x)
    pos_v = _pw(em, "mul", [x, _num(scale)], "posv", x) if scale != 1.0 else x
    return em.emit("where", [pos, pos_v, neg])


@_op("mish")
def _mish(em, a):
    x = em.val(a["self"])
    return em.emit("mul", [x, _pw(em, "tanh", [_pw(em, "softplus", [x], "sp", x)], "t", x)])


@_op("gelu")
def _gelu(em, a):
    approx = a.get("approximate") or "none"
    return em.emit("gelu", [em.val(a["self"])], {"approx": approx} if approx != "none" else None)


def _binary(op, reverse=False):
    def h(em, a):
        out_dt = em.dt(em.meta_val().dtype)
        x = a["self"]
        y = a.get("other")
        if y is None:
            y = a.get("exponent")
        alpha = a.get("alpha")
        xv, yv = em.val(x), em.val(y)
        if isinstance(yv, _Val) and alpha not in (None, 1):
            yv = em.emit("mul", [yv, _num(alpha)], shape=yv.shape, dtype=yv.dtype, name=yv.name + ".alpha")
        elif alpha not in (None, 1):
            yv = _num(float(yv) * alpha)
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            # compare in the promoted dtype of the operands
            dts = [v.dtype for v in (xv, yv) if isinstance(v, _Val)]
            common = _promote(dts)
            if common == "bool" and len(dts) == 1:
                common = "f32"   # a bool tensor and a number (mask == 0): the IR has no bool literal
            xv, yv = em.cast(xv, common), em.cast(yv, common)
        elif op in ("and", "or"):
            return _logic(em, op, xv, yv)
        else:
            xv, yv = em.cast(xv, out_dt), em.cast(yv, out_dt)
        if reverse:
            xv, yv = yv, xv
        if not isinstance(xv, _Val) and not isinstance(yv, _Val):
            em.fail("an op of two numbers")
        return em.emit(op, [xv, yv])
    return h


def _promote(dts):
    order = ["bool", "i32", "i64", "bf16", "f16", "f32", "f64"]
    return max(dts, key=order.index) if dts else "f32"


def _logic(em, op, x, y):
    # bool and/or as where: and(x, y) = where(x, y, x); or(x, y) = where(x, x, y) (x is the false / true
    # there, so no bool literal is needed); broadcast first, as where's operands take one shape
    if not (isinstance(x, _Val) and isinstance(y, _Val)):
        em.fail("a logical op with a number")
    shape = _shape(em.meta_val())
    x, y = em.broadcast(em.cast(x, "bool"), shape), em.broadcast(em.cast(y, "bool"), shape)
    return em.emit("where", [x, y, x]) if op == "and" else em.emit("where", [x, x, y])


for _n, _t in {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "maximum",
               "minimum": "minimum", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
               "__and__": "and", "bitwise_and": "and", "logical_and": "and", "__or__": "or", "bitwise_or": "or",
               "logical_or": "or"}.items():
    _OPS[_n] = _binary(_t)
_OPS["rsub"] = _binary("sub", reverse=True)


@_op("div")
def _div(em, a):
    if a.get("rounding_mode") is not None:
        em.fail(f"rounding_mode={a['rounding_mode']!r} (tfuse's div is true division)")
    return _binary("div")(em, a)


@_op("pow")
def _pow(em, a):
    x, e = a["self"], a["exponent"]
    if isinstance(e, (int, float)) and float(e) == int(e) and 1 <= int(e) <= 4:
        # small integer powers as products: exact for negative bases
        v = em.cast(em.val(x), em.dt(em.meta_val().dtype))
        r = v
        for i in range(int(e) - 1):
            r = em.emit("mul", [r, v], name=f"{em.node.name}.p{i}") if i < int(e) - 2 else em.emit("mul", [r, v])
        return r
    if isinstance(e, (int, float)) and float(e) == 0.5:
        return em.emit("sqrt", [em.val(x)])
    return _binary("pow")(em, a)


@_op("clamp", "clamp_min", "clamp_max", "hardtanh")
def _clamp(em, a):
    v = em.val(a["self"])
    lo = a.get("min", a.get("min_val"))
    hi = a.get("max", a.get("max_val"))
    for bound, op in ((lo, "maximum"), (hi, "minimum")):
        if bound is not None:
            b = em.val(bound)
            v = em.emit(op, [v, em.cast(b, v.dtype)], shape=v.shape, dtype=v.dtype, name=f"{em.node.name}.{op}")
    return v


@_op("copy")
def _copy(em, a):
    dst = em.val(a["self"])
    return em.broadcast(em.cast(em.val(a["src"]), dst.dtype), dst.shape)


@_op("where")
def _where(em, a):
    out_dt = em.dt(em.meta_val().dtype)
    c = em.cast(em.val(a["condition"]), "bool")
    x, y = em.cast(em.val(a["self"]), out_dt), em.cast(em.val(a["other"]), out_dt)
    return em.emit("where", [c, x, y])


@_op("masked_fill")
def _masked_fill(em, a):
    v = em.val(a["self"])
    m = em.cast(em.val(a["mask"]), "bool")
    return em.emit("where", [m, em.cast(em.val(a["value"]), v.dtype), v])


@_op("logical_not", "bitwise_not")
def _not(em, a):
    v = em.val(a["self"])
    if v.dtype != "bool":
        em.fail("bitwise_not of an integer tensor")
    return em.emit("eq", [em.cast(v, "f32"), _num(0.0)])   # (eq takes no bool literal: 0 is a number)


# ---- linear layers, matmuls, convolution

@_op("linear")
def _linear(em, a):
    x, w, b = a["input"], a["weight"], a.get("bias")
    xv = em.val(x)
    wv = em.linear_weight(w)
    if wv is not None:
        return em.emit("linear", [xv, wv] + ([em.val(b)] if b is not None else []))
    h = em.emit("matmul", [xv, em.val(w)], {"transpose_b": True}, name=em.node.name + ".mm") if b is not None \
        else em.emit("matmul", [xv, em.val(w)], {"transpose_b": True})
    return em.emit("add", [h, em.val(b)]) if b is not None else h


@_op("addmm")
def _addmm(em, a):
    if a.get("beta", 1) != 1 or a.get("alpha", 1) != 1:
        em.fail("addmm with beta or alpha other than 1")
    m1, m2, bias = a["mat1"], a["mat2"], a["self"]
    wv = em.linear_weight_t(m2)
    if wv is not None:
        return em.emit("linear", [em.val(m1), wv, em.val(bias)])
    h = em.emit("matmul", [em.val(m1), em.val(m2)], name=em.node.name + ".mm")
    return em.emit("add", [h, em.val(bias)])


@_op("mm", "bmm", "matmul")
def _matmul(em, a):
    x, other = em.val(a["self"]), a.get("mat2", a.get("other"))
    wv = em.linear_weight_t(other)
    if wv is not None and len(x.shape) >= 2:
        return em.emit("linear", [x, wv])
    y = em.val(other)
    if len(x.shape) < 2 or len(y.shape) < 2:
        em.fail("matmul of a vector (rank 1): tfuse's matmul takes rank >= 2")
    return em.emit("matmul", [x, y])


@_op("conv1d", "conv2d", "convolution", "conv_transpose1d", "conv_transpose2d")
def _conv(em, a):
    """conv2d; a 1-d convolution as a 2-d one of height 1; a transposed
    convolution as conv2d_grad_input (the gradient of a conv2d with respect to
    its input is the transposed convolution)."""
    x, w, b = em.val(a["input"]), em.val(a["weight"]), a.get("bias")
    name = _packet(em.node.target)
    transposed = bool(a.get("transposed")) or name.startswith("conv_transpose")
    rank = len(x.shape)
    if rank not in (3, 4):
        em.fail(f"a {rank - 2}-d convolution (tfuse has 1-d and 2-d convolutions)")
    out = _shape(em.meta_val())
    one_d = rank == 3
    base = em.node.name
    if one_d:
        x = em.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
        w = em.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
    k = list(w.shape[2:])

    def pair(key, dflt):
        v = a.get(key)
        v = [dflt] if v is None else [int(t) for t in v] if isinstance(v, (list, tuple)) else [int(v)]
        v = v * (1 if one_d else 2) if len(v) == 1 else v
        return [dflt] + v if one_d else v
    stride, dil = pair("stride", 1), pair("dilation", 1)
    pad = a.get("padding")
    if isinstance(pad, str):   # 'valid' or 'same' (stride 1): PyTorch puts an odd total's extra on the right
        if pad == "valid":
            pad = [0, 0]
        else:
            tot = [d * (kk - 1) for d, kk in zip(dil, k)]
            if any(t % 2 for t in tot):
                x = _pad_list(em, x, [tot[1] // 2, tot[1] - tot[1] // 2, tot[0] // 2, tot[0] - tot[0] // 2],
                              "constant", 0.0, "same")
                pad = [0, 0]
            else:
                pad = [t // 2 for t in tot]
    else:
        pad = pair("padding", 0)
    groups = int(a.get("groups", 1))
    attrs = {}
    for key, v, d in (("stride", stride, 1), ("padding", pad, 0), ("dilation", dil, 1)):
        if any(t != d for t in v):
            attrs[key] = v if v[0] != v[1] else [v[0]]
    if groups != 1:
        attrs["groups"] = groups
    if transposed:
        shape = (out[0], out[1], 1, out[2]) if one_d else out
        attrs["shape"] = list(shape)
        r = em.emit("conv2d_grad_input", [x, w], attrs, shape=shape, dtype=x.dtype,
                    name=base + (".t" if b is not None or one_d else ""))
        if b is not None:
            bv = em.reshape(em.val(b), (shape[1], 1, 1))
            r = em.emit("add", [r, bv], shape=shape, dtype=x.dtype, name=base + (".b" if one_d else ""))
    else:
        if any(int(t) for t in (a.get("output_padding") or [])):
            em.fail("output_padding without transposed=True")
        ops = [x, w] + ([em.val(b)] if b is not None else [])
        r = em.emit("conv2d", ops, attrs, shape=(out[0], out[1], 1, out[2]) if one_d else out, dtype=x.dtype,
                    name=base + ".2d" if one_d else None)
    return em.reshape(r, out) if one_d else r


# ---- normalizations, softmax, embedding, dropout

@_op("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm")
def _batch_norm(em, a):
    x = em.val(a["input"])
    g, b, rm, rv = a["weight"], a["bias"], a["running_mean"], a["running_var"]
    if rm is None or rv is None:
        em.fail("batch_norm without running statistics (track_running_stats=False)")
    C = x.shape[1]
    g = em.val(g) if g is not None else em.const_val(em.torch.ones(C))
    b = em.val(b) if b is not None else em.const_val(em.torch.zeros(C))
    mom = a.get("momentum")
    attrs = {}
    if mom is not None and abs(float(mom) - 0.1) > 0:
        attrs["momentum"] = float(mom)
    if abs(float(a["eps"]) - 1e-5) > 0:
        attrs["eps"] = float(a["eps"])
    em.bn_buffers.update([a["running_mean"], a["running_var"]])
    r = em.emit("batchnorm", [x, g, b, em.val(rm), em.val(rv)], attrs,
                shape=x.shape, dtype=x.dtype)
    if em.node.target._overloadpacket.__name__ != "batch_norm":
        return [r, None, None]
    return r


@_op("layer_norm")
def _layer_norm(em, a):
    x = em.val(a["input"])
    ns = list(a["normalized_shape"])
    if len(ns) != 1:
        em.fail("layer_norm over more than the last axis")
    E = int(ns[0])
    g = em.val(a["weight"]) if a.get("weight") is not None else em.const_val(em.torch.ones(E))
    b = em.val(a["bias"]) if a.get("bias") is not None else em.const_val(em.torch.zeros(E))
    eps = float(a.get("eps", 1e-5))
    return em.emit("layernorm", [x, g, b], {"eps": eps} if eps != 1e-5 else None)


@_op("softmax", "_softmax", "log_softmax", "_log_softmax")
def _softmax(em, a):
    x = em.val(a["self"])
    op = "log_softmax" if "log" in em.node.target._overloadpacket.__name__ else "softmax"
    ax = _axis(a["dim"], len(x.shape))
    r = em.emit(op, [x], {"axis": ax} if ax != len(x.shape) - 1 else None, shape=x.shape, dtype=x.dtype)
    return em.cast(r, em.dt(em.meta_val().dtype))


@_op("embedding")
def _embedding(em, a):
    if a.get("scale_grad_by_freq"):
        em.fail("scale_grad_by_freq=True")
    pad = int(a.get("padding_idx", -1))   # the row that gets no gradient; -1: none
    return em.emit("embedding", [em.val(a["indices"]), em.val(a["weight"])], {"padding_idx": pad} if pad >= 0 else None)


@_op("dropout", "native_dropout", "feature_dropout")
def _dropout(em, a):
    v = em.val(a["input"] if "input" in a else a["self"])   # dropout_ (inplace=True) calls it self
    p = float(a["p"])
    if not a.get("train", True) or p == 0.0:
        return v
    if em.node.target._overloadpacket.__name__ == "feature_dropout":
        em.fail("feature (channel) dropout")
    em.dropouts += 1
    return em.emit("dropout", [v], {"p": p, "salt": em.dropouts})


# ---- pooling: ceil mode and uneven windows as padding and constant rescales

def _ceil_extra(n, k, s, p, d=1):
    """How far ceil_mode's last window reaches past the padded input (PyTorch's
    rule: that window must start inside the input or its left padding)."""
    out = -(-(n + 2 * p - d * (k - 1) - 1) // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (n + 2 * p))


def _two(v):
    v = [int(t) for t in v]
    return v * 2 if len(v) == 1 else v


@_op("max_pool2d", "max_pool2d_with_indices")
def _max_pool(em, a):
    x = em.val(a["self"])
    k = _two(a["kernel_size"])
    s = _two(a.get("stride") or k)
    p = _two(a.get("padding") or [0])
    if any(t != 1 for t in _two(a.get("dilation") or [1])):
        em.fail("a dilated max pool")
    if a.get("ceil_mode"):   # the windows past the edge see -inf there, as PyTorch's do
        eh, ew = _ceil_extra(x.shape[2], k[0], s[0], p[0]), _ceil_extra(x.shape[3], k[1], s[1], p[1])
        x = _pad_list(em, x, [0, ew, 0, eh], "constant", float("-inf"), "ceil")
    indices = _packet(em.node.target).endswith("indices")
    r = em.emit("maxpool2d", [x], _pool_attrs(k, s, p), shape=_shape(em.meta_val()[0] if indices else em.meta_val()),
                dtype=x.dtype)
    return [r, None] if indices else r


def _pool_attrs(k, s, p):
    k, s, p = _two(k), _two(s), _two(p)
    attrs = {"kernel": k if k[0] != k[1] else [k[0]]}
    if s != k:
        attrs["stride"] = s if s[0] != s[1] else [s[0]]
    if any(p):
        attrs["padding"] = p if p[0] != p[1] else [p[0]]
    return attrs


def _avg_divisors(n, k, s, p, out, include_pad):
    """PyTorch's avg_pool divisor of each output position along one axis: the
    window clipped to the padded input, or to the input itself."""
    ds = []
    for i in range(out):
        start = i * s - p
        end = min(start + k, n + p)
        ds.append(end - start if include_pad else min(end, n) - max(start, 0))
    return ds


@_op("avg_pool2d")
def _avg_pool(em, a):
    """tfuse's avgpool2d divides by the whole window, padding included; where
    PyTorch divides by less (ceil_mode's clipped windows, count_include_pad=False)
    or by divisor_override, the result is rescaled by a constant [OH, OW]."""
    x0 = em.val(a["self"])
    k, p = _two(a["kernel_size"]), _two(a.get("padding") or [0])
    s = _two(a.get("stride") or k)
    out = _shape(em.meta_val())
    x = x0
    if a.get("ceil_mode"):
        eh, ew = _ceil_extra(x.shape[2], k[0], s[0], p[0]), _ceil_extra(x.shape[3], k[1], s[1], p[1])
        x = _pad_list(em, x, [0, ew, 0, eh], "constant", 0.0, "ceil")
    dov = a.get("divisor_override")
    inc = bool(a.get("count_include_pad", True))
    div = np.outer(_avg_divisors(x0.shape[2], k[0], s[0], p[0], out[2], inc),
                   _avg_divisors(x0.shape[3], k[1], s[1], p[1], out[3], inc)).astype(np.float64)
    scale = (k[0] * k[1]) / (np.full_like(div, float(dov)) if dov else div)
    if np.all(scale == 1.0):
        return em.emit("avgpool2d", [x], _pool_attrs(k, s, p), shape=out, dtype=x.dtype)
    r = em.emit("avgpool2d", [x], _pool_attrs(k, s, p), shape=out, dtype=x.dtype, name=em.node.name + ".full")
    c = em.cast(em.const_val(em.torch.tensor(scale, dtype=em.torch.float32), hint=em.node.name + ".scale"), x.dtype)
    return em.emit("mul", [r, c])


@_op("adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_avg_pool1d")
def _adaptive_avg(em, a):
    x = em.val(a["self"])
    if _packet(em.node.target) == "adaptive_avg_pool1d":   # [N, C, L] as [N, C, 1, L]
        lead = x.shape[:-1] if len(x.shape) == 3 else (1,) + x.shape[:-1]
        x4 = em.reshape(x, lead + (1, x.shape[-1]))
        r = _adaptive_avg_2d(em, x4, 1, int(a["output_size"][0]), em.node.name + ".2d")
        return em.reshape(r, _shape(em.meta_val()))
    oh, ow = [int(t) for t in a["output_size"]] * (2 if len(a["output_size"]) == 1 else 1)
    return _adaptive_avg_2d(em, x, oh, ow, None)


def _adaptive_avg_2d(em, x, oh, ow, name):
    N, C, H, W = x.shape
    if (oh, ow) == (1, 1):
        g = em.emit("global_avgpool", [x], shape=(N, C), dtype=x.dtype, name=em.node.name + ".g")
        return em.reshape(g, (N, C, 1, 1))
    if H % oh == 0 and W % ow == 0:
        return em.emit("avgpool2d", [x], _pool_attrs([H // oh, W // ow], [H // oh, W // ow], [0]),
                       shape=(N, C, oh, ow), dtype=x.dtype, name=name)
    # windows of different sizes (from floor(i n / o) to ceil((i + 1) n / o)): an averaging matrix per axis
    torch = em.torch

    def avg(n, o, hint):
        m = torch.zeros(n, o, dtype=torch.float32)
        for i in range(o):
            s0, e0 = (i * n) // o, -(-((i + 1) * n) // o)
            m[s0:e0, i] = 1.0 / (e0 - s0)
        return em.cast(em.const_val(m, hint=f"{em.node.name}.{hint}"), x.dtype)
    base = em.node.name
    t = em.emit("matmul", [x, avg(W, ow, "avg_w")], shape=(N, C, H, ow), dtype=x.dtype, name=base + ".w")
    t = em.emit("transpose", [t], {"perm": [0, 1, 3, 2]}, shape=(N, C, ow, H), dtype=x.dtype, name=base + ".wt")
    t = em.emit("matmul", [t, avg(H, oh, "avg_h")], shape=(N, C, ow, oh), dtype=x.dtype, name=base + ".h")
    return em.emit("transpose", [t], {"perm": [0, 1, 3, 2]}, shape=(N, C, oh, ow), dtype=x.dtype, name=name)


# ---- products, norms, einsum, reductions

@_op("baddbmm", "addbmm")
def _baddbmm(em, a):
    """beta * self + alpha * (batch1 @ batch2) (addbmm: the products summed over the batch)."""
    s, b1, b2 = em.val(a["self"]), em.val(a["batch1"]), em.val(a["batch2"])
    beta, alpha = a.get("beta", 1), a.get("alpha", 1)
    base = em.node.name
    mm_shape = b1.shape[:-1] + (b2.shape[-1],)
    p = em.emit("matmul", [b1, b2], shape=mm_shape, dtype=b1.dtype, name=base + ".mm")
    if _packet(em.node.target) == "addbmm":
        p = em.emit("sum", [p], {"axes": [0]}, shape=mm_shape[1:], dtype=b1.dtype, name=base + ".sum")
    if alpha != 1:
        p = em.emit("mul", [p, _num(alpha)], shape=p.shape, dtype=p.dtype, name=base + ".alpha")
    if beta == 0:   # PyTorch ignores self then, NaN included
        return em.broadcast(p, _shape(em.meta_val()))
    if beta != 1:
        s = em.emit("mul", [s, _num(beta)], shape=s.shape, dtype=s.dtype, name=base + ".beta")
    return em.emit("add", [s, p])


@_op("addcmul", "addcdiv")
def _addcmul(em, a):
    out_dt = em.dt(em.meta_val().dtype)
    s, t1, t2 = (em.cast(em.val(a[k]), out_dt) for k in ("self", "tensor1", "tensor2"))
    op = "mul" if _packet(em.node.target) == "addcmul" else "div"
    shape = _shape(em.meta_val())
    p = em.emit(op, [t1, t2], shape=shape, dtype=out_dt, name=em.node.name + ".p")
    value = a.get("value", 1)
    if value != 1:
        p = em.emit("mul", [p, _num(value)], shape=shape, dtype=out_dt, name=em.node.name + ".v")
    return em.emit("add", [s, p])


@_op("linalg_vector_norm", "norm")
def _vector_norm(em, a):
    x = em.val(a.get("self", a.get("input")))
    order = a.get("ord", a.get("p", 2))
    order = 2 if order is None else float(order)
    dims = a.get("dim")
    dims = [] if dims is None else list(dims) if isinstance(dims, (list, tuple)) else [dims]
    axes = [_axis(d, len(x.shape)) for d in dims] or list(range(len(x.shape)))
    keep = bool(a.get("keepdim", False))
    out = _shape(em.meta_val())
    base = em.node.name
    red = {"axes": [] if len(axes) == len(x.shape) else axes}
    if keep:
        red["keepdims"] = True
    if order == 2:
        s = em.emit("sum", [_pw(em, "mul", [x, x], "sq", x)], red, shape=out, dtype=x.dtype, name=base + ".ss")
        return em.emit("sqrt", [s])
    if order == 1:
        return em.emit("sum", [_pw(em, "abs", [x], "abs", x)], red, shape=out, dtype=x.dtype)
    if math.isinf(order) and order > 0:
        return em.emit("max", [_pw(em, "abs", [x], "abs", x)], red, shape=out, dtype=x.dtype)
    em.fail(f"a vector norm of order {order} (tfuse maps 1, 2 and inf)")


@_op("group_norm", "native_group_norm")
def _group_norm(em, a):
    """Each sample's channels in G groups, normalized over a group's channels
    and positions, then scaled and shifted per channel."""
    x = em.val(a["input"])
    G, eps = int(a.get("num_groups", a.get("group"))), float(a.get("eps", 1e-5))
    N, C = x.shape[0], x.shape[1]
    rest = int(np.prod(x.shape[2:])) if len(x.shape) > 2 else 1
    base = em.node.name
    xg = em.reshape(x, (N, G, (C // G) * rest))
    g3 = (N, G, 1)
    mu = em.emit("mean", [xg], {"axes": [2], "keepdims": True}, shape=g3, dtype=x.dtype, name=base + ".mean")
    xc = em.emit("sub", [xg, mu], shape=xg.shape, dtype=x.dtype, name=base + ".centered")
    var = em.emit("mean", [_pw(em, "mul", [xc, xc], "sq", xc)], {"axes": [2], "keepdims": True}, shape=g3,
                  dtype=x.dtype, name=base + ".var")
    inv = em.emit("rsqrt", [em.emit("add", [var, _num(eps)], shape=g3, dtype=x.dtype, name=base + ".var_eps")],
                  shape=g3, dtype=x.dtype, name=base + ".inv_std")
    y = em.reshape(em.emit("mul", [xc, inv], shape=xg.shape, dtype=x.dtype, name=base + ".normed"), x.shape)
    cshape = (C,) + (1,) * (len(x.shape) - 2)
    w, b = a.get("weight"), a.get("bias")
    if w is not None:
        y = em.emit("mul", [y, em.reshape(em.val(w), cshape)], shape=x.shape, dtype=x.dtype,
                    name=base + (".scaled" if b is not None else ""))
    if b is not None:
        y = em.emit("add", [y, em.reshape(em.val(b), cshape)], shape=x.shape, dtype=x.dtype)
    if _packet(em.node.target) == "native_group_norm":
        return [y, None, None]
    return y


@_op("einsum")
def _einsum(em, a):
    """One or two operands, each letter once per operand (no diagonals):
    letters of one operand missing from the output are summed first; the
    rest is a batched matmul over [shared-kept, left-only, contracted] x
    [shared-kept, contracted, right-only], transposed to the output's order."""
    eq = a["equation"].replace(" ", "")
    ops = [em.val(t) for t in a["tensors"]]
    if "..." in eq or "->" not in eq:
        em.fail(f"einsum {eq!r}: write it with '->' and without '...'")
    lhs, out = eq.split("->")
    ins = lhs.split(",")
    if len(ins) != len(ops) or len(ops) > 2 or any(len(set(s)) != len(s) for s in ins + [out]):
        em.fail(f"einsum {eq!r}: tfuse maps one or two operands, each letter once per operand")
    dims = {}
    for s, v in zip(ins, ops):
        if len(s) != len(v.shape):
            em.fail(f"einsum {eq!r}: '{s}' names {len(s)} axes of a rank-{len(v.shape)} operand")
        for c, n in zip(s, v.shape):
            if dims.setdefault(c, n) != n:
                em.fail(f"einsum {eq!r}: axis '{c}' is {dims[c]} and {n}")
    base = em.node.name

    def sum_out(s, v, keep, hint):
        drop = [i for i, c in enumerate(s) if c not in keep]
        if not drop:
            return s, v
        s2 = "".join(c for c in s if c in keep)
        return s2, em.emit("sum", [v], {"axes": drop}, shape=tuple(dims[c] for c in s2), dtype=v.dtype,
                           name=f"{base}.{hint}")

    def perm(s, v, order, hint):
        p = [s.index(c) for c in order]
        if p == list(range(len(s))):
            return v
        return em.emit("transpose", [v], {"perm": p}, shape=tuple(dims[c] for c in order), dtype=v.dtype,
                       name=f"{base}.{hint}")
    if len(ops) == 1:
        s, v = sum_out(ins[0], ops[0], set(out), "sum")
        return perm(s, v, out, "t") if s != out else em.reshape(v, _shape(em.meta_val()))
    (sa, va), (sb, vb) = sum_out(ins[0], ops[0], set(out) | set(ins[1]), "sa"), \
        sum_out(ins[1], ops[1], set(out) | set(ins[0]), "sb")
    batch = [c for c in sa if c in sb and c in out]
    contract = [c for c in sa if c in sb and c not in out]
    fa = [c for c in sa if c not in sb]
    fb = [c for c in sb if c not in sa]
    size = lambda cs: int(np.prod([dims[c] for c in cs])) if cs else 1   # noqa: E731
    va = em.reshape(perm(sa, va, batch + fa + contract, "ta"), tuple(dims[c] for c in batch) + (size(fa), size(contract)))
    vb = em.reshape(perm(sb, vb, batch + contract + fb, "tb"), tuple(dims[c] for c in batch) + (size(contract), size(fb)))
    mm_shape = tuple(dims[c] for c in batch) + (size(fa), size(fb))
    r = em.emit("matmul", [va, vb], shape=mm_shape, dtype=va.dtype, name=base + ".mm")
    got = batch + fa + fb
    r = em.reshape(r, tuple(dims[c] for c in got))
    if "".join(got) == out:
        return r
    return em.emit("transpose", [r], {"perm": [got.index(c) for c in out]})


@_op("mean", "sum", "amax")
def _reduce(em, a):
    x = em.val(a["self"])
    name = em.node.target._overloadpacket.__name__
    dims = a.get("dim")
    axes = [] if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0) else \
        [_axis(d, len(x.shape)) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
    if len(axes) == len(x.shape):
        axes = []
    out_dt = em.dt(em.meta_val().dtype)
    if name != "amax":
        x = em.cast(x, out_dt)
    attrs = {"axes": axes}
    if a.get("keepdim"):
        attrs["keepdims"] = True
    op = {"mean": "mean", "sum": "sum", "amax": "max"}[name]
    return em.emit(op, [x], attrs)


@_op("var", "std")
def _var(em, a):
    x = em.val(a["self"])
    dims = a.get("dim")
    axes = [_axis(d, len(x.shape)) for d in dims] if dims else list(range(len(x.shape)))
    corr = a.get("correction")
    if corr is None:
        corr = 1 if a.get("unbiased", True) else 0
    n = 1
    for d in axes:
        n *= x.shape[d]
    base = em.node.name
    m = em.emit("mean", [x], {"axes": axes, "keepdims": True}, shape=tuple(1 if i in axes else s for i, s in
                enumerate(x.shape)), dtype=x.dtype, name=base + ".mean")
    d = em.emit("sub", [x, m], shape=x.shape, dtype=x.dtype, name=base + ".d")
    d2 = em.emit("mul", [d, d], shape=x.shape, dtype=x.dtype, name=base + ".d2")
    out_shape = _shape(em.meta_val())
    s = em.emit("sum", [d2], {"axes": axes, "keepdims": bool(a.get("keepdim"))}, shape=out_shape, dtype=x.dtype,
                name=base + ".ss")
    v = em.emit("div", [s, _num(float(n - float(corr)))], shape=out_shape, dtype=x.dtype,
                name=base + ".var" if em.node.target._overloadpacket.__name__ == "std" else None)
    return em.emit("sqrt", [v]) if em.node.target._overloadpacket.__name__ == "std" else v


# ---- attention and losses

@_op("scaled_dot_product_attention")
def _sdpa(em, a):
    """Every argument onto `attention` (_export_attention.py): attn_mask (bool: true attends; float: added to
    the scores; any shape broadcasting to [..., L, S]; a constant equal to the causal mask becomes
    causal=true, one of all true or all zeros goes), is_causal (a mask as well is allowed), scale (written
    when given: the op's own default is 1/sqrt(E)), dropout_p (the next dropout salt), enable_gqa (k and v
    with fewer heads, as they come). q of rank 3 or above 4: its leading axes but the last become B, the
    last H; of rank 2, [1, 1, L, E]."""
    key, value = em.attention_kv.get(em.node, (a["key"], a["value"]))   # HF's repeat_kv taken off
    q, k, v = em.val(a["query"]), em.val(key), em.val(value)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, _Val) or len(t.shape) < 2:
            em.fail(f"scaled_dot_product_attention's {name} must be a tensor of rank >= 2 ([..., L, E])")
    p = float(a.get("dropout_p") or 0.0)
    why = check_attention(q.shape, k.shape, v.shape, p)
    if why:
        em.fail(why)
    full = q.shape[:-2] + (q.shape[-2], k.shape[-2])
    masks = _Masks(em, full, q.dtype, em.node.name)
    masks.causal = bool(a.get("is_causal"))
    mask = a.get("attn_mask")
    if mask is not None:
        torch = em.torch
        shape = _shape(em.meta_val(mask))
        if not masks.ok(shape):
            em.fail(f"attn_mask {list(shape)} does not broadcast to the scores {list(full)}")
        for m in and_terms(em, mask, full) or [mask]:   # HF's causal & padding: causal=true, the padding
            if em.is_const(m):
                t = em.const_of(m)
                (masks.const_bool if t.dtype == torch.bool else masks.const_add)(t)
            else:
                mv = em.val(m)
                (masks.bool_val if mv.dtype == "bool" else masks.add_val)(mv)
    scale = a.get("scale")
    return emit_attention(em, q, k, v, masks, None if scale is None else float(scale), p,
                          out_dtype=em.dt(em.meta_val().dtype))


@_op("cross_entropy_loss")
def _cross_entropy(em, a):
    x, y = em.val(a["self"]), em.val(a["target"])
    if a.get("weight") is not None:
        em.fail("a weighted cross-entropy")
    if float(a.get("label_smoothing", 0.0)) != 0.0:
        em.fail("label_smoothing")
    if y.dtype not in ("i64", "i32"):
        em.fail("cross-entropy with class probabilities (tfuse takes integer labels)")
    red = int(a.get("reduction", 1))   # ATen's enum: 0 none, 1 mean, 2 sum
    if len(x.shape) > 2:   # classes on axis 1 -> last
        perm = [0] + list(range(2, len(x.shape))) + [1]
        x = em.emit("transpose", [x], {"perm": perm}, shape=tuple(x.shape[p] for p in perm), dtype=x.dtype,
                    name=em.node.name + ".t")
    attrs = {}
    ii = int(a.get("ignore_index", -100))
    if ii != -100:
        attrs["ignore_index"] = ii
    if red != 1:
        attrs["reduction"] = "none" if red == 0 else "sum"
    r = em.emit("cross_entropy", [x, y], attrs or None, shape=y.shape if red == 0 else (), dtype="f32")
    return em.cast(r, em.dt(em.meta_val().dtype))


@_op("mse_loss")
def _mse(em, a):
    if int(a.get("reduction", 1)) != 1:
        em.fail("mse_loss with a reduction other than 'mean'")
    return em.emit("mse_loss", [em.val(a["self"]), em.val(a["target"])])
