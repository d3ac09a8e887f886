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
the example inputs'); each ATen op becomes tfuse ops (the table `_OPS`, in
_export_ops.py and _export_ops_layout.py). Parts of the graph that depend
on no input, param or buffer (the position ids and causal masks models
build from torch.arange) are computed here, once, and become constants. An ATen op with no mapping, or a mapping
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
# The exporter's parts: this module is the driver (export(), the walk over
# the graph, the train block, Exported, safetensors, the command line);
# _export_emit.py the IR's values and names and the _Emitter; the op table
# in _export_ops.py (ops that compute) and _export_ops_layout.py (views,
# slices, padding, indexing, in-place writes); _export_attention.py the
# attention op (scaled_dot_product_attention's mapping, and the pass before
# the walk that finds attention written by hand); _export_dynamic.py
# dynamic_shapes.
import os
import re
import struct
import json
import sys

import numpy as np

from . import Error
from ._export_attention import emit_plan, find_attention
from ._export_dynamic import _dynamic
from ._export_emit import ExportError, _Emitter, _NP_OF, _Val, _input_names, _loss_arg_names, _ir_name, _num, _packet, _torch
from ._export_ops import _OPS   # the whole table: _export_ops imports _export_ops_layout
from ._export_ops_layout import _SPLIT_VIEWS, _VIEWS, _unview

__all__ = ["export", "Exported", "ExportError"]


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
# The walk

_SHAPE_ONLY = {"new_ones", "new_zeros", "new_full", "new_empty", "ones_like", "zeros_like", "full_like",
               "empty_like", "sym_size", "size"}
_NO_RESULT = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size",
              "_assert_async", "_functional_assert_async"}
_RANDOM = {"rand", "randn", "randint", "bernoulli", "normal", "uniform", "rand_like", "randn_like", "randperm",
           "dropout", "native_dropout"}


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


