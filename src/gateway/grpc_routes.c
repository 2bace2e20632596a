/*
 * grpc_routes.c - the gateway's answers to the forwarding gRPC front end
 * (pjs_grpc_proxy_ops): each method served over the workers as its
 * operation's class says (relay_policy.h, one table for gRPC and REST).
 * What is gRPC's own stays here: the local answers (ServerLive,
 * ServerReady, grpc.health.v1.Health/Check, NodeStatus), reading a
 * request's model and sequence key, reading the changes the pool
 * remembers out of protobuf requests, and merging protobuf answers
 * (RepositoryIndex, ModelStatistics) by the class's rule.
 */
#include "gateway/grpc_routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/grpc/arena.h"
#include "frontend/grpc/control_codec.h"
#include "gateway/relay_policy.h"
#include "gateway/route_key.h"
#include "grpc_service.pb-c.h"
#include "health.pb-c.h"
#include "pjserve_control.pb-c.h"
#include "trace/trace.h"

#define INFERENCE_SERVICE "inference.GRPCInferenceService"

static pjs_grpc_proxy_kind classify(void *ctx, const char *m)
{
    (void)ctx;
    const pjs_gw_op *op = pjs_gw_op_of_grpc(m);
    if (op->cls == &pjs_gw_class_local)
        return PJS_GRPC_PROXY_LOCAL;
    if (op->stream)
        return PJS_GRPC_PROXY_STREAM_ROUTED;
    return op->cls->targets != NULL ? PJS_GRPC_PROXY_FANOUT : PJS_GRPC_PROXY_ROUTED;
}

static int pack(const ProtobufCMessage *m, uint8_t **out, size_t *len, pjs_error *err)
{
    *len = protobuf_c_message_get_packed_size(m);
    *out = malloc(*len ? *len : 1);
    if (*out == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the answer");
    protobuf_c_message_pack(m, *out);
    return 0;
}

/* NodeStatus from the node's status document. */
static int node_status(const pjs_gw_grpc_routes *r, uint8_t **out, size_t *out_len,
                       pjs_error *err)
{
    if (r->node_status == NULL)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "this gateway runs on its own, not under `pjserve node`: there is "
                             "no node status");
    char *json = r->node_status(r->node_ctx);
    if (json == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the node's status");
    pjs_grpc_arena arena;
    pjs_grpc_arena_init(&arena, (size_t)1 << 20);
    pjs_grpc_node_status_response *status = NULL;
    int rc = pjs_grpc_node_status(json, strlen(json), &arena, &status, err);
    free(json);
    if (rc == 0)
        rc = pack(&status->base, out, out_len, err);
    pjs_grpc_arena_reset(&arena);
    return rc;
}

static int answer(void *ctx, const char *m, const uint8_t *msg, size_t len, uint8_t **out,
                  size_t *out_len, pjs_error *err)
{
    const pjs_gw_grpc_routes *routes = ctx;
    pjs_gw_op_id op = pjs_gw_op_of_grpc(m)->id;
    if (op == PJS_GW_OP_NODE_STATUS)
        return node_status(routes, out, out_len, err);
    bool ready = pjs_gw_pool_ready(routes->pool);
    if (op == PJS_GW_OP_SERVER_LIVE) {
        Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
        r.live = true;
        return pack(&r.base, out, out_len, err);
    }
    if (op == PJS_GW_OP_SERVER_READY) {
        Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
        r.ready = ready;
        return pack(&r.base, out, out_len, err);
    }
    Grpc__Health__V1__HealthCheckRequest *rq =
        grpc__health__v1__health_check_request__unpack(NULL, len, msg);
    if (rq == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "the request is not a grpc.health.v1.HealthCheckRequest");
    bool known = rq->service == NULL || rq->service[0] == '\0' ||
                 strcmp(rq->service, INFERENCE_SERVICE) == 0;
    if (!known)
        pjs_error_set(err, PJS_ERR_NOT_FOUND,
                      "unknown service \"%.256s\" (pjserve reports on \"\" and \"" INFERENCE_SERVICE
                      "\")",
                      rq->service);
    grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
    if (!known)
        return PJS_ERR_NOT_FOUND;
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = ready ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                     : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    return pack(&r.base, out, out_len, err);
}

static int pick(void *ctx, const char *m, const uint8_t *msg, size_t len, uint64_t tried,
                pjs_error *err)
{
    pjs_gw_pool *pool = ((pjs_gw_grpc_routes *)ctx)->pool;
    const pjs_gw_op *op = pjs_gw_op_of_grpc(m);
    pjs_gw_route_key key = {.model = "", .sequence = ""};
    if (op->cls == &pjs_gw_class_model) {
        if (pjs_gw_route_key_read(msg, len, op->inference, &key, err) != 0)
            return -1;
        if (key.model[0] == '\0') {
            if (!op->stream) /* a stream's first message may be yet to come */
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "the request names no model"),
                       -1;
            return pjs_gw_class_any.pick(pool, &(pjs_gw_route){"", ""}, tried, err);
        }
    }
    pjs_gw_route route = {key.model, key.sequence};
    int worker = op->cls->pick(pool, &route, tried, err);
    if (worker >= 0 && tried != 0) /* a call sent again: the first worker did not run it */
        pjs_gw_pool_count_retry(pool, PJS_GW_GRPC);
    return worker;
}

