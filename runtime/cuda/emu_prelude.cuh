// emu_prelude.cuh — what cuda-emu (runtime/cuda/emu.c) puts before a
// kernel's CUDA C source to compile it with the host C++ compiler: the
// CUDA built-ins the emitter (codegen/cuda.c) uses, and the scheduler that
// runs every thread of every block.
//
// A CUDA thread is a coroutine with its own stack. The scheduler resumes
// the threads of a block in order; a thread runs until it finishes or
// reaches a synchronization point (__syncthreads, a warp shuffle,
// __syncwarp) and gives control back. A block barrier is passed when every
// thread of the block that has not exited waits at one; a warp point when
// every live lane of the warp waits at one. A shuffle is a real exchange:
// each lane writes its value, the warp synchronizes, each lane reads its
// source lane's value, the warp synchronizes again. When no thread can go
// on (a barrier in divergent code, a shuffle naming an exited lane) the
// launch fails and says which threads wait where.
//
// Launches are serialized by the caller (one at a time in the process), so
// the scheduler's state is plain static data of the loaded kernel. Dynamic
// shared memory is `tf_smem`, the name the emitter declares it under
// (`extern __shared__ __align__(16) unsigned char tf_smem[]`), filled with
// 0xff bytes (NaN in every float type) before each block, as a real GPU
// leaves it holding garbage.
//
// Numbers: host math (glibc), no fused multiply-add contraction (-ffp-contract=off),
// f16/bf16 conversions rounded to nearest even from the exact value.

// ---- qualifiers ------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ thread_local
#define __align__(n) __attribute__((aligned(n)))
#define warpSize 32

// ---- math (glibc's, declared here so that no header is parsed) -------------
extern "C" {
float expf(float) noexcept; double exp(double) noexcept;
float logf(float) noexcept; double log(double) noexcept;
float sqrtf(float) noexcept; double sqrt(double) noexcept;
float tanhf(float) noexcept; double tanh(double) noexcept;
float sinf(float) noexcept; double sin(double) noexcept;
float cosf(float) noexcept; double cos(double) noexcept;
float erff(float) noexcept; double erf(double) noexcept;
float powf(float, float) noexcept; double pow(double, double) noexcept;
float fabsf(float) noexcept; double fabs(double) noexcept;
float floorf(float) noexcept; double floor(double) noexcept;
float ceilf(float) noexcept; double ceil(double) noexcept;
float fmaxf(float, float) noexcept; double fmax(double, double) noexcept;
float fminf(float, float) noexcept; double fmin(double, double) noexcept;
float log1pf(float) noexcept; double log1p(double) noexcept;
float expm1f(float) noexcept; double expm1(double) noexcept;
void *memset(void *, int, unsigned long) noexcept;
void *memcpy(void *, const void *, unsigned long) noexcept;
int snprintf(char *, unsigned long, const char *, ...) noexcept;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

// ---- bit casts ---------------------------------------------------------------
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
static inline long long __double_as_longlong(double f) { long long i; memcpy(&i, &f, 8); return i; }

// ---- f16 and bf16: storage types and conversions ------------------------------
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };

// x rounded to nearest even into a binary format with ebits of exponent and
// mbits of mantissa (f16: 5, 10; bf16: 8, 7); NaN stays a quiet NaN.
static inline unsigned short tfemu_round16(double x, int ebits, int mbits)
{
    unsigned long long b;
    memcpy(&b, &x, 8);
    unsigned short sign = (unsigned short)((b >> 63) << 15);
    int e = (int)((b >> 52) & 0x7ff);
    unsigned long long m = b & ((1ull << 52) - 1);
    unsigned emax = (1u << ebits) - 1, bias = (1u << (ebits - 1)) - 1;
    if (e == 0x7ff) return (unsigned short)(sign | (emax << mbits) | (m ? 1u << (mbits - 1) : 0));
    if (e == 0) return sign;   // zero, and doubles far below every 16-bit subnormal
    m |= 1ull << 52;
    int ue = e - 1023;                 // x = m * 2^(ue - 52)
    int he = ue + (int)bias;           // the biased exponent if normal
    int shift = he >= 1 ? 52 - mbits : 52 - mbits + 1 - he;   // subnormal: the unit is 2^(1 - bias - mbits)
    if (shift >= 64) return sign;
    unsigned long long r = m >> shift, rem = m & ((1ull << shift) - 1), half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    if (he < 1) return (unsigned short)(sign | r);     // r == 1 << mbits is the smallest normal: the same bits
    if (r >> (mbits + 1)) { r >>= 1; he++; }
    if (he >= (int)emax) return (unsigned short)(sign | (emax << mbits));   // overflow: infinity
    return (unsigned short)(sign | ((unsigned)he << mbits) | (r & ((1u << mbits) - 1)));
}

