"""tfuse.export: a PyTorch module as a tfuse model (.ir text + weights).

    ex = tfuse.export(model, (x,))                       # model.eval() first for inference
    ex.text, ex.params                                   # the .ir and {name: NumPy array}
    ex.save("model.ir")                                  # model.ir + model.safetensors beside it
    sess = tfuse.compile(ex, mode="infer").session()     # starts from the exported weights
    out = sess.run(x=x)                                  # {name: array}: the module's flattened outputs, in order

    # training: the loss, the optimizer and its schedule become the train block
    ex = tfuse.export(model, (x,), loss_fn=F.cross_entropy, targets=(y,), optimizer=opt, scheduler=sched)
    sess = tfuse.compile(ex, mode="train").session()
    loss, metrics = sess.train_step(x=x, target=y)
    model.load_state_dict(ex.to_torch(sess.state_dict()))   # tfuse's weights back into the module

How: torch.export.export traces the module to an ATen graph (static shapes,
the example inputs'); each ATen op becomes tfuse ops (the table `_OPS`
below). Parts of the graph that depend on no input, param or buffer (the
position ids and causal masks models build from torch.arange) are computed
here, once, and become constants. An ATen op with no mapping, or a mapping
whose arguments tfuse cannot honour (a weighted loss, a non-causal mask
pattern it cannot express), raises ExportError naming the op and the line
of Python it came from: never a silently different model.

Names and layouts: params and buffers keep the module's state_dict names
(a name that is not a tfuse name, `0.weight` in an nn.Sequential, gets a
leading `_`); a weight used only as nn.Linear's (or F.linear's) weight is
stored transposed, [in, out], tfuse's linear layout. `Exported.layout` lists
each tensor's torch name and whether it is transposed; `to_torch(state)`
and `from_torch(state_dict)` apply that mapping either way, so a tfuse
checkpoint loads into the module and back.
"""
import inspect
import math
import os
import re
import struct
import json
import sys

import numpy as np

from . import Error

__all__ = ["export", "Exported", "ExportError"]

_KEYWORDS = {"module", "dim", "input", "param", "buffer", "output", "update", "train", "region", "yield",
             "inf", "nan", "true", "false"}


class ExportError(Error):
    """An op or argument tfuse has no mapping for. .op is the ATen op
    ("aten.cumsum.default"), .source the Python line it came from
    ("model.py:12: x = x.cumsum(-1)") or None."""

    def __init__(self, message, op=None, source=None):
        text = message
        if op:
            text = f"error: cannot export {op}: {message}"
        if source:
            text += f"\n  from {source}"
        super().__init__(text, "unsupported")
        self.op, self.source = op, source


def _torch():
    try:
        import torch
    except ImportError:
        raise Error("error: tfuse.export needs PyTorch (pip install torch)", "unavailable") from None
    return torch


# ---------------------------------------------------------------------------
# safetensors, in plain NumPy

_ST = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64",
       np.dtype("<i4"): "I32", np.dtype("bool"): "BOOL"}
_ST_BACK = {v: k for k, v in _ST.items()}


def write_safetensors(path, tensors, metadata=None):
    """{name: array} to a safetensors file (written beside, then renamed)."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.asarray(a)
        a = a if a.flags.c_contiguous else np.array(a, order="C")   # (ascontiguousarray makes a 0-d array 1-d)
        if a.dtype not in _ST:
            raise Error(f"error: {name}: dtype {a.dtype} has no safetensors name here", "invalid argument")
        b = a.tobytes()
        header[name] = {"dtype": _ST[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = os.fspath(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    """A safetensors file's {name: array} (F64 F32 F16 I64 I32 BOOL)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + b:8 + n + e], dtype=_ST_BACK[h["dtype"]]).reshape(h["shape"]).copy()
    return out


# ---------------------------------------------------------------------------
# The result

class Exported:
    """An exported module: .text (the .ir), .params ({tfuse name: array},
    params and buffers, in tfuse's layouts), .inputs ({forward argument
    name: tfuse input name}, the same but for `input`, a tfuse keyword),
    .outputs (tfuse output names, in the order of the module's flattened
    outputs; "loss" first when exported with a loss_fn), .layout ({tfuse
    name: (torch state_dict name, transposed)}), .aliases ({torch name:
    tfuse name} for tied weights: one tfuse param, several torch names),
    .dims ({dim name: the example's size} for the sizes exported as tfuse
    dims through dynamic_shapes; tfuse.compile(..., dims={...}) sets them)."""

    def __init__(self, text, params, inputs, outputs, layout, aliases, name, dims=None):
        self.text, self.params, self.inputs, self.outputs = text, params, inputs, outputs
        self.layout, self.aliases, self.name = layout, aliases, name
        self.dims = dict(dims or {})

    def save(self, path):
        """Writes PATH (the .ir) and the weights beside it, PATH with
        .safetensors for .ir; returns the weights' path. `tfuse run PATH
        --params W` and Session.load(W) read them."""
        path = os.fspath(path)
        root = path[:-3] if path.endswith(".ir") else path
        wpath = root + ".safetensors"
        with open(path, "w") as f:
            f.write(self.text)
        write_safetensors(wpath, self.params, {"format": "tfuse", "exported_from": self.name})
        return wpath

    def to_torch(self, state):
        """tfuse state ({tfuse name: array}: Session.state_dict(), or a
        checkpoint's) as the module's state_dict ({torch name: tensor}),
        linear weights transposed back to [out, in], tied names filled in;
        optimizer state ("opt.*", "train.*") is left out."""
        torch = _torch()
        out = {}
        for name, (tname, transposed) in self.layout.items():
            if name not in state:
                continue
            a = np.asarray(state[name])
            if transposed:
                a = a.T
            out[tname] = torch.from_numpy(np.ascontiguousarray(a))
        for tname, name in self.aliases.items():
            if name in state:
                out[tname] = out[self.layout[name][0]]
        return out

    def from_torch(self, state_dict):
        """The module's state_dict as tfuse state ({tfuse name: array}),
        for Session.load_state_dict."""
        back = {tname: (name, tr) for name, (tname, tr) in self.layout.items()}
        out = {}
        for tname, t in state_dict.items():
            if tname not in back:
                continue
            name, tr = back[tname]
            a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
            out[name] = np.ascontiguousarray(a.T if tr else a)
        return out

    def __repr__(self):
        dims = f", dims {self.dims}" if self.dims else ""
        return (f"<tfuse.Exported {self.name}: inputs {list(self.inputs)}, outputs {self.outputs}, "
                f"{len(self.params)} tensors{dims}>")


# ---------------------------------------------------------------------------
# Values and names

class _Val:
    """A tfuse value: its name, shape (tuple of ints) and dtype ('f32', ...)."""
    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype

    def __repr__(self):
        return f"{self.name}:{self.dtype}{list(self.shape)}"


def _dtype_name(torch, dt):
    m = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
         torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}
    return m.get(dt)


_NP_OF = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32,
          "bool": np.bool_}


def _ir_name(s):
    """A torch name as a tfuse name: [A-Za-z_][A-Za-z0-9_.]*, not a keyword."""
    s = re.sub(r"[^A-Za-z0-9_.]", "_", s)
    if not s or not (s[0].isalpha() or s[0] == "_"):
        s = "_" + s
    if s in _KEYWORDS:
        s += "_"
    return s


def _num(x):
    """A Python number as a tfuse operand."""
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = repr(x)
    return r[:-2] if r.endswith(".0") else r


def _source_of(node):
    """'file.py:12: code' for the innermost user frame of node's stack trace."""
    st = node.meta.get("stack_trace") if node is not None else None
    if not st:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', st)
    if not frames:
        return st.strip().splitlines()[-1]
    mine = os.path.abspath(__file__)
    theirs = [fr for fr in frames if os.path.abspath(fr[0]) != mine] or frames
    f, line, code = theirs[-1]
    where = f"{f}:{line}: {code.strip()}"
    if theirs is not frames and frames[-1] is not theirs[-1]:
        where += " (in the loss_fn)"
    return where


# ---------------------------------------------------------------------------
# The translation of one ATen graph

