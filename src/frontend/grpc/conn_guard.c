/*
 * conn_guard.c - keeps gRPC's accepted connections below a ceiling of file
 * descriptors, so they cannot take the descriptors the rest of the server
 * needs (models, the plugin, HTTP connections, logs).
 *
 * gRPC 1.51 has no connection cap, and when accept(2) fails with EMFILE its
 * listener stops accepting for good (CVE-2023-4785, fixed upstream in 1.53;
 * Debian 12 ships 1.51.1 unpatched). What it offers is a socket mutator,
 * called on every accepted socket before the connection is built. Ours
 * shuts down (shutdown(2), both ways) a socket whose descriptor number is at
 * or above the ceiling: descriptors are allocated lowest first, so such a
 * number means every descriptor below it is in use. gRPC then sees the
 * connection end at once and closes it; the client gets UNAVAILABLE. The
 * mutator never fails, since a failure would also stop the listener.
 * Refusals are logged through a pjs_log_limiter (one line a second at most,
 * with a count of those dropped).
 *
 * A refused socket still holds its descriptor until gRPC closes it, which
 * happens only after its accept loop drained the listen queue: one burst
 * takes up to the queue's length in descriptors beyond the ceiling. The
 * guard therefore also shortens the listen queue (listen(2) again on the
 * listening sockets, which it learns from the same mutator) to `backlog`,
 * and sets the ceiling that far below gRPC's share of the file limit, so a
 * burst stays within the share.
 *
 * The mutator's layout is gRPC core's own (src/core/lib/iomgr/
 * socket_mutator.h, not installed): a vtable pointer and a gpr_refcount,
 * with four functions. It has been stable across many releases, but it is
 * not public, so the guard is installed only on the core version it was
 * checked against (29.x, gRPC 1.51); elsewhere start-up says it is off.
 */
#include "frontend/grpc/internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <grpc/support/sync.h>

#include "core/log.h"

/* The gRPC core ABI whose socket mutator layout this file mirrors. */
#define PJS_GRPC_GUARD_CORE_VERSION "29."

/* gRPC's grpc_fd_usage: how an fd handed to the mutator will be used. */
enum { GUARD_FD_SERVER_LISTENER = 1, GUARD_FD_SERVER_CONNECTION = 2 };
/* Listening sockets one port may have (IPv4 and IPv6 for a wildcard). */
#define GUARD_MAX_LISTENERS 8
/* Longest listen queue the guard leaves, and the shortest. */
#define GUARD_BACKLOG_MAX 128
#define GUARD_BACKLOG_MIN 16

typedef struct guard_socket_info {
    int fd;
    int usage; /* grpc_fd_usage */
} guard_socket_info;

typedef struct guard_vtable {
    bool (*mutate_fd)(int fd, grpc_socket_mutator *m);
    int (*compare)(grpc_socket_mutator *a, grpc_socket_mutator *b);
    void (*destroy)(grpc_socket_mutator *m);
    bool (*mutate_fd_2)(const guard_socket_info *info, grpc_socket_mutator *m);
} guard_vtable;

struct pjs_grpc_conn_guard {
    /* gRPC's struct grpc_socket_mutator: these two fields first, in order */
    const guard_vtable *vtable;
    gpr_refcount refcount; /* gRPC's references; ours is never dropped */

    int ceiling;              /* refuse descriptors >= this */
    int backlog;              /* listen queue length */
    pjs_log_limiter refusals; /* bounds the lines refusals write */
    int listeners[GUARD_MAX_LISTENERS]; /* written while binding (one thread) */
    int n_listeners;
    /* Bumped (release) after each socket handed to the mutator and read
     * (acquire) before the free: gRPC's own ordering of its pollers before
     * grpc_shutdown_blocking returns is invisible to ThreadSanitizer, since
     * the library is uninstrumented; this edge makes it visible. */
    atomic_uint sockets_seen;
};

static bool guard_mutate_fd(int fd, grpc_socket_mutator *m)
{
    (void)fd;
    (void)m;
    return true;
}

static int guard_compare(grpc_socket_mutator *a, grpc_socket_mutator *b)
{
    return a == b ? 0 : a < b ? -1 : 1;
}

/* gRPC never drops the last reference (the front end holds one); the guard
 * is freed by pjs__grpc_conn_guard_free once gRPC has shut down. */
