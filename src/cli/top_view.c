/*
 * top_view.c - `pjserve top`'s snapshots, rates, rows and screen (see
 * top_view.h).
 *
 * A snapshot is built in one pass over the parsed samples: each sample's
 * family picks the field it adds to, its `model` label the model (found
 * through a small open-addressing table while the pass runs; the models
 * are sorted by name at the end) and its `worker` label the worker. The
 * view pairs each model of the newer snapshot with the same name in the
 * older one (binary search) and divides the counters' growth by the time
 * between the scrapes.
 */
#include "cli/top_view.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/residency.h"

/* ---- snapshot ------------------------------------------------------------------- */

#define TABLE_SLOTS 8192 /* a power of two, twice PJS_TOP_MAX_MODELS */

typedef struct builder {
    pjs_top_snapshot *s;
    size_t cap;
    int32_t slot[TABLE_SLOTS]; /* index + 1 into s->models; 0: empty */
    bool recognised;           /* a pjserve or Triton sample was seen */
} builder;

/* Copies src as text a terminal shows as it is: control bytes (an escape
 * sequence in a model's name, say) become '?'. */
static void printable_copy(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src[i] != '\0' && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    dst[i] = '\0';
}

static uint32_t hash_name(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s != '\0'; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* The model named `name`, added when new; NULL past the bounds or out of
 * memory. */
static pjs_top_model *model_of(builder *b, const char *name)
{
    char key[PJS_TOP_NAME_MAX];
    printable_copy(key, sizeof key, name);
    for (uint32_t i = hash_name(key) & (TABLE_SLOTS - 1);; i = (i + 1) & (TABLE_SLOTS - 1)) {
        if (b->slot[i] != 0) {
            pjs_top_model *m = &b->s->models[b->slot[i] - 1];
            if (strcmp(m->name, key) == 0)
                return m;
            continue;
        }
        if (b->s->n_models == PJS_TOP_MAX_MODELS)
            return NULL;
        if (b->s->n_models == b->cap) {
            size_t cap = b->cap ? b->cap * 2 : 16;
            pjs_top_model *grown = realloc(b->s->models, cap * sizeof *grown);
            if (grown == NULL)
                return NULL;
            b->s->models = grown;
            b->cap = cap;
        }
        pjs_top_model *m = &b->s->models[b->s->n_models++];
        memset(m, 0, sizeof *m);
        memcpy(m->name, key, sizeof key);
        b->slot[i] = (int32_t)b->s->n_models;
        return m;
    }
}

static pjs_top_worker *worker_of(pjs_top_snapshot *s, int id)
{
    for (size_t i = 0; i < s->n_workers; i++)
        if (s->workers[i].id == id)
            return &s->workers[i];
    if (s->n_workers == PJS_TOP_MAX_WORKERS)
        return NULL;
    pjs_top_worker *w = &s->workers[s->n_workers++];
    memset(w, 0, sizeof *w);
    w->id = id;
    w->pid = -1;
    return w;
}

/* The sample's worker: its `worker` label (0 to 1023), or worker 0. */
static pjs_top_worker *sample_worker(pjs_top_snapshot *s, const pjs_prom_sample *x)
{
    const char *label = pjs_prom_label_value(x, "worker");
    if (label == NULL)
        return worker_of(s, 0);
    s->gateway = true;
    char *end;
    long id = strtol(label, &end, 10);
    if (label[0] < '0' || label[0] > '9' || *end != '\0' || id > 1023)
        return NULL;
    return worker_of(s, (int)id);
}

/* Per-model families: where each adds its value. */
typedef enum model_field {
    F_SUCCESS,
    F_FAILURE,
    F_REQUEST_US,
    F_QUEUE_US,
    F_DEVICE_S,
    F_LOADS,
    F_EVICTIONS,
    F_QUEUE_DEPTH,
    F_IN_FLIGHT,
    F_RESIDENT,
    F_IN_HOST,
    F_HOST_LOADS,
    F_QWAIT,
} model_field;

static const struct {
    const char *name;
    model_field field;
} model_families[] = {
    {"nv_inference_request_success", F_SUCCESS},
    {"nv_inference_request_failure", F_FAILURE},
    {"nv_inference_request_duration_us", F_REQUEST_US},
    {"nv_inference_queue_duration_us", F_QUEUE_US},
    {"pjserve_model_device_seconds_total", F_DEVICE_S},
    {"pjserve_weight_loads_total", F_LOADS},
    {"pjserve_weight_evictions_total", F_EVICTIONS},
    {"pjserve_model_queue_depth", F_QUEUE_DEPTH},
    {"pjserve_model_requests_in_flight", F_IN_FLIGHT},
    {"pjserve_weight_resident_bytes", F_RESIDENT},
    {"pjserve_host_weight_bytes", F_IN_HOST},
    {"pjserve_host_weight_loads_total", F_HOST_LOADS},
    {"pjserve_model_queue_wait_seconds", F_QWAIT},
};

/* Counters and gauges must be finite and not negative to count. */
static bool countable(double v)
{
    return isfinite(v) && v >= 0;
}

static void add_model_sample(builder *b, const pjs_prom_sample *x, model_field f)
{
    const char *name = pjs_prom_label_value(x, "model");
    pjs_top_worker *w = sample_worker(b->s, x);
    if (name == NULL || w == NULL || !countable(x->value))
        return;
    pjs_top_model *m = model_of(b, name);
    if (m == NULL)
        return;
    double v = x->value;
    switch (f) {
    case F_SUCCESS:
        m->success += v;
        m->workers++;
        break;
    case F_FAILURE: m->failure += v; break;
    case F_REQUEST_US: m->request_us += v; break;
    case F_QUEUE_US: m->queue_us += v; break;
    case F_DEVICE_S:
        b->s->has_device_time = true;
        m->device_s += v;
        w->device_s += v;
        break;
    case F_LOADS:
        m->loads += v;
        w->loads += v;
        break;
    case F_EVICTIONS:
        m->evictions += v;
        w->evictions += v;
        break;
    case F_QUEUE_DEPTH: m->queue_depth += v; break;
    case F_IN_FLIGHT: m->in_flight += v; break;
    case F_RESIDENT:
        m->resident_bytes += v;
        m->resident_on += v > 0;
        break;
    case F_IN_HOST: m->in_host_on += v > 0; break;
    case F_HOST_LOADS: w->host_loads += v; break;
    case F_QWAIT: {
        const char *q = pjs_prom_label_value(x, "quantile");
        if (q == NULL)
            break;
        m->has_qwait = true;
        if (strcmp(q, "0.5") == 0 && v > m->qwait_p50_s)
            m->qwait_p50_s = v;
        else if (strcmp(q, "0.99") == 0 && v > m->qwait_p99_s)
            m->qwait_p99_s = v;
        break;
    }
    }
}

/* Server-wide families, per worker. */
static void add_server_sample(builder *b, const pjs_prom_sample *x)
{
    const char *n = x->name;
    pjs_top_snapshot *s = b->s;
    if (strcmp(n, "pjserve_scheduler_info") == 0) {
        const char *d = pjs_prom_label_value(x, "discipline");
        if (d != NULL)
            printable_copy(s->discipline, sizeof s->discipline, d);
        return;
    }
    bool budget = strcmp(n, "pjserve_weight_cache_budget_bytes") == 0;
    if (!countable(x->value) && !(budget && x->value == INFINITY))
        return;
    pjs_top_worker *w = sample_worker(s, x);
    if (w == NULL)
        return;
    if (budget) {
        w->budget_bytes = x->value;
        w->has_cache = true;
    } else if (strcmp(n, "pjserve_weight_cache_used_bytes") == 0) {
        w->used_bytes = x->value;
    } else if (strcmp(n, "pjserve_weight_cache_pinned_bytes") == 0) {
        w->pinned_bytes = x->value;
    } else if (strcmp(n, "pjserve_weight_prefetches_total") == 0) {
        w->prefetches = x->value;
    } else if (strcmp(n, "pjserve_host_weight_budget_bytes") == 0) {
        w->has_host_tier = true; /* a finite budget: +Inf (no tier) is not countable */
        w->host_budget_bytes = x->value;
    } else if (strcmp(n, "pjserve_host_weight_used_bytes") == 0) {
        w->host_used_bytes = x->value;
    } else if (strcmp(n, "pjserve_queue_depth") == 0) {
        s->queue_depth += x->value;
    } else if (strcmp(n, "pjserve_requests_in_flight") == 0) {
        s->in_flight += x->value;
    } else if (strcmp(n, "pjserve_gateway_worker_ready") == 0) {
        /* A gateway's word on its worker; a node's status, read later, has more. */
        snprintf(w->state, sizeof w->state, "%s", x->value == 1 ? "ready" : "not ready");
    } else if (strcmp(n, "pjserve_gateway_worker_metrics_scraped") == 0) {
        w->unscraped = x->value == 0;
    }
    /* Any other family: the worker is known now. */
}

static int by_model_name(const void *a, const void *b)
{
    return strcmp(((const pjs_top_model *)a)->name, ((const pjs_top_model *)b)->name);
}

static int by_worker_id(const void *a, const void *b)
{
    int x = ((const pjs_top_worker *)a)->id, y = ((const pjs_top_worker *)b)->id;
    return (x > y) - (x < y);
}

int pjs_top_snapshot_from_metrics(const pjs_prom_doc *doc, double at_s, pjs_top_snapshot *out,
                                  pjs_error *err)
{
    memset(out, 0, sizeof *out);
    out->at_s = at_s;
    builder *b = calloc(1, sizeof *b);
    if (b == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory reading metrics");
    b->s = out;
    for (size_t i = 0; i < doc->n_samples; i++) {
        const pjs_prom_sample *x = &doc->samples[i];
        if (strncmp(x->name, "pjserve_", 8) != 0 && strncmp(x->name, "nv_inference_", 13) != 0)
            continue;
        b->recognised = true;
        size_t f = 0, n = sizeof model_families / sizeof *model_families;
        while (f < n && strcmp(x->name, model_families[f].name) != 0)
            f++;
        if (f < n)
            add_model_sample(b, x, model_families[f].field);
        else
            add_server_sample(b, x);
    }
    bool recognised = b->recognised;
    free(b);
    if (!recognised)
        return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                             "the answer holds no pjserve or Triton metrics");
    if (out->n_workers == 0)
        worker_of(out, 0);
    if (out->n_models > 0) /* qsort and bsearch want a table, even for no element */
        qsort(out->models, out->n_models, sizeof *out->models, by_model_name);
    qsort(out->workers, out->n_workers, sizeof *out->workers, by_worker_id);
    return 0;
}

static pjs_top_model *find_model(const pjs_top_snapshot *s, const char *name)
{
    if (s->n_models == 0)
        return NULL;
    pjs_top_model key;
    printable_copy(key.name, sizeof key.name, name);
    return bsearch(&key, s->models, s->n_models, sizeof *s->models, by_model_name);
}

void pjs_top_snapshot_apply_control(pjs_top_snapshot *s, const json_t *control)
{
    const json_t *list = json_object_get(control, "models");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *residency = json_string_value(json_object_get(e, "residency"));
        pjs_top_model *m = name != NULL ? find_model(s, name) : NULL;
        if (m == NULL || residency == NULL)
            continue;
        printable_copy(m->residency, sizeof m->residency, residency);
        for (char *c = m->residency; *c != '\0'; c++)
            *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + ('a' - 'A') : *c); /* "HOST" -> "host" */
        const json_t *bytes = json_object_get(e, "weight_bytes");
        if (json_is_number(bytes) && json_number_value(bytes) >= 0)
            m->weight_bytes = json_number_value(bytes);
    }
}