class _Emitter:
    def __init__(self, torch, ep, names_in, train_mode):
        self.torch = torch
        self.ep = ep
        self.lines = []
        self.used = set(_KEYWORDS)
        self.env = {}        # fx node -> _Val, list of _Val, or ('const', tensor)
        self.decls = []      # declaration lines (params, buffers, constants)
        self.params = {}     # tfuse name -> np array
        self.layout = {}     # tfuse name -> (torch name, transposed)
        self.consts = 0
        self.node = None
        self.names_in = names_in
        self.train_mode = train_mode
        self.dropouts = 0
        self.transposed = set()   # param nodes stored [in, out]
        self.bn_buffers = set()   # running statistics batchnorm moves itself
        self.views = {}           # fx node -> (its base node, view kind, the node): in-place writes reach the base
        self.origin = {}          # IR line -> the user's source line it came from (for _dynamic's messages)

    # -- naming and emission
    def uniq(self, base):
        base = _ir_name(base)
        name, i = base, 1
        while name in self.used:
            name = f"{base}_{i}"
            i += 1
        self.used.add(name)
        return name

    def fail(self, msg):
        raise ExportError(msg, op=str(self.node.target) if self.node is not None else None,
                          source=_source_of(self.node))

    def emit(self, op, operands, attrs=None, shape=None, dtype=None, name=None):
        """name = op(operands, attrs); returns the _Val. shape/dtype: the
        result's (the torch node's when not given)."""
        if shape is None or dtype is None:
            v = self.meta_val()
            shape = tuple(int(d) for d in v.shape) if shape is None else shape
            dtype = self.dt(v.dtype) if dtype is None else dtype
        if any(isinstance(o, _Val) and o.name is None for o in operands):
            self.fail(f"{op} of an empty tensor (tfuse has no tensors of size 0; only a concat drops them)")
        nm = self.uniq(name or (self.node.name if self.node is not None else op))
        args = [o.name if isinstance(o, _Val) else o for o in operands]
        for k, a in (attrs or {}).items():
            args.append(f"{k}={self._attr(a)}")
        line = f"{nm} = {op}({', '.join(args)})"
        self.lines.append(line)
        self.origin[line] = _source_of(self.node)
        return _Val(nm, shape, dtype)

    @staticmethod
    def _attr(a):
        if isinstance(a, bool):
            return "true" if a else "false"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(str(int(x)) for x in a) + "]"
        if isinstance(a, str):
            return a if a in ("f32", "f16", "bf16", "f64", "i64", "i32", "bool") else f'"{a}"'
        return _num(a)

    def meta_val(self, node=None):
        node = node or self.node
        v = node.meta.get("val")
        if v is None:
            self.fail("the graph gives no type for its result")
        return v

    def dt(self, tdt):
        d = _dtype_name(self.torch, tdt)
        if d is None:
            self.fail(f"dtype {tdt} has no tfuse equivalent (tfuse has f32 f16 bf16 f64 i64 i32 bool)")
        return d

    # -- constants: computed here, declared as buffers when an op needs them as tensors
    def const_val(self, t, hint="const"):
        t = t.detach().contiguous()
        d = self.dt(t.dtype)
        name = self.uniq(f"const.{self.consts}" if hint == "const" else hint)
        self.consts += 1
        shape = tuple(t.shape)
        decl = f"buffer {name} : {d}[{', '.join(str(s) for s in shape)}]"
        self.decls.append(decl)
        self.origin[decl] = _source_of(self.node)
        if d == "bf16":
            self.fail("a bf16 constant cannot be stored (NumPy has no bfloat16)")
        self.params[name] = t.cpu().numpy().astype(_NP_OF[d])
        return _Val(name, shape, d)

    def val(self, a, dtype=None):
        """An operand: a _Val, or a number for a Python scalar / 1-element constant."""
        torch = self.torch
        fx = torch.fx
        if isinstance(a, fx.Node):
            v = self.env[a]
            if isinstance(v, tuple) and v[0] == "const":
                t = v[1]
                if not isinstance(t, torch.Tensor):
                    return _num(t)
                return self.const_val(t)
            if isinstance(v, list):
                self.fail("a tuple result used as a tensor")
            if isinstance(v, tuple):   # ("tparam", p): a linear weight's transpose, read only by mm/addmm
                self.fail("internal: a transposed linear weight used as a tensor")
            return v
        if isinstance(a, (int, float, bool)):
            return _num(a)
        self.fail(f"operand {a!r} is not a tensor or a number")

    def val_of(self, x):
        """val() of an fx node, a number, or a _Val already."""
        return x if isinstance(x, _Val) else self.val(x)

    def is_const(self, a):
        fx = self.torch.fx
        if isinstance(a, fx.Node):
            v = self.env.get(a)
            return isinstance(v, tuple) and v[0] == "const"
        return True

    def const_of(self, a):
        fx = self.torch.fx
        if isinstance(a, fx.Node):
            return self.env[a][1]
        return a

    def cast(self, v, dtype):
        if not isinstance(v, _Val) or v.dtype == dtype:
            return v
        return self.emit("cast", [v], {"to": dtype}, shape=v.shape, dtype=dtype, name=v.name + ".to_" + dtype)

    def reshape(self, v, shape):
        shape = tuple(int(s) for s in shape)
        if v.shape == shape or v.name is None:   # an empty tensor stays one
            return v if v.shape == shape else _Val(None, shape, v.dtype)
        return self.emit("reshape", [v], {"shape": list(shape)}, shape=shape, dtype=v.dtype, name=v.name + ".r")

    def broadcast(self, v, shape):
        shape = tuple(int(s) for s in shape)
        if v.shape == shape:
            return v
        if len(v.shape) < len(shape):
            v = self.reshape(v, (1,) * (len(shape) - len(v.shape)) + v.shape)
            if v.shape == shape:
                return v
        return self.emit("broadcast", [v], {"shape": list(shape)}, shape=shape, dtype=v.dtype, name=v.name + ".b")

    # -- one node
    def bind(self, node):
        """node's arguments by schema name, defaults filled in."""
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            return dict(enumerate(node.args), **node.kwargs)
        out = {}
        for i, a in enumerate(schema.arguments):
            if i < len(node.args) and not a.kwarg_only:
                out[a.name] = node.args[i]
            elif a.name in node.kwargs:
                out[a.name] = node.kwargs[a.name]
            elif a.has_default_value():
                out[a.name] = a.default_value
            else:
                out[a.name] = None
        return out


def _axis(d, rank):
    d = int(d)
    return d + rank if d < 0 else d


def _shape(v):
    return tuple(int(s) for s in v.shape)


# ---- the op table: ATen op (overload packet name) -> handler(em, a) where a
# is the node's arguments by schema name; a handler returns a _Val (or a
# list of them for ops with several results).

_OPS = {}


def _op(*names):
    def reg(f):
        for n in names:
            _OPS[n] = f
        return f
    return reg


def _same(em, x):
    """An op that does not change its operand's values (views, copies)."""
    v = em.val(x)
    return em.reshape(v, _shape(em.meta_val()))


for _n in ("clone", "contiguous", "alias", "detach", "lift_fresh_copy", "view", "_unsafe_view", "reshape",
           "unsqueeze", "squeeze", "flatten", "view_as", "reshape_as", "unflatten", "_reshape_alias"):
    _OPS[_n] = lambda em, a: _same(em, a["self"])


@_op("to", "_to_copy", "type_as")
def _to(em, a):
    v = em.val(a["self"])
    return em.reshape(em.cast(v, em.dt(em.meta_val().dtype)), _shape(em.meta_val()))


@_op("expand", "expand_as", "broadcast_to")
def _expand(em, a):
    return em.broadcast(em.val(a["self"]), _shape(em.meta_val()))


@_op("broadcast_tensors")
def _broadcast_tensors(em, a):
    return [em.broadcast(em.val(t), tuple(int(s) for s in mv.shape))
            for t, mv in zip(a["tensors"], em.meta_val())]


@_op("t", "transpose", "permute", "swapaxes", "movedim")
def _permute(em, a):
    v = em.val(a["self"])
    r = len(v.shape)
    perm = _perm_of(_packet(em.node.target), a, r)
    if perm == list(range(r)):
        return v
    return em.emit("transpose", [v], {"perm": perm})


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
    return em.emit("eq", [v, _num(0.0)])


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


# ---- padding, ceil-mode and uneven pooling, cumsum: decompositions into
# slices, concats and constants, whose gradients tfuse already has

_TORCH_DT = {"f32": "float32", "f16": "float16", "f64": "float64", "i64": "int64", "i32": "int32", "bool": "bool"}


def _fill(em, shape, value, dtype, hint):
    """A tensor of one value: a one-element constant broadcast to `shape`."""
    torch = em.torch
    base = dtype if dtype in _TORCH_DT else "f32"   # bf16: an f32 constant, cast
    c = em.const_val(torch.full((1,) * len(shape), value, dtype=getattr(torch, _TORCH_DT[base])))
    c = em.cast(c, dtype)
    return em.emit("broadcast", [c], {"shape": list(shape)}, shape=tuple(shape), dtype=dtype,
                   name=f"{em.node.name}.{hint}")


def _with(shape, axis, n):
    s = list(shape)
    s[axis] = n
    return tuple(s)


def _pad_axis(em, v, axis, lo, hi, mode, value, hint):
    """v padded on one axis: lo before, hi after (negative: cropped), as
    F.pad's constant, reflect, replicate and circular modes."""
    n = v.shape[axis]
    if lo < 0 or hi < 0:
        v = _slice(em, v, axis, max(0, -lo), n - max(0, -hi), name=f"{em.node.name}.{hint}.crop")
        lo, hi, n = max(lo, 0), max(hi, 0), v.shape[axis]
    if lo == 0 and hi == 0:
        return v
    parts_lo, parts_hi = [], []
    if mode == "constant":
        if lo:
            parts_lo = [_fill(em, _with(v.shape, axis, lo), value, v.dtype, f"{hint}.lo")]
        if hi:
            parts_hi = [_fill(em, _with(v.shape, axis, hi), value, v.dtype, f"{hint}.hi")]
    elif mode == "replicate":
        for k, (side, idx) in enumerate(((lo, 0), (hi, n - 1))):
            if side:
                edge = _slice(em, v, axis, idx, idx + 1, name=f"{em.node.name}.{hint}.edge{k}")
                b = em.emit("broadcast", [edge], {"shape": list(_with(v.shape, axis, side))},
                            shape=_with(v.shape, axis, side), dtype=v.dtype, name=f"{em.node.name}.{hint}.rep{k}")
                (parts_lo if k == 0 else parts_hi).append(b)
    elif mode == "circular":
        if lo > n or hi > n:
            em.fail(f"circular padding of {max(lo, hi)} on an axis of {n}")
        if lo:
            parts_lo = [_slice(em, v, axis, n - lo, n, name=f"{em.node.name}.{hint}.wrap0")]
        if hi:
            parts_hi = [_slice(em, v, axis, 0, hi, name=f"{em.node.name}.{hint}.wrap1")]
    elif mode == "reflect":
        if lo >= n or hi >= n:
            em.fail(f"reflect padding of {max(lo, hi)} on an axis of {n} (PyTorch needs it below the size too)")
        parts_lo = [_slice(em, v, axis, i, i + 1, name=f"{em.node.name}.{hint}.l{i}") for i in range(lo, 0, -1)]
        parts_hi = [_slice(em, v, axis, n - 2 - j, n - 1 - j, name=f"{em.node.name}.{hint}.r{j}") for j in range(hi)]
    else:
        em.fail(f"padding mode {mode!r}")
    return em.emit("concat", parts_lo + [v] + parts_hi, {"axis": axis}, shape=_with(v.shape, axis, n + lo + hi),
                   dtype=v.dtype, name=f"{em.node.name}.{hint}")


