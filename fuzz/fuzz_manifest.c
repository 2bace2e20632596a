/*
 * fuzz_manifest.c - libFuzzer driver for the manifest parser.
 *
 * Feeds arbitrary bytes to pjs_manifest_parse (label "fuzz") and frees the
 * result, so crashes, sanitizer reports and leaks on any accept or reject
 * path surface. An accepted manifest is also checked against the invariants
 * manifest.h promises (batched tensors hold -1 in dims[0], batch sizes are
 * strictly ascending, ranks in range); a broken one aborts. The seed corpus is
 * fuzz/corpus/fuzz_manifest/, replayed by fuzz_manifest_replay in `make test`.
 */
#include <stdint.h>
#include <stdlib.h>

#include "core/manifest.h"

static void check_tensors(const pjs_tensor_spec *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const pjs_tensor_spec *t = &v[i];
        if (t->name == NULL || t->name[0] == '\0' || t->dtype == PJS_DTYPE_INVALID ||
            t->shape.rank < 0 || t->shape.rank > PJS_MAX_RANK)
            abort();
        if (t->batched != (t->shape.rank > 0 && t->shape.dims[0] == -1))
            abort();
        for (int d = t->batched ? 1 : 0; d < t->shape.rank; d++)
            if (t->shape.dims[d] < 0)
                abort();
    }
}

static void check_manifest(const pjs_manifest *m)
{
    if (m->name == NULL || m->n_inputs == 0 || m->n_outputs == 0 || !(m->weight > 0))
        abort();
    check_tensors(m->inputs, m->n_inputs);
    check_tensors(m->outputs, m->n_outputs);
    if (m->kind == PJS_KIND_MODEL && (m->n_batch_sizes == 0 || m->n_calls != 0))
        abort();
    if (m->kind == PJS_KIND_META && m->n_batch_sizes != 0)
        abort();
    for (size_t i = 0; i < m->n_batch_sizes; i++)
        if (m->batch_sizes[i] < 1 || (i > 0 && m->batch_sizes[i] <= m->batch_sizes[i - 1]))
            abort();
    for (size_t i = 0; i < m->n_calls; i++)
        if (m->calls[i] == NULL)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pjs_manifest m;
    pjs_error err;
    if (pjs_manifest_parse(&m, (const char *)data, size, "fuzz", &err) == 0)
        check_manifest(&m);
    pjs_manifest_free(&m);
    return 0;
}
