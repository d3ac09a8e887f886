/* convert.c — reading an element of a tensor view (the conversions are ir/core.c's tf_elem_load). */
#include <math.h>
#include <string.h>

#include "runtime.h"

double tf_view_element(const tf_tensor_view *v, int64_t i)
{
    if (!v || !v->data || v->rank < 0 || v->rank > 8 || i < 0 || (unsigned)v->dtype > TF_DTYPE_BOOL) return NAN;
    int64_t n = 1;
    for (int k = 0; k < v->rank; k++) n *= v->shape[k];
    return i < n ? tf_elem_load((tf_dt)v->dtype, v->data, i) : NAN;
}
