"""tfuse.export (python/tfuse/export.py): PyTorch modules through
torch.export to tfuse, run, and trained one step, against PyTorch.

scripts/test.sh runs it with the venv's torch, torchvision and
transformers (scripts/setup.sh installs them); ctest's python_api runs it
too and skips it where torch is not installed. Nothing is downloaded: the
models are built from configs with random weights. By hand, from the
repository root:

    PYTHONPATH=python .venv/bin/python -m unittest -v python/tests/test_export.py

Real models, many of them, are tests/zoo's.

Tolerance (bench/check_twins.py's rule, DESIGN's "tolerances by dtype"):
the reference is PyTorch in float64; with e32 the float32 PyTorch error
against it, tfuse's error must be at most max(10 * e32, 1e-5), each error
measured as max|x - ref| / max|ref| per tensor.
"""
import copy
import math
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tfuse  # noqa: E402

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.utils._pytree as pytree
except ImportError:
    torch = None

try:
    import torchvision
except ImportError:
    torchvision = None

try:
    import transformers
    transformers.logging.set_verbosity_error()
except ImportError:
    transformers = None

TOL_FACTOR, TOL_FLOOR = 10.0, 1e-5
VERBOSE = bool(os.environ.get("TFUSE_EXPORT_VERBOSE"))   # print each test's worst errors


def rel(x, ref):
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-30))


def leaves(out):
    return [t.detach().numpy() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def call(m, args):
    return m(**args) if isinstance(args, dict) else m(*args)


def to64(args):
    f = (lambda t: t.double() if t.is_floating_point() else t)
    return {k: f(v) for k, v in args.items()} if isinstance(args, dict) else tuple(f(t) for t in args)


def feed(ex, args):
    if isinstance(args, dict):
        return {k: v.numpy() for k, v in args.items()}
    return {k: t.numpy() for k, t in zip(ex.inputs, args)}


if torch is not None:
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(12, 32)
            self.fc2 = nn.Linear(32, 32)
            self.norm = nn.LayerNorm(32)
            self.out = nn.Linear(32, 5)

        def forward(self, x):
            h = F.gelu(self.fc1(x))
            h = self.norm(torch.tanh(self.fc2(h)) + F.silu(h))
            return self.out(F.relu(h)).view(x.shape[0], -1)

    class HandAttention(nn.Module):
        """Attention as models write it by hand: a causal mask buffer added to the scores."""

        def __init__(self, E=16, H=2, T=6):
            super().__init__()
            self.qkv = nn.Linear(E, 3 * E)
            self.proj = nn.Linear(E, E)
            self.H = H
            self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

        def forward(self, x):
            B, T, E = x.shape
            q, k, v = self.qkv(x).split(E, dim=2)
            q, k, v = (t.view(B, T, self.H, E // self.H).transpose(1, 2) for t in (q, k, v))
            s = (q @ k.transpose(-2, -1)) * (1.0 / (E // self.H) ** 0.5)
            s = s.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(s, dim=-1) @ v
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, E))

    class ManyOps(nn.Module):
        """One module through most of the mapped ops."""

        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 8)
            self.conv = nn.Conv2d(3, 4, 3, padding=1, stride=1, bias=True)
            self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)

        def forward(self, img, ids, m):
            h = self.dw(F.relu(self.conv(img)))                       # [2, 4, 8, 8]
            a = F.avg_pool2d(h, 2) + F.max_pool2d(h, 3, 2, 1)[..., :4, :4]
            a = F.adaptive_avg_pool2d(a, 2).flatten(1)                # [2, 16]
            a = torch.cat([a.clamp(-0.5, 0.5), a.pow(2), torch.sigmoid(a) * 3 - a.abs()], dim=1)
            e = self.emb(ids)                                         # [2, 5, 8]
            q = e.view(2, 5, 2, 4).permute(0, 2, 1, 3)                # [2, 2, 5, 4]
            att = F.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=m, scale=0.3)
            x = att.transpose(1, 2).reshape(2, 5, 8)
            x = torch.where(x > 0, x, x.exp() - 1).masked_fill(ids.unsqueeze(-1) == 3, 0.25)
            c0, c1 = x.chunk(2, dim=-1)
            s = (c0 - c1).var(dim=1) + c0.std(dim=1, keepdim=False) + x.select(1, 2)[:, :4]
            s = s / (1.0 + x.mean(dim=(1, 2), keepdim=True).squeeze(-1)) - 2.0 - s.amax(dim=-1, keepdim=True)
            lsm = F.log_softmax(torch.cat([s, a[:, :4]], dim=1), dim=-1)
            sel = lsm[:, torch.tensor([0, 2, 3])]
            return sel.float(), F.mse_loss(a, torch.zeros_like(a)), (1 - ids.float()).sum()

    class Cummax(nn.Module):
        def forward(self, x):
            return x.cummax(-1).values   # tfuse has no cummax: the export names this line

    class Decomposed(nn.Module):
        """The ops tfuse.export writes as other ops: F.pad in every mode, the hard activations, ceil-mode and
        uneven pooling, cumsum, 1-d, 'same' and transposed convolutions, an embedding's padding row."""

        def __init__(self):
            super().__init__()
            self.ct = nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)
            self.c1 = nn.Conv1d(3, 5, 3, padding="same", dilation=2)
            self.c2 = nn.Conv2d(3, 2, (2, 3), padding="same")
            self.emb = nn.Embedding(7, 4, padding_idx=1)

        def forward(self, x, ids):
            p = F.pad(x, (1, 2, 0, 1)).sum() + F.pad(x, (1, 1, 2, 0), mode="reflect").mean()
            p = p + F.pad(x, (1, 1, 1, 1), mode="replicate").pow(2).mean() + F.pad(x, (2, 0, 1, 1), mode="circular").sin().mean()
            act = F.hardswish(x) + F.hardsigmoid(x) + F.relu6(x * 4) + F.leaky_relu(x) + F.elu(x) + F.mish(x)
            mp = F.max_pool2d(x, 3, 2, ceil_mode=True)
            ap = F.avg_pool2d(x, 3, 2, ceil_mode=True, count_include_pad=False).sum() + \
                F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True).mean() + F.avg_pool2d(x, 2, padding=1,
                                                                                      count_include_pad=False).sum()
            return (p + ap, act, mp, F.adaptive_avg_pool2d(x, 3), ids.cumsum(1), self.c1(x[:, :, 0]), self.ct(x),
                    self.c2(x), self.emb(ids))

    class Decomposed2(nn.Module):
        """roll, group_norm, addcmul, F.normalize (a vector norm), einsum with one and two operands, zero_."""

        def __init__(self):
            super().__init__()
            self.gn = nn.GroupNorm(2, 6)
            self.w = nn.Parameter(torch.randn(5, 4))

        def forward(self, x, q, k):
            a = torch.roll(x, shifts=(1, -2), dims=(2, 3)) + torch.roll(x, 3)
            c = torch.addcmul(x, a, self.gn(x), value=0.5)
            n = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
            e = torch.einsum("bhid,bhjd->bhij", q, k) + torch.einsum("bhij->bhji", n)
            z = x.clone()
            z.zero_()
            return (c + z, e, torch.einsum("bhid,dk->bhik", q, self.w), torch.linalg.vector_norm(x, ord=1, dim=(1, 2)),
                    torch.einsum("bhid->b", q))

    class ViewWrites(nn.Module):
        """In-place writes through views reach the base (T5's shift of its labels is this)."""

        def forward(self, x, ids):
            s = ids.new_zeros(ids.shape)
            s[..., 1:] = ids[..., :-1].clone()
            s[..., 0] = 7
            s.masked_fill_(s == 3, 0)
            y = x.clone()
            y[:, 1] = x[:, 0] * 2                # select
            y.transpose(1, 2)[:, 0, :] = -1.0   # a slice of a transpose
            y.view(-1)[:3] = 5.0               # a slice of a reshape
            return s, y

    class SplitWrite(nn.Module):
        def forward(self, x):
            a, b = x.clone().chunk(2, dim=1)
            a.zero_()   # writes into a chunk's view: refused, never silently lost
            return a + b

    def decomposed_loss(out, y):
        return sum((o.float() * 0.1).sin().mean() for o in out) + F.cross_entropy(out[-1].reshape(-1, 4), y,
                                                                                   ignore_index=2)

    def small_gpt2(dropout=0.0):
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=16,
                                      use_cache=False, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
        return transformers.GPT2LMHeadModel(cfg)

    def gpt2_loss(out, labels):
        lg = out.logits
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels.reshape(-1))


