/*
 * model.c - a bundle compiled, its weights on the device, reference counted.
 */
#include "registry/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "sched/coalesce.h"
#include "sched/sequence_table.h"

static void model_free(pjs_model *m)
{
    if (m->weights != NULL) {
        pjs_model_free_weights(m);
        free(m->weights);
    }
    pjs_model_set_host_floor(m, false, NULL);
    pjs_bundle_close(m->bundle);
    pjs_model_stats_release(&m->stats);
    free(m->queues);
    pthread_mutex_destroy(&m->stats_lock);
    pjs_sequence_table_destroy(m->sequences);
    pthread_mutex_destroy(&m->sequences_lock);
    free(m);
}

int pjs_model_create(pjs_bundle *b, pjs_rt_client *c, pjs_exec_cache *cache, pjs_wstore *store,
                     bool floor_on_demand, pjs_model **out, pjs_error *err)
{
    const pjs_manifest *man = &b->manifest;
    if (man->n_inputs > PJS_INFER_MAX_TENSORS || man->n_outputs > PJS_INFER_MAX_TENSORS ||
        man->n_client_inputs > PJS_INFER_MAX_TENSORS ||
        man->n_client_outputs > PJS_INFER_MAX_TENSORS) {
        pjs_bundle_close(b);
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "bundle %s: pjserve serves models with at most %d inputs and %d "
                             "outputs",
                             man->name, PJS_INFER_MAX_TENSORS, PJS_INFER_MAX_TENSORS);
    }
    if (man->n_batch_sizes > PJS_MODEL_MAX_BATCH_SIZES) {
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
    m->weight_store = store;
    pthread_mutex_init(&m->stats_lock, NULL);
    pthread_mutex_init(&m->sequences_lock, NULL);
    atomic_init(&m->refs, 1);
    snprintf(m->name, sizeof m->name, "%s", man->name);
    if (man->stateful) {
        size_t state_bytes = 0;
        for (size_t j = 0; j < man->sequence.n_state; j++)
            state_bytes += pjs_tensor_spec_row_bytes(&man->inputs[man->sequence.state[j].input]);
        m->sequences = pjs_sequence_table_create(
            man->name, state_bytes, NULL, (uint64_t)man->sequence.idle_timeout_ms * 1000000u,
            (size_t)man->sequence.max_sequences, (size_t)man->sequence.max_sequences_per_client,
            (uint64_t)man->sequence.evict_after_idle_ms * 1000000u);
        if (m->sequences == NULL) {
            model_free(m);
            return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
        }
    }
    for (size_t v = 0; v < man->n_variants; v++) {
        for (size_t i = 0; i < man->n_batch_sizes; i++) {
            int rc = pjs_bundle_compile_module(b, pjs_bundle_module_at(b, v, i), c, cache, err);
            if (rc != 0) {
                model_free(m);
                return rc;
            }
        }
    }
    for (size_t i = 0; i < b->n_stage_modules; i++) {
        int rc = pjs_bundle_compile_module(b, &b->stage_modules[i], c, cache, err);
        if (rc != 0) {
            model_free(m);
            return rc;
        }
    }
    bool batched = false;
    for (size_t i = 0; i < man->n_inputs; i++)
        batched = batched || man->inputs[i].batched;
    m->max_batch_size = batched ? man->batch_sizes[man->n_batch_sizes - 1] : 0;
    m->n_served_sizes = man->n_batch_sizes;
    m->coalesce = pjs_model_coalesces(man, m->max_batch_size);
    m->weights = calloc(b->weights.n_tensors + 1, sizeof *m->weights);
    if (m->weights == NULL) {
        model_free(m);
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    }
    m->residency = man->residency;
    for (size_t i = 0; i < b->weights.n_tensors; i++)
        m->wentry.bytes += b->weights.tensors[i].nbytes;
    m->wentry.pinned = pjs_residency_device_pinned(m->residency);
    m->hentry.bytes = pjs_model_floor_bytes(m);
    atomic_init(&m->load_ns, 0);
    atomic_init(&m->host_load_ns, 0);
    /* with a host tier, only a pinned model's floor is made now */
    bool floor = pjs_residency_has_floor(m->residency) &&
                 (m->wentry.pinned || !floor_on_demand);
    int rc = pjs_model_set_host_floor(m, floor, err);
    if (rc == 0)
        rc = pjs_bundle_seal_weights(b, err);
    if (rc != 0) {
        model_free(m);
        return rc;
    }
    /* Read again only to make a floor (a host tier's, or after a residency
     * change): by path then, checked to be the file sealed. An unpinned
     * model, read at every upload, keeps its descriptor, so a bundle renamed
     * over it keeps serving its weights until it is reloaded. */
    if (m->residency != PJS_RESIDENCY_UNPINNED)
        pjs_safetensors_release_fd(&b->weights);
    *out = m;
    return 0;
}

