"""tfuse.export's attention: F.scaled_dot_product_attention, and attention
as models write it by hand, each as one `attention` op (docs/ir.md), which
tfuse compiles into one fused kernel (flash_attention) unless
--attention=decomposed.

emit_attention writes the op from q, k, v and the mask terms (_Masks, which
folds constant terms, finds the causal mask among them, and combines the
rest into the op's one mask operand); _export_ops.py's _sdpa maps
scaled_dot_product_attention onto it, argument for argument.

Attention written by hand is found before the walk, by a pass over the
ATen graph (find_attention), from each softmax over the last axis:

    softmax(q' @ k'^T <steps>, dim=-1) <casts, views, one dropout> @ v

q' and k' are q and k, possibly times or over a number (the scale put on q
or k before the product); k'^T is a transpose or permute of the last two
axes (or any [.., D, Tk] tensor, transposed back); the products are matmul,
bmm, einsum ("bhid,bhjd->bhij", "bhij,bhjd->bhid"), the first also
baddbmm (BLOOM: its bias a step). k and v may be HF's repeat_kv (unsqueeze,
expand, reshape) or repeat_interleave over the heads axis: the tensors with
fewer heads are taken (grouped-query attention). The steps between the
product and the softmax, in any order and number: a multiplication or
division by a number (the scale), an added tensor (a float mask, a position
bias: additive), masked_fill(mask, value) and torch.where(cond, scores,
value) with value -inf or a huge negative such as torch.finfo(dtype).min,
casts, copies, and views of the leading axes (Swin's windows split to add
its shift mask, BLOOM's [B*H, T, T] viewed as [B, H, T, T]). Every node
from the first product to the last has its one user in the pattern (a
probability or score the model also returns, or reads elsewhere, keeps the
op-by-op mapping), and nothing the pattern reads is written in place
between them.

The walk puts the matched nodes off when it meets them; at the last
product, emit_plan writes the `attention` op, or, when what the pattern
holds turns out not to be expressible (a scale that is a computed tensor,
a fill value like -1e4 that does not swamp the scores), writes nothing and
returns None, and the walk then maps the nodes put off one by one, as it
would have.

Semantics: a fill with -inf is a bool mask (true: attend); with a huge
negative value, an additive mask of that value (score + value rounds to
value, as the fill gives: a row whose keys are all masked so comes out as
the fill's, the mean of v). A row whose keys are all masked with -inf is 0
in `attention`, as in PyTorch's scaled_dot_product_attention; a softmax
written by hand gives NaN there."""
import math

from ._export_emit import _Val, _axis, _num, _packet
from ._export_ops_layout import _SPLIT_VIEWS, _VIEWS, _perm_of

_CAST = {"to", "_to_copy", "type_as"}
_COPY = {"clone", "contiguous", "alias", "detach", "lift_fresh_copy"}
_TRANSPOSE = {"t", "transpose", "permute", "swapaxes", "movedim"}
_MM = {"matmul", "bmm"}
_HUGE = -1e30   # a fill value at most this swamps any score: score + value rounds to value


# ---------------------------------------------------------------------------
# The shared emitter: q, k, v and mask terms -> one attention op

def _bshape(a, b):
    r = max(len(a), len(b))
    a, b = (1,) * (r - len(a)) + tuple(a), (1,) * (r - len(b)) + tuple(b)
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def _fits(shape, full):
    """shape broadcasts to full without growing it (dims 1 or equal, from the right)."""
    if len(shape) > len(full):
        return False
    return all(s == 1 or s == f for s, f in zip(reversed(shape), reversed(full)))


def _tdt(torch, d):
    return {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}.get(d,
                                                                                                         torch.float32)


def _causal_like(torch, b, Tq, Tk):
    """Whether bool tensor b (broadcast to [.., Tq, Tk]) is exactly the top-left causal mask."""
    if b.dim() < 2:
        return False
    tri = torch.ones(Tq, Tk, dtype=torch.bool).tril()
    try:
        return bool((b.expand(*b.shape[:-2], Tq, Tk) == tri).all())
    except RuntimeError:
        return False


def _as_bool_mask(torch, t):
    """A float mask whose entries are all 0 or -inf as the bool mask it is (true: attend), else None."""
    if t.dtype == torch.bool:
        return t
    if not t.is_floating_point():
        return None
    if bool(((t == 0) | (t == float("-inf"))).all()):
        return t == 0
    return None


