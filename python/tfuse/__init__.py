"""tfuse — compile and run neural-network models from Python.

A thin layer over libtfuse (include/tfuse.h) through ctypes:

    import numpy as np, tfuse
    prog = tfuse.compile("examples/mlp.ir", mode="infer", precision="fp32", dims={"B": 8})
    sess = prog.session(seed=0)
    out = sess.run(x=np.random.rand(8, 784).astype(np.float32), y=np.arange(8) % 10)
    out["loss"], out["logits"]              # NumPy arrays over the session's memory

    train = tfuse.compile("examples/mlp.ir", mode="train", dims={"B": 8}).session(seed=0)
    loss, metrics = train.train_step(x=..., y=...)   # one step: forward, backward, optimizer
    train.save("ckpt.safetensors")

What the calls promise:

- Inputs are not copied. A NumPy array (or anything with the buffer
  protocol or __array_interface__, or a CPU torch tensor, through DLPack)
  whose dtype is the input's and whose memory is C-contiguous is handed to
  the library as it is: tfuse reads it during the next run. An array of
  another dtype or layout is refused with a tfuse.Error saying what to
  pass (tfuse does not convert behind your back); Python lists and scalars,
  which have no memory to share, are converted.
- Outputs are not copied. run() returns read-only NumPy arrays that view
  the session's output buffers: they stay valid (the session's memory is
  kept alive while any of them exists) but hold the *next* run's values
  once the session runs again. Copy one (np.array(out["loss"])) to keep it.
  NumPy has no bfloat16: a bf16 output or state tensor comes back as a
  float32 copy, and a bf16 input takes uint16 (or int16) arrays of the raw
  bits, or a torch.bfloat16 tensor.
- Every failure raises tfuse.Error, whose message is libtfuse's: for bad
  model text "file:line:col: error: ...", with .location = (file, line, col).
- A Session is for one thread at a time (its calls take a lock); use one
  session per thread. Programs may be shared by threads. Sessions share one
  process-wide cache of compiled kernels (tf_cache_t), so the second session
  of a program compiles nothing.
"""
import atexit
import collections
import ctypes
import json
import os
import re
import shutil
import tempfile
import threading

import numpy as np

from . import _capi as C
from ._capi import byref

__version__ = C.HEADER_VERSION
__all__ = ["compile", "load", "export", "Exported", "Program", "Session", "Communicator", "Error", "TensorSpec", "Decision", "doctor", "default_target",
           "settings",
           "library_path", "cache_info"]

_BF16 = 2
_NP = {0: np.dtype("<f4"), 1: np.dtype("<f2"), 3: np.dtype("<f8"), 4: np.dtype("<i8"), 5: np.dtype("<i4"),
       6: np.dtype("bool")}


