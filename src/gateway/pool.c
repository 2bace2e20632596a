/*
 * pool.c - the gateway's workers: probes, circuit breakers, routing.
 *
 * State. One mutex guards everything that changes: each worker's health,
 * breaker, in-flight count and the models ready on it, the model table
 * (every model some worker holds, with its lpt placement and measured
 * cost) and the sequence pins. Channels are created once and never change,
 * so forwards use them without the lock.
 *
 * Probes. One thread visits every worker each interval: ServerLive, then
 * (under strict readiness) ServerReady, then the repository index of ready
 * models, over the worker's gRPC channel.
 * Failures count up to `unhealthy_after`; one success makes the worker
 * ready again. A failed probe of a worker that answered requests since its
 * last probe does not count (it is busy, not down). A forward that could
 * not reach its worker (NOT_SENT) marks it unhealthy at once and wakes the
 * thread, so traffic moves before the next round. The node probes a
 * worker it has just seen start answering in its own thread
 * (pjs_gw_pool_probe_worker) before it reports it ready. Under lpt_packing every PLACEMENT_EVERY_MS the thread also
 * reads each worker's statistics, turns the growth of each model's compute
 * time into a cost per second and rebalances (placement.h).
 *
 * Changes. Those clients make through the gateway and those the node's
 * repository watcher decides (pjs_gw_pool_apply_change, which sends them
 * itself, one thread per worker) are remembered alike and sent again to a
 * restarted worker. While the watcher's load of a model is under way, the
 * model's requests are steered to the workers that can serve it (one
 * model at a time: the watcher makes one change at a time).
 *
 * Channels reconnect after at most a second of backoff, so a restarted
 * worker is reached again quickly.
 */
#include "core/thread_name.h"
#include "gateway/pool.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "core/log.h"
#include "gateway/grpc_unary.h"
#include "gateway/placement.h"
#include "grpc_service.pb-c.h"
#include "pjserve_control.pb-c.h"

#define PLACEMENT_EVERY_MS 5000
/* Device seconds per second counted for a model with no traffic. */
#define IDLE_MODEL_COST 1e-6
/* How long a change sent again to a restarted worker may take (a load
 * compiles). */
#define REPLAY_TIMEOUT_MS (600u * 1000u)
/* Sequences remembered at once; the oldest pin of a slot window goes first. */
#define SEQUENCE_SLOTS 4096
#define SEQUENCE_WINDOW 8

typedef struct worker {
    pjs_gw_worker_addr addr;
    grpc_channel *channel;
    /* Guarded by the pool's lock. */
    bool gone; /* its address no longer resolves from the DNS name */
    pjs_gw_worker_state state;
    unsigned probe_failures;
    unsigned forward_failures; /* consecutive */
    bool breaker_open;
    uint64_t breaker_until_ms;
    bool trial_in_flight;
    unsigned in_flight;
    uint64_t forwarded, failed;
    uint64_t answered; /* forwards it answered since its last probe */
    bool told_oversized; /* its refused index was logged (once, until it answers again) */
    char **models; /* ready on it, sorted */
    size_t n_models;
    bool server_ready; /* its ServerReady at the last probe that answered */
    /* Restarted and not yet sent the remembered changes up to the last:
     * no traffic, no new change (those are remembered for it instead). */
    bool needs_replay;
    uint64_t replayed_seq; /* changes up to this one were sent again */
    /* The repository watcher's changes up to this one were decided before
     * its current process started (it loaded them from the repository):
     * not sent again. */
    uint64_t restart_seq;
} worker;

/* A remembered change (pjs_gw_change), numbered in the order made. */
typedef struct change_entry {
    uint64_t seq;
    bool pending; /* sent, no worker's answer yet (pjs_gw_pool_change_settled) */
    pjs_gw_change_kind kind;
    char *model;
    char *config;
    int residency;
    bool repository; /* decided by the node's repository watcher */
} change_entry;

typedef struct model_entry {
    char *name;
    uint64_t holders; /* workers it is ready on */
    uint64_t placed;  /* lpt_packing: where its requests go; 0: not placed yet */
    double cost;      /* device seconds per second, measured */
    uint64_t compute_ns[PJS_GW_MAX_WORKERS]; /* last statistics read, per worker */
} model_entry;

typedef struct sequence_pin {
    char *key;
    int worker;
    uint64_t used;
} sequence_pin;

struct pjs_gw_pool {
    pjs_gw_pool_options o;
    _Atomic uint64_t retries[2]; /* per pjs_gw_protocol */
    char *token;
    char *dns_name;
    worker w[PJS_GW_MAX_WORKERS];
    /* Workers joined so far. Only the probe thread appends, filling the slot
     * before it counts it, so any thread may read slots below n. */
    _Atomic size_t n;
    uint64_t last_dns_ms;
    bool dns_failing; /* the last resolution failed (logged once) */

    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stop, probe_now;
    uint64_t rr;
    model_entry *models; /* sorted by name */
    size_t n_models;
    sequence_pin *pins; /* SEQUENCE_SLOTS */
    uint64_t pin_clock;
    uint64_t last_placement_ms;
    bool models_changed;   /* a worker's list changed since the table was built */
    change_entry *changes; /* in the order made; one per model and class */
    size_t n_changes, cap_changes;
    uint64_t change_seq;
    /* While pjs_gw_pool_apply_change loads model `steered` (NULL: none),
     * its requests go to the available workers of steer_to. */
    char *steered;
    uint64_t steer_to;
    pthread_t prober;
    bool prober_running;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *pjs_gw_routing_name(pjs_gw_routing r)
{
    return r == PJS_GW_LPT_PACKING ? "lpt_packing" : "round_robin";
}

int pjs_gw_routing_parse(const char *s, pjs_gw_routing *out)
{
    if (strcmp(s, "round_robin") == 0)
        *out = PJS_GW_ROUND_ROBIN;
    else if (strcmp(s, "lpt_packing") == 0)
        *out = PJS_GW_LPT_PACKING;
    else
        return -1;
    return 0;
}

const char *pjs_gw_worker_state_name(pjs_gw_worker_state s)
{
    switch (s) {
    case PJS_GW_WORKER_READY: return "ready";
    case PJS_GW_WORKER_UNHEALTHY: return "unhealthy";
    default: return "starting";
    }
}

/* "HOST:PORT" with a port in 1..65535, or "unix:/path". */
static bool valid_address(const char *a)
{
    if (strncmp(a, "unix:", 5) == 0)
        return a[5] == '/';
    const char *colon = strrchr(a, ':');
    if (colon == NULL || colon == a)
        return false;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    return *end == '\0' && port > 0 && port < 65536;
}

static int copy_address(char *dst, size_t size, const char *src, size_t len, const char *what,
                        const char *whole, pjs_error *err)
{
    if (len == 0 || len >= size)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--worker %s: the %s address is %s", whole, what,
                             len == 0 ? "empty" : "too long");
    memcpy(dst, src, len);
    dst[len] = '\0';
    if (!valid_address(dst))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--worker %s: the %s address '%s' is not HOST:PORT or unix:/PATH",
                             whole, what, dst);
    return 0;
}