class _Masks:
    """The mask terms of one attention, combined into one operand."""

    def __init__(self, em, full, sdt, base):
        self.em, self.full, self.sdt, self.base = em, tuple(full), sdt, base
        self.torch = em.torch
        self.causal = False
        self.cbool, self.cadd = None, None   # constant terms, folded here
        self.bools, self.adds = [], []       # _Vals: bool (true: attend) and additive

    def ok(self, shape):
        return _fits(tuple(int(s) for s in shape), self.full)

    def const_bool(self, b):
        torch, Tq, Tk = self.torch, self.full[-2], self.full[-1]
        if bool(b.all()):
            return
        if _causal_like(torch, b, Tq, Tk):
            self.causal = True
            return
        self.cbool = b if self.cbool is None else (self.cbool & b)

    def const_add(self, a):
        torch, Tq, Tk = self.torch, self.full[-2], self.full[-1]
        if not a.is_floating_point():
            a = a.to(_tdt(torch, self.sdt))
        if bool((a == 0).all()):
            return
        b = _as_bool_mask(torch, a)
        if b is not None:
            self.const_bool(b)
            return
        # 0 where attended and at most _HUGE elsewhere, in the causal pattern: causal (no row is then empty, so
        # the huge value's uniform row never shows)
        if bool(((a == 0) | (a <= _HUGE)).all()) and _causal_like(torch, a == 0, Tq, Tk):
            self.causal = True
            return
        self.cadd = a if self.cadd is None else (self.cadd + a)

    def bool_val(self, v):
        self.bools.append(self.em.cast(v, "bool"))

    def add_val(self, v):
        if v.dtype not in ("f32", "f64", "f16", "bf16"):
            v = self.em.cast(v, self.sdt)
        self.adds.append(v)

    def _emit(self, op, operands, shape, dtype, hint):
        return self.em.emit(op, operands, shape=shape, dtype=dtype, name=f"{self.base}.{hint}")

    def _not(self, v):
        return self._emit("eq", [self.em.cast(v, "f32"), _num(0.0)], v.shape, "bool", "keep")

    def operand(self):
        """The combined mask (_Val), or None; self.causal set when a term was the causal mask."""
        em, torch = self.em, self.torch
        bools, adds = list(self.bools), list(self.adds)
        if self.cbool is not None and self.cadd is not None:   # both constant: one additive constant
            self.cadd = torch.where(self.cbool, self.cadd, float("-inf"))
            self.cbool = None
        if self.cbool is not None:
            if not bool(self.cbool.all()):
                bools.insert(0, em.const_val(self.cbool.contiguous(), hint=f"{self.base}.mask"))
        if self.cadd is not None:
            adds.insert(0, em.const_val(self.cadd.contiguous(), hint=f"{self.base}.bias"))
        b = None
        for v in bools:   # and: where(b, v, b)
            b = v if b is None else self._emit("where", [b, v, b], _bshape(b.shape, v.shape), "bool", "and")
        a = None
        for v in adds:
            if a is None:
                a = v
                continue
            order = ["bf16", "f16", "f32", "f64"]
            dt = max(a.dtype, v.dtype, key=order.index)
            a = self._emit("add", [em.cast(a, dt), em.cast(v, dt)], _bshape(a.shape, v.shape), dt, "sum")
        if a is not None and b is not None:
            a = self._emit("where", [b, a, "-inf"], _bshape(a.shape, b.shape), a.dtype, "masked")
        return a if a is not None else b


_AND = {"__and__", "bitwise_and", "logical_and"}
_SAME_MASK = {"expand", "alias", "clone", "contiguous", "detach", "lift_fresh_copy"}


def and_terms(em, node, full):
    """A bool mask node as the masks it ands together, through expand and copies: [fx node], or None when
    none of them is a constant that goes (all true) or is the causal mask (nothing to gain). HF builds
    its causal mask from arange (a constant) and ands the padding of attention_mask into it: the constant
    can then become causal=true, and the padding stays a [B, 1, 1, Tk] mask."""
    torch = em.torch
    fx = torch.fx

    def leaves(n):
        while isinstance(n, fx.Node) and n.op == "call_function" and _packet(n.target) in _SAME_MASK and \
                not em.is_const(n):
            n = n.args[0]
        if isinstance(n, fx.Node) and n.op == "call_function" and _packet(n.target) in _AND and \
                not em.is_const(n) and len(n.args) == 2 and all(isinstance(a, fx.Node) for a in n.args):
            return leaves(n.args[0]) + leaves(n.args[1])
        return [n]
    out = leaves(node)
    for n in out:
        mv = n.meta.get("val") if isinstance(n, fx.Node) else None
        if not isinstance(mv, torch.Tensor) or mv.dtype != torch.bool or \
                not _fits(tuple(int(s) for s in mv.shape), full):
            return None
        if not em.is_const(n) and not isinstance(em.env.get(n), _Val):
            return None
    gain = [n for n in out if em.is_const(n) and isinstance(em.const_of(n), torch.Tensor) and
            (bool(em.const_of(n).all()) or _causal_like(torch, em.const_of(n), full[-2], full[-1]))]
    return out if len(out) > 1 and gain else None


def _lead4(em, x, lead, hint):
    """x [*lead, T, D] as [B, H, T, D]: the leading axes but the last merged into one (none: 1)."""
    if len(lead) == 2:
        return x
    if not lead:
        shape = (1, 1) + tuple(x.shape[-2:])
    else:
        shape = (math.prod(lead[:-1]), lead[-1]) + tuple(x.shape[-2:])
    return em.emit("reshape", [x], {"shape": list(shape)}, shape=shape, dtype=x.dtype, name=f"{x.name}.{hint}")


def _mask4(em, m, lead, Tq, Tk, base):
    """A mask broadcasting to [*lead, Tq, Tk] as one of rank 1..4 broadcasting to [B, H, Tq, Tk] (_lead4's)."""
    full = tuple(lead) + (Tq, Tk)
    if len(m.shape) == 0:
        return em.reshape(m, (1,))
    if len(lead) <= 2:
        return m
    ms = (1,) * (len(full) - len(m.shape)) + tuple(m.shape)
    outer, H = ms[:len(lead) - 1], ms[len(lead) - 1]
    if all(s == 1 for s in outer):
        B = 1
    else:
        if any(s != f for s, f in zip(outer, lead[:-1])):   # part broadcast: make it whole
            want = tuple(lead[:-1]) + ms[len(lead) - 1:]
            m = em.emit("broadcast", [em.reshape(m, ms)], {"shape": list(want)}, shape=want, dtype=m.dtype,
                        name=f"{base}.mask_b")
        B = math.prod(lead[:-1])
    shape = (B, H) + ms[-2:]
    return em.emit("reshape", [m], {"shape": list(shape)}, shape=shape, dtype=m.dtype, name=f"{base}.mask4")


