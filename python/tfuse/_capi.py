"""ctypes declarations of include/tfuse.h, and where libtfuse.so is found.

Only what the header declares is used. The structs below mirror the
header's field for field: the library's version (tf_version) must be the
one this file was written for, which `load()` checks.
"""
import ctypes
import ctypes.util
import glob
import os

HEADER_VERSION = "0.1.0"   # include/tfuse.h's TFUSE_VERSION these declarations follow

c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
c_int = ctypes.c_int
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64
c_size_t = ctypes.c_size_t
c_double = ctypes.c_double
POINTER = ctypes.POINTER
byref = ctypes.byref

# enums (tfuse.h)
TF_OK = 0
DTYPES = ["f32", "f16", "bf16", "f64", "i64", "i32", "bool"]          # tf_dtype, in order
TARGETS = ["interp", "cpu", "cuda", "cuda-emu"]                      # tf_target
MODES = ["train", "infer"]                                          # tf_mode
IO_INPUT, IO_OUTPUT, IO_PARAM, IO_BUFFER = range(4)                   # tf_io_kind


class TensorView(ctypes.Structure):
    _fields_ = [("dtype", c_int), ("rank", c_int), ("shape", c_int64 * 8), ("data", c_void_p)]


class DimOverride(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("value", c_int64)]


class CompileOptions(ctypes.Structure):
    """tf_compile_options. Its target settings (a field each, between
    dump_llvm and outputs) are the library's: load() lays them out from
    tf_setting_info (include/tfuse_settings.def's rows), so a setting added
    there needs nothing here."""


_OPTIONS_BEFORE = [
    ("mode", c_int), ("target", c_int), ("dump_ir", c_char_p), ("dump_dir", c_char_p), ("opt_level", c_int),
    ("disable_passes", POINTER(c_char_p)), ("ndisable_passes", c_size_t), ("precision", c_int),
    ("explain", c_void_p), ("memory_limit", c_int64), ("dump_kernels", c_char_p), ("checkpoint", c_int),
    ("memory_budget", c_int64), ("memory_budget_percent", c_double), ("threads", c_int), ("dump_llvm", c_char_p),
]
_OPTIONS_AFTER = [("outputs", POINTER(c_char_p)), ("noutputs", c_size_t)]

SETTINGS = {}   # {name: tf_setting_desc as a dict}, in the library's order, once load() has run


class SettingDesc(ctypes.Structure):
    _fields_ = [(f, c_char_p) for f in ("name", "type", "target", "env", "env_on", "flag", "on", "off", "help")]


def _lay_out_options(lib):
    """CompileOptions' fields, with the library's target settings."""
    rows = []
    for i in range(lib.tf_setting_count()):
        d = SettingDesc()
        if lib.tf_setting_info(i, byref(d)) != TF_OK:
            raise LibraryNotFound(f"tfuse: tf_setting_info({i}) failed")
        rows.append({f: getattr(d, f).decode() for f, _ in SettingDesc._fields_})
    fields = _OPTIONS_BEFORE + [(r["name"], c_char_p if r["type"] == "str" else c_int) for r in rows] + _OPTIONS_AFTER
    if "_fields_" in CompileOptions.__dict__:   # a second library in one process: it must agree
        if [f for f, _ in CompileOptions._fields_] != [f for f, _ in fields]:
            raise LibraryNotFound("tfuse: a second libtfuse with other target settings than the first")
        return
    CompileOptions._fields_ = fields
    SETTINGS.update((r["name"], r) for r in rows)


class SessionInfo(ctypes.Structure):
    _fields_ = [
        ("target", c_char_p), ("threads", c_int), ("kernels", c_int), ("jit_compiled", c_int), ("jit_cached", c_int),
        ("fallbacks", c_int), ("jit_disk", c_int), ("jit_package", c_int), ("jit_ms", c_double),
        ("disk_hits", c_int), ("disk_misses", c_int), ("library", c_char_p),
        ("step_graph", c_char_p), ("graph_replays", c_int64), ("arena_bytes", c_int64), ("value_bytes", c_int64),
        ("unplanned_bytes", c_int64), ("aux_bytes", c_int64), ("device_bytes", c_int64),
    ]


