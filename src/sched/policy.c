/*
 * policy.c - the scheduler's decisions (see policy.h).
 */
#include "sched/policy.h"

#include <math.h>
#include <string.h>

const char *pjs_discipline_name(pjs_discipline d)
{
    switch (d) {
    case PJS_DISCIPLINE_FIFO: return "fifo";
    case PJS_DISCIPLINE_EDF: return "edf";
    default: return "fair";
    }
}

int pjs_discipline_parse(const char *s)
{
    if (strcmp(s, "fair") == 0)
        return PJS_DISCIPLINE_FAIR;
    if (strcmp(s, "fifo") == 0)
        return PJS_DISCIPLINE_FIFO;
    if (strcmp(s, "edf") == 0)
        return PJS_DISCIPLINE_EDF;
    return -1;
}

const char *pjs_hand_off_name(pjs_hand_off h)
{
    return h == PJS_HAND_OFF_OFF ? "off" : "on";
}

int pjs_hand_off_parse(const char *s)
{
    if (strcmp(s, "on") == 0)
        return PJS_HAND_OFF_ON;
    if (strcmp(s, "off") == 0)
        return PJS_HAND_OFF_OFF;
    return -1;
}

void pjs_sched_config_defaults(pjs_sched_config *c)
{
    *c = (pjs_sched_config){
        .discipline = PJS_DISCIPLINE_FAIR,
        .half_life_s = 1.0,
        .coalesce_discount = 0.5,
        .fair_clamp = 4.0,
        .cost_smoothing = 0.2,
        .edf_laxity_margin_us = 0,
        .max_queue_depth = 1024,
        .default_timeout_us = 0,
        .warmup_runs = 2,
        .cold_model_defer_ms = 10.0,
        .eviction = PJS_EVICTION_LFU,
        .weight_prefetch = true,
        .hand_off = PJS_HAND_OFF_ON,
    };
}

int pjs_sched_config_check(const pjs_sched_config *c, pjs_error *err)
{
    if (c->discipline != PJS_DISCIPLINE_FAIR && c->discipline != PJS_DISCIPLINE_FIFO &&
        c->discipline != PJS_DISCIPLINE_EDF)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.discipline: expected fair, fifo or edf");
    if (!(c->half_life_s > 0) || !isfinite(c->half_life_s))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.half_life_ms: must be a positive number of milliseconds");
    if (!(c->coalesce_discount >= 0 && c->coalesce_discount <= 1))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.coalesce_discount: must be between 0 and 1");
    if (!(c->fair_clamp >= 1) || !isfinite(c->fair_clamp))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.fair_clamp: must be a finite number >= 1");
    if (!(c->cost_smoothing > 0 && c->cost_smoothing <= 1))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.cost_smoothing: must be in (0, 1]");
    if (c->max_queue_depth < 1)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.max_queue_depth: must be at least 1");
    if (!(c->cold_model_defer_ms >= 0 && c->cold_model_defer_ms <= 60000))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.cold_model_defer_ms: must be between 0 and 60000");
    if (c->eviction != PJS_EVICTION_LFU && c->eviction != PJS_EVICTION_LRU)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.eviction_policy: expected lfu or lru");
    if (c->hand_off != PJS_HAND_OFF_ON && c->hand_off != PJS_HAND_OFF_OFF)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.hand_off: expected on or off");
    if (c->warmup_runs < 0 || c->warmup_runs > 100)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.warmup_runs: must be between 0 and 100");
    return 0;
}

/* ---- queues ------------------------------------------------------------------ */

void pjs_sched_init(pjs_sched *s, const pjs_sched_config *cfg)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
}

void pjs_sched_share_init(pjs_sched_share *sh, double weight, size_t max_queue_depth)
{
    memset(sh, 0, sizeof *sh);
    sh->weight = weight;
    sh->max_queue_depth = max_queue_depth;
}

void pjs_sched_queue_init(pjs_sched_queue *q, pjs_sched_share *sh, void *owner, size_t variant,
                          const int64_t *sizes, size_t n_sizes, bool coalesce)
{
    memset(q, 0, sizeof *q);
    q->share = sh;
    q->owner = owner;
    q->variant = variant;
    q->n_sizes = n_sizes < PJS_SCHED_MAX_SIZES ? n_sizes : PJS_SCHED_MAX_SIZES;
    memcpy(q->sizes, sizes, q->n_sizes * sizeof *sizes);
    q->coalesce = coalesce;
}

