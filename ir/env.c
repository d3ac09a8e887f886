/* env.c — the process environment (env.h). */
#include "env.h"

#include <stdlib.h>

const char *tf_env(const char *name) { return getenv(name); }

const tf_env_var tf_env_vars[] = {
    {"TFUSE_CACHE_DIR", "runtime/cache_file.c", "the disk caches' directory (default ~/.cache/tfuse)"},
    {"TFUSE_CACHE_MAX", "runtime/cache_file.c", "the disk caches' size bound in bytes (K, M, G suffixes)"},
    {"TFUSE_JIT_CACHE_KERNELS", "runtime/context.c", "compiled kernels no session holds that stay in memory (default 2048)"},
    {"TFUSE_CPU_WIDE_CACHE_MB", "runtime/cpu/cpu_gemm.c", "MiB of float32 copies of f16/bf16 GEMM operands made per run (default 256; 0: none)"},
    {"TFUSE_CPU_PACKED_MB", "runtime/cpu/cpu_gemm.c", "MiB of oneDNN-packed inference weights in all (default 1024; 0: none)"},
    {"TFUSE_CPU_BF16_GEMM", "runtime/cpu/cpu_ops.c", "the bf16 GEMM: sbgemm, avx512 or off (default the best this machine has)"},
    {"TFUSE_LLVM_MODULE", "codegen/llvm_lazy.c", "the LLVM code generator module to load (default libtfuse-llvm.so beside libtfuse)"},
    {"TFUSE_CUDA_LIBS", "runtime/cuda/loader.c", "directories searched first for the CUDA libraries"},
    {"TFUSE_CUDA_LIBS_ONLY", "runtime/cuda/loader.c", "1: search only TFUSE_CUDA_LIBS"},
    {"TFUSE_EMU_CXX", "runtime/cuda/emu_nvrtc.c", "the C++ compiler cuda-emu compiles kernels with"},
    {"TFUSE_EMU_MEMORY", "runtime/cuda/emu.c", "cuda-emu's device memory in bytes"},
    {"TMPDIR", "runtime/program_pkg.c", "where a package is written before it is renamed into place"},
    {"HOME", "runtime/cache_file.c, runtime/cuda/emu_nvrtc.c, runtime/cuda/loader.c", "the default cache directory; Python installs searched for CUDA libraries"},
    {"PATH", "runtime/cuda/emu_nvrtc.c, runtime/cuda/loader.c", "where cuda-emu finds a compiler, and nvcc's CUDA installation"},
    {"VIRTUAL_ENV", "runtime/cuda/loader.c", "a Python environment searched for pip's CUDA libraries"},
    {"CONDA_PREFIX", "runtime/cuda/loader.c", "a conda environment searched for CUDA libraries"},
    {"PYENV_ROOT", "runtime/cuda/loader.c", "pyenv's Pythons searched for pip's CUDA libraries"},
    {"TFUSE_CUDA_NCCL", "runtime/cuda/cuda_comm.c", "0: data parallel's means on the host instead of through NCCL; 1: through NCCL even for a job of one rank"},
    {"TFUSE_COMM_TIMEOUT", "runtime/comm.c", "seconds a data-parallel collective may take before the rank gives up and ends the job (default 300)"},
    {"OMPI_COMM_WORLD_RANK", "runtime/comm_mpi.c", "this process's rank, set by Open MPI's mpirun"},
    {"OMPI_COMM_WORLD_SIZE", "runtime/comm_mpi.c", "the job's ranks, set by Open MPI's mpirun"},
    {"PMI_RANK", "runtime/comm_mpi.c", "this process's rank, set by MPICH's mpiexec or Slurm's srun: a launcher other than Open MPI's, named when MPI fails"},
    {"PMI_SIZE", "runtime/comm_mpi.c", "the job's ranks, set by MPICH's mpiexec or Slurm's srun (see PMI_RANK)"},
};
const size_t tf_env_nvars = sizeof tf_env_vars / sizeof *tf_env_vars;