def check_attention(q, k, v, dropout=0.0):
    """None when shapes q [*lead, Tq, D], k [*klead, Tk, D], v [*klead, Tk, Dv] make an attention (klead:
    lead, or broadcasting to it, or with fewer heads in its last axis, a divisor of q's), else why not."""
    lead, D = tuple(q[:-2]), q[-1]
    Tk = k[-2]
    if k[-1] != D or v[-2] != Tk:
        return f"attention shapes do not agree: q {list(q)}, k {list(k)}, v {list(v)}"
    if len(k) > len(q) or len(v) > len(q):
        return f"k {list(k)} or v {list(v)} has more leading axes than q {list(q)}"
    klead = (1,) * (len(q) - len(k)) + tuple(k[:-2])
    vlead = (1,) * (len(q) - len(v)) + tuple(v[:-2])
    if lead:
        if vlead[-1] != klead[-1]:
            return f"k {list(k)} and v {list(v)} have different numbers of heads"
        if lead[-1] % klead[-1]:
            return (f"q has {lead[-1]} heads and k, v {klead[-1]}: the query heads must be a multiple of the "
                    "key/value heads")
    for kl, vl, ql in zip(klead[:-1], vlead[:-1], lead[:-1]):
        if kl not in (1, ql) or vl not in (1, ql):
            return f"k {list(k)} and v {list(v)} do not broadcast to q {list(q)}"
    if dropout > 0.999:
        return f"dropout p={dropout} on the attention probabilities (tfuse's is below 1)"
    return None


def emit_attention(em, q, k, v, masks, scale=None, dropout=0.0, out_dtype=None):
    """The attention op of q, k, v (_Vals, check_attention's shapes) and a _Masks; returns its result
    [*lead, Tq, Dv] (_Val): an attention over [B, H, T, D] (the leading axes but the last merged into B),
    reshaped back."""
    lead, Tq, D = tuple(q.shape[:-2]), q.shape[-2], q.shape[-1]
    Tk, Dv = k.shape[-2], v.shape[-1]
    base = masks.base
    k, v = em.cast(k, q.dtype), em.cast(v, q.dtype)
    if lead:   # the batch axes (all but the heads) of k and v as q's: broadcast where they are 1
        Hk = k.shape[-3] if len(k.shape) > 2 else 1
        k = em.broadcast(k, lead[:-1] + (Hk, Tk, D))
        v = em.broadcast(v, lead[:-1] + (Hk, Tk, Dv))
        kvlead = lead[:-1] + (Hk,)
    else:
        kvlead = ()
    mask = masks.operand()
    q4, k4, v4 = _lead4(em, q, lead, "q4"), _lead4(em, k, kvlead, "k4"), _lead4(em, v, kvlead, "v4")
    operands = [q4, k4, v4]
    if mask is not None:
        operands.append(_mask4(em, mask, lead, Tq, Tk, base))
    attrs = {}
    if masks.causal:
        attrs["causal"] = True
    if scale is not None:
        attrs["scale"] = float(scale)
    if dropout > 0.0:
        em.dropouts += 1
        attrs["dropout"] = float(dropout)
        attrs["salt"] = em.dropouts
    shape4 = tuple(q4.shape[:2]) + (Tq, Dv)
    r = em.emit("attention", operands, attrs or None, shape=shape4, dtype=q.dtype,
                name=base if len(lead) == 2 else base + ".a4")
    if len(lead) != 2:
        r = em.emit("reshape", [r], {"shape": list(lead + (Tq, Dv))}, shape=lead + (Tq, Dv), dtype=q.dtype,
                    name=base)
    return em.cast(r, out_dtype) if out_dtype else r


# ---------------------------------------------------------------------------
# Attention written by hand: the pattern, found before the walk

_VIEW = {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "unsqueeze", "squeeze"}


class Plan:
    """One hand-written attention found in the graph: the nodes it spans and
    what emit_plan needs. The scores may change layout on the way (a view of
    their leading axes: BLOOM's [B*H, T, T] to [B, H, T, T], Swin's windows
    split to add its shift mask): the attention is computed in the layout of
    the softmax, full[:-2]; q and k come in qk_lead's, v and the result in
    pv_lead's, each step's operand in the step's own."""
    __slots__ = ("final", "deferred", "q", "k", "v", "k_t", "factors", "steps", "dropout", "full", "qk_lead",
                 "pv_lead")

    def __init__(self):
        self.factors = []   # (operand, divide): what q @ k^T is multiplied (divided) by
        # the steps, in order: ("scale", operand, divide, lead), ("qscale", operand, divide, lead) (a tensor
        # factor, put on q), ("add", operand, coef, lead), ("fill", mask, value, keep, lead)
        self.steps = []
        self.dropout = 0.0
        self.k_t = False    # k is given as [.., D, Tk]: transpose it


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _same_rows(a, b):
    """a and b are one tensor's shapes before and after a view of its leading axes only."""
    return a is not None and b is not None and len(a) >= 2 and len(b) >= 2 and a[-2:] == b[-2:] and \
        math.prod(a) == math.prod(b)


