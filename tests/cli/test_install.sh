#!/usr/bin/env bash
# test_install.sh — libtfuse installed as a C library is used the usual ways
# (docs/c-api.md "Embedding"; cmake/install.cmake): `cmake --install` into a
# temporary prefix, which is then moved (the .pc and CMake files must find
# it from where they lie); examples/embed.c built with pkg-config against
# the shared library (its documented build line), with pkg-config --static
# against libtfuse.a (no undefined symbol, no libtfuse.so needed), and by a
# small CMake project through find_package(tfuse), both targets; each runs.
# Usage: test_install.sh CMAKE BUILD_DIR SOURCE_DIR TMPDIR CC
set -uo pipefail
cmake=$1 build=$2 src=$3 tmp=$4 cc=$5
. "$(dirname "$0")/lib.sh"
rm -rf "$tmp" && mkdir -p "$tmp"
tmp=$(cd "$tmp" && pwd)

if ! "$cmake" --install "$build" --prefix "$tmp/stage" >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"; echo "FAILED: cmake --install"; exit 1
fi
mv "$tmp/stage" "$tmp/prefix"
P=$tmp/prefix
version=$(sed -n 's/^#define TFUSE_VERSION "\(.*\)"/\1/p' "$src/include/tfuse.h")
libdir=lib
[ -e "$P/lib/libtfuse.so.$version" ] || libdir=$(cd "$P" && dirname "$(find . -name "libtfuse.so.$version" | head -n1)" | sed 's|^\./||')
for f in "$libdir/libtfuse.so.$version" "$libdir/libtfuse.so.0" "$libdir/libtfuse.so" "$libdir/libtfuse.a" include/tfuse.h include/tfuse_settings.def \
         "$libdir/pkgconfig/tfuse.pc" "$libdir/cmake/tfuse/tfuseConfig.cmake" "$libdir/cmake/tfuse/tfuseConfigVersion.cmake" \
         bin/tfuse share/doc/tfuse/LICENSE; do
  if [ -e "$P/$f" ]; then ok; else bad "not installed: $f"; fi