def _pad_list(em, v, pads, mode, value, hint="pad"):
    """F.pad's list: (left, right) of the last axis, then of the one before, ..."""
    r = len(v.shape)
    if len(pads) % 2 or len(pads) // 2 > r:
        em.fail(f"a padding list of {len(pads)} numbers for a rank-{r} tensor")
    for i in range(len(pads) // 2):
        v = _pad_axis(em, v, r - 1 - i, int(pads[2 * i]), int(pads[2 * i + 1]), mode, value, f"{hint}{i}")
    return v


@_op("pad", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d",
     "replication_pad2d", "replication_pad3d", "_pad_circular")
def _pad(em, a):
    v = em.val(a.get("self", a.get("input")))
    name = _packet(em.node.target)
    mode = a.get("mode") or ("reflect" if name.startswith("reflection") else "replicate"
                             if name.startswith("replication") else "circular" if name == "_pad_circular"
                             else "constant")
    value = a.get("value")
    r = _pad_list(em, v, list(a.get("pad", a.get("padding"))), mode, 0.0 if value is None else float(value))
    if r.shape != _shape(em.meta_val()):
        em.fail(f"internal: padding gave {r.shape}, PyTorch {_shape(em.meta_val())}")
    return r


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


@_op("cumsum")
def _cumsum(em, a):
    """A scan in log2(n) steps, x plus x shifted by 1, 2, 4, ...: exact for
    integers (RoBERTa's position ids), any dtype."""
    out_dt = em.dt(em.meta_val().dtype)
    v = em.cast(em.val(a["self"]), out_dt)
    if not v.shape:
        return v
    ax = _axis(a["dim"], len(v.shape))
    n, shift, i = v.shape[ax], 1, 0
    while shift < n:
        body = _slice(em, v, ax, 0, n - shift, name=f"{em.node.name}.b{i}")
        head = _fill(em, _with(v.shape, ax, shift), 0, v.dtype, f"z{i}")
        sh = em.emit("concat", [head, body], {"axis": ax}, shape=v.shape, dtype=v.dtype, name=f"{em.node.name}.s{i}")
        last = shift * 2 >= n
        v = em.emit("add", [v, sh], shape=v.shape, dtype=v.dtype, name=None if last else f"{em.node.name}.c{i}")
        shift, i = shift * 2, i + 1
    return v


@_op("zero", "fill")
def _zero_fill(em, a):
    """zero_ / fill_ of a computed tensor: its shape filled with one number."""
    value = 0.0 if _packet(em.node.target).startswith("zero") else a.get("value")
    if not isinstance(value, (int, float, bool)):
        em.fail("fill_ with a tensor value")
    mv = em.meta_val()
    return _fill(em, _shape(mv), value, em.dt(mv.dtype), "fill")


@_op("roll")
def _roll(em, a):
    v = em.val(a["self"])
    shifts, dims = list(a["shifts"]), list(a.get("dims") or [])
    if not dims:   # flattened, rolled, shaped back
        flat = em.reshape(v, (int(np.prod(v.shape)),))
        return em.reshape(_roll_axis(em, flat, 0, int(shifts[0]), "r"), v.shape)
    for i, (s, d) in enumerate(zip(shifts, dims)):
        v = _roll_axis(em, v, _axis(d, len(v.shape)), int(s), f"r{i}")
    return v


def _roll_axis(em, v, ax, shift, hint):
    n = v.shape[ax]
    shift %= n
    if shift == 0:
        return v
    tail = _slice(em, v, ax, n - shift, n, name=f"{em.node.name}.{hint}.tail")
    head = _slice(em, v, ax, 0, n - shift, name=f"{em.node.name}.{hint}.head")
    return em.emit("concat", [tail, head], {"axis": ax}, shape=v.shape, dtype=v.dtype, name=f"{em.node.name}.{hint}")


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


@_op("cat", "concat")
def _cat(em, a):
    vs = [em.val(t) for t in a["tensors"]]
    vs = [v for v in vs if 0 not in v.shape]
    dt = em.dt(em.meta_val().dtype)
    vs = [em.cast(v, dt) for v in vs]
    if len(vs) == 1:
        return vs[0]
    ax = _axis(a["dim"], len(em.meta_val().shape))
    return em.emit("concat", vs, {"axis": ax})


def _slice(em, v, axis, start, end, step=1, name=None):
    n = v.shape[axis]
    start, end, _ = slice(start, end, step).indices(n)
    if start == 0 and end == n and step == 1:
        return v
    size = max(0, (end - start + step - 1) // step)
    if size == 0:   # only a concat may take it (Phi-3's rotary split with nothing left over); emit() refuses others
        return _Val(None, _with(v.shape, axis, 0), v.dtype)
    shape = list(v.shape)
    shape[axis] = size
    attrs = {"axis": axis, "start": start, "end": end}
    if step != 1:
        attrs["step"] = step
    return em.emit("slice", [v], attrs, shape=tuple(shape), dtype=v.dtype, name=name)


@_op("slice")
def _slice_op(em, a):
    v = em.val(a["self"])
    ax = _axis(a.get("dim", 0), len(v.shape))
    start = a.get("start")
    end = a.get("end")
    return _slice(em, v, ax, 0 if start is None else int(start), v.shape[ax] if end is None else
                  min(int(end), v.shape[ax]), int(a.get("step", 1)))


@_op("select")
def _select(em, a):
    v = em.val(a["self"])
    ax = _axis(a["dim"], len(v.shape))
    i = int(a["index"]) % v.shape[ax]
    s = _slice(em, v, ax, i, i + 1, name=em.node.name + ".s")
    return em.reshape(s, _shape(em.meta_val()))


@_op("split", "split_with_sizes", "chunk", "unbind", "tensor_split")
def _split(em, a):
    v = em.val(a["self"])
    ax = _axis(a.get("dim", 0), len(v.shape))
    outs = em.meta_val()
    res, start = [], 0
    for i, o in enumerate(outs):
        size = int(o.shape[ax]) if len(o.shape) == len(v.shape) else 1
        s = _slice(em, v, ax, start, start + size, name=f"{em.node.name}.{i}")
        res.append(em.reshape(s, tuple(int(t) for t in o.shape)))
        start += size
    return res


@_op("index")
def _index(em, a):
    idx = list(a["indices"])
    return _index_many(em, em.val(a["self"]), idx, [i for i, t in enumerate(idx) if t is not None])


_OUT_OF_ANY_TABLE = 2 ** 52   # past any table's rows (a tensor has at most 2^48 elements), plus any other part's


def _flat_index(em, parts, shape, rows, hint):
    """sum_j idx_j * stride_j over index operands broadcast to `shape`, an i64
    tensor of row numbers into a table of `rows` rows. parts: (index, size,
    stride), the index a torch tensor (known now) or a _Val. Negative indices
    count from the end, as in PyTorch. One out of [-size, size) is refused
    now when known, and otherwise sends the sum past any table
    (_OUT_OF_ANY_TABLE, not `rows`: a number that does not move with a
    dynamic dim), so that gather stops with its range error instead of
    reading a neighbouring row."""
    torch = em.torch
    known = [(i.to(torch.int64), n, st) for i, n, st in parts if not isinstance(i, _Val)]
    for i, n, _ in known:
        if i.numel() and (int(i.min()) < -n or int(i.max()) >= n):
            em.fail(f"an index out of range for an axis of {n}: {int(i.min())} .. {int(i.max())}")
    acc, rest = None, []
    for k, (i, n, st) in enumerate(known):
        c = (i % n) * st
        ax = _arange_axis(torch, c, st)
        if ax is None:
            rest.append(c)
            continue
        # an arange along one axis (a batch or position counter, as HF's masks index with): an iota, so that its
        # length can be a dim (dynamic_shapes) rather than a constant of the example's size
        cs = tuple(int(d) for d in c.shape)
        iv = em.emit("iota", [], {"shape": list(cs), "axis": ax}, shape=cs, dtype="i64", name=f"{em.node.name}.{hint}.iota{k}")
        if st != 1:
            iv = em.emit("mul", [iv, str(st)], shape=cs, dtype="i64", name=iv.name + ".s")
        iv = em.broadcast(iv, tuple(shape))
        acc = iv if acc is None else em.emit("add", [acc, iv], shape=tuple(shape), dtype="i64", name=iv.name + ".sum")
    if rest:
        rs = tuple(torch.broadcast_shapes(*[r.shape for r in rest]))
        c = em.broadcast(em.const_val(sum(r.expand(rs) for r in rest).contiguous(), hint=f"{em.node.name}.{hint}"),
                         tuple(shape))
        acc = c if acc is None else em.emit("add", [acc, c], shape=tuple(shape), dtype="i64", name=c.name + ".sum")
    for k, (iv, n, st) in enumerate(p for p in parts if isinstance(p[0], _Val)):
        iv = em.cast(iv, "i64")
        nm = f"{em.node.name}.{hint}.{k}"
        neg = em.emit("lt", [iv, "0"], shape=iv.shape, dtype="bool", name=nm + ".neg")
        iv = em.emit("where", [neg, em.emit("add", [iv, str(n)], shape=iv.shape, dtype="i64", name=nm + ".wrap"), iv],
                     shape=iv.shape, dtype="i64", name=nm + ".i")
        low = em.emit("lt", [iv, "0"], shape=iv.shape, dtype="bool", name=nm + ".low")
        high = em.emit("ge", [iv, str(n)], shape=iv.shape, dtype="bool", name=nm + ".high")
        bad = em.emit("where", [low, low, high], shape=iv.shape, dtype="bool", name=nm + ".bad")
        if st != 1:
            iv = em.emit("mul", [iv, str(st)], shape=iv.shape, dtype="i64", name=nm + ".s")
        iv = em.broadcast(em.emit("where", [bad, str(_OUT_OF_ANY_TABLE), iv], shape=iv.shape, dtype="i64", name=nm + ".row"),
                          shape)
        acc = iv if acc is None else em.emit("add", [acc, iv], shape=tuple(shape), dtype="i64", name=nm + ".sum")
    return acc


def _arange_axis(torch, c, step):
    """The axis along which c (an integer tensor) is arange(len) * step,
    every other axis of size 1; None if it is not such a counter."""
    big = [k for k, d in enumerate(c.shape) if d != 1]
    if len(big) != 1 or c.shape[big[0]] < 2:
        return None
    return big[0] if torch.equal(c.reshape(-1), torch.arange(c.shape[big[0]], dtype=c.dtype) * step) else None


def _index_many(em, v, idx, used):
    """x[i, j, ...] with one or more index tensors (HF's mask building: a
    batch arange against a position arange): the indexed axes brought to the
    front and flattened, one gather with the combined flat index, and the
    result's axes where PyTorch puts them (in place of adjacent indexed
    axes, else first)."""
    torch = em.torch
    ops = []
    for k in used:
        t = idx[k]
        if em.is_const(t):
            c = em.const_of(t)
            if c.dtype == torch.bool:
                em.fail("indexing with a boolean mask (the result's size depends on the data)")
            ops.append(c)
        else:
            iv = em.val(t)
            if iv.dtype == "bool":
                em.fail("indexing with a boolean mask (the result's size depends on the data)")
            ops.append(iv)
    shapes = [tuple(o.shape) for o in ops]
    B = tuple(torch.broadcast_shapes(*shapes))
    rest = [i for i in range(len(v.shape)) if i not in used]
    perm = used + rest
    base = em.node.name
    if perm != list(range(len(v.shape))):
        v = em.emit("transpose", [v], {"perm": perm}, shape=tuple(v.shape[p] for p in perm), dtype=v.dtype,
                    name=base + ".t")
    usizes = [v.shape[i] for i in range(len(used))]
    rsizes = list(v.shape[len(used):])
    nu, nr = int(np.prod(usizes)), int(np.prod(rsizes)) if rsizes else 1
    table = em.reshape(v, (nu, nr))
    strides = [int(np.prod(usizes[j + 1:])) for j in range(len(used))]
    flat = _flat_index(em, list(zip(ops, usizes, strides)), B, nu, "flat")
    g = em.emit("gather", [flat, table], shape=B + (nr,), dtype=v.dtype, name=base + ".g")
    g = em.reshape(g, B + tuple(rsizes))
    adjacent = used == list(range(used[0], used[-1] + 1))
    if adjacent and used[0] > 0:   # the axes before the indexed ones come first again
        nb, before = len(B), used[0]
        p = list(range(nb, nb + before)) + list(range(nb)) + list(range(nb + before, len(g.shape)))
        g = em.emit("transpose", [g], {"perm": p}, shape=tuple(g.shape[q] for q in p), dtype=g.dtype,
                    name=base + ".back")
    return em.reshape(g, _shape(em.meta_val()))


@_op("gather")
def _torch_gather(em, a):
    """torch.gather(x, dim, index): out[..., j, ...] = x[..., index[..., j, ...], ...] along dim: one gather over x
    flattened, the index's own position on every other axis an arange of the flat index."""
    torch = em.torch
    x = em.val(a["self"])
    ax = _axis(a["dim"], len(x.shape))
    index = em.const_of(a["index"]) if em.is_const(a["index"]) else em.val(a["index"])
    ishape = tuple(int(s) for s in index.shape)
    if len(ishape) != len(x.shape):
        em.fail("gather with an index of another rank than its input")
    strides = [int(np.prod(x.shape[k + 1:])) for k in range(len(x.shape))]
    parts = [(index, x.shape[ax], strides[ax])]
    for k in range(len(x.shape)):
        if k != ax:
            shp = [1] * len(ishape)
            shp[k] = ishape[k]
            parts.append((torch.arange(ishape[k]).reshape(shp), x.shape[k], strides[k]))
    rows = int(np.prod(x.shape))
    flat = _flat_index(em, parts, ishape, rows, "flat")
    g = em.emit("gather", [flat, em.reshape(x, (rows, 1))], shape=ishape + (1,), dtype=x.dtype, name=em.node.name + ".g")
    return em.reshape(g, _shape(em.meta_val()))


@_op("scaled_dot_product_attention")
def _sdpa(em, a):
    q, k, v = em.val(a["query"]), em.val(a["key"]), em.val(a["value"])
    if len(q.shape) != 4:
        em.fail("attention on rank-%d tensors (tfuse's is [B, H, T, D])" % len(q.shape))
    if a.get("enable_gqa"):
        em.fail("enable_gqa=True")
    D = q.shape[-1]
    T, S = q.shape[2], k.shape[2]
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    causal = bool(a.get("is_causal"))
    mask = a.get("attn_mask")
    p = float(a.get("dropout_p", 0.0))
    torch = em.torch
    if mask is not None and em.is_const(mask):
        m = em.const_of(mask)
        tri = torch.ones(T, S, dtype=torch.bool).tril()
        if m.dtype == torch.bool:
            mb = m
        else:
            mb = m == 0 if bool(((m == 0) | (m == float("-inf")) | (m < -1e30)).all()) else None
        if mb is not None:
            mb = mb.expand(*mb.shape[:-2], T, S) if mb.dim() >= 2 else None
        if mb is not None and bool((mb == tri).all()):
            mask, causal = None, causal or True
        elif mb is not None and bool(mb.all()):
            mask = None
    if mask is None and p == 0.0:
        if abs(scale * math.sqrt(D) - 1.0) > 1e-12:
            q = em.emit("mul", [q, _num(scale * math.sqrt(D))], shape=q.shape, dtype=q.dtype,
                        name=em.node.name + ".qs")
        return em.emit("attention", [q, k, v], {"causal": True} if causal else None)
    # the attention written out: scores, mask, softmax, (dropout), values
    base = em.node.name
    s = em.emit("matmul", [q, k], {"transpose_b": True}, shape=q.shape[:-1] + (S,), dtype=q.dtype, name=base + ".s")
    s = em.emit("mul", [s, _num(scale)], shape=s.shape, dtype=s.dtype, name=base + ".ss")
    if causal:
        em.fail("is_causal=True together with attn_mask")
    if mask is not None:
        mv = em.val(mask)
        if mv.dtype == "bool":
            s = em.emit("where", [mv, s, "-inf"], shape=s.shape, dtype=s.dtype, name=base + ".m")
        else:
            s = em.emit("add", [s, em.cast(mv, s.dtype)], shape=s.shape, dtype=s.dtype, name=base + ".m")
    pr = em.emit("softmax", [s], shape=s.shape, dtype=s.dtype, name=base + ".p")
    if p > 0.0:
        em.dropouts += 1
        pr = em.emit("dropout", [pr], {"p": p, "salt": em.dropouts}, shape=s.shape, dtype=s.dtype,
                     name=base + ".pd")
    return em.emit("matmul", [pr, v])


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


# ---------------------------------------------------------------------------
# In-place writes through views: x[..., 1:] = y is copy_(slice(x), y), and
# x must change too (transformers' T5 shifts its labels right this way)

_VIEWS = {"slice", "select", "narrow", "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten", "unflatten",
          "view_as", "alias", "transpose", "permute", "t", "swapaxes", "movedim", "expand", "expand_as", "as_strided",
          "diagonal", "unfold", "view_as_real", "view_as_complex"}
_SPLIT_VIEWS = {"split", "split_with_sizes", "chunk", "unbind", "tensor_split"}


def _unview(em, base, kind, vnode, new):
    """The base's new value after `new` was written into its view `vnode`."""
    bv = em.val(base)
    if not isinstance(bv, _Val):
        em.fail("an in-place write into a view of a number")
    new = em.cast(em.val_of(new), bv.dtype)
    rank = len(bv.shape)
    a = em.bind(vnode) if kind != "split" else None
    hint = f"{em.node.name}.{vnode.name}"
    if kind in ("slice", "narrow", "select"):
        ax = _axis(a.get("dim", 0), rank)
        n = bv.shape[ax]
        if kind == "select":
            start = int(a["index"]) % n
            end, step = start + 1, 1
        elif kind == "narrow":
            start = int(a["start"]) % n
            end, step = start + int(a["length"]), 1
        else:
            start, end, step = slice(a.get("start"), a.get("end"), int(a.get("step") or 1)).indices(n)
        if step != 1:
            em.fail("an in-place write through a strided slice")
        region = _with(bv.shape, ax, end - start)
        new = em.broadcast(em.reshape(new, region) if int(np.prod(new.shape or (1,))) == int(np.prod(region))
                           else new, region)
        parts = ([_slice(em, bv, ax, 0, start, name=f"{hint}.keep0")] if start > 0 else []) + [new] + \
                ([_slice(em, bv, ax, end, n, name=f"{hint}.keep1")] if end < n else [])
        return parts[0] if len(parts) == 1 else em.emit("concat", parts, {"axis": ax}, shape=bv.shape, dtype=bv.dtype,
                                                         name=f"{hint}.written")
    if kind in ("view", "_unsafe_view", "unsqueeze", "squeeze", "view_as", "alias"):
        return em.reshape(new, bv.shape)
    if kind in ("reshape", "flatten", "unflatten"):   # a view or a copy, by the memory layout PyTorch had
        em.fail(f"an in-place write through {kind} (PyTorch's result depends on whether it copied; write through "
                "view() instead)")
    if kind in ("transpose", "permute", "t", "swapaxes", "movedim"):
        fwd = _perm_of(kind, a, rank)
        inv = [fwd.index(i) for i in range(rank)]
        return em.emit("transpose", [new], {"perm": inv}, shape=bv.shape, dtype=bv.dtype, name=f"{hint}.untransposed")
    em.fail(f"an in-place write through {kind} (tfuse writes through slice, select, reshape and transpose views)")


def _perm_of(kind, a, r):
    """The axis order of t / transpose / swapaxes / permute / movedim."""
    if kind == "t":
        return [1, 0] if r == 2 else list(range(r))
    if kind == "permute":
        return [_axis(d, r) for d in a["dims"]]
    if kind == "movedim":
        src, dst = _axis(a["source"], r), _axis(a["destination"], r)
        perm = [i for i in range(r) if i != src]
        perm.insert(dst, src)
        return perm
    d0, d1 = _axis(a.get("dim0", a.get("axis0")), r), _axis(a.get("dim1", a.get("axis1")), r)
    perm = list(range(r))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return perm


# ---------------------------------------------------------------------------
# The walk

_SHAPE_ONLY = {"new_ones", "new_zeros", "new_full", "new_empty", "ones_like", "zeros_like", "full_like",
               "empty_like", "sym_size", "size"}
_NO_RESULT = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size",
              "_assert_async", "_functional_assert_async"}
_RANDOM = {"rand", "randn", "randint", "bernoulli", "normal", "uniform", "rand_like", "randn_like", "randperm",
           "dropout", "native_dropout"}


def _packet(target):
    p = getattr(target, "_overloadpacket", None)
    if p is not None:
        return p.__name__
    return getattr(target, "__name__", str(target))


def _linear_uses_only(torch, p):
    """True when every use of param node p is as a linear layer's weight
    [out, in]: aten.linear's weight, or a 2-d transpose feeding mm/addmm's mat2."""
    aten = torch.ops.aten
    if not p.users:
        return False
    for u in p.users:
        if u.target is aten.linear.default and len(u.args) > 1 and u.args[1] is p and p not in u.args[2:] \
                and u.args[0] is not p:
            continue
        if _packet(u.target) in ("t", "transpose", "permute") and _is_2d_swap(u) and u.users and all(
                _packet(w.target) in ("addmm", "mm") and w.args[-1 if _packet(w.target) == "mm" else 2] is u
                and list(w.args).count(u) == 1 and not w.kwargs for w in u.users):
            continue
        return False
    return True


def _is_2d_swap(u):
    v = u.args[0].meta.get("val")
    if v is None or v.dim() != 2:
        return False
    name = _packet(u.target)
    if name == "permute":
        return list(u.args[1]) == [1, 0]
    return True


def _out_paths(torch, out_spec, n):
    """The key path of each flattened output, as a list of str (dict keys,
    attribute names) and int (tuple positions)."""
    import torch.utils._pytree as pytree
    tree = pytree.tree_unflatten(list(range(n)), out_spec)
    flat, _ = pytree.tree_flatten_with_path(tree)
    paths = []
    for path, _ in flat:
        parts = []
        for k in path:
            if hasattr(k, "key"):
                parts.append(str(k.key))
            elif hasattr(k, "idx"):
                parts.append(int(k.idx))
            elif hasattr(k, "name"):
                parts.append(str(k.name))
        paths.append(parts)
    return paths


def _out_name(parts):
    """"output" for a lone tensor, "output0", "output1" for a tuple's, the key
    ("logits") for a dict's or a ModelOutput's, joined by dots when nested."""
    if not parts:
        return "output"
    s = ".".join(str(p) for p in parts)
    return _ir_name("output" + s if isinstance(parts[0], int) else s)


def _graph_to_ir(torch, ep, input_names, out_names, module_name, train_mode, strip_prefix=""):
    from torch.export.graph_signature import InputKind, OutputKind
    sig = ep.graph_signature
    em = _Emitter(torch, ep, input_names, train_mode)
    for n in list(input_names.values()) + list(out_names):
        em.used.add(n)
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    state = ep.state_dict
    consts = ep.constants
    inputs_decl, params_decl, buffers_decl = [], [], []
    user_i = 0
    gm = ep.graph_module
    updates = {}   # buffer name -> its new value

    def tname(target):
        return target[len(strip_prefix):] if strip_prefix and target.startswith(strip_prefix) else target

    def call(node):
        name = _packet(node.target)
        if name == "wrap_with_autocast":   # a torch.autocast region: its subgraph, inline
            autocast(node)
            return
        if node.target.__module__ == "_operator" and name == "getitem":
            if _packet(node.args[0].target) in _SPLIT_VIEWS:
                em.views[node] = (node.args[0].args[0], "split", node)
            src = em.env[node.args[0]]
            if isinstance(src, tuple) and src[0] == "const":
                em.env[node] = ("const", src[1][node.args[1]])
            else:
                em.env[node] = src[node.args[1]]
            return
        if name in _NO_RESULT:
            return
        if isinstance(node.args[0] if node.args else None, torch.fx.Node) and name.rstrip("_") in _VIEWS:
            em.views[node] = (node.args[0], name.rstrip("_"), node)
        ins = node.all_input_nodes
        if name in _SHAPE_ONLY or (all(em.is_const(i) for i in ins) and name not in _RANDOM):
            em.env[node] = ("const", _evaluate(torch, em, node))
            return
        if name in ("t", "transpose", "permute") and node.args[0] in em.transposed:
            em.env[node] = ("tparam", node.args[0])   # read by addmm/mm as the [in, out] param
            return
        inplace = name.endswith("_") and not name.startswith("_") and name not in _OPS
        h = _OPS.get(name[:-1] if inplace else name)
        if h is None:
            em.fail("tfuse has no mapping for this op")
        try:
            res = h(em, em.bind(node))
        except ExportError:
            raise
        except Exception as e:   # noqa: BLE001 -- a mapping's own bug: still an ExportError naming the op and line
            em.fail(f"tfuse.export's mapping of this op failed ({type(e).__name__}: {e}); this is a bug in "
                    "tfuse, please report it with the model")
        em.check(node, res)
        em.env[node] = res
        if inplace and isinstance(node.args[0], torch.fx.Node):
            target, value = node.args[0], res
            while True:   # the write reaches the view's base, and its base's, ...
                if target.op == "placeholder":   # state the model changes: a buffer's update
                    spec = specs.get(target.name)
                    if spec is None or spec.kind != InputKind.BUFFER or not isinstance(em.env.get(target), _Val):
                        em.fail("an in-place change of an input or a param (tfuse models change only buffers)")
                    updates[em.env[target].name] = value
                em.env[target] = value
                if target not in em.views:
                    break
                base, kind, vnode = em.views[target]
                if any(b is base and v is not vnode and used_after(v, node) for v, (b, _, _) in em.views.items()):
                    em.fail(f"an in-place write through {kind} into a tensor that another of its views reads later "
                            "(tfuse computes views as values: write into the tensor itself, or clone() the view)")
                if not read_later(base, node):
                    break   # nothing reads the base again (a dropout_ on a flatten of a pooled map): nothing to carry
                value = _unview(em, base, kind, vnode, value)
                target = base

    order = {n: i for i, n in enumerate(gm.graph.nodes)}

    def read_later(v, node):
        """Whether anything reads v (or, v a view, what it views) after node:
        a later user, or a placeholder's state. Unknown order (a subgraph's
        node): yes."""
        if v.op == "placeholder" or node not in order:
            return True
        if any(order.get(u, len(order)) > order[node] for u in v.users):
            return True
        return v in em.views and read_later(em.views[v][0], node)

    def used_after(v, node):
        """Whether v, or a view of v, is read after node."""
        if node not in order or any(order.get(u, len(order)) > order[node] for u in v.users):
            return True
        return any(b is v and used_after(w, node) for w, (b, _, _) in em.views.items())

    def autocast(node):
        """torch.autocast(device, dtype, enabled) around part of the forward:
        torch.export keeps it as a subgraph. Disabled (timm's EfficientViT
        keeps its attention in float32 so), or for another device than the
        CPU the model was traced on, it changes nothing there: its ops are
        the model's. Enabled on the CPU, it would compute in a narrower
        dtype, which tfuse chooses itself: refused."""
        device, dtype, enabled = node.args[:3]
        if enabled and device == "cpu":
            em.fail(f"code under torch.autocast(\"cpu\", dtype={dtype}): tfuse chooses its precision itself "
                    "(tfuse.compile(..., precision=\"bf16\")); export the model without autocast")
        sub = getattr(gm, node.args[4].target)
        operands = list(node.args[5:])
        for n in sub.graph.nodes:
            em.node = n
            if n.op == "placeholder":
                o = operands.pop(0)
                em.env[n] = em.env[o] if isinstance(o, torch.fx.Node) else ("const", o)
            elif n.op == "call_function":
                call(n)
            elif n.op == "output":
                em.env[node] = [em.env[x] if isinstance(x, torch.fx.Node) else ("const", x) for x in n.args[0]]
            else:
                em.fail(f"a {n.op} node inside a torch.autocast region")
        em.node = node

    for node in gm.graph.nodes:
        em.node = node
        if node.op == "placeholder":
            spec = specs.get(node.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            val = node.meta.get("val")
            if kind == InputKind.USER_INPUT:
                if not isinstance(val, torch.Tensor):
                    em.env[node] = ("const", val)
                    continue
                nm = list(input_names.values())[user_i]
                user_i += 1
                d = em.dt(val.dtype)
                inputs_decl.append(f"input  {nm} : {d}[{', '.join(str(int(s)) for s in val.shape)}]")
                em.env[node] = _Val(nm, tuple(int(s) for s in val.shape), d)
                continue
            if kind in (InputKind.PARAMETER, InputKind.BUFFER):
                t = state.get(spec.target) if spec.target in state else consts.get(spec.target)
                persistent = kind == InputKind.PARAMETER or spec.persistent is not False
                if t is None or not persistent:
                    if t is None:
                        em.fail(f"no value for {spec.target}")
                    if spec.target in {s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION}:
                        em.fail(f"a non-persistent buffer {spec.target} that the model changes")
                    em.env[node] = ("const", t.detach())
                    continue
                d = em.dt(t.dtype)
                trainable = kind == InputKind.PARAMETER and t.requires_grad and d in ("f32", "f16", "bf16", "f64")
                transposed = kind == InputKind.PARAMETER and t.dim() == 2 and _linear_uses_only(torch, node)
                arr = t.detach().cpu()
                if transposed:
                    arr = arr.t()
                arr = arr.contiguous()
                if d == "bf16":
                    em.fail(f"{spec.target} is bf16 (export the module in float32)")
                nm = em.uniq(tname(spec.target))
                shape = tuple(int(s) for s in arr.shape)
                decl = f"{'param ' if trainable else 'buffer'} {nm} : {d}[{', '.join(str(s) for s in shape)}]"
                (params_decl if trainable else buffers_decl).append(decl)
                em.params[nm] = arr.numpy().astype(_NP_OF[d])
                em.layout[nm] = (tname(spec.target), transposed)
                em.env[node] = _Val(nm, shape, d)
                if transposed:
                    em.transposed.add(node)
                continue
            if kind == InputKind.CONSTANT_TENSOR:
                em.env[node] = ("const", consts[spec.target])
                continue
            em.fail(f"an input of kind {kind}")
        elif node.op == "call_function":
            call(node)
        elif node.op == "output":
            outs = node.args[0]
            user = []
            for spec, o in zip(sig.output_specs, outs):
                if spec.kind == OutputKind.USER_OUTPUT:
                    user.append(o)
                elif spec.kind == OutputKind.BUFFER_MUTATION:
                    bnode = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name in specs and
                                 specs[n.name].target == spec.target)
                    if bnode in em.bn_buffers:
                        continue   # tfuse's batchnorm moves its running statistics itself (train mode)
                    updates[em.env[bnode].name] = em.val(o)
                else:
                    em.node = None
                    raise ExportError(f"error: cannot export a model whose graph has a {spec.kind} output "
                                      f"({spec.target}): tfuse models change only their buffers")
            outputs = []
            for nm, o in zip(out_names, user):
                if o is None:
                    continue
                v = em.val(o) if isinstance(o, torch.fx.Node) else None
                if v is None or not isinstance(v, _Val):
                    em.fail(f"output {nm} is not a tensor the model computes")
                outputs.append(f"output {nm}" if v.name == nm else f"output {nm} = {v.name}")
    text = [f"module {_ir_name(module_name)}", "# exported from PyTorch by tfuse.export; weights in the .safetensors "
            "beside this file (tfuse run --params)", ""]
    text += inputs_decl + [""] + params_decl + buffers_decl + em.decls + [""] + em.lines + [""] + outputs
    if updates:
        text += [""] + [f"update {b} = {v.name if isinstance(v, _Val) else v}" for b, v in updates.items()]
    return em, "\n".join(text) + "\n"


def _evaluate(torch, em, node):
    """A node that depends on no input, param or buffer, computed now."""
    fx = torch.fx

    def conv(x):
        if isinstance(x, fx.Node):
            v = em.env.get(x)
            if isinstance(v, tuple) and v[0] == "const":
                return v[1]
            mv = x.meta.get("val")   # a shape-only use: a tensor of the right shape and dtype
            if isinstance(mv, torch.Tensor):
                return torch.zeros(tuple(int(s) for s in mv.shape), dtype=mv.dtype)
            return mv
        if isinstance(x, (list, tuple)):
            return type(x)(conv(y) for y in x)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, torch.device):
            return torch.device("cpu")
        return x

    args, kwargs = conv(node.args), conv(node.kwargs)
    if "device" in kwargs:
        kwargs["device"] = torch.device("cpu")
    try:
        with torch.no_grad():
            return node.target(*args, **kwargs)
    except Exception as e:   # noqa: BLE001  (the op's own message says why)
        em.fail(f"computing it at export time failed: {e}")