class Error(Exception):
    """A libtfuse call failed. str(e) and e.message are libtfuse's message
    ("file:line:col: error: ..." for bad input); e.status names the
    tf_status ("parse error", "invalid argument", ...); e.location is
    (file, line, col) when the message starts with one, else None."""

    def __init__(self, message, status="error"):
        super().__init__(message)
        self.message = message
        self.status = status
        m = re.match(r"^(.*?):(\d+):(\d+): ", message)
        self.location = (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


# ---- the library, loaded on first use ----

_load_lock = threading.Lock()
_lib = None
_cache = None
library_path = None   # where libtfuse.so was loaded from, after the first call


def _L():
    global _lib, _cache, library_path
    if _lib is None:
        with _load_lock:
            if _lib is None:
                try:
                    lib, path = C.load()
                except C.LibraryNotFound as e:
                    raise Error(str(e), "unavailable") from None
                cache = ctypes.c_void_p()
                if lib.tf_cache_create(byref(cache)) != C.TF_OK:
                    raise Error("tfuse: out of memory creating the kernel cache", "out of memory")
                _cache = cache.value
                atexit.register(lib.tf_cache_free, _cache)   # contexts still alive keep their reference
                library_path = path
                _lib = lib
    return _lib


def _status_name(st):
    return _L().tf_status_name(st).decode()


def _check(ctx, st):
    if st != C.TF_OK:
        msg = _L().tf_context_last_error(ctx).decode("utf-8", "replace") if ctx else ""
        if "LLVM JIT module" in msg and C.BUILD is not None and library_path == C.BUNDLED:
            msg += f" ({C.how_built()}: reinstall it, pip install --force-reinstall ./python)"
        raise Error(msg or "tfuse: " + _status_name(st), _status_name(st))


def _new_context():
    lib = _L()
    ctx = ctypes.c_void_p()
    st = lib.tf_context_create(byref(ctx))
    if st != C.TF_OK:
        raise Error("tfuse: cannot create a context: " + _status_name(st), _status_name(st))
    st = lib.tf_context_set_cache(ctx, _cache)
    if st != C.TF_OK:
        lib.tf_context_free(ctx)
        raise Error("tfuse: cannot attach the kernel cache: " + _status_name(st), _status_name(st))
    return ctx.value


def _target_of(target):
    if target is None:
        return _L().tf_default_target()
    if target not in C.TARGETS:
        raise Error(f"error: unknown target '{target}': expected one of {', '.join(C.TARGETS)}", "invalid argument")
    return C.TARGETS.index(target)


def default_target():
    """The target that runs best here: "cuda", "cpu" or "interp"."""
    return C.TARGETS[_L().tf_default_target()]


def doctor():
    """What this build and machine can run, and why not (tfuse doctor), as text."""
    lib = _L()
    ctx = _new_context()
    try:
        out = ctypes.c_void_p()
        _check(ctx, lib.tf_doctor(ctx, byref(out)))
        return C.take_string(out.value)
    finally:
        lib.tf_context_free(ctx)


def settings():
    """The target settings compile() takes, as the library declares them
    (include/tfuse_settings.def): {name: {"type": "bool" or "str", "target",
    "env", "env_on", "flag", "on", "off", "help"}}."""
    _L()
    return {k: dict(v) for k, v in C.SETTINGS.items()}


def cache_info():
    """The process-wide kernel cache the package's sessions share:
    {"limit", "kernels", "in_use", "evicted"}."""
    lib = _L()
    info = C.CacheInfo()
    st = lib.tf_cache_get_info(_cache, byref(info))
    if st != C.TF_OK:
        raise Error("tfuse: cache info: " + _status_name(st), _status_name(st))
    return {"limit": info.limit, "kernels": info.kernels, "in_use": info.in_use, "evicted": info.evicted}


# ---- handles: what frees the C objects, in children-first order ----

class _ProgramHandle:
    def __init__(self, lib, ctx):
        self.lib, self.ctx, self.ptr = lib, ctx, None

    def __del__(self):
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        if self.ptr:
            lib.tf_program_free(self.ptr)
        if self.ctx:
            lib.tf_context_free(self.ctx)
        self.ptr = self.ctx = None


class _SessionHandle:
    """Owns a session and its context; holds the program's handle, which is
    freed after it. Output arrays hold this handle, not the Session: the
    memory they view lives as long as they do."""

    def __init__(self, lib, ctx, program):
        self.lib, self.ctx, self.program, self.ptr = lib, ctx, program, None

    def __del__(self):
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        if self.ptr:
            lib.tf_session_free(self.ptr)
        if self.ctx:
            lib.tf_context_free(self.ctx)
        self.ptr = self.ctx = None


class _OutputMemory:
    """An output buffer of a session, for np.asarray: no copy."""

    def __init__(self, ptr, shape, dtype, owner):
        self.__array_interface__ = {"data": (ptr, True), "shape": shape, "typestr": dtype.str, "version": 3}
        self._owner = owner


# ---- dtypes ----

TensorSpec = collections.namedtuple("TensorSpec", "dtype shape")
TensorSpec.__doc__ = "A tensor's type: dtype ('f32', 'bf16', 'i64', ...) and shape (a tuple)."


def _spec_str(spec):
    return f"{spec.dtype}[{', '.join(str(d) for d in spec.shape)}]"


def _contiguous(a):
    """a, C-contiguous (np.ascontiguousarray would make a 0-d array 1-d)."""
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x):
    """float32 -> bfloat16 bits, rounding to nearest even (NaN stays NaN)."""
    x = _contiguous(np.asarray(x, dtype=np.float32))
    u = x.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if np.any(nan):
        rounded = np.where(nan, ((u >> 16) | np.uint32(0x40)).astype(np.uint16), rounded)
    return rounded


def _as_host_array(name, obj):
    """obj's memory as an ndarray without copying it, or None for objects
    that have no memory to share (lists, scalars)."""
    if isinstance(obj, np.ndarray):
        return obj
    mod = type(obj).__module__ or ""
    if mod.startswith("torch"):
        import torch
        if obj.device.type != "cpu":
            raise Error(f"error: input '{name}' is a tensor on {obj.device}: a tfuse session reads host memory "
                        f"(pass a CPU tensor)", "invalid argument")
        t = obj.detach()   # shares the memory
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)   # NumPy has no bfloat16: the bits
        return np.from_dlpack(t) if hasattr(np, "from_dlpack") else t.numpy()
    if hasattr(obj, "__dlpack__") and hasattr(np, "from_dlpack"):
        try:
            return np.from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError) as e:
            raise Error(f"error: input '{name}': its DLPack memory cannot be read on the host: {e}",
                        "invalid argument") from None
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array_struct__"):
        return np.asarray(obj)
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        return None