static inline double tfemu_widen16(unsigned short h, int ebits, int mbits)
{
    unsigned emax = (1u << ebits) - 1, bias = (1u << (ebits - 1)) - 1;
    unsigned e = (h >> mbits) & emax, m = h & ((1u << mbits) - 1);
    double v;
    if (e == emax) v = m ? __longlong_as_double(0x7ff8000000000000LL) : __longlong_as_double(0x7ff0000000000000LL);
    else if (e == 0) v = (double)m * __builtin_ldexp(1.0, 1 - (int)bias - mbits);
    else v = (double)(m | (1u << mbits)) * __builtin_ldexp(1.0, (int)e - (int)bias - mbits);
    return (h >> 15) ? -v : v;
}

static inline float __half2float(__half h) { return (float)tfemu_widen16(h.x, 5, 10); }
static inline __half __float2half_rn(float f) { return __half{tfemu_round16(f, 5, 10)}; }
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline __half __double2half(double d) { return __half{tfemu_round16(d, 5, 10)}; }
static inline float __bfloat162float(__nv_bfloat16 h) { return (float)tfemu_widen16(h.x, 8, 7); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{tfemu_round16(f, 8, 7)}; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16{tfemu_round16(d, 8, 7)}; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline __half __ushort_as_half(unsigned short x) { return __half{x}; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return __nv_bfloat16{x}; }

// ---- the thread model -----------------------------------------------------------
struct tfemu_dim3 { unsigned x, y, z; };
enum { TFEMU_RUN, TFEMU_BLOCK_WAIT, TFEMU_WARP_WAIT, TFEMU_DONE };
struct tfemu_thread {
    void *sp;                  // saved stack pointer while suspended
    tfemu_dim3 tid;
    unsigned linear, lane, warp;
    int state;
    unsigned mask;             // at a warp point: the lanes it synchronizes with
    const char *where;         // what it waits at, for messages
};

enum { TFEMU_MAX_THREADS = 1024, TFEMU_SMEM_MAX = 232448 };
extern "C" {   // C linkage, as the kernels' (extern "C") declarations of it have
thread_local __attribute__((aligned(16))) unsigned char tf_smem[TFEMU_SMEM_MAX];
}
static tfemu_thread tfemu_threads[TFEMU_MAX_THREADS];
static tfemu_thread *tfemu_self;
static tfemu_dim3 tfemu_bidx, tfemu_bdim, tfemu_gdim;
static void *tfemu_sched_sp;
static void (*tfemu_entry)(void **);
static void **tfemu_args;
static unsigned long long tfemu_xchg[TFEMU_MAX_THREADS];   // a shuffle's values, by linear thread index
static char *tfemu_err;
static unsigned long tfemu_errn;
#define threadIdx (tfemu_self->tid)
#define blockIdx tfemu_bidx
#define blockDim tfemu_bdim
#define gridDim tfemu_gdim

extern "C" void tfemu_swap(void **save, void *to);
#if defined(__x86_64__)
// Save the callee-saved registers on this stack, switch stacks, restore them there.
asm(".text\n"
    ".p2align 4\n"
    ".globl tfemu_swap\n"
    ".hidden tfemu_swap\n"
    ".type tfemu_swap,@function\n"
    "tfemu_swap:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size tfemu_swap, .-tfemu_swap\n");
#elif defined(__aarch64__)
asm(".text\n"
    ".p2align 4\n"
    ".globl tfemu_swap\n"
    ".hidden tfemu_swap\n"
    ".type tfemu_swap,%function\n"
    "tfemu_swap:\n"
    "    sub sp, sp, #176\n"
    "    stp x19, x20, [sp, #0]\n    stp x21, x22, [sp, #16]\n    stp x23, x24, [sp, #32]\n"
    "    stp x25, x26, [sp, #48]\n    stp x27, x28, [sp, #64]\n    stp x29, x30, [sp, #80]\n"
    "    stp d8, d9, [sp, #96]\n    stp d10, d11, [sp, #112]\n    stp d12, d13, [sp, #128]\n    stp d14, d15, [sp, #144]\n"
    "    mov x9, sp\n    str x9, [x0]\n    mov sp, x1\n"
    "    ldp x19, x20, [sp, #0]\n    ldp x21, x22, [sp, #16]\n    ldp x23, x24, [sp, #32]\n"
    "    ldp x25, x26, [sp, #48]\n    ldp x27, x28, [sp, #64]\n    ldp x29, x30, [sp, #80]\n"
    "    ldp d8, d9, [sp, #96]\n    ldp d10, d11, [sp, #112]\n    ldp d12, d13, [sp, #128]\n    ldp d14, d15, [sp, #144]\n"
    "    add sp, sp, #176\n"
    "    ret\n"
    ".size tfemu_swap, .-tfemu_swap\n");
#else
#error "cuda-emu switches stacks with x86-64 or AArch64 code; this host is neither"
#endif

static void tfemu_yield(void) { tfemu_swap(&tfemu_self->sp, tfemu_sched_sp); }

__attribute__((noreturn, used)) static void tfemu_start(void)
{
    tfemu_entry(tfemu_args);
    tfemu_self->state = TFEMU_DONE;
    tfemu_swap(&tfemu_self->sp, tfemu_sched_sp);
    __builtin_trap();   // a finished thread is never resumed
}

// A fresh stack whose first resumption enters tfemu_start.
static void *tfemu_new_stack(char *base, unsigned long size)
{
    unsigned long top = ((unsigned long)(base + size)) & ~15ul;
    void **sp = (void **)top;
#if defined(__x86_64__)
    *--sp = 0;                        // tfemu_start's return address: never used
    *--sp = (void *)tfemu_start;      // where tfemu_swap's ret goes
    for (int i = 0; i < 6; i++) *--sp = 0;   // rbp rbx r12 r13 r14 r15
#else
    sp -= 22;                          // the 176-byte frame tfemu_swap pops
    for (int i = 0; i < 22; i++) sp[i] = 0;
    sp[11] = (void *)tfemu_start;      // x30 (the link register) at [sp, #88]
#endif
    return sp;
}

static void tfemu_fail(const char *what)
{
    if (tfemu_err && !tfemu_err[0])
        snprintf(tfemu_err, tfemu_errn, "block (%u, %u, %u), thread (%u, %u, %u): %s", tfemu_bidx.x, tfemu_bidx.y, tfemu_bidx.z,
                 tfemu_self->tid.x, tfemu_self->tid.y, tfemu_self->tid.z, what);
}

void __syncthreads(void)
{
    tfemu_self->state = TFEMU_BLOCK_WAIT;
    tfemu_self->where = "__syncthreads";
    tfemu_yield();
}

static void tfemu_warp_point(unsigned mask, const char *where)
{
    tfemu_self->state = TFEMU_WARP_WAIT;
    tfemu_self->mask = mask;
    tfemu_self->where = where;
    tfemu_yield();
}

static inline void __syncwarp(unsigned mask = 0xffffffffu) { tfemu_warp_point(mask, "__syncwarp"); }
// blocks run one after another: every write is seen by every later block
static inline void __threadfence(void) {}

// The value lane src (of this warp) holds, exchanged for real; own value
// when src is outside the lane's segment of `width` lanes, as CUDA does.
template <typename T> static T tfemu_shuffle(unsigned mask, T v, int src, int width, const char *what)
{
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    tfemu_thread *me = tfemu_self;
    if (width < 1 || width > 32 || (width & (width - 1))) tfemu_fail("a warp shuffle's width is not a power of two up to 32");
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof v);
    tfemu_xchg[me->linear] = bits;
    tfemu_warp_point(mask, what);
    T r = v;
    bool inside = src >= 0 && src < 32 && (unsigned)src / (unsigned)width == me->lane / (unsigned)width;
    if (inside) {
        unsigned other = me->warp * 32 + (unsigned)src;
        if (!(mask >> src & 1)) tfemu_fail("a warp shuffle reads a lane its mask leaves out");
        else if (other >= tfemu_bdim.x * tfemu_bdim.y * tfemu_bdim.z) tfemu_fail("a warp shuffle reads a lane past the end of the block");
        else memcpy(&r, &tfemu_xchg[other], sizeof r);
    }
    tfemu_warp_point(mask, what);   // every lane has read before the next shuffle writes
    return r;
}

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return tfemu_shuffle(mask, v, (int)(tfemu_self->lane ^ (unsigned)lane_mask), width, "__shfl_xor_sync");
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return tfemu_shuffle(mask, v, (int)(tfemu_self->lane / (unsigned)width * (unsigned)width) + (src % width), width, "__shfl_sync");
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    unsigned lane = tfemu_self->lane, seg = lane / (unsigned)width * (unsigned)width;
    int src = lane + delta < seg + (unsigned)width ? (int)(lane + delta) : (int)lane;
    return tfemu_shuffle(mask, v, src, width, "__shfl_down_sync");
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    unsigned lane = tfemu_self->lane, seg = lane / (unsigned)width * (unsigned)width;
    int src = lane >= seg + delta ? (int)(lane - delta) : (int)lane;
    return tfemu_shuffle(mask, v, src, width, "__shfl_up_sync");
}

