/*
 * node.h - the supervisor of `pjserve node`: starts one worker process per
 * device, watches each, restarts one that goes down, and stops them all.
 *
 * One thread per worker owns that worker's whole life: it starts the
 * process (its stderr through a pipe, each line written to the node's
 * stderr behind "[worker N] "), waits on its pidfd, its stderr and a wake-up
 * descriptor at once, and probes GET /v2/health/live on the worker's REST
 * port every probe_interval_ms. A worker that exits, or whose probes fail
 * unhealthy_after times in a row once it has answered (a hung or stopped
 * process: the kernel still accepts its connections), is killed (SIGTERM,
 * SIGKILL after kill_grace_ms) and started again after a backoff, within a
 * restart budget (restart.h); past the budget it is `failed` and left down.
 * Under a gateway a worker is reported ready only once the gateway routes
 * to it (pjs_node_options.ready): "node ready" means the gateway reaches
 * every ready worker, so a change fanned out right after it reaches them.
 *
 * The state of every worker is kept under one lock, read by
 * pjs_node_status_json from any thread (the gateway's REST threads), and,
 * with a status file, written to it (temporary file + rename, both relative
 * to the run directory's descriptor) on every change.
 *
 * The caller blocks its stop signals (SIGINT, SIGTERM) before starting
 * anything, so every thread inherits the mask, and then waits in
 * pjs_node_run.
 * Workers start with an empty signal mask and get SIGTERM if the thread
 * that started them dies (PR_SET_PDEATHSIG), so a node killed with SIGKILL
 * does not leave them behind.
 */
#ifndef PJS_NODE_NODE_H
#define PJS_NODE_NODE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "node/restart.h"

typedef enum pjs_node_worker_state {
    PJS_NODE_STARTING,   /* started, has not answered a health probe yet */
    PJS_NODE_READY,      /* answers its health probes: serving */
    PJS_NODE_UNHEALTHY,  /* answered before, now misses probes */
    PJS_NODE_RESTARTING, /* down, waiting out its backoff */
    PJS_NODE_STOPPING,   /* told to stop (SIGTERM), draining */
    PJS_NODE_FAILED,     /* restart budget spent: left down */
} pjs_node_worker_state;

const char *pjs_node_worker_state_name(pjs_node_worker_state s);

/* One worker as the node starts it. Strings are copied by pjs_node_start. */
typedef struct pjs_node_worker_spec {
    const char *device;       /* shown in status: "cpu:0", "cuda:1" */
    char *const *argv;        /* NULL-terminated; argv[0] is the binary */
    char *const *env;         /* "KEY=VALUE" set in its environment; NULL-terminated or NULL */
    const char *probe_host;   /* its REST address for probes: "127.0.0.1" */
    int probe_port;
    const char *grpc, *http;  /* "host:port" shown in status */
} pjs_node_worker_spec;

/* The models ready on worker i (malloc'd array of malloc'd names, as
 * pjs_gw_pool_models); NULL with *n = 0 when none. */
typedef char **(*pjs_node_models_fn)(void *ctx, size_t worker, size_t *n);
/* Called after worker i was started again, and before the node kills a
 * worker it found unhealthy or once it found one gone: whatever routes to
 * the workers takes it out first, so no new request meets a process being
 * stopped. */
typedef void (*pjs_node_restarted_fn)(void *ctx, size_t worker);
/* Called from worker i's supervising thread when the worker, just started,
 * answers its first health probe; the node reports it ready only once this
 * returns true (the gateway has taken it into its routing), and asks again
 * at each probe until then. */
typedef bool (*pjs_node_ready_fn)(void *ctx, size_t worker);

typedef struct pjs_node_options {
    const pjs_node_worker_spec *workers;
    size_t n_workers;
    const char *routing;      /* shown in status: "round_robin" */
    /* The status file, rewritten on every change: status_name in the
     * directory open on status_dir_fd (the run directory, setup.h), made
     * and replaced relative to that descriptor; NULL name: none. */
    int status_dir_fd;
    const char *status_name;
    unsigned probe_interval_ms; /* [500] */
    unsigned probe_timeout_ms;  /* [1000] */
    unsigned unhealthy_after;   /* failed probes in a row [3] */
    unsigned kill_grace_ms;     /* SIGTERM to SIGKILL for a worker killed as unhealthy [2000] */
    unsigned stop_timeout_ms;   /* SIGTERM to SIGKILL when the node stops [30000] */
    pjs_node_restart_policy restart;
    /* With a gateway: where the models come from, whom to tell of a
     * restart, and who must agree that a worker is ready. NULL models: the
     * worker's own repository index (POST /v2/repository/index, ready
     * models), read at every probe. NULL ready: the health probe decides. */
    pjs_node_models_fn models;
    pjs_node_restarted_fn restarted;
    pjs_node_ready_fn ready;
    void *ctx;
} pjs_node_options;

typedef struct pjs_node pjs_node;

/* Starts every worker and its supervising thread. */
int pjs_node_start(const pjs_node_options *o, pjs_node **out, pjs_error *err);

/* Waits until one of `stop_signals` arrives (returns 0 with the signal in
 * *sig) or the node cannot go on (returns the exit status: 1 when every
 * worker failed, 2 when a worker refused its command line). */
int pjs_node_run(pjs_node *n, const sigset_t *stop_signals, int *sig);

/* Sends SIGTERM to every worker, waits for each to drain and exit (SIGKILL
 * after stop_timeout_ms), joins the threads. Idempotent. */
void pjs_node_stop(pjs_node *n);
void pjs_node_destroy(pjs_node *n);

/* The status document (docs/node.md) as a malloc'd JSON string; NULL when
 * out of memory. Any thread. */
char *pjs_node_status_json(pjs_node *n);

#endif