def _input_array(name, obj, spec, dt):
    a = _as_host_array(name, obj)
    if a is None:   # a list or a scalar: converted, as it must be
        if dt == _BF16:
            return _f32_to_bf16(np.asarray(obj, dtype=np.float32))
        return _contiguous(np.asarray(obj, dtype=_NP[dt]))
    if dt == _BF16:
        ok = a.dtype in (np.dtype(np.uint16), np.dtype(np.int16)) or a.dtype.name == "bfloat16"
        want = "uint16 (the bf16 bits), or a torch.bfloat16 tensor"
    else:
        ok = a.dtype == _NP[dt]
        want = f"np.{_NP[dt].name}"
    if not ok:
        raise Error(f"error: input '{name}' is {_spec_str(spec)}, the array given is {a.dtype.name}{list(a.shape)}: "
                    f"pass {want} (tfuse does not convert inputs; x.astype(...) makes a converted copy)",
                    "invalid argument")
    if not a.flags.c_contiguous or not a.flags.aligned:
        raise Error(f"error: input '{name}': the array is not C-contiguous and aligned (strides {a.strides}); "
                    f"tfuse reads inputs in place: pass np.ascontiguousarray(...)", "invalid argument")
    return a


class Decision(collections.namedtuple("Decision", "pass_name location text")):
    """One line of --explain: the pass that decided, where in the model
    ("file:line:col", or None) and what and why."""

    def __str__(self):
        where = f" {self.location}:" if self.location else ""
        return f"[{self.pass_name}]{where} {self.text}"


def _parse_explain(text):
    out = []
    for line in text.splitlines():
        m = re.match(r"^\[([^\]]+)\] (?:(\S+?:\d+:\d+): )?(.*)$", line)
        out.append(Decision(m.group(1), m.group(2), m.group(3)) if m else Decision(None, None, line))
    return out


def _read_tree(root):
    files = {}
    for d, _, names in os.walk(root):
        for n in sorted(names):
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                data = f.read()
            rel = os.path.relpath(p, root)
            try:
                files[rel] = data.decode("utf-8")
            except UnicodeDecodeError:
                files[rel] = data   # binaries (cubins) stay bytes
    return dict(sorted(files.items()))


# ---- compiling ----

