/*
 * server.c - the repository of models, lookups, submission, shutdown.
 *
 * The repository is an array of entries, one per bundle directory, each with
 * its state and (when READY) the current pjs_model. `repo_lock` guards the
 * array and is held only to read or swap entries, never while compiling:
 * loads run under `load_lock`, which serializes them, and swap the new model
 * in at the end, so requests in flight keep the model they looked up.
 *
 * Loads asked for while serving (either front end, the watcher) run on one
 * load thread (a pjs_work_pool: one, because load_lock lets one load
 * compile at a time anyway) from a queue of at most max_pending_loads
 * models; a full queue refuses at once. `load_jobs` lists the models queued
 * or loading with the callers waiting for each, so a second request for a
 * model joins the first one's load. Front ends hand a callback and return;
 * the load thread answers them. A failed load keeps the version that
 * serves; only an unload (or the bundle's removal) stops serving a model.
 *
 * A load compiles the bundle, attaches the model to the dispatcher with its
 * policy (weight, queue depth, default timeout: the configuration's entry
 * for the model, else the manifest's weight and the scheduler's defaults)
 * and runs the warm-up pass under the device token, which seeds the
 * scheduler's cost estimates; only then is the model swapped in and ready.
 * A load may carry a configuration override (load_config.h: a served batch
 * cap, coalescing on or off, queue depth and default timeout), checked
 * against the bundle before compiling and applied to that version only.
 *
 * In dynamic mode the repository watcher (watcher.c) loads, reloads and
 * removes bundles as they change on disk through the same functions; its
 * reloads keep the serving version when the new one fails to load.
 */
#include "server/server.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "core/work_pool.h"
#include "registry/bundle.h"
#include "runtime/exec_cache.h"
#include "server/dispatch.h"
#include "server/ensemble.h"
#include "server/hooked.h"
#include "server/load_config.h"
#include "server/meta.h"
#include "server/sequence.h"
#include "server/server_internal.h"
#include "server/watcher.h"

typedef struct repo_entry {
    pjs_repository_entry info;
    pjs_model *model;  /* the repository's reference; NULL unless READY */
    bool unloaded;     /* unavailable on request, not by failure */
    bool internal;     /* named in a loaded meta's calls: not addressable by clients */
} repo_entry;

/* What the server keeps of its configuration: the scheduler's settings
 * and each configured model's policy (names owned). */
typedef struct server_policies {
    pjs_sched_config sched;
    size_t n_models;
    pjs_model_policy *models;
} server_policies;

struct pjs_server {
    char repository[PJS_BUNDLE_DIR_MAX];
    char name[PJS_SERVER_NAME_MAX + 1]; /* ServerMetadata's name */
    server_policies policies;
    pjs_rt_client *client;
    pjs_exec_cache *cache; /* NULL: no executable cache */
    pjs_wstore *weight_store; /* --shared-weights; NULL: private host floors */
    pjs_dispatcher *dispatcher;
    pjs_shm_registry *shm;
    struct pjs_tracer *tracer; /* the caller's; NULL: tracing off */
    uint64_t max_request_bytes;
    pjs_byte_budget request_budget;
    atomic_bool draining;
    pjs_watcher *watcher; /* dynamic mode, until the server drains; else NULL */
    pjs_control_mode control_mode;
    bool strict_readiness; /* pjs_server_options.strict_readiness */
    size_t metrics_models; /* pjs_server_metrics_models */

    pthread_mutex_t load_lock; /* one load at a time */
    pjs_work_pool *loads;      /* the load thread and its queue */
    size_t max_pending_loads;
    pthread_mutex_t jobs_lock; /* guards load_jobs and n_load_waiters */
    struct load_job *load_jobs;/* models queued or loading */
    size_t n_load_waiters;     /* callers waiting on them, all jobs */
    pjs_log_limiter joined_load_log; /* load calls that join one already queued */
    pjs_meta_gate *meta_gate;  /* where meta runs run (server/meta.h) */
    pjs_meta_gate *stream_gate; /* decoupled compute-only metas' runs */
    pjs_scratch_pool *scratch; /* their reuse buffers */
    pthread_mutex_t repo_lock;
    repo_entry *entries;
    size_t n_entries;
    size_t cap_entries;
};

const char *pjs_server_version(void)
{
    return PJSERVE_VERSION;
}

/* ---- repository entries (repo_lock held) ----------------------------------- */

/* The entries are kept sorted by name: a lookup (every request makes one)
 * is a binary search, not a walk through 10,000 names. Where name is or
 * would go. */
static size_t entry_slot_locked(const pjs_server *s, const char *name, bool *found)
{
    size_t lo = 0, hi = s->n_entries;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->entries[mid].info.name, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static repo_entry *find_entry_locked(pjs_server *s, const char *name)
{
    bool found;
    size_t at = entry_slot_locked(s, name, &found);
    return found ? &s->entries[at] : NULL;
}

static repo_entry *add_entry_locked(pjs_server *s, const char *name)
{
    bool found;
    size_t at = entry_slot_locked(s, name, &found);
    if (found)
        return &s->entries[at];
    if (s->n_entries == s->cap_entries) {
        size_t cap = s->cap_entries ? 2 * s->cap_entries : 16;
        repo_entry *grown = realloc(s->entries, cap * sizeof *grown);
        if (grown == NULL)
            return NULL;
        s->entries = grown;
        s->cap_entries = cap;
    }
    memmove(&s->entries[at + 1], &s->entries[at], (s->n_entries - at) * sizeof *s->entries);
    s->n_entries++;
    repo_entry *e = &s->entries[at];
    memset(e, 0, sizeof *e);
    snprintf(e->info.name, sizeof e->info.name, "%s", name);
    e->info.state = PJS_MODEL_UNAVAILABLE;
    return e;
}

static bool is_meta(const pjs_model *m)
{
    return m != NULL && m->bundle->manifest.kind == PJS_KIND_META;
}

/* A meta or an ensemble: a model that calls others (manifest.calls). */
static bool calls_models(const pjs_model *m)
{
    return m != NULL && m->bundle->manifest.kind != PJS_KIND_MODEL;
}

/* Marks the models a loaded meta calls as internal, and only those (an
 * ensemble's steps stay addressable, as in Triton). */
static void mark_internal_locked(pjs_server *s)
{
    for (size_t i = 0; i < s->n_entries; i++)
        s->entries[i].internal = false;
    for (size_t i = 0; i < s->n_entries; i++) {
        const pjs_model *m = s->entries[i].model;
        if (!is_meta(m))
            continue;
        for (size_t k = 0; k < m->bundle->manifest.n_calls; k++) {
            repo_entry *e = find_entry_locked(s, m->bundle->manifest.calls[k]);
            if (e != NULL)
                e->internal = true;
        }
    }
}

/* A meta or an ensemble serves when every model it calls does. */
static int meta_calls_serving_locked(pjs_server *s, const pjs_model *m, pjs_error *err)
{
    for (size_t k = 0; calls_models(m) && k < m->bundle->manifest.n_calls; k++) {
        repo_entry *e = find_entry_locked(s, m->bundle->manifest.calls[k]);
        if (e == NULL || e->model == NULL)
            return pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                                 "model \"%s\" is not ready: the model it calls, \"%s\", is not "
                                 "loaded%s%s",
                                 m->name, m->bundle->manifest.calls[k],
                                 e != NULL && e->info.reason[0] ? ": " : "",
                                 e != NULL ? e->info.reason : "");
    }
    return 0;
}

/* An entry as the index shows it: a meta or an ensemble is READY exactly
 * when lookups would hand it out, so while a model it calls does not serve
 * it is UNAVAILABLE with the lookup's reason, which names that model. */
