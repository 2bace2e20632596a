/*
 * calls.c - every call but inference: health, metadata, configuration,
 * statistics, the repository, model control, and shared memory
 * registration, each over gRPC (a message, its answer converted by
 * pb_json.c) or REST (a path; the server's JSON as sent).
 */
#include "client/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_service.pb-c.h"
#include "pjserve_control.pb-c.h"

#define INFERENCE_SERVICE "/inference.GRPCInferenceService/"

/* ---- paths ------------------------------------------------------------------------- */

int pjsc_path_segment(char *out, size_t cap, const char *segment, pjs_client_error *err)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)segment; *p; p++) {
        bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                     (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.' || *p == '~';
        if (n + 4 > cap)
            return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "the name %.100s... is too long",
                             segment);
        if (plain) {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    out[n] = '\0';
    return 0;
}

int pjsc_model_path(char *out, size_t cap, const char *model, const char *version,
                    const char *suffix, pjs_client_error *err)
{
    char m[1024], v[256];
    if (model == NULL || model[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "no model name given");
    int rc = pjsc_path_segment(m, sizeof m, model, err);
    if (rc == 0 && version != NULL && version[0] != '\0')
        rc = pjsc_path_segment(v, sizeof v, version, err);
    if (rc != 0)
        return rc;
    bool versioned = version != NULL && version[0] != '\0';
    snprintf(out, cap, "/v2/models/%s%s%s%s", m, versioned ? "/versions/" : "",
             versioned ? v : "", suffix);
    return 0;
}

/* ---- the two shapes of a document call ---------------------------------------------- */

/* A gRPC call whose answer becomes JSON text in *json. */
static int grpc_document(pjs_client *c, const char *method, const ProtobufCMessage *req,
                         const ProtobufCMessageDescriptor *type, char **json,
                         pjs_client_error *err)
{
    ProtobufCMessage *resp;
    int rc = pjsc_grpc_call(c, method, req, type, &resp, err);
    if (rc != 0)
        return rc;
    json_t *doc = pjsc_pb_to_json(resp);
    protobuf_c_message_free_unpacked(resp, NULL);
    *json = doc != NULL ? pjsc_json_text(doc) : NULL;
    json_decref(doc);
    return *json != NULL ? 0
                         : pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a document");
}

/* A REST call whose answer's text (NUL-terminated) goes to *json, or is
 * dropped when json is NULL. `body` is JSON or NULL. */
static int rest_call(pjs_client *c, const char *method, const char *path, const char *body,
                     char **json, pjs_client_error *err)
{
    char *copy = NULL;
    size_t len = 0;
    if (body != NULL) {
        if ((copy = pjsc_strdup(body)) == NULL)
            return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a request");
        len = strlen(body);
    }
    pjsc_sync s;
    pjsc_sync_init(&s);
    int rc = pjsc_http_start(c, method, path, copy, len, len, 0, pjsc_sync_done, &s, err);
    if (rc != 0)
        return rc;
    rc = pjsc_sync_wait(&s, err);
    if (rc == 0 && json != NULL) {
        *json = malloc(s.reply.len + 1);
        if (*json == NULL) {
            rc = pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a document");
        } else {
            if (s.reply.len > 0)
                memcpy(*json, s.reply.body, s.reply.len);
            (*json)[s.reply.len] = '\0';
        }
    }
    free(s.reply.body);
    return rc;
}

static int check_client(pjs_client *c, void *out, pjs_client_error *err)
{
    if (c == NULL || out == NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "no client or no result given");
    return 0;
}

/* ---- health ------------------------------------------------------------------------ */

/* A REST health probe: 200 is yes, any other answer no (an error only
 * when no answer came). */
static int rest_probe(pjs_client *c, const char *path, int *out, pjs_client_error *err)
{
    pjs_client_error e;
    int rc = rest_call(c, "GET", path, NULL, NULL, &e);
    *out = rc == 0;
    if (rc != 0 && !e.from_server) {
        if (err != NULL)
            *err = e;
        return rc;
    }
    pjsc_ok(err);
    return 0;
}

int pjs_client_server_live(pjs_client *c, int *out, pjs_client_error *err)
{
    int rc = check_client(c, out, err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP)
        return rest_probe(c, "/v2/health/live", out, err);
    Inference__ServerLiveRequest req = INFERENCE__SERVER_LIVE_REQUEST__INIT;
    ProtobufCMessage *resp;
    rc = pjsc_grpc_call(c, INFERENCE_SERVICE "ServerLive", &req.base,
                        &inference__server_live_response__descriptor, &resp, err);
    if (rc == 0) {
        *out = ((Inference__ServerLiveResponse *)resp)->live != 0;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return rc;
}

int pjs_client_server_ready(pjs_client *c, int *out, pjs_client_error *err)
{
    int rc = check_client(c, out, err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP)
        return rest_probe(c, "/v2/health/ready", out, err);
    Inference__ServerReadyRequest req = INFERENCE__SERVER_READY_REQUEST__INIT;
    ProtobufCMessage *resp;
    rc = pjsc_grpc_call(c, INFERENCE_SERVICE "ServerReady", &req.base,
                        &inference__server_ready_response__descriptor, &resp, err);
    if (rc == 0) {
        *out = ((Inference__ServerReadyResponse *)resp)->ready != 0;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return rc;
}

int pjs_client_model_ready(pjs_client *c, const char *model, const char *version, int *out,
                           pjs_client_error *err)
{
    int rc = check_client(c, out, err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP) {
        char path[1400];
        rc = pjsc_model_path(path, sizeof path, model, version, "/ready", err);
        return rc != 0 ? rc : rest_probe(c, path, out, err);
    }
    if (model == NULL || model[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "no model name given");
    Inference__ModelReadyRequest req = INFERENCE__MODEL_READY_REQUEST__INIT;
    req.name = (char *)model;
    if (version != NULL)
        req.version = (char *)version;
    ProtobufCMessage *resp;
    rc = pjsc_grpc_call(c, INFERENCE_SERVICE "ModelReady", &req.base,
                        &inference__model_ready_response__descriptor, &resp, err);
    if (rc == 0) {
        *out = ((Inference__ModelReadyResponse *)resp)->ready != 0;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return rc;
}

/* ---- documents -------------------------------------------------------------------- */

int pjs_client_server_metadata(pjs_client *c, char **json, pjs_client_error *err)
{
    int rc = check_client(c, json, err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP)
        return rest_call(c, "GET", "/v2", NULL, json, err);
    Inference__ServerMetadataRequest req = INFERENCE__SERVER_METADATA_REQUEST__INIT;
    return grpc_document(c, INFERENCE_SERVICE "ServerMetadata", &req.base,
                         &inference__server_metadata_response__descriptor, json, err);
}

int pjs_client_model_metadata(pjs_client *c, const char *model, const char *version, char **json,
                              pjs_client_error *err)
{
    int rc = check_client(c, json, err);
    char path[1400];
    if (rc == 0)
        rc = pjsc_model_path(path, sizeof path, model, version, "", err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP)
        return rest_call(c, "GET", path, NULL, json, err);
    Inference__ModelMetadataRequest req = INFERENCE__MODEL_METADATA_REQUEST__INIT;
    req.name = (char *)model;
    if (version != NULL)
        req.version = (char *)version;
    return grpc_document(c, INFERENCE_SERVICE "ModelMetadata", &req.base,
                         &inference__model_metadata_response__descriptor, json, err);
}

int pjs_client_model_config(pjs_client *c, const char *model, const char *version, char **json,
                            pjs_client_error *err)
{
    int rc = check_client(c, json, err);
    char path[1400];
    if (rc == 0)
        rc = pjsc_model_path(path, sizeof path, model, version, "/config", err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP)
        return rest_call(c, "GET", path, NULL, json, err);
    Inference__ModelConfigRequest req = INFERENCE__MODEL_CONFIG_REQUEST__INIT;
    req.name = (char *)model;
    if (version != NULL)
        req.version = (char *)version;
    return grpc_document(c, INFERENCE_SERVICE "ModelConfig", &req.base,
                         &inference__model_config_response__descriptor, json, err);
}

int pjs_client_model_statistics(pjs_client *c, const char *model, const char *version,
                                char **json, pjs_client_error *err)
{
    int rc = check_client(c, json, err);
    if (rc != 0)
        return rc;
    bool all = model == NULL || model[0] == '\0';
    if (c->protocol == PJS_CLIENT_HTTP) {
        char path[1400];
        if (all)
            snprintf(path, sizeof path, "/v2/models/stats");
        else
            rc = pjsc_model_path(path, sizeof path, model, version, "/stats", err);
        return rc != 0 ? rc : rest_call(c, "GET", path, NULL, json, err);
    }
    Inference__ModelStatisticsRequest req = INFERENCE__MODEL_STATISTICS_REQUEST__INIT;
    if (!all)
        req.name = (char *)model;
    if (version != NULL)
        req.version = (char *)version;
    return grpc_document(c, INFERENCE_SERVICE "ModelStatistics", &req.base,
                         &inference__model_statistics_response__descriptor, json, err);
}

/* ---- repository and control ---------------------------------------------------------- */

int pjs_client_repository_index(pjs_client *c, int ready_only, char **json,
                                pjs_client_error *err)
{
    int rc = check_client(c, json, err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP)
        return rest_call(c, "POST", "/v2/repository/index",
                         ready_only ? "{\"ready\":true}" : "{}", json, err);
    Inference__RepositoryIndexRequest req = INFERENCE__REPOSITORY_INDEX_REQUEST__INIT;
    req.ready = ready_only != 0;
    return grpc_document(c, INFERENCE_SERVICE "RepositoryIndex", &req.base,
                         &inference__repository_index_response__descriptor, json, err);
}

static int model_action(pjs_client *c, const char *model, bool load, pjs_client_error *err)
{
    if (c == NULL || model == NULL || model[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "no model name given");
    if (c->protocol == PJS_CLIENT_HTTP) {
        char m[1024], path[1200];
        int rc = pjsc_path_segment(m, sizeof m, model, err);
        if (rc != 0)
            return rc;
        snprintf(path, sizeof path, "/v2/repository/models/%s/%s", m, load ? "load" : "unload");
        return rest_call(c, "POST", path, "{}", NULL, err);
    }
    ProtobufCMessage *resp;
    int rc;
    if (load) {
        Inference__RepositoryModelLoadRequest req = INFERENCE__REPOSITORY_MODEL_LOAD_REQUEST__INIT;
        req.model_name = (char *)model;
        rc = pjsc_grpc_call(c, INFERENCE_SERVICE "RepositoryModelLoad", &req.base,
                            &inference__repository_model_load_response__descriptor, &resp, err);
    } else {
        Inference__RepositoryModelUnloadRequest req =
            INFERENCE__REPOSITORY_MODEL_UNLOAD_REQUEST__INIT;
        req.model_name = (char *)model;
        rc = pjsc_grpc_call(c, INFERENCE_SERVICE "RepositoryModelUnload", &req.base,
                            &inference__repository_model_unload_response__descriptor, &resp, err);
    }
    if (rc == 0)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

int pjs_client_load_model(pjs_client *c, const char *model, pjs_client_error *err)
{
    return model_action(c, model, true, err);
}

int pjs_client_unload_model(pjs_client *c, const char *model, pjs_client_error *err)
{
    return model_action(c, model, false, err);
}

int pjs_client_control_status(pjs_client *c, char **json, pjs_client_error *err)
{
    int rc = check_client(c, json, err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP)
        return rest_call(c, "GET", "/v2/pjserve/control", NULL, json, err);
    Pjserve__Control__V1__ModelControlStatusRequest req =
        PJSERVE__CONTROL__V1__MODEL_CONTROL_STATUS_REQUEST__INIT;
    return grpc_document(c, "/pjserve.control.v1.ModelControl/ModelControlStatus", &req.base,
                         &pjserve__control__v1__model_control_status_response__descriptor, json,
                         err);
}

/* ---- shared memory registration -------------------------------------------------------- */

int pjs_client_shm_register(pjs_client *c, const char *name, const char *key, uint64_t offset,
                            uint64_t byte_size, pjs_client_error *err)
{
    if (c == NULL || name == NULL || name[0] == '\0' || key == NULL || key[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "registering a region needs a client, a region name and a key");
    if (c->protocol == PJS_CLIENT_HTTP) {
        char n[1024], path[1200];
        int rc = pjsc_path_segment(n, sizeof n, name, err);
        if (rc != 0)
            return rc;
        snprintf(path, sizeof path, "/v2/systemsharedmemory/region/%s/register", n);
        json_t *doc = json_pack("{s:s, s:I, s:I}", "key", key, "offset", (json_int_t)offset,
                                "byte_size", (json_int_t)byte_size);
        char *body = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
        json_decref(doc);
        if (body == NULL)
            return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a request");
        rc = rest_call(c, "POST", path, body, NULL, err);
        free(body);
        return rc;
    }
    Inference__SystemSharedMemoryRegisterRequest req =
        INFERENCE__SYSTEM_SHARED_MEMORY_REGISTER_REQUEST__INIT;
    req.name = (char *)name;
    req.key = (char *)key;
    req.offset = offset;
    req.byte_size = byte_size;
    ProtobufCMessage *resp;
    int rc = pjsc_grpc_call(c, INFERENCE_SERVICE "SystemSharedMemoryRegister", &req.base,
                            &inference__system_shared_memory_register_response__descriptor, &resp,
                            err);
    if (rc == 0)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* "/v2/systemsharedmemory[/region/NAME]/ACTION" */
static int shm_path(char *out, size_t cap, const char *name, const char *action,
                    pjs_client_error *err)
{
    if (name == NULL || name[0] == '\0') {
        snprintf(out, cap, "/v2/systemsharedmemory/%s", action);
        return 0;
    }
    char n[1024];
    int rc = pjsc_path_segment(n, sizeof n, name, err);
    if (rc == 0)
        snprintf(out, cap, "/v2/systemsharedmemory/region/%s/%s", n, action);
    return rc;
}

int pjs_client_shm_unregister(pjs_client *c, const char *name, pjs_client_error *err)
{
    if (c == NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "no client given");
    if (c->protocol == PJS_CLIENT_HTTP) {
        char path[1200];
        int rc = shm_path(path, sizeof path, name, "unregister", err);
        return rc != 0 ? rc : rest_call(c, "POST", path, "{}", NULL, err);
    }
    Inference__SystemSharedMemoryUnregisterRequest req =
        INFERENCE__SYSTEM_SHARED_MEMORY_UNREGISTER_REQUEST__INIT;
    if (name != NULL)
        req.name = (char *)name;
    ProtobufCMessage *resp;
    int rc = pjsc_grpc_call(c, INFERENCE_SERVICE "SystemSharedMemoryUnregister", &req.base,
                            &inference__system_shared_memory_unregister_response__descriptor,
                            &resp, err);
    if (rc == 0)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

int pjs_client_shm_status(pjs_client *c, const char *name, char **json, pjs_client_error *err)
{
    int rc = check_client(c, json, err);
    if (rc != 0)
        return rc;
    if (c->protocol == PJS_CLIENT_HTTP) {
        char path[1200];
        rc = shm_path(path, sizeof path, name, "status", err);
        return rc != 0 ? rc : rest_call(c, "GET", path, NULL, json, err);
    }
    Inference__SystemSharedMemoryStatusRequest req =
        INFERENCE__SYSTEM_SHARED_MEMORY_STATUS_REQUEST__INIT;
    if (name != NULL)
        req.name = (char *)name;
    return grpc_document(c, INFERENCE_SERVICE "SystemSharedMemoryStatus", &req.base,
                         &inference__system_shared_memory_status_response__descriptor, json, err);
}