class KernelProfile(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("how", c_char_p), ("total_ms", c_double), ("calls", c_int64),
                ("elements", c_int64), ("bytes", c_int64)]


class TrainParam(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("value", c_double)]


class TrainConfig(ctypes.Structure):
    _fields_ = [
        ("has_block", c_int), ("optimizer", c_char_p), ("lr", c_double), ("optimizer_params", TrainParam * 8),
        ("noptimizer_params", c_size_t), ("schedule", c_char_p), ("schedule_params", TrainParam * 8),
        ("nschedule_params", c_size_t), ("precision", c_int), ("clip_grad_norm", c_double), ("accumulate", c_int64),
        ("metrics", POINTER(c_char_p)), ("nmetrics", c_size_t),
    ]


class PackageInfo(ctypes.Structure):
    _fields_ = [("objects", c_int), ("objects_cached", c_int), ("has_params", c_int), ("bytes", c_int64)]


class CacheInfo(ctypes.Structure):
    _fields_ = [("limit", c_int), ("kernels", c_int), ("in_use", c_int), ("evicted", c_int64)]


# the structs above as the library names them (tf_struct_layout checks each field)
_MIRRORS = {"tf_compile_options": CompileOptions, "tf_session_info": SessionInfo, "tf_train_config": TrainConfig,
            "tf_kernel_profile": KernelProfile, "tf_cache_info": CacheInfo, "tf_package_info": PackageInfo}