void pjs_top_snapshot_apply_node(pjs_top_snapshot *s, const json_t *node)
{
    const json_t *list = json_object_get(node, "workers");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        const json_t *id = json_object_get(e, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) > 1023)
            continue;
        pjs_top_worker *w = worker_of(s, (int)json_integer_value(id));
        if (w == NULL)
            continue;
        const char *state = json_string_value(json_object_get(e, "state"));
        const char *device = json_string_value(json_object_get(e, "device"));
        printable_copy(w->state, sizeof w->state, state != NULL ? state : "?");
        printable_copy(w->device, sizeof w->device, device != NULL ? device : "?");
        const json_t *pid = json_object_get(e, "pid");
        w->pid = json_is_integer(pid) ? (long long)json_integer_value(pid) : -1;
        w->restarts = (long long)json_integer_value(json_object_get(e, "restarts"));
        w->n_models = json_array_size(json_object_get(e, "models"));
        s->node = true;
    }
    if (s->n_workers > 0)
        qsort(s->workers, s->n_workers, sizeof *s->workers, by_worker_id);
}

void pjs_top_snapshot_free(pjs_top_snapshot *s)
{
    free(s->models);
    memset(s, 0, sizeof *s);
}

/* ---- columns -------------------------------------------------------------------- */

static const char *const column_names[PJS_TOP_N_COLUMNS] = {
    "model", "queue", "rate", "latency", "qwait", "busy", "loads", "evictions",
};

