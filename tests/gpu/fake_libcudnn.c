/* fake_libcudnn.c — a stand-in for libcudnn.so.9 beside fake_libcuda.c,
 * for test_gpu --fake: cuDNN's convolution API as runtime/cuda/emu_dnn.c
 * computes it on the host. The fake driver's device memory is host memory,
 * so the cuda target's own convolution path (plans, the algorithm cache,
 * Find on the session's buffers, the workspace, the runs) executes and its
 * results can be compared with the interpreter's.
 *
 * Work runs at once (the fake driver's streams do everything at once):
 * tf_cuda_emu_submit here is that, not runtime/cuda/emu.c's. Counters for
 * the test: Find calls, convolution calls, and handles and descriptors still
 * alive. Built with no SONAME, like the fake driver. */
#include <stddef.h>

#include "emu.h"

static tf_cudnn_api g_api;
static int g_finds, g_convs, g_live;

__attribute__((constructor)) static void fake_cudnn_init(void) { tf_cuda_emu_dnn_fill(&g_api); }

int tf_cuda_emu_submit(tf_cu_stream s, tf_cuda_emu_work fn, const void *arg, size_t arg_bytes)
{
    (void)s;
    (void)arg_bytes;
    return fn((void *)arg);
}

/* the test's view */
int fake_cudnn_finds(void) { return g_finds; }
int fake_cudnn_convs(void) { return g_convs; }
int fake_cudnn_live(void) { return g_live; }

static tf_cudnn_status made(tf_cudnn_status r) { g_live += r == 0; return r; }
static tf_cudnn_status gone(tf_cudnn_status r, const void *p) { g_live -= r == 0 && p; return r; }

size_t cudnnGetVersion(void) { return g_api.GetVersion(); }
const char *cudnnGetErrorString(tf_cudnn_status s) { return g_api.GetErrorString(s); }
tf_cudnn_status cudnnCreate(tf_cudnn_handle *h) { return made(g_api.Create(h)); }
tf_cudnn_status cudnnDestroy(tf_cudnn_handle h) { return gone(g_api.Destroy(h), h); }
tf_cudnn_status cudnnSetStream(tf_cudnn_handle h, tf_cu_stream s) { return g_api.SetStream(h, s); }
tf_cudnn_status cudnnCreateTensorDescriptor(tf_cudnn_tensor *d) { return made(g_api.CreateTensorDescriptor(d)); }
tf_cudnn_status cudnnSetTensor4dDescriptor(tf_cudnn_tensor d, int f, int t, int n, int c, int h, int w)
{
    return g_api.SetTensor4dDescriptor(d, f, t, n, c, h, w);
}
tf_cudnn_status cudnnSetTensor4dDescriptorEx(tf_cudnn_tensor d, int t, int n, int c, int h, int w, int ns, int cs, int hs, int ws)
{
    return g_api.SetTensor4dDescriptorEx(d, t, n, c, h, w, ns, cs, hs, ws);
}
tf_cudnn_status cudnnDestroyTensorDescriptor(tf_cudnn_tensor d) { return gone(g_api.DestroyTensorDescriptor(d), d); }
tf_cudnn_status cudnnCreateFilterDescriptor(tf_cudnn_filter *d) { return made(g_api.CreateFilterDescriptor(d)); }
tf_cudnn_status cudnnSetFilter4dDescriptor(tf_cudnn_filter d, int t, int f, int k, int c, int h, int w)
{
    return g_api.SetFilter4dDescriptor(d, t, f, k, c, h, w);
}
tf_cudnn_status cudnnDestroyFilterDescriptor(tf_cudnn_filter d) { return gone(g_api.DestroyFilterDescriptor(d), d); }
tf_cudnn_status cudnnCreateConvolutionDescriptor(tf_cudnn_conv *d) { return made(g_api.CreateConvolutionDescriptor(d)); }
tf_cudnn_status cudnnSetConvolution2dDescriptor(tf_cudnn_conv d, int ph, int pw, int sh, int sw, int dh, int dw, int mode, int ct)
{
    return g_api.SetConvolution2dDescriptor(d, ph, pw, sh, sw, dh, dw, mode, ct);
}
tf_cudnn_status cudnnSetConvolutionMathType(tf_cudnn_conv d, int m) { return g_api.SetConvolutionMathType(d, m); }
tf_cudnn_status cudnnSetConvolutionGroupCount(tf_cudnn_conv d, int g) { return g_api.SetConvolutionGroupCount(d, g); }
tf_cudnn_status cudnnDestroyConvolutionDescriptor(tf_cudnn_conv d) { return gone(g_api.DestroyConvolutionDescriptor(d), d); }