def compile(source, mode="train", target=None, precision=None, dims=None, *, name=None, opt_level=1,
            disable_passes=(), checkpoint=None, memory_budget=0, memory_limit=0, threads=0, explain=False,
            dump_ir=None, dump_kernels=False, dump_llvm=False, dump_dir=None, outputs=None, loss=None, optimizer=None,
            **settings):
    """Parse, verify and compile a model; returns a Program.

    source: a path (str or os.PathLike) to a .ir file or an .onnx model
    (docs/onnx.md: its sessions start from its initializers), the model's text
    (a str with a newline in it, or bytes; `name` names it in messages,
    default "<string>"), or a tfuse.Exported (tfuse.export's result), whose
    sessions start from the exported weights and whose run() takes the
    forward's argument names. mode: "train" (each run is a whole training step)
    or "infer". target: "interp", "cpu", "cuda", "cuda-emu" or None (the
    best here). precision: None (the train block's), "fp32", "fp16",
    "bf16". dims: {"B": 64, ...} overrides `dim` declarations; "auto" picks
    the largest that fits memory_limit bytes. opt_level 0 runs only the
    passes a target needs; disable_passes leaves passes out; checkpoint
    None/"none"/"auto" with memory_budget (bytes); threads: the cpu
    target's (0: one per core). explain=True keeps each compiler decision
    in Program.explain. dump_ir ("all" or a pass name), dump_kernels and
    dump_llvm (True) keep those dumps in Program.dumps, as {file name:
    text}; they are written to dump_dir (default: a temporary directory,
    removed). settings: the target settings of tf_compile_options
    (include/tfuse_settings.def: llvm_pipeline, no_tf32, cuda_sync,
    cuda_fallback_all, cuda_explain, cuda_no_graphs, cpu_conv_im2col,
    cpu_gemm_openblas, cpu_state_every, cpu_conv_plain, cpu_explain, numerics_exact, attention_decomposed,
    data_parallel, allreduce_bucket;
    tfuse.settings() lists them); unset
    ones keep their defaults from the environment. outputs: compute only
    these outputs (names); inputs only the others read are then no inputs.
    loss: "cross_entropy(OUTPUT, LABELS)" or "mse_loss(OUTPUT, TARGET)" gives
    a model without a loss one (LABELS or TARGET a new input), to train an
    ONNX model; optimizer ("adamw(lr=1e-3)") its training step's optimizer
    when the model names none (tf_model_add_loss).
    """
    if hasattr(source, "text") and hasattr(source, "params") and hasattr(source, "layout"):   # an Exported
        prog = compile(source.text, mode, target, precision, dims, name=name or source.name, opt_level=opt_level,
                       disable_passes=disable_passes, checkpoint=checkpoint, memory_budget=memory_budget,
                       memory_limit=memory_limit, threads=threads, explain=explain, dump_ir=dump_ir,
                       dump_kernels=dump_kernels, dump_llvm=dump_llvm, dump_dir=dump_dir, loss=loss, optimizer=optimizer,
                       **settings)
        prog._initial_state = source.params
        prog._input_alias = {k: v for k, v in source.inputs.items() if k != v}
        return prog
    lib = _L()
    unknown = sorted(set(settings) - set(C.SETTINGS))
    if unknown:
        raise TypeError(f"compile() got unknown options {unknown}; the target settings are {list(C.SETTINGS)}")
    if mode not in C.MODES:
        raise Error(f"error: mode '{mode}': expected 'train' or 'infer'", "invalid argument")
    keep = []   # what ctypes pointers point into, alive until compiling is done
    o = C.CompileOptions()
    lib.tf_compile_options_init(byref(o))
    o.mode = C.MODES.index(mode)
    o.target = _target_of(target)
    o.opt_level = int(opt_level)
    o.memory_limit = int(memory_limit)
    o.memory_budget = int(memory_budget)
    o.threads = int(threads)
    if precision is not None:
        p = ctypes.c_int()
        if lib.tf_precision_parse(str(precision).encode(), byref(p)) != C.TF_OK:
            raise Error(f"error: precision '{precision}': expected fp32, fp16, bf16 or default", "invalid argument")
        o.precision = p.value
    if checkpoint is not None:
        c = ctypes.c_int()
        if lib.tf_checkpoint_parse(str(checkpoint).encode(), byref(c)) != C.TF_OK:
            raise Error(f"error: checkpoint '{checkpoint}': expected none or auto", "invalid argument")
        o.checkpoint = c.value
    if disable_passes:
        if isinstance(disable_passes, str):
            disable_passes = [disable_passes]
        arr = (ctypes.c_char_p * len(disable_passes))(*[str(s).encode() for s in disable_passes])
        keep.append(arr)
        o.disable_passes = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
        o.ndisable_passes = len(disable_passes)
    if outputs:   # compute only these outputs (tf_compile_options.outputs)
        if isinstance(outputs, str):
            outputs = [outputs]
        arr = (ctypes.c_char_p * len(outputs))(*[str(s).encode() for s in outputs])
        keep.append(arr)
        o.outputs = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
        o.noutputs = len(outputs)
    for k, v in settings.items():
        if C.SETTINGS[k]["type"] == "str":
            b = None if v is None else str(v).encode()
            keep.append(b)
            setattr(o, k, b)
        else:
            setattr(o, k, 1 if v else 0)
    dump_root = None
    if dump_ir or dump_kernels or dump_llvm:
        dump_root = os.fspath(dump_dir) if dump_dir is not None else tempfile.mkdtemp(prefix="tfuse-dump-")
        root_b = dump_root.encode()
        keep.append(root_b)
        o.dump_dir = root_b
        if dump_ir:
            d = str(dump_ir).encode()
            keep.append(d)
            o.dump_ir = d
        if dump_kernels:
            o.dump_kernels = root_b
        if dump_llvm:
            o.dump_llvm = root_b

    dim_list = []
    for k, v in (dims or {}).items():
        dim_list.append(C.DimOverride(str(k).encode(), -1 if v == "auto" else int(v)))
    dim_arr = (C.DimOverride * max(len(dim_list), 1))(*dim_list)

    handle = _ProgramHandle(lib, _new_context())
    ctx = handle.ctx
    model = ctypes.c_void_p()
    if isinstance(source, (bytes, bytearray)) or (isinstance(source, str) and "\n" in source):
        text = bytes(source) if isinstance(source, (bytes, bytearray)) else source.encode()
        st = lib.tf_model_parse_string(ctx, (name or "<string>").encode(), text, len(text), dim_arr, len(dim_list),
                                       byref(model))
    else:
        st = lib.tf_model_parse_file(ctx, os.fsencode(os.fspath(source)), dim_arr, len(dim_list), byref(model))
    _check(ctx, st)
    if loss is not None or optimizer is not None:
        st = lib.tf_model_add_loss(ctx, model, None if loss is None else str(loss).encode(),
                                   None if optimizer is None else str(optimizer).encode())
        if st != C.TF_OK:
            lib.tf_model_free(model)
        _check(ctx, st)

    explain_buf, explain_len, stream = ctypes.c_void_p(), ctypes.c_size_t(), None
    if explain:
        stream = C.libc.open_memstream(byref(explain_buf), byref(explain_len))
        if not stream:
            lib.tf_model_free(model)
            raise Error("tfuse: open_memstream failed", "out of memory")
        o.explain = stream
    prog = ctypes.c_void_p()
    try:
        st = lib.tf_program_compile(ctx, model, byref(o), byref(prog))
    finally:
        lib.tf_model_free(model)   # the program keeps a copy of the module
        decisions = None
        if stream:
            C.libc.fclose(stream)
            decisions = _parse_explain(ctypes.string_at(explain_buf, explain_len.value).decode("utf-8", "replace"))
            C.libc.free(explain_buf)
        dumps = {}
        if dump_root is not None:
            if os.path.isdir(dump_root):
                dumps = _read_tree(dump_root)
            if dump_dir is None:
                shutil.rmtree(dump_root, ignore_errors=True)
    _check(ctx, st)
    handle.ptr = prog.value
    return Program(handle, mode=mode, target=C.TARGETS[o.target], explain=decisions, dumps=dumps)