/* Bytes a weight takes in a private floor: whole PJS_RT_BLOCK_ALIGN units,
 * so that each weight starts aligned for the plugin's copies, and for an
 * executable reading it within the floor's one device block. */
static size_t floor_stride(const pjs_st_tensor *t)
{
    return ((size_t)t->nbytes + PJS_RT_BLOCK_ALIGN - 1) / PJS_RT_BLOCK_ALIGN * PJS_RT_BLOCK_ALIGN;
}

/* Weights [first, end) of the floor as one block, as pjs_rt_block_upload_start
 * wants them: uploads[] and offsets[] within the block (from weight
 * `first`), and the block's place and size in the floor. */
static void floor_run(const pjs_model *m, size_t first, size_t end, pjs_rt_upload *uploads,
                      size_t *offsets, const char **data, size_t *size)
{
    const pjs_bundle *b = m->bundle;
    const char *base = (const char *)m->host_weights[first < end ? first : 0];
    for (size_t i = first; i < end; i++) {
        const pjs_st_tensor *t = &b->weights.tensors[i];
        uploads[i - first] = (pjs_rt_upload){.dtype = t->dtype, .shape = &t->shape};
        offsets[i - first] = (size_t)((const char *)m->host_weights[i] - base);
    }
    *data = base;
    *size = end > first ? offsets[end - 1 - first] + floor_stride(&b->weights.tensors[end - 1])
                        : 0;
}

/* Swap-in stage k's run of weights (floor_run). */
static void stage_block(const pjs_model *m, size_t k, pjs_rt_upload *uploads, size_t *offsets,
                        const char **data, size_t *size)
{
    const pjs_bundle *b = m->bundle;
    floor_run(m, b->stages[k].first, b->stages[k].end, uploads, offsets, data, size);
}

/* A private floor copied to the device as one block, the weights views of
 * it: on an H200 a ResNet-50's 161 copies took 4.4 ms where one copy of its
 * 51 MB takes 0.94 (docs/benchmarks.md). PJS_ERR_UNSUPPORTED, nothing
 * done, where there is no private floor, --weight-upload says each weight on
 * its own (pjs_rt_uploads_blocks), or the plugin cannot view. */
static int upload_floor_block(pjs_model *m, pjs_error *err)
{
    const pjs_bundle *b = m->bundle;
    size_t n = b->weights.n_tensors;
    if (m->host_weights == NULL || m->host_block.data == NULL || n == 0 ||
        !pjs_rt_uploads_blocks(m->client))
        return PJS_ERR_UNSUPPORTED;
    pjs_rt_upload *uploads = calloc(n, sizeof *uploads);
    size_t *offsets = calloc(n, sizeof *offsets);
    int rc = uploads != NULL && offsets != NULL
                 ? 0
                 : pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", m->name);
    if (rc == 0) {
        pjs_error why;
        const char *data;
        size_t size;
        floor_run(m, 0, n, uploads, offsets, &data, &size);
        rc = pjs_rt_block_from_host(m->client, data, size, n, uploads, offsets,
                                    &m->weight_block, m->weights, &why);
        if (rc == 0)
            pjs_log(PJS_LOG_DEBUG, "model %s: %zu weights copied to the device as one block of "
                                   "%zu bytes", m->name, n, size);
        else if (rc == PJS_ERR_UNSUPPORTED)
            pjs_log(PJS_LOG_DEBUG, "model %s: weights copied one by one (%s)", m->name, why.msg);
        else {
            *err = why;
            pjs_error_prefix(err, "model %s: ", m->name);
        }
    }
    free(uploads);
    free(offsets);
    return rc;
}

