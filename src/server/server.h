/*
 * server.h - what the front ends see of a running pjserve.
 *
 * A pjs_server owns the PJRT client, the model repository (every bundle in
 * one directory, compiled at start-up), the dispatcher (one execution at a
 * time on the device, by whoever holds its device token; requests wait in its
 * queues) and the client shared-memory registry. Front ends decode a request,
 * look the model up, validate and submit; the dispatcher completes the
 * request through its on_done callback, on the submitting thread (possibly
 * before submit returns) or on one of its workers.
 *
 * Every function here may be called from any thread once the server is
 * created. Shutdown is two-phase: pjs_server_drain stops admitting new
 * requests (they get UNAVAILABLE) and waits until every accepted request has
 * completed; then the front ends stop and pjs_server_destroy frees the rest.
 */
#ifndef PJS_SERVER_SERVER_H
#define PJS_SERVER_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/byte_budget.h"
#include "core/infer.h"
#include "core/lifecycle.h"
#include "core/shm.h"
#include "core/status.h"
#include "registry/model.h"
#include "runtime/runtime.h"
#include "server/config.h"

typedef struct pjs_server pjs_server;


typedef struct pjs_server_options {
    const char *repository;       /* directory of bundles (required) */
    const char *plugin_path;      /* NULL: the default plugin */
    const char *cache_dir;        /* NULL: the default executable cache */
    bool no_cache;
    const pjs_rt_option *pjrt_options;
    size_t n_pjrt_options;
    bool allow_client_shm;
    /* The name ServerMetadata reports (--server-name; at most
     * PJS_SERVER_NAME_MAX bytes); NULL: "pjserve". */
    const char *server_name;
    /* Where sampled requests' spans go (--trace-endpoint); NULL: tracing
     * off. Owned by the caller; it outlives the server. */
    struct pjs_tracer *tracer;
    int dispatch_workers;         /* threads that take the device and finish requests
                                     when submitting threads do not; 0: a default */
    const pjs_server_config *config; /* scheduler and model policies; NULL: defaults */
    pjs_control_mode control_mode;
    uint64_t repository_poll_ms;  /* dynamic: how often the repository is scanned; 0: 1000 */
    /* Dynamic mode without a watcher of this process's own: another one
     * (pjserve node's) applies the repository's changes through the
     * repository API. */
    bool repository_watched_outside;
    /* Device weight-cache budget in bytes; 0: derived from the device's
     * memory with weight_fraction (pjs_weight_budget), unlimited when the
     * device reports none (the CPU plugin). */
    uint64_t device_weight_budget;
    double weight_fraction;       /* share of device memory for weights; 0: 0.8 */
    /* Host memory for `host` models' floors; 0: no host tier (every floor
     * kept for its model's life). */
    uint64_t host_weight_budget;
    /* Models with series of their own in /metrics (the rest in totals);
     * 0: PJS_DEFAULT_METRICS_MODELS; SIZE_MAX: every model. */
    size_t metrics_models;
    /* Largest request a front end accepts, counted after decompression;
     * 0: PJS_DEFAULT_MAX_REQUEST_BYTES. At most PJS_MAX_REQUEST_BYTES_LIMIT. */
    uint64_t max_request_bytes;
    /* Bytes of requests held at once across front ends (bodies being
     * received and decoded); 0: 4 x max_request_bytes. */
    uint64_t max_inflight_request_bytes;
    /* Client shared-memory regions registered at once and their total
     * byte_size (--max-shm-regions, --max-shm-bytes); 0: the defaults of
     * core/shm.h. */
    uint64_t max_shm_regions;
    uint64_t max_shm_bytes;
    /* Models whose load may wait for the load thread at once (loads asked
     * for while one runs; --max-pending-loads); 0: PJS_DEFAULT_MAX_PENDING_LOADS. */
    uint64_t max_pending_loads;
    /* Meta models whose run may be inside its stages at once (the gate;
     * --meta-concurrency, PJSERVE_META_CONCURRENCY); 0: PJS_DEFAULT_META_CONCURRENCY.
     * Compute-only metas (empty meta.calls) do not take a permit. */
    int meta_concurrency;
    /* Bytes of the scratch pool meta runs take reuse buffers from
     * (--meta-scratch-bytes); 0: no pool, scratch buffers are plain memory. */
    uint64_t meta_scratch_bytes;
    /* Directory on a tmpfs where the node's workers share one host copy of
     * each bundle's weights (--shared-weights; registry/weight_store.h), and
     * the group that may share it (--shared-weights-group); NULL: every
     * model's host weights are private memory. */
    const char *shared_weights_dir;
    const char *shared_weights_group;
    /* What pjs_server_ready asks (--strict-readiness, as Triton's): true,
     * every model that should be loaded is READY; false, the server is up
     * and serving, whatever loaded. */
    bool strict_readiness;
} pjs_server_options;

