"""test_onnx.py — `tfuse import` against ONNX Runtime (docs/onnx.md).

Each model of tests/onnx/models.py, a small CNN and torchvision's ResNet-18
and MobileNetV2 that PyTorch exports, is
imported and run by `tfuse run` on the interp and cpu targets with fresh
random inputs; every output must have ONNX Runtime's dtype and shape and
its values within rtol 1e-3, atol 1e-5 (the backend node tests' bounds).
Then what must fail does, with the message a user needs: a truncated file
(the byte), an op tfuse lacks (the node, the op, the opset), asymmetric
padding; and the reader takes repeated fields unpacked as well as packed
(proto2 allows both; onnx's Python writes packed).

    TFUSE_CLI=build/tfuse .venv/bin/python tests/onnx/test_onnx.py
"""
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import models  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

TFUSE = os.environ.get("TFUSE_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "tfuse"))
TARGETS = os.environ.get("TFUSE_ONNX_TARGETS", "interp cpu").split()
NP = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.BOOL: np.bool_}


def tfuse(*args, ok=True):
    r = subprocess.run([TFUSE, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise AssertionError(f"tfuse {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


class Imported(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        cls.rng = np.random.default_rng()   # fresh inputs every run

    def check(self, name, m, dims=None):
        path = os.path.join(self.dir, name + ".onnx")
        onnx.save(m, path)
        dims = dims or {}
        feeds = {}
        for i in m.graph.input:
            shape = [d.dim_value if d.dim_value else dims[d.dim_param] for d in i.type.tensor_type.shape.dim]
            dt = NP[i.type.tensor_type.elem_type]
            feeds[i.name] = (self.rng.integers(0, 6, shape) if dt == np.int64 else self.rng.random(shape) < 0.75 if dt == np.bool_
                             else self.rng.standard_normal(shape)).astype(dt)
        want = ort.InferenceSession(path).run(None, feeds)
        ir = os.path.join(self.dir, name + ".ir")
        tfuse("import", path, "-o", ir, *[a for k, v in dims.items() for a in ("--dim", f"{k}={v}")])
        args = []
        for k, v in feeds.items():
            np.save(os.path.join(self.dir, f"{name}.in.{k}.npy"), v)
            args += ["--input", f"{k}={self.dir}/{name}.in.{k}.npy"]
        dargs = [a for k, v in dims.items() for a in ("--dim", f"{k}={v}")]
        for t in TARGETS + ["direct"]:   # the imported text with its params, then the .onnx file itself
            outs = [os.path.join(self.dir, f"{name}.{t}.{o.name}.npy") for o in m.graph.output]
            oargs = [a for o, f in zip(m.graph.output, outs) for a in ("--output", f"{o.name}={f}")]
            if t == "direct":
                tfuse("run", path, f"--target={TARGETS[-1]}", *dargs, *args, *oargs)
            else:
                tfuse("run", ir, f"--target={t}", "--params", ir[:-3] + ".safetensors", *args, *oargs)
            for o, f, w in zip(m.graph.output, outs, want):
                got = np.load(f)
                with self.subTest(model=name, target=t, output=o.name):
                    self.assertEqual(got.dtype, w.dtype)
                    self.assertEqual(got.shape, w.shape)
                    np.testing.assert_allclose(got, w, rtol=1e-3, atol=1e-5)

    def feeds_of(self, m, dims=None):
        return {i.name: (self.rng.integers(0, 11, [d.dim_value or dims[d.dim_param] for d in i.type.tensor_type.shape.dim])
                         if NP[i.type.tensor_type.elem_type] == np.int64 else
                         self.rng.standard_normal([d.dim_value or dims[d.dim_param] for d in i.type.tensor_type.shape.dim]))
                .astype(NP[i.type.tensor_type.elem_type]) for i in m.graph.input}

    def test_models(self):
        for name, m in models.all_models().items():
            self.check(name, m, {"batch": 3} if name == "embed" else None)

    def test_pytorch_cnn(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no torch")
        torch.manual_seed(int(self.rng.integers(1 << 30)))

        class Net(torch.nn.Module):
            def __init__(s):
                super().__init__()
                s.c1, s.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
                s.c2, s.fc, s.ln = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.Linear(16, 10), torch.nn.LayerNorm(10)

            def forward(s, x):
                x = torch.nn.functional.max_pool2d(torch.relu(s.bn(s.c1(x))), 2)
                x = torch.nn.functional.gelu(s.c2(x)).mean(dim=(2, 3))
                return torch.softmax(s.ln(s.fc(x)).reshape(x.shape[0], -1), dim=-1)

        net = Net().eval()
        with torch.no_grad():   # running statistics that are not the identity
            net.bn.running_mean.uniform_(-1, 1)
            net.bn.running_var.uniform_(0.5, 2)
        path = os.path.join(self.dir, "torch_cnn.onnx")
        torch.onnx.export(net, (torch.randn(2, 3, 16, 16),), path, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}})
        self.check("torch_cnn", onnx.load(path), {"batch": 2})

    def test_torchvision(self):
        """ResNet-18 and MobileNetV2 (depthwise convolutions, ReLU6 as Clip), exported by PyTorch at 64x64, with
        batch norm statistics that are not the identity."""
        try:
            import torch
            import torchvision
        except ImportError:
            self.skipTest("no torchvision")
        torch.manual_seed(int(self.rng.integers(1 << 30)))
        for name in ("resnet18", "mobilenet_v2"):
            net = getattr(torchvision.models, name)(num_classes=10).eval()
            with torch.no_grad():
                for mod in net.modules():
                    if isinstance(mod, torch.nn.BatchNorm2d):
                        mod.running_mean.uniform_(-0.5, 0.5)
                        mod.running_var.uniform_(0.5, 2)
                        mod.weight.uniform_(0.5, 1.5)
            path = os.path.join(self.dir, name + ".onnx")
            torch.onnx.export(net, (torch.randn(2, 3, 64, 64),), path, dynamo=False, opset_version=17, input_names=["x"],
                              output_names=["y"])
            self.check(name, onnx.load(path))


def small_bert(torch, transformers, seed):
    """A transformers BERT classifier (2 layers, hidden 32, 4 heads), dropout off, its weights drawn again so that no
    two are equal (torch.onnx.export writes equal initializers once, tying them)."""
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, num_labels=3)
    torch.manual_seed(seed)
    net = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if p.dim() == 1 and p.shape[0] == 32 else 0.0))
    return net