class _Finder:
    def __init__(self, em, graph, ignore):
        self.em, self.torch = em, em.torch
        self.graph = graph
        self.ignore = ignore
        self.nodes = list(graph.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}

    def users(self, n):
        """n's users that read its values: not the asserts on its metadata, the ops that take only its shape
        (ignore), or type_as(x, n), which takes its dtype."""
        def reads(u):
            if u.op != "call_function":
                return True
            name = _packet(u.target)
            return name not in self.ignore and not (name == "type_as" and u.args[0] is not n)
        return [u for u in n.users if reads(u)]

    def one_user(self, n):
        return len(self.users(n)) == 1

    def shape(self, n):
        mv = n.meta.get("val") if hasattr(n, "meta") else None
        if mv is None or not isinstance(mv, self.torch.Tensor):
            return None
        return tuple(int(s) for s in mv.shape)

    def dtype(self, n):
        mv = n.meta.get("val")
        return mv.dtype if isinstance(mv, self.torch.Tensor) else None

    def call(self, n, *names):
        return isinstance(n, self.torch.fx.Node) and n.op == "call_function" and _packet(n.target) in names

    def scalar(self, o):
        """A number, or a node of one element (constant or not: emit_plan decides)."""
        if _is_number(o):
            return math.isfinite(o)
        if isinstance(o, self.torch.fx.Node):
            s = self.shape(o)
            return s is not None and math.prod(s) == 1
        return False

    # -- the whole pattern, from a softmax
    def at_softmax(self, sm):
        em = self.em
        shape = self.shape(sm)
        if shape is None or len(shape) < 2:
            return None
        a = em.bind(sm)
        if _axis(a["dim"], len(shape)) != len(shape) - 1:
            return None
        plan = Plan()
        plan.full = shape
        mid = [sm]
        # forward: casts, copies, views, a dropout, then the product with v
        cur, cs = sm, shape
        while True:
            us = self.users(cur)
            if len(us) != 1 or us[0].op != "call_function":
                return None
            u = us[0]
            name = _packet(u.target)
            if u.args and u.args[0] is cur and name in _CAST | _COPY | _VIEW | {"dropout", "dropout_"}:
                s = self.shape(u)
                if name in _VIEW:
                    if not _same_rows(s, cs):
                        return None
                    cs = s
                elif s != cs:
                    return None
                if name in ("dropout", "dropout_"):
                    b = em.bind(u)
                    p = b.get("p", 0.5)
                    if not _is_number(p):
                        return None
                    if b.get("train", True) and p > 0:
                        if plan.dropout:
                            return None
                        plan.dropout = float(p)
                elif self.dtype(u) is None or not self.dtype(u).is_floating_point:
                    return None
                mid.append(u)
                cur = u
                continue
            if name in _MM and len(u.args) == 2 and u.args[0] is cur and u.args[1] is not cur:
                plan.final, plan.v = u, u.args[1]
                break
            if name == "einsum" and self.einsum_pv(u, cur):
                plan.final, plan.v = u, u.args[1][1]
                break
            return None
        plan.pv_lead = cs[:-2]
        # backward: the steps, down to q @ k^T
        if not self.back(sm.args[0], shape, plan, mid):
            return None
        plan.steps.reverse()
        # v: its repeat over the heads, taken off
        plan.v = self.strip_repeat(plan.v, mid)
        vs = self.shape(plan.v)
        if vs is None or len(vs) < 2 or vs[-2] != shape[-1]:
            return None
        if self.shape(plan.final) != cs[:-1] + (vs[-1],):
            return None
        if not self.unwritten(mid, plan.final):
            return None
        plan.deferred = sorted(set(mid), key=self.order.get)
        return plan

    def unwritten(self, mid, final):
        """Nothing that nodes mid (put off) and final read is written in place between the first of them and
        final (the walk reads their operands at final)."""
        first = min(self.order[n] for n in mid)
        midset = set(mid)
        read = {self.root(a) for n in mid + [final] for a in n.all_input_nodes if a not in midset}
        for n in self.nodes[first:self.order[final]]:
            if n in midset or n.op != "call_function" or not n.args or not isinstance(n.args[0], self.torch.fx.Node):
                continue
            nm = _packet(n.target)
            if nm == "detach_":
                continue
            if ((nm.endswith("_") and not nm.startswith("_")) or nm in ("copy_", "index_put_", "_index_put_impl_")) \
                    and self.root(n.args[0]) in read:
                return False
        return True

    def sdpa_kv(self, n):
        """For a scaled_dot_product_attention node whose k and v are both repeated over the heads (HF's
        repeat_kv before SDPA) and read only there: (k, v with fewer heads, the repeat nodes), else None."""
        b = self.em.bind(n)
        k, v, mid = b["key"], b["value"], []
        k2, v2 = self.strip_repeat(k, mid), self.strip_repeat(v, mid)
        if k2 is k or v2 is v or self.shape(k2)[-3] != self.shape(v2)[-3] or not self.unwritten(mid, n):
            return None
        return k2, v2, mid

    def root(self, n):
        """The tensor n is a view of (n itself when it is none)."""
        while isinstance(n, self.torch.fx.Node) and n.op == "call_function" and n.args and \
                isinstance(n.args[0], self.torch.fx.Node):
            nm = _packet(n.target)
            if nm.rstrip("_") in _VIEWS:
                n = n.args[0]
            elif nm == "getitem" and self.call(n.args[0], *_SPLIT_VIEWS):
                n = n.args[0].args[0]
            else:
                break
        return n

    def einsum_pv(self, u, p):
        eq, ops = u.args[0], u.args[1] if len(u.args) > 1 else None
        if not isinstance(eq, str) or not isinstance(ops, (list, tuple)) or len(ops) != 2 or ops[0] is not p \
                or ops[1] is p:
            return False
        t = self.einsum_terms(eq)
        if t is None:
            return False
        (a, b), o = t
        # P [L, x, z], V [L, z, w] -> [L, x, w]
        return len(a) >= 2 and a[:-2] == b[:-2] == o[:-2] and a[-1] == b[-2] and o[-2] == a[-2] and \
            o[-1] == b[-1] and len({a[-2], a[-1], b[-1]}) == 3 and not set(a[:-2]) & {a[-2], a[-1], b[-1]}

    def einsum_qk(self, u):
        eq, ops = u.args[0], u.args[1] if len(u.args) > 1 else None
        if not isinstance(eq, str) or not isinstance(ops, (list, tuple)) or len(ops) != 2:
            return False
        t = self.einsum_terms(eq)
        if t is None:
            return False
        (a, b), o = t
        # Q [L, x, y], K [L, z, y] -> [L, x, z]
        return len(a) >= 2 and a[:-2] == b[:-2] == o[:-2] and a[-1] == b[-1] and o[-2] == a[-2] and \
            o[-1] == b[-2] and len({a[-2], a[-1], b[-2]}) == 3 and not set(a[:-2]) & {a[-2], a[-1], b[-2]}

    @staticmethod
    def einsum_terms(eq):
        eq = eq.replace(" ", "")
        if "->" not in eq:
            return None
        ins, out = eq.split("->")
        ins = ins.split(",")
        if len(ins) != 2:
            return None

        def toks(s):
            if s.startswith("..."):
                return ("...",) + tuple(s[3:])
            return None if "." in s else tuple(s)
        ts = [toks(s) for s in ins + [out]]
        if any(t is None for t in ts) or any(len(set(t)) != len(t) for t in ts):
            return None
        return (ts[0], ts[1]), ts[2]

    def back(self, x, shape, plan, mid):
        """The score chain from x (shape `shape`) down to the q @ k^T product: True when it is one, plan.steps
        then in reverse order and mid with its nodes."""
        if not isinstance(x, self.torch.fx.Node) or x.op != "call_function" or not self.one_user(x):
            return False
        if self.shape(x) != shape:
            return False
        name = _packet(x.target)
        if name in _MM or name in ("einsum", "baddbmm"):
            return self.product(x, shape, plan, mid)
        saved = len(plan.steps), len(mid), len(plan.factors)
        lead = shape[:-2]

        def attempt(chain, step, chain_shape=shape, extra=()):
            if step is not None:
                plan.steps.append(step + (lead,))
            mid.append(x)
            mid.extend(extra)
            if self.back(chain, chain_shape, plan, mid):
                return True
            del plan.steps[saved[0]:]
            del mid[saved[1]:]
            del plan.factors[saved[2]:]
            return False

        args = x.args
        if name in _CAST | _COPY:
            dt = self.dtype(x)
            return dt is not None and dt.is_floating_point and attempt(args[0], None)
        if name in _VIEW:
            ss = self.shape(args[0]) if isinstance(args[0], self.torch.fx.Node) else None
            return _same_rows(ss, shape) and attempt(args[0], None, ss)
        if name in ("mul", "mul_", "div", "div_") and len(args) == 2:
            orders = ((args[0], args[1]),) if name.startswith("div") else ((args[0], args[1]), (args[1], args[0]))
            for chain, other in orders:
                if self.scalar(other) and attempt(chain, ("scale", other, name.startswith("div"))):
                    return True
                # a tensor the same along the last two axes (a learned per-head scale, [H, 1, 1]): on q instead
                os_ = self.shape(other) if isinstance(other, self.torch.fx.Node) else None
                if name.startswith("mul") and os_ is not None and _fits(os_, shape[:-2] + (1, 1)) and \
                        attempt(chain, ("qscale", other, False)):
                    return True
            return False
        if name in ("add", "add_") and len(args) == 2:
            b = self.em.bind(x)
            if b.get("alpha", 1) != 1:
                return False
            for chain, other in ((args[0], args[1]), (args[1], args[0])):
                if _is_number(other):
                    if math.isfinite(other) and attempt(chain, None):   # softmax(x + c) = softmax(x)
                        return True
                    continue
                os_ = self.shape(other)
                if os_ is not None and _fits(os_, shape) and attempt(chain, ("add", other, 1.0)):
                    return True
            return False
        if name in ("masked_fill", "masked_fill_") and len(args) == 3:
            ms = self.shape(args[1])
            if ms is None or not _fits(ms, shape) or not (self.scalar(args[2]) or _is_number(args[2])):
                return False
            m, keep, extra = self.unnot(args[1], x, False)
            return attempt(args[0], ("fill", m, args[2], keep), extra=extra)
        if name == "where" and len(args) == 3:
            c, a, b = args
            cs = self.shape(c)
            if cs is None or not _fits(cs, shape):
                return False
            for chain, val, keep in ((a, b, True), (b, a, False)):
                m, keep, extra = self.unnot(c, x, keep)
                if self.fill_value(val) and attempt(chain, ("fill", m, val, keep), extra=extra):
                    return True
            return False
        return False

    def unnot(self, m, user, keep):
        """A fill's mask m = ~t (bitwise_not / logical_not of a bool t) read only by user: (t, not keep, [m]);
        else (m, keep, [])."""
        if self.call(m, "bitwise_not", "logical_not") and self.users(m) == [user] and \
                self.dtype(m) == self.torch.bool and self.dtype(m.args[0]) == self.torch.bool:
            return m.args[0], not keep, [m]
        return m, keep, []

    def fill_value(self, o):
        """A number, or a node whose every element may be one value (a full constant: emit_plan checks)."""
        if _is_number(o):
            return True
        return isinstance(o, self.torch.fx.Node) and self.shape(o) is not None

    def product(self, x, shape, plan, mid):
        """x = q' @ k'^T (matmul, bmm, einsum; baddbmm: beta * bias + alpha * q @ k^T): plan.q, plan.k (and
        k_t), the scales taken off q and k."""
        mid.append(x)
        plan.k_t = False
        name = _packet(x.target)
        if name == "einsum":
            if not self.einsum_qk(x):
                return False
            A, B = x.args[1]
        elif name == "baddbmm":
            b = self.em.bind(x)
            beta, alpha = b.get("beta", 1), b.get("alpha", 1)
            bias = b["self"]
            if not (_is_number(beta) and _is_number(alpha)) or not isinstance(bias, self.torch.fx.Node) or \
                    not _fits(self.shape(bias) or (0,) * 9, shape):
                return False
            A, B = b["batch1"], b["batch2"]
            if alpha != 1:
                plan.factors.append((alpha, False))
            if beta != 0:
                plan.steps.append(("add", bias, float(beta), shape[:-2]))
        else:
            if len(x.args) != 2:
                return False
            A, B = x.args
        plan.q = self.strip_scale(A, plan, mid)
        B = self.strip_scale(B, plan, mid)
        if name == "einsum":
            plan.k = self.strip_repeat(B, mid)
        else:
            bs = self.shape(B)
            if bs is None or len(bs) < 2:
                return False
            if self.swaps_last_two(B) and self.one_user(B):
                mid.append(B)
                plan.k = self.strip_repeat(self.strip_scale(B.args[0], plan, mid), mid)
            else:
                plan.k, plan.k_t = B, True
        qs, ks = self.shape(plan.q), self.shape(plan.k)
        if qs is None or ks is None or len(qs) != len(shape) or qs[:-1] != shape[:-1]:
            return False
        kk = ks if not plan.k_t else ks[:-2] + (ks[-1], ks[-2])
        plan.qk_lead = shape[:-2]
        return len(kk) >= 2 and kk[-2] == shape[-1] and kk[-1] == qs[-1]

    def swaps_last_two(self, n):
        if not self.call(n, *_TRANSPOSE):
            return False
        s = self.shape(n)
        if s is None:
            return False
        r = len(s)
        try:
            perm = _perm_of(_packet(n.target), self.em.bind(n), r)
        except (TypeError, ValueError, KeyError):
            return False
        return r >= 2 and perm == list(range(r - 2)) + [r - 1, r - 2]

    def strip_scale(self, n, plan, mid):
        """n = t * c or t / c (c a number) with n read only here: t, c kept as a factor of the scale."""
        while self.call(n, "mul", "div") and len(n.args) == 2 and self.one_user(n):
            a, b = n.args
            div = _packet(n.target) == "div"
            if self.scalar(b) and isinstance(a, self.torch.fx.Node) and self.shape(a) == self.shape(n):
                t, c = a, b
            elif not div and self.scalar(a) and isinstance(b, self.torch.fx.Node) and self.shape(b) == self.shape(n):
                t, c = b, a
            else:
                break
            plan.factors.append((c, div))
            mid.append(n)
            n = t
        return n

    def strip_repeat(self, n, mid):
        """k or v repeated over the heads axis (axis -3) for grouped-query attention, read only here: the
        tensor with fewer heads. HF's repeat_kv (x[:, :, None].expand(B, Hk, G, T, D).reshape(B, Hk*G, T, D))
        and x.repeat_interleave(G, dim=-3)."""
        s = self.shape(n)
        if s is None or len(s) < 3 or not self.one_user(n):
            return n
        if self.call(n, "repeat_interleave") and len(n.args) >= 2 and isinstance(n.args[0], self.torch.fx.Node):
            b = self.em.bind(n)
            src = n.args[0]
            ss = self.shape(src)
            if _is_number(b.get("repeats")) and b.get("dim") is not None and ss is not None and \
                    len(ss) == len(s) and _axis(b["dim"], len(s)) == len(s) - 3:
                mid.append(n)
                return src
            return n
        if self.call(n, "view", "reshape", "_unsafe_view") and self.call(n.args[0], "expand") and \
                self.one_user(n.args[0]):
            e = n.args[0]
            es = self.shape(e)
            u = e.args[0]
            us = self.shape(u) if isinstance(u, self.torch.fx.Node) else None
            if es is None or us is None or len(es) != len(s) + 1 or len(us) != len(es) or us[-3] != 1:
                return n
            # u [.., Hk, 1, T, D] -> e [.., Hk, G, T, D] -> n [.., Hk * G, T, D]
            if es[:-4] + (es[-4] * es[-3],) + es[-2:] != s or us[:-3] != es[:-3] or us[-2:] != es[-2:]:
                return n
            if self.call(u, "unsqueeze") and self.one_user(u) and _axis(u.args[1], len(us)) == len(us) - 3:
                mid.extend([n, e, u])
                return u.args[0]
        return n