int pjs_gw_worker_addr_parse(const char *s, pjs_gw_worker_addr *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    if (strchr(s, '=') == NULL) {
        if (s[0] == '\0' || strchr(s, ':') != NULL || strchr(s, ',') != NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "--worker %s: expected grpc=HOST:PORT,http=HOST:PORT"
                                 "[,metrics=HOST:PORT] or a bare HOST (ports 8001, 8000, 8002)",
                                 s);
        snprintf(out->grpc, sizeof out->grpc, "%s:8001", s);
        snprintf(out->http, sizeof out->http, "%s:8000", s);
        snprintf(out->metrics, sizeof out->metrics, "%s:8002", s);
        return 0;
    }
    const char *p = s;
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int rc;
        if (len > 5 && strncmp(p, "grpc=", 5) == 0)
            rc = copy_address(out->grpc, sizeof out->grpc, p + 5, len - 5, "gRPC", s, err);
        else if (len > 5 && strncmp(p, "http=", 5) == 0)
            rc = copy_address(out->http, sizeof out->http, p + 5, len - 5, "HTTP", s, err);
        else if (len > 8 && strncmp(p, "metrics=", 8) == 0)
            rc = copy_address(out->metrics, sizeof out->metrics, p + 8, len - 8, "metrics", s,
                              err);
        else
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "--worker %s: unknown part '%.*s' (expected grpc=HOST:PORT, "
                               "http=HOST:PORT and optionally metrics=HOST:PORT)",
                               s, (int)len, p);
        if (rc != 0)
            return rc;
        p = end ? end + 1 : p + len;
    }
    if (out->grpc[0] == '\0' || out->http[0] == '\0')
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--worker %s: both grpc=HOST:PORT and http=HOST:PORT are needed", s);
    return 0;
}

/* ---- the model table ------------------------------------------------------ */

static int by_name(const void *a, const void *b)
{
    return strcmp(((const model_entry *)a)->name, ((const model_entry *)b)->name);
}

