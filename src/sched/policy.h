/*
 * policy.h - the scheduler's decisions, free of threads, devices and clocks.
 *
 * Each time the device frees up the dispatcher asks pjs_sched_next what to
 * run. The answer is a plan: one queue (a model's input-shape variant), the
 * compiled batch size to execute and the queued jobs that execute together,
 * plus the jobs dropped on the way (deadline passed, or under edf predicted
 * to miss it). Decision order:
 *
 *   1. A committed job (a meta model's sub-call) is dispatched first, oldest
 *      first; at most one per caller is in flight, so a meta in progress is
 *      never stalled behind newer work.
 *   2. Otherwise a queue is selected by the discipline:
 *      fifo  the queue holding the oldest job;
 *      edf   the queue whose most urgent job has the soonest deadline (jobs
 *            without one come last), fifo on ties; before coalescing, its
 *            jobs that would miss their deadline even in the cheapest
 *            measured execution holding them (plus the laxity margin) are
 *            shed, except that every PJS_SCHED_SHED_PROBE-th such job in a
 *            row runs to re-measure;
 *      fair  per-model shares. Each model's recent device time is a sum
 *            decaying with a half-life. Among models with queued work, a
 *            model's deficit is its weight share of their recent device
 *            time minus its own; its score is that deficit divided by the
 *            estimated cost of the execution it would run now (made cheaper
 *            by the coalescing discount when the execution serves many
 *            rows), so it counts executions-worth of time the model is owed.
 *            Scores are clamped to [-clamp, clamp] and ties go to the oldest
 *            job. A model whose queue was empty rejoins owed at most `clamp`
 *            executions, so time spent idle never buys a lockout of the
 *            others; since deficits sum to zero some queued model is always
 *            owed time, so none starves.
 *      Residency: a queue whose model's weights are not on the device
 *      (`cold`) costs its load on top of its execution wherever costs are
 *      weighed (fair scores, edf's shedding), and fair shares are charged
 *      the load time (pjs_sched_charge_load). When the discipline picks a
 *      cold queue while some resident model has queued work, the resident
 *      model's queue (the discipline's pick among resident ones) runs
 *      instead, as long as the cold queue's oldest job has waited less than
 *      cold_model_defer_ms and deferring cannot make any of its deadlines
 *      miss; so a cold model's requests gather while the device stays busy
 *      and one load serves them all. With weight_prefetch, once that bound
 *      is spent the resident queue still runs for up to as long again, and
 *      the plan names the cold queue (`cold_due`) so that the caller copies
 *      its weights beside that execution instead of stopping the device for
 *      the load; it runs when the copy is done (no longer cold) or when the
 *      second bound is spent too, whichever comes first.
 *   3. Coalescing: jobs are taken in FIFO order (committed jobs of the queue
 *      first), always including the oldest. When the queue holds at least
 *      the largest compiled size in rows, the largest size is filled. With
 *      fewer rows queued, each compiled size's FIFO prefix is a candidate
 *      (padded up to that size) and the one serving the most rows per
 *      estimated second wins; ties go to the one serving more rows. Queues
 *      of models without a batch axis run one job per execution.
 *
 * Costs: device time per (queue, compiled size) is an exponential moving
 * average of measured executions, seeded at load by a warm-up pass. A size
 * not yet measured is estimated from the nearest measured one, in proportion
 * to the batch size.
 *
 * Nothing here locks: the dispatcher holds its lock around every call. All
 * times are nanoseconds of one monotonic clock, passed in by the caller.
 */
#ifndef PJS_SCHED_POLICY_H
#define PJS_SCHED_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/job.h"
#include "sched/weight_cache.h"

/* Most compiled batch sizes a queue may have. */
#define PJS_SCHED_MAX_SIZES 32
/* edf: after this many requests of a queue shed in a row, the next one
 * predicted to miss runs anyway and re-measures the cost. */
#define PJS_SCHED_SHED_PROBE 8

