/*
 * reflection.c - gRPC server reflection (grpc.reflection.v1alpha and v1).
 *
 * The build embeds a FileDescriptorSet of every served .proto file
 * (pjs_grpc_descriptor_set, see cmake/grpc.cmake). At start the set is
 * indexed once: each file's serialized FileDescriptorProto, its
 * dependencies, and the fully qualified names it declares (messages, nested
 * ones included, enums, services and their methods). The index is read-only
 * afterwards, so any thread may use it.
 *
 * A reflection stream answers each request in order: one read, then one
 * write, then the next read, until the client half-closes (status OK) or
 * the call ends. FileByFilename and FileContainingSymbol answer the file
 * followed by every file it depends on, transitively. v1 and v1alpha share
 * this code: their messages are identical on the wire.
 */
#include "frontend/grpc/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "descriptor_index.pb-c.h"
#include "reflection.pb-c.h"

extern const unsigned char pjs_grpc_descriptor_set[];
extern const size_t pjs_grpc_descriptor_set_size;

typedef Grpc__Reflection__V1alpha__ServerReflectionRequest reflection_request;
typedef Grpc__Reflection__V1alpha__ServerReflectionResponse reflection_response;

#define REQUEST_CASE(name)                                                                         \
    GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_##name
#define RESPONSE_CASE(name)                                                                        \
    GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_##name

/* Bytes one reflection request and its answer may take. */
#define REFLECTION_ARENA_LIMIT ((size_t)8 << 20)

typedef struct symbol {
    char *name; /* fully qualified, without a leading dot */
    size_t file;
    bool is_service;
    bool is_message;
} symbol;

struct pjs_grpc_reflection_index {
    Pjserve__Descriptor__FileSet *set; /* set->file[i]: file i's bytes */
    Pjserve__Descriptor__File **files; /* file i, decoded */
    size_t n_files;
    symbol *symbols;
    size_t n_symbols, cap_symbols;
};

/* ---- the index ---------------------------------------------------------------- */

static int add_symbol(pjs_grpc_reflection_index *r, const char *scope, const char *name,
                      size_t file, bool is_service, bool is_message)
{
    if (r->n_symbols == r->cap_symbols) {
        size_t cap = r->cap_symbols ? 2 * r->cap_symbols : 64;
        symbol *grown = realloc(r->symbols, cap * sizeof *grown);
        if (grown == NULL)
            return -1;
        r->symbols = grown;
        r->cap_symbols = cap;
    }
    size_t len = strlen(scope) + 1 + strlen(name) + 1;
    char *full = malloc(len);
    if (full == NULL)
        return -1;
    snprintf(full, len, "%s%s%s", scope, scope[0] != '\0' ? "." : "", name);
    r->symbols[r->n_symbols++] = (symbol){full, file, is_service, is_message};
    return 0;
}

static int index_message(pjs_grpc_reflection_index *r, const char *scope,
                         const Pjserve__Descriptor__Message *m, size_t file)
{
    if (add_symbol(r, scope, m->name, file, false, true) != 0)
        return -1;
    const char *full = r->symbols[r->n_symbols - 1].name;
    for (size_t i = 0; i < m->n_enum_type; i++)
        if (add_symbol(r, full, m->enum_type[i]->name, file, false, false) != 0)
            return -1;
    for (size_t i = 0; i < m->n_nested_type; i++)
        if (index_message(r, full, m->nested_type[i], file) != 0)
            return -1;
    return 0;
}

static int index_file(pjs_grpc_reflection_index *r, size_t i)
{
    const Pjserve__Descriptor__File *f = r->files[i];
    for (size_t k = 0; k < f->n_message_type; k++)
        if (index_message(r, f->package, f->message_type[k], i) != 0)
            return -1;
    for (size_t k = 0; k < f->n_enum_type; k++)
        if (add_symbol(r, f->package, f->enum_type[k]->name, i, false, false) != 0)
            return -1;
    for (size_t k = 0; k < f->n_service; k++) {
        const Pjserve__Descriptor__Service *s = f->service[k];
        if (add_symbol(r, f->package, s->name, i, true, false) != 0)
            return -1;
        const char *full = r->symbols[r->n_symbols - 1].name;
        for (size_t m = 0; m < s->n_method; m++)
            if (add_symbol(r, full, s->method[m]->name, i, false, false) != 0)
                return -1;
    }
    return 0;
}

void pjs__grpc_reflection_destroy(pjs_grpc_reflection_index *r)
{
    for (size_t i = 0; i < r->n_symbols; i++)
        free(r->symbols[i].name);
    free(r->symbols);
    for (size_t i = 0; r->files != NULL && i < r->n_files; i++)
        if (r->files[i] != NULL)
            pjserve__descriptor__file__free_unpacked(r->files[i], NULL);
    free(r->files);
    if (r->set != NULL)
        pjserve__descriptor__file_set__free_unpacked(r->set, NULL);
    free(r);
}

