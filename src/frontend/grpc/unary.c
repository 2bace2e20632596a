/*
 * unary.c - the unary RPCs of inference.GRPCInferenceService other than
 * ModelInfer, and the table of every method the front end serves (the
 * model control service's handlers are in control_rpc.c).
 *
 * Each handler reads its decoded request and builds its response in the
 * call's arena (call.c packs and sends it). Handlers that describe a model
 * leave the model's reference in ctx->model, because the response borrows
 * the manifest's strings until it is packed. Errors come from the server
 * (NOT_FOUND, UNAVAILABLE, ...) or from the handler, with a message that
 * names the model, region or setting at fault.
 */
#include "frontend/grpc/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "frontend/grpc/control_codec.h"
#include "frontend/grpc/model_info.h"
#include "grpc_service.pb-c.h"
#include "health.pb-c.h"
#include "pjserve_control.pb-c.h"
#include "server/load_config.h"

/* A zeroed message of type d with its defaults, in the arena; NULL when out
 * of memory. */
static void *new_message(pjs_grpc_unary_ctx *ctx, const ProtobufCMessageDescriptor *d)
{
    void *m = pjs_grpc_arena_alloc(ctx->arena, d->sizeof_message);
    if (m != NULL)
        protobuf_c_message_init(d, m);
    return m;
}

#define NEW(ctx, type, prefix) ((type *)new_message((ctx), &prefix##__descriptor))

static int no_memory(pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the response");
}

/* ---- health and metadata -------------------------------------------------------- */

static int server_live(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                       ProtobufCMessage **response, pjs_error *err)
{
    (void)request;
    Inference__ServerLiveResponse *r =
        NEW(ctx, Inference__ServerLiveResponse, inference__server_live_response);
    if (r == NULL)
        return no_memory(err);
    r->live = pjs_server_live(ctx->frontend->server);
    *response = &r->base;
    return 0;
}

static int server_ready(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                        ProtobufCMessage **response, pjs_error *err)
{
    (void)request;
    Inference__ServerReadyResponse *r =
        NEW(ctx, Inference__ServerReadyResponse, inference__server_ready_response);
    if (r == NULL)
        return no_memory(err);
    r->ready = pjs_server_ready(ctx->frontend->server);
    *response = &r->base;
    return 0;
}

/* Not ready (rather than an error) for a model that is unknown or not
 * loaded, as Triton answers. */
static int model_ready(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                       ProtobufCMessage **response, pjs_error *err)
{
    const Inference__ModelReadyRequest *req = (const Inference__ModelReadyRequest *)request;
    Inference__ModelReadyResponse *r =
        NEW(ctx, Inference__ModelReadyResponse, inference__model_ready_response);
    if (r == NULL)
        return no_memory(err);
    pjs_model *m;
    pjs_error ignored;
    r->ready =
        pjs_server_get_model(ctx->frontend->server, req->name, req->version, &m, &ignored) == 0;
    if (r->ready)
        pjs_model_unref(m);
    *response = &r->base;
    return 0;
}

/* One extension list for both protocols, as Triton reports it (so
 * binary_tensor_data, an HTTP feature, is listed here too). Only extensions
 * served in full; system_shared_memory is listed even when registration is
 * off, as Triton does: registering then says why it is refused. */
static int server_metadata(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                           ProtobufCMessage **response, pjs_error *err)
{
    (void)request;
    static char *extensions[] = {"classification",       "binary_tensor_data",
                                 "model_repository",     "model_configuration",
                                 "system_shared_memory", "cuda_shared_memory",
                                 "statistics",           "trace",
                                 "logging"};
    Inference__ServerMetadataResponse *r =
        NEW(ctx, Inference__ServerMetadataResponse, inference__server_metadata_response);
    if (r == NULL)
        return no_memory(err);
    r->name = (char *)pjs_server_name(ctx->frontend->server);
    r->version = (char *)pjs_server_version();
    r->extensions = extensions;
    r->n_extensions = sizeof extensions / sizeof extensions[0];
    *response = &r->base;
    return 0;
}