# name: (restype, argtypes)
_PROTOS = {
    "tf_version": (c_char_p, []),
    "tf_struct_layout": (c_size_t, [c_char_p, c_char_p]),
    "tf_setting_count": (c_size_t, []),
    "tf_setting_info": (c_int, [c_size_t, POINTER(SettingDesc)]),
    "tf_context_create": (c_int, [POINTER(c_void_p)]),
    "tf_context_free": (None, [c_void_p]),
    "tf_context_last_error": (c_char_p, [c_void_p]),
    "tf_status_name": (c_char_p, [c_int]),
    "tf_cache_create": (c_int, [POINTER(c_void_p)]),
    "tf_cache_free": (None, [c_void_p]),
    "tf_cache_get_info": (c_int, [c_void_p, POINTER(CacheInfo)]),
    "tf_context_set_cache": (c_int, [c_void_p, c_void_p]),
    "tf_dtype_size": (c_int, [c_int]),
    "tf_precision_name": (c_char_p, [c_int]),
    "tf_precision_parse": (c_int, [c_char_p, POINTER(c_int)]),
    "tf_checkpoint_parse": (c_int, [c_char_p, POINTER(c_int)]),
    "tf_model_parse_file": (c_int, [c_void_p, c_char_p, POINTER(DimOverride), c_size_t, POINTER(c_void_p)]),
    "tf_model_parse_string": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t, POINTER(DimOverride), c_size_t,
                                      POINTER(c_void_p)]),
    "tf_model_free": (None, [c_void_p]),
    "tf_model_add_loss": (c_int, [c_void_p, c_void_p, c_char_p, c_char_p]),
    "tf_program_input_unread": (c_int, [c_void_p, c_char_p]),
    "tf_compile_options_init": (None, [POINTER(CompileOptions)]),
    "tf_program_compile": (c_int, [c_void_p, c_void_p, POINTER(CompileOptions), POINTER(c_void_p)]),
    "tf_program_free": (None, [c_void_p]),
    "tf_program_save": (c_int, [c_void_p, c_void_p, c_char_p, c_int, ctypes.c_uint64, c_char_p, POINTER(PackageInfo)]),
    "tf_program_load": (c_int, [c_void_p, c_char_p, POINTER(c_void_p)]),
    "tf_program_describe": (c_int, [c_void_p, POINTER(c_int), POINTER(c_int), POINTER(c_int)]),
    "tf_program_stat_count": (c_size_t, [c_void_p]),
    "tf_program_stat": (c_int, [c_void_p, c_size_t, POINTER(c_char_p), POINTER(c_int64)]),
    "tf_program_print": (c_int, [c_void_p, c_void_p, POINTER(c_void_p)]),
    "tf_program_write_artifact": (c_int, [c_void_p, c_void_p, c_char_p, c_char_p, POINTER(c_int)]),
    "tf_program_io_count": (c_size_t, [c_void_p, c_int]),
    "tf_program_io": (c_int, [c_void_p, c_int, c_size_t, POINTER(c_char_p), POINTER(c_int), POINTER(c_int),
                              POINTER(c_int64)]),
    "tf_program_train_config": (c_int, [c_void_p, c_void_p, POINTER(TrainConfig)]),
    "tf_doctor": (c_int, [c_void_p, POINTER(c_void_p)]),
    "tf_default_target": (c_int, []),
    "tf_session_create": (c_int, [c_void_p, c_void_p, c_int, c_uint64, POINTER(c_void_p)]),
    "tf_session_set_comm": (c_int, [c_void_p, c_void_p]),
    "tf_comm_launched": (c_int, [POINTER(c_int), POINTER(c_int)]),
    "tf_comm_create_mpi": (c_int, [c_void_p, c_void_p, POINTER(c_void_p)]),
    "tf_comm_create_self": (c_int, [c_void_p, POINTER(c_void_p)]),
    "tf_comm_free": (None, [c_void_p]),
    "tf_comm_rank": (c_int, [c_void_p]),
    "tf_comm_size": (c_int, [c_void_p]),
    "tf_session_free": (None, [c_void_p]),
    "tf_session_bind": (c_int, [c_void_p, c_char_p, c_int, POINTER(c_int64), c_int, c_void_p]),
    "tf_session_run": (c_int, [c_void_p]),
    "tf_session_output": (c_int, [c_void_p, c_char_p, POINTER(TensorView)]),
    "tf_session_get_state": (c_int, [c_void_p, c_char_p, POINTER(TensorView), c_size_t]),
    "tf_session_set_state": (c_int, [c_void_p, c_char_p, POINTER(TensorView)]),
    "tf_session_load_state_meta": (c_int, [c_void_p, c_char_p, POINTER(c_void_p)]),
    "tf_session_save_state_meta": (c_int, [c_void_p, c_char_p, c_char_p]),
    "tf_session_missing_params": (c_char_p, [c_void_p]),
    "tf_session_step": (c_int, [c_void_p, POINTER(c_uint64)]),
    "tf_session_set_step": (c_int, [c_void_p, c_uint64]),
    "tf_session_get_info": (c_int, [c_void_p, POINTER(SessionInfo)]),
    "tf_session_set_profiling": (c_int, [c_void_p, c_int]),
    "tf_session_profile_count": (c_size_t, [c_void_p]),
    "tf_session_profile": (c_int, [c_void_p, c_size_t, POINTER(KernelProfile)]),
    "tf_session_copy_bandwidth": (c_int, [c_void_p, POINTER(c_double)]),
}


class LibraryNotFound(OSError):
    pass


try:   # written by CMake into a package that pip built with its own libtfuse (CMakeLists.txt, SKBUILD)
    from . import _build as BUILD
except ImportError:   # the repository's python/ itself: an editable install, PYTHONPATH=python or a copy
    BUILD = None

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLED = os.path.join(HERE, "libtfuse.so.0")   # where a package built by pip has its library


def how_built():
    """How this package came to be, for messages."""
    if BUILD is None:
        return (f"this tfuse package ({HERE}) is the repository's python/ (an editable install, PYTHONPATH=python "
                f"or a copy), which carries no library of its own")
    c = BUILD.CONFIG
    parts = [c["build_type"], c["compiler"], c["system"]] + [f"{k} {'on' if c[k] else 'off'}"
                                                               for k in ("llvm", "openblas", "onednn")]
    return f"this tfuse package ({HERE}) was built by {BUILD.BUILT_BY} with libtfuse {c['version']} ({', '.join(parts)})"


def candidates():
    """Where libtfuse.so is looked for, in order (see the package README)."""
    env = os.environ.get("TFUSE_LIBRARY")
    if env:
        return [env]   # asked for: that one or none
    here = HERE
    out = [os.path.join(here, n) for n in ("libtfuse.so.0", "libtfuse.so")]
    # a build tree of the repository this package lies in (python/tfuse/ -> ../../build*)
    repo = os.path.dirname(os.path.dirname(here))
    for d in ["build"] + sorted(os.path.basename(p) for p in glob.glob(os.path.join(repo, "build-*"))):
        out.append(os.path.join(repo, d, "libtfuse.so"))
    return out