/* What the relay policy reads of a worker's call. */
static pjs_gw_result result_of(const pjs_grpc_proxy_result *r)
{
    return (pjs_gw_result){
        .worker = r->worker,
        .delivery = r->outcome == PJS_GRPC_PROXY_ANSWERED   ? PJS_GW_DELIVERED
                    : r->outcome == PJS_GRPC_PROXY_NOT_SENT ? PJS_GW_UNDELIVERED
                                                            : PJS_GW_LOST,
        .mark = r->mark != NULL ? pjs_gw_mark_of(r->mark, strlen(r->mark)) : PJS_GW_MARK_NONE,
        .ok = r->outcome == PJS_GRPC_PROXY_ANSWERED && r->status == 0,
        .status = r->status,
        .text = r->details,
        .text_len = strlen(r->details),
    };
}

static bool done(void *ctx, const char *m, const pjs_grpc_proxy_result *r)
{
    pjs_gw_result result = result_of(r);
    pjs_gw_pool_done(((pjs_gw_grpc_routes *)ctx)->pool, r->worker, pjs_gw_relay_outcome(&result));
    return pjs_gw_op_of_grpc(m)->cls->retry(&result);
}

/* The change a repository load, unload or residency call makes, for the
 * pool to remember (its strings point into *unpacked, which the caller
 * frees); false for other calls and messages that do not decode (the
 * workers refuse those themselves). */