class _GraphWalk:
    """The translation of one ATen graph, node by node: the state its steps
    share (the emitter, the declarations, the buffers' new values) and the
    steps (a placeholder, a call, the output)."""

    def __init__(self, torch, ep, input_names, out_names, train_mode, strip_prefix):
        from torch.export.graph_signature import InputKind, OutputKind
        self.InputKind, self.OutputKind = InputKind, OutputKind
        self.torch = torch
        self.sig = ep.graph_signature
        self.em = em = _Emitter(torch, ep, input_names, train_mode)
        for n in list(input_names.values()) + list(out_names):
            em.used.add(n)
        self.input_names, self.out_names = input_names, out_names
        self.specs = {s.arg.name: s for s in self.sig.input_specs if hasattr(s.arg, "name")}
        self.state = ep.state_dict
        self.consts = ep.constants
        self.inputs_decl, self.params_decl, self.buffers_decl = [], [], []
        self.user_i = 0
        self.gm = ep.graph_module
        self.updates = {}   # buffer name -> its new value
        self.outputs = []   # the output lines
        self.strip_prefix = strip_prefix
        self.order = {n: i for i, n in enumerate(self.gm.graph.nodes)}

    def run(self):
        em = self.em
        # hand-written attention: its nodes are put off, and the last one writes one attention op
        self.attention, self.deferred = find_attention(em, self.gm.graph, _NO_RESULT | _SHAPE_ONLY)
        for node in self.gm.graph.nodes:
            em.node = node
            if node.op == "placeholder":
                self.placeholder(node)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.output(node)

    def text(self, module_name):
        em = self.em
        text = [f"module {_ir_name(module_name)}", "# exported from PyTorch by tfuse.export; weights in the .safetensors "
                "beside this file (tfuse run --params)", ""]
        text += self.inputs_decl + [""] + self.params_decl + self.buffers_decl + em.decls + [""] + em.lines + [""] + \
            self.outputs
        if self.updates:
            text += [""] + [f"update {b} = {v.name if isinstance(v, _Val) else v}" for b, v in self.updates.items()]
        return "\n".join(text) + "\n"

    def tname(self, target):
        p = self.strip_prefix
        return target[len(p):] if p and target.startswith(p) else target

    # -- the graph's inputs
    def placeholder(self, node):
        InputKind, em = self.InputKind, self.em
        spec = self.specs.get(node.name)
        kind = spec.kind if spec is not None else InputKind.USER_INPUT
        if kind == InputKind.USER_INPUT:
            self.user_input(node)
        elif kind in (InputKind.PARAMETER, InputKind.BUFFER):
            self.state_tensor(node, spec, kind)
        elif kind == InputKind.CONSTANT_TENSOR:
            em.env[node] = ("const", self.consts[spec.target])
        else:
            em.fail(f"an input of kind {kind}")

    def user_input(self, node):
        """A forward argument (or a loss_fn target): an `input`, or a constant when it is no tensor."""
        em = self.em
        val = node.meta.get("val")
        if not isinstance(val, self.torch.Tensor):
            em.env[node] = ("const", val)
            return
        nm = list(self.input_names.values())[self.user_i]
        self.user_i += 1
        d = em.dt(val.dtype)
        self.inputs_decl.append(f"input  {nm} : {d}[{', '.join(str(int(s)) for s in val.shape)}]")
        em.env[node] = _Val(nm, tuple(int(s) for s in val.shape), d)

    def state_tensor(self, node, spec, kind):
        """A param or buffer: a `param` (trainable) or `buffer` with its value,
        a linear layer's weight stored [in, out]; a non-persistent buffer is
        a constant."""
        em, InputKind, torch = self.em, self.InputKind, self.torch
        state, consts = self.state, self.consts
        t = state.get(spec.target) if spec.target in state else consts.get(spec.target)
        persistent = kind == InputKind.PARAMETER or spec.persistent is not False
        if t is None or not persistent:
            if t is None:
                em.fail(f"no value for {spec.target}")
            if spec.target in {s.target for s in self.sig.output_specs if s.kind == self.OutputKind.BUFFER_MUTATION}:
                em.fail(f"a non-persistent buffer {spec.target} that the model changes")
            em.env[node] = ("const", t.detach())
            return
        d = em.dt(t.dtype)
        trainable = kind == InputKind.PARAMETER and t.requires_grad and d in ("f32", "f16", "bf16", "f64")
        transposed = kind == InputKind.PARAMETER and t.dim() == 2 and _linear_uses_only(torch, node)
        arr = t.detach().cpu()
        if transposed:
            arr = arr.t()
        arr = arr.contiguous()
        if d == "bf16":
            em.fail(f"{spec.target} is bf16 (export the module in float32)")
        nm = em.uniq(self.tname(spec.target))
        shape = tuple(int(s) for s in arr.shape)
        decl = f"{'param ' if trainable else 'buffer'} {nm} : {d}[{', '.join(str(s) for s in shape)}]"
        (self.params_decl if trainable else self.buffers_decl).append(decl)
        em.params[nm] = arr.numpy().astype(_NP_OF[d])
        em.layout[nm] = (self.tname(spec.target), transposed)
        em.env[node] = _Val(nm, shape, d)
        if transposed:
            em.transposed.add(node)

    # -- an op
    def call(self, node):
        em, torch = self.em, self.torch
        if node in self.deferred:
            return   # part of an attention: its last node decides
        plan = self.attention.get(node)
        if plan is not None:
            res = emit_plan(em, plan)
            if res is not None:
                em.check(node, res)
                em.env[node] = res
                return
            for n in plan.deferred:   # not expressible after all: the nodes put off, one by one
                self.deferred.discard(n)
                em.node = n
                self.call(n)
            em.node = node
        name = _packet(node.target)
        if name == "wrap_with_autocast":   # a torch.autocast region: its subgraph, inline
            self.autocast(node)
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
            self.write_back(node, res)

    def write_back(self, node, value):
        """An in-place op's result is the new value of the tensor it wrote;
        the write reaches the view's base, and its base's, ..."""
        em = self.em
        target = node.args[0]
        while True:
            if target.op == "placeholder":   # state the model changes: a buffer's update
                spec = self.specs.get(target.name)
                if spec is None or spec.kind != self.InputKind.BUFFER or not isinstance(em.env.get(target), _Val):
                    em.fail("an in-place change of an input or a param (tfuse models change only buffers)")
                self.updates[em.env[target].name] = value
            em.env[target] = value
            if target not in em.views:
                break
            base, kind, vnode = em.views[target]
            if any(b is base and v is not vnode and self.used_after(v, node) for v, (b, _, _) in em.views.items()):
                em.fail(f"an in-place write through {kind} into a tensor that another of its views reads later "
                        "(tfuse computes views as values: write into the tensor itself, or clone() the view)")
            if not self.read_later(base, node):
                break   # nothing reads the base again (a dropout_ on a flatten of a pooled map): nothing to carry
            value = _unview(em, base, kind, vnode, value)
            target = base

    def read_later(self, v, node):
        """Whether anything reads v (or, v a view, what it views) after node:
        a later user, or a placeholder's state. Unknown order (a subgraph's
        node): yes."""
        order, em = self.order, self.em
        if v.op == "placeholder" or node not in order:
            return True
        if any(order.get(u, len(order)) > order[node] for u in v.users):
            return True
        return v in em.views and self.read_later(em.views[v][0], node)

    def used_after(self, v, node):
        """Whether v, or a view of v, is read after node."""
        order = self.order
        if node not in order or any(order.get(u, len(order)) > order[node] for u in v.users):
            return True
        return any(b is v and self.used_after(w, node) for w, (b, _, _) in self.em.views.items())

    def autocast(self, node):
        """torch.autocast(device, dtype, enabled) around part of the forward:
        torch.export keeps it as a subgraph. Disabled (timm's EfficientViT
        keeps its attention in float32 so), or for another device than the
        CPU the model was traced on, it changes nothing there: its ops are
        the model's. Enabled on the CPU, it would compute in a narrower
        dtype, which tfuse chooses itself: refused."""
        em, torch = self.em, self.torch
        device, dtype, enabled = node.args[:3]
        if enabled and device == "cpu":
            em.fail(f"code under torch.autocast(\"cpu\", dtype={dtype}): tfuse chooses its precision itself "
                    "(tfuse.compile(..., precision=\"bf16\")); export the model without autocast")
        sub = getattr(self.gm, node.args[4].target)
        operands = list(node.args[5:])
        for n in sub.graph.nodes:
            em.node = n
            if n.op == "placeholder":
                o = operands.pop(0)
                em.env[n] = em.env[o] if isinstance(o, torch.fx.Node) else ("const", o)
            elif n.op == "call_function":
                self.call(n)
            elif n.op == "output":
                em.env[node] = [em.env[x] if isinstance(x, torch.fx.Node) else ("const", x) for x in n.args[0]]
            else:
                em.fail(f"a {n.op} node inside a torch.autocast region")
        em.node = node

    # -- the graph's outputs
    def output(self, node):
        """The user's outputs become `output` lines; a buffer the model
        changes, an `update` (batchnorm's statistics excepted: tfuse's
        batchnorm moves them itself)."""
        em, torch, OutputKind, specs = self.em, self.torch, self.OutputKind, self.specs
        outs = node.args[0]
        user = []
        for spec, o in zip(self.sig.output_specs, outs):
            if spec.kind == OutputKind.USER_OUTPUT:
                user.append(o)
            elif spec.kind == OutputKind.BUFFER_MUTATION:
                bnode = next(n for n in self.gm.graph.nodes if n.op == "placeholder" and n.name in specs and
                             specs[n.name].target == spec.target)
                if bnode in em.bn_buffers:
                    continue   # tfuse's batchnorm moves its running statistics itself (train mode)
                self.updates[em.env[bnode].name] = em.val(o)
            else:
                em.node = None
                raise ExportError(f"error: cannot export a model whose graph has a {spec.kind} output "
                                  f"({spec.target}): tfuse models change only their buffers")
        for nm, o in zip(self.out_names, user):
            if o is None:
                continue
            v = em.val(o) if isinstance(o, torch.fx.Node) else None
            if v is None or not isinstance(v, _Val):
                em.fail(f"output {nm} is not a tensor the model computes")
            self.outputs.append(f"output {nm}" if v.name == nm else f"output {nm} = {v.name}")


