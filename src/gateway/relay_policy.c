/*
 * relay_policy.c - the operation table and the rules every class shares:
 * what the pool hears of a worker's call, the first-error verdict and how
 * a failure names its worker (relay_policy.h). The classes themselves are
 * in relay_classes.c.
 */
#include "gateway/relay_policy.h"

#include <stdio.h>
#include <string.h>

#include "frontend/status_map.h"

pjs_gw_mark pjs_gw_mark_of(const char *value, size_t len)
{
    if (len == strlen(PJS_ANSWER_DRAINING) && memcmp(value, PJS_ANSWER_DRAINING, len) == 0)
        return PJS_GW_MARK_DRAINING;
    if (len == strlen(PJS_ANSWER_NOT_RUN) && memcmp(value, PJS_ANSWER_NOT_RUN, len) == 0)
        return PJS_GW_MARK_NOT_RUN;
    return PJS_GW_MARK_ERROR;
}

pjs_gw_outcome pjs_gw_relay_outcome(const pjs_gw_result *r)
{
    switch (r->delivery) {
    case PJS_GW_DELIVERED:
        return r->mark == PJS_GW_MARK_DRAINING ? PJS_GW_NOT_SENT : PJS_GW_ANSWERED;
    case PJS_GW_UNDELIVERED: return PJS_GW_NOT_SENT;
    default: return PJS_GW_BROKEN;
    }
}

static bool failed(const pjs_gw_result *r)
{
    return r->delivery != PJS_GW_DELIVERED || !r->ok;
}

static bool alike(const pjs_gw_result *a, const pjs_gw_result *b)
{
    return a->delivery == PJS_GW_DELIVERED && b->delivery == PJS_GW_DELIVERED &&
           a->status == b->status && a->text_len == b->text_len &&
           (a->text_len == 0 || memcmp(a->text, b->text, a->text_len) == 0);
}

void pjs_gw_relay_first_error(const pjs_gw_result *results, size_t n, pjs_gw_verdict *out)
{
    *out = (pjs_gw_verdict){.kind = PJS_GW_VERDICT_RELAY, .n = n};
    for (size_t i = 0; i < n; i++)
        if (failed(&results[i]) && out->n_failed++ == 0)
            out->at = i;
    out->accepted = out->n_failed < n;
    if (out->n_failed == 0)
        return;
    out->kind = PJS_GW_VERDICT_FAILED;
    out->unanimous = out->n_failed == n;
    for (size_t i = 0; i < n && out->unanimous; i++)
        out->unanimous = alike(&results[i], &results[out->at]);
}

char *pjs_gw_relay_failure_text(const pjs_gw_verdict *v, const pjs_gw_result *failure,
                                const char *addr, const char *why, char *buf, size_t size)
{
    char others[96] = "";
    size_t rest = v->n - 1;
    if (v->n_failed > 1)
        snprintf(others, sizeof others, " (and %zu more of the %zu workers failed)",
                 v->n_failed - 1, v->n);
    else if (rest > 0)
        snprintf(others, sizeof others, " (the other %zu worker%s succeeded)", rest,
                 rest == 1 ? "" : "s");
    snprintf(buf, size, "worker %d (%s)%s %s%s", failure->worker, addr,
             failure->delivery == PJS_GW_DELIVERED ? ":" : " did not answer:", why, others);
    return buf;
}

/* ---- the operations ------------------------------------------------------------ */

#define SVC "/inference.GRPCInferenceService/"
#define CONTROL "/pjserve.control.v1.ModelControl/"

