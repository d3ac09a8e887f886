#!/usr/bin/env bash
# test_python_install.sh — the Python package away from the repository, laid
# out as an installed copy (its .py files in a temporary site directory, no
# pip: `pip install ./python` builds libtfuse, which tests/cli/test_wheel.sh
# checks in scripts/test.sh): imported from there, it finds libtfuse through
# TFUSE_LIBRARY, and, with no TFUSE_LIBRARY, a libtfuse.so.0 put beside the
# package (as the wheel bundles it) and the LLVM module beside that; a
# TFUSE_LIBRARY that is not there is an error naming it; with no library
# anywhere, the message says what the package is (a copy of python/, or a
# package pip built whose library is gone, by its _build.py) and what to do.
# Skipped (exit 77) where NumPy is missing. Usage: test_python_install.sh
# PYTHON SOURCE_DIR LIBTFUSE TMPDIR
set -uo pipefail
py=$1 src=$2 lib=$3 tmp=$4
. "$(dirname "$0")/lib.sh"
if ! env -u LD_PRELOAD "$py" -c 'import numpy' 2>/dev/null; then
  echo "skipped: $py lacks NumPy (scripts/setup.sh installs it)"
  exit 77
fi
rm -rf "$tmp" && mkdir -p "$tmp/site/tfuse"
tmp=$(cd "$tmp" && pwd)
if cp "$src"/python/tfuse/*.py "$tmp/site/tfuse/"; then ok; else bad "cannot copy $src/python/tfuse"; fi
check='
import os, sys, numpy as np, tfuse
assert tfuse.__file__.startswith(sys.argv[1]), tfuse.__file__
p = tfuse.compile("module t\ninput x : f32[3]\ny = relu(x)\noutput y\n", mode="infer")
y = p.session().run(x=np.array([-1, 2, -3], np.float32))["y"]
assert y.tolist() == [0, 2, 0], y
print("loaded", tfuse.library_path)
'
cd "$tmp"   # not the repository: no build tree to fall back on
expect 0 "loaded $lib" -- env PYTHONPATH="$tmp/site" TFUSE_LIBRARY="$lib" "$py" -c "$check" "$tmp/site"
system_lib=$(ldconfig -p 2>/dev/null | grep -c 'libtfuse\.so' || true)
if [ "$system_lib" -eq 0 ]; then   # (a libtfuse on the system's library path would be found)
  expect 1 "not found.*the repository's python/.*cmake --build build.*pip install ./python" -- \
    env -u TFUSE_LIBRARY PYTHONPATH="$tmp/site" "$py" -c "$check" "$tmp/site"
fi
cp "$lib" "$tmp/site/tfuse/libtfuse.so.0"
expect 0 "loaded $tmp/site/tfuse/libtfuse.so.0" -- env -u TFUSE_LIBRARY PYTHONPATH="$tmp/site" "$py" -c "$check" "$tmp/site"
# with LLVM the wheel bundles the cpu target's JIT module too (pyproject.toml), found beside libtfuse.so.0
module=$(dirname "$lib")/libtfuse-llvm.so
if [ -e "$module" ]; then
  cp "$module" "$tmp/site/tfuse/"
  cpu_check='
import numpy as np, tfuse
p = tfuse.compile("module t\ninput x : f32[3]\ny = relu(x)\noutput y\n", mode="infer", target="cpu")
y = p.session().run(x=np.array([-1, 2, -3], np.float32))["y"]
assert y.tolist() == [0, 2, 0], y
print("cpu target from", tfuse.library_path)
'
  expect 0 "cpu target from $tmp/site/tfuse/libtfuse.so.0" -- env -u TFUSE_LIBRARY TFUSE_CACHE_DIR="$tmp/cache" PYTHONPATH="$tmp/site" \
    "$py" -c "$cpu_check"
fi
expect 1 "TFUSE_LIBRARY=/nonexistent/libtfuse.so does not exist" -- env PYTHONPATH="$tmp/site" \
  TFUSE_LIBRARY=/nonexistent/libtfuse.so "$py" -c "$check" "$tmp/site"
# a package pip built (CMakeLists.txt writes its _build.py) whose library is gone: how it was built, and to reinstall
rm -f "$tmp/site/tfuse/"libtfuse*
cat >"$tmp/site/tfuse/_build.py" <<'EOF'
BUILT_BY = "pip install ./python (scikit-build-core, CMake 3.25.1)"
CONFIG = {"version": "0.1.0", "build_type": "Release", "compiler": "GNU 12.2.0", "system": "Linux",
          "llvm": True, "openblas": True, "onednn": False}
EOF
if [ "$system_lib" -eq 0 ]; then
  expect 1 "built by pip install ./python .*Release.*onednn off.*tfuse/libtfuse.so.0, but it is not there.*--force-reinstall" -- \
    env -u TFUSE_LIBRARY PYTHONPATH="$tmp/site" "$py" -c "$check" "$tmp/site"
fi
echo "python install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