static pjs_repository_entry entry_view_locked(pjs_server *s, const repo_entry *e)
{
    pjs_repository_entry info = e->info;
    pjs_error err;
    if (e->model != NULL && meta_calls_serving_locked(s, e->model, &err) != 0) {
        info.state = PJS_MODEL_UNAVAILABLE;
        snprintf(info.reason, sizeof info.reason, "%.*s", (int)sizeof info.reason - 1, err.msg);
    }
    return info;
}

/* Strict readiness: whether entry e is as the repository and the requests
 * made of it say it should be. A model is when it is READY or was unloaded
 * on request; a meta or an ensemble also when the only models it calls that
 * do not serve were unloaded on request (it follows them, and serves again
 * once they are loaded). A failed load, or a model it calls that failed or
 * left the repository, is not. */
static bool entry_as_asked_locked(pjs_server *s, const repo_entry *e)
{
    if (e->unloaded)
        return true;
    if (e->info.state != PJS_MODEL_READY || e->model == NULL)
        return false;
    const pjs_manifest *man = &e->model->bundle->manifest;
    for (size_t k = 0; calls_models(e->model) && k < man->n_calls; k++) {
        const repo_entry *call = find_entry_locked(s, man->calls[k]);
        if (call == NULL || (call->model == NULL && !call->unloaded))
            return false;
    }
    return true;
}

/* Whether bundle `name` declares kind: meta or ensemble (a manifest that
 * does not parse is not: its load will say what is wrong). */
static bool names_meta_bundle(pjs_server *s, const char *name)
{
    char path[PJS_BUNDLE_DIR_MAX + 300];
    snprintf(path, sizeof path, "%s/%s/manifest.yaml", s->repository, name);
    pjs_manifest m;
    pjs_error err;
    bool meta = pjs_manifest_load(&m, path, &err) == 0 && m.kind != PJS_KIND_MODEL;
    pjs_manifest_free(&m);
    return meta;
}

/* A meta's calls name loaded models with no hooks that are not metas. */
/* What a meta's call finds in the repository. */
typedef enum call_target {
    CALL_MODEL, CALL_MISSING, CALL_NOT_LOADED, CALL_META, CALL_HOOKED, CALL_STATEFUL
} call_target;

static call_target find_call_target(pjs_server *s, const char *name, char *reason, size_t size)
{
    pthread_mutex_lock(&s->repo_lock);
    repo_entry *e = find_entry_locked(s, name);
    call_target t = e == NULL                             ? CALL_MISSING
                    : e->model == NULL                    ? CALL_NOT_LOADED
                    : calls_models(e->model)              ? CALL_META
                    : e->model->bundle->hooks != NULL     ? CALL_HOOKED
                    : e->model->bundle->manifest.stateful ? CALL_STATEFUL
                                                          : CALL_MODEL;
    snprintf(reason, size, "%s", e != NULL ? e->info.reason : "");
    pthread_mutex_unlock(&s->repo_lock);
    /* Metas and ensembles load after models, in name order: one not loaded
     * yet is known
     * by its manifest (read without the lock). */
    if ((t == CALL_MISSING || t == CALL_NOT_LOADED) && names_meta_bundle(s, name))
        t = CALL_META;
    return t;
}

/* Where calls[i] is declared: "meta.calls[i]", or for an ensemble the
 * first step calling it, "ensemble.steps[s].model". */
static void call_path(const pjs_manifest *man, size_t i, char *buf, size_t size)
{
    size_t s = 0;
    while (s < man->n_steps && strcmp(man->steps[s].model, man->calls[i]) != 0)
        s++;
    if (man->kind == PJS_KIND_ENSEMBLE)
        snprintf(buf, size, "ensemble.steps[%zu].model", s);
    else
        snprintf(buf, size, "meta.calls[%zu]", i);
}

/* An ensemble's steps against the models they call, which check_meta_calls
 * found loaded (a model unloaded meanwhile fails here as not loaded). */
static int check_ensemble_steps(pjs_server *s, const pjs_manifest *man, pjs_error *err)
{
    pjs_model *models[PJS_ENSEMBLE_MAX_STEPS] = {NULL};
    const pjs_manifest *manifests[PJS_ENSEMBLE_MAX_STEPS];
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < man->n_steps; k++) {
        rc = pjs__server_get_internal_model(s, man->steps[k].model, &models[k], err);
        if (rc == 0)
            manifests[k] = pjs_model_manifest(models[k]);
    }
    if (rc == 0)
        rc = pjs_ensemble_check(man, manifests, err);
    for (size_t k = 0; k < man->n_steps; k++)
        pjs_model_unref(models[k]);
    return rc;
}

static int check_meta_calls(pjs_server *s, const pjs_bundle *b, pjs_error *err)
{
    const pjs_manifest *man = &b->manifest;
    const char *caller = man->kind == PJS_KIND_ENSEMBLE ? "an ensemble" : "a meta";
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < man->n_calls; i++) {
        const char *name = man->calls[i];
        char reason[sizeof ((repo_entry *)0)->info.reason], where[64];
        call_path(man, i, where, sizeof where);
        switch (find_call_target(s, name, reason, sizeof reason)) {
        case CALL_MODEL: break;
        case CALL_MISSING:
            rc = pjs_error_set(err, PJS_ERR_NOT_FOUND,
                               "manifest.yaml: %s: no model \"%s\" in the repository", where,
                               name);
            break;
        case CALL_NOT_LOADED:
            rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                               "manifest.yaml: %s: model \"%s\" is not loaded%s%s", where, name,
                               reason[0] ? ": " : "", reason);
            break;
        case CALL_META:
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "manifest.yaml: %s: \"%s\" is a meta model (or an ensemble), and "
                               "%s may not call a meta (call its sub-models directly)",
                               where, name, caller);
            break;
        case CALL_HOOKED:
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "manifest.yaml: %s: model \"%s\" has hooks; %s calls "
                               "executables directly (%s)",
                               where, name, caller,
                               man->kind == PJS_KIND_ENSEMBLE
                                   ? "call the model's executable, or use a meta"
                                   : "do the conversion in pjserve_run");
            break;
        case CALL_STATEFUL:
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "manifest.yaml: %s: model \"%s\" keeps state per sequence, and "
                               "%s's calls carry no sequence; clients call it directly",
                               where, name, caller);
            break;
        }
    }
    if (rc == 0 && man->kind == PJS_KIND_ENSEMBLE)
        rc = check_ensemble_steps(s, man, err);
    if (rc != 0)
        pjs_error_prefix(err, "bundle %s: ", b->dir);
    return rc;
}

/* Sets an entry's state, swapping in `model` (which may be NULL); returns the
 * model it replaced for the caller to unref outside the lock. */
static pjs_model *set_entry(pjs_server *s, const char *name, pjs_model_state st,
                            const char *reason, pjs_model *model, bool unloaded)
{
    pjs_model *old = NULL;
    pthread_mutex_lock(&s->repo_lock);
    repo_entry *e = add_entry_locked(s, name);
    if (e == NULL) {
        pthread_mutex_unlock(&s->repo_lock);
        pjs_error("model %s: out of memory", name);
        return model;
    }
    old = e->model;
    e->model = model;
    e->unloaded = unloaded;
    e->info.state = st;
    snprintf(e->info.reason, sizeof e->info.reason, "%s", reason ? reason : "");
    mark_internal_locked(s);
    pthread_mutex_unlock(&s->repo_lock);
    return old;
}

/* Whether `name` has a model that serves requests. */
static bool entry_serving(pjs_server *s, const char *name)
{
    pthread_mutex_lock(&s->repo_lock);
    repo_entry *e = find_entry_locked(s, name);
    bool serving = e != NULL && e->model != NULL;
    pthread_mutex_unlock(&s->repo_lock);
    return serving;
}

/* Lets go of a model that left the repository (or never entered it): its
 * device weights go once its queued requests ran, then the reference. */
static void drop_model(pjs_server *s, pjs_model *m)
{
    if (m == NULL)
        return;
    pjs_dispatcher_retire(s->dispatcher, m);
    pjs_model_unref(m);
}

