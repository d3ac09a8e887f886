/* emu_dnn.c — cuda-emu's cuDNN (see emu.h): so far what the backend loads. */
#include "emu.h"

static size_t dnn_version(void) { return 90000; }
static const char *dnn_error(tf_cudnn_status s) { return s ? "CUDNN_STATUS_NOT_SUPPORTED (cuda-emu)" : "CUDNN_STATUS_SUCCESS"; }
static int g_dnn_token;
static tf_cudnn_status dnn_create(tf_cudnn_handle *h) { *h = (tf_cudnn_handle)&g_dnn_token; return 0; }
static tf_cudnn_status dnn_destroy(tf_cudnn_handle h) { (void)h; return 0; }
static tf_cudnn_status dnn_set_stream(tf_cudnn_handle h, tf_cu_stream s) { (void)h, (void)s; return 0; }

void tf_cuda_emu_dnn_fill(tf_cudnn_api *api)
{
    *api = (tf_cudnn_api){dnn_version, dnn_error, dnn_create, dnn_destroy, dnn_set_stream};
}
