/*
 * setup.h - what `pjserve node` prepares before it starts its workers: the
 * devices to run them on, their private ports, the run directory and the
 * token the workers accept admin calls with.
 *
 * Called once, from the main thread, before any other thread exists.
 */
#ifndef PJS_NODE_SETUP_H
#define PJS_NODE_SETUP_H

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

/* Makes the run directory: `given` if not NULL, else
 * $XDG_RUNTIME_DIR/pjserve-node-PID or /tmp/pjserve-node-PID; mode 0700.
 * *created tells whether it was made here (and is removed at exit). */
int pjs_node_run_dir_create(const char *given, char *out, size_t size, int *created,
                            pjs_error *err);

/* Writes 32 random bytes, hex-encoded, as one line to `path` (created new,
 * mode 0600). The token is also copied to `token` (65 bytes). */
int pjs_node_write_token(const char *path, char token[65], pjs_error *err);

/* Reads the first line of a token file (as serve does) into a malloc'd
 * string; NULL when it cannot (serve then reports the problem). */
char *pjs_node_read_token(const char *path);

#endif
