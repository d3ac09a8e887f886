/* objload.h — a loader for the cpu target's kernel objects: an x86-64 ELF
 * relocatable object (what codegen/llvm.c emits, one kernel per object)
 * mapped into memory and relocated, with no LLVM.
 *
 * Why: linking a cached or packaged object through ORC costs about 0.7 ms
 * per kernel (a materialization, a lookup and a memory manager each);
 * this loader does it in microseconds, and needs no LLVM loaded at all.
 * The cpu target (runtime/cpu/cpu_jit.c) links every object with it
 * and goes through ORC (tf_jit_load_object) only where it answers
 * TF_OBJ_UNSUPPORTED.
 *
 * What it takes: ELF64, little-endian, ET_REL, EM_X86_64; its allocated
 * sections (code, constants, zero-filled data) are laid out in one mapping,
 * code on pages of its own made read+execute once relocated, the rest
 * read-only (read-write where a section is writable). Relocations:
 * R_X86_64_64, PC64, PC32, PLT32, 32 and 32S, the 32-bit ones checked to
 * reach. A symbol the object leaves undefined resolves through resolve()
 * (the runtime's own helpers: tf_kernel_runtime_symbol), then dlsym over
 * the process (libm).
 *
 * What it leaves out: .eh_frame is not loaded or registered, so a debugger
 * or profiler cannot unwind through a kernel's frame (kernels call nothing
 * that throws or unwinds); TLS, GOT-relative relocations and common
 * symbols are TF_OBJ_UNSUPPORTED (LLVM's large code model, which the cpu
 * target compiles with, emits none of them). */
#ifndef TF_CODEGEN_OBJLOAD_H
#define TF_CODEGEN_OBJLOAD_H

#include <stddef.h>

typedef enum {
    TF_OBJ_OK = 0,
    TF_OBJ_UNSUPPORTED,   /* a well-formed object this loader does not take (another machine, a relocation it lacks) */
    TF_OBJ_MALFORMED,     /* not a well-formed object: offsets out of bounds, a bad symbol */
    TF_OBJ_UNDEFINED,     /* a symbol neither resolve() nor the process defines */
    TF_OBJ_NOMEM,         /* mmap or mprotect failed */
} tf_obj_status;

typedef struct tf_obj tf_obj;   /* one loaded object: its mapping */

/* Resolves an undefined symbol to its address, or NULL to look in the
 * process; may be NULL. */
typedef void *(*tf_obj_resolver)(const char *name, void *ctx);

/* Load the n bytes at data (copied; the caller keeps them) and find the
 * function named sym in it: its address into *addr, the loaded object
 * into *out. On failure a message into why (n_why bytes). */
tf_obj_status tf_obj_load(const void *data, size_t n, const char *sym, tf_obj_resolver resolve, void *ctx, tf_obj **out, void **addr,
                          char *why, size_t n_why);
/* Unmap it; its functions must not be called again. */
void tf_obj_free(tf_obj *o);

#endif
