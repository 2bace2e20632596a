/*
 * fuzz_manifest.c - libFuzzer driver for the manifest parser.
 *
 * Feeds arbitrary bytes to pjs_manifest_parse (label "fuzz") and frees the
 * result, so crashes, sanitizer reports and leaks on any accept or reject
 * path surface. An accepted manifest is also checked against the invariants
 * manifest.h promises (batched tensors hold -1 in dims[0], batch sizes are
 * strictly ascending, ranks in range; bytes and extents of -1 only in client
 * tensors, which a meta always has; variant 0 is the top level, every
 * variant has its names, dtypes, ranks and batch axes, and no two have the
 * same input shapes; an ensemble's steps in an order where each reads only
 * what is written before it, every tensor written once); a broken one
 * aborts. The seed corpus is
 * fuzz/corpus/fuzz_manifest/, replayed by fuzz_manifest_replay in `make test`.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/manifest.h"

/* `client`: client_inputs / client_outputs, which may hold bytes and -1. */
static void check_tensor_list(const pjs_tensor_spec *v, size_t n, bool client)
{
    for (size_t i = 0; i < n; i++) {
        const pjs_tensor_spec *t = &v[i];
        if (t->name == NULL || t->name[0] == '\0' || t->dtype == PJS_DTYPE_INVALID ||
            t->shape.rank < 0 || t->shape.rank > PJS_MAX_RANK)
            abort();
        if (t->dtype == PJS_DTYPE_BYTES && !client)
            abort();
        if (t->batched && t->shape.dims[0] != -1)
            abort();
        for (int d = t->batched ? 1 : 0; d < t->shape.rank; d++)
            if (t->shape.dims[d] < (client ? -1 : 0))
                abort();
    }
}

static void check_tensors(const pjs_tensor_spec *v, size_t n)
{
    check_tensor_list(v, n, false);
}

/* Variant tensors keep everything of the top-level ones but extents. */
static void check_like(const pjs_tensor_spec *v, const pjs_tensor_spec *top, size_t n)
{
    check_tensors(v, n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].name, top[i].name) != 0 || v[i].dtype != top[i].dtype ||
            v[i].batched != top[i].batched || v[i].shape.rank != top[i].shape.rank)
            abort();
}

static void check_variants(const pjs_manifest *m)
{
    if (m->kind != PJS_KIND_MODEL) {
        if (m->n_variants != 0 || m->variants != NULL)
            abort();
        return;
    }
    if (m->n_variants < 1 || m->n_variants > 1 + PJS_MANIFEST_MAX_VARIANTS ||
        strcmp(m->variants[0].name, "default") != 0 || m->variants[0].inputs != m->inputs ||
        m->variants[0].outputs != m->outputs)
        abort();
    for (size_t v = 1; v < m->n_variants; v++) {
        check_like(m->variants[v].inputs, m->inputs, m->n_inputs);
        check_like(m->variants[v].outputs, m->outputs, m->n_outputs);
        for (size_t u = 0; u < v; u++) {
            size_t same = 0;
            while (same < m->n_inputs &&
                   pjs_shape_equal(&m->variants[u].inputs[same].shape,
                                   &m->variants[v].inputs[same].shape))
                same++;
            if (same == m->n_inputs || strcmp(m->variants[u].name, m->variants[v].name) == 0)
                abort();
        }
    }
}

/* Whether ensemble tensor `name` is a client input or written by one of
 * the steps order[0..k). */
static bool written_before(const pjs_manifest *m, size_t k, const char *name)
{
    for (size_t i = 0; i < m->n_client_inputs; i++)
        if (strcmp(m->client_inputs[i].name, name) == 0)
            return true;
    for (size_t j = 0; j < k; j++) {
        const pjs_ensemble_step *s = &m->steps[m->step_order[j]];
        for (size_t e = 0; e < s->n_outputs; e++)
            if (strcmp(s->outputs[e].ensemble_tensor, name) == 0)
                return true;
    }
    return false;
}

/* An ensemble's steps: step_order a permutation in which every step reads
 * only client inputs and what earlier steps wrote, no tensor written twice
 * (nor a client input written), every client output written; calls lists
 * each step model once. Other kinds have no steps. */
static void check_ensemble(const pjs_manifest *m)
{
    if (m->kind != PJS_KIND_ENSEMBLE) {
        if (m->n_steps != 0 || m->steps != NULL || m->step_order != NULL)
            abort();
        return;
    }
    if (m->n_steps == 0 || m->n_steps > PJS_ENSEMBLE_MAX_STEPS || m->n_calls == 0 ||
        m->n_calls > m->n_steps)
        abort();
    bool seen[PJS_ENSEMBLE_MAX_STEPS] = {false};
    for (size_t k = 0; k < m->n_steps; k++) {
        size_t s = m->step_order[k];
        if (s >= m->n_steps || seen[s])
            abort();
        seen[s] = true;
        const pjs_ensemble_step *st = &m->steps[s];
        if (st->n_inputs == 0 || st->n_outputs == 0 || st->n_inputs > PJS_ENSEMBLE_MAX_MAP ||
            st->n_outputs > PJS_ENSEMBLE_MAX_MAP || (st->version < 1 && st->version != -1))
            abort();
        for (size_t e = 0; e < st->n_inputs; e++)
            if (!written_before(m, k, st->inputs[e].ensemble_tensor))
                abort();
        for (size_t e = 0; e < st->n_outputs; e++)
            if (written_before(m, k, st->outputs[e].ensemble_tensor))
                abort();
    }
    for (size_t i = 0; i < m->n_client_outputs; i++)
        if (!written_before(m, m->n_steps, m->client_outputs[i].name))
            abort();
}

static void check_manifest(const pjs_manifest *m)
{
    if (m->name == NULL || !(m->weight > 0))
        abort();
    if (m->kind == PJS_KIND_MODEL ? m->n_inputs == 0 || m->n_outputs == 0
                                  : m->n_inputs != 0 || m->n_outputs != 0 ||
                                        m->n_client_inputs == 0 || m->n_client_outputs == 0)
        abort();
    check_tensors(m->inputs, m->n_inputs);
    check_tensors(m->outputs, m->n_outputs);
    check_tensor_list(m->client_inputs, m->n_client_inputs, true);
    check_tensor_list(m->client_outputs, m->n_client_outputs, true);
    if (m->kind == PJS_KIND_MODEL && (m->n_batch_sizes == 0 || m->n_calls != 0))
        abort();
    if (m->kind != PJS_KIND_MODEL && m->n_batch_sizes != 0)
        abort();
    for (size_t i = 0; i < m->n_batch_sizes; i++)
        if (m->batch_sizes[i] < 1 || (i > 0 && m->batch_sizes[i] <= m->batch_sizes[i - 1]))
            abort();
    for (size_t i = 0; i < m->n_calls; i++)
        if (m->calls[i] == NULL)
            abort();
    check_variants(m);
    check_ensemble(m);
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
