/* test_objload.c — codegen/objload.c, the cpu target's object loader.
 *
 * Without LLVM: objects it must refuse (not ELF, another machine or class,
 * section headers past the end) are refused with the right status.
 * With LLVM: every kernel object tf_jit_object makes for a few models
 * (libm calls, dropout's runtime call, reductions, f16 storage) loads
 * through objload and computes, bit for bit, what the same kernel compiled
 * through ORC computes on the same random buffers; an object cut short
 * anywhere is refused; random corruption of an object never crashes the
 * loader (the sanitizer run checks that); a symbol nobody defines is named. */
#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check.h"
#include "objload.h"
#include "testutil.h"
#ifdef TFUSE_HAVE_LLVM
#include "kernel.h"
#include "llvm.h"
#include "parser.h"
#include "passes.h"
#endif

static tf_obj_status load(const void *data, size_t n, const char *sym, tf_obj_resolver r, char *why, size_t nw)
{
    tf_obj *o = NULL;
    void *addr = NULL;
    tf_obj_status st = tf_obj_load(data, n, sym, r, NULL, &o, &addr, why, nw);
    CHECK((st == TF_OBJ_OK) == (o != NULL && addr != NULL), "an object and an address exactly when it loads (status %d)", (int)st);
    tf_obj_free(o);
    return st;
}

static void refused(void)
{
    char why[256];
    unsigned char buf[512];
    CHECK(load("", 0, "f", NULL, why, sizeof why) == TF_OBJ_MALFORMED && strstr(why, "not an ELF"), "empty: %s", why);
    CHECK(load("hello, world", 12, "f", NULL, why, sizeof why) == TF_OBJ_MALFORMED, "text: %s", why);
    Elf64_Ehdr e;
    memset(&e, 0, sizeof e);
    memcpy(e.e_ident, ELFMAG, SELFMAG);
    e.e_ident[EI_CLASS] = ELFCLASS64;
    e.e_ident[EI_DATA] = ELFDATA2LSB;
    e.e_type = ET_REL;
    e.e_machine = EM_AARCH64;
    e.e_shentsize = sizeof(Elf64_Shdr);
    memcpy(buf, &e, sizeof e);
    CHECK(load(buf, sizeof e, "f", NULL, why, sizeof why) == TF_OBJ_UNSUPPORTED && strstr(why, "x86-64"), "aarch64: %s", why);
    e.e_machine = EM_X86_64;
    e.e_type = ET_DYN;
    memcpy(buf, &e, sizeof e);
    CHECK(load(buf, sizeof e, "f", NULL, why, sizeof why) == TF_OBJ_UNSUPPORTED, "a shared object: %s", why);
    e.e_type = ET_REL;
    e.e_ident[EI_CLASS] = ELFCLASS32;
    memcpy(buf, &e, sizeof e);
    CHECK(load(buf, sizeof e, "f", NULL, why, sizeof why) == TF_OBJ_UNSUPPORTED, "32-bit: %s", why);
    e.e_ident[EI_CLASS] = ELFCLASS64;
    e.e_shoff = 1u << 30;   /* section headers far past the end */
    e.e_shnum = 4;
    memcpy(buf, &e, sizeof e);
    CHECK(load(buf, sizeof e, "f", NULL, why, sizeof why) == TF_OBJ_MALFORMED && strstr(why, "section headers"), "headers: %s", why);
    e.e_shoff = sizeof e;   /* four zeroed headers: no code */
    e.e_shstrndx = 0;
    memcpy(buf, &e, sizeof e);
    memset(buf + sizeof e, 0, sizeof buf - sizeof e);
    CHECK(load(buf, sizeof e + 4 * sizeof(Elf64_Shdr), "f", NULL, why, sizeof why) == TF_OBJ_MALFORMED && strstr(why, "no code"),
          "empty sections: %s", why);
}

#ifdef TFUSE_HAVE_LLVM
static uint64_t g_rng;
static uint64_t next_rand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static double fake_uniform(const uint64_t *rt, int64_t salt, int64_t flat)
{
    (void)rt;
    return (double)((salt * 31 + flat) % 97) / 97.0;
}

