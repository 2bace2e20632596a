/*
 * shape.c - overflow-checked shape arithmetic (see shape.h).
 */
#include "core/shape.h"

#include <stdio.h>

bool pjs_shape_numel(const pjs_shape *s, int64_t *out_numel)
{
    if (s->rank < 0 || s->rank > PJS_MAX_RANK)
        return false;
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++) {
        if (s->dims[i] < 0 || __builtin_mul_overflow(n, s->dims[i], &n))
            return false;
    }
    *out_numel = n;
    return true;
}

bool pjs_shape_nbytes(const pjs_shape *s, size_t elem_size, uint64_t *out_nbytes)
{
    int64_t n;
    int64_t bytes;
    if (!pjs_shape_numel(s, &n) || __builtin_mul_overflow(n, (int64_t)elem_size, &bytes))
        return false;
    *out_nbytes = (uint64_t)bytes;
    return true;
}

bool pjs_shape_equal(const pjs_shape *a, const pjs_shape *b)
{
    if (a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return false;
    return true;
}

char *pjs_shape_format(const pjs_shape *s, char *buf, size_t bufsize)
{
    size_t used = 0;
    int n = snprintf(buf, bufsize, "[");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < s->rank && used < bufsize; i++) {
        n = snprintf(buf + used, bufsize - used, "%s%lld", i ? ", " : "", (long long)s->dims[i]);
        used += n > 0 ? (size_t)n : 0;
    }
    if (used < bufsize)
        snprintf(buf + used, bufsize - used, "]");
    return buf;
}