@unittest.skipIf(torch is None, "torch is not installed")
class Forward(unittest.TestCase):
    def check_forward(self, model, args):
        model.eval()
        torch.manual_seed(0)
        ex = tfuse.export(model, args)
        out = tfuse.compile(ex, mode="infer").session().run(**feed(ex, args))
        with torch.no_grad():
            ref32 = leaves(call(model, args))
            ref64 = leaves(call(copy.deepcopy(model).double(), to64(args)))
        self.assertEqual(len(out), len(ref64))
        for (name, got), r32, r64 in zip(out.items(), ref32, ref64):
            self.assertEqual(got.shape, r64.shape, name)
            e, e32 = rel(got, r64), rel(r32, r64)
            self.assertLessEqual(e, max(TOL_FACTOR * e32, TOL_FLOOR), f"{name}: tfuse {e:.3g}, torch fp32 {e32:.3g}")
            if VERBOSE:
                print(f"\n  {self.id().split('.')[-1]} {name}: tfuse {e:.3g}, torch fp32 {e32:.3g}", end=" ")
        return ex, out

    def test_mlp(self):
        torch.manual_seed(1)
        ex, out = self.check_forward(MLP(), (torch.randn(4, 12),))
        self.assertEqual(list(ex.inputs), ["x"])
        self.assertEqual(list(out), ["output"])
        self.assertEqual(ex.params["fc1.weight"].shape, (12, 32))   # linear weights [in, out]
        self.assertEqual(ex.layout["fc1.weight"], ("fc1.weight", True))
        self.assertIn("linear(", ex.text)

    def test_many_ops(self):
        torch.manual_seed(13)
        m = torch.randn(2, 1, 5, 5)   # a float mask input, added to the scores
        self.check_forward(ManyOps(), (torch.randn(2, 3, 8, 8), torch.randint(0, 11, (2, 5)), m))

    def test_decomposed_ops(self):
        torch.manual_seed(15)
        self.check_forward(Decomposed(), (torch.randn(2, 3, 7, 7), torch.randint(0, 5, (2, 6))))

    def test_decomposed_ops_2(self):
        torch.manual_seed(17)
        self.check_forward(Decomposed2(), (torch.randn(2, 6, 4, 5), torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)))

    def test_writes_through_views(self):
        torch.manual_seed(19)
        ids = torch.randint(0, 5, (2, 6))
        ids[0, 2] = 3
        self.check_forward(ViewWrites(), (torch.randn(2, 3, 4), ids))

    def test_indexing_with_runtime_indices(self):
        class Pick(nn.Module):
            def forward(self, x, i, j, k):
                return x[i, :, j] * 2, x[:, k]
        torch.manual_seed(20)
        x, i, j, k = torch.randn(4, 3, 5), torch.tensor([[0, 3], [-1, 2]]), torch.tensor([4, -5]), torch.tensor([2, -3])
        ex, _ = self.check_forward(Pick(), (x, i, j, k))
        # an index out of range stops the run, as in PyTorch, never reads a neighbouring row
        sess = tfuse.compile(ex, mode="infer").session()
        with self.assertRaises(tfuse.Error) as cm:
            sess.run(x=x.numpy(), i=i.numpy(), j=np.array([5, 0]), k=k.numpy())
        self.assertIn("out of range", str(cm.exception))

    def test_index_out_of_range_refused(self):
        class Bad(nn.Module):
            def forward(self, x):
                return x[:, torch.tensor([0, 5])]
        with self.assertRaises(tfuse.ExportError) as cm:
            tfuse.export(Bad(), (torch.randn(2, 3),))
        self.assertIn("out of range", str(cm.exception))

    def test_weight_through_t(self):
        class MM(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(5, 3))
                self.b = nn.Parameter(torch.randn(5))

            def forward(self, x):
                return torch.mm(x, self.w.t()) + torch.addmm(self.b, x, self.w.t())
        torch.manual_seed(14)
        ex, _ = self.check_forward(MM(), (torch.randn(2, 3),))
        self.assertEqual(ex.layout["w"], ("w", True))   # only ever a linear weight: stored [in, out]
        self.assertNotIn("transpose", ex.text)

    def test_sequential_names(self):
        torch.manual_seed(2)
        seq = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        ex, _ = self.check_forward(seq, (torch.randn(2, 6),))
        # `input` is a tfuse keyword and `0.weight` no tfuse name: both renamed, run() takes the torch name
        self.assertEqual(ex.inputs, {"input": "input_"})
        self.assertIn("_0.weight", ex.params)

    def test_hand_written_attention(self):
        torch.manual_seed(3)
        ex, _ = self.check_forward(HandAttention(), (torch.randn(2, 6, 16),))
        # scores, the causal buffer's masked_fill, softmax, @ v: one attention, the mask recognised as causal
        self.assertEqual(ex.text.count("= attention("), 1)
        self.assertIn("causal=true", ex.text)
        self.assertNotIn("softmax(", ex.text)

    def test_tuple_outputs(self):
        class Two(nn.Module):
            def forward(self, x):
                return {"a": x * 2, "b": (x.sum(dim=1), torch.softmax(x, -1))}
        ex, out = self.check_forward(Two(), (torch.randn(3, 4),))
        self.assertEqual(list(out), ["a", "b.0", "b.1"])

    @unittest.skipIf(torchvision is None, "torchvision is not installed")
    def test_resnet18(self):
        torch.manual_seed(4)
        ex, _ = self.check_forward(torchvision.models.resnet18(weights=None), (torch.randn(2, 3, 32, 32),))
        self.assertIn("batchnorm(", ex.text)
        self.assertIn("global_avgpool(", ex.text)

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_gpt2(self):
        torch.manual_seed(5)
        ex, out = self.check_forward(small_gpt2(), {"input_ids": torch.randint(0, 97, (2, 10))})
        self.assertEqual(list(out), ["logits"])
        self.assertIn("attention(", ex.text)   # HF's causal mask recognised as causal attention
        self.assertIn("causal=true", ex.text)


