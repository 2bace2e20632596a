/*
 * client.c - connections (the URL, the options, the transport), errors
 * and their codes, the count of calls in flight, and synchronous waiting
 * on a transport's completion.
 *
 * A synchronous call is an asynchronous one waited for: the calling
 * thread sleeps on a condition variable until the transport's completion
 * thread hands the reply over. So every call, whichever way it is made,
 * goes through one path per protocol.
 */
#include "client/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PJSERVE_VERSION
#define PJSERVE_VERSION "0.0.0"
#endif

const char *pjs_client_version(void)
{
    return PJSERVE_VERSION;
}

/* ---- errors -------------------------------------------------------------------- */

static const char *const code_names[] = {
    "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS",    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",       "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *pjs_client_code_name(pjs_client_code code)
{
    if ((int)code < 0 || (size_t)code >= sizeof code_names / sizeof code_names[0])
        return "UNKNOWN";
    return code_names[code];
}

pjs_client_code pjsc_code_from_http(long status)
{
    if (status >= 200 && status < 300)
        return PJS_CLIENT_OK;
    switch (status) {
    case 400: return PJS_CLIENT_INVALID_ARGUMENT;
    case 401: return PJS_CLIENT_UNAUTHENTICATED;
    case 403: return PJS_CLIENT_PERMISSION_DENIED;
    case 404: return PJS_CLIENT_NOT_FOUND;
    case 408:
    case 504: return PJS_CLIENT_DEADLINE_EXCEEDED;
    case 409: return PJS_CLIENT_ABORTED;
    case 412: return PJS_CLIENT_FAILED_PRECONDITION;
    case 413:
    case 429: return PJS_CLIENT_RESOURCE_EXHAUSTED;
    case 499: return PJS_CLIENT_CANCELLED;
    case 501: return PJS_CLIENT_UNIMPLEMENTED;
    case 502:
    case 503: return PJS_CLIENT_UNAVAILABLE;
    default: return status >= 500 ? PJS_CLIENT_INTERNAL : PJS_CLIENT_UNKNOWN;
    }
}

int pjsc_http_from_code(pjs_client_code code)
{
    switch (code) {
    case PJS_CLIENT_OK: return 200;
    case PJS_CLIENT_INVALID_ARGUMENT:
    case PJS_CLIENT_FAILED_PRECONDITION:
    case PJS_CLIENT_OUT_OF_RANGE: return 400;
    case PJS_CLIENT_UNAUTHENTICATED: return 401;
    case PJS_CLIENT_PERMISSION_DENIED: return 403;
    case PJS_CLIENT_NOT_FOUND: return 404;
    case PJS_CLIENT_ALREADY_EXISTS:
    case PJS_CLIENT_ABORTED: return 409;
    case PJS_CLIENT_RESOURCE_EXHAUSTED: return 429;
    case PJS_CLIENT_CANCELLED: return 499;
    case PJS_CLIENT_UNIMPLEMENTED: return 501;
    case PJS_CLIENT_UNAVAILABLE: return 503;
    case PJS_CLIENT_DEADLINE_EXCEEDED: return 504;
    default: return 500;
    }
}

int pjsc_fail(pjs_client_error *err, pjs_client_code code, const char *fmt, ...)
{
    if (err != NULL) {
        err->code = code;
        err->http_status = pjsc_http_from_code(code);
        err->from_server = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return (int)code;
}

void pjsc_ok(pjs_client_error *err)
{
    if (err != NULL) {
        err->code = PJS_CLIENT_OK;
        err->http_status = 200;
        err->from_server = 0;
        err->message[0] = '\0';
    }
}

char *pjsc_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

void pjs_client_free(void *p)
{
    free(p);
}

/* ---- calls in flight ---------------------------------------------------------- */

void pjsc_call_begin(pjs_client *c)
{
    pthread_mutex_lock(&c->mu);
    c->in_flight++;
    pthread_mutex_unlock(&c->mu);
}

void pjsc_call_end(pjs_client *c)
{
    pthread_mutex_lock(&c->mu);
    if (--c->in_flight == 0)
        pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->mu);
}

/* ---- synchronous waiting --------------------------------------------------------- */

void pjsc_sync_init(pjsc_sync *s)
{
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->done = false;
    memset(&s->reply, 0, sizeof s->reply);
}

void pjsc_sync_done(void *arg, pjsc_reply *reply)
{
    pjsc_sync *s = arg;
    pthread_mutex_lock(&s->mu);
    s->reply = *reply;
    s->done = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

int pjsc_sync_wait(pjsc_sync *s, pjs_client_error *err)
{
    pthread_mutex_lock(&s->mu);
    while (!s->done)
        pthread_cond_wait(&s->cond, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cond);
    if (err != NULL)
        *err = s->reply.err;
    return (int)s->reply.err.code;
}

int pjsc_grpc_call(pjs_client *c, const char *method, const ProtobufCMessage *request,
                   const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **response,
                   pjs_client_error *err)
{
    *response = NULL;
    pjsc_sync s;
    pjsc_sync_init(&s);
    int rc = pjsc_grpc_start(c, method, request, 0, pjsc_sync_done, &s, err);
    if (rc != 0)
        return rc;
    rc = pjsc_sync_wait(&s, err);
    if (rc == 0) {
        *response = protobuf_c_message_unpack(response_type, NULL, s.reply.len, s.reply.body);
        if (*response == NULL)
            rc = pjsc_fail(err, PJS_CLIENT_INTERNAL, "the server's answer to %s is not a %s",
                           method, response_type->name);
    }
    free(s.reply.body);
    return rc;
}

char *pjsc_json_text(const json_t *doc)
{
    return json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* ---- connections ------------------------------------------------------------------ */

/* Splits url into protocol, TLS and target. */
static int parse_url(pjs_client *c, const char *url, pjs_client_error *err)
{
    static const struct {
        const char *prefix;
        pjs_client_protocol protocol;
        bool tls;
    } schemes[] = {
        {"grpc://", PJS_CLIENT_GRPC, false},
        {"grpcs://", PJS_CLIENT_GRPC, true},
        {"http://", PJS_CLIENT_HTTP, false},
        {"https://", PJS_CLIENT_HTTP, true},
    };
    const char *hostport = url;
    c->protocol = PJS_CLIENT_GRPC;
    c->tls = false;
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        size_t n = strlen(schemes[i].prefix);
        if (strncmp(url, schemes[i].prefix, n) == 0) {
            hostport = url + n;
            c->protocol = schemes[i].protocol;
            c->tls = schemes[i].tls;
            break;
        }
    }
    if (hostport == url && strstr(url, "://") != NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "URL %.200s: the scheme must be grpc://, grpcs://, http:// or https://",
                         url);
    size_t n = strlen(hostport);
    while (n > 0 && hostport[n - 1] == '/')
        n--;
    if (n == 0 || memchr(hostport, '/', n) != NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "URL %.200s: give HOST:PORT after the scheme, with no path", url);
    size_t cap = n + 16;
    c->target = malloc(cap);
    if (c->target == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a connection");
    if (c->protocol == PJS_CLIENT_GRPC)
        snprintf(c->target, cap, "%.*s", (int)n, hostport);
    else
        snprintf(c->target, cap, "%s://%.*s", c->tls ? "https" : "http", (int)n, hostport);
    return 0;
}

static int check_options(const pjs_client_options *o, pjs_client_error *err)
{
    if ((o->tls_cert_file == NULL) != (o->tls_key_file == NULL))
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "give both tls_cert_file and tls_key_file for mutual TLS, or neither");
    return 0;
}

int pjs_client_connect(const char *url, const pjs_client_options *options, pjs_client **out,
                       pjs_client_error *err)
{
    static const pjs_client_options defaults;
    const pjs_client_options *o = options != NULL ? options : &defaults;
    *out = NULL;
    if (url == NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "no URL given");
    int rc = check_options(o, err);
    if (rc != 0)
        return rc;
    pjs_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a connection");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->idle, NULL);
    c->timeout_ms = o->timeout_ms;
    c->max_message_bytes = o->max_message_bytes ? o->max_message_bytes : PJSC_DEFAULT_MAX_MESSAGE;
    rc = parse_url(c, url, err);
    if (rc == 0 && o->token != NULL && (c->token = pjsc_strdup(o->token)) == NULL)
        rc = pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a connection");
    if (rc == 0)
        rc = c->protocol == PJS_CLIENT_GRPC ? pjsc_grpc_open(c, o, err) : pjsc_http_open(c, o, err);
    if (rc != 0) {
        pjs_client_close(c);
        return rc;
    }
    pjsc_ok(err);
    *out = c;
    return 0;
}

void pjs_client_close(pjs_client *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    while (c->in_flight > 0)
        pthread_cond_wait(&c->idle, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (c->grpc != NULL)
        pjsc_grpc_close(c);
    if (c->http != NULL)
        pjsc_http_close(c);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->idle);
    free(c->target);
    free(c->token);
    free(c);
}

pjs_client_protocol pjs_client_get_protocol(const pjs_client *c)
{
    return c->protocol;
}