def load():
    """The loaded library with its prototypes set, and the path it came from."""
    tried = []
    path = None
    for c in candidates():
        if os.path.exists(c):
            path = c
            break
        tried.append(c)
    if path is None and not os.environ.get("TFUSE_LIBRARY"):
        found = ctypes.util.find_library("tfuse")
        if found:
            path = found
        else:
            tried.append("the system's library path (ctypes.util.find_library('tfuse'))")
    if path is None:
        if os.environ.get("TFUSE_LIBRARY"):
            raise LibraryNotFound(f"tfuse: libtfuse.so not found: TFUSE_LIBRARY={tried[0]} does not exist; "
                                  f"unset it to use the package's own search ({how_built()})")
        if BUILD is not None:
            raise LibraryNotFound(
                f"tfuse: libtfuse.so not found; {how_built()}, which put the library at {BUNDLED}, but it is not "
                f"there (removed, or an interrupted install). Reinstall the package (pip install --force-reinstall "
                f"./python in the tfuse repository), or set TFUSE_LIBRARY to a libtfuse.so; also looked at "
                + ", ".join(tried[1:]))
        raise LibraryNotFound(
            "tfuse: libtfuse.so not found; looked at " + ", ".join(tried) + f"; {how_built()}. "
            "Build the library in the repository (cmake -S . -B build && cmake --build build), install it "
            "(cmake --install build), set TFUSE_LIBRARY to its path, or install the package with the library "
            "inside it: pip install ./python")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        hint = ""
        if BUILD is not None and os.path.abspath(path) == BUNDLED:
            hint = (f" ({how_built()}; the library uses that machine's system libraries, such as LLVM's and "
                    f"oneDNN's: install them here, or build the package on this machine: pip install ./python)")
        raise LibraryNotFound(f"tfuse: cannot load {path}: {e}{hint}") from None
    for name, (res, args) in _PROTOS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise LibraryNotFound(f"tfuse: {path} has no {name}: a libtfuse older than this package "
                                  f"(which needs {HEADER_VERSION})") from None
        fn.restype = res
        fn.argtypes = args
    version = lib.tf_version().decode()
    if version != HEADER_VERSION:
        raise LibraryNotFound(f"tfuse: {path} is libtfuse {version}; this package is written for {HEADER_VERSION}")
    _lay_out_options(lib)
    for cname, mirror in _MIRRORS.items():   # the same version can still have grown a field
        theirs = [(None, lib.tf_struct_layout(cname.encode(), None))]
        theirs += [(f, lib.tf_struct_layout(cname.encode(), f.encode())) for f, _ in mirror._fields_]
        ours = [(None, ctypes.sizeof(mirror))] + [(f, getattr(mirror, f).offset) for f, _ in mirror._fields_]
        if theirs != ours:
            bad = next(f for (f, a), (_, b) in zip(theirs, ours) if a != b)
            raise LibraryNotFound(f"tfuse: {path}'s {cname} is laid out otherwise than this package's mirror of it "
                                  f"({'its size' if bad is None else bad}): the package and the library are from "
                                  f"different tfuse builds")
    return lib, path


class _Libc:
    """The C library's open_memstream, fclose and free: the compile options'
    explain stream is a FILE *, collected in memory."""

    def __init__(self):
        libc = ctypes.CDLL(None)
        self.open_memstream = libc.open_memstream
        self.open_memstream.restype = c_void_p
        self.open_memstream.argtypes = [POINTER(c_void_p), POINTER(c_size_t)]
        self.fclose = libc.fclose
        self.fclose.restype = c_int
        self.fclose.argtypes = [c_void_p]
        self.free = libc.free
        self.free.restype = None
        self.free.argtypes = [c_void_p]


libc = _Libc()


def take_string(ptr):
    """A malloc'd char * handed over by libtfuse, as str; freed."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        libc.free(ptr)