/* ---- loading ------------------------------------------------------------- */

static bool is_bundle_dir(const char *repository, const char *name)
{
    if (name[0] == '.')
        return false;
    char path[PJS_BUNDLE_DIR_MAX + 300];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", repository, name);
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Attaches m to the dispatcher with its configured policy, the defaults
 * filling what the configuration leaves out, and a load's override (ov,
 * NULL: none) over both. */
static int attach_model(pjs_server *s, pjs_model *m, const pjs_load_override *ov,
                        pjs_error *err)
{
    const server_policies *p = &s->policies;
    double weight = pjs_model_manifest(m)->weight;
    size_t depth = p->sched.max_queue_depth;
    uint64_t timeout_us = p->sched.default_timeout_us;
    for (size_t i = 0; i < p->n_models; i++) {
        const pjs_model_policy *mp = &p->models[i];
        if (strcmp(mp->name, m->name) != 0)
            continue;
        if (mp->weight > 0)
            weight = mp->weight;
        if (mp->max_queue_depth > 0)
            depth = mp->max_queue_depth;
        if (mp->default_timeout_us >= 0)
            timeout_us = (uint64_t)mp->default_timeout_us;
    }
    if (ov != NULL && ov->max_queue_depth > 0)
        depth = ov->max_queue_depth;
    if (ov != NULL && ov->default_timeout_us >= 0)
        timeout_us = (uint64_t)ov->default_timeout_us;
    atomic_store(&m->default_timeout_ns, timeout_us * 1000);
    return pjs_dispatcher_attach(s->dispatcher, m, weight, depth, err);
}

/* "model mlp ready: 3 batch sizes x 1 variants (3 modules from the
 * executable cache, 0 shared with loaded models), 4 weights; warm-up b1
 * 0.05 ms, b4 0.08 ms, b8 0.11 ms; 0.21 s", the warm-up's costs said to be
 * another model's when they were. */
static void log_ready(pjs_server *s, pjs_model *m, const char *progress, const uint64_t *costs,
                      bool costs_reused, double seconds)
{
    const pjs_bundle *b = m->bundle;
    const pjs_manifest *man = pjs_model_manifest(m);
    size_t from_cache = 0, shared = 0;
    for (size_t i = 0; i < b->n_modules; i++) {
        shared += b->modules[i].shared;
        from_cache += !b->modules[i].shared && b->modules[i].exec->from_cache;
    }
    char warm[512] = "";
    size_t used = 0;
    for (size_t i = 0; s->policies.sched.warmup_runs > 0 && i < b->n_modules; i++) {
        const pjs_bundle_module *mod = &b->modules[i];
        int n = snprintf(warm + used, sizeof warm - used, "%s%s%s b%lld %.3f ms",
                         i == 0 ? "; warm-up" : ",", man->n_variants > 1 ? " " : "",
                         man->n_variants > 1 ? man->variants[mod->variant].name : "",
                         (long long)mod->batch_size, (double)costs[i] / 1e6);
        if (n < 0 || (size_t)n >= sizeof warm - used)
            break;
        used += (size_t)n;
    }
    if (costs_reused && used > 0)
        snprintf(warm + used, sizeof warm - used, " (measured on an earlier model with the same "
                                                  "modules; none run)");
    if (man->kind == PJS_KIND_ENSEMBLE) {
        pjs_info("%smodel %s ready: an ensemble of %zu steps calling %zu models; %.2f s",
                 progress, m->name, man->n_steps, man->n_calls, seconds);
        return;
    }
    if (man->kind == PJS_KIND_META) {
        char calls[512] = "";
        size_t at = 0;
        for (size_t i = 0; i < man->n_calls && at < sizeof calls; i++)
            at += (size_t)snprintf(calls + at, sizeof calls - at, "%s%s", i ? ", " : "",
                                   man->calls[i]);
        pjs_info("%smodel %s ready: a meta model calling [%s]%s; %.2f s", progress, m->name,
                 calls, man->n_calls == 0 ? " (compute-only: takes no permit)" : "", seconds);
        return;
    }
    const pjs_hooks *h = b->hooks;
    pjs_info("%smodel %s ready: %zu batch sizes x %zu variants (%zu modules from the executable "
             "cache, %zu shared with loaded models), %zu weights%s%s%s%s; %.2f s",
             progress, m->name, man->n_batch_sizes, man->n_variants, from_cache, shared,
             b->weights.n_tensors, warm, h != NULL ? "; hooks:" : "",
             h != NULL && h->preprocess != NULL ? " preprocess" : "",
             h != NULL && h->postprocess != NULL ? " postprocess" : "", seconds);
}

/* Checks a load's config against the bundle opened (b), into *ov. */
static int check_override(pjs_server *s, const char *name, const pjs_load_config *config,
                          const pjs_bundle *b, pjs_load_override *ov, pjs_error *err)
{
    char platform[64]; /* as ModelConfig reports it, so that it may be restated */
    if (b->manifest.kind == PJS_KIND_ENSEMBLE)
        snprintf(platform, sizeof platform, "ensemble");
    else
        snprintf(platform, sizeof platform, "pjrt_%s", pjs_server_platform(s));
    return pjs_load_config_apply(config, name, platform, &b->manifest, ov, err);
}

/* Applies a load's override to the model just created (before it is
 * attached) and says so in the log. */
static void override_model(pjs_model *m, const pjs_load_override *ov)
{
    m->max_batch_size = ov->max_batch_size;
    m->n_served_sizes = ov->n_served_sizes;
    m->coalesce = ov->coalesce;
    char timeout[64] = "", depth[64] = "";
    if (ov->default_timeout_us >= 0)
        snprintf(timeout, sizeof timeout, ", default timeout %lld us",
                 (long long)ov->default_timeout_us);
    if (ov->max_queue_depth > 0)
        snprintf(depth, sizeof depth, ", max queue depth %zu", ov->max_queue_depth);
    pjs_info("model %s: configuration override for this version: max_batch_size %lld, dynamic "
             "batching %s%s%s",
             m->name, (long long)ov->max_batch_size, ov->coalesce ? "on" : "off", timeout, depth);
}

/* Compiles bundle `name` and swaps it in, with `config`'s override (NULL:
 * the bundle as it is). On failure the entry turns UNAVAILABLE with the
 * error, unless keep_serving and a version of it is serving: that one
 * stays. load_lock held. */
static int load_locked(pjs_server *s, const char *name, const char *progress, bool keep_serving,
                       const pjs_load_config *config, pjs_error *err)
{
    char dir[PJS_BUNDLE_DIR_MAX];
    if (strchr(name, '/') != NULL || strlen(name) >= 256 || !is_bundle_dir(s->repository, name))
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "model \"%.256s\": no bundle directory of that name in %s", name,
                             s->repository);
    if (snprintf(dir, sizeof dir, "%s/%s", s->repository, name) >= (int)sizeof dir)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "model \"%s\": path too long", name);
    pjs_info("%sloading model %s from %s", progress, name, dir);
    uint64_t t0 = pjs_now_ns();
    pjs_bundle *b = NULL;
    pjs_model *m = NULL;
    uint64_t *costs = NULL;
    bool reused = false;
    pjs_load_override ov;
    int rc = pjs_bundle_open(dir, &b, err);
    if (rc == 0 && b->manifest.kind != PJS_KIND_MODEL && (rc = check_meta_calls(s, b, err)) != 0)
        pjs_bundle_close(b);
    if (rc == 0 && config != NULL && (rc = check_override(s, name, config, b, &ov, err)) != 0)
        pjs_bundle_close(b);
    if (rc == 0)
        rc = pjs_model_create(b, s->client, s->cache, s->weight_store,
                              pjs_dispatcher_host_tier(s->dispatcher), &m, err);
    if (rc == 0 && config != NULL)
        override_model(m, &ov);
    if (rc == 0)
        rc = attach_model(s, m, config != NULL ? &ov : NULL, err);
    if (rc == 0 && (costs = calloc(m->bundle->n_modules + 1, sizeof *costs)) == NULL)
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    if (rc == 0)
        rc = pjs_dispatcher_warm_up(s->dispatcher, m, s->policies.sched.warmup_runs, costs,
                                    &reused, err);
    if (rc != 0) {
        bool keep = keep_serving && entry_serving(s, name);
        pjs_warn("%smodel %s not loaded%s: %s", progress, name,
                 keep ? " (the version serving keeps serving)" : "", err->msg);
        drop_model(s, m);
        free(costs);
        if (!keep)
            drop_model(s, set_entry(s, name, PJS_MODEL_UNAVAILABLE, err->msg, NULL, false));
        return rc;
    }
    log_ready(s, m, progress, costs, reused, (double)(pjs_now_ns() - t0) / 1e9);
    free(costs);
    drop_model(s, set_entry(s, name, PJS_MODEL_READY, "", m, false));
    return 0;
}