static bool change_of(pjs_gw_op_id op, const uint8_t *msg, size_t len, pjs_gw_change *c,
                      ProtobufCMessage **unpacked)
{
    memset(c, 0, sizeof *c);
    *unpacked = NULL;
    if (op == PJS_GW_OP_REPOSITORY_MODEL_LOAD) {
        Inference__RepositoryModelLoadRequest *rq =
            inference__repository_model_load_request__unpack(NULL, len, msg);
        if (rq == NULL)
            return false;
        *unpacked = &rq->base;
        c->kind = PJS_GW_CHANGE_LOAD;
        c->model = rq->model_name;
        for (size_t i = 0; i < rq->n_parameters; i++) {
            const Inference__RepositoryModelLoadRequest__ParametersEntry *e = rq->parameters[i];
            if (e->key != NULL && strcmp(e->key, "config") == 0 && e->value != NULL &&
                e->value->parameter_choice_case ==
                    INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
                c->config = e->value->string_param;
        }
    } else if (op == PJS_GW_OP_REPOSITORY_MODEL_UNLOAD) {
        Inference__RepositoryModelUnloadRequest *rq =
            inference__repository_model_unload_request__unpack(NULL, len, msg);
        if (rq == NULL)
            return false;
        *unpacked = &rq->base;
        c->kind = PJS_GW_CHANGE_UNLOAD;
        c->model = rq->model_name;
    } else if (op == PJS_GW_OP_SET_MODEL_RESIDENCY) {
        Pjserve__Control__V1__SetModelResidencyRequest *rq =
            pjserve__control__v1__set_model_residency_request__unpack(NULL, len, msg);
        if (rq == NULL)
            return false;
        *unpacked = &rq->base;
        c->kind = PJS_GW_CHANGE_RESIDENCY;
        c->model = rq->name;
        c->residency = (int)rq->residency;
    } else {
        return false;
    }
    return c->model != NULL && c->model[0] != '\0';
}

/* The workers of a fan-out or merge, as its class says; a change the pool
 * remembers for workers restarted later read out of the request. */
/* TraceSetting acts on the gateway's own sampling too: applied here first,
 * so that one the gateway refuses goes to no worker. */
static int trace_setting_here(pjs_tracer *t, const uint8_t *msg, size_t len, pjs_error *err)
{
    Inference__TraceSettingRequest *req = inference__trace_setting_request__unpack(NULL, len, msg);
    if (req == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "TraceSetting: the message does not decode");
    int rc = pjs_grpc_trace_settings_update(t, req, err);
    inference__trace_setting_request__free_unpacked(req, NULL);
    return rc;
}

static uint64_t fanout(void *ctx, const char *m, const uint8_t *msg, size_t len,
                       uint64_t *change_seq, pjs_error *err)
{
    pjs_gw_grpc_routes *routes = ctx;
    pjs_gw_pool *pool = routes->pool;
    const pjs_gw_op *op = pjs_gw_op_of_grpc(m);
    if (op->id == PJS_GW_OP_TRACE_SETTING && routes->tracer != NULL &&
        trace_setting_here(routes->tracer, msg, len, err) != 0)
        return 0;
    pjs_gw_change change;
    ProtobufCMessage *unpacked;
    bool remembered = change_of(op->id, msg, len, &change, &unpacked);
    uint64_t mask = op->cls->targets(pool, remembered ? &change : NULL, change_seq, err);
    if (unpacked != NULL)
        protobuf_c_message_free_unpacked(unpacked, NULL);
    return mask;
}

static grpc_channel *channel(void *ctx, int worker)
{
    return pjs_gw_pool_channel(((pjs_gw_grpc_routes *)ctx)->pool, (size_t)worker);
}

/* ---- merging ------------------------------------------------------------------ */

static bool same_model(const char *a_name, const char *a_version, const char *b_name,
                       const char *b_version)
{
    return strcmp(a_name ? a_name : "", b_name ? b_name : "") == 0 &&
           strcmp(a_version ? a_version : "", b_version ? b_version : "") == 0;
}

typedef Inference__RepositoryIndexResponse__ModelIndex index_entry;

static bool entry_ready(const index_entry *e)
{
    return e->state != NULL && strcmp(e->state, "READY") == 0;
}

/* Name, then version, then a READY entry first. */
static int by_model_ready_first(const void *a, const void *b)
{
    const index_entry *x = *(index_entry *const *)a, *y = *(index_entry *const *)b;
    int c = strcmp(x->name ? x->name : "", y->name ? y->name : "");
    if (c == 0)
        c = strcmp(x->version ? x->version : "", y->version ? y->version : "");
    return c != 0 ? c : (int)entry_ready(y) - (int)entry_ready(x);
}

/* Every worker's entries, sorted by name and version, each model once: the
 * READY entry where some worker has it ready. O(n log n) in the entries, so
 * a worker listing a huge index costs the call that asked, not more. */
static int merge_index(ProtobufCMessage **parts, size_t n, uint8_t **out, size_t *len,
                       pjs_error *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += ((Inference__RepositoryIndexResponse *)parts[i])->n_models;
    index_entry **all = calloc(total ? total : 1, sizeof *all);
    if (all == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory merging the index");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        Inference__RepositoryIndexResponse *r = (void *)parts[i];
        for (size_t j = 0; j < r->n_models; j++)
            all[k++] = r->models[j];
    }
    qsort(all, k, sizeof *all, by_model_ready_first);
    size_t unique = 0;
    for (size_t j = 0; j < k; j++) {
        const index_entry *m = all[j], *prev = unique > 0 ? all[unique - 1] : NULL;
        if (prev == NULL || !same_model(prev->name, prev->version, m->name, m->version))
            all[unique++] = all[j];
    }
    Inference__RepositoryIndexResponse merged_r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    merged_r.n_models = unique;
    merged_r.models = all;
    int rc = pack(&merged_r.base, out, len, err);
    free(all);
    return rc;
}

static void add_duration(Inference__StatisticDuration *into, const Inference__StatisticDuration *d)
{
    if (into != NULL && d != NULL) {
        into->count += d->count;
        into->ns += d->ns;
    }
}

/* One model of a merged answer: the first worker's entry, summed into,
 * and its batch sizes: the first worker's, then those only others had
 * (entries of their answers, borrowed until the merged answer is packed). */
typedef struct merged_model {
    Inference__ModelStatistics *stats;
    Inference__InferBatchStatistics **batches;
    size_t n_batches;
} merged_model;

static void add_batch(merged_model *into, Inference__InferBatchStatistics *b)
{
    for (size_t j = 0; j < into->n_batches; j++)
        if (into->batches[j]->batch_size == b->batch_size) {
            add_duration(into->batches[j]->compute_input, b->compute_input);
            add_duration(into->batches[j]->compute_infer, b->compute_infer);
            add_duration(into->batches[j]->compute_output, b->compute_output);
            return;
        }
    into->batches[into->n_batches++] = b; /* room for every entry was made */
}

static void add_stats(merged_model *into, const Inference__ModelStatistics *s)
{
    Inference__ModelStatistics *m = into->stats;
    m->inference_count += s->inference_count;
    m->execution_count += s->execution_count;
    if (s->last_inference > m->last_inference)
        m->last_inference = s->last_inference;
    Inference__InferStatistics *a = m->inference_stats;
    const Inference__InferStatistics *b = s->inference_stats;
    if (a != NULL && b != NULL) {
        add_duration(a->success, b->success);
        add_duration(a->fail, b->fail);
        add_duration(a->queue, b->queue);
        add_duration(a->compute_input, b->compute_input);
        add_duration(a->compute_infer, b->compute_infer);
        add_duration(a->compute_output, b->compute_output);
        add_duration(a->cache_hit, b->cache_hit);
        add_duration(a->cache_miss, b->cache_miss);
    }
    for (size_t i = 0; i < s->n_batch_stats; i++)
        add_batch(into, s->batch_stats[i]);
}

static int merge_statistics(ProtobufCMessage **parts, size_t n, uint8_t **out, size_t *len,
                            pjs_error *err)
{
    size_t total = 0, batches = 0;
    for (size_t i = 0; i < n; i++) {
        const Inference__ModelStatisticsResponse *r = (const void *)parts[i];
        total += r->n_model_stats;
        for (size_t j = 0; j < r->n_model_stats; j++)
            batches += r->model_stats[j]->n_batch_stats;
    }
    merged_model *models = calloc(total ? total : 1, sizeof *models);
    Inference__ModelStatistics **all = calloc(total ? total : 1, sizeof *all);
    Inference__InferBatchStatistics **room = calloc(batches ? batches : 1, sizeof *room);
    if (models == NULL || all == NULL || room == NULL) {
        free(models);
        free(all);
        free(room);
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory merging statistics");
    }
    size_t k = 0, used = 0;
    for (size_t i = 0; i < n; i++) {
        Inference__ModelStatisticsResponse *r = (void *)parts[i];
        for (size_t j = 0; j < r->n_model_stats; j++) {
            Inference__ModelStatistics *s = r->model_stats[j];
            size_t at = k;
            for (size_t q = 0; q < k && at == k; q++)
                if (same_model(all[q]->name, all[q]->version, s->name, s->version))
                    at = q;
            if (at < k) {
                add_stats(&models[at], s);
                continue;
            }
            /* A model's batch sizes fit in what all its entries have. */
            size_t room_for = 0;
            for (size_t i2 = i; i2 < n; i2++) {
                const Inference__ModelStatisticsResponse *r2 = (const void *)parts[i2];
                for (size_t j2 = 0; j2 < r2->n_model_stats; j2++)
                    if (same_model(s->name, s->version, r2->model_stats[j2]->name,
                                   r2->model_stats[j2]->version))
                        room_for += r2->model_stats[j2]->n_batch_stats;
            }
            models[k] = (merged_model){.stats = s, .batches = room + used};
            used += room_for;
            for (size_t b = 0; b < s->n_batch_stats; b++)
                models[k].batches[models[k].n_batches++] = s->batch_stats[b];
            all[k++] = s;
        }
    }
    /* Each merged entry shows its merged batch sizes while it is packed,
     * then gets its own array back (freed with its answer). */
    Inference__InferBatchStatistics ***own = calloc(k ? k : 1, sizeof *own);
    size_t *own_n = calloc(k ? k : 1, sizeof *own_n);
    int rc = 0;
    if (own == NULL || own_n == NULL) {
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "no memory merging statistics");
    } else {
        for (size_t q = 0; q < k; q++) {
            own[q] = all[q]->batch_stats;
            own_n[q] = all[q]->n_batch_stats;
            all[q]->batch_stats = models[q].batches;
            all[q]->n_batch_stats = models[q].n_batches;
        }
        Inference__ModelStatisticsResponse merged_r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
        merged_r.n_model_stats = k;
        merged_r.model_stats = all;
        rc = pack(&merged_r.base, out, len, err);
        for (size_t q = 0; q < k; q++) {
            all[q]->batch_stats = own[q];
            all[q]->n_batch_stats = own_n[q];
        }
    }
    free(own);
    free(own_n);
    free(models);
    free(all);
    free(room);
    return rc;
}