static void activate(pjs_sched *s, pjs_sched_queue *q)
{
    q->prev_active = NULL;
    q->next_active = s->active;
    if (s->active != NULL)
        s->active->prev_active = q;
    s->active = q;
    q->share->active_queues++;
}

static void deactivate(pjs_sched *s, pjs_sched_queue *q)
{
    if (q->prev_active != NULL)
        q->prev_active->next_active = q->next_active;
    else
        s->active = q->next_active;
    if (q->next_active != NULL)
        q->next_active->prev_active = q->prev_active;
    q->prev_active = q->next_active = NULL;
    q->share->active_queues--;
}

static void limit_idle_credit(pjs_sched *s, pjs_sched_queue *q, const pjs_sched_job *j,
                              uint64_t now);

int pjs_sched_enqueue(pjs_sched *s, pjs_sched_queue *q, pjs_sched_job *j, uint64_t now,
                      pjs_error *err)
{
    if (j->deadline_ns != 0 && now >= j->deadline_ns)
        return pjs_error_set(err, PJS_ERR_DEADLINE_EXCEEDED,
                             "the request's deadline passed before it could be queued");
    if (!j->committed && q->share->queued >= q->share->max_queue_depth)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "the model's queue is full (%zu requests waiting); retry later",
                             q->share->queued);
    if (q->share->queued == 0 && s->cfg.discipline == PJS_DISCIPLINE_FAIR)
        limit_idle_credit(s, q, j, now);
    j->next = NULL;
    if (q->tail != NULL)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    if (q->length++ == 0)
        activate(s, q);
    q->rows += j->rows;
    q->share->queued++;
    if (j->committed) {
        q->committed++;
        s->committed++;
    }
    return 0;
}

bool pjs_sched_promote(pjs_sched *s, pjs_sched_queue *q, pjs_sched_job *j)
{
    if (j->committed)
        return false;
    for (const pjs_sched_job *at = q->head; at != NULL; at = at->next) {
        if (at == j) {
            j->committed = true;
            q->committed++;
            s->committed++;
            return true;
        }
    }
    return false;
}

/* Unlinks j, whose predecessor in q is prev (NULL for the head). */
static void remove_job(pjs_sched *s, pjs_sched_queue *q, pjs_sched_job *prev, pjs_sched_job *j)
{
    if (prev != NULL)
        prev->next = j->next;
    else
        q->head = j->next;
    if (q->tail == j)
        q->tail = prev;
    j->next = NULL;
    q->rows -= j->rows;
    q->share->queued--;
    if (j->committed) {
        q->committed--;
        s->committed--;
    }
    if (--q->length == 0)
        deactivate(s, q);
}

/* Appends j to the list *tail points to the end of. */
static void append(pjs_sched_job ***tail, pjs_sched_job *j)
{
    **tail = j;
    *tail = &j->next;
}

/* ---- costs ------------------------------------------------------------------- */

/* Prior estimate when a queue has never been measured: 1 ms per row. */
#define UNMEASURED_NS_PER_ROW 1e6

/* The moving average of size k, or an extrapolation from the nearest
 * measured size, or the prior. */
static double raw_estimate(const pjs_sched_queue *q, size_t k)
{
    if (q->cost[k].samples > 0)
        return q->cost[k].ns;
    size_t best = q->n_sizes;
    for (size_t i = 0; i < q->n_sizes; i++) {
        if (q->cost[i].samples == 0)
            continue;
        size_t d = i > k ? i - k : k - i;
        size_t bd = best > k ? best - k : k - best;
        if (best == q->n_sizes || d < bd)
            best = i;
    }
    if (best == q->n_sizes)
        return UNMEASURED_NS_PER_ROW * (double)q->sizes[k];
    return q->cost[best].ns * (double)q->sizes[k] / (double)q->sizes[best];
}

/* An estimate too high is never corrected: the size looks slow, is not
 * chosen, and so is not measured again. Two bounds that hold on any device
 * cap it with the measured sizes: size k costs no more than a larger size j
 * (its rows could run padded there), nor more than ceil(k / j) executions of
 * a smaller size j. Estimates too low correct themselves: the size is
 * chosen and measured. */