int pjs_model_load_weights(pjs_model *m, pjs_error *err)
{
    uint64_t t0 = pjs_now_ns();
    if (m->host_segment != NULL && pjs_wstore_segment_verify(m->host_segment, err) != 0) {
        char detail[PJS_ERROR_MSG_MAX];
        snprintf(detail, sizeof detail, "%s", err->msg);
        return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                             "model %s: weights refused: %s; reload the model "
                             "(RepositoryModelLoad, or POST /v2/repository/models/%s/load) to "
                             "make a fresh copy",
                             m->name, detail, m->name);
    }
    int rc = upload_floor_block(m, err);
    if (rc == PJS_ERR_UNSUPPORTED)
        rc = pjs_bundle_upload_weights(m->bundle, m->client, m->host_weights, m->weights, err);
    atomic_fetch_add(&m->load_ns, pjs_now_ns() - t0);
    return rc;
}

int pjs_model_start_staged_load(pjs_model *m, pjs_error *err)
{
    const pjs_bundle *b = m->bundle;
    size_t n_stages = b->manifest.n_stages, n = b->weights.n_tensors;
    if (n_stages == 0 || m->host_weights == NULL || m->host_block.data == NULL || n == 0 ||
        !pjs_rt_uploads_blocks(m->client))
        return PJS_ERR_UNSUPPORTED; /* a shared floor has no host_block */
    pjs_rt_upload *uploads = calloc(n, sizeof *uploads);
    size_t *offsets = calloc(n, sizeof *offsets);
    int rc = uploads != NULL && offsets != NULL
                 ? 0
                 : pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", m->name);
    m->staged_load_start = pjs_now_ns();
    m->staged_load_end = 0;
    m->staged_done = 0;
    size_t started = 0;
    for (; rc == 0 && started < n_stages; started++) {
        const char *data;
        size_t size;
        size_t count = b->stages[started].end - b->stages[started].first;
        stage_block(m, started, uploads, offsets, &data, &size);
        if (count == 0)
            continue; /* nothing first used here */
        rc = pjs_rt_block_upload_start(m->client, data, size, count, uploads, offsets,
                                       &m->stage_uploads[started], err);
    }
    free(uploads);
    free(offsets);
    if (rc != 0) {
        for (size_t k = 0; k < started; k++)
            pjs_rt_block_upload_cancel(m->client, &m->stage_uploads[k]);
        if (rc != PJS_ERR_UNSUPPORTED)
            pjs_error_prefix(err, "model %s: ", m->name);
        return rc;
    }
    m->staged_loading = true;
    pjs_log(PJS_LOG_DEBUG, "model %s: weights copied to the device as %zu stage blocks, each "
                           "stage run as its block arrives", m->name, n_stages);
    return 0;
}

int pjs_model_await_stage(pjs_model *m, size_t k, pjs_error *err)
{
    const pjs_bundle *b = m->bundle;
    if (!m->staged_loading)
        return 0;
    size_t n = b->weights.n_tensors;
    pjs_rt_upload *uploads = calloc(n + 1, sizeof *uploads);
    size_t *offsets = calloc(n + 1, sizeof *offsets);
    int rc = uploads != NULL && offsets != NULL
                 ? 0
                 : pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", m->name);
    for (; rc == 0 && m->staged_done <= k && m->staged_done < b->manifest.n_stages;
         m->staged_done++) {
        size_t s = m->staged_done, first = b->stages[s].first;
        size_t count = b->stages[s].end - first;
        const char *data;
        size_t size;
        if (count == 0)
            continue;
        stage_block(m, s, uploads, offsets, &data, &size);
        rc = pjs_rt_block_upload_finish(m->client, &m->stage_uploads[s], count, uploads, offsets,
                                        &m->stage_blocks[s], &m->weights[first], err);
        if (rc != 0)
            pjs_error_prefix(err, "model %s: copying swap-in stage %zu's weights: ", m->name, s);
    }
    free(uploads);
    free(offsets);
    if (rc == 0 && m->staged_done == b->manifest.n_stages && m->staged_load_end == 0)
        m->staged_load_end = pjs_now_ns();
    return rc;
}