if torch is not None:
    class SDPA(nn.Module):
        """F.scaled_dot_product_attention with the keyword arguments given (dropout_p in train mode only)."""

        def __init__(self, **kw):
            super().__init__()
            self.kw = kw

        def forward(self, q, k, v, mask=None):
            kw = dict(self.kw, dropout_p=self.kw.get("dropout_p", 0.0) if self.training else 0.0)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

    class Hand(nn.Module):
        """Attention written by hand, in one of the forms models use."""

        def __init__(self, form, p=0.0):
            super().__init__()
            self.form, self.p = form, p
            self.temperature = nn.Parameter(torch.linspace(0.5, 2.0, 4).view(4, 1, 1))   # per head

        def forward(self, q, k, v, mask=None):
            f, D = self.form, q.shape[-1]
            if f == "gqa":            # repeat_interleave over the heads: grouped-query attention
                G = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
            elif f == "repeat_kv":    # HF's repeat_kv
                B, Hk, T, Dk = k.shape
                G = q.shape[1] // Hk
                k = k[:, :, None, :, :].expand(B, Hk, G, T, Dk).reshape(B, Hk * G, T, Dk)
                v = v[:, :, None, :, :].expand(B, Hk, G, T, v.shape[-1]).reshape(B, Hk * G, T, v.shape[-1])
            if f == "q_scaled":
                s = (q * D ** -0.5) @ k.transpose(-2, -1)
            elif f == "div":
                s = (q @ k.transpose(-2, -1)) / math.sqrt(D) + mask
            elif f == "einsum":
                s = torch.einsum("bhid,bhjd->bhij", q, k) * 0.5
            elif f == "temperature":   # a learned scale per head (EdgeNeXt's, Swin-V2's): put on q
                s = (q @ k.transpose(-2, -1)) * self.temperature
            elif f == "in_place":      # T5's: scores += bias, softmax(scores.float()).type_as(scores)
                s = q @ k.transpose(-2, -1)
                s /= math.sqrt(D)
                s += mask
                return F.softmax(s.float(), dim=-1).type_as(s) @ v
            else:
                s = q @ k.transpose(-2, -1) * D ** -0.5
            if f == "masked_fill":
                s = s.masked_fill(~mask, float("-inf"))
            elif f == "finfo":        # HF's way: the dtype's most negative number, not -inf
                s = s.masked_fill(mask == 0, torch.finfo(s.dtype).min)
            elif f == "where":
                s = torch.where(mask, s, float("-inf"))
            elif f == "fill_1e4":     # a fill that does not swamp the scores: no mask, op by op
                s = s.masked_fill(~mask, -1e4)
            p = F.dropout(F.softmax(s, dim=-1), self.p, self.training)
            return torch.einsum("bhij,bhjd->bhid", p, v) if f == "einsum" else p @ v

    class Probs(nn.Module):
        """The probabilities returned as well: they must exist, so op by op."""

        def forward(self, q, k, v):
            p = F.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1)
            return p @ v, p

    class CausalAndPadding(nn.Module):
        """A causal buffer and a padding mask of the keys, both on the scores: causal=true and the mask."""

        def __init__(self, T=6):
            super().__init__()
            self.register_buffer("tri", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

        def forward(self, q, k, v, keep):
            T = q.shape[-2]
            s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
            s = s.masked_fill(self.tri[:, :, :T, :T] == 0, float("-inf"))
            s = s + (1.0 - keep[:, None, None, :].to(s.dtype)) * torch.finfo(s.dtype).min
            return F.softmax(s, dim=-1) @ v

    class WithDropouts(nn.Module):
        """A dropout before the attention's: each draws its own stream (salt)."""

        def __init__(self, hand):
            super().__init__()
            self.fc, self.hand = nn.Linear(8, 8), hand

        def forward(self, q, k, v):
            q = F.dropout(self.fc(q), 0.2, self.training)
            if self.hand:
                p = F.dropout(F.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1), 0.1, self.training)
                return p @ v
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)