def find_attention(em, graph, ignore):
    """{last node (the product with v): Plan} for the hand-written attentions of graph, and the nodes the walk
    puts off (the plans', and the repeats of k and v before a scaled_dot_product_attention: em.attention_kv
    has their sources). ignore: the ops whose use of a tensor does not read its values (asserts on its
    metadata, ops that take its shape: the walk needs no value of a node put off for them)."""
    f = _Finder(em, graph, ignore)
    plans = {}
    taken = set()
    for n in graph.nodes:
        if n.op == "call_function" and _packet(n.target) == "scaled_dot_product_attention":
            try:
                kv = f.sdpa_kv(n)
            except Exception:   # noqa: BLE001 -- an odd graph: k and v as they come
                kv = None
            if kv is not None and not taken & set(kv[2]):
                em.attention_kv[n] = kv[:2]
                taken.update(kv[2])
        if n.op == "call_function" and _packet(n.target) in ("softmax", "_softmax"):
            try:
                p = f.at_softmax(n)
            except Exception:   # noqa: BLE001 -- an odd graph: no plan, the op-by-op mapping
                p = None
            if p is None or p.final in plans or p.final in taken or taken & set(p.deferred) or \
                    set(plans) & set(p.deferred):
                continue
            plans[p.final] = p
            taken.update(p.deferred)
    return plans, taken


