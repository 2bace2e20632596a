/*
 * probe.h - a small blocking HTTP/1.1 client for the node's probes of its
 * workers: one request per connection, over TCP or a Unix socket, under one
 * deadline.
 *
 * The node asks its own worker processes on loopback for their health
 * (GET /v2/health/live) and their repository index (POST
 * /v2/repository/index), over loopback TCP or the Unix socket a worker
 * listens on in the node's private run directory. A request sends "Connection: close" and reads the
 * status line, the headers and a body delimited by Content-Length or by the
 * end of the connection (a chunked body is refused). Every step — connect,
 * send, read — counts against the one timeout, so a stopped worker (SIGSTOP:
 * the kernel still accepts the connection) costs the caller the timeout and
 * no more.
 *
 * No state is shared between calls: any thread may call these.
 */
#ifndef PJS_NODE_PROBE_H
#define PJS_NODE_PROBE_H

#include <stddef.h>

#include "core/status.h"

/* Largest reply accepted (headers and body); a larger one is an error. */
#define PJS_PROBE_MAX_REPLY (4u << 20)

typedef struct pjs_probe_request {
    const char *host;          /* numeric address or name, e.g. "127.0.0.1", or a Unix
                                  socket "unix:/path" (core/unix_addr.h; port ignored) */
    int port;
    const char *method;        /* "GET", "POST" */
    const char *path;          /* "/v2/health/live" */
    const char *body;          /* NULL: none */
    size_t body_len;
    const char *bearer_token;  /* sent as Authorization: Bearer; NULL: none */
    unsigned timeout_ms;       /* the whole exchange; 0: 1000 */
} pjs_probe_request;

typedef struct pjs_probe_reply {
    int status;      /* HTTP status code */
    char *body;      /* malloc'd, NUL-terminated; free with pjs_probe_reply_free */
    size_t body_len;
} pjs_probe_reply;

/* Sends one request and reads the reply. UNAVAILABLE when the connection is
 * refused or cut, DEADLINE_EXCEEDED when the timeout passed first,
 * INVALID_ARGUMENT for a reply that is not HTTP/1.x (or too large); the
 * message names the address and the path. */
int pjs_probe_http(const pjs_probe_request *req, pjs_probe_reply *out, pjs_error *err);
void pjs_probe_reply_free(pjs_probe_reply *r);

#endif