@unittest.skipIf(torch is None, "torch is not installed")
class Attention(unittest.TestCase):
    """Attention as one `attention` op: scaled_dot_product_attention with each of its arguments, attention
    written by hand in the forms models use, HF's eager attention; each run fused (the default) and
    decomposed (attention_decomposed=True) against PyTorch in float64."""

    def check(self, model, args, n=1, softmax=0, nan_is_zero=False, f64=True):
        """Exports model (in its mode), asserts n attention ops and `softmax` softmaxes in the IR, runs it both
        ways in inference against the module in eval mode in float64: exported in float32, within the usual
        tolerance; with f64, exported in float64 too, within 1e-10. nan_is_zero: where PyTorch gives NaN (a
        softmax written by hand over a row whose every key is masked with -inf), tfuse's attention gives 0."""
        ex = tfuse.export(model, args)
        self.assertEqual(ex.text.count("= attention("), n, ex.text)
        self.assertEqual(ex.text.count("= softmax("), softmax, ex.text)
        m64 = copy.deepcopy(model).double()
        ex64 = tfuse.export(m64, to64(args)) if f64 else None
        model.eval()
        m64.eval()
        with torch.no_grad():
            ref32 = leaves(call(model, args))
            ref64 = leaves(call(m64, to64(args)))
        for decomposed in (False, True):
            for e_x, a, bound in ((ex, args, None), (ex64, to64(args), 1e-10)):
                if e_x is None:
                    continue
                out = tfuse.compile(e_x, mode="infer", attention_decomposed=decomposed).session().run(**feed(e_x, a))
                self.assertEqual(len(out), len(ref64))
                for (name, got), r32, r64 in zip(out.items(), ref32, ref64):
                    self.assertEqual(got.shape, r64.shape, name)
                    nan = np.isnan(r64)
                    if nan.any():
                        self.assertTrue(nan_is_zero, f"{name}: PyTorch gives NaN")
                        np.testing.assert_array_equal(got[nan], 0.0)
                        got, r32, r64 = got[~nan], r32[~nan], r64[~nan]
                    e, e32 = rel(got, r64), rel(r32, r64)
                    tol = bound if bound is not None else max(TOL_FACTOR * e32, TOL_FLOOR)
                    self.assertLessEqual(e, tol, f"{name} ({got.dtype}, decomposed={decomposed}): tfuse {e:.3g}, "
                                                 f"torch fp32 {e32:.3g}")
        return ex

    @staticmethod
    def qkv(seed, B=2, H=4, Hk=None, Tq=5, Tk=7, D=8, Dv=6):
        torch.manual_seed(seed)
        return torch.randn(B, H, Tq, D), torch.randn(B, Hk or H, Tk, D), torch.randn(B, Hk or H, Tk, Dv)

    @staticmethod
    def key_mask(seed, shape=(2, 1, 5, 7), empty_row=(1, 0, 3)):
        """A bool mask (true: attend) with one query row that sees no key."""
        torch.manual_seed(seed)
        m = torch.rand(*shape) > 0.4
        m[..., 0] = True
        if empty_row is not None:
            m[empty_row] = False
        return m

    def test_sdpa_bool_mask(self):
        q, k, v = self.qkv(30)
        m = self.key_mask(31)
        ex = self.check(SDPA(), (q, k, v, m))
        self.assertIn("attention(q, k, v, mask)", ex.text)
        # the row that sees no key: 0 in PyTorch's scaled_dot_product_attention, and so in tfuse's (check's)
        self.assertEqual(float(SDPA()(q, k, v, m)[1, :, 3].abs().max()), 0.0)

    def test_empty_row_train_step(self):
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(8, 24)

            def forward(self, x, mask):
                q, k, v = (t.view(2, 5, 2, 4).transpose(1, 2) for t in self.qkv(x).split(8, dim=-1))
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        torch.manual_seed(49)
        model, x = Net(), torch.randn(2, 5, 8)
        mask = self.key_mask(50, (2, 1, 5, 5), (0, 0, 2))
        loss_fn = (lambda out: (out * torch.linspace(-1, 1, 4)).sum())
        make_opt = (lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
        ex = tfuse.export(model, (x, mask), loss_fn=loss_fn, optimizer=make_opt(model))
        m32, m64 = copy.deepcopy(model), copy.deepcopy(model).double()
        for m, xx in ((m32, x), (m64, x.double())):
            opt = make_opt(m)
            loss_fn(m(xx, mask)).backward()   # the empty row: output 0 and no gradient, in PyTorch
            opt.step()
        for decomposed in (False, True):
            sess = tfuse.compile(ex, mode="train", attention_decomposed=decomposed).session()
            sess.train_step(x=x.numpy(), mask=mask.numpy())
            got = ex.to_torch(sess.state_dict())
            for k, r64 in m64.state_dict().items():
                e, e32 = rel(got[k].numpy(), r64.numpy()), rel(m32.state_dict()[k].numpy(), r64.numpy())
                self.assertLessEqual(e, max(TOL_FACTOR * e32, TOL_FLOOR),
                                     f"{k} (decomposed={decomposed}): tfuse {e:.3g}, torch fp32 {e32:.3g}")

    def test_sdpa_float_masks(self):
        q, k, v = self.qkv(32)
        for shape in ((5, 7), (1, 1, 7), (2, 4, 5, 7)):
            with self.subTest(shape=shape):
                m = torch.randn(*shape)
                if len(shape) == 4:
                    m[0, 1, 2] = float("-inf")   # an additive -inf row: 0 as well
                ex = self.check(SDPA(), (q, k, v, m))
                self.assertIn("attention(q, k, v, mask)", ex.text)

    def test_sdpa_causal_and_scale(self):
        for Tq, Tk, kw in ((5, 5, dict(is_causal=True)), (5, 7, dict(is_causal=True, scale=0.3)),
                           (6, 4, dict(scale=2.0))):
            with self.subTest(Tq=Tq, Tk=Tk, **kw):
                ex = self.check(SDPA(**kw), self.qkv(33, Tq=Tq, Tk=Tk))
                self.assertEqual("causal=true" in ex.text, bool(kw.get("is_causal")))
                if "scale" in kw:
                    self.assertIn(f"scale={kw['scale']:g}", ex.text)
                else:
                    self.assertNotIn("scale=", ex.text)   # the op's own default, 1/sqrt(D)

    def test_sdpa_constant_causal_mask(self):
        class Buf(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("tri", torch.ones(5, 5, dtype=torch.bool).tril(), persistent=False)

            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=self.tri)
        ex = self.check(Buf(), self.qkv(34, Tk=5))
        self.assertIn("attention(q, k, v, causal=true)", ex.text)

    def test_causal_and_padding_mask(self):
        q, k, v = self.qkv(35, Tq=6, Tk=6)
        keep = torch.ones(2, 6, dtype=torch.bool)
        keep[1, 4:] = False
        ex = self.check(CausalAndPadding(), (q, k, v, keep))
        line = next(ln for ln in ex.text.splitlines() if "= attention(" in ln)
        self.assertIn("causal=true", line)
        operands = [a for a in line.split("(", 1)[1].rstrip(")").split(", ") if "=" not in a]
        self.assertEqual(len(operands), 4, line)   # q, k, v and the padding mask

    def test_sdpa_gqa(self):
        for Hk in (2, 1):
            with self.subTest(Hk=Hk):
                ex = self.check(SDPA(enable_gqa=True), self.qkv(36, Hk=Hk))
                self.assertIn(f"input  k : f32[2, {Hk}, 7, 8]", ex.text)
                self.assertIn("attention(q, k, v)", ex.text)

    def test_sdpa_other_ranks(self):
        torch.manual_seed(37)
        q3, k3, v3 = torch.randn(6, 5, 8), torch.randn(6, 7, 8), torch.randn(6, 7, 4)
        self.check(SDPA(), (q3, k3, v3, torch.randn(5, 7)))
        q5, k5, v5 = torch.randn(2, 3, 4, 5, 8), torch.randn(2, 3, 4, 7, 8), torch.randn(2, 3, 4, 7, 4)
        self.check(SDPA(), (q5, k5, v5, self.key_mask(38, (3, 1, 5, 7), None)))

    def test_dropout_train_mode(self):
        for hand in (False, True):
            with self.subTest(hand=hand):
                torch.manual_seed(39)
                model = WithDropouts(hand).train()
                q, k, v = self.qkv(40, H=2, Tq=4, Tk=4, D=8, Dv=8)
                ex = self.check(model.train(), (q, k, v))   # the reference: eval mode, no dropout
                self.assertIn("dropout(", ex.text)
                self.assertIn("p=0.2, salt=1", ex.text)
                self.assertIn("dropout=0.1, salt=2", ex.text)   # the attention's: the next stream
                # a training step runs both ways with the attention's dropout
                ex = tfuse.export(model.train(), (q, k, v), loss_fn=lambda out: out.pow(2).mean(),
                                  optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
                for decomposed in (False, True):
                    sess = tfuse.compile(ex, mode="train", attention_decomposed=decomposed).session()
                    loss, _ = sess.train_step(q=q.numpy(), k=k.numpy(), v=v.numpy())
                    self.assertTrue(np.isfinite(loss))

    def test_hand_written_forms(self):
        q, k, v = self.qkv(41)
        cases = [("mul", None, False), ("q_scaled", None, False), ("einsum", None, False),
                 ("temperature", None, False),
                 ("div", torch.randn(2, 1, 5, 7), False), ("in_place", torch.randn(1, 4, 5, 7), False),
                 ("masked_fill", self.key_mask(42), True),   # the row with no key: NaN in PyTorch, 0 in tfuse
                 ("where", self.key_mask(43), True),
                 ("finfo", self.key_mask(44), False)]        # finfo.min: the row is the mean of v in both
        for form, m, nan in cases:
            with self.subTest(form=form):
                args = (q, k, v) if m is None else (q, k, v, m)
                # in_place's softmax(s.float()) is float32 in PyTorch's float64 run too: float32 export only
                ex = self.check(Hand(form), args, nan_is_zero=nan, f64=form != "in_place")
                self.assertIn("attention(q.scaled, k, v" if form == "temperature" else "attention(q, k, v", ex.text)
                self.assertNotIn("matmul(", ex.text)

    def test_hand_written_gqa(self):
        for form, Hk in (("gqa", 2), ("repeat_kv", 1), ("repeat_kv", 2)):
            with self.subTest(form=form, Hk=Hk):
                ex = self.check(Hand(form), self.qkv(45, Hk=Hk))
                self.assertIn("attention(q, k, v, scale=", ex.text)   # k and v with their Hk heads

    def test_hand_written_not_fused(self):
        q, k, v = self.qkv(46)
        self.check(Probs(), (q, k, v), n=0, softmax=1)   # the probabilities are an output
        self.check(Hand("fill_1e4"), (q, k, v, self.key_mask(47, empty_row=None)), n=0, softmax=1)

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_hf_sdpa_attention(self):
        torch.manual_seed(51)
        cfg = transformers.LlamaConfig(attn_implementation="sdpa", vocab_size=97, hidden_size=32,
                                       intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=32, use_cache=False)
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 6:] = 0
        ex = self.check(transformers.LlamaForCausalLM(cfg).eval(),
                        {"input_ids": torch.randint(0, 97, (2, 8)), "attention_mask": mask}, n=2, f64=False)
        defs = {ln.split(" = ")[0]: ln.split(" = ")[1] for ln in ex.text.splitlines() if " = " in ln}
        for line in (ln for ln in ex.text.splitlines() if "= attention(" in ln):
            # HF's causal mask and its padding: causal=true and a [B, 1, 1, T] mask; k and v as the model
            # computes them, with their 2 heads (HF's repeat_kv before SDPA taken off)
            self.assertIn("causal=true", line)
            k, v = line.split("(", 1)[1].split(", ")[1:3]
            for t in (k, v):
                self.assertFalse(defs[t].startswith(("reshape(", "broadcast(")), defs[t])

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_hf_eager_attention(self):
        configs = [
            ("GPT2Config", "GPT2LMHeadModel", dict(n_layer=2, n_embd=32, n_head=4, n_positions=16, use_cache=False)),
            ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2,
                                                     max_position_embeddings=32, use_cache=False)),
            ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=1,
                                                     max_position_embeddings=32, use_cache=False)),
            ("BertConfig", "BertModel", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                             intermediate_size=64, max_position_embeddings=32)),
        ]
        for cfg_name, model_name, kw in configs:
            with self.subTest(model=model_name, **{k: v for k, v in kw.items() if k == "num_key_value_heads"}):
                torch.manual_seed(48)
                cfg = getattr(transformers, cfg_name)(attn_implementation="eager", vocab_size=97, **kw)
                model = getattr(transformers, model_name)(cfg).eval()
                mask = torch.ones(2, 8, dtype=torch.long)
                mask[1, 6:] = 0   # padding
                # (PyTorch's "float64" Llama keeps its softmax in float32: the float32 export is compared)
                self.check(model, {"input_ids": torch.randint(0, 97, (2, 8)), "attention_mask": mask}, n=2,
                           f64=False)