def _number(em, o, all_equal=False):
    """o as a float: a number, or a constant tensor of one element (all_equal: of one value throughout)."""
    torch = em.torch
    if _is_number(o):
        return float(o)
    if isinstance(o, torch.fx.Node) and em.is_const(o):
        t = em.const_of(o)
        if _is_number(t):
            return float(t)
        if isinstance(t, torch.Tensor) and t.numel() >= 1 and t.dtype != torch.bool:
            if t.numel() == 1:
                return float(t.reshape(()))
            if all_equal:
                f = t.reshape(-1)[0]
                if bool((t == f).all()):
                    return float(f)
    return None


def _groups(A, B):
    """The axes of A and of B that hold the same elements when leading axes A are viewed as B:
    [(axes of A, axes of B)], or None."""
    if math.prod(A) != math.prod(B):
        return None
    out, i, j = [], 0, 0
    while i < len(A) or j < len(B):
        gi, gj, pa, pb = [], [], 1, 1
        if i < len(A):
            gi.append(i)
            pa *= A[i]
            i += 1
        if j < len(B):
            gj.append(j)
            pb *= B[j]
            j += 1
        while pa != pb:
            if pa < pb and i < len(A):
                gi.append(i)
                pa *= A[i]
                i += 1
            elif pb < pa and j < len(B):
                gj.append(j)
                pb *= B[j]
                j += 1
            else:
                return None
        out.append((gi, gj))
    return out