def _check(self, node, res):
    mv = node.meta.get("val")
    if isinstance(res, _Val) and isinstance(mv, self.torch.Tensor):
        want = tuple(int(s) for s in mv.shape)
        if res.shape != want:
            self.fail(f"internal: the mapping gives shape {list(res.shape)}, PyTorch's is {list(want)}")


_Emitter.check = _check


def _linear_weight(self, w):
    if w in self.transposed:
        return self.env[w]
    return None


def _linear_weight_t(self, m2):
    v = self.env.get(m2)
    if isinstance(v, tuple) and v[0] == "tparam":
        return self.env[v[1]]
    if isinstance(v, _Val) and len(v.shape) == 2 and _packet(self.node.target) == "addmm":
        return v
    return None


_Emitter.linear_weight = _linear_weight
_Emitter.linear_weight_t = _linear_weight_t


# ---------------------------------------------------------------------------
# The train block

def _optimizer_text(torch, optimizer, trainable):
    groups = optimizer.param_groups
    g0 = groups[0]
    for g in groups[1:]:
        diff = [k for k in g if k != "params" and g[k] != g0[k] and k != "initial_lr"]
        if diff:
            raise ExportError(f"error: cannot export {type(optimizer).__name__}: its param groups differ in "
                              f"{diff}; tfuse's train block has one optimizer setting for every param")
    given = {id(p) for g in groups for p in g["params"]}
    missing = [n for n, p in trainable if id(p) not in given]
    if missing:
        raise ExportError(f"error: cannot export {type(optimizer).__name__}: it does not update {missing[:3]}; "
                          "tfuse's optimizer updates every param (freeze one with requires_grad=False)")
    lr = float(g0.get("initial_lr", g0["lr"]))
    name = type(optimizer).__name__

    def bad(what):
        raise ExportError(f"error: cannot export {name}({what}): tfuse's {name.lower()} has no such setting")

    if g0.get("maximize"):
        bad("maximize=True")
    if name == "SGD":
        if g0.get("dampening", 0):
            bad(f"dampening={g0['dampening']}")
        args = [f"lr={_num(lr)}"]
        if g0.get("momentum", 0):
            args.append(f"momentum={_num(g0['momentum'])}")
        if g0.get("nesterov"):
            args.append("nesterov=true")
        if g0.get("weight_decay", 0):
            args.append(f"weight_decay={_num(g0['weight_decay'])}")
        return f"sgd({', '.join(args)})", lr
    if name in ("Adam", "AdamW"):
        if g0.get("amsgrad"):
            bad("amsgrad=True")
        if g0.get("decoupled_weight_decay") and name == "Adam":
            name = "AdamW"
        b1, b2 = g0["betas"]
        wd = float(g0.get("weight_decay", 0.0))
        args = [f"lr={_num(lr)}", f"beta1={_num(float(b1))}", f"beta2={_num(float(b2))}",
                f"eps={_num(float(g0['eps']))}", f"weight_decay={_num(wd)}"]
        return f"{name.lower()}({', '.join(args)})", lr
    raise ExportError(f"error: cannot export the optimizer {name}: tfuse has SGD, Adam and AdamW")