double pjs_sched_estimate(const pjs_sched_queue *q, size_t k)
{
    double est = raw_estimate(q, k);
    for (size_t j = 0; j < q->n_sizes; j++) {
        if (j == k || q->cost[j].samples == 0)
            continue;
        double runs = j > k ? 1.0 : ceil((double)q->sizes[k] / (double)q->sizes[j]);
        est = fmin(est, runs * q->cost[j].ns);
    }
    return est;
}

void pjs_sched_seed_cost(pjs_sched_queue *q, size_t k, uint64_t device_ns)
{
    q->cost[k].ns = (double)device_ns;
    q->cost[k].samples = 1;
}

static double decayed(const pjs_sched *s, const pjs_sched_share *sh, uint64_t now)
{
    if (sh->recent_ns <= 0 || now <= sh->recent_at)
        return sh->recent_ns;
    double elapsed_s = (double)(now - sh->recent_at) / 1e9;
    return sh->recent_ns * exp2(-elapsed_s / s->cfg.half_life_s);
}

void pjs_sched_record(pjs_sched *s, pjs_sched_queue *q, size_t k, uint64_t now,
                      uint64_t device_ns)
{
    pjs_sched_cost *c = &q->cost[k];
    q->shed_streak = 0;
    if (c->samples == 0)
        c->ns = (double)device_ns;
    else
        c->ns += s->cfg.cost_smoothing * ((double)device_ns - c->ns);
    c->samples++;
    pjs_sched_share *sh = q->share;
    sh->recent_ns = decayed(s, sh, now) + (double)device_ns;
    sh->recent_at = now;
}

void pjs_sched_charge_load(pjs_sched *s, pjs_sched_share *sh, uint64_t now, uint64_t load_ns)
{
    if (sh->load_ns <= 0)
        sh->load_ns = (double)load_ns;
    else
        sh->load_ns += s->cfg.cost_smoothing * ((double)load_ns - sh->load_ns);
    sh->recent_ns = decayed(s, sh, now) + (double)load_ns;
    sh->recent_at = now;
}

double pjs_sched_recent_utilization(const pjs_sched *s, const pjs_sched_share *sh, uint64_t now)
{
    /* A device busy all the time accumulates half_life / ln 2 seconds. */
    double full_ns = s->cfg.half_life_s * 1e9 / M_LN2;
    double u = decayed(s, sh, now) / full_ns;
    return u < 1.0 ? u : 1.0;
}

/* The smallest compiled size index holding `rows` (the largest if none). */
static size_t size_for_rows(const pjs_sched_queue *q, int64_t rows)
{
    for (size_t k = 0; k < q->n_sizes; k++)
        if (q->sizes[k] >= rows)
            return k;
    return q->n_sizes - 1;
}

/* ---- selection ----------------------------------------------------------------- */

/* The oldest job of q that is committed (want_committed) or not. */
static const pjs_sched_job *oldest(const pjs_sched_queue *q, bool want_committed)
{
    for (const pjs_sched_job *j = q->head; j != NULL; j = j->next)
        if (j->committed == want_committed)
            return j;
    return NULL;
}

static uint64_t head_arrival(const pjs_sched_queue *q)
{
    return q->head->arrival_ns;
}

/* Whether a beats b on a tie-broken key: smaller key first, then older head. */
static bool earlier(uint64_t key_a, const pjs_sched_queue *a, uint64_t key_b,
                    const pjs_sched_queue *b)
{
    if (key_a != key_b)
        return key_a < key_b;
    return head_arrival(a) < head_arrival(b);
}

static pjs_sched_queue *select_committed(const pjs_sched *s)
{
    pjs_sched_queue *best = NULL;
    uint64_t best_at = 0;
    for (pjs_sched_queue *q = s->active; q != NULL; q = q->next_active) {
        if (q->committed == 0)
            continue;
        uint64_t at = oldest(q, true)->arrival_ns;
        if (best == NULL || at < best_at) {
            best = q;
            best_at = at;
        }
    }
    return best;
}

/* Which queues a selection looks at. */
typedef enum among { ALL, RESIDENT, COLD } among;

static bool skipped(const pjs_sched_queue *q, among which)
{
    return (which == RESIDENT && q->share->cold) || (which == COLD && !q->share->cold);
}