int pjs_model_finish_staged_load(pjs_model *m, pjs_error *err)
{
    if (!m->staged_loading)
        return 0;
    int rc = pjs_model_await_stage(m, m->bundle->manifest.n_stages, err);
    if (rc != 0) {
        pjs_model_free_weights(m); /* cancels what is still in flight */
        return rc;
    }
    m->staged_loading = false;
    atomic_fetch_add(&m->load_ns, m->staged_load_end - m->staged_load_start);
    return 0;
}

void pjs_model_free_weights(pjs_model *m)
{
    if (m->staged_loading) {
        for (size_t k = m->staged_done; k < m->bundle->manifest.n_stages; k++)
            pjs_rt_block_upload_cancel(m->client, &m->stage_uploads[k]);
        m->staged_loading = false;
    }
    for (size_t i = 0; i < m->bundle->weights.n_tensors; i++) {
        if (m->weights[i] != NULL)
            pjs_rt_buffer_destroy(m->client, m->weights[i]);
        m->weights[i] = NULL;
    }
    if (m->weight_block != NULL)
        pjs_rt_buffer_destroy(m->client, m->weight_block);
    m->weight_block = NULL;
    for (size_t k = 0; k < PJS_MANIFEST_MAX_STAGES; k++) {
        if (m->stage_blocks[k] != NULL)
            pjs_rt_buffer_destroy(m->client, m->stage_blocks[k]);
        m->stage_blocks[k] = NULL;
    }
}

static int fill_from_bundle(void *bundle, size_t i, void *dst, pjs_error *err)
{
    return pjs_bundle_read_weight(bundle, i, dst, err);
}

/* The host floor in the node's shared store: the weights' checksums first
 * (sealing reads the file), which name the segment. UNAVAILABLE when the
 * store itself failed. */
static int shared_host_floor(pjs_model *m, void **host, pjs_error *err)
{
    pjs_bundle *b = m->bundle;
    size_t n = b->weights.n_tensors;
    int rc = pjs_bundle_seal_weights(b, err);
    pjs_wstore_tensor *t = rc == 0 ? calloc(n + 1, sizeof *t) : NULL;
    if (rc == 0 && t == NULL)
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", m->name);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const pjs_st_tensor *st = &b->weights.tensors[i];
        t[i] = (pjs_wstore_tensor){.name = st->name, .dtype = st->dtype, .shape = &st->shape,
                                   .nbytes = st->nbytes, .sum = b->weight_sums[i]};
    }
    if (rc == 0)
        rc = pjs_wstore_acquire(m->weight_store, m->name, t, n, fill_from_bundle, b,
                                &m->host_segment, err);
    free(t);
    for (size_t i = 0; rc == 0 && i < n; i++)
        host[i] = (void *)pjs_wstore_segment_weight(m->host_segment, i);
    return rc;
}

uint64_t pjs_model_floor_bytes(const pjs_model *m)
{
    const pjs_bundle *b = m->bundle;
    uint64_t total = 0;
    for (size_t i = 0; i < b->weights.n_tensors; i++)
        total += floor_stride(&b->weights.tensors[i]);
    return total;
}

/* The private host floor: one block from the runtime (page-locked where the
 * plugin DMA-maps host memory), the weights in argument order. */
static int private_host_floor(pjs_model *m, void **host, pjs_error *err)
{
    pjs_bundle *b = m->bundle;
    size_t n = b->weights.n_tensors;
    int rc = pjs_rt_host_alloc(m->client, (size_t)pjs_model_floor_bytes(m), &m->host_block, err);
    if (rc != 0)
        return pjs_error_prefix(err, "model %s: ", m->name);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        host[i] = (char *)m->host_block.data + at;
        at += floor_stride(&b->weights.tensors[i]);
    }
    rc = pjs_bundle_read_weights(b, host, pjs_bundle_read_threads(b), err);
    if (rc != 0)
        pjs_rt_host_free(m->client, &m->host_block);
    return rc;
}