done
soname=$(readelf -d "$P/$libdir/libtfuse.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ "$soname" = libtfuse.so.0 ]; then ok; else bad "soname is '$soname', wanted libtfuse.so.0"; fi
# the installed command finds the installed library (RUNPATH $ORIGIN/../lib)
expect 0 "tfuse $version" -- "$P/bin/tfuse" doctor
# and libtfuse.so finds its LLVM module beside it (codegen/llvm_lazy.c), where the build has one
if grep -q '^TFUSE_WITH_LLVM:BOOL=ON' "$build/CMakeCache.txt"; then
  if [ -e "$P/$libdir/libtfuse-llvm.so" ]; then ok; else bad "not installed: $libdir/libtfuse-llvm.so"; fi
  expect 0 "target cpu: available" -- "$P/bin/tfuse" doctor
  expect 0 "cpu: LLVM JIT module $P/(bin/\.\./)?$libdir/libtfuse-llvm.so \(opened when a kernel is compiled\)" -- "$P/bin/tfuse" doctor
  expect 0 "^loss : f32\[\] = " -- "$P/bin/tfuse" run "$src/examples/mlp.ir" --target=cpu --random-inputs
  # a module that is not there, or is not one: the cpu target says which file and why, and nothing runs
  expect 0 "target cpu: cannot run here: cannot find tfuse's LLVM JIT module $tmp/none.so" -- \
    env TFUSE_LLVM_MODULE="$tmp/none.so" "$P/bin/tfuse" doctor
  expect 1 "target 'cpu' cannot run here: cannot find tfuse's LLVM JIT module" -- \
    env TFUSE_LLVM_MODULE="$tmp/none.so" "$P/bin/tfuse" run "$src/examples/mlp.ir" --target=cpu --random-inputs
  # (an empty cache: with the kernels and the host's target id cached, nothing would open the module)
  expect 1 "libtfuse.so.$version is not tfuse's LLVM JIT module" -- env TFUSE_CACHE_DIR="$tmp/empty-cache" \
    TFUSE_LLVM_MODULE="$P/$libdir/libtfuse.so.$version" "$P/bin/tfuse" run "$src/examples/mlp.ir" --target=cpu --random-inputs
fi

export PKG_CONFIG_PATH=$P/$libdir/pkgconfig
model=$src/examples/mlp.ir
needs_libtfuse() { readelf -d "$1" | grep -q 'NEEDED.*libtfuse\.so'; }

# 1. pkg-config, shared: examples/embed.c's own build line
if (cd "$tmp" && "$cc" "$src/examples/embed.c" $(pkg-config --cflags --libs tfuse) -o embed_shared) 2>"$tmp/cc1.log"; then
  ok
  if needs_libtfuse "$tmp/embed_shared"; then ok; else bad "embed_shared does not link libtfuse.so"; fi
  expect 0 "^loss [0-9.]+ over a batch of 64" -- env LD_LIBRARY_PATH="$P/$libdir" "$tmp/embed_shared" "$model"
else
  bad "cc embed.c \$(pkg-config --cflags --libs tfuse): $(cat "$tmp/cc1.log")"
fi

# 2. pkg-config --static: the archive and Libs.private (LLVM, oneDNN, ...; OpenBLAS is opened at run time)
static_libs=$(pkg-config --static --libs tfuse | sed 's/\(^\| \)-ltfuse\( \|$\)/ /')
if (cd "$tmp" && "$cc" "$src/examples/embed.c" $(pkg-config --cflags tfuse) -Wl,-Bstatic -L"$P/$libdir" -ltfuse -Wl,-Bdynamic \
      $static_libs -o embed_static) 2>"$tmp/cc2.log"; then
  ok
  if needs_libtfuse "$tmp/embed_static"; then bad "embed_static needs libtfuse.so"; else ok; fi
  expect 0 "^loss [0-9.]+ over a batch of 64" -- "$tmp/embed_static" "$model"
else
  bad "static link against libtfuse.a: $(grep -c 'undefined reference' "$tmp/cc2.log") undefined references: $(head -c 2000 "$tmp/cc2.log")"
fi

# 3. find_package(tfuse): the shared and the static target
mkdir -p "$tmp/proj"
cp "$src/examples/embed.c" "$tmp/proj/"
cat >"$tmp/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(embed_user C)
find_package(tfuse 0.1 REQUIRED)
add_executable(embed_shared embed.c)
target_link_libraries(embed_shared PRIVATE tfuse::tfuse)
add_executable(embed_static embed.c)
target_link_libraries(embed_static PRIVATE tfuse::tfuse_static)
CM
if "$cmake" -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$P" >"$tmp/proj.log" 2>&1 &&
   "$cmake" --build "$tmp/proj/build" >>"$tmp/proj.log" 2>&1; then
  ok
  if needs_libtfuse "$tmp/proj/build/embed_shared"; then ok; else bad "find_package: embed_shared does not link libtfuse.so"; fi
  if needs_libtfuse "$tmp/proj/build/embed_static"; then bad "find_package: embed_static needs libtfuse.so"; else ok; fi
  # the build tree's RUNPATH points at the installed library
  expect 0 "^loss [0-9.]+ over a batch of 64" -- "$tmp/proj/build/embed_shared" "$model"
  expect 0 "^loss [0-9.]+ over a batch of 64" -- "$tmp/proj/build/embed_static" "$model"
else
  bad "find_package(tfuse) project: $(tail -c 3000 "$tmp/proj.log")"
fi
# a version this install does not satisfy is refused
sed -i 's/find_package(tfuse 0.1 REQUIRED)/find_package(tfuse 99 REQUIRED)/' "$tmp/proj/CMakeLists.txt"
expect 1 "tfuse.*version" -- "$cmake" -S "$tmp/proj" -B "$tmp/proj/build99" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$P"

echo "install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
