"""tfuse.export's dynamic_shapes: sizes exported as tfuse dims (export.py
calls _dynamic after the export at the example's sizes)."""
import re

import numpy as np

from ._export_emit import ExportError, _KEYWORDS, _input_names, _loss_arg_names, _torch

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
    elif "*" in str(d) or "+" in str(d):
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
        names.update(zip(_loss_arg_names(torch, loss_fn, len(targets)), targets))
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


def _dynamic(module, example_inputs, loss_fn, optimizer, scheduler, targets, name, spec, ex, em, export_at):
    """ex, exported at the example's sizes (em: its _Emitter), with the sizes
    dynamic_shapes names as tfuse dims. export_at: the driver's _export_at,
    which exports the model again at each dim's size + 1."""
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

    def grown_export(dim, n):
        ex1, _ = export_at(module, _grown(torch, example_inputs, axes, dim, n), loss_fn, optimizer, scheduler,
                           _grown(torch, targets, axes, dim, n), name)
        return ex1
    rw = _DimRewrite(ex, em, sizes)
    rw.compare(grown_export)
    for i, toks in sorted(rw.by_line().items()):
        rw.rewrite_line(i, toks)
    return rw.result()


class _DimRewrite:
    """ex's text rewritten with dims: its lines (lines0) and each line cut at
    its numbers (split0: text, number, text, ...), the numbers that moved
    with a dim, and what the rewrite adds: params, declarations, and the
    lines that rebuild a constant at the dims' sizes."""

    def __init__(self, ex, em, sizes):
        self.ex, self.em, self.sizes = ex, em, sizes
        self.lines0 = ex.text.split("\n")
        self.split0 = [_NUMTOK.split(ln) for ln in self.lines0]
        self.moved = {}   # (line, token) -> {dim: (number at the size, number at the size + 1)}
        self.new_params = dict(ex.params)
        self.broadcasts, self.step_decls = [], {}

    def compare(self, grown_export):
        """Fills moved from the export at each dim's size + 1, which must be
        the same text but for numbers."""
        em, sizes, lines0, split0 = self.em, self.sizes, self.lines0, self.split0
        for dim, n in sizes.items():
            try:
                ex1 = grown_export(dim, n)
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
                    raise ExportError(f"error: dim {dim} cannot be dynamic: the model's graph at {dim} = {n + 1} is "
                                      f"not the one at {n}:\n  {l0}\nbecomes\n  {l1}" + _from(em, l0))
                for j in range(1, len(p0), 2):
                    if p0[j] != p1[j]:
                        self.moved.setdefault((i, j), {})[dim] = (p0[j], p1[j])

    def by_line(self):
        """moved as {line: {token: {dim: (number, number)}}}."""
        by_line = {}
        for (i, j), how in self.moved.items():
            by_line.setdefault(i, {})[j] = how
        return by_line

    def rewrite_line(self, i, toks):
        """Line i with each number that is a dim's size written as the dim;
        the numbers derived from a size become -1 in a reshape's shape, and
        are refused elsewhere."""
        sizes = self.sizes
        line, parts = self.lines0[i], list(self.split0[i])   # split0 keeps the example's text: positions are in it
        derived = []
        for j, how in toks.items():
            (dim, (a, b)), = how.items() if len(how) == 1 else ((None, (None, None)),)
            before = "".join(self.split0[i][:j])
            where_ok = before.rfind("[") > before.rfind("]") or re.search(r"\w=$", before)
            if dim is not None and a == str(sizes[dim]) and b == str(sizes[dim] + 1) and where_ok:
                parts[j] = dim   # a size or an integer attribute: the dim itself
            else:
                derived.append(j)
        word = line.split(" ", 1)[0]
        if word in ("param", "buffer"):
            self.constant(i, line, parts, derived, word)
            return
        if derived:
            self.reshape_sizes(i, line, toks, derived, parts)
        self.lines0[i] = "".join(parts)

    def constant(self, i, line, parts, derived, word):
        """A buffer computed at export time with a dim in its shape: stored
        once along the dim and broadcast, or a count along it (first + k *
        step, k an iota); anything else is refused."""
        em, sizes = self.em, self.sizes
        if derived or word == "param":
            raise ExportError(f"error: the size of a dim reaches the shape of {'a param' if word == 'param' else 'a constant'} "
                              f"other than as itself:\n  {line}" + _from(em, line))
        bname = line.split()[1]
        arr = self.new_params.pop(bname)
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
        self.new_params[bname + ".one"] = np.ascontiguousarray(keep)
        self.lines0[i] = f"buffer {bname}.one : {dtype}[{', '.join(one)}]"
        if ramp is None:
            self.broadcasts.append(f"{bname} = broadcast({bname}.one, shape=[{', '.join(entries)}])")
            return
        ax, step = ramp
        self.new_params[bname + ".step"] = step
        self.step_decls[i] = f"buffer {bname}.step : {dtype}[{', '.join(one)}]"
        self.broadcasts += [f"{bname}.k = iota(shape=[{', '.join(entries)}], axis={ax}, dtype={dtype})",
                            f"{bname}.ks = mul({bname}.k, {bname}.step)",
                            f"{bname} = add({bname}.one, {bname}.ks)"]

    def reshape_sizes(self, i, line, toks, derived, parts):
        """Numbers derived from a dim's size: one per reshape, inside its
        shape=[...], becomes -1; anywhere else, refused."""
        em, sizes = self.em, self.sizes
        k = line.find("shape=[") if " = reshape(" in line else -1
        starts = [len("".join(self.split0[i][:j])) for j in derived]
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

    def result(self):
        """The Exported with dims: the declarations and broadcasts added."""
        lines0, ex = self.lines0, self.ex
        for i in sorted(self.step_decls, reverse=True):
            lines0.insert(i + 1, self.step_decls[i])
        if self.broadcasts:
            first_op = next((i for i, ln in enumerate(lines0) if re.match(r"[A-Za-z_][\w.]* = ", ln)), len(lines0))
            lines0[first_op:first_op] = self.broadcasts
        decl = [f"dim {d} = {n}   # from dynamic_shapes: tfuse.compile(..., dims={{\"{d}\": N}}) sets it"
                for d, n in self.sizes.items()]
        lines0[2:2] = decl
        # type(ex): the driver's Exported (export.py imports this module, not the other way)
        return type(ex)("\n".join(lines0), self.new_params, ex.inputs, ex.outputs, ex.layout, ex.aliases, ex.name,
                        self.sizes)


def _from(em, line):
    src = em.origin.get(line)
    return f"\n(from {src})" if src else ""