/* A policy naming no bundle of the repository is most likely a typo. */
static void warn_unused_policies(pjs_server *s)
{
    for (size_t i = 0; i < s->policies.n_models; i++) {
        const char *name = s->policies.models[i].name;
        pthread_mutex_lock(&s->repo_lock);
        bool known = find_entry_locked(s, name) != NULL;
        pthread_mutex_unlock(&s->repo_lock);
        if (!known)
            pjs_warn("configuration: models.%s: no bundle of that name in %s; the policy is "
                     "unused until one appears",
                     name, s->repository);
    }
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int load_repository(pjs_server *s, pjs_error *err)
{
    DIR *d = opendir(s->repository);
    if (d == NULL)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND, "model repository %s: %s", s->repository,
                             strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) != NULL) {
        if (!is_bundle_dir(s->repository, de->d_name))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(names, cap * sizeof *grown);
            if (grown == NULL) {
                rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
                break;
            }
            names = grown;
        }
        names[n] = strdup(de->d_name);
        if (names[n] == NULL) {
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == 0) {
        if (n > 0)
            qsort(names, n, sizeof *names, compare_names);
        else
            pjs_warn("model repository %s has no bundle directories; serving no models",
                     s->repository);
        size_t loaded = 0, done = 0;
        /* Metas and ensembles last: they need the models they call loaded. */
        bool *meta = calloc(n + 1, sizeof *meta);
        for (size_t i = 0; meta != NULL && i < n; i++)
            meta[i] = names_meta_bundle(s, names[i]);
        for (int metas = 0; metas < 2; metas++) {
            for (size_t i = 0; i < n; i++) {
                if ((meta != NULL && meta[i]) != (metas == 1))
                    continue;
                char progress[64];
                snprintf(progress, sizeof progress, "[%zu/%zu] ", ++done, n);
                pjs_error load_err;
                pthread_mutex_lock(&s->load_lock);
                loaded += load_locked(s, names[i], progress, false, NULL, &load_err) == 0;
                pthread_mutex_unlock(&s->load_lock);
            }
        }
        free(meta);
        pjs_info("%zu of %zu models loaded from %s", loaded, n, s->repository);
        warn_unused_policies(s);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* ---- the load queue ------------------------------------------------------ */

/* Callers waiting on a load beyond this many per queued model are refused
 * (each is a request held open by a front end). */
#define LOAD_WAITERS_PER_JOB 16

typedef struct load_waiter {
    pjs_server_load_done done;
    void *arg;
    struct load_waiter *next;
} load_waiter;

/* One model queued or loading, and every caller waiting for its result. */
typedef struct load_job {
    pjs_server *server;
    char name[256];
    pjs_load_config *config;  /* the load's override, owned; NULL: none */
    load_waiter *waiters; /* guarded by jobs_lock */
    size_t n_waiters;
    struct load_job *next;
} load_job;

/* Unlinks job from the list (jobs_lock held). */
static void unlink_job_locked(pjs_server *s, load_job *job)
{
    for (load_job **p = &s->load_jobs; *p != NULL; p = &(*p)->next) {
        if (*p == job) {
            *p = job->next;
            break;
        }
    }
    s->n_load_waiters -= job->n_waiters;
}

/* Load refusals and failures say "failed to load 'NAME': ..." first, as
 * Triton's do: its clients (the model control examples) look for the prefix. */
static void prefix_load_failure(pjs_error *err, const char *name)
{
    pjs_error_prefix(err, "failed to load '%.256s': ", name);
}

/* The load thread's job: loads the model unless cancelled (shutdown), then
 * answers every waiter. Callers arriving after the job left the list start
 * a new load. */
static void run_load_job(void *arg, bool cancelled)
{
    load_job *job = arg;
    pjs_server *s = job->server;
    pjs_error err;
    pjs_error_clear(&err);
    if (cancelled) {
        pjs_error_set(&err, PJS_ERR_UNAVAILABLE,
                      "model %s: not loaded, the server is shutting down", job->name);
    } else {
        pthread_mutex_lock(&s->load_lock);
        load_locked(s, job->name, "", true, job->config, &err);
        pthread_mutex_unlock(&s->load_lock);
    }
    if (err.code != 0)
        prefix_load_failure(&err, job->name);
    pthread_mutex_lock(&s->jobs_lock);
    unlink_job_locked(s, job);
    load_waiter *w = job->waiters;
    pthread_mutex_unlock(&s->jobs_lock);
    while (w != NULL) {
        load_waiter *next = w->next;
        w->done(w->arg, &err);
        free(w);
        w = next;
    }
    pjs_load_config_free(job->config);
    free(job);
}

/* Whether a queued job loads what a caller with `config` asks for. */
static bool job_matches(const load_job *job, const char *name, const pjs_load_config *config)
{
    if (strcmp(job->name, name) != 0 || (job->config == NULL) != (config == NULL))
        return false;
    return config == NULL ||
           strcmp(pjs_load_config_text(job->config), pjs_load_config_text(config)) == 0;
}

int pjs_server_load_model_async(pjs_server *s, const char *name, pjs_server_load_done done,
                                void *arg, pjs_error *err)
{
    return pjs_server_load_model_config_async(s, name, NULL, 0, done, arg, err);
}

static int load_async(pjs_server *s, const char *name, const char *config_text, size_t config_len,
                      pjs_server_load_done done, void *arg, pjs_error *err);

int pjs_server_load_model_config_async(pjs_server *s, const char *name, const char *config_text,
                                       size_t config_len, pjs_server_load_done done, void *arg,
                                       pjs_error *err)
{
    int rc = load_async(s, name, config_text, config_len, done, arg, err);
    if (rc != 0)
        prefix_load_failure(err, name != NULL ? name : "");
    return rc;
}

static int load_async(pjs_server *s, const char *name, const char *config_text, size_t config_len,
                      pjs_server_load_done done, void *arg, pjs_error *err)
{
    if (name == NULL || name[0] == '\0')
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "no model name given");
    if (strchr(name, '/') != NULL || strlen(name) >= 256 || !is_bundle_dir(s->repository, name))
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "model \"%.256s\": no bundle directory of that name in %s", name,
                             s->repository);
    if (atomic_load(&s->draining))
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                             "model %s: not loaded, the server is shutting down", name);
    pjs_load_config *config = NULL;
    if (config_text != NULL &&
        pjs_load_config_parse(name, config_text, config_len, &config, err) != 0)
        return err->code;
    load_waiter *w = calloc(1, sizeof *w);
    if (w == NULL) {
        pjs_load_config_free(config);
        return pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", name);
    }
    *w = (load_waiter){done, arg, NULL};
    int rc = 0;
    pthread_mutex_lock(&s->jobs_lock);
    load_job *job = s->load_jobs;
    while (job != NULL && !job_matches(job, name, config))
        job = job->next;
    if (s->n_load_waiters >= LOAD_WAITERS_PER_JOB * s->max_pending_loads) {
        rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                           "model %s: %zu load requests are already waiting; retry once they "
                           "completed",
                           name, s->n_load_waiters);
    } else if (job == NULL) {
        job = calloc(1, sizeof *job);
        if (job == NULL) {
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", name);
        } else {
            job->server = s;
            snprintf(job->name, sizeof job->name, "%s", name);
            job->config = config;
            rc = pjs_work_pool_submit(s->loads, run_load_job, job, err);
            if (rc == PJS_ERR_RESOURCE_EXHAUSTED)
                pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                              "model %s: %zu other model loads are already queued; retry once "
                              "they completed, or raise --max-pending-loads",
                              name, s->max_pending_loads);
            if (rc != 0) {
                free(job); /* config is freed below */
                job = NULL;
            } else {
                job->next = s->load_jobs;
                s->load_jobs = job;
                config = NULL; /* the job's now */
            }
        }
    } else {
        pjs_log_limited(&s->joined_load_log, PJS_LOG_INFO,
                        "model %s: a load of it is already queued or running; this request "
                        "waits for its result",
                        name);
    }
    if (rc == 0) {
        w->next = job->waiters;
        job->waiters = w;
        job->n_waiters++;
        s->n_load_waiters++;
        w = NULL;
    }
    pthread_mutex_unlock(&s->jobs_lock);
    free(w);
    pjs_load_config_free(config);
    return rc;
}

