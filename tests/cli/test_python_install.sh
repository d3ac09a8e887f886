#!/usr/bin/env bash
# test_python_install.sh — the Python package installs the usual way:
# `pip install` of a copy of python/ (offline: --no-build-isolation, with the
# setuptools and wheel scripts/setup.sh installs) into a temporary
# directory; imported from there, it finds libtfuse through TFUSE_LIBRARY,
# and, with no TFUSE_LIBRARY, a libtfuse.so.0 put beside the package (a
# wheel that bundles it); a TFUSE_LIBRARY that is not there is an error
# naming it. Skipped (exit 77) where NumPy, pip, setuptools or wheel is
# missing. Usage: test_python_install.sh PYTHON SOURCE_DIR LIBTFUSE TMPDIR
set -uo pipefail
py=$1 src=$2 lib=$3 tmp=$4
. "$(dirname "$0")/lib.sh"
# pip itself runs without the sanitizer runtimes a sanitized build preloads
# (TFUSE_PY_ENV); only the checks load libtfuse
pyplain() { env -u LD_PRELOAD "$py" "$@"; }
if ! pyplain -c 'import setuptools, wheel, numpy' 2>/dev/null || ! pyplain -m pip --version >/dev/null 2>&1; then
  echo "skipped: $py lacks one of numpy, pip, setuptools, wheel (scripts/setup.sh installs them)"
  exit 77
fi
rm -rf "$tmp" && mkdir -p "$tmp"
tmp=$(cd "$tmp" && pwd)
cp -r "$src/python" "$tmp/src"
rm -rf "$tmp/src/build" "$tmp/src"/*.egg-info "$tmp/src/tfuse/__pycache__" "$tmp/src/tfuse/"libtfuse.so*
if pyplain -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$tmp/site" "$tmp/src" \
     >"$tmp/pip.log" 2>&1; then
  ok
else
  bad "pip install: $(tail -c 3000 "$tmp/pip.log")"
fi
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
expect 1 "TFUSE_LIBRARY|/nonexistent/libtfuse.so" -- env PYTHONPATH="$tmp/site" TFUSE_LIBRARY=/nonexistent/libtfuse.so \
  "$py" -c "$check" "$tmp/site"
echo "python install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