int pjs__grpc_reflection_create(pjs_grpc_reflection_index **out, pjs_error *err)
{
    pjs_grpc_reflection_index *r = calloc(1, sizeof *r);
    if (r == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "gRPC reflection: no memory");
    r->set = pjserve__descriptor__file_set__unpack(NULL, pjs_grpc_descriptor_set_size,
                                                   pjs_grpc_descriptor_set);
    if (r->set != NULL) {
        r->n_files = r->set->n_file;
        r->files = calloc(r->n_files, sizeof *r->files);
    }
    bool ok = r->files != NULL;
    for (size_t i = 0; ok && i < r->n_files; i++) {
        r->files[i] =
            pjserve__descriptor__file__unpack(NULL, r->set->file[i].len, r->set->file[i].data);
        ok = r->files[i] != NULL && index_file(r, i) == 0;
    }
    if (!ok) {
        pjs__grpc_reflection_destroy(r);
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "gRPC reflection: cannot index the embedded descriptor set");
    }
    *out = r;
    return 0;
}

static const symbol *find_symbol(const pjs_grpc_reflection_index *r, const char *name)
{
    if (name[0] == '.')
        name++;
    for (size_t i = 0; i < r->n_symbols; i++)
        if (strcmp(r->symbols[i].name, name) == 0)
            return &r->symbols[i];
    return NULL;
}

static bool find_file(const pjs_grpc_reflection_index *r, const char *name, size_t *out)
{
    for (size_t i = 0; i < r->n_files; i++) {
        if (strcmp(r->files[i]->name, name) == 0) {
            *out = i;
            return true;
        }
    }
    return false;
}

/* ---- answers ------------------------------------------------------------------ */

/* Appends file i and then, depth first, the files it imports, each once. */
static void collect_file(const pjs_grpc_reflection_index *r, size_t i, bool *seen,
                         ProtobufCBinaryData *out, size_t *n)
{
    if (seen[i])
        return;
    seen[i] = true;
    out[(*n)++] = r->set->file[i];
    const Pjserve__Descriptor__File *f = r->files[i];
    for (size_t k = 0; k < f->n_dependency; k++) {
        size_t dep;
        if (find_file(r, f->dependency[k], &dep))
            collect_file(r, dep, seen, out, n);
    }
}

static bool answer_file(const pjs_grpc_reflection_index *r, size_t i, pjs_grpc_arena *a,
                        reflection_response *resp)
{
    Grpc__Reflection__V1alpha__FileDescriptorResponse *fd = pjs_grpc_arena_alloc(a, sizeof *fd);
    bool *seen = pjs_grpc_arena_calloc(a, r->n_files, sizeof *seen);
    ProtobufCBinaryData *files = pjs_grpc_arena_alloc(a, r->n_files * sizeof *files);
    if (fd == NULL || seen == NULL || files == NULL)
        return false;
    *fd = (Grpc__Reflection__V1alpha__FileDescriptorResponse)
        GRPC__REFLECTION__V1ALPHA__FILE_DESCRIPTOR_RESPONSE__INIT;
    fd->file_descriptor_proto = files;
    collect_file(r, i, seen, files, &fd->n_file_descriptor_proto);
    resp->message_response_case = RESPONSE_CASE(FILE_DESCRIPTOR_RESPONSE);
    resp->file_descriptor_response = fd;
    return true;
}

static bool answer_services(const pjs_grpc_reflection_index *r, pjs_grpc_arena *a,
                            reflection_response *resp)
{
    Grpc__Reflection__V1alpha__ListServiceResponse *list = pjs_grpc_arena_alloc(a, sizeof *list);
    Grpc__Reflection__V1alpha__ServiceResponse **items =
        pjs_grpc_arena_alloc(a, r->n_symbols * sizeof *items);
    if (list == NULL || items == NULL)
        return false;
    *list = (Grpc__Reflection__V1alpha__ListServiceResponse)
        GRPC__REFLECTION__V1ALPHA__LIST_SERVICE_RESPONSE__INIT;
    list->service = items;
    for (size_t i = 0; i < r->n_symbols; i++) {
        if (!r->symbols[i].is_service)
            continue;
        Grpc__Reflection__V1alpha__ServiceResponse *s = pjs_grpc_arena_alloc(a, sizeof *s);
        if (s == NULL)
            return false;
        *s = (Grpc__Reflection__V1alpha__ServiceResponse)
            GRPC__REFLECTION__V1ALPHA__SERVICE_RESPONSE__INIT;
        s->name = r->symbols[i].name;
        items[list->n_service++] = s;
    }
    resp->message_response_case = RESPONSE_CASE(LIST_SERVICES_RESPONSE);
    resp->list_services_response = list;
    return true;
}