#define OP(id_, name_, cls_, grpc_, ...)                                                         \
    [PJS_GW_OP_##id_] = {.id = PJS_GW_OP_##id_, .name = name_, .cls = &pjs_gw_class_##cls_,     \
                         .grpc = grpc_, .rest = {__VA_ARGS__}

const pjs_gw_op pjs_gw_ops[PJS_GW_N_OPS] = {
    OP(SERVER_LIVE, "ServerLive", local, SVC "ServerLive", "GET /v2/health/live")},
    OP(SERVER_READY, "ServerReady", local, SVC "ServerReady", "GET /v2/health/ready")},
    OP(HEALTH_CHECK, "Health/Check", local, "/grpc.health.v1.Health/Check", NULL)},
    OP(NODE_STATUS, "NodeStatus", local, CONTROL "NodeStatus", "GET /v2/pjserve/node")},
    OP(SERVER_METADATA, "ServerMetadata", any, SVC "ServerMetadata", "GET /v2")},
    OP(MODEL_STATISTICS, "ModelStatistics", merge, SVC "ModelStatistics", "GET /v2/models/stats",
       "GET /v2/models/{m}/stats", "GET /v2/models/{m}/versions/*/stats"),
       .merge = PJS_GW_MERGE_STATISTICS},
    OP(MODEL_METADATA, "ModelMetadata", model, SVC "ModelMetadata", "GET /v2/models/{m}",
       "GET /v2/models/{m}/versions/*")},
    OP(MODEL_CONFIG, "ModelConfig", model, SVC "ModelConfig", "GET /v2/models/{m}/config",
       "GET /v2/models/{m}/versions/*/config")},
    OP(MODEL_READY, "ModelReady", model, SVC "ModelReady", "GET /v2/models/{m}/ready",
       "GET /v2/models/{m}/versions/*/ready")},
    OP(MODEL_INFER, "ModelInfer", model, SVC "ModelInfer", "POST /v2/models/{m}/infer",
       "POST /v2/models/{m}/versions/*/infer"),
       .inference = true},
    OP(MODEL_STREAM_INFER, "ModelStreamInfer", model, SVC "ModelStreamInfer", NULL),
       .stream = true, .inference = true},
    OP(REPOSITORY_INDEX, "RepositoryIndex", merge, SVC "RepositoryIndex",
       "POST /v2/repository/index"),
       .merge = PJS_GW_MERGE_INDEX},
    OP(REPOSITORY_MODEL_LOAD, "RepositoryModelLoad", fan_out, SVC "RepositoryModelLoad",
       "POST /v2/repository/models/{m}/load")},
    OP(REPOSITORY_MODEL_UNLOAD, "RepositoryModelUnload", fan_out, SVC "RepositoryModelUnload",
       "POST /v2/repository/models/{m}/unload")},
    OP(SYSTEM_SHM_STATUS, "SystemSharedMemoryStatus", any, SVC "SystemSharedMemoryStatus",
       "GET /v2/systemsharedmemory/status", "GET /v2/systemsharedmemory/region/*/status")},
    OP(SYSTEM_SHM_REGISTER, "SystemSharedMemoryRegister", fan_out,
       SVC "SystemSharedMemoryRegister", "POST /v2/systemsharedmemory/region/*/register")},
    OP(SYSTEM_SHM_UNREGISTER, "SystemSharedMemoryUnregister", fan_out,
       SVC "SystemSharedMemoryUnregister", "POST /v2/systemsharedmemory/unregister",
       "POST /v2/systemsharedmemory/region/*/unregister")},
    OP(CUDA_SHM_STATUS, "CudaSharedMemoryStatus", any, SVC "CudaSharedMemoryStatus",
       "GET /v2/cudasharedmemory/status", "GET /v2/cudasharedmemory/region/*/status")},
    OP(CUDA_SHM_REGISTER, "CudaSharedMemoryRegister", fan_out, SVC "CudaSharedMemoryRegister",
       "POST /v2/cudasharedmemory/region/*/register")},
    OP(CUDA_SHM_UNREGISTER, "CudaSharedMemoryUnregister", fan_out,
       SVC "CudaSharedMemoryUnregister", "POST /v2/cudasharedmemory/unregister",
       "POST /v2/cudasharedmemory/region/*/unregister")},
    OP(TRACE_SETTING, "TraceSetting", fan_out, SVC "TraceSetting", "GET /v2/trace/setting",
       "POST /v2/trace/setting", "GET /v2/models/*/trace/setting",
       "POST /v2/models/*/trace/setting")},
    OP(LOG_SETTINGS, "LogSettings", fan_out, SVC "LogSettings", "GET /v2/logging",
       "POST /v2/logging")},
    OP(MODEL_CONTROL_STATUS, "ModelControlStatus", any, CONTROL "ModelControlStatus",
       "GET /v2/pjserve/control")},
    OP(SET_MODEL_RESIDENCY, "SetModelResidency", fan_out, CONTROL "SetModelResidency",
       "POST /v2/pjserve/models/{m}/residency")},
    OP(SET_MODEL_POLICY, "SetModelPolicy", fan_out, CONTROL "SetModelPolicy",
       "POST /v2/pjserve/models/{m}/policy")},
    OP(COMPACT, "Compact", fan_out, CONTROL "Compact", "POST /v2/pjserve/compact")},
    /* Reflection, Health/Watch and whatever else: a stream to any worker. */
    OP(OTHER, "other", any, NULL, NULL), .stream = true},
};

const pjs_gw_op *pjs_gw_op_of_grpc(const char *method)
{
    for (size_t i = 0; i < PJS_GW_OP_OTHER; i++)
        if (pjs_gw_ops[i].grpc != NULL && strcmp(pjs_gw_ops[i].grpc, method) == 0)
            return &pjs_gw_ops[i];
    return &pjs_gw_ops[PJS_GW_OP_OTHER];
}

/* Whether `shape` ("METHOD /a/{m}/b", "*" for any segment) fits the
 * request; *model_at is set to the model's segment (n: none). */
static bool shape_fits(const char *shape, const char *method, const char *const *seg, size_t n,
                       size_t *model_at)
{
    const char *s = strchr(shape, ' ');
    size_t method_len = (size_t)(s - shape);
    if (strcmp(method, "HEAD") == 0)
        method = "GET";
    if (strlen(method) != method_len || strncmp(shape, method, method_len) != 0)
        return false;
    size_t i = 0, model = n;
    for (s++; *s == '/'; i++) {
        const char *part = s + 1, *end = strchr(part, '/');
        size_t len = end != NULL ? (size_t)(end - part) : strlen(part);
        s = part + len;
        if (i >= n)
            return false;
        if (len == 3 && strncmp(part, "{m}", 3) == 0)
            model = i;
        else if (!(len == 1 && *part == '*') &&
                 (strlen(seg[i]) != len || strncmp(seg[i], part, len) != 0))
            return false;
    }
    if (i != n)
        return false;
    *model_at = model;
    return true;
}

const pjs_gw_op *pjs_gw_op_of_rest(const char *method, const char *const *seg, size_t n,
                                   size_t *model_at)
{
    for (size_t i = 0; i < PJS_GW_OP_OTHER; i++)
        for (size_t k = 0; k < PJS_GW_OP_REST_SHAPES && pjs_gw_ops[i].rest[k] != NULL; k++)
            if (shape_fits(pjs_gw_ops[i].rest[k], method, seg, n, model_at))
                return &pjs_gw_ops[i];
    *model_at = n;
    return &pjs_gw_ops[PJS_GW_OP_OTHER];
}