static void *resolve_fake(const char *name, void *ctx)
{
    (void)ctx;
    union { double (*f)(const uint64_t *, int64_t, int64_t); void *p; } u;
    u.f = fake_uniform;
    return strcmp(name, "tf_jit_dropout_uniform") == 0 ? u.p : NULL;
}

static int g_kernels, g_compared;

/* Fresh buffers for k, random bytes (finite floats where they are floats). */
static void **make_bufs(const tf_kernel *k, size_t *sizes, uint64_t seed)
{
    void **b = calloc((size_t)k->nbufs + 1, sizeof *b);
    for (int i = 0; b && i < k->nbufs; i++) {
        const tf_type *t = &k->bufs[i].value->type;
        sizes[i] = (size_t)tf_type_numel(t) * (size_t)tf_dtype_bytes(t->dtype);
        b[i] = calloc(sizes[i] ? sizes[i] : 1, 1);
        uint64_t r = seed + (uint64_t)i * 7919;
        for (size_t e = 0; b[i] && t->dtype == TF_DT_F32 && e < sizes[i] / 4; e++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            ((float *)b[i])[e] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        }
        for (size_t e = 0; b[i] && t->dtype == TF_DT_F16 && e < sizes[i] / 2; e++)
            ((uint16_t *)b[i])[e] = (uint16_t)(0x3000 + (e * 37) % 0x0c00);   /* 0.125 .. 2, finite */
    }
    return b;
}

static void free_bufs(void **b, int n)
{
    for (int i = 0; b && i < n; i++) free(b[i]);
    free(b);
}

