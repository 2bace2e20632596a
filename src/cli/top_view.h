/*
 * top_view.h - what `pjserve top` shows, without a network or a terminal:
 * a snapshot of a server read from its /metrics (and, where the metrics
 * lack it, its model control and node status documents), the rates between
 * two snapshots, the rows sorted and filtered, and the screen as lines of
 * text or the view as JSON.
 *
 * Behind a gateway (pjserve node with several workers) every sample carries
 * a `worker` label: a model's counters and gauges are summed over the
 * workers, and the weight cache and device time are kept per worker as
 * well. Counters that went down between two snapshots (a restarted worker)
 * count from zero. No threads; everything belongs to its caller.
 */
#ifndef PJS_CLI_TOP_VIEW_H
#define PJS_CLI_TOP_VIEW_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "cli/prom_text.h"
#include "core/status.h"

#define PJS_TOP_MAX_MODELS 4096
#define PJS_TOP_MAX_WORKERS 64
#define PJS_TOP_NAME_MAX 128

/* One model's series, summed over the workers that report it. */
typedef struct pjs_top_model {
    char name[PJS_TOP_NAME_MAX];
    double success, failure;     /* requests answered (counters) */
    double request_us, queue_us; /* their cumulative durations (counters) */
    double device_s;             /* device time of its executions (counter) */
    double loads, evictions;     /* of its weights (counters) */
    double queue_depth, in_flight, resident_bytes; /* gauges */
    double qwait_p50_s, qwait_p99_s; /* queue wait summary, the largest over workers */
    bool has_qwait;
    unsigned workers, resident_on;   /* workers reporting it; of them, with weights on the device */
    unsigned in_host_on;             /* of them, with its floor in host memory */
    char residency[16];              /* device, host, unpinned (control status), or "" */
    double weight_bytes;             /* from the control status; 0 when unknown */
} pjs_top_model;

/* One worker (a serve process): its weight cache and device time. */
typedef struct pjs_top_worker {
    int id;                    /* the `worker` label; 0 without a gateway */
    bool has_cache;
    double budget_bytes, used_bytes, pinned_bytes; /* budget +Inf: unlimited */
    double device_s, loads, evictions, prefetches;
    /* Its host tier (--host-weight-budget), when it has one: floors in
     * host memory, and floors read from files so far. */
    bool has_host_tier;
    double host_budget_bytes, host_used_bytes, host_loads;
    /* From the node status, when there is one. */
    char state[16], device[32];
    long long pid, restarts;   /* pid -1: none running */
    size_t n_models;
    bool unscraped;            /* its gateway has no metrics address for it */
} pjs_top_worker;

typedef struct pjs_top_snapshot {
    double at_s;               /* monotonic time of the scrape */
    pjs_top_model *models;     /* sorted by name */
    size_t n_models;
    pjs_top_worker workers[PJS_TOP_MAX_WORKERS]; /* sorted by id */
    size_t n_workers;
    bool gateway;              /* samples carry a worker label */
    bool node;                 /* a node status was applied */
    bool has_device_time;      /* pjserve_model_device_seconds_total was seen */
    char discipline[32];       /* pjserve_scheduler_info, or "" */
    double queue_depth, in_flight; /* server gauges, summed */
} pjs_top_snapshot;

/* Builds a snapshot from parsed metrics. FAILED_PRECONDITION when the text
 * holds none of pjserve's or Triton's per-model families (not a pjserve
 * metrics port). */
int pjs_top_snapshot_from_metrics(const pjs_prom_doc *doc, double at_s, pjs_top_snapshot *out,
                                  pjs_error *err);

/* Adds the residency and weight size of each model from a model control
 * status document ({"models": [{"name", "residency", "weight_bytes"}]}). */
void pjs_top_snapshot_apply_control(pjs_top_snapshot *s, const json_t *control);

/* Adds the workers' states from a node status document ({"workers":
 * [{"id", "device", "pid", "state", "restarts", "models"}]}). */