/* The selections below return NULL when every queue was skipped. */
static pjs_sched_queue *select_fifo(const pjs_sched *s, among which)
{
    pjs_sched_queue *best = NULL;
    for (pjs_sched_queue *q = s->active; q != NULL; q = q->next_active)
        if (!skipped(q, which) && (best == NULL || head_arrival(q) < head_arrival(best)))
            best = q;
    return best;
}

static uint64_t most_urgent(const pjs_sched_queue *q)
{
    uint64_t d = UINT64_MAX;
    for (const pjs_sched_job *j = q->head; j != NULL; j = j->next)
        if (j->deadline_ns != 0 && j->deadline_ns < d)
            d = j->deadline_ns;
    return d;
}

static pjs_sched_queue *select_edf(const pjs_sched *s, among which)
{
    pjs_sched_queue *best = NULL;
    uint64_t best_deadline = 0;
    for (pjs_sched_queue *q = s->active; q != NULL; q = q->next_active) {
        if (skipped(q, which))
            continue;
        uint64_t d = most_urgent(q);
        if (best == NULL || earlier(d, q, best_deadline, best)) {
            best = q;
            best_deadline = d;
        }
    }
    return best;
}

/* What running q now costs on top of its execution: its model's load when
 * its weights are not on the device. */
static double load_cost(const pjs_sched_queue *q)
{
    return q->share->cold ? q->share->load_ns : 0.0;
}

/* Estimated cost of serving q's queue now, made cheaper per the coalescing
 * discount by the rows it would serve, plus its load if cold. */
static double discounted_cost(const pjs_sched *s, const pjs_sched_queue *q)
{
    int64_t rows = q->coalesce ? q->rows : q->head->rows;
    size_t k = size_for_rows(q, rows);
    if (rows > q->sizes[k])
        rows = q->sizes[k];
    double cost = pjs_sched_estimate(q, k);
    return cost / (1.0 + s->cfg.coalesce_discount * (double)(rows - 1)) + load_cost(q);
}

/* Sums the weights and recent device time of the models with queued work;
 * a model with several non-empty variant queues is counted once. */
static void fair_totals(const pjs_sched *s, uint64_t now, double *total_weight,
                        double *total_recent)
{
    *total_weight = 0;
    *total_recent = 0;
    for (pjs_sched_queue *q = s->active; q != NULL; q = q->next_active) {
        double part = 1.0 / (double)q->share->active_queues;
        *total_weight += q->share->weight * part;
        *total_recent += decayed(s, q->share, now) * part;
    }
}

/* A model whose queue was empty rejoins owed at most fair_clamp executions:
 * its recent device time r is raised, if lower, to the value at which
 * share * (others + r) - r equals that many executions, so idling never
 * banks enough credit to lock the others out. */
static void limit_idle_credit(pjs_sched *s, pjs_sched_queue *q, const pjs_sched_job *j,
                              uint64_t now)
{
    pjs_sched_share *sh = q->share;
    double others_weight, others_recent;
    fair_totals(s, now, &others_weight, &others_recent);
    if (others_weight <= 0)
        return; /* alone: nobody to owe anything to */
    double share = sh->weight / (others_weight + sh->weight);
    double credit = s->cfg.fair_clamp * pjs_sched_estimate(q, size_for_rows(q, j->rows));
    double floor = (share * others_recent - credit) / (1.0 - share);
    if (decayed(s, sh, now) < floor) {
        sh->recent_ns = floor;
        sh->recent_at = now;
    }
}

static pjs_sched_queue *select_fair(const pjs_sched *s, uint64_t now, among which)
{
    double total_weight, total_recent;
    fair_totals(s, now, &total_weight, &total_recent);
    pjs_sched_queue *best = NULL;
    double best_score = 0;
    double clamp = s->cfg.fair_clamp;
    for (pjs_sched_queue *q = s->active; q != NULL; q = q->next_active) {
        if (skipped(q, which))
            continue;
        double owed = q->share->weight / total_weight * total_recent - decayed(s, q->share, now);
        double score = owed / discounted_cost(s, q);
        score = score > clamp ? clamp : score < -clamp ? -clamp : score;
        if (best == NULL || score > best_score ||
            (score == best_score && head_arrival(q) < head_arrival(best))) {
            best = q;
            best_score = score;
        }
    }
    return best;
}

/* ---- coalescing ---------------------------------------------------------------- */