/* No extension exists in pjserve's files: a known message has none. */
static bool answer_extension_numbers(const char *type, pjs_grpc_arena *a, reflection_response *resp)
{
    Grpc__Reflection__V1alpha__ExtensionNumberResponse *e = pjs_grpc_arena_alloc(a, sizeof *e);
    if (e == NULL)
        return false;
    *e = (Grpc__Reflection__V1alpha__ExtensionNumberResponse)
        GRPC__REFLECTION__V1ALPHA__EXTENSION_NUMBER_RESPONSE__INIT;
    e->base_type_name = (char *)type;
    resp->message_response_case = RESPONSE_CASE(ALL_EXTENSION_NUMBERS_RESPONSE);
    resp->all_extension_numbers_response = e;
    return true;
}

static bool answer_error(int code, const char *message, pjs_grpc_arena *a,
                         reflection_response *resp)
{
    Grpc__Reflection__V1alpha__ErrorResponse *e = pjs_grpc_arena_alloc(a, sizeof *e);
    char *text = pjs_grpc_arena_strdup(a, message);
    if (e == NULL || text == NULL)
        return false;
    *e = (Grpc__Reflection__V1alpha__ErrorResponse)GRPC__REFLECTION__V1ALPHA__ERROR_RESPONSE__INIT;
    e->error_code = code;
    e->error_message = text;
    resp->message_response_case = RESPONSE_CASE(ERROR_RESPONSE);
    resp->error_response = e;
    return true;
}

/* Fills resp for req; false when out of memory. */
static bool answer(const pjs_grpc_reflection_index *r, reflection_request *req, pjs_grpc_arena *a,
                   reflection_response *resp)
{
    char msg[512];
    size_t file;
    const symbol *sym;
    resp->valid_host = req->host;
    resp->original_request = req;
    switch (req->message_request_case) {
    case REQUEST_CASE(FILE_BY_FILENAME):
        if (find_file(r, req->file_by_filename, &file))
            return answer_file(r, file, a, resp);
        snprintf(msg, sizeof msg, "no file named \"%.256s\"", req->file_by_filename);
        return answer_error(GRPC_STATUS_NOT_FOUND, msg, a, resp);
    case REQUEST_CASE(FILE_CONTAINING_SYMBOL):
        if ((sym = find_symbol(r, req->file_containing_symbol)) != NULL)
            return answer_file(r, sym->file, a, resp);
        snprintf(msg, sizeof msg, "no symbol named \"%.256s\"", req->file_containing_symbol);
        return answer_error(GRPC_STATUS_NOT_FOUND, msg, a, resp);
    case REQUEST_CASE(ALL_EXTENSION_NUMBERS_OF_TYPE):
        sym = find_symbol(r, req->all_extension_numbers_of_type);
        if (sym != NULL && sym->is_message)
            return answer_extension_numbers(req->all_extension_numbers_of_type, a, resp);
        snprintf(msg, sizeof msg, "no message type named \"%.256s\"",
                 req->all_extension_numbers_of_type);
        return answer_error(GRPC_STATUS_NOT_FOUND, msg, a, resp);
    case REQUEST_CASE(FILE_CONTAINING_EXTENSION):
        return answer_error(GRPC_STATUS_NOT_FOUND, "pjserve's services declare no extensions", a,
                            resp);
    case REQUEST_CASE(LIST_SERVICES): return answer_services(r, a, resp);
    default:
        return answer_error(GRPC_STATUS_INVALID_ARGUMENT, "the request asks for nothing", a, resp);
    }
}

/* ---- the stream --------------------------------------------------------------- */

typedef struct reflection_call {
    pjs_grpc_call base;
    pjs_grpc_tag on_read;
    pjs_grpc_tag on_write;
    pjs_grpc_tag on_close;
    pjs_grpc_tag on_status;
    atomic_int refs; /* outstanding tags */
    /* Touched only by the read -> write -> read chain, one step at a time: */
    grpc_byte_buffer *incoming;
    grpc_byte_buffer *outgoing;
    bool metadata_sent;
    pjs_grpc_arena arena;
} reflection_call;

static void reflection_free(reflection_call *c)
{
    if (c->incoming != NULL)
        grpc_byte_buffer_destroy(c->incoming);
    if (c->outgoing != NULL)
        grpc_byte_buffer_destroy(c->outgoing);
    pjs_grpc_arena_reset(&c->arena);
    pjs__grpc_call_destroy(&c->base);
    free(c);
}

static void reflection_unref(reflection_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        reflection_free(c);
}