static void guard_destroy(grpc_socket_mutator *m) { (void)m; }

static bool guard_mutate_fd_2(const guard_socket_info *info, grpc_socket_mutator *m)
{
    pjs_grpc_conn_guard *g = (pjs_grpc_conn_guard *)m;
    if (info->usage == GUARD_FD_SERVER_LISTENER && g->n_listeners < GUARD_MAX_LISTENERS)
        g->listeners[g->n_listeners++] = info->fd;
    if (info->usage != GUARD_FD_SERVER_CONNECTION || info->fd < g->ceiling) {
        atomic_fetch_add_explicit(&g->sockets_seen, 1, memory_order_release);
        return true;
    }
    shutdown(info->fd, SHUT_RDWR);
    pjs_log_limited(&g->refusals, PJS_LOG_WARN,
                    "gRPC: connection refused: descriptor %d is past gRPC's share of the file "
                    "limit (descriptors below %d; the rest is kept for the server); raise the "
                    "hard file limit (ulimit -Hn, LimitNOFILE=) or cap connections in a proxy "
                    "in front",
                    info->fd, g->ceiling);
    atomic_fetch_add_explicit(&g->sockets_seen, 1, memory_order_release);
    return true;
}

static const guard_vtable guard_functions = {
    .mutate_fd = guard_mutate_fd,
    .compare = guard_compare,
    .destroy = guard_destroy,
    .mutate_fd_2 = guard_mutate_fd_2,
};

/* The channel argument holds the guard itself; gRPC takes its own
 * references through the mutator's refcount. */
static void *guard_arg_copy(void *p) { return p; }
static void guard_arg_destroy(void *p) { (void)p; }
static int guard_arg_cmp(void *a, void *b) { return a == b ? 0 : a < b ? -1 : 1; }
static const grpc_arg_pointer_vtable guard_arg_functions = {
    .copy = guard_arg_copy, .destroy = guard_arg_destroy, .cmp = guard_arg_cmp};

pjs_grpc_conn_guard *pjs__grpc_conn_guard_create(int share)
{
    if (share <= 0)
        return NULL;
    const char *core = grpc_version_string();
    if (strncmp(core, PJS_GRPC_GUARD_CORE_VERSION, strlen(PJS_GRPC_GUARD_CORE_VERSION)) != 0) {
        pjs_warn("gRPC core %s: the descriptor guard is checked against core %sx (gRPC 1.51) "
                 "only and is off; gRPC connections are bounded by the file limit alone",
                 core, PJS_GRPC_GUARD_CORE_VERSION);
        return NULL;
    }
    pjs_grpc_conn_guard *g = calloc(1, sizeof *g);
    if (g == NULL)
        return NULL;
    g->vtable = &guard_functions;
    gpr_ref_init(&g->refcount, 1);
    g->backlog = share / 8 > GUARD_BACKLOG_MAX   ? GUARD_BACKLOG_MAX
                 : share / 8 < GUARD_BACKLOG_MIN ? GUARD_BACKLOG_MIN
                                                 : share / 8;
    g->ceiling = share > 2 * g->backlog ? share - g->backlog : share / 2;
    return g;
}

grpc_arg pjs__grpc_conn_guard_arg(pjs_grpc_conn_guard *g)
{
    grpc_arg a;
    memset(&a, 0, sizeof a);
    a.type = GRPC_ARG_POINTER;
    a.key = (char *)GRPC_ARG_SOCKET_MUTATOR;
    a.value.pointer.p = g;
    a.value.pointer.vtable = &guard_arg_functions;
    return a;
}

int pjs__grpc_conn_guard_ceiling(const pjs_grpc_conn_guard *g) { return g->ceiling; }

void pjs__grpc_conn_guard_listening(pjs_grpc_conn_guard *g)
{
    for (int i = 0; i < g->n_listeners; i++)
        if (listen(g->listeners[i], g->backlog) != 0)
            pjs_warn("gRPC: cannot shorten the listen queue of descriptor %d to %d: %s",
                     g->listeners[i], g->backlog, strerror(errno));
    g->n_listeners = 0;
}

void pjs__grpc_conn_guard_free(pjs_grpc_conn_guard *g)
{
    if (g == NULL)
        return;
    (void)atomic_load_explicit(&g->sockets_seen, memory_order_acquire);
    free(g);
}
