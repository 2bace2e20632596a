/*
 * pool.h - the gateway's workers: where each model can be served, which
 * worker takes the next request for it, and whether a worker is fit to.
 *
 * A background thread probes every worker (ServerLive and the index of
 * its ready models, over gRPC) at a fixed interval. A worker is available when
 * its last probes answered and its circuit breaker is closed (or half-open
 * and letting a trial request through). Forwards report their outcome
 * with pjs_gw_pool_done: consecutive failures open the breaker, a success
 * closes it.
 *
 * Routing per model: round_robin over the available workers that hold the
 * model ready; lpt_packing over the workers the model is placed on
 * (placement.h). A request carrying a sequence key always goes to the
 * worker the first request of that sequence went to, while it is available;
 * a sequence's first request goes to the worker its key hashes to among
 * those available.
 *
 * Every function is thread-safe.
 */
#ifndef PJS_GATEWAY_POOL_H
#define PJS_GATEWAY_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* At most this many workers behind one gateway (routing uses bit masks). */
#define PJS_GW_MAX_WORKERS 64
/* Most models one worker's repository index may list; a worker listing more
 * is not taken (its probe fails), so a hostile or broken one cannot make
 * the routing table unbounded. */
#define PJS_GW_MAX_WORKER_MODELS 100000

typedef enum pjs_gw_routing {
    PJS_GW_ROUND_ROBIN,
    PJS_GW_LPT_PACKING,
} pjs_gw_routing;

const char *pjs_gw_routing_name(pjs_gw_routing r);
/* "round_robin" / "lpt_packing" -> 0 and *out; else -1. */
int pjs_gw_routing_parse(const char *s, pjs_gw_routing *out);

/* A worker as the gateway reaches it. */
typedef struct pjs_gw_worker_addr {
    char grpc[280];    /* "host:port" or "unix:/path" */
    char http[280];    /* "host:port" */
    char metrics[280]; /* "host:port" of its /metrics; "" when not scraped */
} pjs_gw_worker_addr;

/* Parses a --worker value: "grpc=HOST:PORT,http=HOST:PORT[,metrics=HOST:PORT]"
 * or "HOST" (gRPC 8001, HTTP 8000, metrics 8002). Errors say what was
 * expected. */
int pjs_gw_worker_addr_parse(const char *s, pjs_gw_worker_addr *out, pjs_error *err);

typedef enum pjs_gw_worker_state {
    PJS_GW_WORKER_STARTING,  /* never answered a probe yet */
    PJS_GW_WORKER_READY,     /* probes answer, breaker closed */
    PJS_GW_WORKER_UNHEALTHY, /* probes fail, or the breaker is open */
} pjs_gw_worker_state;

const char *pjs_gw_worker_state_name(pjs_gw_worker_state s);

/* How a forward to a worker went. */
typedef enum pjs_gw_outcome {
    PJS_GW_ANSWERED,  /* the worker answered (any status of its own) */
    PJS_GW_NOT_SENT,  /* provably never reached it: connect refused, refused before send */
    PJS_GW_BROKEN,    /* sent, then the connection failed or timed out without an answer */
} pjs_gw_outcome;

typedef struct pjs_gw_pool_options {
    const pjs_gw_worker_addr *workers;
    size_t n_workers;
    pjs_gw_routing routing;
    unsigned lpt_devices_per_model; /* K for lpt_packing; 0: 1 */
    unsigned probe_interval_ms;     /* 0: 500 */
    unsigned probe_timeout_ms;      /* 0: 2000 */
    unsigned unhealthy_after;       /* consecutive failed probes; 0: 3 */
    unsigned breaker_failures;      /* consecutive failed forwards that open the breaker; 0: 5 */
    unsigned breaker_open_ms;       /* before a trial request; 0: 2000 */
    const char *worker_token;       /* Bearer token for admin calls to workers; NULL: none */
    /* Workers found by DNS: every address `dns_name` resolves to, with these
     * ports, re-resolved every dns_refresh_ms (0: 10000). Addresses that
     * appear join (up to PJS_GW_MAX_WORKERS in the pool's life); those
     * that vanish get no traffic until they come back. NULL: none. */
    const char *dns_name;
    int dns_grpc_port, dns_http_port, dns_metrics_port; /* 0: 8001, 8000, 8002 */
    unsigned dns_refresh_ms;
    /* --strict-readiness: probes also ask each worker's ServerReady, and
     * pjs_gw_pool_ready holds only while every available worker said ready. */
    bool strict_readiness;
    /* Called (from the probe thread) after worker i joined. */
    void (*on_worker_added)(void *ctx, size_t i);
    void *ctx;
} pjs_gw_pool_options;