/* What pjs_server_load_model waits on. */
typedef struct load_wait {
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    bool done;
    pjs_error err;
} load_wait;

static void load_wait_done(void *arg, const pjs_error *err)
{
    load_wait *w = arg;
    pthread_mutex_lock(&w->lock);
    w->err = *err;
    w->done = true;
    pthread_cond_signal(&w->done_cond);
    pthread_mutex_unlock(&w->lock);
}

int pjs_server_load_model(pjs_server *s, const char *name, pjs_error *err)
{
    load_wait w = {.done = false};
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.done_cond, NULL);
    int rc = pjs_server_load_model_async(s, name, load_wait_done, &w, err);
    if (rc == 0) {
        pthread_mutex_lock(&w.lock);
        while (!w.done)
            pthread_cond_wait(&w.done_cond, &w.lock);
        pthread_mutex_unlock(&w.lock);
        *err = w.err;
        rc = w.err.code;
    }
    pthread_cond_destroy(&w.done_cond);
    pthread_mutex_destroy(&w.lock);
    return rc;
}

/* ---- creation and shutdown ----------------------------------------------- */

/* The device weight cache's budget: the operator's, else solved from the
 * device's memory (pjs_weight_budget_solve, 5 % slack, no scratch reserve
 * known), else unlimited (the CPU plugin reports no memory size). */
static uint64_t weight_budget(pjs_server *s, const pjs_server_options *o)
{
    char bytes[32], device[32];
    if (o->device_weight_budget > 0) {
        pjs_info("device weight cache: budget %s (--device-weight-budget)",
                 pjs_format_bytes(o->device_weight_budget, bytes, sizeof bytes));
        return o->device_weight_budget;
    }
    uint64_t arena = 0;
    pjs_error err;
    if (pjs_rt_client_device_memory(s->client, 0, &arena, &err) != 0) {
        pjs_info("device weight cache: no budget, the device reports no memory size (%s); "
                 "--device-weight-budget sets one",
                 err.msg);
        return PJS_WCACHE_UNLIMITED;
    }
    double fraction = o->weight_fraction > 0 ? o->weight_fraction : 0.8;
    pjs_weight_budget b = pjs_weight_budget_solve(arena, fraction, 0.05, 0, 0);
    pjs_info("device weight cache: budget %s (%.0f %% of %s device memory, 5 %% kept free)",
             pjs_format_bytes(b.on_demand_budget, bytes, sizeof bytes), fraction * 100,
             pjs_format_bytes(arena, device, sizeof device));
    return b.on_demand_budget;
}

static void free_policies(server_policies *p)
{
    for (size_t i = 0; i < p->n_models; i++)
        free(p->models[i].name);
    free(p->models);
    p->models = NULL;
    p->n_models = 0;
}