@unittest.skipIf(torch is None, "torch is not installed")
class Errors(unittest.TestCase):
    def test_unmapped_op_names_op_and_line(self):
        with self.assertRaises(tfuse.ExportError) as cm:
            tfuse.export(Cummax(), (torch.randn(2, 3),))
        msg = str(cm.exception)
        self.assertIn("aten.cummax", msg)
        self.assertIn("test_export.py", msg)
        self.assertIn("x.cummax(-1)", msg)
        self.assertIsInstance(cm.exception, tfuse.Error)

    def test_train_arguments_checked(self):
        m = nn.Linear(3, 2)
        x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
        cases = [({"loss_fn": F.cross_entropy, "targets": (y,), "optimizer": "adamw"}, "optimizer='adamw'"),
                 ({"loss_fn": "cross_entropy", "targets": (y,)}, "loss_fn='cross_entropy'"),
                 ({"loss_fn": F.cross_entropy, "targets": (y,), "optimizer": torch.optim.SGD(m.parameters(), lr=0.1),
                   "scheduler": "cosine"}, "scheduler='cosine'")]
        for kw, want in cases:
            with self.assertRaises(tfuse.ExportError) as cm:
                tfuse.export(m, (x,), **kw)
            self.assertIn(want, str(cm.exception))
            self.assertNotIn("a bug in tfuse", str(cm.exception))

    def test_write_through_split_refused(self):
        with self.assertRaises(tfuse.ExportError) as cm:
            tfuse.export(SplitWrite(), (torch.randn(2, 4),))
        self.assertIn("in-place write through split", str(cm.exception))
        self.assertIn("a.zero_()", str(cm.exception))

    def test_writes_through_views_read_later(self):
        class Overlap(nn.Module):   # b views what a.zero_() writes, and is read after it
            def forward(self, x):
                y = x.clone()
                a, b = y[:, :2], y[:, 1:]
                a.zero_()
                return b + 1

        class FlatReadBase(nn.Module):   # reshape may have copied: whether r changes is PyTorch's layout's choice
            def forward(self, x):
                r = x.relu()
                torch.flatten(r, 1).mul_(2)
                return r + 1

        class FlatDropout(nn.Module):   # EfficientNet's classifier: nothing reads the flattened map's base again
            def forward(self, x):
                y = torch.flatten(x.relu(), 1)
                F.dropout(y, 0.5, False, True)
                return y * 2
        for m, shape, words in ((Overlap(), (2, 4), "another of its views reads later"),
                                (FlatReadBase(), (2, 3, 1, 1), "in-place write through flatten")):
            with self.assertRaises(tfuse.ExportError) as cm:
                tfuse.export(m, (torch.randn(*shape),))
            self.assertIn(words, str(cm.exception))
        x = torch.randn(2, 3, 1, 1)
        ex = tfuse.export(FlatDropout(), (x,))
        out = tfuse.compile(ex, mode="infer").session().run(x=x.numpy())["output"]
        np.testing.assert_array_equal(out, FlatDropout()(x).numpy())

    def test_unmapped_argument(self):
        class Weighted(nn.Module):
            def forward(self, x, y):
                return F.cross_entropy(x, y, label_smoothing=0.1)
        with self.assertRaises(tfuse.Error) as cm:
            tfuse.export(Weighted(), (torch.randn(4, 3), torch.randint(0, 3, (4,))))
        self.assertIn("label_smoothing", str(cm.exception))

    def test_autocast_regions(self):
        class Mixed(nn.Module):
            def __init__(self, enabled):
                super().__init__()
                self.fc, self.enabled = nn.Linear(6, 6), enabled

            def forward(self, x):
                h = self.fc(x)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.enabled):
                    a = (h @ h.transpose(-1, -2)).softmax(-1) @ h   # timm's EfficientViT keeps this in float32
                return a + h
        torch.manual_seed(23)
        x = torch.randn(2, 5, 6)
        m = Mixed(False).eval()
        ex = tfuse.export(m, (x,))   # a disabled region: its ops, inline
        out = tfuse.compile(ex, mode="infer").session().run(x=x.numpy())["output"]
        with torch.no_grad():
            r64, r32 = copy.deepcopy(m).double()(x.double()).numpy(), m(x).numpy()
        self.assertLessEqual(rel(out, r64), max(TOL_FACTOR * rel(r32, r64), TOL_FLOOR))
        with self.assertRaises(tfuse.ExportError) as cm:
            tfuse.export(Mixed(True).eval(), (x,))
        self.assertIn("torch.autocast(\"cpu\", dtype=torch.bfloat16)", str(cm.exception))
        self.assertIn("precision", str(cm.exception))

    def test_unsupported_optimizer(self):
        m = nn.Linear(3, 2)
        with self.assertRaises(tfuse.Error) as cm:
            tfuse.export(m, (torch.randn(2, 3),), loss_fn=F.mse_loss, targets=(torch.randn(2, 2),),
                         optimizer=torch.optim.RMSprop(m.parameters()))
        self.assertIn("RMSprop", str(cm.exception))