/* Longest --server-name. */
#define PJS_SERVER_NAME_MAX 64

#define PJS_DEFAULT_META_CONCURRENCY 2

#define PJS_DEFAULT_MAX_PENDING_LOADS 64

#define PJS_DEFAULT_MAX_REQUEST_BYTES (256ULL << 20)
#define PJS_MAX_REQUEST_BYTES_LIMIT (2ULL << 30)

/* Loads the plugin, creates the client, loads and compiles every bundle of
 * the repository (logging progress and each refusal; a bad bundle does not
 * stop the others) and starts the dispatcher; in dynamic mode also the
 * repository watcher (server/watcher.h), which pjs_server_drain stops. Fails
 * only when the server cannot run at all (no plugin, no repository
 * directory). */
int pjs_server_create(const pjs_server_options *o, pjs_server **out, pjs_error *err);
/* Drains (if not done yet), stops the dispatcher and frees everything. */
void pjs_server_destroy(pjs_server *s);

/* Stops admitting requests and waits until every accepted one completed. */
void pjs_server_drain(pjs_server *s);
bool pjs_server_live(const pjs_server *s);
/* Live and not draining; with strict_readiness also every model of the
 * repository that should be loaded is READY: models unloaded on request do
 * not count, nor metas and ensembles whose only missing calls were
 * unloaded on request; a failed load counts, and so does a meta or an
 * ensemble calling a model that failed or left the repository. */
bool pjs_server_ready(pjs_server *s);

const char *pjs_server_version(void);          /* "0.1.0" */
const char *pjs_server_name(const pjs_server *s); /* "pjserve", or --server-name */
const char *pjs_server_platform(const pjs_server *s); /* "cpu", "cuda" */
pjs_shm_registry *pjs_server_shm(pjs_server *s);
/* The tracer (NULL: tracing off). */
struct pjs_tracer *pjs_server_tracer(const pjs_server *s);

/* A request's spans (server/request_trace.c). pjs_server_trace_start, once
 * the front end decoded the request, decides whether it is traced: from
 * its traceparent value (NULL: none) or the tracer's rate, into r->trace.
 * pjs_server_trace_finish records the spans of a traced request once it is
 * answered (its server span ends at end_ns; err NULL or PJS_OK: success):
 * the request's own span, named "<protocol> <model>", and as its children
 * decode, queue, execute (with the batch it rode in) and respond, from
 * r->times. No-ops for a request that is not sampled. */
void pjs_server_trace_start(pjs_server *s, pjs_infer_request *r, const char *traceparent,
                            size_t len);
void pjs_server_trace_finish(pjs_server *s, const pjs_infer_request *r, const char *protocol,
                             uint64_t end_ns, const pjs_error *err);
/* The spans of executed request r under `parent`: queue and execute. */
void pjs_server_trace_execution(pjs_server *s, const pjs_trace_ctx *parent,
                                const pjs_infer_request *r);
/* The request byte cap (--max-request-bytes) and the budget of request bytes
 * in flight that every front end takes from (--max-inflight-request-bytes). */
uint64_t pjs_server_max_request_bytes(const pjs_server *s);
pjs_byte_budget *pjs_server_request_budget(pjs_server *s);

/* The model `name` at `version` ("" or NULL: the latest, i.e. "1"), with a
 * reference the caller releases with pjs_model_unref. NOT_FOUND for an
 * unknown model or version; UNAVAILABLE for a model that is not loaded
 * (the message says why: unloaded, or its load error). */
int pjs_server_get_model(pjs_server *s, const char *name, const char *version, pjs_model **out,
                         pjs_error *err);

/* Validates r (its model set by the caller, with a reference) and queues it.
 * On success on_done will be called exactly once (with r->error
 * DEADLINE_EXCEEDED when the deadline passed while queued); on failure it is
 * not, and the caller answers with err (INVALID_ARGUMENT, UNSUPPORTED,
 * UNAVAILABLE when draining, RESOURCE_EXHAUSTED when the model's queue is
 * full, DEADLINE_EXCEEDED when the deadline already passed). */
int pjs_server_submit(pjs_server *s, pjs_infer_request *r, pjs_error *err);

/* A caller of committed requests (a meta model's orchestration): at most
 * one of its requests is in flight at a time. Zero-initialize before use. */
typedef struct pjs_committed_caller {
    _Atomic bool in_flight;
} pjs_committed_caller;

/* As pjs_server_submit, but the request is dispatched ahead of the
 * discipline's choice, is exempt from the queue depth and from edf's
 * predictive shedding (its deadline still holds).
 * FAILED_PRECONDITION when `caller` already has a request in flight. */
int pjs_server_submit_committed(pjs_server *s, pjs_infer_request *r,
                                pjs_committed_caller *caller, pjs_error *err);