static int copy_policies(server_policies *p, const pjs_server_config *c, pjs_error *err)
{
    if (c == NULL) {
        pjs_sched_config_defaults(&p->sched);
        return 0;
    }
    if (pjs_sched_config_check(&c->sched, err) != 0)
        return err->code;
    p->sched = c->sched;
    p->models = calloc(c->n_models + 1, sizeof *p->models);
    if (p->models == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < c->n_models; i++) {
        p->models[i] = c->models[i];
        if ((p->models[i].name = strdup(c->models[i].name)) == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
        p->n_models++;
    }
    return 0;
}

/* Compute-only metas run on this many threads besides the gate's. */
#define META_COMPUTE_THREADS 2
/* Decoupled compute-only metas (which may stream for as long as their
 * requests allow, e.g. waiting between responses) run on threads of their
 * own, so runs that wait cannot hold the threads other compute-only metas
 * need: 16, started more on demand up to 256, shared between clients (the
 * streams their requests come on): a stream has at most 4 runs going and 16
 * waiting, so one that holds its threads for long cannot take every thread
 * (16 such streams stopped every other client's run for a minute). */
#define META_STREAM_THREADS 16
#define META_STREAM_MAX_THREADS 256
#define META_STREAM_PER_CLIENT 4
#define META_STREAM_PER_CLIENT_WAITING 16

static int start_meta(pjs_server *s, const pjs_server_options *o, pjs_error *err)
{
    int permits = o->meta_concurrency > 0 ? o->meta_concurrency : PJS_DEFAULT_META_CONCURRENCY;
    int rc = pjs_meta_gate_create("meta gate", permits, META_COMPUTE_THREADS, 0, &s->meta_gate,
                                  err);
    if (rc == 0)
        rc = pjs_meta_gate_create("meta stream threads", 0, META_STREAM_THREADS, 0,
                                  &s->stream_gate, err);
    if (rc == 0)
        rc = pjs_meta_gate_share(s->stream_gate, META_STREAM_MAX_THREADS, META_STREAM_PER_CLIENT,
                                 META_STREAM_PER_CLIENT_WAITING, err);
    if (rc == 0)
        rc = pjs_scratch_pool_create(o->meta_scratch_bytes, &s->scratch, err);
    return rc;
}

int pjs_server_create(const pjs_server_options *o, pjs_server **out, pjs_error *err)
{
    if (o->repository == NULL || strlen(o->repository) >= PJS_BUNDLE_DIR_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "a model repository is required");
    struct stat st;
    if (stat(o->repository, &st) != 0 || !S_ISDIR(st.st_mode))
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "model repository %s is not a directory (make models creates the "
                             "demo repository)",
                             o->repository);
    pjs_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    snprintf(s->repository, sizeof s->repository, "%s", o->repository);
    snprintf(s->name, sizeof s->name, "%s", o->server_name != NULL ? o->server_name : "pjserve");
    s->tracer = o->tracer;
    if (copy_policies(&s->policies, o->config, err) != 0) {
        pjs_server_destroy(s);
        return err->code;
    }
    pthread_mutex_init(&s->load_lock, NULL);
    pthread_mutex_init(&s->repo_lock, NULL);
    pthread_mutex_init(&s->jobs_lock, NULL);
    s->max_pending_loads =
        o->max_pending_loads != 0 ? (size_t)o->max_pending_loads : PJS_DEFAULT_MAX_PENDING_LOADS;
    atomic_init(&s->draining, false);
    s->max_request_bytes =
        o->max_request_bytes != 0 ? o->max_request_bytes : PJS_DEFAULT_MAX_REQUEST_BYTES;
    pjs_byte_budget_init(&s->request_budget, o->max_inflight_request_bytes != 0
                                                 ? o->max_inflight_request_bytes
                                                 : 4 * s->max_request_bytes);
    pjs_shm_options shm = {.allowed = o->allow_client_shm,
                           .max_regions = o->max_shm_regions,
                           .max_bytes = o->max_shm_bytes,
                           .budget = &s->request_budget};
    int rc = pjs_shm_registry_create(&shm, &s->shm, err);
    if (rc == 0 && o->shared_weights_dir != NULL) {
        pjs_wstore_options wo = {.dir = o->shared_weights_dir, .group = o->shared_weights_group};
        rc = pjs_wstore_open(&wo, &s->weight_store, err);
    }
    if (rc == 0)
        rc = pjs_rt_client_open(o->plugin_path, o->pjrt_options, o->n_pjrt_options, &s->client,
                                err);
    if (rc == 0) {
        s->cache = pjs_exec_cache_open_or_warn(o->cache_dir, o->no_cache);
        if (s->cache != NULL)
            pjs_info("executable cache: %s", pjs_exec_cache_dir(s->cache));
        char devices[256];
        pjs_rt_client_describe_device(s->client, 0, devices, sizeof devices);
        pjs_info("PJRT platform %s (%s), executing on device %s",
                 pjs_rt_client_platform(s->client), pjs_rt_client_platform_version(s->client),
                 devices);
        s->control_mode = o->control_mode;
        s->strict_readiness = o->strict_readiness;
        s->metrics_models = o->metrics_models == 0            ? PJS_DEFAULT_METRICS_MODELS
                            : o->metrics_models == SIZE_MAX ? 0
                                                            : o->metrics_models;
        uint64_t budget = weight_budget(s, o);
        uint64_t host_budget = PJS_WCACHE_UNLIMITED;
        if (o->host_weight_budget > 0) {
            char bytes[32];
            host_budget = o->host_weight_budget;
            pjs_info("host weight tier: budget %s (--host-weight-budget): floors of host "
                     "models are read from their files when needed",
                     pjs_format_bytes(host_budget, bytes, sizeof bytes));
        }
        rc = pjs_dispatcher_create(o->dispatch_workers > 0 ? o->dispatch_workers : 4,
                                   &s->policies.sched, budget,
                                   o->control_mode != PJS_CONTROL_EXPLICIT, host_budget,
                                   &s->dispatcher, err);
    }
    if (rc == 0)
        rc = pjs_work_pool_create("model loads", 1, s->max_pending_loads, &s->loads, err);
    if (rc == 0)
        rc = start_meta(s, o, err);
    if (rc == 0 && o->control_mode == PJS_CONTROL_DYNAMIC && !o->repository_watched_outside)
        rc = pjs_watcher_start(s, s->repository,
                               o->repository_poll_ms > 0 ? o->repository_poll_ms : 1000,
                               &s->watcher, err);
    if (rc == 0)
        rc = load_repository(s, err);
    if (rc != 0) {
        pjs_server_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void pjs_server_drain(pjs_server *s)
{
    pjs_watcher_stop(s->watcher); /* first: it may be waiting for a load */
    s->watcher = NULL;
    atomic_store(&s->draining, true);
    /* The load in progress finishes; queued ones are answered UNAVAILABLE. */
    pjs_work_pool_stop(s->loads);
    /* Metas first: their runs still queue sub-calls. */
    if (s->meta_gate != NULL)
        pjs_meta_gate_drain(s->meta_gate);
    if (s->stream_gate != NULL)
        pjs_meta_gate_drain(s->stream_gate);
    if (s->dispatcher != NULL)
        pjs_dispatcher_drain(s->dispatcher);
}

void pjs_server_destroy(pjs_server *s)
{
    if (s == NULL)
        return;
    pjs_server_drain(s);
    pjs_meta_gate_destroy(s->meta_gate);
    pjs_meta_gate_destroy(s->stream_gate);
    pjs_scratch_pool_destroy(s->scratch);
    pjs_work_pool_destroy(s->loads);
    for (size_t i = 0; s->dispatcher != NULL && i < s->n_entries; i++)
        if (s->entries[i].model != NULL)
            pjs_dispatcher_retire(s->dispatcher, s->entries[i].model);
    pjs_dispatcher_destroy(s->dispatcher);
    for (size_t i = 0; i < s->n_entries; i++)
        pjs_model_unref(s->entries[i].model);
    free(s->entries);
    pjs_wstore_close(s->weight_store);
    pjs_exec_cache_close(s->cache);
    if (s->client != NULL)
        pjs_rt_client_destroy(s->client);
    pjs_shm_registry_destroy(s->shm);
    free_policies(&s->policies);
    pthread_mutex_destroy(&s->repo_lock);
    pthread_mutex_destroy(&s->jobs_lock);
    pthread_mutex_destroy(&s->load_lock);
    free(s);
}

/* ---- queries ------------------------------------------------------------- */

bool pjs_server_live(const pjs_server *s)
{
    (void)s;
    return true;
}

bool pjs_server_ready(pjs_server *s)
{
    if (atomic_load(&s->draining))
        return false;
    if (!s->strict_readiness)
        return true;
    bool ready = true;
    pthread_mutex_lock(&s->repo_lock);
    for (size_t i = 0; ready && i < s->n_entries; i++)
        ready = entry_as_asked_locked(s, &s->entries[i]);
    pthread_mutex_unlock(&s->repo_lock);
    return ready;
}

const char *pjs_server_name(const pjs_server *s)
{
    return s->name;
}

const char *pjs_server_platform(const pjs_server *s)
{
    return pjs_rt_client_platform(s->client);
}

pjs_shm_registry *pjs_server_shm(pjs_server *s)
{
    return s->shm;
}

struct pjs_tracer *pjs_server_tracer(const pjs_server *s)
{
    return s->tracer;
}

uint64_t pjs_server_max_request_bytes(const pjs_server *s)
{
    return s->max_request_bytes;
}

pjs_byte_budget *pjs_server_request_budget(pjs_server *s)
{
    return &s->request_budget;
}

/* NOT_FOUND in Triton's words, which its clients match: "Request for
 * unknown model: 'NAME' is not found". Not run: behind a gateway another
 * worker may have the model (one that loaded it since the last probe). */
static int unknown_model(const char *name, pjs_error *err)
{
    pjs_error_set(err, PJS_ERR_NOT_FOUND,
                  "Request for unknown model: '%.256s' is not found (RepositoryIndex / "
                  "POST /v2/repository/index lists the models)",
                  name);
    return pjs_error_not_run(err);
}

/* A version as clients may name one: digits, not starting with 0, at most
 * 18 of them (an int64). */
static bool is_version_number(const char *v)
{
    size_t n = strspn(v, "0123456789");
    return n > 0 && n <= 18 && v[n] == '\0' && v[0] != '0';
}

static int get_model(pjs_server *s, const char *name, const char *version, bool internal_ok,
                     pjs_model **out, pjs_error *err)
{
    *out = NULL;
    if (name == NULL || name[0] == '\0')
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "no model name given");
    int rc = 0;
    pthread_mutex_lock(&s->repo_lock);
    repo_entry *e = find_entry_locked(s, name);
    bool has_version = version != NULL && version[0] != '\0';
    if (has_version && !is_version_number(version))
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, /* Triton's words, then ours */
                           "failed to get model version from specified version string "
                           "'%.64s' for model \"%.256s\" (a version is a whole number > 0; "
                           "pjserve serves version %s of each model)",
                           version, name, PJS_MODEL_VERSION);
    else if (e == NULL || (e->internal && !internal_ok))
        rc = unknown_model(name, err);
    else if (has_version && strcmp(version, PJS_MODEL_VERSION) != 0)
        rc = pjs_error_set(err, PJS_ERR_NOT_FOUND,
                           "Request for unknown model: '%.256s' version %.64s is not found "
                           "(pjserve serves version %s of each model)",
                           name, version, PJS_MODEL_VERSION);
    else if (e->model == NULL) {
        pjs_error_set(err, PJS_ERR_UNAVAILABLE, "model \"%s\" is not loaded%s%s", name,
                      e->info.reason[0] ? ": " : " (unloaded)", e->info.reason);
        rc = pjs_error_not_run(err); /* another worker may still have it */
    }
    else if ((rc = meta_calls_serving_locked(s, e->model, err)) == 0)
        *out = pjs_model_ref(e->model);
    pthread_mutex_unlock(&s->repo_lock);
    return rc;
}

