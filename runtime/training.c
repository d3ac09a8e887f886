/* training.c — what a host program asks about training: the names of the
 * precision and checkpoint modes. */
#include <string.h>

#include "runtime.h"

static const char *const precision_names[] = {
    [TF_PRECISION_DEFAULT] = "default", [TF_PRECISION_FP32] = "fp32",
    [TF_PRECISION_FP16] = "fp16",       [TF_PRECISION_BF16] = "bf16",
};
static const char *const checkpoint_names[] = {[TF_CHECKPOINT_NONE] = "none", [TF_CHECKPOINT_AUTO] = "auto"};
enum { NPRECISIONS = sizeof precision_names / sizeof *precision_names, NCHECKPOINTS = 2 };

const char *tf_precision_name(tf_precision p)
{
    return (unsigned)p < NPRECISIONS ? precision_names[p] : "?";
}

tf_status tf_precision_parse(const char *name, tf_precision *out)
{
    for (int i = 0; name && out && i < NPRECISIONS; i++)
        if (!strcmp(name, precision_names[i])) {
            *out = (tf_precision)i;
            return TF_OK;
        }
    return TF_ERR_INVALID_ARG;
}

const char *tf_checkpoint_name(tf_checkpoint c)
{
    return (unsigned)c < NCHECKPOINTS ? checkpoint_names[c] : "?";
}

tf_status tf_checkpoint_parse(const char *name, tf_checkpoint *out)
{
    for (int i = 0; name && out && i < NCHECKPOINTS; i++)
        if (!strcmp(name, checkpoint_names[i])) {
            *out = (tf_checkpoint)i;
            return TF_OK;
        }
    return TF_ERR_INVALID_ARG;
}

bool tf_ir_precision_of(tf_precision p, bool *set, tf_ir_precision *out)
{
    *set = p != TF_PRECISION_DEFAULT;
    switch (p) {
    case TF_PRECISION_DEFAULT: return true;
    case TF_PRECISION_FP32: *out = TF_PREC_FP32; return true;
    case TF_PRECISION_FP16: *out = TF_PREC_FP16; return true;
    case TF_PRECISION_BF16: *out = TF_PREC_BF16; return true;
    }
    *set = false;
    return false;
}

tf_precision tf_precision_of_ir(tf_ir_precision p)
{
    return p == TF_PREC_FP16 ? TF_PRECISION_FP16 : p == TF_PREC_BF16 ? TF_PRECISION_BF16 : TF_PRECISION_FP32;
}