// ---- atomics: a thread is never interrupted between synchronization points,
// and launches run one at a time, so a read-modify-write is atomic ----------
template <typename T> static inline T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
template <typename T> static inline T atomicMax(T *p, T v) { T old = *p; if (v > old) *p = v; return old; }
template <typename T> static inline T atomicMin(T *p, T v) { T old = *p; if (v < old) *p = v; return old; }
template <typename T> static inline T atomicExch(T *p, T v) { T old = *p; *p = v; return old; }
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) { T old = *p; if (old == cmp) *p = v; return old; }

// ---- the launch ----------------------------------------------------------------------

// Every thread of one block, to the end; false (with the reason) when they
// deadlock or a thread failed.
static bool tfemu_run_block(unsigned nthreads, char *stacks, unsigned long stack_size, unsigned smem)
{
    memset(tf_smem, 0xff, smem);
    for (unsigned i = 0; i < nthreads; i++) {
        tfemu_thread *t = &tfemu_threads[i];
        t->linear = i;
        t->tid.x = i % tfemu_bdim.x;
        t->tid.y = i / tfemu_bdim.x % tfemu_bdim.y;
        t->tid.z = i / (tfemu_bdim.x * tfemu_bdim.y);
        t->lane = i % 32;
        t->warp = i / 32;
        t->state = TFEMU_RUN;
        t->where = "";
        t->sp = tfemu_new_stack(stacks + (unsigned long)i * stack_size, stack_size);
    }
    unsigned done = 0;
    for (;;) {
        for (unsigned i = 0; i < nthreads; i++) {
            tfemu_thread *t = &tfemu_threads[i];
            if (t->state != TFEMU_RUN) continue;
            tfemu_self = t;
            tfemu_swap(&tfemu_sched_sp, t->sp);
            if (tfemu_err[0]) return false;
            done += t->state == TFEMU_DONE;
        }
        if (done == nthreads) return true;
        bool released = false;
        // a warp point is passed when every live lane of the warp waits at one
        for (unsigned w = 0; w * 32 < nthreads; w++) {
            unsigned lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads, waiting = 0, live = 0;
            for (unsigned i = lo; i < hi; i++) {
                live += tfemu_threads[i].state != TFEMU_DONE;
                waiting += tfemu_threads[i].state == TFEMU_WARP_WAIT;
            }
            if (!waiting || waiting != live) continue;
            for (unsigned i = lo; i < hi; i++) {
                tfemu_thread *t = &tfemu_threads[i];
                if (t->state != TFEMU_WARP_WAIT) continue;
                for (unsigned l = 0; l < 32; l++)
                    if ((t->mask >> l & 1) && (lo + l >= nthreads || tfemu_threads[lo + l].state == TFEMU_DONE)) {
                        tfemu_self = t;
                        char what[160];
                        snprintf(what, sizeof what, "%s with mask 0x%08x waits for lane %u, which has exited or does not exist",
                                 t->where, t->mask, l);
                        tfemu_fail(what);
                        return false;
                    }
                t->state = TFEMU_RUN;
            }
            released = true;
        }
        if (released) continue;
        // the block barrier: every live thread waits at it
        unsigned at_bar = 0;
        for (unsigned i = 0; i < nthreads; i++) at_bar += tfemu_threads[i].state == TFEMU_BLOCK_WAIT;
        if (at_bar && at_bar == nthreads - done) {
            for (unsigned i = 0; i < nthreads; i++)
                if (tfemu_threads[i].state == TFEMU_BLOCK_WAIT) tfemu_threads[i].state = TFEMU_RUN;
            continue;
        }
        // nobody can go on
        for (unsigned i = 0; i < nthreads; i++)
            if (tfemu_threads[i].state != TFEMU_DONE) {
                tfemu_self = &tfemu_threads[i];
                break;
            }
        char what[200];
        snprintf(what, sizeof what, "deadlock: %u threads wait at __syncthreads and %u at warp points (%s), %u have exited: "
                 "a barrier in divergent code", at_bar, nthreads - done - at_bar, tfemu_self->where, done);
        tfemu_fail(what);
        return false;
    }
}