def load(path):
    """The Program in a package `tfuse compile` (or Program.save) wrote: no
    kernel is compiled, and its sessions start from the package's params.
    A truncated, corrupted or foreign package raises Error saying why."""
    lib = _L()
    handle = _ProgramHandle(lib, _new_context())
    prog = ctypes.c_void_p()
    _check(handle.ctx, lib.tf_program_load(handle.ctx, os.fsencode(os.fspath(path)), byref(prog)))
    handle.ptr = prog.value
    mode, target = ctypes.c_int(), ctypes.c_int()
    lib.tf_program_describe(handle.ptr, byref(mode), byref(target), None)
    return Program(handle, mode=C.MODES[mode.value], target=C.TARGETS[target.value], explain=None, dumps={})


class Program:
    """A compiled model (tf_program_t): passes run, plan made, stats known.
    Made by tfuse.compile. Attributes: mode, target, precision, stats
    ({name: int}), explain (a list of Decision, with explain=True), dumps
    ({file: text}), inputs/outputs/params/buffers ({name: TensorSpec}),
    train_config (the train block, defaults filled in), ir (the compiled
    module's text)."""

    def __init__(self, handle, mode, target, explain, dumps):
        self._h = handle
        self._lock = threading.Lock()
        self.mode, self.target, self.explain, self.dumps = mode, target, explain, dumps
        self._initial_state = None   # an exported model's weights, which its sessions start from
        self._input_alias = {}       # forward argument name -> input name, where they differ
        lib, p = handle.lib, handle.ptr
        stats = {}
        for i in range(lib.tf_program_stat_count(p)):
            n, v = ctypes.c_char_p(), ctypes.c_int64()
            if lib.tf_program_stat(p, i, byref(n), byref(v)) == C.TF_OK:
                stats[n.value.decode()] = v.value
        self.stats = stats
        self.inputs, self.outputs, self.params, self.buffers = (self._io(k) for k in range(4))
        self.train_config = self._train_config()
        self.precision = self.train_config["precision"]

    def _io(self, kind):
        lib, p = self._h.lib, self._h.ptr
        out = {}
        for i in range(lib.tf_program_io_count(p, kind)):
            n, dt, rank, shape = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_int(), (ctypes.c_int64 * 8)()
            st = lib.tf_program_io(p, kind, i, byref(n), byref(dt), byref(rank), shape)
            if st != C.TF_OK:
                raise Error("tfuse: program io: " + _status_name(st), _status_name(st))
            out[n.value.decode()] = TensorSpec(C.DTYPES[dt.value], tuple(shape[:rank.value]))
        return out

    def _train_config(self):
        lib = self._h.lib
        tc = C.TrainConfig()
        with self._lock:
            _check(self._h.ctx, lib.tf_program_train_config(self._h.ctx, self._h.ptr, byref(tc)))
        return {
            "has_block": bool(tc.has_block), "optimizer": tc.optimizer.decode(), "lr": tc.lr,
            "optimizer_params": {tc.optimizer_params[i].name.decode(): tc.optimizer_params[i].value
                                 for i in range(tc.noptimizer_params)},
            "schedule": tc.schedule.decode(),
            "schedule_params": {tc.schedule_params[i].name.decode(): tc.schedule_params[i].value
                                for i in range(tc.nschedule_params)},
            "precision": lib.tf_precision_name(tc.precision).decode(), "clip_grad_norm": tc.clip_grad_norm,
            "accumulate": tc.accumulate, "metrics": [tc.metrics[i].decode() for i in range(tc.nmetrics)],
        }

    @property
    def ir(self):
        """The compiled module as text (the format a model is written in)."""
        out = ctypes.c_void_p()
        with self._lock:
            _check(self._h.ctx, self._h.lib.tf_program_print(self._h.ctx, self._h.ptr, byref(out)))
        return C.take_string(out.value)

    def write_artifact(self, directory, arch=None):
        """program.ir, kernels.txt and, for the cuda target, CUDA sources and
        cubins in directory (tf_program_write_artifact); returns the number
        of cubins written."""
        n = ctypes.c_int()
        with self._lock:
            _check(self._h.ctx, self._h.lib.tf_program_write_artifact(
                self._h.ctx, self._h.ptr, os.fsencode(os.fspath(directory)), arch.encode() if arch else None, byref(n)))
        return n.value

    def save(self, path, params=True, seed=0, cuda_archs=None):
        """This program as a package (tf_program_save): tfuse.load and
        `tfuse run PATH` start from it without compiling a kernel. params:
        include the initial params a session of `seed` starts from (else
        sessions run the initializers); cuda_archs: for a cuda program, the
        architectures to hold cubins for ("sm_80,sm_90"; default sm_90).
        Returns {"objects", "objects_cached", "has_params", "bytes"}."""
        info = C.PackageInfo()
        with self._lock:
            _check(self._h.ctx, self._h.lib.tf_program_save(self._h.ctx, self._h.ptr, os.fsencode(os.fspath(path)),
                                                            1 if params else 0, seed,
                                                            cuda_archs.encode() if cuda_archs else None, byref(info)))
        return {"objects": info.objects, "objects_cached": info.objects_cached, "has_params": bool(info.has_params),
                "bytes": info.bytes}

    def session(self, seed=0, target=None, comm=None):
        """A Session of this program on its target (or another one); seed
        drives initializers and dropout; comm: a Communicator whose ranks
        the program's allreduce ops average over (data_parallel)."""
        return Session(self, seed=seed, target=target, comm=comm)

    def __repr__(self):
        return f"<tfuse.Program {self.mode} on {self.target}: inputs {list(self.inputs)}, outputs {list(self.outputs)}>"