typedef struct pjs_gw_pool pjs_gw_pool;

int pjs_gw_pool_create(const pjs_gw_pool_options *o, pjs_gw_pool **out, pjs_error *err);
void pjs_gw_pool_destroy(pjs_gw_pool *p);

size_t pjs_gw_pool_size(const pjs_gw_pool *p);
pjs_gw_routing pjs_gw_pool_routing(const pjs_gw_pool *p);
/* The addresses of worker i (valid for the pool's life). */
const pjs_gw_worker_addr *pjs_gw_pool_addr(const pjs_gw_pool *p, size_t i);
/* Worker i's gRPC channel (valid for the pool's life). */
typedef struct grpc_channel grpc_channel;
grpc_channel *pjs_gw_pool_channel(const pjs_gw_pool *p, size_t i);
/* The token to send with admin calls forwarded to workers, or NULL. */
const char *pjs_gw_pool_worker_token(const pjs_gw_pool *p);

/* Requests sent again to another worker (the relay policy said the first
 * did not run it), per protocol, for pjserve_gateway_retries_total. */
typedef enum { PJS_GW_GRPC = 0, PJS_GW_HTTP = 1 } pjs_gw_protocol;
void pjs_gw_pool_count_retry(pjs_gw_pool *p, pjs_gw_protocol protocol);
uint64_t pjs_gw_pool_retries(const pjs_gw_pool *p, pjs_gw_protocol protocol);

/* The worker to forward one request for `model` to, never one in `tried`
 * (bit i: worker i), counted in flight until pjs_gw_pool_done: one holding
 * the model, or any available worker when none held it at the last probe
 * (it may have been loaded since; if not, the worker answers NOT_FOUND).
 * -1 with err UNAVAILABLE when no such worker is available. `sequence_key`
 * (may be NULL) pins a sequence to one worker. */
int pjs_gw_pool_pick(pjs_gw_pool *p, const char *model, const char *sequence_key, uint64_t tried,
                     pjs_error *err);
/* Any available worker (server-wide calls: metadata, index), or -1 with
 * UNAVAILABLE; counted in flight like a pick. */
int pjs_gw_pool_pick_any(pjs_gw_pool *p, uint64_t tried, pjs_error *err);
/* The available workers as a bit mask. */
uint64_t pjs_gw_pool_available(pjs_gw_pool *p);
/* The gateway's readiness: some worker is available and, under
 * strict_readiness, every available worker answered ServerReady true at its
 * last probe (each applies the strict rule to its own repository, so the
 * gateway is ready exactly when serve over that repository would be). */
bool pjs_gw_pool_ready(pjs_gw_pool *p);
/* A change the pool remembers, to bring a restarted worker up to date:
 * the last repository load or unload of each model (a load with its
 * `config` override) and its last residency that some worker accepted, in
 * the order they were made. A change is remembered when it is sent
 * (pending, so a worker restarted meanwhile gets it too) and settled by the
 * workers' answers: kept in place of the model's earlier one when some
 * worker accepted it, forgotten when none did. */
typedef enum pjs_gw_change_kind {
    PJS_GW_CHANGE_LOAD,
    PJS_GW_CHANGE_UNLOAD,
    PJS_GW_CHANGE_RESIDENCY,
} pjs_gw_change_kind;

typedef struct pjs_gw_change {
    pjs_gw_change_kind kind;
    const char *model;
    const char *config; /* LOAD: the override's JSON text; NULL: none */
    int residency;      /* RESIDENCY: a pjserve.control.v1.Residency value */
    /* Made by the node's repository watcher (pjs_gw_pool_apply_change), not
     * by a client: a worker started after it was decided read the
     * repository as it is since, so it is not sent to that worker again. */
    bool repository;
} pjs_gw_change;