void pjs_top_snapshot_apply_node(pjs_top_snapshot *s, const json_t *node);

void pjs_top_snapshot_free(pjs_top_snapshot *s);

/* Columns, in the order `s` cycles through them. */
typedef enum pjs_top_column {
    PJS_TOP_COL_MODEL,
    PJS_TOP_COL_QUEUE,
    PJS_TOP_COL_RATE,
    PJS_TOP_COL_LATENCY,
    PJS_TOP_COL_QWAIT_P99,
    PJS_TOP_COL_BUSY,
    PJS_TOP_COL_LOADS,
    PJS_TOP_COL_EVICTIONS,
    PJS_TOP_N_COLUMNS
} pjs_top_column;

/* The column named `name` (case-insensitive: model, queue, rate, latency,
 * qwait, busy, loads, evictions), or -1. */
int pjs_top_column_parse(const char *name);
const char *pjs_top_column_name(pjs_top_column c);

/* One row: a model's rates over the interval between two snapshots. */
typedef struct pjs_top_row {
    const pjs_top_model *model; /* in the newer snapshot */
    double rate, failure_rate;  /* requests per second */
    double latency_ms, queue_ms; /* means over the interval; < 0: no request finished */
    double busy;                 /* share of one device's time, 0..1 */
    double loads_rate, evictions_rate;
} pjs_top_row;

/* The view of two snapshots: the header's figures and the sorted,
 * filtered rows. */
typedef struct pjs_top_view {
    double interval_s;
    pjs_top_row *rows;
    size_t n_rows, n_models;     /* rows shown; models in the snapshot */
    double rate, failure_rate, loads_rate, evictions_rate, prefetches_rate;
    double busy;                 /* mean share of the devices' time, 0..1; < 0: unknown */
    double worker_busy[PJS_TOP_MAX_WORKERS]; /* by index into the snapshot's workers */
    double budget_bytes, used_bytes, pinned_bytes; /* summed over workers */
    bool has_cache;
    bool has_host_tier;          /* some worker has one: its sums below */
    double host_budget_bytes, host_used_bytes, host_loads_rate;
} pjs_top_view;

typedef struct pjs_top_options {
    pjs_top_column sort;
    bool reverse;        /* ascending where the column's natural order is descending */
    const char *filter;  /* substring of model names; NULL or "": every model */
} pjs_top_options;

/* Computes the view of `cur` against `prev` (the earlier snapshot).
 * NOMEM. */
int pjs_top_view_build(const pjs_top_snapshot *prev, const pjs_top_snapshot *cur,
                       const pjs_top_options *o, pjs_top_view *out, pjs_error *err);
void pjs_top_view_free(pjs_top_view *v);

/* Lines of text, each without its newline: the screen of the view. */
typedef struct pjs_top_lines {
    char **line;
    size_t n, cap;
} pjs_top_lines;

/* What the header says besides the figures. */
typedef struct pjs_top_context {
    const char *url, *metrics_url;
    double every_s;      /* the refresh interval asked for (the view's own is measured) */
    const char *clock;   /* "07:01:02", or NULL */
    const char *note;    /* a problem to show (a failed scrape), or NULL */
    const char *control_note; /* why residency is missing, or NULL */
    bool keys;           /* show the keys line (live, interactive) */
    const char *editing_filter; /* the filter being typed, or NULL */
} pjs_top_context;

/* Renders the view into lines no wider than `width` columns (0: no
 * limit). NOMEM. */
int pjs_top_render(const pjs_top_snapshot *cur, const pjs_top_view *v, const pjs_top_options *o,
                   const pjs_top_context *ctx, size_t width, pjs_top_lines *out, pjs_error *err);
void pjs_top_lines_free(pjs_top_lines *l);

/* The view as a JSON document (a new reference; NULL: out of memory). */
json_t *pjs_top_view_json(const pjs_top_snapshot *cur, const pjs_top_view *v,
                          const pjs_top_options *o, const pjs_top_context *ctx);

#endif
