/*
 * access.h - who may make which call: the one place both front ends ask.
 *
 * Every REST route and every gRPC method has a class, given once in the
 * tables of access.c:
 *
 *   open   health probes (REST /v2/health/live|ready; gRPC ServerLive,
 *          ServerReady, grpc.health.v1.Health, server reflection): anyone.
 *   infer  inference and reading (infer, metadata, config, statistics,
 *          repository index, model control and node status, /metrics): anyone, or
 *          only holders of the inference or admin token when an inference
 *          token is configured.
 *   admin  changes and secrets (repository load/unload, residency, policy,
 *          compaction, shared memory register/unregister/status, logging
 *          and trace settings, read or write): the admin token when one is
 *          configured; without one, loopback peers only (and the inference
 *          token too when that is configured).
 *
 * A route or method missing from the tables is admin-class: adding one
 * without a class makes it need admin credentials, never opens it.
 *
 * Credentials are `Authorization: Bearer <token>` (HTTP) or the
 * `authorization` metadata with the same value (gRPC). No credential where
 * one is needed is UNAUTHENTICATED (HTTP 401), a wrong one
 * PERMISSION_DENIED (403), and so is an admin call from a remote peer
 * without an admin token configured. Tokens are compared in time that
 * depends only on the configured token's length; messages never contain a
 * credential.
 *
 * This module knows no gRPC or libmicrohttpd type: the front ends hand it
 * the header value and whether the peer is loopback. A pjs_access is
 * immutable once created, so any thread may consult it; a NULL one means no
 * tokens (the loopback rule for admin calls, inference open).
 */
#ifndef PJS_FRONTEND_ACCESS_H
#define PJS_FRONTEND_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "core/status.h"

/* Longest token file read, in bytes: a token is one line. */
#define PJS_ACCESS_TOKEN_MAX 4096
/* Tokens shorter than this are accepted with a warning. */
#define PJS_ACCESS_TOKEN_WARN_BELOW 16

typedef enum pjs_access_class {
    PJS_ACCESS_OPEN,
    PJS_ACCESS_INFER,
    PJS_ACCESS_ADMIN,
} pjs_access_class;

typedef struct pjs_access pjs_access;

/* What a caller presented. `authorization` is the first Authorization header
 * (or metadata entry), not NUL-terminated, NULL when there is none;
 * `n_authorization` counts them (more than one is refused). */
typedef struct pjs_access_caller {
    const char *authorization;
    size_t authorization_len;
    unsigned n_authorization;
    bool loopback; /* the peer is 127.0.0.0/8, ::1, ::ffff:127.x.x.x or a Unix socket */
} pjs_access_caller;

/* Reads the token files (either may be NULL). A file that cannot be read,
 * is not a regular file, is readable or writable by group or others, is
 * larger than PJS_ACCESS_TOKEN_MAX, is empty once one trailing newline
 * ("\n" or "\r\n") is stripped, or holds anything but visible ASCII is an
 * error naming the flag and the file; so are two files holding the same
 * token. */
int pjs_access_create(const char *admin_token_file, const char *infer_token_file,
                      pjs_access **out, pjs_error *err);
void pjs_access_destroy(pjs_access *a);

/* One line for the start-up log each: which rule admin calls and inference
 * calls follow. */
void pjs_access_describe_admin(const pjs_access *a, char *buf, size_t size);
void pjs_access_describe_infer(const pjs_access *a, char *buf, size_t size);

/* The class of a gRPC method ("/inference.GRPCInferenceService/ModelInfer"). */
pjs_access_class pjs_access_grpc_class(const char *method);
/* Whether the table classifies the method (rather than the admin default). */
bool pjs_access_grpc_classified(const char *method);
/* The class of a REST or metrics path as libmicrohttpd hands it (decoded,
 * no query), split on '/' with empty segments ignored, as the router does. */
pjs_access_class pjs_access_rest_class(const char *url);

/* Finds the token in an Authorization value "Bearer <token>": the scheme in
 * any case, one or more spaces, then visible ASCII up to trailing spaces.
 * Returns 0 with *token pointing into value, or -1 when it is not that. */
int pjs_access_parse_bearer(const char *value, size_t len, const char **token,
                            size_t *token_len);

/* Whether a peer is loopback: an HTTP client's address, or a gRPC peer
 * string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000" or with the brackets
 * percent-encoded, "unix:/path"). Anything unparsable is not. */
bool pjs_access_sockaddr_is_loopback(const struct sockaddr *sa);
bool pjs_access_peer_is_loopback(const char *peer);

/* Whether the caller presented the admin token (exactly one well-formed
 * credential holding it); false when none is configured. */
bool pjs_access_holds_admin_token(const pjs_access *a, const pjs_access_caller *who);

/* The decision: 0, or PJS_ERR_UNAUTHENTICATED / PJS_ERR_PERMISSION_DENIED
 * with a message that says what to send or which flag to use. `what` names
 * the call in the message ("POST /v2/logging", "LogSettings"). */
int pjs_access_check(const pjs_access *a, pjs_access_class cls, const pjs_access_caller *who,
                     const char *what, pjs_error *err);

#endif