int pjs_model_set_host_floor(pjs_model *m, bool present, pjs_error *err)
{
    size_t n = m->bundle->weights.n_tensors;
    if (present == (m->host_weights != NULL))
        return 0;
    if (!present) {
        pjs_rt_host_free(m->client, &m->host_block);
        free(m->host_weights);
        m->host_weights = NULL;
        pjs_wstore_release(m->weight_store, m->host_segment);
        m->host_segment = NULL;
        return 0;
    }
    void **host = calloc(n + 1, sizeof *host);
    if (host == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory for the host weights",
                             m->name);
    if (m->weight_store != NULL && n > 0) { /* a model without weights needs no segment */
        int rc = shared_host_floor(m, host, err);
        if (rc == 0) {
            m->host_weights = host;
            return 0;
        }
        if (rc != PJS_ERR_UNAVAILABLE) {
            free(host);
            return rc;
        }
        pjs_warn("model %s: host weights kept in private memory: %s", m->name, err->msg);
    }
    int rc = private_host_floor(m, host, err);
    if (rc != 0) {
        free(host);
        return rc;
    }
    m->host_weights = host;
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
    out->batch = NULL;
    out->n_batch = 0;
    if (m->stats.n_batch > 0) {
        out->batch = malloc(m->stats.n_batch * sizeof *out->batch);
        if (out->batch != NULL) {
            memcpy(out->batch, m->stats.batch, m->stats.n_batch * sizeof *out->batch);
            out->n_batch = m->stats.n_batch;
        }
    }
    pthread_mutex_unlock(&m->stats_lock);
}

void pjs_model_stats_release(pjs_model_stats *s)
{
    free(s->batch);
    s->batch = NULL;
    s->n_batch = 0;
}

pjs_batch_stat *pjs_model_stats_batch_entry(pjs_model_stats *s, int64_t rows)
{
    size_t i = 0;
    while (i < s->n_batch && s->batch[i].batch_size < rows)
        i++;
    if (i < s->n_batch && s->batch[i].batch_size == rows)
        return &s->batch[i];
    pjs_batch_stat *grown = realloc(s->batch, (s->n_batch + 1) * sizeof *grown);
    if (grown == NULL)
        return NULL;
    s->batch = grown;
    memmove(&s->batch[i + 1], &s->batch[i], (s->n_batch - i) * sizeof *s->batch);
    s->n_batch++;
    memset(&s->batch[i], 0, sizeof s->batch[i]);
    s->batch[i].batch_size = rows;
    return &s->batch[i];
}

/* ---- queue-wait histogram ------------------------------------------------- */

/* Four buckets per octave: bucket i >= 1 ends at 2^(i/4) us. */
double pjs_queue_wait_bucket_upper_us(size_t i)
{
    if (i + 1 >= PJS_QUEUE_WAIT_BUCKETS)
        return INFINITY;
    return exp2((double)i / 4.0);
}

size_t pjs_queue_wait_bucket(uint64_t ns)
{
    double us = (double)ns / 1e3;
    if (us < 1.0)
        return 0;
    size_t i = (size_t)floor(log2(us) * 4.0) + 1;
    return i < PJS_QUEUE_WAIT_BUCKETS ? i : PJS_QUEUE_WAIT_BUCKETS - 1;
}

double pjs_queue_wait_quantile_us(const uint64_t hist[PJS_QUEUE_WAIT_BUCKETS], double q)
{
    uint64_t total = 0;
    for (size_t i = 0; i < PJS_QUEUE_WAIT_BUCKETS; i++)
        total += hist[i];
    if (total == 0)
        return 0;
    double rank = ceil(q * (double)total);
    uint64_t seen = 0;
    for (size_t i = 0; i < PJS_QUEUE_WAIT_BUCKETS; i++) {
        seen += hist[i];
        if ((double)seen >= rank)
            return pjs_queue_wait_bucket_upper_us(i);
    }
    return pjs_queue_wait_bucket_upper_us(PJS_QUEUE_WAIT_BUCKETS - 1);
}
