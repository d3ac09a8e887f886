# fuzz.cmake — included by the top-level CMakeLists.txt before any target.
# -DTFUSE_FUZZ=ON (clang only) compiles everything with libFuzzer's coverage
# instrumentation and ASan+UBSan, and builds tests/fuzz: the targets
# fuzz_model, fuzz_npy and fuzz_safetensors and the dictionary model.dict.
# Build just those: cmake --build DIR --target fuzz_all. tests/fuzz/run.sh
# does all of it; tests/fuzz/README.md says how to use them.
option(TFUSE_FUZZ "Build the libFuzzer targets in tests/fuzz (needs clang)" OFF)
if(TFUSE_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "TFUSE_FUZZ=ON needs clang (found ${CMAKE_C_COMPILER_ID}): configure a fresh build directory "
                        "with -DCMAKE_C_COMPILER=clang; scripts/setup.sh installs clang and libclang-rt-14-dev")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()