/* Looks the model up and leaves the reference in ctx for the response. */
static int hold_model(pjs_grpc_unary_ctx *ctx, const char *name, const char *version,
                      pjs_grpc_model_desc *out, pjs_error *err)
{
    int rc = pjs_server_get_model(ctx->frontend->server, name, version, &ctx->model, err);
    if (rc != 0)
        return rc;
    out->name = ctx->model->name;
    out->version = PJS_MODEL_VERSION;
    out->platform = pjs_server_platform(ctx->frontend->server);
    out->max_batch_size = ctx->model->max_batch_size;
    out->manifest = pjs_model_manifest(ctx->model);
    out->batching_off = !ctx->model->coalesce;
    return 0;
}

static int model_metadata(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                          ProtobufCMessage **response, pjs_error *err)
{
    const Inference__ModelMetadataRequest *req = (const Inference__ModelMetadataRequest *)request;
    pjs_grpc_model_desc desc;
    Inference__ModelMetadataResponse *r;
    int rc = hold_model(ctx, req->name, req->version, &desc, err);
    if (rc == 0)
        rc = pjs_grpc_model_metadata(&desc, ctx->arena, &r, err);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

static int model_config(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                        ProtobufCMessage **response, pjs_error *err)
{
    const Inference__ModelConfigRequest *req = (const Inference__ModelConfigRequest *)request;
    pjs_grpc_model_desc desc;
    Inference__ModelConfigResponse *r =
        NEW(ctx, Inference__ModelConfigResponse, inference__model_config_response);
    if (r == NULL)
        return no_memory(err);
    int rc = hold_model(ctx, req->name, req->version, &desc, err);
    if (rc == 0)
        rc = pjs_grpc_model_config(&desc, ctx->arena, &r->config, err);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

/* ---- statistics --------------------------------------------------------------- */

static Inference__StatisticDuration *duration(pjs_grpc_unary_ctx *ctx, pjs_duration_stat d)
{
    Inference__StatisticDuration *s =
        NEW(ctx, Inference__StatisticDuration, inference__statistic_duration);
    if (s != NULL) {
        s->count = d.count;
        s->ns = d.ns;
    }
    return s;
}

/* Every field set, so clients that read any of them find it (the cache
 * counters stay zero: pjserve has no response cache). */
static Inference__InferStatistics *infer_statistics(pjs_grpc_unary_ctx *ctx,
                                                    const pjs_model_stats *st)
{
    const pjs_duration_stat zero = {0, 0};
    Inference__InferStatistics *s =
        NEW(ctx, Inference__InferStatistics, inference__infer_statistics);
    if (s == NULL)
        return NULL;
    s->success = duration(ctx, st->success);
    s->fail = duration(ctx, st->fail);
    s->queue = duration(ctx, st->queue);
    s->compute_input = duration(ctx, st->compute_input);
    s->compute_infer = duration(ctx, st->compute_infer);
    s->compute_output = duration(ctx, st->compute_output);
    s->cache_hit = duration(ctx, zero);
    s->cache_miss = duration(ctx, zero);
    bool ok = s->success && s->fail && s->queue && s->compute_input && s->compute_infer &&
              s->compute_output && s->cache_hit && s->cache_miss;
    return ok ? s : NULL;
}

static Inference__InferBatchStatistics *batch_statistics(pjs_grpc_unary_ctx *ctx,
                                                         const pjs_batch_stat *b)
{
    Inference__InferBatchStatistics *s =
        NEW(ctx, Inference__InferBatchStatistics, inference__infer_batch_statistics);
    if (s == NULL)
        return NULL;
    s->batch_size = (uint64_t)b->batch_size;
    s->compute_input = duration(ctx, b->compute_input);
    s->compute_infer = duration(ctx, b->compute_infer);
    s->compute_output = duration(ctx, b->compute_output);
    return s->compute_input && s->compute_infer && s->compute_output ? s : NULL;
}

/* The statistics of one model; batch_stats has one entry per row count
 * that ran (rows served by one execution), as the HTTP document has. */
static Inference__ModelStatistics *model_statistics(pjs_grpc_unary_ctx *ctx, pjs_model *m)
{
    pjs_model_stats st;
    pjs_model_stats_snapshot(m, &st);
    Inference__ModelStatistics *s =
        NEW(ctx, Inference__ModelStatistics, inference__model_statistics);
    bool ok = s != NULL && (s->name = pjs_grpc_arena_strdup(ctx->arena, m->name)) != NULL;
    if (ok) {
        s->version = PJS_MODEL_VERSION;
        s->last_inference = st.last_inference_ms;
        s->inference_count = st.inference_count;
        s->execution_count = st.execution_count;
        s->inference_stats = infer_statistics(ctx, &st);
        s->batch_stats =
            pjs_grpc_arena_alloc(ctx->arena, (st.n_batch + 1) * sizeof *s->batch_stats);
        ok = s->inference_stats != NULL && s->batch_stats != NULL;
    }
    for (size_t i = 0; ok && i < st.n_batch; i++) {
        if (st.batch[i].compute_infer.count == 0)
            continue;
        ok = (s->batch_stats[s->n_batch_stats++] = batch_statistics(ctx, &st.batch[i])) != NULL;
    }
    pjs_model_stats_release(&st);
    return ok ? s : NULL;
}

/* Collects the statistics of every loaded model (pjs_server_foreach_model). */
typedef struct stats_list {
    pjs_grpc_unary_ctx *ctx;
    Inference__ModelStatistics **items;
    size_t n, cap;
    bool failed;
} stats_list;

static void collect_statistics(pjs_model *m, void *arg)
{
    stats_list *l = arg;
    if (l->failed)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        Inference__ModelStatistics **grown =
            pjs_grpc_arena_alloc(l->ctx->arena, cap * sizeof *grown);
        if (grown == NULL) {
            l->failed = true;
            return;
        }
        if (l->n > 0)
            memcpy(grown, l->items, l->n * sizeof *grown);
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n] = model_statistics(l->ctx, m);
    l->failed = l->items[l->n++] == NULL;
}

/* One model, or every loaded model when the name is empty. */
static int model_statistics_rpc(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                                ProtobufCMessage **response, pjs_error *err)
{
    const Inference__ModelStatisticsRequest *req =
        (const Inference__ModelStatisticsRequest *)request;
    Inference__ModelStatisticsResponse *r =
        NEW(ctx, Inference__ModelStatisticsResponse, inference__model_statistics_response);
    if (r == NULL)
        return no_memory(err);
    stats_list list = {.ctx = ctx};
    if (req->name[0] == '\0') {
        pjs_server_foreach_public_model(ctx->frontend->server, collect_statistics, &list);
    } else {
        int rc =
            pjs_server_get_model(ctx->frontend->server, req->name, req->version, &ctx->model, err);
        if (rc != 0)
            return rc;
        collect_statistics(ctx->model, &list);
    }
    if (list.failed)
        return no_memory(err);
    r->model_stats = list.items;
    r->n_model_stats = list.n;
    *response = &r->base;
    return 0;
}

/* ---- repository ----------------------------------------------------------------- */

/* The first size of the entry buffer; grown once if the repository is larger. */
#define REPOSITORY_FIRST_CAP 64

static int repository_index(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                            ProtobufCMessage **response, pjs_error *err)
{
    const Inference__RepositoryIndexRequest *req =
        (const Inference__RepositoryIndexRequest *)request;
    pjs_server *s = ctx->frontend->server;
    size_t cap = REPOSITORY_FIRST_CAP;
    pjs_repository_entry *entries = pjs_grpc_arena_alloc(ctx->arena, cap * sizeof *entries);
    size_t n = entries != NULL ? pjs_server_repository_index(s, req->ready, entries, cap) : 0;
    if (entries != NULL && n > cap) {
        cap = n;
        entries = pjs_grpc_arena_alloc(ctx->arena, cap * sizeof *entries);
        n = entries != NULL ? pjs_server_repository_index(s, req->ready, entries, cap) : 0;
        n = n < cap ? n : cap;
    }
    Inference__RepositoryIndexResponse *r =
        NEW(ctx, Inference__RepositoryIndexResponse, inference__repository_index_response);
    Inference__RepositoryIndexResponse__ModelIndex **models =
        pjs_grpc_arena_alloc(ctx->arena, n * sizeof *models);
    if (entries == NULL || r == NULL || models == NULL)
        return no_memory(err);
    for (size_t i = 0; i < n; i++) {
        Inference__RepositoryIndexResponse__ModelIndex *m =
            NEW(ctx, Inference__RepositoryIndexResponse__ModelIndex,
                inference__repository_index_response__model_index);
        if (m == NULL)
            return no_memory(err);
        m->name = entries[i].name;
        m->version = PJS_MODEL_VERSION;
        m->state = (char *)pjs_model_state_name(entries[i].state);
        m->reason = entries[i].reason;
        models[i] = m;
    }
    r->models = models;
    r->n_models = n;
    *response = &r->base;
    return 0;
}

/* The load thread's answer to a RepositoryModelLoad call. */
static void repository_load_done(void *arg, const pjs_error *err)
{
    static const Inference__RepositoryModelLoadResponse loaded =
        INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
    pjs__grpc_unary_answer(arg, &loaded.base, err->code != 0 ? err : NULL);
}

/* Queues the load and answers when it finished (the call is deferred: no
 * completion-queue thread waits for a compile); a refused queue answers at
 * once. A "config" parameter (a string: ModelConfig as JSON) overrides the
 * bundle's settings for this load (server/load_config.h); "file:"
 * parameters are refused. */
static int repository_load(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                           ProtobufCMessage **response, pjs_error *err)
{
    (void)response;
    const Inference__RepositoryModelLoadRequest *req =
        (const Inference__RepositoryModelLoadRequest *)request;
    const char *config = NULL;
    for (size_t i = 0; i < req->n_parameters; i++) {
        const char *key = req->parameters[i]->key;
        const Inference__ModelRepositoryParameter *v = req->parameters[i]->value;
        int rc = pjs_load_parameter_check(req->model_name, key, err);
        if (rc != 0)
            return rc;
        if (strcmp(key, "config") != 0)
            continue;
        if (v == NULL ||
            v->parameter_choice_case !=
                INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "model %.256s: load parameter \"config\" must be a "
                                 "string_param holding the ModelConfig as JSON",
                                 req->model_name);
        config = v->string_param;
    }
    pjs_grpc_deferred *call = pjs__grpc_unary_defer(ctx);
    pjs_error refused;
    if (pjs_server_load_model_config_async(ctx->frontend->server, req->model_name, config,
                                           config != NULL ? strlen(config) : 0,
                                           repository_load_done, call, &refused) != 0)
        pjs__grpc_unary_answer(call, NULL, &refused);
    return 0;
}

/* Parameters (unload_dependents) are ignored: pjserve models have none. */
static int repository_unload(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                             ProtobufCMessage **response, pjs_error *err)
{
    const Inference__RepositoryModelUnloadRequest *req =
        (const Inference__RepositoryModelUnloadRequest *)request;
    Inference__RepositoryModelUnloadResponse *r = NEW(ctx, Inference__RepositoryModelUnloadResponse,
                                                      inference__repository_model_unload_response);
    if (r == NULL)
        return no_memory(err);
    int rc = pjs_server_unload_model(ctx->frontend->server, req->model_name, err);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

/* ---- shared memory: system and CUDA ---------------------------------------------- */

typedef Inference__SystemSharedMemoryStatusResponse__RegionsEntry region_entry;
typedef Inference__SystemSharedMemoryStatusResponse__RegionStatus region_status;
typedef Inference__CudaSharedMemoryStatusResponse__RegionsEntry cuda_region_entry;
typedef Inference__CudaSharedMemoryStatusResponse__RegionStatus cuda_region_status;

/* Every region of `kind` or the one named, into an arena array (*out, *n). */
static int shm_regions(pjs_grpc_unary_ctx *ctx, pjs_shm_kind kind, const char *name,
                       pjs_shm_info **out, size_t *n, pjs_error *err)
{
    pjs_shm_registry *reg = pjs_server_shm(ctx->frontend->server);
    size_t cap = 16;
    for (;;) {
        pjs_shm_info *info = pjs_grpc_arena_alloc(ctx->arena, cap * sizeof *info);
        if (info == NULL)
            return no_memory(err);
        int count = pjs_shm_status_kind(reg, kind, name, info, cap, err);
        if (count < 0)
            return count;
        if ((size_t)count <= cap) {
            *out = info;
            *n = (size_t)count;
            return 0;
        }
        cap = (size_t)count; /* registered meanwhile: try again with room */
    }
}

static int shm_status(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                      ProtobufCMessage **response, pjs_error *err)
{
    const Inference__SystemSharedMemoryStatusRequest *req =
        (const Inference__SystemSharedMemoryStatusRequest *)request;
    pjs_shm_info *info = NULL;
    size_t n = 0;
    int rc = shm_regions(ctx, PJS_SHM_SYSTEM, req->name, &info, &n, err);
    if (rc != 0)
        return rc;
    Inference__SystemSharedMemoryStatusResponse *r =
        NEW(ctx, Inference__SystemSharedMemoryStatusResponse,
            inference__system_shared_memory_status_response);
    region_entry **entries = pjs_grpc_arena_alloc(ctx->arena, n * sizeof *entries);
    if (r == NULL || entries == NULL)
        return no_memory(err);
    for (size_t i = 0; i < n; i++) {
        region_entry *e =
            NEW(ctx, region_entry, inference__system_shared_memory_status_response__regions_entry);
        region_status *st =
            NEW(ctx, region_status, inference__system_shared_memory_status_response__region_status);
        if (e == NULL || st == NULL)
            return no_memory(err);
        st->name = info[i].name;
        st->key = info[i].key;
        st->offset = info[i].offset;
        st->byte_size = info[i].byte_size;
        e->key = info[i].name;
        e->value = st;
        entries[i] = e;
    }
    r->regions = entries;
    r->n_regions = n;
    *response = &r->base;
    return 0;
}

static int shm_register(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                        ProtobufCMessage **response, pjs_error *err)
{
    const Inference__SystemSharedMemoryRegisterRequest *req =
        (const Inference__SystemSharedMemoryRegisterRequest *)request;
    Inference__SystemSharedMemoryRegisterResponse *r =
        NEW(ctx, Inference__SystemSharedMemoryRegisterResponse,
            inference__system_shared_memory_register_response);
    if (r == NULL)
        return no_memory(err);
    int rc = pjs_shm_register(pjs_server_shm(ctx->frontend->server), req->name, req->key,
                              req->offset, req->byte_size, err);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

static int shm_unregister(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                          ProtobufCMessage **response, pjs_error *err)
{
    const Inference__SystemSharedMemoryUnregisterRequest *req =
        (const Inference__SystemSharedMemoryUnregisterRequest *)request;
    Inference__SystemSharedMemoryUnregisterResponse *r =
        NEW(ctx, Inference__SystemSharedMemoryUnregisterResponse,
            inference__system_shared_memory_unregister_response);
    if (r == NULL)
        return no_memory(err);
    int rc = pjs_shm_unregister(pjs_server_shm(ctx->frontend->server), req->name, err);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

static int cuda_shm_status(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                           ProtobufCMessage **response, pjs_error *err)
{
    const Inference__CudaSharedMemoryStatusRequest *req =
        (const Inference__CudaSharedMemoryStatusRequest *)request;
    pjs_shm_info *info = NULL;
    size_t n = 0;
    int rc = shm_regions(ctx, PJS_SHM_CUDA, req->name, &info, &n, err);
    if (rc != 0)
        return rc;
    Inference__CudaSharedMemoryStatusResponse *r =
        NEW(ctx, Inference__CudaSharedMemoryStatusResponse,
            inference__cuda_shared_memory_status_response);
    cuda_region_entry **entries = pjs_grpc_arena_alloc(ctx->arena, n * sizeof *entries);
    if (r == NULL || entries == NULL)
        return no_memory(err);
    for (size_t i = 0; i < n; i++) {
        cuda_region_entry *e = NEW(ctx, cuda_region_entry,
                                   inference__cuda_shared_memory_status_response__regions_entry);
        cuda_region_status *st =
            NEW(ctx, cuda_region_status,
                inference__cuda_shared_memory_status_response__region_status);
        if (e == NULL || st == NULL)
            return no_memory(err);
        st->name = info[i].name;
        st->device_id = (uint64_t)info[i].device_id;
        st->byte_size = info[i].byte_size;
        e->key = info[i].name;
        e->value = st;
        entries[i] = e;
    }
    r->regions = entries;
    r->n_regions = n;
    *response = &r->base;
    return 0;
}

static int cuda_shm_register(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                             ProtobufCMessage **response, pjs_error *err)
{
    const Inference__CudaSharedMemoryRegisterRequest *req =
        (const Inference__CudaSharedMemoryRegisterRequest *)request;
    Inference__CudaSharedMemoryRegisterResponse *r =
        NEW(ctx, Inference__CudaSharedMemoryRegisterResponse,
            inference__cuda_shared_memory_register_response);
    if (r == NULL)
        return no_memory(err);
    int rc = pjs_shm_register_cuda(pjs_server_shm(ctx->frontend->server), req->name,
                                   req->raw_handle.data, req->raw_handle.len, req->device_id,
                                   req->byte_size, err);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

static int cuda_shm_unregister(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                               ProtobufCMessage **response, pjs_error *err)
{
    const Inference__CudaSharedMemoryUnregisterRequest *req =
        (const Inference__CudaSharedMemoryUnregisterRequest *)request;
    Inference__CudaSharedMemoryUnregisterResponse *r =
        NEW(ctx, Inference__CudaSharedMemoryUnregisterResponse,
            inference__cuda_shared_memory_unregister_response);
    if (r == NULL)
        return no_memory(err);
    int rc = pjs_shm_unregister_kind(pjs_server_shm(ctx->frontend->server), PJS_SHM_CUDA,
                                     req->name, err);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

/* ---- tracing and logging ---------------------------------------------------------- */

/* Applies the settings given (none: a read), then reports them all
 * (trace/trace.h). */
static int trace_setting(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                         ProtobufCMessage **response, pjs_error *err)
{
    const Inference__TraceSettingRequest *req = (const Inference__TraceSettingRequest *)request;
    pjs_tracer *tracer = pjs_server_tracer(ctx->frontend->server);
    int rc = pjs_grpc_trace_settings_update(tracer, req, err);
    if (rc != 0)
        return rc;
    pjs_trace_setting_out now[PJS_TRACE_SETTINGS];
    size_t n = pjs_trace_settings_current(tracer, now);
    Inference__TraceSettingResponse *r =
        NEW(ctx, Inference__TraceSettingResponse, inference__trace_setting_response);
    Inference__TraceSettingResponse__SettingsEntry **entries =
        pjs_grpc_arena_alloc(ctx->arena, n * sizeof *entries);
    if (r == NULL || entries == NULL)
        return no_memory(err);
    for (size_t i = 0; i < n; i++) {
        Inference__TraceSettingResponse__SettingsEntry *e =
            NEW(ctx, Inference__TraceSettingResponse__SettingsEntry,
                inference__trace_setting_response__settings_entry);
        Inference__TraceSettingResponse__SettingValue *v =
            NEW(ctx, Inference__TraceSettingResponse__SettingValue,
                inference__trace_setting_response__setting_value);
        char **values = pjs_grpc_arena_alloc(ctx->arena, sizeof *values);
        char *text = pjs_grpc_arena_alloc(ctx->arena, sizeof now[i].value);
        if (e == NULL || v == NULL || values == NULL || text == NULL)
            return no_memory(err);
        memcpy(text, now[i].value, sizeof now[i].value);
        values[0] = text;
        /* an empty string is reported as no value, as Triton does */
        v->value = values;
        v->n_value = text[0] != '\0' ? 1 : 0;
        e->key = (char *)now[i].key;
        e->value = v;
        entries[i] = e;
    }
    r->settings = entries;
    r->n_settings = n;
    *response = &r->base;
    return 0;
}

typedef Inference__LogSettingsRequest__SettingValue log_value;

/* What a LogSettings request asks for, before it is applied. */
typedef struct log_request {
    const log_value *error, *warning, *info, *verbose;
} log_request;

#define LOG_CASE(name) INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_##name

/* Files one setting into out, refusing what pjserve cannot do. */
static int log_parse_one(const char *key, const log_value *v, log_request *out, pjs_error *err)
{
    if (v == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "log setting \"%.256s\" has no value",
                             key);
    const log_value **flag = strcmp(key, "log_error") == 0     ? &out->error
                             : strcmp(key, "log_warning") == 0 ? &out->warning
                             : strcmp(key, "log_info") == 0    ? &out->info
                                                               : NULL;
    bool is_string = v->parameter_choice_case == LOG_CASE(STRING_PARAM);
    if (flag != NULL) {
        if (v->parameter_choice_case != LOG_CASE(BOOL_PARAM))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "log setting \"%s\" must be a bool_param", key);
        *flag = v;
        return 0;
    }
    if (strcmp(key, "log_verbose_level") == 0) {
        if (v->parameter_choice_case != LOG_CASE(UINT32_PARAM))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "log setting \"log_verbose_level\" must be a uint32_param");
        out->verbose = v;
        return 0;
    }
    if (strcmp(key, "log_file") == 0)
        return is_string && v->string_param[0] == '\0'
                   ? 0
                   : pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                                   "pjserve logs to stderr only; log_file must be \"\"");
    if (strcmp(key, "log_format") == 0)
        return is_string && strcmp(v->string_param, "ISO8601") == 0
                   ? 0
                   : pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                                   "pjserve writes ISO8601 timestamps only; log_format must be "
                                   "\"ISO8601\"");
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "unknown log setting \"%.256s\"", key);
}

static int log_parse(const Inference__LogSettingsRequest *req, log_request *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < req->n_settings; i++) {
        int rc = log_parse_one(req->settings[i]->key, req->settings[i]->value, out, err);
        if (rc != 0)
            return rc;
    }
    if (out->error != NULL && !out->error->bool_param)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED, "pjserve always logs errors");
    return 0;
}

