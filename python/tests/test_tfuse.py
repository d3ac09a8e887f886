"""The Python API's contracts (python/tfuse/__init__.py's docstring): results
equal to `tfuse run`, no copies of inputs or outputs where promised, errors
as tfuse.Error with file:line:col, no leak over 1,000 sessions, sessions on
several threads, training, state and its files.

Run by ctest (tests/CMakeLists.txt: python_api) with TFUSE_LIBRARY, TFUSE_CLI
and TFUSE_EXAMPLES set; by hand from the repository root:
    PYTHONPATH=python python3 -m unittest discover -s python/tests -v
Tests that need torch are skipped where torch is not installed.
"""
import os
import subprocess
import sys
import tempfile
import threading
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tfuse  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.environ.get("TFUSE_EXAMPLES", os.path.join(ROOT, "examples"))
MLP = os.path.join(EXAMPLES, "mlp.ir")
CLI = os.environ.get("TFUSE_CLI", os.path.join(ROOT, "build", "tfuse"))
SEED = int(os.environ.get("TFUSE_TEST_SEED", "1234"))

try:
    import torch
except ImportError:
    torch = None

TINY = """module tiny
dim N = 4
input x : f32[N, 3]
param w : f32[3, 2] = normal(std=0.5)
h = matmul(x, w)
y = relu(h)
output y
output pre = h
"""


def batch(rng, b=8):
    return rng.standard_normal((b, 784)).astype(np.float32), rng.integers(0, 10, b).astype(np.int64)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Compile(unittest.TestCase):
    def test_program_facts(self):
        p = tfuse.compile(MLP, mode="infer", precision="fp32", dims={"B": 8}, explain=True, dump_ir="all",
                          dump_kernels=True)
        self.assertEqual(p.mode, "infer")
        self.assertEqual(p.precision, "fp32")
        self.assertEqual(p.inputs, {"x": tfuse.TensorSpec("f32", (8, 784)), "y": tfuse.TensorSpec("i64", (8,))})
        self.assertEqual(p.outputs["logits"], tfuse.TensorSpec("f32", (8, 10)))
        self.assertEqual(list(p.params), ["w1", "b1", "w2", "b2"])
        self.assertEqual(p.stats["params"], 784 * 256 + 256 + 256 * 10 + 10)
        self.assertEqual(p.stats["inputs"], 2)
        self.assertGreater(p.stats["kernels"], 0)
        self.assertTrue(p.explain and all(isinstance(d, tfuse.Decision) for d in p.explain))
        self.assertIn("amp", {d.pass_name for d in p.explain})
        self.assertIn("00-input.ir", p.dumps)
        self.assertIn("kernels.txt", p.dumps)
        self.assertIn("\nmodule mlp\n", p.dumps["00-input.ir"])
        self.assertIn("module mlp", p.ir)
        tc = tfuse.compile(MLP, dims={"B": 8}).train_config
        self.assertEqual((tc["optimizer"], tc["schedule"], tc["precision"]), ("adamw", "onecycle", "bf16"))
        self.assertAlmostEqual(tc["optimizer_params"]["weight_decay"], 0.01)
        self.assertEqual(tc["metrics"], [])
        met = open(MLP).read().replace("train {", "output lg_mean = m\ntrain {\n  metrics = lg_mean").replace(
            "loss = cross_entropy(lg, y)", "loss = cross_entropy(lg, y)\nm = reduce_mean(lg, axes=[0, 1])")
        self.assertEqual(tfuse.compile(met, dims={"B": 8}).train_config["metrics"], ["lg_mean"])

    def test_text_and_options(self):
        p = tfuse.compile(TINY, mode="infer", target="interp", dims={"N": 2}, opt_level=0)
        self.assertEqual(p.target, "interp")
        self.assertEqual(p.inputs["x"].shape, (2, 3))
        p = tfuse.compile(TINY.encode(), mode="infer", disable_passes=["cse"])
        self.assertEqual(p.inputs["x"].shape, (4, 3))


