/*
 * http_internal.h - what the files of the HTTP front end share: the daemon,
 * the per-request context, replies and the route entry points.
 *
 * Threads. libmicrohttpd runs a pool of connection threads (epoll); each
 * connection belongs to one of them, which calls the access handler for it.
 * A request is answered either at once, on that thread, or later: the
 * handler marks the call `waiting`, suspends the connection and hands the
 * work off (an inference to the server, a model load to a helper thread).
 * Whoever finishes the work stores the reply in the call and resumes the
 * connection as its very last touch of the call; libmicrohttpd then calls
 * the handler again on the connection's thread, which queues the stored
 * reply. Resuming goes through libmicrohttpd's mutex, which orders the
 * stored reply before the second handler call.
 */
#ifndef PJS_FRONTEND_HTTP_HTTP_INTERNAL_H
#define PJS_FRONTEND_HTTP_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "core/work_pool.h"
#include "frontend/http/http_buf.h"
#include "frontend/http/http_codec.h"
#include "frontend/http/http_frontend.h"
#include "server/server.h"

struct pjs_http_frontend {
    pjs_server *server;
    struct MHD_Daemon *daemon;
    bool metrics; /* serves GET /metrics only */
    const pjs_access *access; /* consulted once a request's headers are in */
    char address[300]; /* "host:port", for messages */

    /* Shutdown bookkeeping. Stop waits for every deferred job (each holds a
     * suspended connection, which must be resumed before the daemon stops)
     * and, for a grace period, for open requests to finish sending their
     * replies. `idle` is signalled when either count reaches zero. */
    pthread_mutex_t lock;
    pthread_cond_t idle;
    int jobs;             /* suspended calls waiting for work; guarded by lock */
    pjs_work_pool *jobs_pool; /* runs deferred jobs (REST only; NULL for metrics) */
    int open_calls;       /* requests begun and not yet completed; guarded by lock */
    atomic_bool stopping; /* replies ask clients to close their connections */
};

/* A response waiting to be queued. */
typedef struct pjs__http_reply {
    unsigned status;
    char *body; /* malloc'd (handed to libmicrohttpd), NULL for an empty body */
    size_t len;
    const char *content_type;  /* static string, NULL with an empty body */
    size_t inference_header;   /* > 0: Inference-Header-Content-Length */
    const char *allow;         /* for 405: the methods the path takes */
    bool www_authenticate;     /* for 401: WWW-Authenticate: Bearer */
} pjs__http_reply;

/* One request, from its headers to the end of its response (libmicrohttpd's
 * per-request context). Owned by the connection's thread, except while
 * `waiting`, when the reply fields and `infer` belong to the work it waits
 * for. */
typedef struct pjs__http_call {
    pjs_http_frontend *fe;
    struct MHD_Connection *conn;
    const char *method; /* libmicrohttpd's strings, valid for the request */
    const char *url;
    pjs_http_buf body;  /* the request body, decompressed once complete */
    pjs_error body_error; /* code set when the body was refused */
    bool dispatched;      /* the route ran */
    bool waiting;         /* suspended until the reply is stored */
    pjs__http_reply reply;
    pjs_http_infer *infer; /* an inference in progress, or NULL */
} pjs__http_call;

/* ---- replies (http_frontend.c); each replaces any reply stored before ---- */

/* A document; `doc` is consumed (NULL: out of memory, answered 500). */
void pjs__http_reply_json(pjs__http_call *c, unsigned status, json_t *doc);
/* {"error": msg} with the HTTP status that status_map.h gives err->code. */
void pjs__http_reply_error(pjs__http_call *c, const pjs_error *err);
/* {"error": formatted} with an explicit HTTP status. */
void pjs__http_reply_message(pjs__http_call *c, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pjs__http_reply_empty(pjs__http_call *c, unsigned status);
/* Takes the bytes of b as the body. */
void pjs__http_reply_buf(pjs__http_call *c, unsigned status, pjs_http_buf *b,
                         const char *content_type);

/* Runs fn(c) on one of the front end's job threads (a bounded pool: no
 * thread per request) with the connection suspended, then resumes it; fn
 * stores the reply. When the pool's queue is full the call is answered 429
 * at once. */
void pjs__http_defer(pjs__http_call *c, void (*fn)(pjs__http_call *c));
/* For work that answers through a callback on another thread (a model
 * load): suspend marks the call waiting and counts it for shutdown; the
 * callback stores the reply and calls resume as its last touch of c. */
void pjs__http_suspend(pjs__http_call *c);
void pjs__http_resume(pjs__http_call *c);

/* ---- routes ---------------------------------------------------------------- */

/* Whether the caller may make this request (its headers are in, its body
 * not yet read); stores a 401 or 403 reply when not (http_routes.c). */
bool pjs__http_access_allowed(pjs__http_call *c);

/* Every /v2 endpoint (http_routes.c). Stores a reply, or leaves the call
 * waiting. */
void pjs__http_route_rest(pjs__http_call *c);
/* GET /metrics (http_routes.c). */
void pjs__http_route_metrics(pjs__http_call *c);
/* POST /v2/models/{m}[/versions/{v}]/infer (http_infer.c). */
void pjs__http_infer(pjs__http_call *c, const char *model, const char *version);
/* Releases an unfinished inference of c (after a failure or at shutdown). */
void pjs__http_infer_discard(pjs__http_call *c);

#endif
