/*
 * file_limit.h - the process's descriptor limit, raised at start and split
 * between the server's own needs and its client connections.
 *
 * pjserve serve raises the soft RLIMIT_NOFILE to the hard limit once, before
 * any thread starts, and splits it:
 *   - gRPC's connections live within the lowest (limit - reserve) / 2
 *     descriptors, so they and the server's own files together take at most
 *     half the table (frontend/grpc/conn_guard.c refuses the rest: gRPC 1.51
 *     has no connection cap, and an EMFILE stops its listener for good);
 *   - HTTP/REST and metrics bound their connections with their own caps
 *     (--http-max-connections, by default a quarter of the limit per port),
 *     the other half;
 *   - reserve descriptors (PJS_FILE_LIMIT_RESERVE, an eighth of a small
 *     limit) are left over for files opened later (models loaded by the
 *     watcher or the API, cache files) even when both sides are full.
 */
#ifndef PJS_CORE_FILE_LIMIT_H
#define PJS_CORE_FILE_LIMIT_H

#include <stdbool.h>

/* Descriptors kept for files opened while serving (an eighth of the limit
 * when that is smaller). */
#define PJS_FILE_LIMIT_RESERVE 128

typedef struct pjs_file_limit {
    long before;     /* soft limit found at start */
    long soft;       /* soft limit now */
    long hard;       /* hard limit (a large finite value stands for unlimited) */
    bool raised;     /* soft was raised */
    int set_errno;   /* why raising failed (0: it did not) */
    long reserve;    /* descriptors kept for the server itself */
    long grpc_share; /* the lowest descriptors gRPC's connections may take */
} pjs_file_limit;

/* Raises the soft limit to the hard one (or to the kernel's nr_open when
 * the hard limit is unlimited) and computes the split. Never fails: when
 * the limit cannot be raised the split is made on the current one and
 * set_errno says why. */
void pjs_file_limit_raise(pjs_file_limit *out);

/* The split alone, for a soft limit (exposed for tests). */
void pjs_file_limit_split(long soft, long *reserve, long *grpc_share);

#endif