/* Starts a batch that will deliver `tag`, counting its reference. */
static void start_ops(reflection_call *c, grpc_op *ops, size_t n, pjs_grpc_tag *tag)
{
    atomic_fetch_add(&c->refs, 1);
    if (pjs__grpc_start_batch(c->base.call, ops, n, tag) != GRPC_CALL_OK)
        reflection_unref(c);
}

static void start_read(reflection_call *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->incoming;
    start_ops(c, &op, 1, &c->on_read);
}

static void finish(reflection_call *c)
{
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->metadata_sent)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[n++].data.send_status_from_server.status_details = &c->base.details;
    start_ops(c, ops, n, &c->on_status);
}

/* Answers the message just read (an error response when it is not a
 * ServerReflectionRequest); NULL when out of memory. */
static grpc_byte_buffer *answer_message(reflection_call *c, grpc_byte_buffer **payload)
{
    grpc_slice bytes;
    pjs_error payload_err;
    pjs_grpc_arena_reset(&c->arena);
    reflection_request *req = NULL;
    if (pjs__grpc_take_payload(payload, pjs__grpc_small_limit(c->base.frontend), &bytes,
                               &payload_err) == 0)
        req = grpc__reflection__v1alpha__server_reflection_request__unpack(
            &c->arena.allocator, GRPC_SLICE_LENGTH(bytes), GRPC_SLICE_START_PTR(bytes));
    grpc_slice_unref(bytes);
    reflection_response resp = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__INIT;
    bool ok;
    if (req != NULL)
        ok = answer(c->base.frontend->reflection, req, &c->arena, &resp);
    else
        ok = answer_error(GRPC_STATUS_INVALID_ARGUMENT, "malformed ServerReflectionRequest",
                          &c->arena, &resp);
    pjs_error err;
    grpc_byte_buffer *bb = ok ? pjs__grpc_pack(&resp.base, &err) : NULL;
    if (bb == NULL)
        pjs_error("grpc reflection: cannot answer a request");
    return bb;
}

static void reflection_on_read(pjs_grpc_tag *tag, bool ok)
{
    reflection_call *c = PJS_GRPC_CONTAINER(tag, reflection_call, on_read);
    if (ok && c->incoming == NULL) {
        finish(c); /* the client is done asking */
    } else if (ok) {
        c->outgoing = answer_message(c, &c->incoming);
        if (c->outgoing != NULL) {
            grpc_op ops[2];
            size_t n = 0;
            memset(ops, 0, sizeof ops);
            if (!c->metadata_sent)
                ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
            c->metadata_sent = true;
            ops[n].op = GRPC_OP_SEND_MESSAGE;
            ops[n++].data.send_message.send_message = c->outgoing;
            start_ops(c, ops, n, &c->on_write);
        } else {
            grpc_call_cancel(c->base.call, NULL);
        }
    }
    reflection_unref(c);
}

static void reflection_on_write(pjs_grpc_tag *tag, bool ok)
{
    reflection_call *c = PJS_GRPC_CONTAINER(tag, reflection_call, on_write);
    grpc_byte_buffer_destroy(c->outgoing);
    c->outgoing = NULL;
    if (ok)
        start_read(c);
    reflection_unref(c);
}

static void reflection_on_close(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    reflection_unref(PJS_GRPC_CONTAINER(tag, reflection_call, on_close));
}

static void reflection_on_status(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    reflection_unref(PJS_GRPC_CONTAINER(tag, reflection_call, on_status));
}

static void reflection_on_new(pjs_grpc_tag *tag, bool ok)
{
    reflection_call *c = PJS_GRPC_CONTAINER(tag, reflection_call, base.on_new);
    if (!ok) {
        reflection_free(c);
        return;
    }
    pjs__grpc_request(c->base.frontend, c->base.method);
    atomic_store(&c->refs, 1); /* this step's own */
    atomic_fetch_add(&c->refs, 1);
    if (pjs__grpc_recv_close(&c->base, &c->on_close) != GRPC_CALL_OK)
        reflection_unref(c);
    start_read(c);
    reflection_unref(c);
}

void pjs__grpc_request_reflection(pjs_grpc_frontend *f, size_t index)
{
    reflection_call *c = calloc(1, sizeof *c);
    if (c == NULL) {
        pjs_error("grpc: no memory to accept a reflection call");
        return;
    }
    pjs__grpc_call_init(&c->base, f, index, reflection_on_new);
    c->on_read.fn = reflection_on_read;
    c->on_write.fn = reflection_on_write;
    c->on_close.fn = reflection_on_close;
    c->on_status.fn = reflection_on_status;
    pjs_grpc_arena_init(&c->arena, REFLECTION_ARENA_LIMIT);
    if (pjs__grpc_call_request(&c->base, NULL) != GRPC_CALL_OK)
        reflection_free(c);
}