tf_cudnn_status cudnnFindConvolutionForwardAlgorithmEx(tf_cudnn_handle h, tf_cudnn_tensor xd, const void *x, tf_cudnn_filter wd,
                                                       const void *w, tf_cudnn_conv cd, tf_cudnn_tensor yd, void *y, int req, int *got,
                                                       tf_cudnn_algo_perf *perf, void *ws, size_t wsb)
{
    g_finds++;
    return g_api.FindConvolutionForwardAlgorithmEx(h, xd, x, wd, w, cd, yd, y, req, got, perf, ws, wsb);
}
tf_cudnn_status cudnnFindConvolutionBackwardDataAlgorithmEx(tf_cudnn_handle h, tf_cudnn_filter wd, const void *w, tf_cudnn_tensor dyd,
                                                            const void *dy, tf_cudnn_conv cd, tf_cudnn_tensor dxd, void *dx, int req,
                                                            int *got, tf_cudnn_algo_perf *perf, void *ws, size_t wsb)
{
    g_finds++;
    return g_api.FindConvolutionBackwardDataAlgorithmEx(h, wd, w, dyd, dy, cd, dxd, dx, req, got, perf, ws, wsb);
}
tf_cudnn_status cudnnFindConvolutionBackwardFilterAlgorithmEx(tf_cudnn_handle h, tf_cudnn_tensor xd, const void *x, tf_cudnn_tensor dyd,
                                                              const void *dy, tf_cudnn_conv cd, tf_cudnn_filter dwd, void *dw, int req,
                                                              int *got, tf_cudnn_algo_perf *perf, void *ws, size_t wsb)
{
    g_finds++;
    return g_api.FindConvolutionBackwardFilterAlgorithmEx(h, xd, x, dyd, dy, cd, dwd, dw, req, got, perf, ws, wsb);
}
tf_cudnn_status cudnnGetConvolutionForwardWorkspaceSize(tf_cudnn_handle h, tf_cudnn_tensor xd, tf_cudnn_filter wd, tf_cudnn_conv cd,
                                                        tf_cudnn_tensor yd, int algo, size_t *bytes)
{
    return g_api.GetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo, bytes);
}
tf_cudnn_status cudnnGetConvolutionBackwardDataWorkspaceSize(tf_cudnn_handle h, tf_cudnn_filter wd, tf_cudnn_tensor dyd, tf_cudnn_conv cd,
                                                             tf_cudnn_tensor dxd, int algo, size_t *bytes)
{
    return g_api.GetConvolutionBackwardDataWorkspaceSize(h, wd, dyd, cd, dxd, algo, bytes);
}
tf_cudnn_status cudnnGetConvolutionBackwardFilterWorkspaceSize(tf_cudnn_handle h, tf_cudnn_tensor xd, tf_cudnn_tensor dyd, tf_cudnn_conv cd,
                                                               tf_cudnn_filter dwd, int algo, size_t *bytes)
{
    return g_api.GetConvolutionBackwardFilterWorkspaceSize(h, xd, dyd, cd, dwd, algo, bytes);
}
tf_cudnn_status cudnnConvolutionForward(tf_cudnn_handle h, const void *alpha, tf_cudnn_tensor xd, const void *x, tf_cudnn_filter wd,
                                        const void *w, tf_cudnn_conv cd, int algo, void *ws, size_t wsb, const void *beta, tf_cudnn_tensor yd,
                                        void *y)
{
    g_convs++;
    return g_api.ConvolutionForward(h, alpha, xd, x, wd, w, cd, algo, ws, wsb, beta, yd, y);
}
tf_cudnn_status cudnnConvolutionBackwardData(tf_cudnn_handle h, const void *alpha, tf_cudnn_filter wd, const void *w, tf_cudnn_tensor dyd,
                                             const void *dy, tf_cudnn_conv cd, int algo, void *ws, size_t wsb, const void *beta,
                                             tf_cudnn_tensor dxd, void *dx)
{
    g_convs++;
    return g_api.ConvolutionBackwardData(h, alpha, wd, w, dyd, dy, cd, algo, ws, wsb, beta, dxd, dx);
}
tf_cudnn_status cudnnConvolutionBackwardFilter(tf_cudnn_handle h, const void *alpha, tf_cudnn_tensor xd, const void *x,
                                               tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd, int algo, void *ws, size_t wsb,
                                               const void *beta, tf_cudnn_filter dwd, void *dw)
{
    g_convs++;
    return g_api.ConvolutionBackwardFilter(h, alpha, xd, x, dyd, dy, cd, algo, ws, wsb, beta, dwd, dw);
}