typedef enum pjs_discipline {
    PJS_DISCIPLINE_FAIR = 0,
    PJS_DISCIPLINE_FIFO = 1,
    PJS_DISCIPLINE_EDF = 2,
} pjs_discipline;

const char *pjs_discipline_name(pjs_discipline d); /* "fair", "fifo", "edf" */
/* Parses "fair" / "fifo" / "edf"; -1 for anything else. */
int pjs_discipline_parse(const char *s);

/* Who runs the next execution when one ends and more work waits: with
 * hand-off (the default) a dispatcher worker is woken to take the device
 * while the thread that ran the last one answers its requests, so answering
 * overlaps the next execution; without, that thread answers first and then
 * takes the device itself, a thread wake-up less per execution. */
typedef enum pjs_hand_off {
    PJS_HAND_OFF_ON = 0,
    PJS_HAND_OFF_OFF = 1,
} pjs_hand_off;

const char *pjs_hand_off_name(pjs_hand_off h); /* "on", "off" */
/* Parses "on" / "off"; -1 for anything else. */
int pjs_hand_off_parse(const char *s);

typedef struct pjs_sched_config {
    pjs_discipline discipline;
    double half_life_s;           /* fair: half-life of recent device time, > 0 */
    double coalesce_discount;     /* fair: 0 (cost per execution) .. 1 (cost per row) */
    double fair_clamp;            /* fair: bound on |score|, >= 1 */
    double cost_smoothing;        /* weight of a new cost measurement, (0, 1] */
    uint64_t edf_laxity_margin_us;/* edf: shed when now + cost + margin > deadline */
    size_t max_queue_depth;       /* per model, requests; >= 1 */
    uint64_t default_timeout_us;  /* per model deadline when the request has none; 0 none */
    int warmup_runs;              /* executions per (variant, batch size) at load; >= 0 */
    double cold_model_defer_ms;   /* longest a cold queue yields to resident work; 0 never */
    pjs_eviction eviction;        /* the weight cache's policy */
    bool weight_prefetch;         /* copy the next cold model's weights during executions */
    pjs_hand_off hand_off;        /* see pjs_hand_off */
} pjs_sched_config;

/* The defaults: fair, half-life 1 s, discount 0.5, clamp 4, smoothing 0.2,
 * margin 0, depth 1024, no default timeout, 2 warm-up runs, cold models
 * deferred up to 10 ms, lfu eviction, weight prefetch on, hand-off on. */
void pjs_sched_config_defaults(pjs_sched_config *c);
/* Checks every field's range; the message names the field. */
int pjs_sched_config_check(const pjs_sched_config *c, pjs_error *err);

/* A model's share state, shared by its variants' queues. */
typedef struct pjs_sched_share {
    double weight;            /* > 0 */
    size_t max_queue_depth;   /* requests over all variants */
    size_t queued;            /* requests over all variants */
    double recent_ns;         /* decaying sum of device time, as of recent_at */
    uint64_t recent_at;
    size_t active_queues;     /* its non-empty queues */
    bool cold;                /* its weights are not on the device and would be
                                 loaded before it runs (set by the caller) */
    double load_ns;           /* EMA of its measured loads (pjs_sched_charge_load) */
} pjs_sched_share;

typedef struct pjs_sched_cost {
    double ns;                /* EMA of device time; valid when samples > 0 */
    uint64_t samples;
} pjs_sched_cost;

/* One queue: a model's variant. */
typedef struct pjs_sched_queue {
    pjs_sched_share *share;
    void *owner;              /* the dispatcher's model; unused here */
    size_t variant;
    size_t n_sizes;
    int64_t sizes[PJS_SCHED_MAX_SIZES]; /* compiled batch sizes, ascending */
    bool coalesce;            /* every input and output has a batch axis */
    pjs_sched_cost cost[PJS_SCHED_MAX_SIZES];

    pjs_sched_job *head, *tail;
    size_t length;            /* jobs */
    int64_t rows;
    size_t committed;         /* committed jobs queued here */
    unsigned shed_streak;     /* edf: jobs shed since the last execution */
    struct pjs_sched_queue *prev_active, *next_active; /* list of non-empty queues */
} pjs_sched_queue;