int pjs_server_get_model(pjs_server *s, const char *name, const char *version, pjs_model **out,
                         pjs_error *err)
{
    return get_model(s, name, version, false, out, err);
}

int pjs__server_get_internal_model(pjs_server *s, const char *name, pjs_model **out,
                                   pjs_error *err)
{
    return get_model(s, name, NULL, true, out, err);
}

bool pjs__server_promote(pjs_server *s, pjs_infer_request *r, pjs_committed_caller *caller)
{
    bool idle = false;
    if (!atomic_compare_exchange_strong(&caller->in_flight, &idle, true))
        return false;
    if (pjs_dispatcher_promote(s->dispatcher, r, &caller->in_flight))
        return true;
    atomic_store(&caller->in_flight, false);
    return false;
}

pjs_meta_gate *pjs__server_meta_gate(pjs_server *s, const pjs_manifest *meta)
{
    return meta->decoupled && meta->n_calls == 0 ? s->stream_gate : s->meta_gate;
}

pjs_scratch_pool *pjs__server_scratch_pool(pjs_server *s)
{
    return s->scratch;
}

int pjs__server_submit_executable(pjs_server *s, pjs_infer_request *r, bool committed,
                                  pjs_error *err)
{
    pjs_model *m = r->model;
    int rc = pjs_infer_validate(r, pjs_model_manifest(m), m->max_batch_size > 0 ? m->max_batch_size : 1,
                                err);
    uint64_t default_timeout_ns = atomic_load(&m->default_timeout_ns);
    if (rc == 0 && r->deadline_ns == 0 && default_timeout_ns > 0)
        r->deadline_ns = r->times.received + default_timeout_ns;
    if (rc == 0)
        rc = pjs_dispatcher_submit(s->dispatcher, r, committed, err);
    if (rc != 0) {
        uint64_t now = pjs_now_ns();
        pthread_mutex_lock(&m->stats_lock);
        m->stats.fail.count++;
        m->stats.fail.ns += now > r->times.received ? now - r->times.received : 0;
        pthread_mutex_unlock(&m->stats_lock);
    }
    return rc;
}

/* Inputs in CUDA shared memory stay there for a model's executable, which
 * the dispatcher runs on them in place where it can; every other route
 * (metas, ensembles, hooks, sequences) and BYTES tensors need them on the
 * host. */
static int read_device_inputs_for_host(const pjs_bundle *b, pjs_infer_request *r,
                                       pjs_error *err)
{
    bool on_host = b->manifest.kind != PJS_KIND_MODEL || b->hooks != NULL || b->manifest.stateful;
    for (size_t i = 0; !on_host && i < r->n_inputs; i++)
        on_host = r->inputs[i].device != NULL && r->inputs[i].datatype != NULL &&
                  strcmp(r->inputs[i].datatype, "BYTES") == 0;
    return on_host ? pjs_infer_read_device_inputs(r, err) : 0;
}

int pjs_server_submit(pjs_server *s, pjs_infer_request *r, pjs_error *err)
{
    const pjs_bundle *b = r->model->bundle;
    /* Draining: metas accepted before still queue sub-calls (which do not
     * come through here); clients get no more. */
    if (atomic_load(&s->draining))
        return pjs_error_set(err, PJS_ERR_DRAINING,
                             "pjserve is shutting down and accepts no new requests");
    if (b->manifest.decoupled && r->respond == NULL)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "model %s is decoupled (it may send zero, one or many responses per "
                             "request): send its requests over gRPC ModelStreamInfer",
                             r->model->name);
    int rc = read_device_inputs_for_host(b, r, err);
    if (rc != 0)
        return rc;
    if (b->manifest.kind != PJS_KIND_MODEL) /* a meta, or an ensemble's steps */
        return pjs_meta_submit(s, r, err);
    if (b->hooks != NULL)
        return pjs_hooked_submit(s, r, err);
    if (b->manifest.stateful)
        return pjs_sequence_submit(s, r, err);
    return pjs__server_submit_executable(s, r, false, err);
}

int pjs_server_submit_committed(pjs_server *s, pjs_infer_request *r,
                                pjs_committed_caller *caller, pjs_error *err)
{
    bool idle = false;
    if (!atomic_compare_exchange_strong(&caller->in_flight, &idle, true))
        return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                             "model %s: this caller already has a committed request in flight; "
                             "wait for its completion before submitting the next",
                             r->model->name);
    r->committed_slot = &caller->in_flight;
    int rc = pjs__server_submit_executable(s, r, true, err);
    if (rc != 0) {
        r->committed_slot = NULL;
        atomic_store(&caller->in_flight, false);
    }
    return rc;
}

void pjs_server_model_sched_info(pjs_server *s, pjs_model *m, pjs_model_sched_info *out)
{
    pjs_sched_model_view v;
    pjs_dispatcher_model_view(s->dispatcher, m, &v);
    out->weight = v.weight;
    out->max_queue_depth = v.max_queue_depth;
    out->queue_depth = v.queue_depth;
    out->in_flight = v.in_flight;
    out->recent_utilization = v.recent_utilization;
    out->default_timeout_us = atomic_load(&m->default_timeout_ns) / 1000;
}

const char *pjs_server_discipline(const pjs_server *s)
{
    return pjs_discipline_name(s->policies.sched.discipline);
}

size_t pjs_server_repository_index(pjs_server *s, bool ready_only, pjs_repository_entry *out,
                                   size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(&s->repo_lock);
    for (size_t i = 0; i < s->n_entries; i++) {
        if (s->entries[i].internal)
            continue;
        pjs_repository_entry info = entry_view_locked(s, &s->entries[i]);
        if (ready_only && info.state != PJS_MODEL_READY)
            continue;
        if (n < cap)
            out[n] = info;
        n++;
    }
    pthread_mutex_unlock(&s->repo_lock);
    return n;
}

int pjs_server_repository_list(pjs_server *s, bool ready_only, pjs_repository_entry **out,
                               size_t *n_out, pjs_error *err)
{
    size_t cap = 64;
    pjs_repository_entry *entries = NULL;
    size_t n;
    for (;;) {
        pjs_repository_entry *grown = realloc(entries, cap * sizeof *entries);
        if (grown == NULL) {
            free(entries);
            return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the repository index");
        }
        entries = grown;
        n = pjs_server_repository_index(s, ready_only, entries, cap);
        if (n <= cap)
            break;
        cap = n;
    }
    *out = entries;
    *n_out = n;
    return 0;
}

int pjs_server_unload_model(pjs_server *s, const char *name, pjs_error *err)
{
    if (name == NULL || name[0] == '\0')
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "no model name given");
    pthread_mutex_lock(&s->repo_lock);
    repo_entry *e = find_entry_locked(s, name);
    bool known = e != NULL;
    bool bundle_gone = known && !e->internal && !is_bundle_dir(s->repository, name);
    pthread_mutex_unlock(&s->repo_lock);
    if (!known)
        return unknown_model(name, err);
    if (bundle_gone) /* as the repository watcher drops a removed bundle */
        return pjs_server_remove_model(s, name, err);
    drop_model(s, set_entry(s, name, PJS_MODEL_UNAVAILABLE,
                              "unloaded by a repository request; load it again to serve it", NULL,
                              true));
    pjs_info("model %s unloaded", name);
    return 0;
}