def _relead(shape, A, B):
    """An operand of shape `shape` broadcasting to [*A, r, c], as one broadcasting to [*B, r, c]: (the shape
    to broadcast it to first, the shape to view that as), or None. A group of axes that the view merges or
    splits stays 1 where the operand is 1 throughout it, else becomes whole."""
    g = _groups(tuple(A), tuple(B))
    if g is None:
        return None
    ms = (1,) * (len(A) + 2 - len(shape)) + tuple(shape)
    lead = ms[:-2]
    bshape, oshape = list(lead), [1] * len(B)
    for gi, gj in g:
        if any(lead[a] != 1 for a in gi):
            for a in gi:
                bshape[a] = A[a]
            for b in gj:
                oshape[b] = B[b]
    return tuple(bshape) + ms[-2:], tuple(oshape) + ms[-2:]


def _const_to_lead(em, t, A, B, hint):
    """A constant operand from leading axes A to B: a constant still when that only views it, else a
    buffer of it broadcast and viewed in the IR (a dynamic batch may be among the axes it grows along)."""
    if tuple(A) == tuple(B):
        return t
    bshape, oshape = _relead(tuple(t.shape), A, B)
    if bshape == (1,) * (len(bshape) - t.dim()) + tuple(t.shape):
        return t.reshape(oshape)
    return _to_lead(em, em.const_val(t.contiguous(), hint=hint), A, B, "r")


def _to_lead(em, o, A, B, hint):
    """_relead a _Val from leading axes A to B."""
    if tuple(A) == tuple(B):
        return o
    bshape, oshape = _relead(tuple(o.shape), A, B)
    o = em.broadcast(o, bshape)
    return em.emit("reshape", [o], {"shape": list(oshape)}, shape=oshape, dtype=o.dtype, name=f"{o.name}.{hint}")