def _schedule_text(scheduler, lr):
    if scheduler is None:
        return None
    name = type(scheduler).__name__
    if name == "StepLR":
        return f"step(step_size={scheduler.step_size}, gamma={_num(scheduler.gamma)})"
    if name == "CosineAnnealingLR":
        return f"cosine(total_steps={scheduler.T_max}, min_lr={_num(scheduler.eta_min)})"
    if name == "ConstantLR" and scheduler.factor == 1.0:
        return None
    if name == "OneCycleLR":
        if getattr(scheduler, "_anneal_func_type", "cos") != "cos" or scheduler.cycle_momentum:
            raise ExportError("error: cannot export OneCycleLR with momentum cycling or linear annealing: tfuse's "
                              "onecycle anneals the learning rate alone, by cosine (cycle_momentum=False, "
                              "anneal_strategy='cos')")
        if getattr(scheduler, "_schedule_phases", None) and len(scheduler._schedule_phases) != 2:
            raise ExportError("error: cannot export OneCycleLR(three_phase=True)")
        g = scheduler.optimizer.param_groups[0]
        mx, init, mn = g["max_lr"], g["initial_lr"], g["min_lr"]
        total = scheduler.total_steps
        up = scheduler._schedule_phases[0]["end_step"] + 1
        if up != int(up):
            raise ExportError(f"error: cannot export OneCycleLR: pct_start * total_steps = {up} is not a whole "
                              "number of steps (tfuse's onecycle rounds it down, PyTorch's does not)")
        pct = up / total
        return (f"onecycle(max_lr={_num(mx)}, total_steps={total}, pct_start={_num(pct)}, "
                f"div_factor={_num(mx / init)}, final_div_factor={_num(init / mn)})")
    raise ExportError(f"error: cannot export the LR scheduler {name}: tfuse has StepLR (step), CosineAnnealingLR "
                      "(cosine) and OneCycleLR (onecycle)")