# ---- data parallel (docs/distributed.md) ----

class Communicator:
    """The ranks of a data-parallel job (tf_comm_t). Communicator.mpi()
    joins the MPI job this process runs in (Open MPI's mpirun); mpi(comm)
    takes an mpi4py communicator instead of MPI_COMM_WORLD (tfuse duplicates
    it). Give it to program.session(comm=...) of a program compiled with
    data_parallel=True: each rank binds its own batch, and the step averages
    the gradients over the ranks. launched() says whether mpirun started this
    process as one of several ranks: (rank, size), or None."""

    def __init__(self, ptr, ctx):
        self._lib, self._ctx, self._ptr = _L(), ctx, ptr

    @staticmethod
    def launched():
        lib = _L()
        r, n = ctypes.c_int(), ctypes.c_int()
        return (r.value, n.value) if lib.tf_comm_launched(byref(r), byref(n)) else None

    @classmethod
    def mpi(cls, comm=None):
        lib, ctx = _L(), _new_context()
        handle = None
        if comm is not None:   # mpi4py: the MPI_Comm value (Open MPI's is a pointer) at the object's handle address
            from mpi4py import MPI
            handle = ctypes.c_void_p.from_address(MPI._addressof(comm)).value
        out = ctypes.c_void_p()
        _check(ctx, lib.tf_comm_create_mpi(ctx, handle, byref(out)))
        return cls(out.value, ctx)

    @classmethod
    def single(cls):
        """A job of one rank (each allreduce is a copy)."""
        lib, ctx = _L(), _new_context()
        out = ctypes.c_void_p()
        _check(ctx, lib.tf_comm_create_self(ctx, byref(out)))
        return cls(out.value, ctx)

    @property
    def rank(self):
        return self._lib.tf_comm_rank(self._ptr)

    @property
    def size(self):
        return self._lib.tf_comm_size(self._ptr)

    def close(self):
        """Release the communicator (MPI is finalized if tfuse initialized it); after its sessions."""
        if self._ptr:
            self._lib.tf_comm_free(self._ptr)
            self._ptr = None
        if self._ctx:
            self._lib.tf_context_free(self._ctx)
            self._ctx = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return f"<tfuse.Communicator rank {self.rank} of {self.size}>"


# ---- sessions ----