int pjs_top_column_parse(const char *name)
{
    for (int c = 0; c < PJS_TOP_N_COLUMNS; c++)
        if (strcasecmp(name, column_names[c]) == 0)
            return c;
    return -1;
}

const char *pjs_top_column_name(pjs_top_column c)
{
    return c < PJS_TOP_N_COLUMNS ? column_names[c] : "?";
}

/* ---- view ----------------------------------------------------------------------- */

/* Growth of a counter; one that went down was reset (a restarted worker). */
static double growth(double before, double now)
{
    return now >= before ? now - before : now;
}

static double sort_key(const pjs_top_row *r, pjs_top_column c)
{
    switch (c) {
    case PJS_TOP_COL_QUEUE: return r->model->queue_depth;
    case PJS_TOP_COL_RATE: return r->rate;
    case PJS_TOP_COL_LATENCY: return r->latency_ms;
    case PJS_TOP_COL_QWAIT_P99: return r->model->qwait_p99_s;
    case PJS_TOP_COL_BUSY: return r->busy;
    case PJS_TOP_COL_LOADS: return r->loads_rate;
    case PJS_TOP_COL_EVICTIONS: return r->evictions_rate;
    default: return 0;
    }
}

/* Names ascending, figures descending (the busiest first); `reverse`
 * flips either; ties by name. */