int pjs_server_remove_model(pjs_server *s, const char *name, pjs_error *err)
{
    pjs_model *old = NULL;
    int rc = 0;
    pthread_mutex_lock(&s->load_lock); /* not in the middle of a load of it */
    pthread_mutex_lock(&s->repo_lock);
    repo_entry *e = name != NULL ? find_entry_locked(s, name) : NULL;
    if (e == NULL) {
        rc = unknown_model(name ? name : "", err);
    } else {
        old = e->model;
        size_t i = (size_t)(e - s->entries);
        memmove(e, e + 1, (s->n_entries - i - 1) * sizeof *e);
        s->n_entries--;
    }
    pthread_mutex_unlock(&s->repo_lock);
    pthread_mutex_unlock(&s->load_lock);
    drop_model(s, old);
    if (rc == 0)
        pjs_info("model %s removed from the repository", name);
    return rc;
}

void pjs_server_get_counters(pjs_server *s, pjs_server_counters *out)
{
    pjs_dispatcher_counters(s->dispatcher, &out->queue_depth, &out->in_flight,
                            &out->plans_inline, &out->plans_worker, &out->weight_prefetches);
    pjs_dispatcher_shm_device_bytes(s->dispatcher, &out->shm_device_in_bytes,
                                    &out->shm_device_out_bytes);
    pjs_dispatcher_tier_stats(s->dispatcher, &out->tiers);
    pjs_tracer_counters tc;
    pjs_tracer_get_counters(s->tracer, &tc);
    out->trace_spans_exported = tc.exported;
    out->trace_spans_dropped_full = tc.dropped_full;
    out->trace_spans_dropped_failed = tc.dropped_failed;
    pjs_meta_gate_counters g, st;
    pjs_meta_gate_get_counters(s->meta_gate, &g);
    pjs_meta_gate_get_counters(s->stream_gate, &st);
    out->meta_permits = g.permits;
    out->meta_running_gated = g.running_gated;
    out->meta_running_compute = g.running_compute + st.running_compute;
    out->meta_waiting = g.waiting_gated + g.waiting_compute + st.waiting_compute;
    out->meta_peak_gated = g.peak_gated;
    out->meta_completed = g.completed + st.completed;
    out->meta_expired = g.expired + st.expired;
    pjs_scratch_counters sc;
    pjs_scratch_pool_get_counters(s->scratch, &sc);
    out->scratch_budget_bytes = sc.budget_bytes;
    out->scratch_used_bytes = sc.used_bytes;
    out->scratch_peak_bytes = sc.peak_bytes;
    out->scratch_waited = sc.waited;
    out->scratch_timed_out = sc.timed_out;
}

static void foreach_model(pjs_server *s, bool internal_too, void (*fn)(pjs_model *m, void *ctx),
                          void *ctx)
{
    pthread_mutex_lock(&s->repo_lock);
    size_t n = 0;
    pjs_model **models = calloc(s->n_entries + 1, sizeof *models);
    for (size_t i = 0; models != NULL && i < s->n_entries; i++)
        if (s->entries[i].model != NULL && (internal_too || !s->entries[i].internal))
            models[n++] = pjs_model_ref(s->entries[i].model);
    pthread_mutex_unlock(&s->repo_lock);
    for (size_t i = 0; i < n; i++) {
        fn(models[i], ctx);
        pjs_model_unref(models[i]);
    }
    free(models);
}

void pjs_server_foreach_model(pjs_server *s, void (*fn)(pjs_model *m, void *ctx), void *ctx)
{
    foreach_model(s, true, fn, ctx);
}

void pjs_server_foreach_public_model(pjs_server *s, void (*fn)(pjs_model *m, void *ctx),
                                     void *ctx)
{
    foreach_model(s, false, fn, ctx);
}

/* ---- residency ----------------------------------------------------------- */

pjs_control_mode pjs_server_control_mode(const pjs_server *s)
{
    return s->control_mode;
}

void pjs_server_model_residency(pjs_server *s, pjs_model *m, pjs_model_residency_info *out)
{
    memset(out, 0, sizeof *out);
    out->weight_bytes = m->wentry.bytes;
    out->load_ns = atomic_load(&m->load_ns);
    pjs_dispatcher_residency(s->dispatcher, m, &out->residency, &out->resident, &out->loads,
                             &out->evictions);
    pjs_dispatcher_host_residency(s->dispatcher, m, &out->in_host, &out->host_loads,
                                  &out->host_evictions);
    out->host_bytes = m->hentry.bytes;
    out->host_load_ns = atomic_load(&m->host_load_ns);
}

size_t pjs_server_metrics_models(const pjs_server *s)
{
    return s->metrics_models;
}

void pjs_server_weight_cache_info(pjs_server *s, pjs_weight_cache_info *out)
{
    pjs_dispatcher_cache_totals(s->dispatcher, &out->budget_bytes, &out->used_bytes,
                                &out->pinned_bytes, &out->changes);
    pjs_dispatcher_host_totals(s->dispatcher, &out->host_budget_bytes, &out->host_used_bytes,
                               &out->host_pinned_bytes, &out->host_changes);
}

int pjs_server_set_residency(pjs_server *s, const char *name, pjs_residency target,
                             pjs_error *err)
{
    pjs_model *m = NULL;
    int rc = pjs_server_get_model(s, name, NULL, &m, err);
    if (rc != 0)
        return rc;
    rc = pjs_dispatcher_set_residency(s->dispatcher, m, target, err);
    /* In explicit control only pinned models warmed up at load. */
    if (rc == 0 && target == PJS_RESIDENCY_DEVICE && s->control_mode == PJS_CONTROL_EXPLICIT)
        rc = pjs_dispatcher_warm_up(s->dispatcher, m, s->policies.sched.warmup_runs, NULL, NULL,
                                    err);
    if (rc == 0)
        pjs_info("model %s: residency %s", name, pjs_residency_name(target));
    pjs_model_unref(m);
    return rc;
}

int pjs_server_compact(pjs_server *s, const char *const *reload, size_t n, size_t *reloaded,
                       pjs_error *err)
{
    *reloaded = 0;
    pjs_model **models = calloc(n + 1, sizeof *models);
    if (models == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    int rc = 0;
    size_t got = 0;
    for (; got < n && rc == 0; got++)
        rc = pjs_server_get_model(s, reload[got], NULL, &models[got], err);
    if (rc == 0)
        rc = pjs_dispatcher_compact(s->dispatcher, models, n, reloaded, err);
    for (size_t i = 0; i < n; i++)
        pjs_model_unref(models[i]);
    free(models);
    if (rc == 0)
        pjs_info("device weight cache compacted; %zu models reloaded", *reloaded);
    return rc;
}

int pjs_server_set_model_policy(pjs_server *s, const char *name, const pjs_model_policy *p,
                                pjs_error *err)
{
    if (p->weight < 0 || !isfinite(p->weight))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "weight: must be a finite number > 0");
    pjs_model *m = NULL;
    int rc = pjs_server_get_model(s, name, NULL, &m, err);
    if (rc != 0)
        return rc;
    if (p->default_timeout_us >= 0)
        atomic_store(&m->default_timeout_ns, (uint64_t)p->default_timeout_us * 1000);
    pjs_dispatcher_set_policy(s->dispatcher, m, p->weight, p->max_queue_depth);
    pjs_sched_model_view v;
    pjs_dispatcher_model_view(s->dispatcher, m, &v);
    pjs_info("model %s: policy weight %g, max queue depth %zu, default timeout %llu us", name,
             v.weight, v.max_queue_depth,
             (unsigned long long)(atomic_load(&m->default_timeout_ns) / 1000));
    pjs_model_unref(m);
    return 0;
}