/* The scheduler's view of a model now. */
typedef struct pjs_model_sched_info {
    double weight;              /* its fair-share weight */
    size_t max_queue_depth;     /* its queue bound */
    uint64_t default_timeout_us;/* deadline of requests carrying none; 0: none */
    uint64_t queue_depth;       /* requests queued, all variants */
    uint64_t in_flight;         /* requests queued or running, not yet finished */
    double recent_utilization;  /* share of device time over the recent window, 0..1 */
} pjs_model_sched_info;
void pjs_server_model_sched_info(pjs_server *s, pjs_model *m, pjs_model_sched_info *out);
/* The discipline in use ("fair", "fifo", "edf"). */
const char *pjs_server_discipline(const pjs_server *s);

/* ---- residency (the device weight cache) ---------------------------------- */

pjs_control_mode pjs_server_control_mode(const pjs_server *s);

/* A model's weights: its floor (manifest `residency`, or as last set), whether
 * they are on the device now, and the cache's counters for it. */
typedef struct pjs_model_residency_info {
    pjs_residency residency;    /* DEVICE: pinned on the device; HOST: host floor,
                                   on the device on demand; UNPINNED: no host floor */
    bool resident;              /* weights on the device now */
    uint64_t weight_bytes;
    uint64_t loads;             /* host-to-device weight loads */
    uint64_t evictions;
    uint64_t load_ns;           /* total time of those loads */
    bool in_host;               /* its host floor is in host memory now */
    uint64_t host_bytes;        /* what its floor takes there */
    uint64_t host_loads;        /* floors read from the file by the host tier */
    uint64_t host_evictions;    /* floors dropped by it */
    uint64_t host_load_ns;      /* total time of those reads */
} pjs_model_residency_info;
void pjs_server_model_residency(pjs_server *s, pjs_model *m, pjs_model_residency_info *out);

typedef struct pjs_weight_cache_info {
    uint64_t budget_bytes;      /* UINT64_MAX: unlimited */
    uint64_t used_bytes;        /* resident weights of on-demand (non-pinned) models */
    uint64_t pinned_bytes;      /* resident weights of device-pinned models */
    uint64_t changes;           /* loads + evictions so far: equal before and after
                                   reading models' residency = a consistent set */
    /* The host tier (--host-weight-budget): UINT64_MAX without one. */
    uint64_t host_budget_bytes;
    uint64_t host_used_bytes;   /* floors of `host` models in host memory */
    uint64_t host_pinned_bytes; /* floors of `device` models (outside the budget) */
    uint64_t host_changes;      /* floors read + dropped so far */
} pjs_weight_cache_info;
void pjs_server_weight_cache_info(pjs_server *s, pjs_weight_cache_info *out);

/* Models given series of their own in /metrics (0: every model). */
#define PJS_DEFAULT_METRICS_MODELS 1000
size_t pjs_server_metrics_models(const pjs_server *s);

/* Moves model `name` to `target` (runs under the device token, between
 * executions; returns when done): DEVICE uploads and pins its weights
 * (outside the budget); HOST makes them evictable (explicit mode: frees
 * them from the device); UNPINNED also drops the host floor. NOT_FOUND /
 * UNAVAILABLE as pjs_server_get_model. */
int pjs_server_set_residency(pjs_server *s, const char *name, pjs_residency target,
                             pjs_error *err);

/* Frees every resident non-pinned model's device weights at once (so the
 * device allocator can coalesce), then loads the models named in reload
 * (n may be 0). Sets *reloaded to how many were loaded again. */
int pjs_server_compact(pjs_server *s, const char *const *reload, size_t n, size_t *reloaded,
                       pjs_error *err);

/* Changes a loaded model's scheduling policy now: fields of p that are set
 * (weight > 0, max_queue_depth > 0, default_timeout_us >= 0) replace the
 * current ones; p->name is ignored. */
int pjs_server_set_model_policy(pjs_server *s, const char *name, const pjs_model_policy *p,
                                pjs_error *err);


typedef struct pjs_repository_entry {
    char name[256];
    pjs_model_state state;
    char reason[512];
} pjs_repository_entry;


/* Every bundle directory of the repository (loaded or not) and every loaded
 * model, sorted by name, into out[cap]; returns the count (may exceed cap;
 * out may be NULL when cap is 0). A meta or an ensemble is READY exactly
 * when pjs_server_get_model hands it out: while a model it calls does not
 * serve it is UNAVAILABLE, the reason naming that model. */
size_t pjs_server_repository_index(pjs_server *s, bool ready_only, pjs_repository_entry *out,
                                   size_t cap);
/* The same into a malloc'd array (*out, free it; NULL when empty). */
int pjs_server_repository_list(pjs_server *s, bool ready_only, pjs_repository_entry **out,
                               size_t *n_out, pjs_error *err);
