/*
 * cpu_threads.c - the XLA CPU plugin's thread count: parsing, XLA's own
 * default, the rule pjserve applies and the work estimate it applies it to
 * (see cpu_threads.h; the runtime applies the count in runtime.c).
 */
#include "runtime/cpu_threads.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpus.h"

int pjs_rt_cpu_threads_parse(const char *arg, int *out, pjs_error *err)
{
    if (strcmp(arg, "auto") == 0) {
        *out = 0;
        return 0;
    }
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno != 0 || end == arg || *end != '\0' || v < 1 || v > PJS_RT_CPU_THREADS_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--cpu-intra-op-threads %s: expected auto or a thread count "
                             "from 1 to %d",
                             arg, PJS_RT_CPU_THREADS_MAX);
    *out = (int)v;
    return 0;
}

/* A non-negative integer in the variable, as XLA reads it; -1 if unset or
 * not a number. */
static int env_count(const char *name)
{
    const char *s = getenv(name);
    if (s == NULL || s[0] == '\0')
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > PJS_RT_CPU_THREADS_MAX)
        return -1;
    return v < 0 ? 0 : (int)v;
}

int pjs_rt_cpu_threads_xla_default(void)
{
    int n = env_count("PJRT_NPROC");
    if (n < 0)
        n = env_count("NPROC");
    if (n < 0)
        n = pjs_cpus_schedulable();
    return n > 0 ? n : 1;
}

int pjs_rt_cpu_threads_auto(double flops)
{
    if (env_count("PJRT_NPROC") >= 0 || env_count("NPROC") >= 0)
        return pjs_rt_cpu_threads_xla_default();
    return flops < PJS_RT_CPU_PARALLEL_FLOPS ? 1 : pjs_rt_cpu_threads_xla_default();
}

/* Positions of an input's spatial extent: its extents but the batch axis and
 * the channel axis (the first for NCHW, else the last); 1 with fewer than two
 * extents per example. */
static double spatial_positions(const pjs_tensor_spec *s)
{
    int first = s->batched ? 1 : 0, last = s->shape.rank - 1;
    if (last - first + 1 < 2)
        return 1;
    if (s->format == PJS_FORMAT_NCHW)
        first++;
    else
        last--;
    double n = 1;
    for (int d = first; d <= last; d++)
        n *= s->shape.dims[d] > 0 ? (double)s->shape.dims[d] : 1;
    return n;
}

double pjs_rt_cpu_flops_estimate(const pjs_manifest *m, const pjs_safetensors *w)
{
    if (m->n_batch_sizes == 0 || w == NULL)
        return 0;
    double positions = 1;
    for (size_t v = 0; v < m->n_variants; v++)
        for (size_t i = 0; i < m->n_inputs; i++) {
            double p = spatial_positions(&m->variants[v].inputs[i]);
            if (p > positions)
                positions = p;
        }
    double macs = 0;
    for (size_t t = 0; t < w->n_tensors; t++) {
        const pjs_shape *s = &w->tensors[t].shape;
        double n = 1;
        for (int d = 0; d < s->rank; d++)
            n *= (double)s->dims[d];
        macs += s->rank >= 3 ? n * positions : n;
    }
    return 2 * macs * (double)m->batch_sizes[0];
}