@unittest.skipIf(torch is None, "torch is not installed")
class Train(unittest.TestCase):
    def check_steps(self, model, args, targets, loss_fn, make_opt, make_sched=None, steps=1):
        model.train()
        m32, m64 = copy.deepcopy(model), copy.deepcopy(model).double()
        opt32, opt64 = make_opt(m32), make_opt(m64)
        s32 = make_sched(opt32) if make_sched else None
        s64 = make_sched(opt64) if make_sched else None
        ex = tfuse.export(model, args, loss_fn=loss_fn, targets=targets, optimizer=make_opt(model),
                          scheduler=make_sched(make_opt(model)) if make_sched else None)
        self.assertIn("train {", ex.text)
        sess = tfuse.compile(ex, mode="train").session()
        names = [n for n in ex.inputs]
        inputs = dict(zip(names, [t.numpy() for t in (list(args.values()) if isinstance(args, dict) else args)]
                          + [t.numpy() for t in targets]))
        for _ in range(steps):
            loss, _ = sess.train_step(**inputs)
            for m, opt, sch, a, tg in ((m32, opt32, s32, args, targets), (m64, opt64, s64, to64(args), to64(targets))):
                opt.zero_grad()
                ls = loss_fn(call(m, a), *tg)
                ls.backward()
                opt.step()
                if sch:
                    sch.step()
        got = ex.to_torch(sess.state_dict())
        sd32, sd64 = m32.state_dict(), m64.state_dict()
        self.assertEqual(set(got), set(sd64))
        worst = (0.0, 0.0, None)
        for k in sd64:
            e, e32 = rel(got[k].numpy(), sd64[k].numpy()), rel(sd32[k].numpy(), sd64[k].numpy())
            self.assertLessEqual(e, max(TOL_FACTOR * e32, TOL_FLOOR), f"{k}: tfuse {e:.3g}, torch fp32 {e32:.3g}")
            worst = max(worst, (e, e32, k))
        if VERBOSE:
            print(f"\n  {self.id().split('.')[-1]}: worst param {worst[2]}: tfuse {worst[0]:.3g}, "
                  f"torch fp32 {worst[1]:.3g}", end=" ")
        return ex, sess

    def test_mlp_sgd_momentum(self):
        torch.manual_seed(6)
        self.check_steps(MLP(), (torch.randn(8, 12),), (torch.randint(0, 5, (8,)),), F.cross_entropy,
                         lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3), steps=2)

    def test_mlp_adam_steplr(self):
        torch.manual_seed(7)
        ex, sess = self.check_steps(
            MLP(), (torch.randn(8, 12),), (torch.randint(0, 5, (8,)),), F.cross_entropy,
            lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
            lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5), steps=3)
        self.assertIn("schedule  = step(step_size=1, gamma=0.5)", ex.text)

    def test_mlp_adamw_cosine(self):
        torch.manual_seed(11)
        ex, _ = self.check_steps(
            MLP(), (torch.randn(8, 12),), (torch.randint(0, 5, (8,)),), F.cross_entropy,
            lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.8, 0.99)),
            lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=1e-4), steps=3)
        self.assertIn("cosine(total_steps=4", ex.text)

    def test_mlp_sgd_onecycle(self):
        torch.manual_seed(12)
        ex, _ = self.check_steps(
            MLP(), (torch.randn(8, 12),), (torch.randint(0, 5, (8,)),), F.cross_entropy,
            lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
            lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=10, pct_start=0.3,
                                                          cycle_momentum=False), steps=4)
        self.assertIn("onecycle(max_lr=0.5, total_steps=10", ex.text)

    def test_decomposed_ops_sgd(self):
        torch.manual_seed(16)
        y = torch.randint(0, 4, (12,))
        y[3] = 2   # ignored: cross_entropy's ignore_index
        ids = torch.randint(0, 5, (2, 6))
        ids[0, 1] = 1   # the padding row: no gradient
        _, sess = self.check_steps(Decomposed(), (torch.randn(2, 3, 7, 7), ids), (y,), decomposed_loss,
                                   lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), steps=2)

    def test_decomposed_ops_2_adamw(self):
        torch.manual_seed(18)
        self.check_steps(Decomposed2(), (torch.randn(2, 6, 4, 5), torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)), (),
                         lambda out: sum((o * 0.3).tanh().mean() for o in out),
                         lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))

    @unittest.skipIf(torchvision is None, "torchvision is not installed")
    def test_resnet18_sgd(self):
        torch.manual_seed(8)
        self.check_steps(torchvision.models.resnet18(weights=None, num_classes=10), (torch.randn(4, 3, 32, 32),),
                         (torch.randint(0, 10, (4,)),), F.cross_entropy,
                         lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_gpt2_adamw(self):
        torch.manual_seed(9)
        ex, _ = self.check_steps(small_gpt2(), {"input_ids": torch.randint(0, 97, (2, 10))},
                                 (torch.randint(0, 97, (2, 10)),), gpt2_loss,
                                 lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01))
        # the tied lm_head / wte: one tfuse param, both torch names come back
        self.assertIn("transformer.wte.weight", ex.aliases)