/* Called once when a queued load finished, on a load thread: err->code 0
 * when the model was loaded and swapped in, else the load error. */
typedef void (*pjs_server_load_done)(void *arg, const pjs_error *err);
/* Queues a (re)load of bundle `name` from the repository on the server's
 * load thread (loads never compile on a front end's threads); done(arg, ..)
 * is called once when it finished. A load of a model already queued or
 * running is joined: one compile, and every caller gets its result. The new
 * version is compiled and swapped in (requests in flight finish on the old
 * one); when it fails to load, a version that serves keeps serving. Fails
 * at once, without calling done: NOT_FOUND when the repository has no such
 * directory, RESOURCE_EXHAUSTED when max_pending_loads models already wait
 * (--max-pending-loads), UNAVAILABLE once draining. */
int pjs_server_load_model_async(pjs_server *s, const char *name, pjs_server_load_done done,
                                void *arg, pjs_error *err);
/* The same with a configuration override: `config` (config_len bytes of
 * Triton's ModelConfig as JSON, see server/load_config.h) applies to the
 * version this load serves, and a later load without one returns to the
 * bundle's settings. A config that does not parse, or names what pjserve
 * cannot apply, is refused at once (INVALID_ARGUMENT); one that disagrees
 * with the bundle fails the load (INVALID_ARGUMENT, before compiling). A
 * load joins a queued one only when both have the same config (or none). */
int pjs_server_load_model_config_async(pjs_server *s, const char *name, const char *config,
                                       size_t config_len, pjs_server_load_done done, void *arg,
                                       pjs_error *err);
/* The same, waiting for the result; for threads that may block (the
 * repository watcher), never a front end's. */
int pjs_server_load_model(pjs_server *s, const char *name, pjs_error *err);
/* Marks `name` unavailable; queued requests still complete. When its
 * bundle directory is gone, drops it from the repository instead, as
 * pjs_server_remove_model (the index no longer lists it): what the
 * repository watcher does with a removed bundle, and how `pjserve node`'s
 * watcher has its workers do the same. */
int pjs_server_unload_model(pjs_server *s, const char *name, pjs_error *err);
/* Drops `name` from the repository (its bundle directory is gone): the
 * index no longer lists it, lookups get NOT_FOUND, requests already
 * admitted complete on the model they hold. NOT_FOUND when not listed. */
int pjs_server_remove_model(pjs_server *s, const char *name, pjs_error *err);

/* Counters for the whole server (Prometheus). */
typedef struct pjs_server_counters {
    uint64_t queue_depth;      /* requests waiting now */
    uint64_t in_flight;        /* accepted and not yet completed */
    uint64_t plans_inline;     /* executions (and drops) run by the submitting thread */
    uint64_t plans_worker;     /* ... run by a dispatcher worker */
    uint64_t weight_prefetches; /* weight copies started beside executions */
    /* CUDA shared memory bytes executions read in place and wrote device to
     * device (pjs_dispatcher_shm_device_bytes). */
    uint64_t shm_device_in_bytes, shm_device_out_bytes;
    /* Spans of sampled requests: exported, and dropped with a full export
     * queue or a collector that refused them (trace/trace.h); 0 without a
     * tracer. */
    uint64_t trace_spans_exported, trace_spans_dropped_full, trace_spans_dropped_failed;
    /* Meta runs (server/meta_gate.h) and their scratch pool. */
    uint64_t meta_permits;          /* --meta-concurrency */
    uint64_t meta_running_gated;    /* runs holding a permit now */
    uint64_t meta_running_compute;  /* compute-only runs now */
    uint64_t meta_waiting;          /* runs waiting for a thread now */
    uint64_t meta_peak_gated;       /* most runs ever holding a permit at once */
    uint64_t meta_completed;        /* runs returned */
    uint64_t meta_expired;          /* dropped at their deadline while waiting */
    uint64_t scratch_budget_bytes;  /* 0: no pool (plain memory) */
    uint64_t scratch_used_bytes;
    uint64_t scratch_peak_bytes;
    uint64_t scratch_waited;        /* acquisitions that waited for room */
    uint64_t scratch_timed_out;     /* ... whose deadline passed first */
    pjs_tier_stats tiers; /* executed requests by the tier their model was in */
} pjs_server_counters;
void pjs_server_get_counters(pjs_server *s, pjs_server_counters *out);

/* Calls fn for each loaded model (with a reference held during the call),
 * the models only metas call (internal) included: what operators see. */
void pjs_server_foreach_model(pjs_server *s, void (*fn)(pjs_model *m, void *ctx), void *ctx);
/* The same without internal models: what clients may see. */
void pjs_server_foreach_public_model(pjs_server *s, void (*fn)(pjs_model *m, void *ctx),
                                     void *ctx);

#endif
