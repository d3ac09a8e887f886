"""tfuse.export's emitter: the values and names of the IR it writes, and the
_Emitter that the op handlers (_export_ops.py, _export_ops_layout.py) and
the graph walk (export.py) write it through. Also ExportError, which every
part raises, and the op table's registry (_OPS, _op), which the two op
modules fill."""
import inspect
import math
import os
import re

import numpy as np

from . import Error

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


# ExportError is defined here, below every part, so that all of them raise
# the one class (under `python -m tfuse.export`, export.py itself runs as
# __main__). Its public name stays tfuse.export.ExportError (export.py
# re-exports it): the name tracebacks print and pickles look up.
ExportError.__module__ = "tfuse.export"


def _torch():
    try:
        import torch
    except ImportError:
        raise Error("error: tfuse.export needs PyTorch (pip install torch)", "unavailable") from None
    return torch


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


# the driver: its _WithLoss.forward calls the user's module and loss_fn, so
# its frames are in stack traces, and the user's line is the one below them
_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "export.py")


def _source_of(node):
    """'file.py:12: code' for the innermost user frame of node's stack trace."""
    st = node.meta.get("stack_trace") if node is not None else None
    if not st:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', st)
    if not frames:
        return st.strip().splitlines()[-1]
    theirs = [fr for fr in frames if os.path.abspath(fr[0]) != _DRIVER] or frames
    f, line, code = theirs[-1]
    where = f"{f}:{line}: {code.strip()}"
    if theirs is not frames and frames[-1] is not theirs[-1]:
        where += " (in the loss_fn)"
    return where


def _packet(target):
    p = getattr(target, "_overloadpacket", None)
    if p is not None:
        return p.__name__
    return getattr(target, "__name__", str(target))


def _loss_arg_names(torch, loss_fn, n):
    """The names of loss_fn's n target arguments (after the outputs): its
    own parameters' names, target0, target1, ... where it has none."""
    fn = loss_fn.forward if isinstance(loss_fn, torch.nn.Module) else loss_fn
    try:
        names = [p for p in inspect.signature(fn).parameters][1:1 + n]
    except (TypeError, ValueError):
        names = []
    return names + [f"target{i}" for i in range(len(names), n)]


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


# ---------------------------------------------------------------------------
# The emitter

class _Emitter:
    """The IR written for one ATen graph: its lines, declarations and
    weights, the names taken, and what each fx node became (env)."""

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
        self.attention_kv = {}    # scaled_dot_product_attention node -> (k, v) with fewer heads (_export_attention)
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

    # -- after a handler, and the linear weights the walk stores [in, out]
    def check(self, node, res):
        mv = node.meta.get("val")
        if isinstance(res, _Val) and isinstance(mv, self.torch.Tensor):
            want = tuple(int(s) for s in mv.shape)
            if res.shape != want:
                self.fail(f"internal: the mapping gives shape {list(res.shape)}, PyTorch's is {list(want)}")

    def linear_weight(self, w):
        if w in self.transposed:
            return self.env[w]
        return None

    def linear_weight_t(self, m2):
        v = self.env.get(m2)
        if isinstance(v, tuple) and v[0] == "tparam":
            return self.env[v[1]]
        if isinstance(v, _Val) and len(v.shape) == 2 and _packet(self.node.target) == "addmm":
            return v
        return None


def _axis(d, rank):
    d = int(d)
    return d + rank if d < 0 else d


def _shape(v):
    return tuple(int(s) for s in v.shape)


# ---- the op table: ATen op (overload packet name) -> handler(em, a) where a
# is the node's arguments by schema name; a handler returns a _Val (or a
# list of them for ops with several results). _export_ops_layout.py and
# _export_ops.py fill it; export.py reads it through _export_ops, which
# imports the other.

_OPS = {}


def _op(*names):
    def reg(f):
        for n in names:
            _OPS[n] = f
        return f
    return reg