@unittest.skipIf(torch is None, "torch is not installed")
class Dynamic(unittest.TestCase):
    """dynamic_shapes: sizes exported as tfuse dims, compiled at other sizes."""

    def check_at(self, model, ex, args, dims):
        out = tfuse.compile(ex, mode="infer", dims=dims).session().run(**feed(ex, args))
        with torch.no_grad():
            ref32 = leaves(call(model, args))
            ref64 = leaves(call(copy.deepcopy(model).double(), to64(args)))
        for (name, got), r32, r64 in zip(out.items(), ref32, ref64):
            self.assertEqual(got.shape, r64.shape, name)
            e, e32 = rel(got, r64), rel(r32, r64)
            self.assertLessEqual(e, max(TOL_FACTOR * e32, TOL_FLOOR), f"{name} at {dims}: tfuse {e:.3g}, torch {e32:.3g}")

    def test_mlp_any_batch(self):
        torch.manual_seed(20)
        model = MLP().eval()
        ex = tfuse.export(model, (torch.randn(4, 12),), dynamic_shapes={"x": {0: torch.export.Dim("B", max=64)}})
        self.assertEqual(ex.dims, {"B": 4})
        self.assertIn("dim B = 4", ex.text)
        self.assertIn("input  x : f32[B, 12]", ex.text)
        for b in (2, 9):
            self.check_at(model, ex, (torch.randn(b, 12),), {"B": b})

    def test_train_at_another_batch_labels_follow(self):
        torch.manual_seed(21)
        model = MLP().train()
        make_opt = (lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
        ex = tfuse.export(model, (torch.randn(4, 12),), loss_fn=F.cross_entropy, targets=(torch.randint(0, 5, (4,)),),
                          optimizer=make_opt(model), dynamic_shapes=({0: "N"},))
        self.assertIn("input  target : i64[N]", ex.text)   # the labels follow the batch
        x, y = torch.randn(7, 12), torch.randint(0, 5, (7,))
        sess = tfuse.compile(ex, mode="train", dims={"N": 7}).session()
        loss, _ = sess.train_step(x=x.numpy(), target=y.numpy())
        got = ex.to_torch(sess.state_dict())
        for m, a, t in ((m32 := copy.deepcopy(model), x, y), (m64 := copy.deepcopy(model).double(), x.double(), y)):
            o = make_opt(m)
            F.cross_entropy(m(a), t).backward()
            o.step()
        for k, r64 in m64.state_dict().items():
            e, e32 = rel(got[k].numpy(), r64.numpy()), rel(m32.state_dict()[k].numpy(), r64.numpy())
            self.assertLessEqual(e, max(TOL_FACTOR * e32, TOL_FLOOR), f"{k}: tfuse {e:.3g}, torch {e32:.3g}")

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_gpt2_batch_and_length(self):
        torch.manual_seed(22)
        model = small_gpt2().eval()
        ex = tfuse.export(model, {"input_ids": torch.randint(0, 97, (3, 10))},
                          dynamic_shapes={"input_ids": {0: "B", 1: "T"}})
        self.assertEqual(ex.dims, {"B": 3, "T": 10})
        self.assertIn("iota(shape=[1, T]", ex.text)   # the position ids: a count, not a constant of 10
        for b, t in ((2, 5), (5, 16)):
            self.check_at(model, ex, {"input_ids": torch.randint(0, 97, (b, t))}, {"B": b, "T": t})

    def test_refusals(self):
        class Scale(nn.Module):
            def forward(self, x):
                return x * x.shape[0]

        class Branch(nn.Module):
            def forward(self, x):
                return x.sum() if x.shape[0] > 4 else x.mean()

        x = torch.randn(4, 3)
        cases = [
            (Scale(), {"x": {0: "B"}}, ["as an operand", "return x * x.shape[0]"]),
            (Branch(), {"x": {0: "B"}}, ["is not the one at 4", "x.sum() if x.shape[0] > 4"]),
            (Scale(), {"x": {0: torch.export.Dim.AUTO}}, ["needs a name"]),
            (Scale(), {"y": {0: "B"}}, ["'y', which is not an argument", "those are: x"]),
            (Scale(), {"x": {2: "B"}}, ["axis 2 is not an axis of a rank-2"]),
            (Scale(), {"x": {0: "B", 1: "B"}}, ["dim B is 4 on one axis and 3 on axis 1"]),
            (Scale(), {"x": {0: "x"}}, ["dim x has the name of a value"]),
            (Scale(), ({0: "B"}, {0: "C"}), ["2 positional specs for 1 positional inputs"]),
        ]
        for model, spec, words in cases:
            with self.assertRaises(tfuse.ExportError, msg=str(spec)) as cm:
                tfuse.export(model, (x,), dynamic_shapes=spec)
            for w in words:
                self.assertIn(w, str(cm.exception))
        with self.assertRaises(tfuse.ExportError) as cm:
            tfuse.export(Scale(), (torch.randn(1, 3),), dynamic_shapes={"x": {0: "B"}})
        self.assertIn("needs an example of 2 or more", str(cm.exception))


@unittest.skipIf(torch is None, "torch is not installed")
class Checkpoints(unittest.TestCase):
    def test_state_both_ways_and_files(self):
        torch.manual_seed(10)
        model = MLP().eval()
        x = torch.randn(3, 12)
        ex = tfuse.export(model, (x,))
        prog = tfuse.compile(ex, mode="infer")
        sess = prog.session()
        # tfuse -> torch: another module takes tfuse's state and computes the same
        other = MLP().eval()
        other.load_state_dict(ex.to_torch(sess.state_dict()), strict=True)
        with torch.no_grad():
            np.testing.assert_allclose(other(x).numpy(), sess.run(x=x.numpy())["output"], rtol=1e-5, atol=1e-6)
        # torch -> tfuse: a fresh session (zeros) takes a module's state_dict
        fresh = tfuse.compile(ex.text, mode="infer").session()
        fresh.load_state_dict(ex.from_torch(model.state_dict()), strict=True)
        with torch.no_grad():
            np.testing.assert_allclose(fresh.run(x=x.numpy())["output"], model(x).numpy(), rtol=1e-5, atol=1e-6)
        # save: model.ir + model.safetensors, read by tfuse itself
        with tempfile.TemporaryDirectory() as d:
            w = ex.save(os.path.join(d, "model.ir"))
            self.assertEqual(w, os.path.join(d, "model.safetensors"))
            back = tfuse.export.read_safetensors(w)
            self.assertEqual(set(back), set(ex.params))
            for k, v in ex.params.items():
                np.testing.assert_array_equal(back[k], v)
            s2 = tfuse.compile(os.path.join(d, "model.ir"), mode="infer").session()
            s2.load(w)
            np.testing.assert_array_equal(s2.run(x=x.numpy())["output"], sess.run(x=x.numpy())["output"])
            # the tfuse command runs the pair too (a 0-d buffer included: num_batches_tracked)
            bn = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten()).eval()
            ex2 = tfuse.export(bn, (torch.randn(1, 2, 4, 4),))
            w2 = ex2.save(os.path.join(d, "bn.ir"))
            s3 = tfuse.compile(os.path.join(d, "bn.ir"), mode="infer").session()
            s3.load(w2)
            self.assertEqual(s3.state_dict()["_1.num_batches_tracked"].shape, ())

    def test_cli(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "net.py")
            with open(src, "w") as f:
                f.write("import torch.nn as nn\n"
                        "class Net(nn.Sequential):\n"
                        "    def __init__(self):\n"
                        "        super().__init__(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n")
            out = os.path.join(d, "net.ir")
            env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
            r = subprocess.run([sys.executable, "-m", "tfuse.export", f"{src}:Net", "--input", "f32[3,4]",
                                "-o", out], capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.exists(os.path.join(d, "net.safetensors")))
            s = tfuse.compile(out, mode="infer").session()
            s.load(os.path.join(d, "net.safetensors"))
            self.assertEqual(s.run(input_=np.ones((3, 4), np.float32))["output"].shape, (3, 2))
            # a dynamic batch: f32[B=3,4] exports dim B, and the model compiles at another batch
            r = subprocess.run([sys.executable, "-m", "tfuse.export", f"{src}:Net", "--input", "f32[B=3,4]",
                                "-o", out], capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("dims B (example 3)", r.stdout)
            s = tfuse.compile(out, mode="infer", dims={"B": 5}).session()
            s.load(os.path.join(d, "net.safetensors"))
            self.assertEqual(s.run(input_=np.ones((5, 4), np.float32))["output"].shape, (5, 2))
            r = subprocess.run([sys.executable, "-m", "tfuse.export", f"{src}:Net", "--input", "f32[B=x,4]"],
                               capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 2)
            self.assertIn("f32[B=8,784] for a dynamic dim B", r.stderr)


if __name__ == "__main__":
    unittest.main()