def emit_plan(em, plan):
    """The attention op of a plan (em.node is plan.final), or None when what it holds is not expressible (and
    nothing is written then)."""
    torch = em.torch
    scale = 1.0
    qf = []   # factors that are no constant numbers: put on q
    for o, div in plan.factors:
        c = _number(em, o)
        if c is None:
            qf.append((o, div))
        elif c == 0 or not math.isfinite(c):
            return None
        else:
            scale = scale / c if div else scale * c
    steps = [("qscale",) + st[1:] if st[0] == "scale" and _number(em, st[1]) is None else st for st in plan.steps]
    q, k, v = em.val(plan.q), em.val(plan.k), em.val(plan.v)
    if not all(isinstance(t, _Val) for t in (q, k, v)):
        return None
    lead = plan.full[:-2]
    ks = k.shape[:-2] + (k.shape[-1], k.shape[-2]) if plan.k_t else k.shape
    qs, vs = q.shape, v.shape
    if plan.qk_lead != lead:   # q and k viewed into the softmax's layout: whole ones only
        if qs[:-2] != plan.qk_lead or ks[:-2] != plan.qk_lead or _groups(plan.qk_lead, lead) is None:
            return None
        qs, ks = lead + qs[-2:], lead + ks[-2:]
    if plan.pv_lead != lead:
        if vs[:-2] != plan.pv_lead or _groups(plan.pv_lead, lead) is None:
            return None
        vs = lead + vs[-2:]
    if check_attention(qs, ks, vs, plan.dropout) is not None:
        return None
    # what the steps hold, checked before anything is written
    for i, st in enumerate(steps):
        if st[-1] != lead and _groups(st[-1], lead) is None:
            return None
        if st[0] == "qscale":   # put on q: before any mask, in q's layout
            if any(t[0] not in ("scale", "qscale") for t in steps[:i]) or st[-1] != lead or plan.qk_lead != lead:
                return None
        elif st[0] == "scale":
            c = _number(em, st[1])
            if c is None or not (c > 0) or not math.isfinite(c):
                return None
        elif st[0] == "fill":
            val = _number(em, st[2], all_equal=True)
            if val is None or not (val == float("-inf") or val <= _HUGE):
                return None   # a fill that does not swamp the scores is not a mask: op by op
        elif em.is_const(st[1]) and not isinstance(em.const_of(st[1]), torch.Tensor):
            return None
    if plan.k_t:
        r = len(k.shape)
        perm = list(range(r - 2)) + [r - 1, r - 2]
        k = em.emit("transpose", [k], {"perm": perm}, shape=k.shape[:-2] + (k.shape[-1], k.shape[-2]), dtype=k.dtype,
                    name=f"{k.name}.t")
    q, k, v = em.reshape(q, qs), em.reshape(k, ks), em.reshape(v, vs)
    sdt = q.dtype
    base = em.node.name

    def on_q(q, o, div):
        f = em.cast(em.val(o), q.dtype)
        return em.emit("div" if div else "mul", [q, f], shape=q.shape, dtype=q.dtype, name=f"{q.name}.scaled")
    for o, div in qf:
        q = on_q(q, o, div)
    masks = _Masks(em, plan.full, sdt, base)
    terms = []   # [kind, operand, coef, extra, lead]
    for st in steps:
        if st[0] == "scale":
            c = _number(em, st[1])
            c = 1.0 / c if st[2] else c
            scale *= c
            for t in terms:
                t[2] *= c
        elif st[0] == "qscale":
            q = on_q(q, st[1], st[2])
        elif st[0] == "add":
            terms.append(["add", st[1], st[2], None, st[-1]])
        else:
            terms.append(["fill", st[1], 1.0, (_number(em, st[2], all_equal=True), st[3]), st[-1]])
    for kind, o, coef, extra, tlead in terms:
        if kind == "add":
            if em.is_const(o):
                t = em.const_of(o)
                if not t.is_floating_point():
                    t = t.to(_tdt(torch, sdt))
                t = _const_to_lead(em, t * coef if coef != 1 else t, tlead, lead, f"{base}.bias")
                (masks.const_add if isinstance(t, torch.Tensor) else masks.add_val)(t)
            else:
                mv = em.val(o)
                if mv.dtype not in ("f32", "f64", "f16", "bf16"):
                    mv = em.cast(mv, sdt)
                if coef != 1:
                    mv = em.emit("mul", [mv, _num(coef)], shape=mv.shape, dtype=mv.dtype, name=f"{base}.bias_s")
                masks.add_val(_to_lead(em, mv, tlead, lead, "bias4"))
            continue
        val, keep = extra
        val = float(torch.tensor(val * coef, dtype=_tdt(torch, sdt)))   # as the scores hold it (f64's min is
        # -inf in f32)
        if em.is_const(o):   # masked (val) where the mask is true, or, for where(c, scores, val), false
            t = em.const_of(o)
            t = t if isinstance(t, torch.Tensor) else torch.tensor(bool(t))
            attend = t.bool() if keep else ~t.bool()
            if val == float("-inf"):
                t = _const_to_lead(em, attend, tlead, lead, f"{base}.mask")
                (masks.const_bool if isinstance(t, torch.Tensor) else masks.bool_val)(t)
            else:
                t = torch.zeros(attend.shape, dtype=_tdt(torch, sdt)).masked_fill(~attend, val)
                t = _const_to_lead(em, t, tlead, lead, f"{base}.bias")
                (masks.const_add if isinstance(t, torch.Tensor) else masks.add_val)(t)
            continue
        mv = _to_lead(em, em.cast(em.val(o), "bool"), tlead, lead, "mask4")
        if val == float("-inf"):
            masks.bool_val(mv if keep else masks._not(mv))
        else:
            hit = masks._not(mv) if keep else mv
            f = em.emit("cast", [hit], {"to": sdt}, shape=hit.shape, dtype=sdt, name=f"{base}.hit")
            masks.add_val(em.emit("mul", [f, _num(val)], shape=f.shape, dtype=sdt, name=f"{base}.fill"))
    out_dt = em.dt(em.meta_val().dtype)
    r = emit_attention(em, q, k, v, masks, scale, plan.dropout, out_dtype=out_dt)
    return em.reshape(r, plan.pv_lead + r.shape[-2:])
