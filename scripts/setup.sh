#!/usr/bin/env bash
# setup.sh — install what tfuse needs to build and test on Debian 12:
# a C11 compiler, CMake, LLVM 14's FileCheck (llvm-14-tools), LLVM 14's
# libraries and llvm-config for the JIT emitter (llvm-14-dev), OpenBLAS for
# the cpu target's GEMMs (libopenblas-dev), oneDNN for its convolutions
# (libdnnl-dev; Debian 12's 2.6.3, OpenMP-threaded), and Python 3 (with pip)
# with NumPy (one test checks tfuse against an independent NumPy computation)
# and scikit-learn (scripts/make_digits.py takes its bundled digits data set
# for the training test; nothing is downloaded at run time), and clang with
# libFuzzer (clang, libclang-rt-14-dev: its fuzzer runtime is only a
# recommendation of clang's packages) for the tests/fuzz targets, and Open MPI
# (openmpi-bin for mpirun, libopenmpi-dev; runtime/comm_mpi.c opens its
# libmpi.so.40 at run time) for the tests/mpi jobs.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake llvm-14-tools llvm-14-dev libopenblas-dev libdnnl-dev python3 python3-pip python3-venv python3-numpy python3-sklearn \
  clang libclang-rt-14-dev openmpi-bin libopenmpi-dev >/dev/null
# pip into the python3 on PATH. Debian 12's own Python refuses (PEP 668,
# "externally-managed-environment"): the second try installs for this user.
pip_install() {
  python3 -m pip install --quiet "$@" 2>/dev/null ||
    python3 -m pip install --quiet --user --break-system-packages "$@"
}
# The python3 first on PATH may not be Debian's (pyenv, a venv): give it NumPy
# and scikit-learn too.
if ! python3 -c 'import numpy' 2>/dev/null; then
  pip_install numpy
fi
if ! python3 -c 'import sklearn' 2>/dev/null; then
  pip_install scikit-learn
fi
# The Python package, editable, in the repository's own virtual environment
# (.venv; Debian's Python refuses pip installs into itself, PEP 668), which
# sees this Python's NumPy: after the build, `.venv/bin/python -c 'import
# tfuse'` finds build/libtfuse.so (docs/python.md). An editable install builds
# nothing (python/pyproject.toml; pip fetches its build backend,
# scikit-build-core, from PyPI); `pip install ./python` would build libtfuse
# into the package (tests/cli/test_wheel.sh, in a venv of its own:
# python3-venv).
repo=$(cd "$(dirname "$0")/.." && pwd)
python3 -m venv --system-site-packages "$repo/.venv"
"$repo/.venv/bin/python" -m pip install --quiet --no-deps -e "$repo/python"
# PyTorch, torchvision, timm and transformers in the venv, for tfuse.export's
# tests and the model zoo (tests/zoo, scripts/test.sh's zoo stage): pinned, so
# that a new release of any of them changes CI only when this line changes.
# PyPI's torch wheel for Linux brings its CUDA libraries (about 5 GB in the
# venv, some 80 s to install here); nothing of it needs a GPU.
"$repo/.venv/bin/python" -m pip install --quiet torch==2.15.0 torchvision==0.29.2 timm==1.0.31 transformers==5.24.0
# ONNX and ONNX Runtime, for tfuse import's tests (tests/onnx) against the reference runtime: onnx 1.22.0 is
# the last release whose wheel carries the backend node tests' data (onnx/backend/test/data/node).
"$repo/.venv/bin/python" -m pip install --quiet onnx==1.22.0 onnxruntime==1.32.0
# NVRTC, for tests/unit/test_cuda_codegen.c (it compiles every generated CUDA
# kernel; no GPU needed). Machines with the CUDA toolkit have it. Elsewhere take
# NVIDIA's wheels from PyPI (their apt repository is not reachable from CI):
# libnvrtc and the cuda_fp16.h/cuda_bf16.h headers land in
# site-packages/nvidia/cu13/, where runtime/cuda's loader looks.
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.1[23] ' &&
   ! ls /usr/local/cuda/lib64/libnvrtc.so.1[23] /usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.1[23] >/dev/null 2>&1; then
  echo "no NVRTC on this machine: installing nvidia-cuda-nvrtc and nvidia-cuda-runtime (headers) from PyPI"
  pip_install 'nvidia-cuda-nvrtc>=13,<14' 'nvidia-cuda-runtime>=13,<14'
fi
echo "setup done: $(cmake --version | head -n1), $(FileCheck-14 --version | grep -m1 version | sed 's/^ *//'), numpy $(python3 -c 'import numpy; print(numpy.__version__)'), scikit-learn $(python3 -c 'import sklearn; print(sklearn.__version__)'), torch $("$repo/.venv/bin/python" -c 'import torch; print(torch.__version__)')"