class Session:
    """A program on a target with its state (tf_session_t). See the module's
    docstring for what run() promises about copies and lifetimes."""

    def __init__(self, program, seed=0, target=None, comm=None):
        if not isinstance(program, Program):
            raise TypeError("Session(program): a tfuse.Program, from tfuse.compile")
        if comm is not None and not isinstance(comm, Communicator):
            raise TypeError("Session(comm=...): a tfuse.Communicator (Communicator.mpi())")
        lib = _L()
        self.program = program
        self._lock = threading.Lock()
        self._bound = {}
        h = _SessionHandle(lib, _new_context(), program._h)
        s = ctypes.c_void_p()
        t = _target_of(target if target is not None else program.target)
        _check(h.ctx, lib.tf_session_create(h.ctx, program._h.ptr, t, int(seed), byref(s)))
        h.ptr = s.value
        self._h = h
        if comm is not None:
            _check(h.ctx, lib.tf_session_set_comm(h.ptr, comm._ptr))
        self.comm = comm   # kept alive as long as the session
        self.target = C.TARGETS[t]
        self.seed = int(seed)
        self.missing_params = None
        if program._initial_state is not None:
            self.load_state_dict(program._initial_state)

    # a closed session's calls fail clearly, not on a NULL pointer
    def _handle(self):
        if self._h is None:
            raise Error("error: the session is closed", "invalid argument")
        return self._h

    def close(self):
        """Drop the session; its memory goes when no output array views it."""
        with self._lock:
            self._h = None
            self._bound = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _bind_locked(self, h, inputs):
        specs = self.program.inputs
        alias = self.program._input_alias
        for name, obj in inputs.items():
            name = alias.get(name, name)
            spec = specs.get(name)
            if spec is None and h.lib.tf_program_input_unread(self.program._h.ptr, name.encode()):
                continue   # declared by the model, and nothing the outputs read depends on it: not needed
            if spec is None:
                raise Error(f"error: the model has no input named '{name}' (it has: {', '.join(specs) or 'none'})",
                            "invalid argument")
            dt = C.DTYPES.index(spec.dtype)
            a = _input_array(name, obj, spec, dt)
            if a.ndim > 8:
                raise Error(f"error: input '{name}' has rank {a.ndim}; tfuse tensors have at most 8 axes",
                            "invalid argument")
            shape = (ctypes.c_int64 * 8)(*a.shape)
            # a zero-size array still needs an address the library may hold
            ptr = a.ctypes.data if a.size else ctypes.addressof(shape)
            _check(h.ctx, h.lib.tf_session_bind(h.ptr, name.encode(), dt, shape, a.ndim, ptr))
            self._bound[name] = a   # the memory the session reads, kept alive until rebound

    def bind(self, inputs=None, **kw):
        """Bind inputs by name without copying them; the next run() reads them."""
        inputs = dict(inputs or {}, **kw)
        with self._lock:
            self._bind_locked(self._handle(), inputs)

    def run(self, inputs=None, **kw):
        """Bind the inputs given (others stay as bound before), run one step
        (in a train program: forward, backward and the optimizer) and return
        {output name: array}, arrays over the session's own buffers that
        the next run overwrites."""
        inputs = dict(inputs or {}, **kw)
        with self._lock:
            h = self._handle()
            self._bind_locked(h, inputs)
            _check(h.ctx, h.lib.tf_session_run(h.ptr))
            return self._outputs_locked(h)

    def _output_locked(self, h, name):
        v = C.TensorView()
        _check(h.ctx, h.lib.tf_session_output(h.ptr, name.encode(), byref(v)))
        shape = tuple(v.shape[:v.rank])
        if v.dtype == _BF16:
            raw = np.asarray(_OutputMemory(v.data, shape, np.dtype("<u2"), h))
            return _bf16_to_f32(raw)
        a = np.asarray(_OutputMemory(v.data, shape, _NP[v.dtype], h))
        return a

    def _outputs_locked(self, h):
        return {n: self._output_locked(h, n) for n in self.program.outputs}

    def outputs(self):
        """The last run's outputs, as run() returns them."""
        with self._lock:
            return self._outputs_locked(self._handle())

    def output(self, name):
        """One output of the last run (a view, as in run())."""
        with self._lock:
            return self._output_locked(self._handle(), name)

    def train_step(self, batch=None, **kw):
        """One training step on a batch: returns (loss, metrics), loss a
        float and metrics {name: float} for the program's other scalar
        outputs (the learning rate "lr", ...) and "step", the steps run."""
        if self.program.mode != "train":
            raise Error("error: train_step needs a program compiled with mode='train' (this one is 'infer'; "
                        "run() runs it)", "invalid argument")
        out = self.run(batch, **kw)
        if "loss" not in out:
            raise Error(f"error: the program has no output named 'loss' (outputs: {', '.join(out)})",
                        "invalid argument")
        loss = float(out["loss"].reshape(-1)[0])
        metrics = {n: float(a.reshape(-1)[0]) for n, a in out.items() if n != "loss" and a.size == 1}
        metrics["step"] = self.step
        return loss, metrics

    # ---- state ----
    def _state_specs(self):
        return {**self.program.params, **self.program.buffers}

    def state_dict(self):
        """Every param and buffer ({name: array}, copies): the model's and,
        in a train program, the optimizer's ("opt.*") and the step's ("train.*")."""
        out = {}
        with self._lock:
            h = self._handle()
            for name, spec in self._state_specs().items():
                dt = C.DTYPES.index(spec.dtype)
                a = np.empty(spec.shape, dtype=np.uint16 if dt == _BF16 else _NP[dt])
                v = C.TensorView()
                v.data = a.ctypes.data if a.size else None
                if a.size:
                    _check(h.ctx, h.lib.tf_session_get_state(h.ptr, name.encode(), byref(v), a.nbytes))
                out[name] = _bf16_to_f32(a) if dt == _BF16 else a
        return out

    def load_state_dict(self, state, strict=False):
        """Set params and buffers from {name: array-like} (converted to each
        tensor's dtype; the shape must match). A name the program does not
        have is an error. strict=True: every param must be given. Returns
        the names of the params and buffers not given."""
        specs = self._state_specs()
        unknown = [n for n in state if n not in specs]
        if unknown:
            raise Error(f"error: the model has no param or buffer named '{unknown[0]}'", "invalid argument")
        missing = [n for n in specs if n not in state]
        missing_params = [n for n in missing if n in self.program.params]
        if strict and missing_params:
            raise Error(f"error: load_state_dict(strict=True): no value for {', '.join(missing_params)}",
                        "invalid argument")
        with self._lock:
            h = self._handle()
            for name, value in state.items():
                spec = specs[name]
                dt = C.DTYPES.index(spec.dtype)
                a = np.asarray(value)
                if dt == _BF16:
                    a = a if a.dtype == np.uint16 else _f32_to_bf16(a.astype(np.float32))
                else:
                    a = a.astype(_NP[dt], copy=False)
                a = _contiguous(a)
                if a.ndim > 8:
                    raise Error(f"error: '{name}' has rank {a.ndim}", "invalid argument")
                v = C.TensorView(dt, a.ndim, (ctypes.c_int64 * 8)(*a.shape),
                                 a.ctypes.data if a.size else ctypes.addressof(ctypes.c_char()))
                _check(h.ctx, h.lib.tf_session_set_state(h.ptr, name.encode(), byref(v)))
        return missing

    def save(self, path, metadata=None):
        """All params and buffers to a safetensors file, atomically;
        metadata: {str: str}, kept in the file's __metadata__, to which
        "step" (the run counter, as `tfuse train` writes it) is added unless
        given, so that load() continues the dropout masks' sequence."""
        metadata = dict(metadata or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise Error("error: save(metadata=...): keys and values must be strings (the safetensors rule)",
                        "invalid argument")
        with self._lock:
            h = self._handle()
            if "step" not in metadata:
                v = ctypes.c_uint64()
                _check(h.ctx, h.lib.tf_session_step(h.ptr, byref(v)))
                metadata["step"] = str(v.value)
            meta = json.dumps(metadata, separators=(",", ":")).encode()
            _check(h.ctx, h.lib.tf_session_save_state_meta(h.ptr, os.fsencode(os.fspath(path)), meta))

    def load(self, path):
        """Params and buffers from a safetensors file (params it lacks keep
        their values; see missing_params); returns its metadata ({} if none).
        A "step" there (save() writes it) becomes the run counter."""
        out = ctypes.c_void_p()
        with self._lock:
            h = self._handle()
            _check(h.ctx, h.lib.tf_session_load_state_meta(h.ptr, os.fsencode(os.fspath(path)), byref(out)))
            missing = h.lib.tf_session_missing_params(h.ptr)
            text = C.take_string(out.value)
            meta = json.loads(text) if text else {}
            if str(meta.get("step", "")).isdigit():
                _check(h.ctx, h.lib.tf_session_set_step(h.ptr, int(meta["step"])))
        self.missing_params = [s.strip() for s in missing.decode().split(",")] if missing else []
        return meta

    @property
    def step(self):
        """Runs done (0 before the first); settable, as a resumed run does."""
        v = ctypes.c_uint64()
        with self._lock:
            h = self._handle()
            _check(h.ctx, h.lib.tf_session_step(h.ptr, byref(v)))
        return v.value

    @step.setter
    def step(self, value):
        with self._lock:
            h = self._handle()
            _check(h.ctx, h.lib.tf_session_set_step(h.ptr, int(value)))

    @property
    def info(self):
        """How the session runs (tf_session_info): target, threads, kernels, JIT counts, ..."""
        i = C.SessionInfo()
        with self._lock:
            h = self._handle()
            _check(h.ctx, h.lib.tf_session_get_info(h.ptr, byref(i)))
        d = {f: getattr(i, f) for f, _ in C.SessionInfo._fields_}
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in d.items()}

    def set_profiling(self, on=True):
        """Time each kernel from now on (and clear what was timed)."""
        with self._lock:
            h = self._handle()
            _check(h.ctx, h.lib.tf_session_set_profiling(h.ptr, 1 if on else 0))

    def profile(self):
        """Per-kernel times since set_profiling: [{name, how, total_ms, calls, elements, bytes}]
        (bytes: the least memory traffic of one call; see copy_bandwidth)."""
        out = []
        with self._lock:
            h = self._handle()
            for i in range(h.lib.tf_session_profile_count(h.ptr)):
                k = C.KernelProfile()
                _check(h.ctx, h.lib.tf_session_profile(h.ptr, i, byref(k)))
                out.append({"name": k.name.decode(), "how": k.how.decode(), "total_ms": k.total_ms,
                            "calls": k.calls, "elements": k.elements, "bytes": k.bytes})
        return out

    def copy_bandwidth(self):
        """GB/s of a plain copy in the session's memory (read + written bytes): what a
        memory-bound kernel can at best approach (tf_session_copy_bandwidth)."""
        with self._lock:
            h = self._handle()
            g = ctypes.c_double()
            _check(h.ctx, h.lib.tf_session_copy_bandwidth(h.ptr, byref(g)))
            return g.value

    def __repr__(self):
        return f"<tfuse.Session {self.program.mode} on {self.target}, seed {self.seed}>"



def __getattr__(name):
    # tfuse.export (the submodule, callable as the function) loads on first use, so that
    # `python -m tfuse.export` runs it fresh and `import tfuse` never imports torch
    if name in ("export", "Exported", "ExportError"):
        import importlib
        mod = importlib.import_module(".export", __name__)
        return mod if name == "export" else getattr(mod, name)
    raise AttributeError(f"module 'tfuse' has no attribute '{name}'")