/* The threshold the request asks for, starting from `level`. pjserve logs
 * by threshold (error < warning < info < verbose), so switching one on
 * switches on the less verbose ones, and switching one off switches off the
 * more verbose ones. A request that asks for both at once is refused. */
static int log_apply(const log_request *q, pjs_log_level level, pjs_log_level *out, pjs_error *err)
{
    if (q->warning != NULL)
        level =
            q->warning->bool_param ? (level > PJS_LOG_WARN ? PJS_LOG_WARN : level) : PJS_LOG_ERROR;
    if (q->info != NULL)
        level = q->info->bool_param ? (level > PJS_LOG_INFO ? PJS_LOG_INFO : level)
                                    : (level < PJS_LOG_WARN ? PJS_LOG_WARN : level);
    if (q->verbose != NULL)
        level = q->verbose->uint32_param > 0 ? PJS_LOG_DEBUG
                                             : (level == PJS_LOG_DEBUG ? PJS_LOG_INFO : level);
    bool consistent =
        (q->warning == NULL || q->warning->bool_param == (level <= PJS_LOG_WARN)) &&
        (q->info == NULL || q->info->bool_param == (level <= PJS_LOG_INFO)) &&
        (q->verbose == NULL || (q->verbose->uint32_param > 0) == (level == PJS_LOG_DEBUG));
    if (!consistent)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "pjserve logs by threshold (error, then warning, info, verbose): "
                             "a level cannot be on while a less verbose one is off");
    *out = level;
    return 0;
}

