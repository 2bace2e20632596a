/*
 * model.c - a bundle compiled, its weights on the device, reference counted.
 */
#include "registry/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

static void model_free(pjs_model *m)
{
    if (m->weights != NULL) {
        for (size_t i = 0; i < m->bundle->weights.n_tensors; i++)
            pjs_rt_buffer_destroy(m->client, m->weights[i]);
        free(m->weights);
    }
    pjs_bundle_close(m->bundle);
    pthread_mutex_destroy(&m->stats_lock);
    free(m);
}

int pjs_model_create(pjs_bundle *b, pjs_rt_client *c, pjs_exec_cache *cache, pjs_model **out,
                     pjs_error *err)
{
    const pjs_manifest *man = &b->manifest;
    if (man->n_inputs > PJS_INFER_MAX_TENSORS || man->n_outputs > PJS_INFER_MAX_TENSORS) {
        pjs_bundle_close(b);
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "bundle %s: pjserve serves models with at most %d inputs and %d "
                             "outputs",
                             man->name, PJS_INFER_MAX_TENSORS, PJS_INFER_MAX_TENSORS);
    }
    if (b->n_modules > PJS_MODEL_MAX_BATCH_SIZES) {
        pjs_bundle_close(b);
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "bundle %s: pjserve serves models with at most %d batch sizes",
                             man->name, PJS_MODEL_MAX_BATCH_SIZES);
    }
    pjs_model *m = calloc(1, sizeof *m);
    if (m == NULL) {
        pjs_bundle_close(b);
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    }
    m->bundle = b;
    m->client = c;
    pthread_mutex_init(&m->stats_lock, NULL);
    atomic_init(&m->refs, 1);
    snprintf(m->name, sizeof m->name, "%s", man->name);
    for (size_t i = 0; i < b->n_modules; i++) {
        int rc = pjs_bundle_compile_module(b, &b->modules[i], c, cache, err);
        if (rc != 0) {
            model_free(m);
            return rc;
        }
        m->stats.batch[i].batch_size = b->modules[i].batch_size;
    }
    m->stats.n_batch = b->n_modules;
    bool batched = false;
    for (size_t i = 0; i < man->n_inputs; i++)
        batched = batched || man->inputs[i].batched;
    m->max_batch_size = batched ? b->modules[b->n_modules - 1].batch_size : 0;
    m->weights = calloc(b->weights.n_tensors + 1, sizeof *m->weights);
    if (m->weights == NULL) {
        model_free(m);
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    }
    int rc = pjs_bundle_upload_weights(b, c, m->weights, err);
    if (rc != 0) {
        free(m->weights);
        m->weights = NULL;
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

pjs_model *pjs_model_ref(pjs_model *m)
{
    atomic_fetch_add(&m->refs, 1);
    return m;
}

void pjs_model_unref(pjs_model *m)
{
    if (m != NULL && atomic_fetch_sub(&m->refs, 1) == 1)
        model_free(m);
}

void pjs_model_stats_snapshot(pjs_model *m, pjs_model_stats *out)
{
    pthread_mutex_lock(&m->stats_lock);
    *out = m->stats;
    pthread_mutex_unlock(&m->stats_lock);
}