class Results(unittest.TestCase):
    def test_equals_tfuse_run(self):
        """The same model, inputs and seed through `tfuse run` and through
        Python: the interpreter bit for bit, the cpu target within fp32
        rounding."""
        if not os.path.exists(CLI):
            self.skipTest(f"no tfuse command at {CLI}")
        rng = np.random.default_rng(SEED)
        x, y = batch(rng)
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "x.npy"), x)
            np.save(os.path.join(d, "y.npy"), y)
            r = subprocess.run([CLI, "run", MLP, "--dim", "B=8", "--target=interp", "--precision=fp32", "--seed", "7",
                                "--input", f"x={d}/x.npy", "--input", f"y={d}/y.npy",
                                "--output", f"logits={d}/logits.npy", "--output", f"loss={d}/loss.npy"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            cli_logits, cli_loss = np.load(f"{d}/logits.npy"), np.load(f"{d}/loss.npy")
        out = tfuse.compile(MLP, mode="infer", target="interp", precision="fp32", dims={"B": 8}).session(seed=7).run(
            x=x, y=y)
        np.testing.assert_array_equal(out["logits"], cli_logits)
        np.testing.assert_array_equal(out["loss"], cli_loss)
        if tfuse.default_target() != "interp":
            cpu = tfuse.compile(MLP, mode="infer", target="cpu", precision="fp32", dims={"B": 8}).session(seed=7)
            got = cpu.run(x=x, y=y)
            np.testing.assert_allclose(got["logits"], cli_logits, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got["loss"], cli_loss, rtol=1e-5)

    def test_profile_bytes_and_copy_bandwidth(self):
        if tfuse.default_target() == "interp":
            self.skipTest("no cpu target in this build")
        s = tfuse.compile("input x : f32[256, 64]\ny = relu(x)\noutput y\n", mode="infer", target="cpu").session()
        s.set_profiling(True)
        s.run(x=np.ones((256, 64), np.float32))
        (k,) = [k for k in s.profile() if k["how"] == "jit"]
        self.assertEqual((k["elements"], k["bytes"]), (16384, 2 * 16384 * 4))   # read once, written once
        self.assertGreater(s.copy_bandwidth(), 0.1)
        interp = tfuse.compile(TINY, mode="infer", target="interp").session()
        with self.assertRaises(tfuse.Error) as e:
            interp.copy_bandwidth()
        self.assertIn("interp target", str(e.exception))

    def test_against_numpy(self):
        s = tfuse.compile(TINY, mode="infer").session(seed=3)
        w = s.state_dict()["w"]
        x = np.random.default_rng(SEED).standard_normal((4, 3)).astype(np.float32)
        out = s.run(x=x)
        np.testing.assert_allclose(out["pre"], x.astype(np.float64) @ w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["y"], np.maximum(out["pre"], 0), rtol=0, atol=0)


class ZeroCopy(unittest.TestCase):
    def setUp(self):
        self.s = tfuse.compile(TINY, mode="infer").session(seed=3)

    def test_inputs_read_in_place(self):
        """A bound array is read where it lies: a change made to it after
        bind and before run is what run sees."""
        x = np.ones((4, 3), np.float32)
        self.s.bind(x=x)
        x[:] = 2.0   # after binding: a copy taken at bind would miss this
        out = self.s.run()
        ref = tfuse.compile(TINY, mode="infer").session(seed=3).run(x=np.full((4, 3), 2.0, np.float32))
        np.testing.assert_array_equal(out["pre"], ref["pre"])
        # any object with the buffer protocol, without a copy either
        import array
        buf = array.array("f", [1.0] * 12)
        self.assertEqual(self.s.run(x=np.frombuffer(buf, np.float32).reshape(4, 3))["pre"].shape, (4, 2))

    def test_outputs_are_views(self):
        """run() returns arrays over the session's buffers: the same memory
        each run, holding the latest run's values; read-only; alive as long
        as an array views it, even after the session is closed."""
        a = self.s.run(x=np.ones((4, 3), np.float32))["pre"]
        first = a.copy()
        ptr = a.__array_interface__["data"][0]
        b = self.s.run(x=np.full((4, 3), 3.0, np.float32))["pre"]
        self.assertEqual(b.__array_interface__["data"][0], ptr)
        self.assertTrue(np.shares_memory(a, b) or a.__array_interface__["data"][0] == ptr)
        np.testing.assert_array_equal(a, b)            # a now shows the second run
        np.testing.assert_allclose(a, 3.0 * first, rtol=1e-6)
        self.assertFalse(a.flags.writeable)
        self.s.close()
        del self.s
        np.testing.assert_allclose(a, 3.0 * first, rtol=1e-6)   # memory still there
        with self.assertRaises(ValueError):
            a[0, 0] = 1.0

    def test_conversions_refused(self):
        """No silent copy: a wrong dtype or a strided array is an error
        saying what to pass; lists (nothing to share) are converted."""
        with self.assertRaises(tfuse.Error) as e:
            self.s.run(x=np.ones((4, 3), np.float64))
        self.assertIn("input 'x' is f32[4, 3]", str(e.exception))
        self.assertIn("float64", str(e.exception))
        with self.assertRaises(tfuse.Error) as e:
            self.s.run(x=np.ones((3, 4), np.float32).T)
        self.assertIn("C-contiguous", str(e.exception))
        with self.assertRaises(tfuse.Error) as e:
            self.s.run(x=np.ones((4, 4), np.float32))
        self.assertIn("input 'x' is f32[4, 3], the data given is f32[4, 4]", str(e.exception))
        out = self.s.run(x=[[1, 2, 3]] * 4)
        self.assertEqual(out["pre"].shape, (4, 2))

    def test_dlpack_producer(self):
        """An object that offers only DLPack is read in place too."""
        class Producer:
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, **kw):
                return self.a.__dlpack__(**kw)

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        if not hasattr(np.ndarray, "__dlpack__"):
            self.skipTest("this NumPy has no DLPack")
        x = np.ones((4, 3), np.float32)
        self.s.bind(x=Producer(x))
        x *= 2.0   # after binding
        got = self.s.run()["pre"].copy()
        np.testing.assert_array_equal(got, self.s.run(x=np.full((4, 3), 2.0, np.float32))["pre"])

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_torch_cpu_tensor(self):
        t = torch.ones(4, 3)
        self.s.bind(x=t)
        t.mul_(2.0)   # in place, after binding: read in place through DLPack
        got = self.s.run()["pre"]
        ref = self.s.run(x=np.full((4, 3), 2.0, np.float32))["pre"].copy()
        self.s.bind(x=t)
        np.testing.assert_array_equal(self.s.run()["pre"], ref)
        self.assertEqual(got.shape, (4, 2))
        with self.assertRaises(tfuse.Error):
            self.s.run(x=torch.ones(4, 3, dtype=torch.float64))
        tt = torch.from_numpy(self.s.run(x=t)["pre"].copy())
        self.assertEqual(tuple(tt.shape), (4, 2))

    def test_bf16(self):
        s = tfuse.compile("module b\ninput x : bf16[4]\ny = relu(x)\noutput y\n", mode="infer").session()
        vals = np.array([-1.5, 0.5, 2.0, -0.0], np.float32)
        bits = (vals.view(np.uint32) >> 16).astype(np.uint16)
        y = s.run(x=bits)["y"]
        self.assertEqual(y.dtype, np.float32)
        np.testing.assert_array_equal(y, np.maximum(vals, 0))
        with self.assertRaises(tfuse.Error):
            s.run(x=vals)


class Errors(unittest.TestCase):
    def test_bad_model_text(self):
        with self.assertRaises(tfuse.Error) as e:
            tfuse.compile("module m\ninput x : f32[2]\ny = relu(x\noutput y\n", name="bad.ir")
        self.assertRegex(str(e.exception), r"^bad\.ir:3:11: error: ")
        self.assertEqual(e.exception.location, ("bad.ir", 3, 11))
        self.assertEqual(e.exception.status, "parse error")

    def test_bad_model_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.ir")
            with open(path, "w") as f:
                f.write("module m\ninput x : f32[2, 3]\ny = matmul(x, x)\noutput y\n")
            with self.assertRaises(tfuse.Error) as e:
                tfuse.compile(path)
            self.assertEqual(e.exception.location[0], path)
            self.assertEqual(e.exception.location[1], 3)
            self.assertEqual(e.exception.status, "verify error")
        with self.assertRaises(tfuse.Error) as e:
            tfuse.compile("/nonexistent/model.ir")
        self.assertIn("/nonexistent/model.ir", str(e.exception))
        self.assertEqual(e.exception.status, "i/o error")

    def test_settings_from_the_library(self):
        # the library's settings table (include/tfuse_settings.def) drives compile()'s keywords and its struct
        st = tfuse.settings()
        self.assertEqual(st["no_tf32"]["flag"], "--no-tf32")
        self.assertEqual(st["no_tf32"]["env"], "TFUSE_NO_TF32")
        self.assertEqual(st["llvm_pipeline"]["type"], "str")
        self.assertEqual(st["cpu_conv_im2col"]["target"], "cpu")
        p = tfuse.compile(MLP, mode="infer", dims={"B": 2}, cpu_conv_im2col=True, llvm_pipeline="default<O1>")
        self.assertEqual(p.session().run(x=np.ones((2, 784), np.float32), y=np.zeros(2, np.int64))["logits"].shape,
                         (2, 10))

    def test_bad_arguments(self):
        with self.assertRaises(tfuse.Error):
            tfuse.compile(MLP, dims={"Q": 3})
        with self.assertRaises(tfuse.Error):
            tfuse.compile(MLP, target="tpu")
        with self.assertRaises(tfuse.Error):
            tfuse.compile(MLP, precision="fp8")
        with self.assertRaises(tfuse.Error):
            tfuse.compile(MLP, mode="eval")
        with self.assertRaises(TypeError):
            tfuse.compile(MLP, no_such_setting=1)
        s = tfuse.compile(MLP, mode="infer", dims={"B": 2}).session()
        with self.assertRaises(tfuse.Error) as e:
            s.run(z=np.zeros(2))
        self.assertIn("no input named 'z'", str(e.exception))
        with self.assertRaises(tfuse.Error) as e:
            s.run()
        self.assertIn("not bound", str(e.exception))
        with self.assertRaises(tfuse.Error) as e:
            s.run(x=np.zeros((2, 784), np.float32), y=np.array([3, 10]))
        self.assertIn("out of range", str(e.exception))
        with self.assertRaises(tfuse.Error):
            s.train_step(x=np.zeros((2, 784), np.float32), y=np.array([3, 1]))
        with self.assertRaises(tfuse.Error):
            s.load_state_dict({"nope": np.zeros(3)})
        with self.assertRaises(tfuse.Error):
            s.load_state_dict({"b2": np.zeros(3)})
        s.close()
        with self.assertRaises(tfuse.Error):
            s.run()


class Training(unittest.TestCase):
    def test_steps_state_and_resume(self):
        rng = np.random.default_rng(SEED)
        x, y = batch(rng)
        prog = tfuse.compile(MLP, mode="train", precision="fp32", dims={"B": 8})
        a = prog.session(seed=5)
        losses = [a.train_step(x=x, y=y)[0] for _ in range(3)]
        self.assertLess(losses[-1], losses[0])
        loss, metrics = a.train_step({"x": x, "y": y})
        self.assertEqual(metrics["step"], 4)
        self.assertIn("lr", metrics)
        self.assertIn("opt.m.w1", a.state_dict())

        # a checkpoint file, with metadata, resumes bit for bit
        with tempfile.TemporaryDirectory() as d:
            ck = os.path.join(d, "ck.safetensors")
            a.save(ck, metadata={"note": "py"})
            b = prog.session(seed=99)
            self.assertEqual(b.load(ck), {"note": "py", "step": "4"})
            self.assertEqual(b.missing_params, [])
            self.assertEqual(b.step, 4)   # the run counter, from the metadata
            np.testing.assert_array_equal(b.state_dict()["train.step"], a.state_dict()["train.step"])
            la, lb = a.train_step(x=x, y=y)[0], b.train_step(x=x, y=y)[0]
            self.assertEqual(la, lb)

        # state_dict -> load_state_dict: an inference session of the trained params
        inf = tfuse.compile(MLP, mode="infer", precision="fp32", dims={"B": 8}).session(seed=0)
        missing = inf.load_state_dict({k: v for k, v in a.state_dict().items() if k in inf.program.params},
                                      strict=True)
        self.assertEqual(missing, [])
        got = inf.run(x=x, y=y)["logits"].copy()
        ref = prog.session(seed=1)
        ref.load_state_dict(a.state_dict())
        np.testing.assert_allclose(got, ref.run(x=x, y=y)["logits"], rtol=1e-3, atol=1e-4)
        with self.assertRaises(tfuse.Error):
            inf.load_state_dict({"w1": a.state_dict()["w1"]}, strict=True)


class Outputs(unittest.TestCase):
    def test_only_the_outputs_asked_for(self):
        prog = tfuse.compile(MLP, mode="infer", precision="fp32", dims={"B": 8}, outputs=["logits"])
        self.assertEqual(list(prog.outputs), ["logits"])
        self.assertNotIn("y", prog.inputs)   # the labels only the loss read
        x = np.random.default_rng(SEED).random((8, 784), dtype=np.float32)
        self.assertEqual(prog.session().run(x=x)["logits"].shape, (8, 10))
        with self.assertRaises(tfuse.Error):
            tfuse.compile(MLP, mode="infer", outputs=["no_such_output"])


class Packages(unittest.TestCase):
    def test_save_load_round_trip(self):
        rng = np.random.default_rng(SEED)
        x, y = batch(rng)
        prog = tfuse.compile(MLP, mode="infer", precision="fp32", dims={"B": 8})
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "mlp.tfp")
            info = prog.save(path, seed=3)
            self.assertTrue(info["has_params"])
            self.assertGreater(info["bytes"], 0)
            loaded = tfuse.load(path)
            self.assertEqual((loaded.mode, loaded.target), (prog.mode, prog.target))
            self.assertEqual(loaded.stats, prog.stats)
            # its sessions start from the package's params, whatever their seed
            a, b = prog.session(seed=3), loaded.session(seed=42)
            for k, v in a.state_dict().items():
                np.testing.assert_array_equal(b.state_dict()[k], v)
            np.testing.assert_array_equal(a.run(x=x, y=y)["logits"], b.run(x=x, y=y)["logits"])
            if loaded.target == "cpu":
                self.assertEqual(b.info["jit_compiled"], 0)
            # a cut file is refused with the reason
            with open(path, "rb") as f:
                data = f.read()
            cut = os.path.join(d, "cut.tfp")
            with open(cut, "wb") as f:
                f.write(data[: len(data) // 2])
            with self.assertRaises(tfuse.Error) as e:
                tfuse.load(cut)
            self.assertIn("truncated or corrupted", str(e.exception))


class Lifetimes(unittest.TestCase):
    @unittest.skipIf(os.environ.get("TFUSE_TEST_SANITIZED"),
                     "under ASan freed memory waits in its quarantine: resident memory says nothing (the plain build checks)")
    def test_thousand_sessions_no_leak(self):
        """1,000 sessions made, run and dropped: resident memory stays put
        (a session of this MLP holds ~150 KiB: a leaked one in each would
        grow it by ~150 MiB)."""
        prog = tfuse.compile(MLP, mode="infer", dims={"B": 4, "F": 64})
        x, y = np.ones((4, 64), np.float32), np.zeros(4, np.int64)

        def churn(n):
            for i in range(n):
                s = prog.session(seed=i)
                s.run(x=x, y=y)
                s.close()

        churn(100)   # warm: the kernel cache, the allocator's pools
        before = rss_bytes()
        churn(1000)
        grown = rss_bytes() - before
        self.assertLess(grown, 8 << 20, f"resident memory grew {grown / 2**20:.1f} MiB over 1,000 sessions")

    def test_threads(self):
        """Sessions of one program on several threads at once (and programs
        compiled on them) give what one thread gives."""
        prog = tfuse.compile(MLP, mode="infer", precision="fp32", dims={"B": 8}, threads=1)
        rng = np.random.default_rng(SEED)
        inputs = [batch(rng) for _ in range(4)]
        ref_s = prog.session(seed=2)
        ref = [ref_s.run(x=x, y=y)["logits"].copy() for x, y in inputs]
        errors = []

        def work(k):
            try:
                own = tfuse.compile(TINY, mode="infer").session(seed=k)
                own.run(x=np.ones((4, 3), np.float32))
                s = prog.session(seed=2)
                for r in range(15):
                    i = (k + r) % len(inputs)
                    out = s.run(x=inputs[i][0], y=inputs[i][1])
                    if not np.array_equal(out["logits"], ref[i]):
                        errors.append(f"thread {k} run {r}: logits differ")
            except Exception as e:   # noqa: BLE001 - reported below
                errors.append(f"thread {k}: {e!r}")

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])


class Library(unittest.TestCase):
    def test_where_and_what(self):
        self.assertTrue(tfuse.library_path is None or os.path.exists(tfuse.library_path)
                        or "libtfuse" in tfuse.library_path)
        self.assertIn("tfuse " + tfuse.__version__, tfuse.doctor())
        self.assertIn(tfuse.default_target(), ("interp", "cpu", "cuda"))
        info = tfuse.cache_info()
        self.assertGreaterEqual(info["limit"], 0)


if __name__ == "__main__":
    unittest.main()