typedef Inference__LogSettingsResponse__SettingsEntry log_entry;

static log_entry *log_report(pjs_grpc_unary_ctx *ctx, const char *key)
{
    log_entry *e = NEW(ctx, log_entry, inference__log_settings_response__settings_entry);
    if (e == NULL)
        return NULL;
    e->key = (char *)key;
    e->value = NEW(ctx, Inference__LogSettingsResponse__SettingValue,
                   inference__log_settings_response__setting_value);
    return e->value != NULL ? e : NULL;
}

static int log_settings(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                        ProtobufCMessage **response, pjs_error *err)
{
    log_request q;
    pjs_log_level level = pjs_log_get_level();
    int rc = log_parse((const Inference__LogSettingsRequest *)request, &q, err);
    if (rc == 0)
        rc = log_apply(&q, pjs_log_get_level(), &level, err);
    if (rc != 0)
        return rc;
    if (level != pjs_log_get_level()) {
        pjs_log_set_level(level);
        pjs_info("log level set to %s over gRPC", level == PJS_LOG_DEBUG  ? "debug"
                                                  : level == PJS_LOG_INFO ? "info"
                                                  : level == PJS_LOG_WARN ? "warn"
                                                                          : "error");
    }
    Inference__LogSettingsResponse *r =
        NEW(ctx, Inference__LogSettingsResponse, inference__log_settings_response);
    log_entry **e = pjs_grpc_arena_alloc(ctx->arena, 6 * sizeof *e);
    if (r == NULL || e == NULL)
        return no_memory(err);
    const char *keys[] = {"log_file",  "log_info",          "log_warning",
                          "log_error", "log_verbose_level", "log_format"};
    for (size_t i = 0; i < 6; i++)
        if ((e[i] = log_report(ctx, keys[i])) == NULL)
            return no_memory(err);
    e[0]->value->parameter_choice_case =
        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM;
    e[0]->value->string_param = "";
    for (size_t i = 1; i <= 3; i++)
        e[i]->value->parameter_choice_case =
            INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_BOOL_PARAM;
    e[1]->value->bool_param = level <= PJS_LOG_INFO;
    e[2]->value->bool_param = level <= PJS_LOG_WARN;
    e[3]->value->bool_param = 1;
    e[4]->value->parameter_choice_case =
        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_UINT32_PARAM;
    e[4]->value->uint32_param = level == PJS_LOG_DEBUG ? 1 : 0;
    e[5]->value->parameter_choice_case =
        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM;
    e[5]->value->string_param = "ISO8601";
    r->settings = e;
    r->n_settings = 6;
    *response = &r->base;
    return 0;
}

