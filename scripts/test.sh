#!/usr/bin/env bash
# test.sh — build tfuse three ways (plain, ASan+UBSan, and without LLVM or oneDNN, as
# on a machine that lacks it, in Release so -O3's extra warnings are errors
# too) and run the whole ctest suite on each, then the PyTorch tests, the
# Python wheel, the README's commands and a short fuzz run. This is the README's test
# command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
# cuda-emu's compiled kernels do not depend on how tfuse was built: the three
# builds share one cache (the first compiles, the others load)
export TFUSE_CACHE_DIR="${TFUSE_CACHE_DIR:-$PWD/build-cache}"
for variant in build build-asan build-nollvm; do
  flags=()
  [ "$variant" = build-asan ] && flags=(-DTFUSE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug)
  # the no-LLVM build repeats the plain build's NVRTC compiles: 1 kernel in 8 is enough there
  [ "$variant" = build-nollvm ] && flags=(-DTFUSE_WITH_LLVM=OFF -DTFUSE_WITH_ONEDNN=OFF -DTFUSE_CUDA_COMPILE_EVERY=8 -DCMAKE_BUILD_TYPE=Release)
  echo "== $variant"
  cmake -S . -B "$variant" "${flags[@]}" >/dev/null
  cmake --build "$variant" -j "$jobs" >/dev/null
  ctest --test-dir "$variant" --output-on-failure -j "$jobs"
done
# PyTorch stage: tfuse.export's tests and the model zoo's CI subset
# (tests/zoo/models.py CI_SUBSET: together they reach every op mapping a zoo
# model uses; the whole zoo is `.venv/bin/python tests/zoo/run.py`), over the
# plain build, with the venv's torch (scripts/setup.sh installs it).
echo "== pytorch"
py=.venv/bin/python
if ! "$py" -c 'import torch, torchvision, timm, transformers, onnx, onnxruntime' 2>/dev/null; then
  echo "error: $py cannot import torch, torchvision, timm, transformers, onnx and onnxruntime: run scripts/setup.sh first" >&2
  exit 1
fi
export TFUSE_LIBRARY="$PWD/build/libtfuse.so" TFUSE_CLI="$PWD/build/tfuse"
PYTHONPATH=python "$py" -m unittest python/tests/test_export.py
"$py" tests/zoo/run.py --subset ci
"$py" tests/onnx/test_onnx.py   # tfuse import against ONNX Runtime (docs/onnx.md)
unset TFUSE_LIBRARY TFUSE_CLI
# Wheel stage: `pip install ./python` as a user runs it, with nothing built
# (tests/cli/test_wheel.sh): the wheel built once (scikit-build-core from PyPI
# driving CMake, Release, in a temporary directory), its contents, installed
# into a fresh venv and run from outside the tree; then the editable install.
echo "== wheel"
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" tests/cli/test_wheel.sh python3
# The README's own commands (scripts/check_readme.py): the build and the
# example it shows, and its Python snippets, as a newcomer would run them.
echo "== readme"
python3 scripts/check_readme.py
# Fuzz stage: the libFuzzer targets (tests/fuzz) built with clang, each run
# over its seed corpus and then for 20 s (about 2 minutes with the build);
# a crash, leak, hang or sanitizer report fails CI. tests/fuzz/README.md has
# the long runs.
echo "== build-fuzz"
tests/fuzz/run.sh --seconds 20