static int compare_rows(const void *a, const void *b, void *arg)
{
    const pjs_top_options *o = arg;
    const pjs_top_row *x = a, *y = b;
    int by_name = strcmp(x->model->name, y->model->name);
    int order = by_name;
    if (o->sort != PJS_TOP_COL_MODEL) {
        double kx = sort_key(x, o->sort), ky = sort_key(y, o->sort);
        order = kx > ky ? -1 : kx < ky ? 1 : 0;
    }
    if (o->reverse)
        order = -order;
    return order != 0 ? order : by_name;
}

static void model_row(const pjs_top_model *m, const pjs_top_model *before, double dt,
                      size_t n_devices, pjs_top_row *r)
{
    static const pjs_top_model zero;
    const pjs_top_model *p = before != NULL ? before : &zero;
    double done = growth(p->success, m->success);
    r->model = m;
    r->rate = dt > 0 ? done / dt : 0;
    r->failure_rate = dt > 0 ? growth(p->failure, m->failure) / dt : 0;
    r->latency_ms = done > 0 ? growth(p->request_us, m->request_us) / done / 1e3 : -1;
    r->queue_ms = done > 0 ? growth(p->queue_us, m->queue_us) / done / 1e3 : -1;
    r->busy = dt > 0 ? growth(p->device_s, m->device_s) / dt / (double)n_devices : 0;
    r->loads_rate = dt > 0 ? growth(p->loads, m->loads) / dt : 0;
    r->evictions_rate = dt > 0 ? growth(p->evictions, m->evictions) / dt : 0;
}

static const pjs_top_worker *worker_by_id(const pjs_top_snapshot *s, int id)
{
    for (size_t i = 0; i < s->n_workers; i++)
        if (s->workers[i].id == id)
            return &s->workers[i];
    return NULL;
}

static void server_figures(const pjs_top_snapshot *prev, const pjs_top_snapshot *cur, double dt,
                           pjs_top_view *v)
{
    double device_s = 0;
    for (size_t i = 0; i < cur->n_workers; i++) {
        const pjs_top_worker *w = &cur->workers[i];
        static const pjs_top_worker none;
        const pjs_top_worker *p = worker_by_id(prev, w->id);
        if (p == NULL)
            p = &none;
        double busy_s = growth(p->device_s, w->device_s);
        device_s += busy_s;
        v->worker_busy[i] = dt > 0 ? busy_s / dt : 0;
        v->loads_rate += dt > 0 ? growth(p->loads, w->loads) / dt : 0;
        v->evictions_rate += dt > 0 ? growth(p->evictions, w->evictions) / dt : 0;
        v->prefetches_rate += dt > 0 ? growth(p->prefetches, w->prefetches) / dt : 0;
        if (w->has_cache) {
            v->has_cache = true;
            v->budget_bytes += w->budget_bytes;
            v->used_bytes += w->used_bytes;
            v->pinned_bytes += w->pinned_bytes;
        }
        if (w->has_host_tier) {
            v->has_host_tier = true;
            v->host_budget_bytes += w->host_budget_bytes;
            v->host_used_bytes += w->host_used_bytes;
            v->host_loads_rate += dt > 0 ? growth(p->host_loads, w->host_loads) / dt : 0;
        }
    }
    size_t n = cur->n_workers > 0 ? cur->n_workers : 1;
    v->busy = dt > 0 && cur->has_device_time ? device_s / dt / (double)n : -1;
}