/* Moves the jobs of q whose deadline passed to plan->expired. */
static void drop_expired(pjs_sched *s, pjs_sched_queue *q, uint64_t now, pjs_sched_plan *plan)
{
    pjs_sched_job **tail = &plan->expired;
    while (*tail != NULL)
        tail = &(*tail)->next;
    pjs_sched_job *prev = NULL, *j = q->head;
    while (j != NULL) {
        pjs_sched_job *next = j->next;
        if (j->deadline_ns != 0 && now >= j->deadline_ns) {
            remove_job(s, q, prev, j);
            append(&tail, j);
        } else {
            prev = j;
        }
        j = next;
    }
}

/* The measured cost of the cheapest execution holding `rows`, or INFINITY
 * when none of those sizes was measured (prior guesses never shed). */
static double cheapest_measured(const pjs_sched_queue *q, int64_t rows)
{
    double cheapest = INFINITY;
    for (size_t k = size_for_rows(q, rows); k < q->n_sizes; k++)
        if (q->cost[k].samples > 0)
            cheapest = fmin(cheapest, q->cost[k].ns);
    return cheapest;
}

/* edf: moves the uncommitted jobs of q that would miss their deadline even
 * in the cheapest measured execution holding them to plan->shed. After
 * PJS_SCHED_SHED_PROBE sheds in a row, one such job runs anyway, so an
 * estimate inflated by one slow execution is measured again instead of
 * shedding the queue's traffic forever. */
static void shed_predicted_misses(pjs_sched *s, pjs_sched_queue *q, uint64_t now,
                                  pjs_sched_plan *plan)
{
    pjs_sched_job **tail = &plan->shed;
    uint64_t margin_ns = s->cfg.edf_laxity_margin_us * 1000;
    pjs_sched_job *prev = NULL, *j = q->head;
    while (j != NULL) {
        pjs_sched_job *next = j->next;
        bool miss = false;
        if (!j->committed && j->deadline_ns != 0) {
            double cost = cheapest_measured(q, j->rows) + load_cost(q);
            miss = isfinite(cost) &&
                   (double)now + cost + (double)margin_ns > (double)j->deadline_ns;
            if (miss && ++q->shed_streak > PJS_SCHED_SHED_PROBE) {
                q->shed_streak = 0;
                miss = false; /* the probe */
            }
        }
        if (miss) {
            remove_job(s, q, prev, j);
            append(&tail, j);
        } else {
            prev = j;
        }
        j = next;
    }
}

/* Jobs in coalescing order: committed ones first, then the rest, each FIFO. */
typedef struct walk {
    const pjs_sched_queue *q;
    bool committed_pass;
    pjs_sched_job *at;
} walk;

static pjs_sched_job *walk_next(walk *w)
{
    for (;;) {
        w->at = w->at == NULL ? w->q->head : w->at->next;
        while (w->at != NULL && w->at->committed != w->committed_pass)
            w->at = w->at->next;
        if (w->at != NULL)
            return w->at;
        if (!w->committed_pass)
            return NULL;
        w->committed_pass = false;
    }
}

static walk walk_start(const pjs_sched_queue *q)
{
    return (walk){.q = q, .committed_pass = q->committed > 0, .at = NULL};
}

/* Picks the compiled size: for each size, the rows of the coalescing-order
 * prefix that fit; the largest size when it is full, else the most rows per
 * estimated nanosecond (more rows on ties). */
static size_t choose_size(const pjs_sched_queue *q, int64_t prefix_rows[PJS_SCHED_MAX_SIZES])
{
    for (size_t k = 0; k < q->n_sizes; k++)
        prefix_rows[k] = 0;
    if (!q->coalesce) {
        walk w = walk_start(q);
        int64_t first_rows = walk_next(&w)->rows;
        size_t k = size_for_rows(q, first_rows);
        prefix_rows[k] = first_rows;
        return k;
    }
    int64_t largest = q->sizes[q->n_sizes - 1];
    int64_t cum = 0;
    walk w = walk_start(q);
    for (pjs_sched_job *j = walk_next(&w); j != NULL; j = walk_next(&w)) {
        cum += j->rows;
        if (cum > largest)
            break;
        for (size_t k = 0; k < q->n_sizes; k++)
            if (cum <= q->sizes[k] && prefix_rows[k] == cum - j->rows)
                prefix_rows[k] = cum;
    }
    size_t last = q->n_sizes - 1;
    if (prefix_rows[last] == largest)
        return last;
    size_t best = last;
    double best_rate = -1;
    for (size_t k = 0; k < q->n_sizes; k++) {
        if (prefix_rows[k] == 0)
            continue; /* cannot hold the first job */
        double rate = (double)prefix_rows[k] / pjs_sched_estimate(q, k);
        if (rate > best_rate * (1 + 1e-9) ||
            (rate >= best_rate * (1 - 1e-9) && prefix_rows[k] > prefix_rows[best])) {
            best = k;
            best_rate = rate;
        }
    }
    return best;
}