# ---------------------------------------------------------------------------
# export()

def _input_names(forward, args, kwargs, extra=()):
    """{torch argument name: tfuse input name} for the tensors among args/kwargs."""
    try:
        bound = inspect.signature(forward).bind(*args, **kwargs)
        items = list(bound.arguments.items())
    except (TypeError, ValueError):
        items = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    out = {}
    for k, v in items + list(extra):
        if isinstance(v, dict):   # **kwargs
            for kk, vv in v.items():
                out[kk] = vv
        elif isinstance(v, (list, tuple)) and k.startswith("*") is False and not hasattr(v, "shape"):
            for i, vv in enumerate(v):
                out[f"{k}{i}"] = vv
        else:
            out[k] = v
    return out


def export(module, example_inputs, loss_fn=None, optimizer=None, scheduler=None, *, targets=(), name=None,
           dynamic_shapes=None):
    """A PyTorch module as a tfuse model: returns an Exported (.text, .params,
    .save(path)); tfuse.compile(exported, ...) compiles it and its sessions
    start from the module's weights.

    example_inputs: a tuple of the forward's positional arguments, or a dict
    of keyword arguments (as HF models take input_ids=...); their shapes and
    dtypes become the inputs'. The module is traced in its current mode:
    call module.eval() first for inference (dropout off, batchnorm's running
    statistics), though tfuse's compile mode decides both in the end.

    loss_fn(outputs, *targets) -> scalar, with `targets` the example tensors
    of its other arguments: the model then has an output named "loss" first
    (what tfuse's train mode minimizes), and inputs for the targets, named
    as loss_fn's parameters (F.cross_entropy's "target"). optimizer: a
    torch.optim SGD, Adam or AdamW over the module's params; scheduler: a
    StepLR, CosineAnnealingLR or OneCycleLR of it: together the train block.

    dynamic_shapes: sizes that become tfuse dims, so that one export
    compiles at any size (tfuse.compile(exported, dims={"B": 64})), in
    torch.export's form: {argument name: {axis: Dim("B")}} (or a list with
    a Dim or None per axis; a tuple of those, one per positional input, in
    place of the dict); a plain string names a dim as well as a Dim does.
    The loss_fn's targets are arguments too; a target given no spec whose
    first axis has the size of a dim declared on an input's first axis
    follows that dim (labels follow the batch). See _dynamic.
    """
    try:
        return _export(module, example_inputs, loss_fn, optimizer, scheduler, targets, name, dynamic_shapes)
    except ExportError:
        raise
    except Exception as e:   # noqa: BLE001 -- never a bare traceback from inside tfuse
        raise ExportError(f"error: tfuse.export failed on {type(module).__name__} ({type(e).__name__}: {e}); this is "
                          "a bug in tfuse, please report it with the model") from e


def _export(module, example_inputs, loss_fn, optimizer, scheduler, targets, name, dynamic_shapes):
    targets = tuple(targets) if isinstance(targets, (list, tuple)) else (targets,)
    ex, em = _export_at(module, example_inputs, loss_fn, optimizer, scheduler, targets, name)
    if dynamic_shapes is None:
        return ex
    return _dynamic(module, example_inputs, loss_fn, optimizer, scheduler, targets, name, dynamic_shapes, ex, em)