def _graph_to_ir(torch, ep, input_names, out_names, module_name, train_mode, strip_prefix=""):
    """An exported program as tfuse IR: (its _Emitter, the .ir text)."""
    walk = _GraphWalk(torch, ep, input_names, out_names, train_mode, strip_prefix)
    walk.run()
    return walk.em, walk.text(module_name)


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
    follows that dim (labels follow the batch). How: _export_dynamic.py.
    """
    _check_train_args(loss_fn, optimizer, scheduler)
    try:
        return _export(module, example_inputs, loss_fn, optimizer, scheduler, targets, name, dynamic_shapes)
    except ExportError:
        raise
    except Exception as e:   # noqa: BLE001 -- never a bare traceback from inside tfuse
        raise ExportError(f"error: tfuse.export failed on {type(module).__name__} ({type(e).__name__}: {e}); this is "
                          "a bug in tfuse, please report it with the model") from e


def _check_train_args(loss_fn, optimizer, scheduler):
    """The train block's arguments are what export takes, or a usage error that says what it wants."""
    torch = _torch()
    if loss_fn is not None and not callable(loss_fn):
        raise ExportError(f"error: loss_fn={loss_fn!r}: expected a function (outputs, *targets) -> scalar loss, "
                          "e.g. torch.nn.functional.cross_entropy")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ExportError(f"error: optimizer={optimizer!r}: expected a torch.optim optimizer over the module's params "
                          "(SGD, Adam or AdamW), e.g. torch.optim.AdamW(model.parameters(), lr=1e-3)")
    sched_types = tuple(t for t in (getattr(torch.optim.lr_scheduler, n, None) for n in ("LRScheduler", "_LRScheduler"))
                        if t is not None)
    if scheduler is not None and not isinstance(scheduler, sched_types):
        raise ExportError(f"error: scheduler={scheduler!r}: expected a torch.optim.lr_scheduler of the optimizer "
                          "(StepLR, CosineAnnealingLR or OneCycleLR)")


def _export(module, example_inputs, loss_fn, optimizer, scheduler, targets, name, dynamic_shapes):
    targets = tuple(targets) if isinstance(targets, (list, tuple)) else (targets,)
    ex, em = _export_at(module, example_inputs, loss_fn, optimizer, scheduler, targets, name)
    if dynamic_shapes is None:
        return ex
    return _dynamic(module, example_inputs, loss_fn, optimizer, scheduler, targets, name, dynamic_shapes, ex, em,
                    _export_at)


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
        for p, t in zip(_loss_arg_names(torch, loss_fn, len(targets)), targets):
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