/* Every worker not known to be down (starting, or ready whatever its
 * breaker says) and not a restarted one still being brought up to date,
 * each counted in flight like a pick: the targets of a change (load,
 * unload, shared memory registration). `change` (NULL: one not
 * remembered) is remembered, in the same step, for the workers restarted
 * later, as *change_seq (0: none), which the caller settles once every
 * worker answered. 0 with UNAVAILABLE when there is none. */
uint64_t pjs_gw_pool_take_not_down(pjs_gw_pool *p, const pjs_gw_change *change,
                                   uint64_t *change_seq, pjs_error *err);
/* The workers answered change `seq` (0: none): `accepted` when at least
 * one took it. */
void pjs_gw_pool_change_settled(pjs_gw_pool *p, uint64_t seq, bool accepted);
/* How the workers took a change made with pjs_gw_pool_apply_change. */
typedef struct pjs_gw_applied {
    unsigned accepted;  /* answered success (an unload: or that the model was not there) */
    unsigned refused;   /* answered an error */
    unsigned unreached; /* could not be reached; brought up to date when restarted */
    unsigned later;     /* still starting: sent the change once they answer */
    char refusal[512];  /* the first refusal's message; "" none */
} pjs_gw_applied;
/* Makes a change the node's repository watcher decided on every worker
 * not known to be down, and returns once each answered, remembered for
 * workers restarted later as pjs_gw_pool_take_not_down does (forgotten
 * when every worker that answered refused it). A worker still in its first
 * start is sent it when it is brought up to date (pjs_gw_pool_probe_worker).
 * A load goes as two generations, so that no client sees the model on a
 * worker that cannot serve it, nor a new version and then the old one:
 * while the first half of the workers loads, the model's requests go to the
 * others; once that half has it, to that half alone while the others load;
 * then to every worker that holds it. When the first half all refuse (a
 * broken bundle), the others are not asked: every worker keeps what it
 * served. An unload goes to every worker at once. The caller's thread
 * blocks (a load compiles); one change at a time. */
void pjs_gw_pool_apply_change(pjs_gw_pool *p, const pjs_gw_change *change, pjs_gw_applied *out);
/* Reports the outcome of a forward begun with a pick. */
void pjs_gw_pool_done(pjs_gw_pool *p, int worker, pjs_gw_outcome o);

/* Live figures of one worker, for node status and metrics. */
typedef struct pjs_gw_worker_view {
    pjs_gw_worker_state state;
    bool breaker_open;
    unsigned in_flight;
    uint64_t forwarded, failed;
    size_t n_models; /* models ready on it */
} pjs_gw_worker_view;
void pjs_gw_pool_view(pjs_gw_pool *p, size_t i, pjs_gw_worker_view *out);
/* The names of the models ready on worker i, as a malloc'd array of
 * malloc'd strings (free with pjs_gw_free_names). */
char **pjs_gw_pool_models(pjs_gw_pool *p, size_t i, size_t *n);
void pjs_gw_free_names(char **names, size_t n);
/* Probes worker i now, in the caller's thread, and records the result as
 * the probe thread would; true when the pool then counts it ready (the
 * node asks this before it reports a worker ready). A restarted worker is
 * first sent the remembered changes, in order; it is ready once it has
 * taken them all (a change it refuses is logged and passed over; one it
 * cannot be reached for is sent again at the next call). */
bool pjs_gw_pool_probe_worker(pjs_gw_pool *p, size_t i);
/* Worker i is being replaced: the node is about to stop it, found it gone,
 * or started it again (a new process, without the changes made through the
 * gateway). It gets no traffic and no new change until
 * pjs_gw_pool_probe_worker has brought it up to date; of the repository
 * watcher's changes, only those decided after the first of these calls are
 * sent (the new process loads the repository as it is when it starts). */
void pjs_gw_pool_worker_restarted(pjs_gw_pool *p, size_t i);

#endif