// The whole grid, block after block. stacks: nthreads stacks of stack_size
// bytes. 0, or -1 with the reason in err.
extern "C" __attribute__((visibility("default"))) int tfemu_launch(void (*entry)(void **), void **args, const unsigned grid[3],
                                                                    const unsigned block[3], unsigned smem, char *stacks,
                                                                    unsigned long stack_size, char *err, unsigned long errn)
{
    unsigned long n = (unsigned long)block[0] * block[1] * block[2];
    tfemu_err = err;
    tfemu_errn = errn;
    err[0] = 0;
    if (!n || n > TFEMU_MAX_THREADS || smem > TFEMU_SMEM_MAX) {
        snprintf(err, errn, "a block of %lu threads with %u bytes of shared memory is past the device's limits", n, smem);
        return -1;
    }
    tfemu_entry = entry;
    tfemu_args = args;
    tfemu_bdim = tfemu_dim3{block[0], block[1], block[2]};
    tfemu_gdim = tfemu_dim3{grid[0], grid[1], grid[2]};
    for (unsigned z = 0; z < grid[2]; z++)
        for (unsigned y = 0; y < grid[1]; y++)
            for (unsigned x = 0; x < grid[0]; x++) {
                tfemu_bidx = tfemu_dim3{x, y, z};
                if (!tfemu_run_block((unsigned)n, stacks, stack_size, smem)) return -1;
            }
    return 0;
}

// A kernel's parameters from cuLaunchKernel's array: args[i] points at the
// i-th parameter's value.
template <unsigned long... I> struct tfemu_seq {};
template <unsigned long N, unsigned long... I> struct tfemu_make : tfemu_make<N - 1, N - 1, I...> {};
template <unsigned long... I> struct tfemu_make<0, I...> { typedef tfemu_seq<I...> type; };
template <typename... P, unsigned long... I> static inline void tfemu_call_seq(void (*f)(P...), void **a, tfemu_seq<I...>)
{
    f(*(P *)a[I]...);
}
template <typename... P> static inline void tfemu_call(void (*f)(P...), void **a)
{
    tfemu_call_seq(f, a, typename tfemu_make<sizeof...(P)>::type());
}
#define TFEMU_ENTRY(name) \
    extern "C" __attribute__((visibility("default"))) void tfemu_entry_##name(void **a) { tfemu_call(name, a); }

// ---- the kernels follow, each in a namespace of its own ----------------------------