/* ---- the table ------------------------------------------------------------------ */

#define SVC "/inference.GRPCInferenceService/"
#define UNARY(name, req, fn)                                                                       \
    {                                                                                              \
        SVC name, PJS_GRPC_UNARY, &req##__descriptor, fn                                           \
    }

#define CONTROL(name, req, fn)                                                                     \
    {                                                                                              \
        "/pjserve.control.v1.ModelControl/" name, PJS_GRPC_UNARY,                                  \
            &pjserve__control__v1__##req##__descriptor, fn                                         \
    }

const pjs_grpc_method pjs__grpc_methods[] = {
    UNARY("ServerLive", inference__server_live_request, server_live),
    UNARY("ServerReady", inference__server_ready_request, server_ready),
    UNARY("ModelReady", inference__model_ready_request, model_ready),
    UNARY("ServerMetadata", inference__server_metadata_request, server_metadata),
    UNARY("ModelMetadata", inference__model_metadata_request, model_metadata),
    {SVC "ModelInfer", PJS_GRPC_INFER, NULL, NULL},
    {SVC "ModelStreamInfer", PJS_GRPC_STREAM_INFER, NULL, NULL},
    UNARY("ModelConfig", inference__model_config_request, model_config),
    UNARY("ModelStatistics", inference__model_statistics_request, model_statistics_rpc),
    UNARY("RepositoryIndex", inference__repository_index_request, repository_index),
    UNARY("RepositoryModelLoad", inference__repository_model_load_request, repository_load),
    UNARY("RepositoryModelUnload", inference__repository_model_unload_request, repository_unload),
    UNARY("SystemSharedMemoryStatus", inference__system_shared_memory_status_request, shm_status),
    UNARY("SystemSharedMemoryRegister", inference__system_shared_memory_register_request,
          shm_register),
    UNARY("SystemSharedMemoryUnregister", inference__system_shared_memory_unregister_request,
          shm_unregister),
    UNARY("CudaSharedMemoryStatus", inference__cuda_shared_memory_status_request, cuda_shm_status),
    UNARY("CudaSharedMemoryRegister", inference__cuda_shared_memory_register_request,
          cuda_shm_register),
    UNARY("CudaSharedMemoryUnregister", inference__cuda_shared_memory_unregister_request,
          cuda_shm_unregister),
    UNARY("TraceSetting", inference__trace_setting_request, trace_setting),
    UNARY("LogSettings", inference__log_settings_request, log_settings),
    CONTROL("ModelControlStatus", model_control_status_request, pjs__grpc_control_status),
    CONTROL("SetModelResidency", set_model_residency_request, pjs__grpc_control_set_residency),
    CONTROL("SetModelPolicy", set_model_policy_request, pjs__grpc_control_set_policy),
    CONTROL("Compact", compact_request, pjs__grpc_control_compact),
    CONTROL("NodeStatus", node_status_request, pjs__grpc_control_node_status),
    {"/grpc.health.v1.Health/Check", PJS_GRPC_UNARY,
     &grpc__health__v1__health_check_request__descriptor, pjs__grpc_health_check},
    {"/grpc.health.v1.Health/Watch", PJS_GRPC_HEALTH_WATCH, NULL, NULL},
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", PJS_GRPC_REFLECTION, NULL,
     NULL},
    {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", PJS_GRPC_REFLECTION, NULL, NULL},
};

const size_t pjs__grpc_n_methods = sizeof pjs__grpc_methods / sizeof pjs__grpc_methods[0];