int pjs_top_view_build(const pjs_top_snapshot *prev, const pjs_top_snapshot *cur,
                       const pjs_top_options *o, pjs_top_view *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    double dt = cur->at_s - prev->at_s;
    out->interval_s = dt;
    out->n_models = cur->n_models;
    out->rows = calloc(cur->n_models > 0 ? cur->n_models : 1, sizeof *out->rows);
    if (out->rows == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory building the view");
    size_t n_devices = cur->n_workers > 0 ? cur->n_workers : 1;
    for (size_t i = 0; i < cur->n_models; i++) {
        const pjs_top_model *m = &cur->models[i];
        pjs_top_row r;
        model_row(m, find_model(prev, m->name), dt, n_devices, &r);
        out->rate += r.rate;
        out->failure_rate += r.failure_rate;
        if (o->filter == NULL || o->filter[0] == '\0' || strstr(m->name, o->filter) != NULL)
            out->rows[out->n_rows++] = r;
    }
    server_figures(prev, cur, dt, out);
    if (out->n_rows > 0)
        qsort_r(out->rows, out->n_rows, sizeof *out->rows, compare_rows, (void *)o);
    return 0;
}

void pjs_top_view_free(pjs_top_view *v)
{
    free(v->rows);
    memset(v, 0, sizeof *v);
}

/* ---- text ----------------------------------------------------------------------- */

static void format_bytes(double bytes, char *out, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    size_t u = 0;
    while (bytes >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        bytes /= 1024;
        u++;
    }
    snprintf(out, cap, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
}

/* Where a model's weights are now: pinned (residency device), device (in
 * the cache; "device 1/2" when on some workers only), file (unpinned, or
 * its floor evicted by a host tier: read from the bundle when loaded
 * next), host. */
static void location(const pjs_top_model *m, bool host_tier, char *out, size_t cap)
{
    pjs_residency r;
    bool known = pjs_residency_from_name(m->residency, &r);
    if (known && pjs_residency_device_pinned(r))
        snprintf(out, cap, "pinned");
    else if (m->resident_on > 0 && m->resident_on < m->workers && m->workers > 1)
        snprintf(out, cap, "%s %u/%u", pjs_tier_name(PJS_TIER_DEVICE), m->resident_on,
                 m->workers);
    else if (m->resident_on > 0)
        snprintf(out, cap, "%s", pjs_tier_name(PJS_TIER_DEVICE));
    else if ((known && !pjs_residency_has_floor(r)) || (host_tier && m->in_host_on == 0))
        snprintf(out, cap, "%s", pjs_tier_name(PJS_TIER_FILE));
    else
        snprintf(out, cap, "%s", pjs_tier_name(PJS_TIER_HOST));
}

static int add_line(pjs_top_lines *l, size_t width, pjs_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int add_line(pjs_top_lines *l, size_t width, pjs_error *err, const char *fmt, ...)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        char **grown = realloc(l->line, cap * sizeof *grown);
        if (grown == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory drawing the screen");
        l->line = grown;
        l->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory drawing the screen");
    if (width > 0 && (size_t)n > width)
        s[width] = '\0';
    l->line[l->n++] = s;
    return 0;
}

static void figure(double v, const char *fmt, char *out, size_t cap)
{
    if (v < 0)
        snprintf(out, cap, "-");
    else
        snprintf(out, cap, fmt, v);
}

static int header(const pjs_top_snapshot *cur, const pjs_top_view *v, const pjs_top_options *o,
                  const pjs_top_context *ctx, size_t width, pjs_top_lines *out, pjs_error *err)
{
    char busy[32], used[32], budget[32], pinned[32];
    int rc = add_line(out, width, err, "pjserve top - %s   every %.1f s%s%s%s%s", ctx->url,
                      ctx->every_s, ctx->clock ? "   " : "", ctx->clock ? ctx->clock : "",
                      cur->discipline[0] ? "   scheduler " : "", cur->discipline);
    figure(v->busy * 100, "%.1f%%", busy, sizeof busy);
    if (rc == 0)
        rc = add_line(out, width, err,
                      "requests %.1f/s   failed %.1f/s   queued %.0f   in flight %.0f   "
                      "device busy %s%s",
                      v->rate, v->failure_rate, cur->queue_depth, cur->in_flight,
                      v->busy < 0 ? "- (no device time in the metrics)" : busy,
                      cur->n_workers > 1 ? " (mean of the workers)" : "");
    format_bytes(v->used_bytes, used, sizeof used);
    format_bytes(v->pinned_bytes, pinned, sizeof pinned);
    if (rc == 0 && v->has_cache && isinf(v->budget_bytes)) {
        rc = add_line(out, width, err,
                      "weights %s in the cache (no budget)   pinned %s   loads %.1f/s   "
                      "evictions %.1f/s   prefetches %.1f/s",
                      used, pinned, v->loads_rate, v->evictions_rate, v->prefetches_rate);
    } else if (rc == 0 && v->has_cache) {
        format_bytes(v->budget_bytes, budget, sizeof budget);
        rc = add_line(out, width, err,
                      "weights %s of %s budget (%.0f%%)   pinned %s   loads %.1f/s   "
                      "evictions %.1f/s   prefetches %.1f/s",
                      used, budget,
                      v->budget_bytes > 0 ? 100.0 * v->used_bytes / v->budget_bytes : 0.0,
                      pinned, v->loads_rate, v->evictions_rate, v->prefetches_rate);
    } else if (rc == 0) {
        rc = add_line(out, width, err,
                      "weights: no weight cache in the metrics   loads %.1f/s   evictions "
                      "%.1f/s",
                      v->loads_rate, v->evictions_rate);
    }
    if (rc == 0 && v->has_host_tier) {
        char host_used[32], host_budget[32];
        format_bytes(v->host_used_bytes, host_used, sizeof host_used);
        format_bytes(v->host_budget_bytes, host_budget, sizeof host_budget);
        rc = add_line(out, width, err,
                      "host floors %s of %s budget (%.0f%%)   read from files %.1f/s", host_used,
                      host_budget,
                      v->host_budget_bytes > 0 ? 100.0 * v->host_used_bytes / v->host_budget_bytes
                                               : 0.0,
                      v->host_loads_rate);
    }
    if (rc == 0)
        rc = add_line(out, width, err,
                      "LAT ms: mean over the interval (the server exports sums, not latency "
                      "quantiles); QWAIT p50/p99 ms: queue wait since each model loaded");
    if (rc == 0 && ctx->note != NULL)
        rc = add_line(out, width, err, "! %s", ctx->note);
    if (rc == 0 && ctx->control_note != NULL)
        rc = add_line(out, width, err, "! %s", ctx->control_note);
    if (rc == 0 && ctx->editing_filter != NULL)
        rc = add_line(out, width, err, "filter: %s_   (Enter: apply, Esc: cancel)",
                      ctx->editing_filter);
    else if (rc == 0)
        rc = add_line(out, width, err, "sort %s%s   filter %s   %zu of %zu models%s",
                      pjs_top_column_name(o->sort), o->reverse ? " (reversed)" : "",
                      o->filter != NULL && o->filter[0] ? o->filter : "-", v->n_rows,
                      v->n_models,
                      ctx->keys ? "   keys: q quit  s sort  r reverse  / filter" : "");
    return rc;
}

static int workers_table(const pjs_top_snapshot *cur, const pjs_top_view *v, size_t width,
                         pjs_top_lines *out, pjs_error *err)
{
    int rc = add_line(out, width, err, "%s", "");
    if (rc == 0)
        rc = add_line(out, width, err, "%-6s  %-10s  %-10s  %7s  %8s  %6s  %-24s  %6s", "WORKER",
                      "DEVICE", "STATE", "PID", "RESTARTS", "BUSY%", "CACHE", "MODELS");
    for (size_t i = 0; rc == 0 && i < cur->n_workers; i++) {
        const pjs_top_worker *w = &cur->workers[i];
        char pid[24], cache[80] = "-", used[32], budget[32];
        snprintf(pid, sizeof pid, w->pid >= 0 ? "%lld" : "-", w->pid);
        if (w->has_cache) {
            format_bytes(w->used_bytes, used, sizeof used);
            format_bytes(w->budget_bytes, budget, sizeof budget);
            snprintf(cache, sizeof cache, "%s / %s", used,
                     isinf(w->budget_bytes) ? "no budget" : budget);
        }
        rc = add_line(out, width, err, "%-6d  %-10s  %-10s  %7s  %8lld  %6.1f  %-24s  %6zu",
                      w->id, w->device[0] ? w->device : "-", w->state[0] ? w->state : "-", pid,
                      w->restarts, v->worker_busy[i] * 100, cache, w->n_models);
    }
    return rc;
}

int pjs_top_render(const pjs_top_snapshot *cur, const pjs_top_view *v, const pjs_top_options *o,
                   const pjs_top_context *ctx, size_t width, pjs_top_lines *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    int rc = header(cur, v, o, ctx, width, out, err);
    if (rc == 0 && (cur->node || cur->gateway))
        rc = workers_table(cur, v, width, out, err);
    int name_w = 5;
    for (size_t i = 0; i < v->n_rows; i++) {
        int n = (int)strlen(v->rows[i].model->name);
        name_w = n > name_w ? (n < 40 ? n : 40) : name_w;
    }
    if (rc == 0)
        rc = add_line(out, width, err, "%s", "");
    if (rc == 0)
        rc = add_line(out, width, err,
                      "%-*s  %6s  %6s  %8s  %7s  %8s  %9s  %9s  %6s  %-11s  %9s  %7s  %7s",
                      name_w, "MODEL", "QUEUE", "INFLT", "REQ/S", "FAIL/S", "LAT ms",
                      "QWAIT p50", "QWAIT p99", "BUSY%", "WEIGHTS", "SIZE", "LOADS/S",
                      "EVICT/S");
    for (size_t i = 0; rc == 0 && i < v->n_rows; i++) {
        const pjs_top_row *r = &v->rows[i];
        const pjs_top_model *m = r->model;
        char lat[24], p50[24], p99[24], where[32], size[32];
        figure(r->latency_ms, "%.2f", lat, sizeof lat);
        figure(m->has_qwait ? m->qwait_p50_s * 1e3 : -1, "%.2f", p50, sizeof p50);
        figure(m->has_qwait ? m->qwait_p99_s * 1e3 : -1, "%.2f", p99, sizeof p99);
        location(m, v->has_host_tier, where, sizeof where);
        if (m->weight_bytes > 0)
            format_bytes(m->weight_bytes, size, sizeof size);
        else
            snprintf(size, sizeof size, "-");
        rc = add_line(out, width, err,
                      "%-*.*s  %6.0f  %6.0f  %8.1f  %7.1f  %8s  %9s  %9s  %6.1f  %-11s  %9s  "
                      "%7.1f  %7.1f",
                      name_w, name_w, m->name, m->queue_depth, m->in_flight, r->rate,
                      r->failure_rate, lat, p50, p99, r->busy * 100, where, size, r->loads_rate,
                      r->evictions_rate);
    }
    size_t unscraped = 0;
    for (size_t i = 0; i < cur->n_workers; i++)
        unscraped += cur->workers[i].unscraped;
    if (rc == 0 && v->n_rows == 0 && v->n_models == 0 && unscraped > 0) {
        rc = add_line(out, width, err,
                      "(no models: the gateway has no metrics address for %zu of its %zu "
                      "workers;", unscraped, cur->n_workers);
        if (rc == 0)
            rc = add_line(out, width, err, "%s",
                          " give each one as --worker grpc=...,http=...,metrics=HOST:PORT)");
    } else if (rc == 0 && v->n_rows == 0)
        rc = add_line(out, width, err, "%s",
                      v->n_models == 0 ? "(the server has no models loaded)"
                                       : "(no model matches the filter)");
    return rc;
}

void pjs_top_lines_free(pjs_top_lines *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->line[i]);
    free(l->line);
    memset(l, 0, sizeof *l);
}

/* ---- JSON ----------------------------------------------------------------------- */

/* A figure, or null where there is none (< 0). */
static json_t *maybe(double v)
{
    return v < 0 ? json_null() : json_real(v);
}

static json_t *row_json(const pjs_top_row *r, bool host_tier)
{
    const pjs_top_model *m = r->model;
    char where[32];
    location(m, host_tier, where, sizeof where);
    json_t *e = json_object();
    json_object_set_new(e, "name", json_string(m->name));
    json_object_set_new(e, "queue_depth", json_integer((json_int_t)m->queue_depth));
    json_object_set_new(e, "in_flight", json_integer((json_int_t)m->in_flight));
    json_object_set_new(e, "requests_per_s", json_real(r->rate));
    json_object_set_new(e, "failures_per_s", json_real(r->failure_rate));
    json_object_set_new(e, "latency_mean_ms", maybe(r->latency_ms));
    json_object_set_new(e, "queue_mean_ms", maybe(r->queue_ms));
    json_object_set_new(e, "queue_wait_p50_ms", maybe(m->has_qwait ? m->qwait_p50_s * 1e3 : -1));
    json_object_set_new(e, "queue_wait_p99_ms", maybe(m->has_qwait ? m->qwait_p99_s * 1e3 : -1));
    json_object_set_new(e, "device_busy", json_real(r->busy));
    json_object_set_new(e, "weights", json_string(where));
    json_object_set_new(e, "residency", m->residency[0] ? json_string(m->residency) : json_null());
    json_object_set_new(e, "resident_bytes", json_integer((json_int_t)m->resident_bytes));
    json_object_set_new(e, "weight_bytes",
                        m->weight_bytes > 0 ? json_integer((json_int_t)m->weight_bytes)
                                            : json_null());
    json_object_set_new(e, "loads_per_s", json_real(r->loads_rate));
    json_object_set_new(e, "evictions_per_s", json_real(r->evictions_rate));
    json_object_set_new(e, "requests_total", json_integer((json_int_t)m->success));
    json_object_set_new(e, "workers", json_integer(m->workers));
    return e;
}

static json_t *worker_json(const pjs_top_worker *w, double busy)
{
    json_t *e = json_object();
    json_object_set_new(e, "id", json_integer(w->id));
    json_object_set_new(e, "device", w->device[0] ? json_string(w->device) : json_null());
    json_object_set_new(e, "state", w->state[0] ? json_string(w->state) : json_null());
    json_object_set_new(e, "pid", w->pid >= 0 ? json_integer(w->pid) : json_null());
    json_object_set_new(e, "restarts", json_integer(w->restarts));
    json_object_set_new(e, "device_busy", json_real(busy));
    if (w->has_cache) {
        json_object_set_new(e, "budget_bytes",
                            isinf(w->budget_bytes) ? json_null()
                                                   : json_integer((json_int_t)w->budget_bytes));
        json_object_set_new(e, "used_bytes", json_integer((json_int_t)w->used_bytes));
        json_object_set_new(e, "pinned_bytes", json_integer((json_int_t)w->pinned_bytes));
    }
    return e;
}

json_t *pjs_top_view_json(const pjs_top_snapshot *cur, const pjs_top_view *v,
                          const pjs_top_options *o, const pjs_top_context *ctx)
{
    json_t *models = json_array(), *workers = json_array();
    for (size_t i = 0; i < v->n_rows; i++)
        json_array_append_new(models, row_json(&v->rows[i], v->has_host_tier));
    for (size_t i = 0; i < cur->n_workers; i++)
        json_array_append_new(workers, worker_json(&cur->workers[i], v->worker_busy[i]));
    json_t *cache = json_null();
    if (v->has_cache)
        cache = json_pack("{s:o, s:I, s:I}", "budget_bytes",
                          isinf(v->budget_bytes) ? json_null()
                                                 : json_integer((json_int_t)v->budget_bytes),
                          "used_bytes", (json_int_t)v->used_bytes, "pinned_bytes",
                          (json_int_t)v->pinned_bytes);
    json_t *doc = json_object();
    json_object_set_new(doc, "url", json_string(ctx->url));
    json_object_set_new(doc, "metrics_url", json_string(ctx->metrics_url));
    json_object_set_new(doc, "every_s", json_real(ctx->every_s));
    json_object_set_new(doc, "interval_s", json_real(v->interval_s));
    json_object_set_new(doc, "latency", json_string("mean over the interval"));
    json_object_set_new(doc, "scheduler",
                        cur->discipline[0] ? json_string(cur->discipline) : json_null());
    json_object_set_new(doc, "requests_per_s", json_real(v->rate));
    json_object_set_new(doc, "failures_per_s", json_real(v->failure_rate));
    json_object_set_new(doc, "queue_depth", json_integer((json_int_t)cur->queue_depth));
    json_object_set_new(doc, "in_flight", json_integer((json_int_t)cur->in_flight));
    json_object_set_new(doc, "device_busy", maybe(v->busy));
    json_object_set_new(doc, "loads_per_s", json_real(v->loads_rate));
    json_object_set_new(doc, "evictions_per_s", json_real(v->evictions_rate));
    json_object_set_new(doc, "prefetches_per_s", json_real(v->prefetches_rate));
    json_object_set_new(doc, "cache", cache);
    json_t *host = json_null();
    if (v->has_host_tier)
        host = json_pack("{s:I, s:I, s:f}", "budget_bytes", (json_int_t)v->host_budget_bytes,
                         "used_bytes", (json_int_t)v->host_used_bytes, "loads_per_s",
                         v->host_loads_rate);
    json_object_set_new(doc, "host_tier", host);
    json_object_set_new(doc, "node", json_boolean(cur->node));
    json_object_set_new(doc, "workers", workers);
    json_object_set_new(doc, "sort", json_string(pjs_top_column_name(o->sort)));
    json_object_set_new(doc, "reverse", json_boolean(o->reverse));
    json_object_set_new(doc, "filter", o->filter != NULL && o->filter[0] ? json_string(o->filter)
                                                                         : json_null());
    json_object_set_new(doc, "models", models);
    if (ctx->control_note != NULL)
        json_object_set_new(doc, "control_note", json_string(ctx->control_note));
    return doc;
}
