"""tfuse.export's op handlers for the ops that move, pick or overwrite
values rather than compute new ones: views and copies; concat, slices and
splits; padding, and the fills, shifts and cumsum written with it; indexing
and gather; and the in-place writes through views, which export.py's walk
carries back to the tensor viewed. _export_ops.py has the ops that compute,
and builds on the helpers here (_pad_list)."""
import numpy as np

from ._export_emit import _OPS, _Val, _axis, _op, _packet, _shape


# ---- views and copies

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


# ---- concat, slices and splits

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


# ---- padding (ceil-mode pooling's too), fills, cumsum, roll: decompositions
# into slices, concats and constants, whose gradients tfuse already has

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


# ---- indexing and gather

@_op("index")
def _index(em, a):
    idx = list(a["indices"])
    return _index_many(em, em.val(a["self"]), idx, [i for i, t in enumerate(idx) if t is not None])


_OUT_OF_ANY_TABLE = 2 ** 52   # past any table's rows (a tensor has at most 2^48 elements), plus any other part's


def _flat_index(em, parts, shape, hint):
    """sum_j idx_j * stride_j over index operands broadcast to `shape`, an i64
    tensor of row numbers into a table. parts: (index, size,
    stride), the index a torch tensor (known now) or a _Val. Negative indices
    count from the end, as in PyTorch. One out of [-size, size) is refused
    now when known, and otherwise sends the sum past any table
    (_OUT_OF_ANY_TABLE, not the table's row count: a number that does not
    move with a dynamic dim), so that gather stops with its range error instead of
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
    flat = _flat_index(em, list(zip(ops, usizes, strides)), B, "flat")
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
    flat = _flat_index(em, parts, ishape, "flat")
    g = em.emit("gather", [flat, em.reshape(x, (rows, 1))], shape=ishape + (1,), dtype=x.dtype, name=em.node.name + ".g")
    return em.reshape(g, _shape(em.meta_val()))


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
