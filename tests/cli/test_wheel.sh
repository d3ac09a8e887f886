#!/usr/bin/env bash
# test_wheel.sh — `pip install ./python` as a user runs it, with nothing built
# beforehand: pip builds the wheel once (scikit-build-core, fetched from PyPI
# into pip's isolated build environment, drives CMake over the repository's
# CMakeLists.txt in Release, in a temporary build directory: build/ is not
# touched); the wheel holds the package's .py files, _build.py,
# libtfuse.so.0 and, when the build has LLVM, libtfuse-llvm.so, and nothing
# else; installed into a fresh virtual environment (NumPy from PyPI), it
# compiles and runs a two-op model on every target it has, from a directory
# outside the repository with no TFUSE_LIBRARY or PYTHONPATH, and
# tfuse.library_path is the bundled library; with that library removed the
# message says how the package was built. Then the developer's editable
# install (pip install -e ./python) builds nothing and imports python/ itself.
# scripts/test.sh runs it after the PyTorch stage; it needs python3 -m venv
# (python3-venv) and PyPI. Usage: tests/cli/test_wheel.sh [PYTHON] (default
# python3); CMAKE_BUILD_PARALLEL_LEVEL (default 2) sets the build's jobs.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=${1:-python3}
. "$repo/tests/cli/lib.sh"
# show PATTERN -- CMD...: as `expect 0`, and prints the output's last line (what was checked)
show() {
  local pat=$1 out; shift 2
  if out=$("$@" 2>&1) && grep -qE -- "$pat" <<<"$out"; then ok; echo "  $(tail -n 1 <<<"$out")"; else bad "$*: $out"; fi
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tfuse-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
export TFUSE_CACHE_DIR="$tmp/cache" PIP_DISABLE_PIP_VERSION_CHECK=1
unset TFUSE_LIBRARY TFUSE_CLI TFUSE_LLVM_MODULE PYTHONPATH PYTHONHOME VIRTUAL_ENV LD_PRELOAD

if ! "$py" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
  echo "error: $py -m venv failed (Debian: apt-get install python3-venv; scripts/setup.sh installs it): $(tail -c 2000 "$tmp/venv.log")" >&2
  exit 1
fi
vpy=$tmp/venv/bin/python
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')

# 1. the wheel, built once
start=$SECONDS
if "$vpy" -m pip wheel --no-deps -w "$tmp/dist" "$repo/python" >"$tmp/wheel.log" 2>&1; then
  ok
else
  bad "pip wheel ./python: $(tail -c 4000 "$tmp/wheel.log")"
  echo "wheel: $pass passed, $fail failed"
  exit 1
fi
wheel=$(ls "$tmp"/dist/tfuse-*.whl)
echo "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) in $((SECONDS - start)) s with $CMAKE_BUILD_PARALLEL_LEVEL jobs"

# 2. what it holds: exactly the package's .py files, _build.py, the library and (with LLVM) the module
contents='
import os, sys, zipfile
whl, pkg = sys.argv[1], sys.argv[2]
names = set(zipfile.ZipFile(whl).namelist())
build = zipfile.ZipFile(whl).read("tfuse/_build.py").decode() if "tfuse/_build.py" in names else ""
ns = {}
exec(build, ns)
cfg = ns.get("CONFIG", {})
want = {"tfuse/" + f for f in os.listdir(pkg) if f.endswith(".py")} | {"tfuse/_build.py", "tfuse/libtfuse.so.0"}
if cfg.get("llvm"):
    want.add("tfuse/libtfuse-llvm.so")
got = {n for n in names if ".dist-info/" not in n}
assert got == want, f"the wheel holds {sorted(got - want)} it should not and lacks {sorted(want - got)}"
assert cfg.get("build_type") == "Release", cfg
print("contents ok:", ", ".join(sorted(got)), cfg)
'
show "contents ok" -- "$vpy" -c "$contents" "$wheel" "$repo/python/tfuse"

# 3. installed into the fresh venv and used from outside the repository
if "$vpy" -m pip install "$wheel" >"$tmp/install.log" 2>&1; then
  ok
else
  bad "pip install $(basename "$wheel"): $(tail -c 3000 "$tmp/install.log")"
fi
mkdir -p "$tmp/work" && cd "$tmp/work"
check='
import os, sys, numpy as np, tfuse
from tfuse import _capi
site = sys.argv[1]
assert tfuse.__file__ == os.path.join(site, "tfuse", "__init__.py"), tfuse.__file__
text = "module t\ninput x : f32[4]\ny = relu(x)\nz = mul(y, x)\noutput z\n"
targets = ["interp"] + (["cpu"] if _capi.BUILD.CONFIG["llvm"] else [])
for target in targets:
    sess = tfuse.compile(text, mode="infer", target=target).session()
    z = sess.run(x=np.array([-1, 2, -3, 4], np.float32))["z"]
    assert z.tolist() == [0, 4, 0, 16], (target, z)
    if target == "cpu":   # the fused kernel was JIT-compiled by the bundled libtfuse-llvm.so
        assert sess.info["jit_compiled"] >= 1, sess.info
assert tfuse.library_path == os.path.join(site, "tfuse", "libtfuse.so.0"), tfuse.library_path
print("ran on", " and ".join(targets), "with", tfuse.library_path)
'
show "ran on interp.* with $site/tfuse/libtfuse.so.0" -- "$vpy" -c "$check" "$site"

# 4. the bundled library removed: the message says how the package was built and what to do
if ldconfig -p 2>/dev/null | grep -q 'libtfuse\.so'; then
  echo "skipped the missing-library check: this machine has a libtfuse on its library path"
else
  rm -f "$site/tfuse/libtfuse.so.0"
  expect 1 "built by pip install ./python .*libtfuse.so.0.*not there.*--force-reinstall" -- \
    "$vpy" -c 'import tfuse; tfuse.compile("module t\ninput x : f32[1]\noutput x\n")'
fi

# 5. the developer's editable install: nothing built, python/ itself imported
if "$vpy" -m pip uninstall -y tfuse >"$tmp/editable.log" 2>&1 &&
   "$vpy" -m pip install --no-deps -e "$repo/python" >>"$tmp/editable.log" 2>&1; then
  ok
else
  bad "pip install -e ./python: $(tail -c 3000 "$tmp/editable.log")"
fi
editable='
import sys, tfuse
from tfuse import _capi
assert tfuse.__file__ == sys.argv[1], tfuse.__file__
assert _capi.BUILD is None
print("editable:", tfuse.__file__)
'
show "editable: $repo/python/tfuse/__init__.py" -- "$vpy" -c "$editable" "$repo/python/tfuse/__init__.py"
built=$(find "$site" "$repo/python" -name 'libtfuse*' -o -name '_build.py' | head -n 3)
if [ -n "$built" ]; then bad "pip install -e ./python built or installed a library: $built"; else ok; fi

echo "wheel: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
