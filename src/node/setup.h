/*
 * setup.h - what `pjserve node` prepares before it starts its workers: the
 * devices to run them on, their private ports, the run directory and the
 * token the workers accept admin calls with.
 *
 * Called once, from the main thread, before any other thread exists.
 */
#ifndef PJS_NODE_SETUP_H
#define PJS_NODE_SETUP_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

/* Most workers one node runs (the gateway's routing masks). */
#define PJS_NODE_MAX_WORKERS 64

/* What the PJRT plugin reports, from `pjserve info` run as a child process
 * (so the node itself never opens a device). */
typedef struct pjs_node_platform {
    char name[32];  /* "cpu", "cuda", "rocm" */
    size_t devices; /* addressable devices */
} pjs_node_platform;

/* Runs `exe info` with `args` (plugin flags) and reads its report. Errors
 * carry the child's message. */
int pjs_node_platform_probe(const char *exe, char *const *args, size_t n_args,
                            pjs_node_platform *out, pjs_error *err);

/* The environment variable that makes a worker see only one device of the
 * platform ("CUDA_VISIBLE_DEVICES"), or NULL when pjserve knows none (cpu). */
const char *pjs_node_visible_devices_variable(const char *platform);

/* Splits a --devices LIST ("0,1,3") into at most max entries of at most 31
 * characters each (letters, digits, '-', ':', '.'). Returns the count, or -1
 * with err. */
int pjs_node_parse_device_list(const char *list, char (*out)[32], size_t max, pjs_error *err);

/* Picks n distinct free TCP ports on 127.0.0.1 (bound together, then
 * released, so they differ from each other), none of the n_avoid ports in
 * `avoid` (ports the caller will listen on later, free until then). */
int pjs_node_free_ports(int *ports, size_t n, const int *avoid, size_t n_avoid, pjs_error *err);

/* The node's files in its run directory. */
#define PJS_NODE_STATUS_NAME "node-status.json"
#define PJS_NODE_STATUS_TMP_NAME "node-status.json.tmp"
#define PJS_NODE_TOKEN_NAME "worker-admin-token"
/* The Unix sockets worker i listens on in the run directory, when the node
 * has a gateway in front of its workers: "worker-<i>.<kind>", kind grpc,
 * http or metrics. Nothing listens on TCP for them: only this user can
 * enter the directory, so only this user can reach a worker. */
void pjs_node_worker_socket_name(char *buf, size_t size, size_t worker, const char *kind);

/* The run directory: private to the node's user, held open. Every file the
 * node makes there is made relative to `fd` (openat with O_NOFOLLOW and
 * O_EXCL, renameat, unlinkat), never by a path resolved again. Workers are
 * handed paths into it (`path`/NAME) and open them by path: that is safe
 * because the directory is this user's and mode 0700, so nobody else can
 * enter it or add, replace or rename an entry in it. */
typedef struct pjs_node_run_dir {
    int fd;                /* O_DIRECTORY, close-on-exec; -1: none */
    int parent_fd;         /* the directory holding it (for removing it); -1: none */
    char path[4096];       /* as workers are told it */
    char name[256];        /* its last component, in parent_fd */
    bool created;          /* made here: removed at exit */
} pjs_node_run_dir;

/* Opens the run directory, creating it when missing. Without `given`: a
 * fresh directory made by mkdtemp, pjserve-node-XXXXXX, under
 * $XDG_RUNTIME_DIR when that is a directory of this user's with mode 0700,
 * else under /tmp; a name nobody can predict or plant beforehand. With
 * `given`: made (mode 0700) if absent, then opened with O_NOFOLLOW (a
 * symbolic link is refused) and checked on the open descriptor: a directory
 * of this user's, no permission bits for group or others. Errors say what
 * to do. */
int pjs_node_run_dir_create(const char *given, pjs_node_run_dir *out, pjs_error *err);

/* Removes the node's files (the names above) from the run directory, and
 * the directory itself when it was made here; closes its descriptors. */
void pjs_node_run_dir_close(pjs_node_run_dir *d);

/* Writes 32 random bytes, hex-encoded, as one line to a new file `name` in
 * the directory dir_fd (an old one of that name is replaced; mode 0600;
 * never through a symbolic link). The token is also copied to `token` (65
 * bytes). */
int pjs_node_write_token(int dir_fd, const char *name, char token[65], pjs_error *err);

#endif
