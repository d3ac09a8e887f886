/* llvm_lazy.c — libtfuse.so's side of the LLVM JIT: llvm.h's functions,
 * forwarded to libtfuse-llvm.so (codegen/llvm.c built as a module), which
 * is opened the first time one of them is called.
 *
 * Why: libLLVM and what it brings along (z3, libxml2, ICU, ...) take 15-20
 * ms to load and relocate, and most processes never JIT a kernel: a cuda
 * compile, the interpreter, `tfuse doctor`, `tfuse --help`, a Python
 * `import tfuse`. libtfuse.a (tfuse_static) links llvm.c directly and has
 * no module.
 *
 * Where: libtfuse-llvm.so beside the libtfuse.so this code is in (the
 * build tree and the install both put it there), or $TFUSE_LLVM_MODULE.
 * The module must come from the same build: its tf_llvm_api names the
 * tfuse version and the sizes of the structs both sides share, and one
 * that differs is refused. When it cannot be opened, every function fails
 * with a message that says which file and why (tf_jit_supports: false,
 * with that reason), and the cpu target is unavailable, not broken. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "llvm.h"
#include "env.h"

static const tf_llvm_api *_Atomic api;   /* atomic: tf_jit_unavailable reads it outside the once */
static char api_error[2400];
static char module_path[1100];
static _Atomic bool opened;               /* open_module ran (api_error is written before) */

static void find_module(void)
{
    const char *env = tf_env("TFUSE_LLVM_MODULE");
    Dl_info info;
    if (env && *env) {
        snprintf(module_path, sizeof module_path, "%s", env);
    } else if (dladdr((void *)find_module, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        const char *slash = strrchr(info.dli_fname, '/');
        snprintf(module_path, sizeof module_path, "%.*s/libtfuse-llvm.so", (int)(slash - info.dli_fname), info.dli_fname);
    } else {
        snprintf(module_path, sizeof module_path, "libtfuse-llvm.so");   /* the loader's search path */
    }
}

static const char *path_of_module(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, find_module);
    return module_path;
}

static void open_module(void)
{
    const char *path = path_of_module();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(api_error, sizeof api_error, "cannot load tfuse's LLVM JIT module: %s", e ? e : path);
        opened = true;
        return;
    }
    const tf_llvm_api *a = dlsym(h, "tf_llvm_module_api");
    if (!a) {
        snprintf(api_error, sizeof api_error, "%s is not tfuse's LLVM JIT module (no tf_llvm_module_api)", path);
        dlclose(h);
        opened = true;
        return;
    }
    if (strcmp(a->version, TF_LLVM_API_VERSION) != 0 || a->size != sizeof *a || a->kernel_size != sizeof(tf_kernel) ||
        a->diag_size != sizeof(tf_diag)) {
        snprintf(api_error, sizeof api_error, "%s comes from another tfuse build (%.100s) than this libtfuse (%s): install them together",
                 path, a->version, TF_LLVM_API_VERSION);
        dlclose(h);
        opened = true;
        return;
    }
    api = a;   /* the module stays open for the process's life */
    opened = true;
}

static bool have_api(tf_diag *d)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, open_module);
    if (!api && d) tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "%s", api_error);
    return api != NULL;
}

tf_ir_status tf_jit_create(tf_jit **out, tf_diag *d)
{
    *out = NULL;
    return have_api(d) ? api->create(out, d) : d->status;
}

void tf_jit_free(tf_jit *j)
{
    if (j && have_api(NULL)) api->free(j);
}

tf_ir_status tf_jit_compile(tf_jit *j, const tf_kernel *k, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d)
{
    *fn = NULL;
    *code = NULL;
    return have_api(d) ? api->compile(j, k, fn, code, d) : d->status;
}

tf_ir_status tf_jit_release(tf_jit *j, tf_jit_code *code, tf_diag *d)
{
    if (!code) return TF_IR_OK;
    return have_api(d) ? api->release(j, code, d) : d->status;
}

char *tf_jit_target_id(tf_jit *j) { return have_api(NULL) ? api->target_id(j) : NULL; }

tf_ir_status tf_jit_compile_object(tf_jit *j, const tf_kernel *k, const char *sym, tf_kernel_fn *fn, tf_jit_code **code, void **obj,
                                   size_t *obj_n, tf_diag *d)
{
    *fn = NULL;
    *code = NULL;
    *obj = NULL;
    *obj_n = 0;
    return have_api(d) ? api->compile_object(j, k, sym, fn, code, obj, obj_n, d) : d->status;
}

tf_ir_status tf_jit_load_object(tf_jit *j, const char *sym, const void *obj, size_t n, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d)
{
    *fn = NULL;
    *code = NULL;
    return have_api(d) ? api->load_object(j, sym, obj, n, fn, code, d) : d->status;
}

tf_ir_status tf_jit_object(const tf_kernel *k, const char *sym, const char *pipe, void **obj, size_t *obj_n, tf_diag *d)
{
    *obj = NULL;
    *obj_n = 0;
    return have_api(d) ? api->object(k, sym, pipe, obj, obj_n, d) : d->status;
}

tf_ir_status tf_jit_set_pipeline(tf_jit *j, const char *pipeline)
{
    return have_api(NULL) ? api->set_pipeline(j, pipeline) : TF_IR_ERR_INTERNAL;
}

bool tf_jit_supports(const tf_kernel *k, char *why, size_t n)
{
    if (have_api(NULL)) return api->supports(k, why, n);
    if (why && n) snprintf(why, n, "%s", api_error);
    return false;
}

bool tf_jit_lowers(int op, char *why, size_t n)
{
    if (have_api(NULL)) return api->lowers(op, why, n);
    if (why && n) snprintf(why, n, "%s", api_error);
    return false;
}

char *tf_jit_print(const tf_kernel *k) { return have_api(NULL) ? api->print(k) : NULL; }

char *tf_jit_print_pipeline(const tf_kernel *k, const char *pipeline) { return have_api(NULL) ? api->print_pipeline(k, pipeline) : NULL; }

/* Without opening it (which is what this file saves): a module that was
 * opened and failed says why; one not yet opened must at least exist. */
const char *tf_jit_unavailable(void)
{
    static _Thread_local char why[1400];
    if (api) return NULL;
    if (opened) return api_error;
    const char *path = path_of_module();
    if (strchr(path, '/') && access(path, R_OK) != 0) {
        snprintf(why, sizeof why, "cannot find tfuse's LLVM JIT module %s: %s", path, strerror(errno));
        return why;
    }
    return NULL;
}

const char *tf_jit_where(char *buf, size_t n)
{
    snprintf(buf, n, "module %s (%s)", path_of_module(), api ? "opened" : opened ? "failed to open" : "opened when a kernel is compiled");
    return buf;
}