def _export_at(module, example_inputs, loss_fn, optimizer, scheduler, targets, name):
    """One export at the example's sizes: (Exported, the _Emitter)."""
    torch = _torch()
    nn = torch.nn
    if isinstance(example_inputs, dict):
        args, kwargs = (), dict(example_inputs)
    else:
        args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
        kwargs = {}
    targets = tuple(targets) if isinstance(targets, (list, tuple)) else (targets,)
    names = _input_names(module.forward, args, kwargs)
    mod, prefix = module, ""
    if loss_fn is not None:
        fn = loss_fn.forward if isinstance(loss_fn, nn.Module) else loss_fn
        try:
            pnames = [p for p in inspect.signature(fn).parameters][1:1 + len(targets)]
        except (TypeError, ValueError):
            pnames = []
        pnames += [f"target{i}" for i in range(len(pnames), len(targets))]
        for p, t in zip(pnames, targets):
            if p in names:
                raise ExportError(f"error: loss_fn's argument '{p}' has the name of one of the forward's")
            names[p] = t
        nin, nkw = len(args), list(kwargs)

        class _WithLoss(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = module

            def forward(self, *a):
                out = self.m(*a[:nin], **dict(zip(nkw, a[nin:nin + len(nkw)])))
                return loss_fn(out, *a[nin + len(nkw):]), out

        mod, prefix = _WithLoss(), "m."
        args, kwargs = args + tuple(kwargs.values()) + targets, {}
    tensor_names = {k: _ir_name(k) for k, v in names.items() if isinstance(v, torch.Tensor)}
    try:
        ep = torch.export.export(mod, args, kwargs, strict=False)
    except Exception as e:   # noqa: BLE001
        raise ExportError(f"error: torch.export could not trace {type(module).__name__}: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    sig = ep.graph_signature
    n_user = sum(1 for s in sig.output_specs if s.kind.name == "USER_OUTPUT")
    paths = _out_paths(torch, ep.call_spec.out_spec, n_user)
    if loss_fn is not None:   # (loss, module outputs)
        onames = ["loss"] + [_out_name(p[1:]) for p in paths[1:]]
    else:
        onames = [_out_name(p) for p in paths]
    seen = set()
    for i, n in enumerate(onames):   # distinct names
        base, k = n, 1
        while onames[i] in seen or onames[i] in tensor_names.values():
            onames[i] = f"{base}_{k}"
            k += 1
        seen.add(onames[i])
    model_name = name or type(module).__name__
    train_mode = module.training or loss_fn is not None
    em, text = _graph_to_ir(torch, ep, tensor_names, onames, model_name, train_mode, prefix)
    aliases = {}
    sd = module.state_dict(keep_vars=True)
    ptr = {}
    for ir, (tn, _) in em.layout.items():
        if tn in sd:
            ptr[(sd[tn].data_ptr(), tuple(sd[tn].shape))] = ir
    for tn, t in sd.items():
        key = (t.data_ptr(), tuple(t.shape))
        if key in ptr and em.layout[ptr[key]][0] != tn and t.numel():
            aliases[tn] = ptr[key]
    if optimizer is not None:
        trainable = [(tn, sd[tn]) for ir, (tn, _) in em.layout.items() if tn in sd and
                     isinstance(sd[tn], nn.Parameter) and sd[tn].requires_grad]
        opt, lr = _optimizer_text(torch, optimizer, trainable)
        block = [f"  optimizer = {opt}"]
        sched = _schedule_text(scheduler, lr)
        if sched:
            block.append(f"  schedule  = {sched}")
        text += "\ntrain {\n" + "\n".join(block) + "\n}\n"
    elif scheduler is not None:
        raise ExportError("error: a scheduler without its optimizer")
    return Exported(text, em.params, dict(tensor_names), onames, em.layout, aliases, model_name), em


# ---------------------------------------------------------------------------
# Dynamic sizes: dynamic_shapes -> tfuse dims
#
# tfuse's dims are names (`dim B = 4`, then f32[B, 16] and shape=[B, -1]),
# not expressions, and the exporter works on concrete sizes. So a dynamic
# size is found by difference: the model is exported once more per dim with
# that size one larger (the example's rows repeated), and the two texts must
# be the same but for numbers. A number that is the example's size in one
# and the size + 1 in the other is the dim; one that moved otherwise (16 * B
# in a reshape, 1/B as a factor) is a size derived from the dim, which a
# reshape can infer (-1, once per reshape) and nothing else can hold: that is
# refused, naming the user's line. A constant computed at export time with
# the dim in its shape is kept when it is the same along that axis (a mask
# of ones, a position row repeated per image: stored once, broadcast to B);
# otherwise refused. The same structure at both sizes is what torch.export
# checks with its guards: a model that branches on the size is refused too.

_NUMTOK = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def _dim_name(torch, d, where):
    from torch.export.dynamic_shapes import Dim
    if isinstance(d, str):
        nm = d
    elif isinstance(d, Dim) and type(d).__name__ == "Dim":
        nm = d.__name__
    elif hasattr(d, "__name__") and "*" in str(d) or "+" in str(d):
        raise ExportError(f"error: dynamic_shapes: {where} is {d}, a size derived from another dim; tfuse's dims are "
                          "names, not expressions: give that axis a Dim of its own")
    else:
        raise ExportError(f"error: dynamic_shapes: {where} is {d!r}; tfuse needs a name for each dynamic size: "
                          "Dim(\"B\") or the string \"B\" (Dim.AUTO and Dim.DYNAMIC have none)")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", nm or "") or nm in _KEYWORDS:
        raise ExportError(f"error: dynamic_shapes: {where}: {nm!r} cannot name a tfuse dim (a name is "
                          "[A-Za-z_][A-Za-z0-9_]* and not a keyword)")
    lo, hi = getattr(d, "min", None), getattr(d, "max", None)
    return nm, lo, hi


def _dynamic_axes(torch, spec, module, example_inputs, loss_fn, targets):
    """[(tensor, axis, dim name)] from dynamic_shapes, and {dim: size}."""
    if isinstance(example_inputs, dict):
        args, kwargs = (), dict(example_inputs)
    else:
        args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
        kwargs = {}
    names = _input_names(module.forward, args, kwargs)
    if loss_fn is not None:
        fn = loss_fn.forward if isinstance(loss_fn, torch.nn.Module) else loss_fn
        try:
            pn = [p for p in inspect.signature(fn).parameters][1:1 + len(targets)]
        except (TypeError, ValueError):
            pn = []
        pn += [f"target{i}" for i in range(len(pn), len(targets))]
        names.update(zip(pn, targets))
    if isinstance(spec, dict):
        items = list(spec.items())
    elif isinstance(spec, (list, tuple)):
        if isinstance(example_inputs, dict) or len(spec) > len(args):
            raise ExportError(f"error: dynamic_shapes: {len(spec)} positional specs for "
                              f"{0 if isinstance(example_inputs, dict) else len(args)} positional inputs "
                              "(key them by argument name instead)")
        pos = list(names)
        items = [(pos[i], sp) for i, sp in enumerate(spec)]
    else:
        raise ExportError("error: dynamic_shapes must be a dict {argument name: {axis: Dim}} or a tuple with "
                          f"one spec per positional input, not {type(spec).__name__}")
    axes, sizes = [], {}

    def add(t, ax, d, where):
        nm, lo, hi = _dim_name(torch, d, where)
        n = int(t.shape[ax])
        if n < 2:
            raise ExportError(f"error: dynamic_shapes: {where} has size {n} in the example; a dynamic size "
                              "needs an example of 2 or more (size 1 broadcasts, as torch.export says too)")
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            raise ExportError(f"error: dynamic_shapes: {where} is {n} in the example, outside {nm}'s range "
                              f"[{lo}, {hi}]")
        if sizes.setdefault(nm, n) != n:
            raise ExportError(f"error: dynamic_shapes: dim {nm} is {sizes[nm]} on one axis and {n} on {where}; "
                              "one dim has one size")
        axes.append((t, ax, nm))

    for key, sp in items:
        if key not in names:
            raise ExportError(f"error: dynamic_shapes names '{key}', which is not an argument of the forward"
                              f"{' or the loss_fn' if loss_fn is not None else ''} (those are: "
                              f"{', '.join(names)})")
        t = names[key]
        if sp is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ExportError(f"error: dynamic_shapes gives '{key}' a spec, but it is not a tensor")
        per = dict(sp) if isinstance(sp, dict) else dict(enumerate(sp)) if isinstance(sp, (list, tuple)) else None
        if per is None:
            raise ExportError(f"error: dynamic_shapes['{key}'] must be {{axis: Dim}} or a list with a Dim or None "
                              f"per axis, not {type(sp).__name__}")
        if isinstance(sp, (list, tuple)) and len(sp) != t.dim():
            raise ExportError(f"error: dynamic_shapes['{key}'] lists {len(sp)} axes; '{key}' has {t.dim()}")
        for ax, d in per.items():
            if d is None:
                continue
            if not isinstance(ax, int) or not -t.dim() <= ax < t.dim():
                raise ExportError(f"error: dynamic_shapes['{key}']: axis {ax!r} is not an axis of a rank-{t.dim()} "
                                  "tensor")
            add(t, ax % t.dim(), d, f"axis {ax % t.dim()} of '{key}'")
    lead = {nm for t, ax, nm in axes if ax == 0}
    given = {id(names[k]) for k, sp in items if k in names and sp is not None}
    for t in targets:   # labels follow the batch
        if isinstance(t, torch.Tensor) and id(t) not in given and t.dim() >= 1:
            match = [nm for nm in lead if sizes[nm] == t.shape[0]]
            if len(match) == 1:
                axes.append((t, 0, match[0]))
    return axes, sizes


def _grown(torch, obj, axes, dim, n):
    """obj (a tensor, or a tuple/dict of them) with every axis of `dim` at
    size n + 1: the example's rows again, row 0 last."""
    if isinstance(obj, dict):
        return {k: _grown(torch, v, axes, dim, n) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return tuple(_grown(torch, v, axes, dim, n) for v in obj)
    if isinstance(obj, torch.Tensor):
        for t, ax, nm in axes:
            if t is obj and nm == dim:
                idx = torch.arange(n + 1) % n
                obj = torch.index_select(obj, ax, idx)
    return obj


def _dynamic(module, example_inputs, loss_fn, optimizer, scheduler, targets, name, spec, ex, em):
    torch = _torch()
    axes, sizes = _dynamic_axes(torch, spec, module, example_inputs, loss_fn, targets)
    if not axes:
        return ex
    clash = sorted(set(sizes) & em.used)
    if clash:
        raise ExportError(f"error: dynamic_shapes: dim {clash[0]} has the name of a value of the model; "
                          "name the dim otherwise")
    if not isinstance(example_inputs, (dict, list, tuple)):
        example_inputs = (example_inputs,)
    lines0 = ex.text.split("\n")
    split0 = [_NUMTOK.split(ln) for ln in lines0]
    moved = {}   # (line, token) -> {dim: (number at the size, number at the size + 1)}
    for dim, n in sizes.items():
        try:
            ex1, _ = _export_at(module, _grown(torch, example_inputs, axes, dim, n), loss_fn, optimizer, scheduler,
                                _grown(torch, targets, axes, dim, n), name)
        except ExportError as e:
            raise ExportError(f"error: dim {dim} cannot be dynamic: at {dim} = {n + 1} (the example's rows "
                              f"repeated) the export fails:\n{e}") from None
        lines1 = ex1.text.split("\n")
        if len(lines1) != len(lines0):
            raise ExportError(f"error: dim {dim} cannot be dynamic: the model's graph at {dim} = {n + 1} is not "
                              f"the one at {n} (it has {len(lines1)} lines, not {len(lines0)}): the model takes "
                              "another path at another size")
        for i, (l0, l1) in enumerate(zip(lines0, lines1)):
            if l0 == l1:
                continue
            p0, p1 = split0[i], _NUMTOK.split(l1)
            if len(p0) != len(p1) or any(a != b for a, b in zip(p0[0::2], p1[0::2])):
                raise ExportError(f"error: dim {dim} cannot be dynamic: the model's graph at {dim} = {n + 1} is not "
                                  f"the one at {n}:\n  {l0}\nbecomes\n  {l1}" + _from(em, l0))
            for j in range(1, len(p0), 2):
                if p0[j] != p1[j]:
                    moved.setdefault((i, j), {})[dim] = (p0[j], p1[j])
    new_params = dict(ex.params)
    broadcasts, step_decls = [], {}
    by_line = {}
    for (i, j), how in moved.items():
        by_line.setdefault(i, {})[j] = how
    for i, toks in sorted(by_line.items()):
        line, parts = lines0[i], split0[i]
        derived = []
        for j, how in toks.items():
            (dim, (a, b)), = how.items() if len(how) == 1 else ((None, (None, None)),)
            before = "".join(split0[i][:j])
            where_ok = before.rfind("[") > before.rfind("]") or re.search(r"\w=$", before)
            if dim is not None and a == str(sizes[dim]) and b == str(sizes[dim] + 1) and where_ok:
                parts[j] = dim   # a size or an integer attribute: the dim itself
            else:
                derived.append(j)
        word = line.split(" ", 1)[0]
        if word in ("param", "buffer"):
            if derived or word == "param":
                raise ExportError(f"error: the size of a dim reaches the shape of {'a param' if word == 'param' else 'a constant'} "
                                  f"other than as itself:\n  {line}" + _from(em, line))
            bname = line.split()[1]
            arr = new_params.pop(bname)
            dtype, shape = re.fullmatch(r"buffer\s+\S+\s*:\s*(\w+)\[(.*)\]\s*", "".join(parts)).groups()
            entries = [e.strip() for e in shape.split(",")]
            keep, ramp = arr, None
            for ax, e in enumerate(entries):
                if e not in sizes:
                    continue
                first = np.take(keep, [0], axis=ax)
                if not np.array_equal(keep, np.broadcast_to(first, keep.shape)):
                    step = np.take(keep, [1], axis=ax) - first if arr.dtype != np.bool_ else None
                    k = np.arange(keep.shape[ax]).reshape([-1 if a == ax else 1 for a in range(keep.ndim)])
                    if ramp is not None or step is None or not np.array_equal(keep, first + k * step):
                        raise ExportError(f"error: dim {e} cannot be dynamic: a constant computed at export time has "
                                          f"it in its shape and is neither the same along it nor a count along it (it "
                                          f"is made from the example's values, not its size):\n  {line}" +
                                          _from(em, line))
                    ramp = (ax, np.ascontiguousarray(step))   # first + k * step: an arange over the dim
                keep = first
            one = [("1" if e in sizes else e) for e in entries]
            new_params[bname + ".one"] = np.ascontiguousarray(keep)
            lines0[i] = f"buffer {bname}.one : {dtype}[{', '.join(one)}]"
            if ramp is None:
                broadcasts.append(f"{bname} = broadcast({bname}.one, shape=[{', '.join(entries)}])")
                continue
            ax, step = ramp
            new_params[bname + ".step"] = step
            step_decls[i] = f"buffer {bname}.step : {dtype}[{', '.join(one)}]"
            broadcasts += [f"{bname}.k = iota(shape=[{', '.join(entries)}], axis={ax}, dtype={dtype})",
                           f"{bname}.ks = mul({bname}.k, {bname}.step)",
                           f"{bname} = add({bname}.one, {bname}.ks)"]
            continue
        if derived:
            k = line.find("shape=[") if " = reshape(" in line else -1
            starts = [len("".join(split0[i][:j])) for j in derived]
            if k < 0 or not all(k < at < line.index("]", k) for at in starts):
                j = derived[0]
                (dim, (a, b)), *_ = toks[j].items()
                if len(toks[j]) == 1 and (a, b) == (str(sizes[dim]), str(sizes[dim] + 1)):
                    why = ("as an operand, and a dim stands only for a size or an integer attribute (compute from "
                           "a tensor, not from its size, or leave this size static)")
                else:
                    why = (f"as {a} at {dim} = {sizes[dim]} and {b} at {dim} = {sizes[dim] + 1}: a number derived "
                           "from the size, and tfuse's dims are names, not expressions (only a reshape can infer "
                           "one size, as -1)")
                raise ExportError(f"error: dim {dim} cannot be dynamic: its size reaches this op {why}:\n  {line}" +
                                  _from(em, line))
            k = line.index("shape=[")
            lst = line[k:line.index("]", k)]
            if len(derived) + lst.count("-1") > 1:
                raise ExportError(f"error: a reshape has {len(derived) + lst.count('-1')} sizes derived from dynamic "
                                  f"dims, and tfuse infers one (-1):\n  {line}" + _from(em, line))
            for j in derived:
                parts[j] = "-1"
        lines0[i] = "".join(parts)
    for i in sorted(step_decls, reverse=True):
        lines0.insert(i + 1, step_decls[i])
    if broadcasts:
        first_op = next((i for i, ln in enumerate(lines0) if re.match(r"[A-Za-z_][\w.]* = ", ln)), len(lines0))
        lines0[first_op:first_op] = broadcasts
    decl = [f"dim {d} = {n}   # from dynamic_shapes: tfuse.compile(..., dims={{\"{d}\": N}}) sets it" for d, n in sizes.items()]
    lines0[2:2] = decl
    return Exported("\n".join(lines0), new_params, ex.inputs, ex.outputs, ex.layout, ex.aliases, ex.name, sizes)


def _from(em, line):
    src = em.origin.get(line)
    return f"\n(from {src})" if src else ""


# ---------------------------------------------------------------------------
# tfuse.export is this module, callable as export(): `tfuse.export(model, ...)`

class _CallableModule(type(sys)):
    def __call__(self, *args, **kwargs):
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


# ---------------------------------------------------------------------------
# python -m tfuse.export FILE.py:NAME --input f32[8,784] ... -o model.ir

_SPEC = re.compile(r"^(?:([A-Za-z_]\w*)=)?(f32|f16|f64|bf16|i64|i32|bool)\[([\w=,\s]*)\]$")


def main(argv=None):
    import argparse
    import importlib.util
    ap = argparse.ArgumentParser(
        prog="python -m tfuse.export",
        description="Export a PyTorch module to a tfuse model: OUT.ir and OUT.safetensors (its weights).")
    ap.add_argument("module", help="FILE.py:NAME or package.module:NAME; NAME a nn.Module class (built with no "
                                   "arguments) or a function returning a module")
    ap.add_argument("--input", action="append", default=[], metavar="[NAME=]DTYPE[SHAPE]",
                    help="an example input, e.g. f32[8,3,32,32] or input_ids=i64[2,16]: positional in order, "
                         "or a keyword argument with NAME= (random values; only the shape and dtype matter); a size "
                         "written DIM=N, as in f32[B=8,784], is exported as the dynamic dim DIM (example size N)")
    ap.add_argument("-o", "--output", default=None, help="the .ir to write (default: NAME.ir); the weights go "
                                                         "beside it as .safetensors")
    ap.add_argument("--train", action="store_true", help="trace in training mode (default: module.eval())")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building the module")
    a = ap.parse_args(argv)
    torch = _torch()
    path, _, attr = a.module.rpartition(":")
    if not path or not attr:
        ap.error(f"'{a.module}': expected FILE.py:NAME or module:NAME")
    if path.endswith(".py") or os.sep in path:
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        mod = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(path)
    torch.manual_seed(a.seed)
    model = getattr(mod, attr)()
    model.train(a.train)
    args, kwargs, dyn = [], {}, []
    gen = torch.Generator().manual_seed(a.seed)
    for s in a.input:
        m = _SPEC.match(s.replace(" ", ""))
        dims = m.group(3).split(",") if m and m.group(3) else []
        if not m or not all(re.fullmatch(r"(?:[A-Za-z_]\w*=)?\d+", d) for d in dims):
            ap.error(f"--input {s}: expected [NAME=]DTYPE[d0,d1,...], e.g. f32[8,784] (or f32[B=8,784] for a "
                     "dynamic dim B)")
        name, dt, _ = m.groups()
        shape = [int(d.rpartition("=")[2]) for d in dims]
        dyn.append((name, {i: d.partition("=")[0] for i, d in enumerate(dims) if "=" in d}))
        tdt = {"f32": torch.float32, "f16": torch.float16, "f64": torch.float64, "bf16": torch.bfloat16,
               "i64": torch.int64, "i32": torch.int32, "bool": torch.bool}[dt]
        t = torch.randn(shape, generator=gen).to(tdt) if tdt.is_floating_point else \
            torch.zeros(shape, dtype=tdt)
        if name:
            kwargs[name] = t
        else:
            args.append(t)
    if args and kwargs:
        ap.error("give the inputs all by position or all by name")
    spec = None
    if any(d for _, d in dyn):
        spec = {n: d for n, d in dyn} if kwargs else tuple(d or None for _, d in dyn)
    try:
        ex = export(model, kwargs if kwargs else tuple(args), dynamic_shapes=spec)
    except Error as e:
        print(e, file=sys.stderr)
        return 1
    out = a.output or attr + ".ir"
    w = ex.save(out)
    dims = f"; dims {', '.join(f'{k} (example {v})' for k, v in ex.dims.items())}" if ex.dims else ""
    print(f"{out}: {len(ex.inputs)} inputs ({', '.join(ex.inputs.values())}), outputs {', '.join(ex.outputs)}"
          f"{dims}; weights: {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