static void model(const char *label, const char *text, tf_ir_mode mode)
{
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(label, text, strlen(text), NULL, 0, &m, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        return;
    }
    tf_options o = {.mode = mode, .diag = &d};
    tf_kernel_plan plan = {0};
    tf_jit *jit = NULL;
    if (tf_run_pipeline(m, NULL, &o) || tf_kernels_build(m, &plan, &d) || tf_jit_create(&jit, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        tf_kernels_free(&plan);
        tf_module_free(m);
        return;
    }
    for (int i = 0; i < plan.nkernels; i++) {
        const tf_kernel *k = &plan.kernels[i];
        if (!k->nexprs || k->kind == TF_K_LIBRARY || !tf_jit_supports(k, NULL, 0)) continue;
        char sym[32];
        snprintf(sym, sizeof sym, "tf_objload_%d", i);
        void *obj = NULL;
        size_t n = 0;
        if (tf_jit_object(k, sym, NULL, &obj, &n, &d)) {
            CHECK(0, "%s: %s: tf_jit_object: %s", label, k->name, d.msg);
            continue;
        }
        g_kernels++;
        char why[256];
        /* objload itself: it takes every object the cpu target makes */
        tf_obj *lo = NULL;
        void *addr = NULL;
        tf_obj_status os = tf_obj_load(obj, n, sym, resolve_fake, NULL, &lo, &addr, why, sizeof why);
        CHECK(os == TF_OBJ_OK, "%s: %s: objload: %s", label, k->name, why);
        tf_obj_free(lo);
        CHECK(load(obj, n, "tf_no_such_function", resolve_fake, why, sizeof why) == TF_OBJ_MALFORMED && strstr(why, "no function"),
              "%s: a function the object lacks: %s", label, why);
        bool calls_runtime = memmem(obj, n, "tf_jit_dropout_uniform", 22) != NULL;
        if (calls_runtime)
            CHECK(load(obj, n, sym, NULL, why, sizeof why) == TF_OBJ_UNDEFINED && strstr(why, "tf_jit_dropout_uniform"),
                  "%s: the runtime's symbol, unresolved, is named: %s", label, why);
        /* cut short anywhere: refused, never loaded */
        int cut_ok = 0;
        for (size_t c = 0; c < n; c += 1 + n / 97) cut_ok += load(obj, c, sym, resolve_fake, why, sizeof why) == TF_OBJ_OK;
        CHECK(cut_ok == 0, "%s: %s: %d objects cut short were loaded", label, k->name, cut_ok);
        /* random corruption: any answer, no crash (not run) */
        unsigned char *bad = malloc(n);
        for (int t = 0; bad && t < 60; t++) {
            memcpy(bad, obj, n);
            for (int f = 0; f < 1 + t % 4; f++) bad[next_rand() % n] ^= (unsigned char)(1u << (next_rand() % 8));
            if (t % 3 == 0) {   /* aim at the section headers, the symbol table's neighbourhood */
                Elf64_Ehdr e;
                memcpy(&e, obj, sizeof e);
                size_t at = (size_t)e.e_shoff + next_rand() % ((size_t)e.e_shnum * sizeof(Elf64_Shdr));
                if (at < n) bad[at] = (unsigned char)next_rand();
            }
            (void)load(bad, n, sym, resolve_fake, why, sizeof why);
        }
        free(bad);
        /* objload's code against ORC's, same random buffers, bit for bit
         * (the real dropout draw, as the cpu target resolves it) */
        tf_kernel_fn f_obj = NULL, f_orc = NULL;
        tf_jit_code *c_orc = NULL;
        tf_obj *c_obj = NULL;
        void *a_obj = NULL;
        if (tf_obj_load(obj, n, sym, tf_kernel_runtime_symbol, NULL, &c_obj, &a_obj, why, sizeof why)) {
            CHECK(0, "%s: %s: objload: %s", label, k->name, why);
        } else if (tf_jit_compile(jit, k, &f_orc, &c_orc, &d)) {
            CHECK(0, "%s: %s: %s", label, k->name, d.msg);
        } else {
            union { void *p; tf_kernel_fn f; } u;
            u.p = a_obj;
            f_obj = u.f;
            size_t *sizes = calloc((size_t)k->nbufs + 1, sizeof *sizes);
            uint64_t seed = next_rand();
            void **a = make_bufs(k, sizes, seed), **b = make_bufs(k, sizes, seed);
            int ax = tf_kernel_split_axis(k);
            int64_t hi = ax < 0 ? 1 : k->dims[ax];
            uint64_t rt[2] = {seed, 3};
            if (a && b) {
                f_obj(a, 0, hi, rt);
                f_orc(b, 0, hi, rt);
                for (int q = 0; q < k->nbufs; q++)
                    CHECK(memcmp(a[q], b[q], sizes[q]) == 0, "%s: %s: buffer %d, objload's code against ORC's", label, k->name, q);
                g_compared++;
            }
            free_bufs(a, k->nbufs);
            free_bufs(b, k->nbufs);
            free(sizes);
        }
        tf_obj_free(c_obj);
        tf_jit_release(jit, c_orc, &d);
        tf_free(obj);
    }
    tf_jit_free(jit);
    tf_kernels_free(&plan);
    tf_module_free(m);
}
#endif

int main(void)
{
    refused();
#ifdef TFUSE_HAVE_LLVM
    g_rng = test_seed() | 1;
    model("math", "input x : f32[5, 33]\ny = tanh(x)\nz = exp(y)\nw = pow(z, 1.7)\nc = cos(w)\ns = reduce_sum(c, axes=[1])\n"
          "output s\noutput w\n", TF_IR_INFER);
    model("dropout", "input x : f32[3, 7]\nd = dropout(x, p=0.3)\ny = mul(d, 2.0)\noutput y\n", TF_IR_TRAIN);
    model("half", "input x : f16[64, 40]\ninput b : f16[40]\nz = add(x, b)\nr = relu(z)\nm = reduce_max(r, axes=[0])\noutput m\noutput r\n",
          TF_IR_INFER);
    model("softmax", "input x : f32[6, 50]\nm = reduce_max(x, axes=[1], keepdims=true)\nd = sub(x, m)\ne = exp(d)\n"
          "s = reduce_sum(e, axes=[1], keepdims=true)\np = div(e, s)\noutput p\n", TF_IR_INFER);
    CHECK(g_kernels >= 4 && g_compared == g_kernels, "%d kernels, %d compared", g_kernels, g_compared);
    printf("objload: %d kernels loaded and compared with ORC\n", g_compared);
#endif
    return check_report();
}