/* The answers in `which` (bit i: answer i), merged as `kind` says. */
static int merge(const char *m, pjs_gw_merge_kind kind, const uint8_t *const *answers,
                 const size_t *lengths, uint64_t which, size_t n, uint8_t **out, size_t *out_len,
                 pjs_error *err)
{
    const ProtobufCMessageDescriptor *type =
        kind == PJS_GW_MERGE_INDEX ? &inference__repository_index_response__descriptor
                                   : &inference__model_statistics_response__descriptor;
    ProtobufCMessage *parts[PJS_GW_MAX_WORKERS];
    size_t got = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!(which & (1ull << i)))
            continue;
        parts[got] = protobuf_c_message_unpack(type, NULL, lengths[i], answers[i]);
        if (parts[got] == NULL)
            rc = pjs_error_set(err, PJS_ERR_INTERNAL, "a worker's answer to %s is not a %s", m,
                               type->name);
        else
            got++;
    }
    if (rc == 0)
        rc = kind == PJS_GW_MERGE_INDEX ? merge_index(parts, got, out, out_len, err)
                                        : merge_statistics(parts, got, out, out_len, err);
    for (size_t i = 0; i < got; i++)
        protobuf_c_message_free_unpacked(parts[i], NULL);
    return rc;
}

/* The reply of a fan-out or merge, as its class's verdict says. */
static int finish(void *ctx, const char *m, uint64_t change, const pjs_grpc_proxy_result *results,
                  const uint8_t *const *answers, const size_t *lengths, size_t n,
                  pjs_grpc_proxy_reply *out, pjs_error *err)
{
    pjs_gw_pool *pool = ((pjs_gw_grpc_routes *)ctx)->pool;
    const pjs_gw_op *op = pjs_gw_op_of_grpc(m);
    pjs_gw_result rs[PJS_GW_MAX_WORKERS];
    for (size_t i = 0; i < n; i++)
        rs[i] = result_of(&results[i]);
    pjs_gw_verdict v;
    op->cls->combine(rs, n, &v);
    pjs_gw_pool_change_settled(pool, change, v.accepted);
    out->from = v.kind == PJS_GW_VERDICT_MERGE ? 0 : v.at;
    out->status = v.kind == PJS_GW_VERDICT_FAILED ? results[v.at].status : 0;
    out->own_details = v.kind != PJS_GW_VERDICT_FAILED || v.unanimous;
    switch (v.kind) {
    case PJS_GW_VERDICT_FAILED:
        if (!v.unanimous)
            pjs_gw_relay_failure_text(&v, &rs[v.at],
                                      pjs_gw_pool_addr(pool, (size_t)rs[v.at].worker)->grpc,
                                      results[v.at].details, out->details, sizeof out->details);
        return 0;
    case PJS_GW_VERDICT_MERGE:
        for (size_t i = 0; i < n; i++)
            if (v.merged & (1ull << i)) {
                out->from = i;
                break;
            }
        return merge(m, op->merge, answers, lengths, v.merged, n, &out->message, &out->len, err);
    default: /* a fan-out whose workers all succeeded: the first answer */
        out->message = malloc(lengths[v.at] ? lengths[v.at] : 1);
        if (out->message == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the answer");
        memcpy(out->message, answers[v.at], lengths[v.at]);
        out->len = lengths[v.at];
        return 0;
    }
}

void pjs_gw_grpc_ops(pjs_gw_grpc_routes *routes, pjs_grpc_proxy_ops *ops)
{
    *ops = (pjs_grpc_proxy_ops){
        .ctx = routes,
        .classify = classify,
        .answer = answer,
        .pick = pick,
        .done = done,
        .fanout = fanout,
        .finish = finish,
        .channel = channel,
        .worker_token = pjs_gw_pool_worker_token(routes->pool),
    };
}
