/* emu_prelude.c — emu_prelude.cuh's text in the library, as the NUL-terminated
 * string tf_cuda_emu_prelude (emu.c puts it before every kernel it compiles).
 * The assembler includes the file (TF_EMU_PRELUDE, its path as a string literal, set by CMake), so
 * the prelude stays a readable C++ file. */
#ifndef TF_EMU_PRELUDE
#error "TF_EMU_PRELUDE (the path of runtime/cuda/emu_prelude.cuh) is set by CMakeLists.txt"
#endif
__asm__(".section .rodata\n"
        ".globl tf_cuda_emu_prelude\n"
        ".hidden tf_cuda_emu_prelude\n"
        ".type tf_cuda_emu_prelude, %object\n"
        ".balign 16\n"
        "tf_cuda_emu_prelude:\n"
        ".incbin \"" TF_EMU_PRELUDE "\"\n"
        ".byte 0\n"
        ".size tf_cuda_emu_prelude, . - tf_cuda_emu_prelude\n"
        ".previous\n");