class Direct(unittest.TestCase):
    """The .onnx file given to compile, run, train and tfuse.compile: BERT against ONNX Runtime, packages, the messages
    of --loss, and fine-tuning BERT against PyTorch doing the same in float64."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        cls.rng = np.random.default_rng()
        cls.seed = int(cls.rng.integers(1 << 30))
        try:
            import torch
            import transformers
        except ImportError:
            cls.bert = None
            return
        cls.torch, cls.net = torch, small_bert(torch, transformers, cls.seed)
        cls.bert = os.path.join(cls.dir, "bert.onnx")
        ids = torch.randint(0, 100, (2, 16))
        mask = torch.ones(2, 16, dtype=torch.long)
        torch.onnx.export(cls.net, (ids, mask), cls.bert, dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"])

    def batch(self):
        ids = self.rng.integers(1, 100, (2, 16)).astype(np.int64)   # not 0, the padding row: ONNX has no padding_idx
        mask = np.ones((2, 16), np.int64)
        mask[1, int(self.rng.integers(4, 16)):] = 0   # the second sequence padded
        return ids, mask

    def test_bert_against_onnxruntime(self):
        if not self.bert:
            self.skipTest("no torch or transformers")
        ids, mask = self.batch()
        want = ort.InferenceSession(self.bert).run(None, {"input_ids": ids, "attention_mask": mask})[0]
        np.save(os.path.join(self.dir, "ids.npy"), ids)
        np.save(os.path.join(self.dir, "mask.npy"), mask)
        for t in TARGETS:
            out = os.path.join(self.dir, f"logits.{t}.npy")
            tfuse("run", self.bert, f"--target={t}", "--input", f"input_ids={self.dir}/ids.npy", "--input",
                  f"attention_mask={self.dir}/mask.npy", "--output", f"logits={out}")
            got = np.load(out)
            with self.subTest(target=t):
                self.assertEqual(got.shape, want.shape)
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)

    def test_package(self):
        """compile model.onnx -o pkg: the package holds the model's weights; running it gives ONNX Runtime's outputs."""
        m = models.all_models()["conv"]
        path = os.path.join(self.dir, "conv.onnx")
        onnx.save(m, path)
        x = self.rng.standard_normal([d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
        want = ort.InferenceSession(path).run(None, {m.graph.input[0].name: x})
        np.save(os.path.join(self.dir, "cx.npy"), x)
        pkg = os.path.join(self.dir, "conv.tfp")
        tfuse("compile", path, "--target=" + TARGETS[-1], "-o", pkg)
        outs = [os.path.join(self.dir, f"pkg.{o.name}.npy") for o in m.graph.output]
        tfuse("run", pkg, "--input", f"{m.graph.input[0].name}={self.dir}/cx.npy",
              *[a for o, f in zip(m.graph.output, outs) for a in ("--output", f"{o.name}={f}")])
        for f, w in zip(outs, want):
            np.testing.assert_allclose(np.load(f), w, rtol=1e-3, atol=1e-5)

    def expect(self, args, *words, code=1):
        r = tfuse(*args, ok=False)
        self.assertEqual(r.returncode, code, r.stdout + r.stderr)
        for w in words:
            self.assertIn(w, r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_loss_errors(self):
        m = models.all_models()["conv"]
        path = os.path.join(self.dir, "conv.onnx")
        onnx.save(m, path)
        x = os.path.join(self.dir, "tx.npy")
        np.save(x, self.rng.standard_normal((4, 3, 8, 8)).astype(np.float32))
        data = ["--data", f"x={x}", "--steps", "1"]
        self.expect(["train", path, *data], "needs a loss to minimize", "--loss \"cross_entropy(OUTPUT, LABELS)\"")
        self.expect(["train", path, "--loss", "cross_entropy(nope, labels)", *data], "no value named 'nope'", "its outputs: out, gmp")
        self.expect(["train", path, "--loss", "cross_entropy(out, x)", *data], "'x' names a value of the model already")
        self.expect(["train", path, "--loss", "hinge(out, y)", *data], "cross_entropy or mse_loss, not 'hinge'")
        self.expect(["train", path, "--loss", "cross_entropy(out labels)", *data], "expected cross_entropy(OUTPUT, LABELS)")
        self.expect(["train", path, "--loss", "mse_loss(out, t)", "--optimizer", "adamx(lr=1)", *data], "adamx")
        self.expect(["run", path, "--loss", "mse_loss(out, t)"], "--loss", code=2)
        pkg = os.path.join(self.dir, "c.tfp")
        tfuse("compile", path, "--target=" + TARGETS[-1], "-o", pkg)
        self.expect(["bench", pkg, "--loss", "mse_loss(out, t)"], "is a compiled package: --loss changes what it holds", code=2)

    def test_weights_stay_params(self):
        """A weight that a Reshape, Concat or Cast reads is still a param: fine-tuning moves it (folding it into a
        constant would freeze it)."""
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
        import tfuse as tf
        n = helper.make_node
        m = models.model("wparams", [
            n("Reshape", ["w", "shape"], ["wr"]), n("Cast", ["v"], ["vc"], to=TensorProto.FLOAT),
            n("Concat", ["wr", "vc"], ["wc"], axis=1), n("MatMul", ["x", "wc"], ["y"]),
        ], [("x", TensorProto.FLOAT, [4, 2])], [("y", TensorProto.FLOAT, [4, 5])],
            [models.init("w", models.rnd(6, seed=30)), models.init("v", models.rnd(2, 2, seed=31).astype(np.float64)),
             models.init("shape", np.array([2, 3], np.int64))])
        path = os.path.join(self.dir, "wparams.onnx")
        onnx.save(m, path)
        s = tf.compile(path, mode="train", target=TARGETS[0], loss="mse_loss(y, t)", optimizer="sgd(lr=0.1)").session()
        before = s.state_dict()
        self.assertLessEqual({"v", "w"}, set(before))
        s.run({"x": self.rng.standard_normal((4, 2)).astype(np.float32), "t": self.rng.standard_normal((4, 5)).astype(np.float32)})
        after = s.state_dict()
        for k in ("v", "w"):
            self.assertGreater(float(np.abs(after[k] - before[k]).max()), 1e-4, k)

    def test_finetune_bert_against_pytorch(self):
        """Five SGD steps (momentum 0.9) of the imported BERT with cross_entropy on its logits, by tfuse.compile and
        by PyTorch in float64 from the same weights: every loss within 1e-5 and every param within 1e-4 of its
        largest value."""
        if not self.bert:
            self.skipTest("no torch or transformers")
        torch = self.torch
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
        import tfuse as tf
        batches = []
        for _ in range(5):
            ids, mask = self.batch()
            batches.append((ids, mask, self.rng.integers(0, 3, 2).astype(np.int64)))
        ref = type(self.net)(self.net.config).double()
        ref.load_state_dict({k: v.double() for k, v in self.net.state_dict().items()})
        ref.train()   # dropout is 0: the same function
        opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
        want = []
        for ids, mask, labels in batches:
            out = ref(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits
            loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(labels))
            opt.zero_grad()
            loss.backward()
            opt.step()
            want.append(loss.item())
        for t in TARGETS:
            p = tf.compile(self.bert, mode="train", target=t, loss="cross_entropy(logits, labels)",
                           optimizer="sgd(lr=0.05, momentum=0.9)")
            s = p.session()
            got = [float(s.run({"input_ids": i, "attention_mask": m, "labels": lb})["loss"]) for i, m, lb in batches]
            with self.subTest(target=t):
                np.testing.assert_allclose(got, want, rtol=1e-5)
                sd, checked, moved = s.state_dict(), 0, 0.0
                start = self.net.state_dict()
                for k, v in ref.state_dict().items():
                    if k in sd:
                        w = v.numpy()
                        np.testing.assert_allclose(sd[k], w, rtol=0, atol=1e-4 * max(np.abs(w).max(), 1e-6), err_msg=k)
                        moved = max(moved, float(np.abs(sd[k] - start[k].numpy()).max()))
                        checked += 1
                self.assertGreater(checked, 15)
                self.assertGreater(moved, 1e-3)   # the steps moved the weights: a comparison of something trained


def varint(v):
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def field(num, wt, payload):
    key = varint(num << 3 | wt)
    return key + (varint(len(payload)) + payload if wt == 2 else payload)


class Reader(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, data):
        p = os.path.join(self.dir, name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def test_unpacked_repeated_fields(self):
        """y = x + c, c's dims and float_data one key per element (proto2's unpacked form), against the packed model."""
        c = np.random.default_rng().standard_normal(3).astype(np.float32)
        m = models.model("unpacked", [helper.make_node("Add", ["x", "c"], ["y"])], [("x", TensorProto.FLOAT, [2, 3])],
                         [("y", TensorProto.FLOAT, [2, 3])], [helper.make_tensor("c", TensorProto.FLOAT, [3], c.tolist())])
        packed = self.write("packed.onnx", m.SerializeToString())
        # the initializer again, by hand: dims (1) and float_data (4) unpacked
        t = field(1, 0, varint(3)) + field(2, 0, varint(TensorProto.FLOAT)) + field(8, 2, b"c")
        t += b"".join(field(4, 5, struct.pack("<f", v)) for v in c)
        g = onnx.GraphProto()
        g.CopyFrom(m.graph)
        del g.initializer[:]
        graph = g.SerializeToString() + field(5, 2, t)
        mm = onnx.ModelProto()
        mm.CopyFrom(m)
        mm.ClearField("graph")
        unpacked = self.write("unpacked.onnx", mm.SerializeToString() + field(7, 2, graph))
        x = np.random.default_rng().standard_normal((2, 3)).astype(np.float32)
        xin = os.path.join(self.dir, "x.npy")
        np.save(xin, x)
        got = []
        for p in (packed, unpacked):
            tfuse("import", p)
            tfuse("run", p[:-5] + ".ir", "--params", p[:-5] + ".safetensors", "--input", f"x={xin}", "--output", f"y={p}.y.npy")
            got.append(np.load(p + ".y.npy"))
        np.testing.assert_array_equal(got[0], x + c)
        np.testing.assert_array_equal(got[1], got[0])

    def expect_error(self, path, *words, args=(), code=1):
        r = tfuse("import", path, *args, ok=False)
        self.assertEqual(r.returncode, code, r.stdout + r.stderr)
        for w in words:
            self.assertIn(w, r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_truncated(self):
        m = models.all_models()["conv"].SerializeToString()
        for cut in (1, 7, len(m) // 2, len(m) - 1):
            self.expect_error(self.write("cut.onnx", m[:cut]), "cut.onnx: error: not a valid ONNX model: byte ")
        self.expect_error(self.write("empty.onnx", b""), "no graph", "the file is empty")
        self.expect_error(self.write("text.onnx", b"module m\ninput x : f32[2]\n"), "not a valid ONNX model")

    def test_unsupported(self):
        n = helper.make_node
        m = models.model("nms", [n("Relu", ["x"], ["r"]), n("TopK", ["r", "k"], ["v", "i"], name="top")],
                         [("x", TensorProto.FLOAT, [4])], [("v", TensorProto.FLOAT, [2])],
                         [helper.make_tensor("k", TensorProto.INT64, [1], [2])])
        self.expect_error(self.write("topk.onnx", m.SerializeToString()), "node 2 'top' (TopK, opset 17)", "no import for this op")
        m = models.model("pads", [n("Conv", ["x", "w"], ["y"], pads=[0, 0, 1, 1], name="c")], [("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                         [("y", TensorProto.FLOAT, [1, 1, 4, 4])], [helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 2, 2], [1.0] * 4)])
        self.expect_error(self.write("pads.onnx", m.SerializeToString()), "(Conv, opset 17)", "asymmetric pads [0, 0, 1, 1]")
        self.expect_error(self.write("ok.onnx", models.all_models()["conv"].SerializeToString()), "--dim wants NAME=N",
                          args=("--dim", "x"), code=2)
        self.expect_error(self.write("ok.onnx", models.all_models()["embed"].SerializeToString()), "--dim batchsize: the model has no dim",
                          args=("--dim", "batchsize=4"))


if __name__ == "__main__":
    unittest.main(verbosity=1)