static model_entry *find_model(pjs_gw_pool *p, const char *name)
{
    if (p->n_models == 0) /* bsearch wants a table, even an empty one */
        return NULL;
    model_entry key = {.name = (char *)name};
    return bsearch(&key, p->models, p->n_models, sizeof *p->models, by_name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Rebuilds the table from the workers' model lists, keeping what is known
 * of models still there. Every list is sorted and free of duplicates
 * (probe_worker), and so is the old table: one merge of them all, linear in
 * the names (times the workers), so a worker with a huge index holds the
 * lock for milliseconds, not seconds. Lock held; only when a list changed. */
static void rebuild_models(pjs_gw_pool *p)
{
    size_t n_workers = p->n, cap = 0;
    for (size_t i = 0; i < n_workers; i++)
        cap += p->w[i].n_models;
    model_entry *next = calloc(cap ? cap : 1, sizeof *next);
    if (next == NULL)
        return; /* keep the old table */
    size_t at[PJS_GW_MAX_WORKERS] = {0}, old_at = 0, n = 0;
    for (;;) {
        const char *name = NULL;
        for (size_t i = 0; i < n_workers; i++) {
            const worker *w = &p->w[i];
            if (at[i] < w->n_models && (name == NULL || strcmp(w->models[at[i]], name) < 0))
                name = w->models[at[i]];
        }
        if (name == NULL)
            break;
        model_entry e = {0};
        while (old_at < p->n_models && strcmp(p->models[old_at].name, name) < 0)
            old_at++;
        if (old_at < p->n_models && strcmp(p->models[old_at].name, name) == 0)
            e = p->models[old_at]; /* its placement and costs carry over */
        e.holders = 0;
        for (size_t i = 0; i < n_workers; i++) {
            const worker *w = &p->w[i];
            if (at[i] < w->n_models && strcmp(w->models[at[i]], name) == 0) {
                e.holders |= 1ull << i;
                at[i]++;
            }
        }
        e.name = strdup(name);
        if (e.name != NULL)
            next[n++] = e;
    }
    for (size_t k = 0; k < p->n_models; k++)
        free(p->models[k].name);
    free(p->models);
    p->models = next;
    p->n_models = n;
    p->models_changed = false;
}

/* ---- availability and the breaker ------------------------------------------- */

static bool available(const worker *w, uint64_t now)
{
    if (w->state != PJS_GW_WORKER_READY || w->gone || w->needs_replay)
        return false;
    if (!w->breaker_open)
        return true;
    return now >= w->breaker_until_ms && !w->trial_in_flight;
}

static uint64_t available_mask(pjs_gw_pool *p, uint64_t now)
{
    uint64_t mask = 0;
    for (size_t i = 0; i < p->n; i++)
        if (available(&p->w[i], now))
            mask |= 1ull << i;
    return mask;
}

static void mark_unhealthy(pjs_gw_pool *p, size_t i, const char *why)
{
    worker *w = &p->w[i];
    if (w->state != PJS_GW_WORKER_UNHEALTHY)
        pjs_warn("gateway: worker %zu (gRPC %s) is unhealthy: %s; its traffic goes to the others",
                 i, w->addr.grpc, why);
    w->state = PJS_GW_WORKER_UNHEALTHY;
}

/* Takes worker i for one forward. Lock held. */
static int take(pjs_gw_pool *p, size_t i, uint64_t now)
{
    worker *w = &p->w[i];
    if (w->breaker_open && now >= w->breaker_until_ms)
        w->trial_in_flight = true;
    w->in_flight++;
    w->forwarded++;
    return (int)i;
}

/* The n-th (round robin) worker of `mask`. */
static size_t nth_of(uint64_t mask, uint64_t n)
{
    unsigned count = (unsigned)__builtin_popcountll(mask);
    unsigned skip = (unsigned)(n % count);
    for (size_t i = 0;; i++)
        if (mask & (1ull << i)) {
            if (skip == 0)
                return i;
            skip--;
        }
}

/* ---- sequences ------------------------------------------------------------------ */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The pin of `key` (*found), or the slot to pin it in: a free one, else the
 * least recently used of its window. Lock held. */
static sequence_pin *pin_slot(pjs_gw_pool *p, const char *key, bool *found)
{
    uint64_t base = hash_str(key) % SEQUENCE_SLOTS;
    sequence_pin *oldest = NULL;
    for (unsigned k = 0; k < SEQUENCE_WINDOW; k++) {
        sequence_pin *s = &p->pins[(base + k) % SEQUENCE_SLOTS];
        if (s->key != NULL && strcmp(s->key, key) == 0) {
            *found = true;
            return s;
        }
        if (oldest == NULL || (oldest->key != NULL && (s->key == NULL || s->used < oldest->used)))
            oldest = s;
    }
    *found = false;
    return oldest;
}

/* ---- picks -------------------------------------------------------------------- */

int pjs_gw_pool_pick(pjs_gw_pool *p, const char *model, const char *sequence_key, uint64_t tried,
                     pjs_error *err)
{
    pthread_mutex_lock(&p->lock);
    uint64_t now = now_ms();
    model_entry *e = find_model(p, model);
    uint64_t up = available_mask(p, now) & ~tried;
    /* A model no worker held at the last probe goes to any worker: it may
     * have been loaded since, and if not the worker says it is unknown. */
    uint64_t candidates = e != NULL && e->holders != 0 ? e->holders & up : up;
    bool steered = p->steered != NULL && strcmp(p->steered, model) == 0 && (p->steer_to & up);
    if (steered)
        candidates = p->steer_to & up;
    else if (e != NULL && p->o.routing == PJS_GW_LPT_PACKING && (candidates & e->placed) != 0)
        candidates &= e->placed;
    if (candidates == 0) {
        pthread_mutex_unlock(&p->lock);
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                             "no worker holding model '%s' is available; retry later", model),
               -1;
    }
    int chosen = -1;
    sequence_pin *pin = NULL;
    if (sequence_key != NULL && sequence_key[0] != '\0') {
        bool found;
        pin = pin_slot(p, sequence_key, &found);
        if (found && pin->worker >= 0 && (candidates & (1ull << pin->worker)))
            chosen = pin->worker;
    }
    /* A new sequence goes where its id hashes among the candidates, so one
     * whose pin was forgotten still lands on the same worker while the
     * workers are unchanged (its state lives there). */
    if (chosen < 0 && pin != NULL)
        chosen = (int)nth_of(candidates, hash_str(sequence_key));
    if (chosen < 0)
        chosen = (int)nth_of(candidates, p->rr++);
    if (pin != NULL) {
        if (pin->key == NULL || strcmp(pin->key, sequence_key) != 0) {
            free(pin->key);
            pin->key = strdup(sequence_key);
        }
        pin->worker = chosen;
        pin->used = ++p->pin_clock;
    }
    int rc = take(p, (size_t)chosen, now);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int pjs_gw_pool_pick_any(pjs_gw_pool *p, uint64_t tried, pjs_error *err)
{
    pthread_mutex_lock(&p->lock);
    uint64_t now = now_ms();
    uint64_t candidates = available_mask(p, now) & ~tried;
    int rc = -1;
    if (candidates == 0)
        pjs_error_set(err, PJS_ERR_UNAVAILABLE, "no worker is available; retry later");
    else
        rc = take(p, nth_of(candidates, p->rr++), now);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

uint64_t pjs_gw_pool_available(pjs_gw_pool *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t mask = available_mask(p, now_ms());
    pthread_mutex_unlock(&p->lock);
    return mask;
}

bool pjs_gw_pool_ready(pjs_gw_pool *p)
{
    uint64_t now = now_ms();
    bool any = false, all = true;
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < p->n; i++) {
        if (!available(&p->w[i], now))
            continue;
        any = true;
        all = all && p->w[i].server_ready;
    }
    pthread_mutex_unlock(&p->lock);
    return any && (all || !p->o.strict_readiness);
}

static bool change_class(pjs_gw_change_kind k)
{
    return k == PJS_GW_CHANGE_RESIDENCY; /* loads and unloads replace each other */
}

static void free_change(change_entry *e)
{
    free(e->model);
    free(e->config);
}

static bool same_change_class(const change_entry *e, const char *model, pjs_gw_change_kind k)
{
    return strcmp(e->model, model) == 0 && change_class(e->kind) == change_class(k);
}

/* Drops the remembered entries for which drop(entry, arg) holds, keeping
 * the others in order. Lock held. */
static void drop_changes(pjs_gw_pool *p, bool (*drop)(const change_entry *, const void *),
                         const void *arg)
{
    size_t k = 0;
    for (size_t j = 0; j < p->n_changes; j++) {
        change_entry *e = &p->changes[j];
        if (drop(e, arg))
            free_change(e);
        else
            p->changes[k++] = *e;
    }
    p->n_changes = k;
}

/* Remembers `c` as pending until a worker's answer settles it; returns its
 * number, 0 when it could not be remembered. Lock held. */
static uint64_t remember_change(pjs_gw_pool *p, const pjs_gw_change *c)
{
    if (p->n_changes == p->cap_changes) {
        size_t cap = p->cap_changes ? 2 * p->cap_changes : 16;
        change_entry *grown = realloc(p->changes, cap * sizeof *grown);
        if (grown == NULL) {
            pjs_warn("gateway: no memory to remember the change of model '%s'; a worker "
                     "restarted later will not get it",
                     c->model);
            return 0;
        }
        p->changes = grown;
        p->cap_changes = cap;
    }
    change_entry e = {.seq = ++p->change_seq, .pending = true, .kind = c->kind,
                      .model = strdup(c->model), .config = c->config ? strdup(c->config) : NULL,
                      .residency = c->residency, .repository = c->repository};
    if (e.model == NULL || (c->config != NULL && e.config == NULL)) {
        free_change(&e);
        pjs_warn("gateway: no memory to remember the change of model '%s'; a worker "
                 "restarted later will not get it",
                 c->model);
        return 0;
    }
    p->changes[p->n_changes++] = e;
    return e.seq;
}

static bool is_change(const change_entry *e, const void *seq)
{
    return e->seq == *(const uint64_t *)seq;
}

/* An earlier change of the settled one's model and class: the settled one
 * decides what a worker ends with. */
static bool superseded_by(const change_entry *e, const void *settled)
{
    const change_entry *s = settled;
    return e->seq < s->seq && same_change_class(e, s->model, s->kind);
}

void pjs_gw_pool_change_settled(pjs_gw_pool *p, uint64_t seq, bool accepted)
{
    if (seq == 0)
        return;
    pthread_mutex_lock(&p->lock);
    change_entry *settled = NULL;
    for (size_t j = 0; j < p->n_changes && settled == NULL; j++)
        if (p->changes[j].seq == seq)
            settled = &p->changes[j];
    if (settled != NULL && !accepted) {
        drop_changes(p, is_change, &seq);
    } else if (settled != NULL) {
        settled->pending = false;
        change_entry key = {.seq = seq, .kind = settled->kind, .model = settled->model};
        drop_changes(p, superseded_by, &key);
    }
    pthread_mutex_unlock(&p->lock);
}

/* The targets of a change, each counted in flight; the change
 * remembered in the same step, so a worker being brought up to date either
 * gets it sent here or finds it among those to send it again. */
static uint64_t change_targets(pjs_gw_pool *p, const pjs_gw_change *change,
                               uint64_t *change_seq)
{
    pthread_mutex_lock(&p->lock);
    *change_seq = change != NULL ? remember_change(p, change) : 0;
    uint64_t mask = 0;
    for (size_t i = 0; i < p->n; i++) {
        worker *w = &p->w[i];
        if (w->state == PJS_GW_WORKER_UNHEALTHY || w->gone || w->needs_replay)
            continue;
        w->in_flight++;
        w->forwarded++;
        mask |= 1ull << i;
    }
    pthread_mutex_unlock(&p->lock);
    return mask;
}

uint64_t pjs_gw_pool_take_not_down(pjs_gw_pool *p, const pjs_gw_change *change,
                                   uint64_t *change_seq, pjs_error *err)
{
    uint64_t mask = change_targets(p, change, change_seq);
    if (mask == 0) {
        pjs_gw_pool_change_settled(p, *change_seq, false); /* sent nowhere */
        *change_seq = 0;
        pjs_error_set(err, PJS_ERR_UNAVAILABLE, "no worker is up; retry later");
    }
    return mask;
}

void pjs_gw_pool_done(pjs_gw_pool *p, int i, pjs_gw_outcome o)
{
    if (i < 0 || (size_t)i >= p->n)
        return;
    pthread_mutex_lock(&p->lock);
    worker *w = &p->w[i];
    if (w->in_flight > 0)
        w->in_flight--;
    bool was_trial = w->trial_in_flight;
    w->trial_in_flight = false;
    if (o == PJS_GW_ANSWERED) {
        w->answered++;
        if (w->breaker_open)
            pjs_info("gateway: worker %d answers again; its circuit breaker is closed", i);
        w->breaker_open = false;
        w->forward_failures = 0;
    } else {
        w->failed++;
        w->forward_failures++;
        if (o == PJS_GW_NOT_SENT) {
            mark_unhealthy(p, (size_t)i, "a request could not reach it");
            p->probe_now = true;
            pthread_cond_signal(&p->wake);
        }
        if (was_trial || w->forward_failures >= p->o.breaker_failures) {
            if (!w->breaker_open)
                pjs_warn("gateway: %u requests in a row to worker %d failed; its circuit breaker "
                         "is open for %u ms",
                         w->forward_failures, i, p->o.breaker_open_ms);
            w->breaker_open = true;
            w->breaker_until_ms = now_ms() + p->o.breaker_open_ms;
        }
    }
    pthread_mutex_unlock(&p->lock);
}

/* ---- probes --------------------------------------------------------------------- */

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

void pjs_gw_free_names(char **names, size_t n)
{
    free_names(names, n);
}

/* A worker's own readiness (ServerReady), asked under strict readiness
 * (true otherwise). It decides the gateway's readiness only, never whether
 * the worker takes traffic: one that does not answer it is not ready. */
static bool probe_server_ready(pjs_gw_pool *p, grpc_channel *ch)
{
    if (!p->o.strict_readiness)
        return true;
    Inference__ServerReadyRequest rq = INFERENCE__SERVER_READY_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    pjs_error err;
    if (pjs_gw_unary(ch, "/inference.GRPCInferenceService/ServerReady", &rq.base,
                     &inference__server_ready_response__descriptor, p->token,
                     p->o.probe_timeout_ms, &resp, &err) != 0)
        return false;
    bool ready = ((Inference__ServerReadyResponse *)resp)->ready;
    protobuf_c_message_free_unpacked(resp, NULL);
    return ready;
}

/* The ready models of one worker, sorted, and its ServerReady, or an
 * error. */
static int probe_worker(pjs_gw_pool *p, size_t i, char ***names, size_t *n, bool *ready,
                        pjs_error *err)
{
    *names = NULL;
    *n = 0;
    *ready = false;
    grpc_channel *ch = p->w[i].channel;
    /* Live, not ready: a worker whose repository holds a bundle it refused
     * is not ready, yet serves every other model. */
    Inference__ServerLiveRequest live_rq = INFERENCE__SERVER_LIVE_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    int rc = pjs_gw_unary(ch, "/inference.GRPCInferenceService/ServerLive", &live_rq.base,
                          &inference__server_live_response__descriptor, p->token,
                          p->o.probe_timeout_ms, &resp, err);
    if (rc != 0)
        return rc;
    bool live = ((Inference__ServerLiveResponse *)resp)->live;
    protobuf_c_message_free_unpacked(resp, NULL);
    if (!live)
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "it is not live");
    *ready = probe_server_ready(p, ch);
    Inference__RepositoryIndexRequest index_rq = INFERENCE__REPOSITORY_INDEX_REQUEST__INIT;
    index_rq.ready = true;
    rc = pjs_gw_unary(ch, "/inference.GRPCInferenceService/RepositoryIndex", &index_rq.base,
                      &inference__repository_index_response__descriptor, p->token,
                      p->o.probe_timeout_ms, &resp, err);
    if (rc != 0)
        return rc;
    Inference__RepositoryIndexResponse *index = (Inference__RepositoryIndexResponse *)resp;
    if (index->n_models > PJS_GW_MAX_WORKER_MODELS) {
        size_t listed = index->n_models;
        protobuf_c_message_free_unpacked(resp, NULL);
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "its repository index lists %zu models, more than the %d a worker "
                             "may hold; not taken",
                             listed, PJS_GW_MAX_WORKER_MODELS);
    }
    char **list = calloc(index->n_models ? index->n_models : 1, sizeof *list);
    size_t k = 0;
    for (size_t j = 0; list != NULL && j < index->n_models; j++) {
        const Inference__RepositoryIndexResponse__ModelIndex *m = index->models[j];
        if (m->state == NULL || strcmp(m->state, "READY") != 0 || m->name == NULL)
            continue;
        if ((list[k] = strdup(m->name)) != NULL)
            k++;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    if (list == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the model list");
    /* Sorted, then each name once (a worker lists a model once per version). */
    qsort(list, k, sizeof *list, cmp_str);
    size_t unique = 0;
    for (size_t j = 0; j < k; j++) {
        if (unique > 0 && strcmp(list[unique - 1], list[j]) == 0)
            free(list[j]);
        else
            list[unique++] = list[j];
    }
    *names = list;
    *n = unique;
    return 0;
}

static bool same_names(char *const *a, size_t n_a, char *const *b, size_t n_b)
{
    if (n_a != n_b)
        return false;
    for (size_t i = 0; i < n_a; i++)
        if (strcmp(a[i], b[i]) != 0)
            return false;
    return true;
}

static void record_probe(pjs_gw_pool *p, size_t i, int rc, char **names, size_t n, bool ready,
                         const pjs_error *err)
{
    worker *w = &p->w[i];
    if (rc == 0)
        w->server_ready = ready;
    if (rc == 0 && w->needs_replay) {
        /* Answers, but lacks the changes made through the gateway: it waits
         * for pjs_gw_pool_probe_worker to send them. */
        w->probe_failures = 0;
        free_names(names, n);
        return;
    }
    if (rc == PJS_ERR_RESOURCE_EXHAUSTED && !w->told_oversized) {
        pjs_warn("gateway: worker %zu (gRPC %s): %s", i, w->addr.grpc, err->msg);
        w->told_oversized = true;
    }
    if (rc == 0) {
        w->answered = 0;
        w->told_oversized = false;
        if (w->state != PJS_GW_WORKER_READY) {
            pjs_info("gateway: worker %zu (gRPC %s, HTTP %s) is ready with %zu models", i,
                     w->addr.grpc, w->addr.http, n);
            /* Back from unhealthy (often a restarted process): a clean slate. */
            w->breaker_open = false;
            w->forward_failures = 0;
        }
        w->state = PJS_GW_WORKER_READY;
        w->probe_failures = 0;
        if (same_names(w->models, w->n_models, names, n)) {
            free_names(names, n);
            return;
        }
        free_names(w->models, w->n_models);
        w->models = names;
        w->n_models = n;
        p->models_changed = true;
        return;
    }
    /* A busy worker may answer a probe late; one that answered requests
     * since the last probe is alive whatever the probe says. */
    if (w->answered > 0) {
        w->answered = 0;
        return;
    }
    w->probe_failures++;
    if (w->state == PJS_GW_WORKER_READY && w->probe_failures >= p->o.unhealthy_after)
        mark_unhealthy(p, i, err->msg);
}

/* Device nanoseconds a model's executions took on one worker so far. */
static uint64_t compute_ns(const Inference__ModelStatistics *s)
{
    uint64_t ns = 0;
    for (size_t b = 0; b < s->n_batch_stats; b++) {
        const Inference__InferBatchStatistics *bs = s->batch_stats[b];
        if (bs->compute_infer != NULL)
            ns += bs->compute_infer->ns;
    }
    if (ns == 0 && s->inference_stats != NULL && s->inference_stats->compute_infer != NULL)
        ns = s->inference_stats->compute_infer->ns;
    return ns;
}

/* Reads every worker's statistics, updates each model's cost and, when a
 * better placement is found, takes it. */
static void rebalance(pjs_gw_pool *p, double seconds)
{
    pthread_mutex_lock(&p->lock);
    for (size_t k = 0; k < p->n_models; k++)
        p->models[k].cost = 0;
    pthread_mutex_unlock(&p->lock);
    for (size_t i = 0; i < p->n; i++) {
        Inference__ModelStatisticsRequest rq = INFERENCE__MODEL_STATISTICS_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        pjs_error err;
        if (pjs_gw_unary(p->w[i].channel, "/inference.GRPCInferenceService/ModelStatistics",
                         &rq.base, &inference__model_statistics_response__descriptor, p->token,
                         p->o.probe_timeout_ms, &resp, &err) != 0)
            continue;
        const Inference__ModelStatisticsResponse *st = (void *)resp;
        pthread_mutex_lock(&p->lock);
        for (size_t j = 0; j < st->n_model_stats; j++) {
            model_entry *e = find_model(p, st->model_stats[j]->name);
            if (e == NULL)
                continue;
            uint64_t ns = compute_ns(st->model_stats[j]);
            uint64_t grown = ns >= e->compute_ns[i] ? ns - e->compute_ns[i] : 0;
            e->compute_ns[i] = ns;
            e->cost += (double)grown / 1e9 / seconds;
        }
        pthread_mutex_unlock(&p->lock);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    pthread_mutex_lock(&p->lock);
    size_t n = p->n_models;
    double *cost = calloc(n ? n : 1, sizeof *cost);
    uint64_t *current = calloc(n ? n : 1, sizeof *current);
    uint64_t *proposed = calloc(n ? n : 1, sizeof *proposed);
    if (cost != NULL && current != NULL && proposed != NULL) {
        /* A floor under every cost, so models with no traffic measured
         * yet are spread by count rather than piled on one worker. */
        for (size_t k = 0; k < n; k++) {
            cost[k] = p->models[k].cost + IDLE_MODEL_COST;
            current[k] = p->models[k].placed;
        }
        pjs_gw_lpt_place(cost, n, p->n, p->o.lpt_devices_per_model, proposed);
        if (pjs_gw_placement_better(cost, current, proposed, n, p->n)) {
            for (size_t k = 0; k < n; k++)
                p->models[k].placed = proposed[k];
            pjs_info("gateway: lpt_packing placed %zu models on %zu workers (%u each); busiest "
                     "worker's share %.3f device s/s",
                     n, p->n, p->o.lpt_devices_per_model,
                     pjs_gw_makespan(cost, proposed, n, p->n));
        }
    }
    pthread_mutex_unlock(&p->lock);
    free(cost);
    free(current);
    free(proposed);
}

static grpc_channel *open_channel(const char *target);

/* Adds a worker at `addr` (probe thread only); false when the pool is full. */
static bool add_worker(pjs_gw_pool *p, const pjs_gw_worker_addr *addr)
{
    size_t i = p->n;
    if (i == PJS_GW_MAX_WORKERS)
        return false;
    worker *w = &p->w[i];
    memset(w, 0, sizeof *w);
    w->addr = *addr;
    w->channel = open_channel(addr->grpc);
    p->n = i + 1; /* counted only once filled */
    if (p->o.on_worker_added != NULL)
        p->o.on_worker_added(p->o.ctx, i);
    return true;
}

/* Re-resolves the DNS name when due: new addresses join, vanished ones get
 * no traffic until they resolve again. Probe thread only. */
static void refresh_dns(pjs_gw_pool *p)
{
    uint64_t now = now_ms();
    if (p->o.dns_name == NULL ||
        (p->last_dns_ms != 0 && now - p->last_dns_ms < p->o.dns_refresh_ms))
        return;
    p->last_dns_ms = now;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *list = NULL;
    int gai = getaddrinfo(p->o.dns_name, NULL, &hints, &list);
    if (gai != 0) {
        if (!p->dns_failing)
            pjs_warn("gateway: cannot resolve %s: %s; keeping the workers known so far",
                     p->o.dns_name, gai_strerror(gai));
        p->dns_failing = true;
        return;
    }
    p->dns_failing = false;
    bool seen[PJS_GW_MAX_WORKERS] = {false};
    for (struct addrinfo *ai = list; ai != NULL; ai = ai->ai_next) {
        char host[INET6_ADDRSTRLEN];
        const void *a = ai->ai_family == AF_INET6
                            ? (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                            : (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr;
        if (inet_ntop(ai->ai_family, a, host, sizeof host) == NULL)
            continue;
        const char *fmt = ai->ai_family == AF_INET6 ? "[%s]:%d" : "%s:%d";
        pjs_gw_worker_addr addr;
        snprintf(addr.grpc, sizeof addr.grpc, fmt, host, p->o.dns_grpc_port);
        snprintf(addr.http, sizeof addr.http, fmt, host, p->o.dns_http_port);
        snprintf(addr.metrics, sizeof addr.metrics, fmt, host, p->o.dns_metrics_port);
        size_t i = 0;
        while (i < p->n && strcmp(p->w[i].addr.grpc, addr.grpc) != 0)
            i++;
        if (i < p->n) {
            seen[i] = true;
            continue;
        }
        if (!add_worker(p, &addr)) {
            pjs_warn("gateway: %s resolves to more than %d workers; %s is left out",
                     p->o.dns_name, PJS_GW_MAX_WORKERS, addr.grpc);
            continue;
        }
        seen[i] = true;
        pjs_info("gateway: worker %zu (gRPC %s, HTTP %s) joined from %s", i, addr.grpc,
                 addr.http, p->o.dns_name);
    }
    freeaddrinfo(list);
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < p->n; i++) {
        if (p->w[i].gone == !seen[i])
            continue;
        p->w[i].gone = !seen[i];
        pjs_info("gateway: worker %zu (gRPC %s) %s %s", i, p->w[i].addr.grpc,
                 seen[i] ? "resolves again from" : "no longer resolves from", p->o.dns_name);
    }
    pthread_mutex_unlock(&p->lock);
}

static void *probe_thread(void *arg)
{
    pjs_gw_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        p->probe_now = false;
        pthread_mutex_unlock(&p->lock);
        refresh_dns(p);
        for (size_t i = 0; i < p->n; i++) {
            char **names;
            size_t n;
            pjs_error err;
            pthread_mutex_lock(&p->lock);
            bool gone = p->w[i].gone;
            pthread_mutex_unlock(&p->lock);
            if (gone)
                continue;
            bool ready;
            int rc = probe_worker(p, i, &names, &n, &ready, &err);
            pthread_mutex_lock(&p->lock);
            record_probe(p, i, rc, names, n, ready, &err);
            pthread_mutex_unlock(&p->lock);
        }
        pthread_mutex_lock(&p->lock);
        if (p->models_changed)
            rebuild_models(p);
        uint64_t now = now_ms();
        bool place = p->o.routing == PJS_GW_LPT_PACKING &&
                     (p->last_placement_ms == 0 ||
                      now - p->last_placement_ms >= PLACEMENT_EVERY_MS);
        if (place) {
            double seconds = p->last_placement_ms == 0
                                 ? PLACEMENT_EVERY_MS / 1e3
                                 : (double)(now - p->last_placement_ms) / 1e3;
            p->last_placement_ms = now;
            pthread_mutex_unlock(&p->lock);
            rebalance(p, seconds);
            pthread_mutex_lock(&p->lock);
        }
        if (p->stop || p->probe_now)
            continue;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)p->o.probe_interval_ms * 1000000u;
        until.tv_sec += (time_t)(ns / 1000000000u);
        until.tv_nsec = (long)(ns % 1000000000u);
        while (!p->stop && !p->probe_now &&
               pthread_cond_timedwait(&p->wake, &p->lock, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static const char *change_name(pjs_gw_change_kind k)
{
    return k == PJS_GW_CHANGE_LOAD ? "load" : k == PJS_GW_CHANGE_UNLOAD ? "unload" : "residency";
}

/* Sends one remembered change to worker i; its answer as pjs_gw_unary's. */
static int send_change(pjs_gw_pool *p, size_t i, const change_entry *e, pjs_error *err)
{
    grpc_channel *ch = p->w[i].channel;
    ProtobufCMessage *resp = NULL;
    int rc;
    if (e->kind == PJS_GW_CHANGE_LOAD) {
        Inference__RepositoryModelLoadRequest rq = INFERENCE__REPOSITORY_MODEL_LOAD_REQUEST__INIT;
        Inference__ModelRepositoryParameter value = INFERENCE__MODEL_REPOSITORY_PARAMETER__INIT;
        Inference__RepositoryModelLoadRequest__ParametersEntry entry =
            INFERENCE__REPOSITORY_MODEL_LOAD_REQUEST__PARAMETERS_ENTRY__INIT;
        Inference__RepositoryModelLoadRequest__ParametersEntry *entries[1] = {&entry};
        rq.model_name = e->model;
        if (e->config != NULL) {
            value.parameter_choice_case =
                INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
            value.string_param = e->config;
            entry.key = "config";
            entry.value = &value;
            rq.n_parameters = 1;
            rq.parameters = entries;
        }
        rc = pjs_gw_unary(ch, "/inference.GRPCInferenceService/RepositoryModelLoad", &rq.base,
                          &inference__repository_model_load_response__descriptor, p->token,
                          REPLAY_TIMEOUT_MS, &resp, err);
    } else if (e->kind == PJS_GW_CHANGE_UNLOAD) {
        Inference__RepositoryModelUnloadRequest rq =
            INFERENCE__REPOSITORY_MODEL_UNLOAD_REQUEST__INIT;
        rq.model_name = e->model;
        rc = pjs_gw_unary(ch, "/inference.GRPCInferenceService/RepositoryModelUnload", &rq.base,
                          &inference__repository_model_unload_response__descriptor, p->token,
                          REPLAY_TIMEOUT_MS, &resp, err);
    } else {
        Pjserve__Control__V1__SetModelResidencyRequest rq =
            PJSERVE__CONTROL__V1__SET_MODEL_RESIDENCY_REQUEST__INIT;
        rq.name = e->model;
        rq.residency = (Pjserve__Control__V1__Residency)e->residency;
        rc = pjs_gw_unary(ch, "/pjserve.control.v1.ModelControl/SetModelResidency", &rq.base,
                          &pjserve__control__v1__model_status__descriptor, p->token,
                          REPLAY_TIMEOUT_MS, &resp, err);
    }
    if (rc == 0 && resp != NULL)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* Sends a restarted worker the remembered changes it has not had, in order,
 * then lets it take new ones; false when it could not be reached (the rest
 * is sent at the next call). */
static bool replay_changes(pjs_gw_pool *p, size_t i)
{
    worker *w = &p->w[i];
    unsigned sent = 0, refused = 0;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        const change_entry *next = NULL;
        for (size_t j = 0; j < p->n_changes && next == NULL; j++)
            if (p->changes[j].seq > w->replayed_seq &&
                !(p->changes[j].repository && p->changes[j].seq <= w->restart_seq))
                next = &p->changes[j];
        if (next == NULL) {
            w->needs_replay = false;
            pthread_mutex_unlock(&p->lock);
            if (sent > 0)
                pjs_info("gateway: worker %zu (gRPC %s) restarted: sent it again the %u "
                         "changes made through the gateway (%u refused)",
                         i, w->addr.grpc, sent, refused);
            return true;
        }
        bool has_config = next->config != NULL;
        change_entry e = {.seq = next->seq, .kind = next->kind, .model = strdup(next->model),
                          .config = has_config ? strdup(next->config) : NULL,
                          .residency = next->residency, .repository = next->repository};
        pthread_mutex_unlock(&p->lock);
        if (e.model == NULL || (has_config && e.config == NULL)) {
            free_change(&e);
            return false;
        }
        pjs_error err;
        int rc = send_change(p, i, &e, &err);
        if (rc != 0 && (err.code == PJS_ERR_UNAVAILABLE || err.code == PJS_ERR_DEADLINE_EXCEEDED)) {
            pjs_debug("gateway: worker %zu: the %s of model '%s' not sent again yet: %s", i,
                      change_name(e.kind), e.model, err.msg);
            free_change(&e);
            return false;
        }
        if (rc != 0) {
            pjs_warn("gateway: worker %zu (gRPC %s) refused the %s of model '%s' made through "
                     "the gateway before it restarted: %s",
                     i, w->addr.grpc, change_name(e.kind), e.model, err.msg);
            refused++;
        }
        sent++;
        pthread_mutex_lock(&p->lock);
        if (w->replayed_seq < e.seq)
            w->replayed_seq = e.seq;
        pthread_mutex_unlock(&p->lock);
        free_change(&e);
    }
}

/* ---- the repository watcher's changes ------------------------------------------- */

/* One worker's part of a change being applied (its own thread). */
typedef struct apply_send {
    pjs_gw_pool *p;
    size_t worker;
    const change_entry *change;
    pthread_t thread;
    bool started;
    int rc;
    pjs_error err;
} apply_send;

static void *apply_send_run(void *arg)
{
    apply_send *a = arg;
    a->rc = send_change(a->p, a->worker, a->change, &a->err);
    return NULL;
}

/* Sends change `e` to the workers of `mask` at once and waits for every
 * answer; returns the mask of those that took it and counts the rest. */
static uint64_t apply_to(pjs_gw_pool *p, const change_entry *e, uint64_t mask,
                         pjs_gw_applied *out)
{
    apply_send sends[PJS_GW_MAX_WORKERS];
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (!(mask & (1ull << i)))
            continue;
        apply_send *a = &sends[n++];
        *a = (apply_send){.p = p, .worker = i, .change = e};
        a->started = pthread_create(&a->thread, NULL, apply_send_run, a) == 0;
        if (!a->started) /* no thread to spare: sent from this one */
            apply_send_run(a);
    }
    uint64_t took = 0;
    for (size_t k = 0; k < n; k++) {
        apply_send *a = &sends[k];
        if (a->started)
            pthread_join(a->thread, NULL);
        bool absent = a->rc != 0 && e->kind == PJS_GW_CHANGE_UNLOAD &&
                      a->err.code == PJS_ERR_NOT_FOUND;
        if (a->rc == 0 || absent) {
            took |= 1ull << a->worker;
            out->accepted++;
        } else if (a->err.code == PJS_ERR_UNAVAILABLE ||
                   a->err.code == PJS_ERR_DEADLINE_EXCEEDED) {
            pjs_warn("gateway: worker %zu (gRPC %s) not reached for the %s of model '%s': %s; "
                     "it gets it if it is restarted",
                     a->worker, p->w[a->worker].addr.grpc, change_name(e->kind), e->model,
                     a->err.msg);
            out->unreached++;
        } else {
            pjs_warn("gateway: worker %zu (gRPC %s) refused the %s of model '%s': %s", a->worker,
                     p->w[a->worker].addr.grpc, change_name(e->kind), e->model, a->err.msg);
            if (out->refused++ == 0)
                snprintf(out->refusal, sizeof out->refusal, "%.*s", (int)sizeof out->refusal - 1,
                         a->err.msg);
        }
    }
    return took;
}

/* The lower half of `mask`'s workers, at least one. */
static uint64_t first_half(uint64_t mask)
{
    unsigned half = ((unsigned)__builtin_popcountll(mask) + 1) / 2;
    uint64_t first = 0;
    for (size_t i = 0; i < PJS_GW_MAX_WORKERS && half > 0; i++)
        if (mask & (1ull << i)) {
            first |= 1ull << i;
            half--;
        }
    return first;
}

/* Where model `model`'s requests go from now on (NULL: as the table says). */
static void steer(pjs_gw_pool *p, const char *model, uint64_t to)
{
    char *copy = model != NULL ? strdup(model) : NULL;
    pthread_mutex_lock(&p->lock);
    free(p->steered);
    p->steered = copy;
    p->steer_to = to;
    pthread_mutex_unlock(&p->lock);
}

void pjs_gw_pool_apply_change(pjs_gw_pool *p, const pjs_gw_change *change, pjs_gw_applied *out)
{
    memset(out, 0, sizeof *out);
    change_entry e = {.kind = change->kind, .model = (char *)change->model,
                      .config = (char *)change->config, .residency = change->residency,
                      .repository = change->repository};
    pthread_mutex_lock(&p->lock);
    e.seq = remember_change(p, change);
    uint64_t targets = 0;
    for (size_t i = 0; i < p->n; i++) {
        worker *w = &p->w[i];
        if (w->state == PJS_GW_WORKER_UNHEALTHY || w->gone || w->needs_replay)
            continue;
        if (w->state == PJS_GW_WORKER_STARTING) {
            /* In its first start: it may have read the repository before
             * the change, and its ports open only once it has loaded it. */
            w->needs_replay = true;
            out->later++;
            continue;
        }
        targets |= 1ull << i;
    }
    pthread_mutex_unlock(&p->lock);
    uint64_t first = e.kind == PJS_GW_CHANGE_LOAD ? first_half(targets) : targets;
    if (first != targets)
        steer(p, e.model, targets & ~first);
    uint64_t took = apply_to(p, &e, first, out);
    if (first != targets && (took != 0 || out->unreached > 0)) {
        steer(p, e.model, took);
        took |= apply_to(p, &e, targets & ~first, out);
    }
    steer(p, NULL, 0);
    pjs_gw_pool_change_settled(p, e.seq, took != 0 || out->refused == 0);
}

void pjs_gw_pool_worker_restarted(pjs_gw_pool *p, size_t i)
{
    if (i >= p->n)
        return;
    pthread_mutex_lock(&p->lock);
    worker *w = &p->w[i];
    if (!w->needs_replay) /* the first call: before the new process is started */
        w->restart_seq = p->change_seq;
    w->needs_replay = true;
    w->replayed_seq = 0;
    w->state = PJS_GW_WORKER_STARTING;
    p->probe_now = true;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
}

bool pjs_gw_pool_probe_worker(pjs_gw_pool *p, size_t i)
{
    if (i >= p->n)
        return false;
    pthread_mutex_lock(&p->lock);
    bool behind = p->w[i].needs_replay;
    pthread_mutex_unlock(&p->lock);
    if (behind && !replay_changes(p, i))
        return false;
    char **names;
    size_t n;
    pjs_error err;
    bool server_ready;
    int rc = probe_worker(p, i, &names, &n, &server_ready, &err);
    pthread_mutex_lock(&p->lock);
    record_probe(p, i, rc, names, n, server_ready, &err);
    if (p->models_changed)
        rebuild_models(p);
    bool ready = p->w[i].state == PJS_GW_WORKER_READY;
    pthread_mutex_unlock(&p->lock);
    return ready;
}

/* ---- life ------------------------------------------------------------------------ */

static grpc_arg int_arg(const char *key, int value)
{
    grpc_arg a;
    memset(&a, 0, sizeof a);
    a.type = GRPC_ARG_INTEGER;
    a.key = (char *)key;
    a.value.integer = value;
    return a;
}

static grpc_channel *open_channel(const char *target)
{
    grpc_arg args[] = {
        int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1),
        int_arg(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1),
        int_arg(GRPC_ARG_ENABLE_RETRIES, 0),
        int_arg(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100),
        int_arg(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100),
        int_arg(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000),
        /* One connection per worker, not one per gateway thread. */
        int_arg(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1),
    };
    grpc_channel_args ca = {.num_args = sizeof args / sizeof args[0], .args = args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, &ca);
    grpc_channel_credentials_release(creds);
    return ch;
}

int pjs_gw_pool_create(const pjs_gw_pool_options *o, pjs_gw_pool **out, pjs_error *err)
{
    *out = NULL;
    if (o->n_workers == 0 && o->dns_name == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "no workers: give at least one --worker or a DNS name");
    if (o->n_workers > PJS_GW_MAX_WORKERS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%zu workers: at most %d are supported",
                             o->n_workers, PJS_GW_MAX_WORKERS);
    pjs_gw_pool *p = calloc(1, sizeof *p);
    if (p == NULL || (p->pins = calloc(SEQUENCE_SLOTS, sizeof *p->pins)) == NULL) {
        free(p);
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the worker pool");
    }
    p->o = *o;
    p->o.workers = NULL;
    if (p->o.lpt_devices_per_model == 0)
        p->o.lpt_devices_per_model = 1;
    if (p->o.probe_interval_ms == 0)
        p->o.probe_interval_ms = 500;
    if (p->o.probe_timeout_ms == 0)
        p->o.probe_timeout_ms = 2000;
    if (p->o.unhealthy_after == 0)
        p->o.unhealthy_after = 3;
    if (p->o.breaker_failures == 0)
        p->o.breaker_failures = 5;
    if (p->o.breaker_open_ms == 0)
        p->o.breaker_open_ms = 2000;
    if (p->o.dns_refresh_ms == 0)
        p->o.dns_refresh_ms = 10000;
    if (p->o.dns_grpc_port == 0)
        p->o.dns_grpc_port = 8001;
    if (p->o.dns_http_port == 0)
        p->o.dns_http_port = 8000;
    if (p->o.dns_metrics_port == 0)
        p->o.dns_metrics_port = 8002;
    p->dns_name = o->dns_name ? strdup(o->dns_name) : NULL;
    p->o.dns_name = p->dns_name;
    p->token = o->worker_token ? strdup(o->worker_token) : NULL;
    p->o.worker_token = p->token;
    pthread_mutex_init(&p->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->wake, &ca);
    pthread_condattr_destroy(&ca);
    grpc_init();
    p->n = o->n_workers;
    for (size_t i = 0; i < p->n; i++) {
        p->w[i].addr = o->workers[i];
        p->w[i].channel = open_channel(o->workers[i].grpc);
    }
    int e = pthread_create(&p->prober, NULL, probe_thread, p);
    if (e != 0) {
        pjs_gw_pool_destroy(p);
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED, "cannot start the probe thread: %s",
                             strerror(e));
    }
    pjs_thread_name(p->prober, "pjs-probe");
    p->prober_running = true;
    *out = p;
    return 0;
}

void pjs_gw_pool_destroy(pjs_gw_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    if (p->prober_running)
        pthread_join(p->prober, NULL);
    for (size_t i = 0; i < p->n; i++) {
        if (p->w[i].channel != NULL)
            grpc_channel_destroy(p->w[i].channel);
        free_names(p->w[i].models, p->w[i].n_models);
    }
    for (size_t k = 0; k < p->n_models; k++)
        free(p->models[k].name);
    free(p->models);
    for (size_t k = 0; k < p->n_changes; k++)
        free_change(&p->changes[k]);
    free(p->changes);
    free(p->steered);
    for (size_t s = 0; s < SEQUENCE_SLOTS; s++)
        free(p->pins[s].key);
    free(p->pins);
    free(p->token);
    free(p->dns_name);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p);
    grpc_shutdown();
}

/* ---- views ------------------------------------------------------------------------ */

size_t pjs_gw_pool_size(const pjs_gw_pool *p)
{
    return p->n;
}

pjs_gw_routing pjs_gw_pool_routing(const pjs_gw_pool *p)
{
    return p->o.routing;
}

const pjs_gw_worker_addr *pjs_gw_pool_addr(const pjs_gw_pool *p, size_t i)
{
    return &p->w[i].addr;
}

const char *pjs_gw_pool_worker_token(const pjs_gw_pool *p)
{
    return p->token;
}

void pjs_gw_pool_count_retry(pjs_gw_pool *p, pjs_gw_protocol protocol)
{
    atomic_fetch_add_explicit(&p->retries[protocol], 1, memory_order_relaxed);
}

uint64_t pjs_gw_pool_retries(const pjs_gw_pool *p, pjs_gw_protocol protocol)
{
    return atomic_load_explicit(&((pjs_gw_pool *)p)->retries[protocol], memory_order_relaxed);
}

grpc_channel *pjs_gw_pool_channel(const pjs_gw_pool *p, size_t i)
{
    return p->w[i].channel;
}

void pjs_gw_pool_view(pjs_gw_pool *p, size_t i, pjs_gw_worker_view *out)
{
    pthread_mutex_lock(&p->lock);
    const worker *w = &p->w[i];
    *out = (pjs_gw_worker_view){.state = w->state,
                                .breaker_open = w->breaker_open,
                                .in_flight = w->in_flight,
                                .forwarded = w->forwarded,
                                .failed = w->failed,
                                .n_models = w->n_models};
    pthread_mutex_unlock(&p->lock);
}

char **pjs_gw_pool_models(pjs_gw_pool *p, size_t i, size_t *n)
{
    pthread_mutex_lock(&p->lock);
    const worker *w = &p->w[i];
    char **copy = calloc(w->n_models ? w->n_models : 1, sizeof *copy);
    size_t k = 0;
    for (size_t j = 0; copy != NULL && j < w->n_models; j++)
        if ((copy[k] = strdup(w->models[j])) != NULL)
            k++;
    pthread_mutex_unlock(&p->lock);
    *n = k;
    return copy;
}