/* Takes the coalescing-order prefix of `rows` rows out of q into the plan:
 * committed jobs first, then the others, each in queue order. */
static void take_prefix(pjs_sched *s, pjs_sched_queue *q, int64_t rows, pjs_sched_plan *plan)
{
    pjs_sched_job **tail = &plan->jobs;
    for (int pass = q->committed > 0 ? 0 : 1; pass < 2; pass++) {
        bool want_committed = pass == 0;
        pjs_sched_job *prev = NULL, *j = q->head;
        while (j != NULL && plan->rows < rows) {
            pjs_sched_job *next = j->next;
            if (j->committed == want_committed) {
                remove_job(s, q, prev, j);
                append(&tail, j);
                plan->rows += j->rows;
                plan->n_jobs++;
            } else {
                prev = j;
            }
            j = next;
        }
    }
}

static pjs_sched_queue *select_by_discipline(const pjs_sched *s, uint64_t now, among which)
{
    switch (s->cfg.discipline) {
    case PJS_DISCIPLINE_FIFO: return select_fifo(s, which);
    case PJS_DISCIPLINE_EDF: return select_edf(s, which);
    default: return select_fair(s, now, which);
    }
}

/* Whether cold queue q may yield to `instead` (resident) now: its oldest
 * job has waited less than `bounds` deferral bounds, and each of its
 * deadlines still holds after instead's execution, q's load and q's
 * execution. */
static bool may_defer(const pjs_sched *s, const pjs_sched_queue *q,
                      const pjs_sched_queue *instead, uint64_t now, double bounds)
{
    double waited_ns = (double)(now - head_arrival(q));
    if (waited_ns >= bounds * s->cfg.cold_model_defer_ms * 1e6)
        return false;
    uint64_t d = most_urgent(q);
    if (d == UINT64_MAX)
        return true;
    double ahead = pjs_sched_estimate(instead, size_for_rows(instead, instead->rows));
    double own = pjs_sched_estimate(q, size_for_rows(q, q->rows)) + load_cost(q);
    double margin = (double)s->cfg.edf_laxity_margin_us * 1e3;
    return (double)now + ahead + own + margin <= (double)d;
}

pjs_sched_queue *pjs_sched_next_cold(const pjs_sched *s, uint64_t now)
{
    if (s->active == NULL || select_by_discipline(s, now, RESIDENT) != NULL)
        return NULL;
    return select_by_discipline(s, now, COLD);
}

bool pjs_sched_next(pjs_sched *s, uint64_t now, pjs_sched_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    if (s->active == NULL)
        return false;
    pjs_sched_queue *q = s->committed > 0 ? select_committed(s) : NULL;
    if (q == NULL) {
        q = select_by_discipline(s, now, ALL);
        if (q->share->cold && s->cfg.cold_model_defer_ms > 0) {
            pjs_sched_queue *resident = select_by_discipline(s, now, RESIDENT);
            if (resident != NULL && may_defer(s, q, resident, now, 1.0)) {
                q = resident;
            } else if (resident != NULL && s->cfg.weight_prefetch &&
                       may_defer(s, q, resident, now, 2.0)) {
                plan->cold_due = q;
                q = resident;
            }
        }
    }
    drop_expired(s, q, now, plan);
    if (s->cfg.discipline == PJS_DISCIPLINE_EDF && q->length > 0)
        shed_predicted_misses(s, q, now, plan);
    if (q->length == 0)
        return true;
    int64_t prefix_rows[PJS_SCHED_MAX_SIZES];
    size_t k = choose_size(q, prefix_rows);
    plan->queue = q;
    plan->size_index = k;
    plan->batch_size = q->sizes[k];
    take_prefix(s, q, prefix_rows[k], plan);
    return true;
}