typedef struct pjs_sched {
    pjs_sched_config cfg;
    pjs_sched_queue *active;  /* non-empty queues */
    size_t committed;         /* committed jobs queued, all queues */
} pjs_sched;

/* What pjs_sched_next decided. Lists are linked through job->next. */
typedef struct pjs_sched_plan {
    pjs_sched_queue *queue;   /* NULL when nothing executes */
    size_t size_index;        /* into queue->sizes */
    int64_t batch_size;       /* compiled size executed */
    int64_t rows;             /* rows of the jobs below (<= batch_size; rest padding) */
    pjs_sched_job *jobs;      /* execute together, in row order */
    size_t n_jobs;
    pjs_sched_job *expired;   /* deadline passed: answer DEADLINE_EXCEEDED */
    pjs_sched_job *shed;      /* edf: predicted to miss: answer DEADLINE_EXCEEDED */
    pjs_sched_queue *cold_due; /* a cold queue whose turn this plan took: copy its
                                  weights beside it (see Residency); else NULL */
} pjs_sched_plan;

void pjs_sched_init(pjs_sched *s, const pjs_sched_config *cfg);

void pjs_sched_share_init(pjs_sched_share *sh, double weight, size_t max_queue_depth);
/* sizes ascending, 1 <= n_sizes <= PJS_SCHED_MAX_SIZES. */
void pjs_sched_queue_init(pjs_sched_queue *q, pjs_sched_share *sh, void *owner, size_t variant,
                          const int64_t *sizes, size_t n_sizes, bool coalesce);

/* Queues j (arrival_ns, deadline_ns, rows, committed set by the caller).
 * DEADLINE_EXCEEDED when the deadline already passed, RESOURCE_EXHAUSTED
 * when the model's queue depth is reached (committed jobs are exempt). */
int pjs_sched_enqueue(pjs_sched *s, pjs_sched_queue *q, pjs_sched_job *j, uint64_t now,
                      pjs_error *err);

/* Makes j committed if it is still queued in q (a meta's sub-call whose turn
 * to jump the line came while it waited as an ordinary request). False
 * when j is not in q (already dequeued) or committed already. */
bool pjs_sched_promote(pjs_sched *s, pjs_sched_queue *q, pjs_sched_job *j);

/* Decides the next execution. Returns false when every queue is empty.
 * It may return true with plan->queue NULL when every job it looked at was
 * dropped. */
bool pjs_sched_next(pjs_sched *s, uint64_t now, pjs_sched_plan *plan);

/* When no resident model has queued work, so that a cold model runs next:
 * the queue the discipline would pick among the cold ones (the one worth
 * prefetching). NULL otherwise: while resident work is queued, a cold
 * model's requests keep gathering (see Residency above), and loading it
 * early would serve fewer of them per load. Changes nothing. */
pjs_sched_queue *pjs_sched_next_cold(const pjs_sched *s, uint64_t now);

/* Records an execution's measured device time: the cost estimate of
 * (q, size_index) and the model's recent device time. */
void pjs_sched_record(pjs_sched *s, pjs_sched_queue *q, size_t size_index, uint64_t now,
                      uint64_t device_ns);
/* Records a load of the share's weights that took load_ns: its load cost
 * estimate, and its recent device time (fair shares pay for loads). */
void pjs_sched_charge_load(pjs_sched *s, pjs_sched_share *sh, uint64_t now, uint64_t load_ns);
/* Seeds the cost estimate (warm-up): replaces it with device_ns. */
void pjs_sched_seed_cost(pjs_sched_queue *q, size_t size_index, uint64_t device_ns);

/* Estimated device time of executing q at sizes[size_index]. */
double pjs_sched_estimate(const pjs_sched_queue *q, size_t size_index);
/* A share's recent device time decayed to now, as a fraction of the device
 * (1: it used the device all the time over the recent window). */
double pjs_sched_recent_utilization(const pjs_sched *s, const pjs_sched_share *sh, uint64_t now);

#endif
