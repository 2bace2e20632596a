/*
 * meta_gate.h - the threads meta models run on, and the gate that bounds how
 * many of them are inside their stages at once.
 *
 * A meta model's run is an orchestration: C code between sub-calls that
 * block until a stage has executed. It never runs on a front end's thread.
 * The caller embeds a pjs_meta_job in its own request state and submits it:
 *
 *   - gated jobs (metas that call sub-models) run on exactly `permits`
 *     gate threads, in submission order, so at most `permits` of them run
 *     at once, ever (--meta-concurrency: a running job holds a permit for
 *     its whole run, glue between stages included);
 *   - compute-only jobs (metas with empty meta.calls, which issue no
 *     sub-calls) bypass the permits and run on `compute_threads` threads of
 *     their own, so a long compute-only run never holds a permit that a
 *     meta with stages needs.
 *
 * Compute threads may be shared between clients (pjs_meta_gate_share): a
 * job names its client (the stream it came on; NULL: a client of its own),
 * one client has at most `per_client` jobs running and `per_client_waiting`
 * waiting, and a thread takes the oldest waiting job whose client is under
 * its share, so a client's excess waits behind everyone else's first jobs.
 * When a job its client may run finds every compute thread busy, another
 * is started, up to `max_threads` (started threads stay). So runs that hold
 * their thread for long, waiting between responses, take threads of their
 * own instead of every thread: filling `max_threads` takes
 * max_threads / per_client clients.
 *
 * Admission sheds a backlog instead of piling it up. A job whose deadline
 * has already passed is refused by submit (DEADLINE_EXCEEDED, no callback);
 * a job still waiting for a thread when its deadline passes is not run:
 * its `expire` callback is called at the deadline (a watchdog thread wakes
 * for the earliest deadline waiting), with DEADLINE_EXCEEDED and a message
 * saying how long it waited and that every permit was held. Each queue
 * holds at most `max_waiting` jobs; one more is refused RESOURCE_EXHAUSTED.
 *
 * Threads: any thread may submit and read the counters. `run` is called on
 * a gate thread (gated) or a compute thread; `expire` on the watchdog
 * thread or on the thread that took the job off its queue. Exactly one of
 * them is called once per accepted job, never from inside submit. The
 * gate does not touch a job once it has called either, so both may free
 * it. pjs_meta_gate_drain stops admitting (later submits: UNAVAILABLE) and
 * waits until every accepted job has run or expired (queued jobs are not
 * dropped: they run, or expire at their deadline); destroy drains first,
 * then joins the threads. Neither may be called from a job's callback.
 */
#ifndef PJS_SERVER_META_GATE_H
#define PJS_SERVER_META_GATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct pjs_meta_gate pjs_meta_gate;
typedef struct pjs_meta_job pjs_meta_job;

/* Waiting jobs each queue holds when create is given 0: with runs of
 * ~10 ms and 2 permits, about 5 s of backlog, well past any useful
 * deadline, so the bound only matters for requests without one. */
#define PJS_META_GATE_DEFAULT_MAX_WAITING 1024
/* Largest permits or compute_threads (each one is a thread). */
#define PJS_META_GATE_MAX_THREADS 1024

/* A job: the caller sets run and expire, embeds the struct in its own
 * state (container_of-style) and leaves the rest to the gate. */
struct pjs_meta_job {
    /* The orchestration; called once on a gate or compute thread. */
    void (*run)(pjs_meta_job *job);
    /* Called once instead of run when the deadline passed while the job
     * waited; err is DEADLINE_EXCEEDED with a message for the client (the
     * callee may prefix it, e.g. with the model's name). */
    void (*expire)(pjs_meta_job *job, pjs_error *err);
    /* Set by the caller before submit: who the job is for, compared with
     * other jobs' (never dereferenced); NULL: a client of its own. */
    const void *client;

    /* The gate's, from submit until run or expire is called. */
    pjs_meta_job *prev, *next;
    uint64_t deadline_ns;  /* pjs_now_ns() time; 0: none */
    uint64_t submitted_ns;
};

/* Counters for metrics; a consistent snapshot. */
typedef struct pjs_meta_gate_counters {
    uint64_t permits;          /* gate threads (--meta-concurrency) */
    uint64_t compute_threads;  /* started now */
    uint64_t running_gated;    /* gated jobs inside run now (<= permits) */
    uint64_t running_compute;  /* compute-only jobs inside run now */
    uint64_t waiting_gated;    /* queued for a permit now */
    uint64_t waiting_compute;  /* queued for a compute thread now */
    uint64_t peak_gated;       /* most gated jobs ever inside run at once */
    uint64_t completed;        /* runs returned, both kinds */
    uint64_t expired;          /* dropped at their deadline while waiting */
    uint64_t refused;          /* refused by submit: past deadline, full, draining */
} pjs_meta_gate_counters;

/* Starts `permits` gate threads (0..PJS_META_GATE_MAX_THREADS: a gate of
 * compute threads alone has none, and refuses gated jobs), `compute_threads`
 * compute threads (1..PJS_META_GATE_MAX_THREADS) and the watchdog. max_waiting bounds each
 * queue (0: PJS_META_GATE_DEFAULT_MAX_WAITING). `name` labels messages
 * ("meta gate"). INVALID_ARGUMENT for counts out of range; NOMEM/INTERNAL
 * when threads cannot start. */
int pjs_meta_gate_create(const char *name, int permits, int compute_threads, size_t max_waiting,
                         pjs_meta_gate **out, pjs_error *err);

/* Shares the compute threads between clients (see the top): from now on
 * their number grows on demand from compute_threads up to max_threads,
 * one client has at most per_client compute jobs running and
 * per_client_waiting waiting (0: no bound). Called once, after create and
 * before the first submit. INVALID_ARGUMENT for values out of range. */
int pjs_meta_gate_share(pjs_meta_gate *g, int max_threads, int per_client,
                        size_t per_client_waiting, pjs_error *err);

/* Queues job (run and expire set) as gated (it takes a permit) or
 * compute-only, with deadline_ns (pjs_now_ns() time, 0: none). On success
 * exactly one of job->run / job->expire will be called, on another thread.
 * On failure neither is, and err says why: DEADLINE_EXCEEDED when the
 * deadline has passed already, RESOURCE_EXHAUSTED when max_waiting jobs
 * already wait in that queue (or per_client_waiting of its client's),
 * UNAVAILABLE once draining. */
int pjs_meta_gate_submit(pjs_meta_gate *g, pjs_meta_job *job, bool gated, uint64_t deadline_ns,
                         pjs_error *err);

/* Stops admitting and waits until every accepted job has run or expired.
 * Idempotent. */
void pjs_meta_gate_drain(pjs_meta_gate *g);
/* Drains, joins the threads and frees the gate; NULL is a no-op. */
void pjs_meta_gate_destroy(pjs_meta_gate *g);

void pjs_meta_gate_get_counters(pjs_meta_gate *g, pjs_meta_gate_counters *out);

#endif
