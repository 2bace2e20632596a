/*
 * watcher.c - the repository watcher: fingerprints, the two-poll debounce,
 * and the load, reload and removal it asks the server for.
 *
 * Each watched bundle keeps two fingerprints: `last`, what the previous poll
 * saw, and `acted`, the state the server's repository reflects (0: absent).
 * A poll that sees `now` acts only when now == last (unchanged for two polls)
 * and now != acted; then acted = now, whatever the outcome, so a bundle that
 * failed to load is retried only once its files change again. Entries whose
 * bundle is absent and was acted on as such are dropped.
 *
 * A fingerprint sums one mixed hash per loaded file, so it does not depend
 * on the order readdir lists them in.
 */
#include "core/thread_name.h"
#include "server/watcher.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/log.h"
#include "registry/bundle.h"
#include "server/server.h"

/* What the watcher knows of one bundle directory. */
typedef struct watched_bundle {
    char name[256];
    uint64_t now;   /* this poll's fingerprint; 0: absent */
    uint64_t last;  /* the previous poll's */
    uint64_t acted; /* the state the server reflects */
} watched_bundle;

struct pjs_watcher {
    pjs_server *server;
    char repository[PJS_BUNDLE_DIR_MAX];
    uint64_t poll_ms;
    bool repository_missing; /* the last poll could not open it (warned once) */
    watched_bundle *bundles;
    size_t n_bundles;
    size_t cap_bundles;

    pthread_mutex_t lock; /* stopping */
    pthread_cond_t wake;  /* stopping was set */
    bool stopping;
    pthread_t thread;
};

/* ---- fingerprints ---------------------------------------------------------- */

/* The files a bundle load reads (registry/bundle.c). */
static bool is_loaded_file(const char *name)
{
    size_t n = strlen(name);
    return strcmp(name, "manifest.yaml") == 0 || strcmp(name, "weights.safetensors") == 0 ||
           strcmp(name, "model.c") == 0 || strcmp(name, "model.so") == 0 ||
           (strncmp(name, "model", 5) == 0 && n >= 10 && strcmp(name + n - 5, ".mlir") == 0);
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

/* splitmix64's finalizer, so that summing file hashes keeps them apart. */
static uint64_t mix(uint64_t h)
{
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

static uint64_t timespec_ns(struct timespec t)
{
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* 0 when `dir` is not a directory; never 0 otherwise. A file that vanishes
 * between readdir and stat is left out: the bundle is changing, and the next
 * poll sees it differently anyway. */
static uint64_t fingerprint(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    uint64_t sum = 0x9e3779b97f4a7c15ULL;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (!is_loaded_file(de->d_name) || fstatat(dirfd(d), de->d_name, &st, 0) != 0)
            continue;
        uint64_t fields[4] = {(uint64_t)st.st_size, timespec_ns(st.st_mtim),
                              timespec_ns(st.st_ctim), (uint64_t)st.st_ino};
        uint64_t h = fnv1a(0xcbf29ce484222325ULL, de->d_name, strlen(de->d_name) + 1);
        sum += mix(fnv1a(h, fields, sizeof fields));
    }
    closedir(d);
    return sum != 0 ? sum : 1;
}

/* ---- the bundle list ----------------------------------------------------- */

static watched_bundle *find_or_add(pjs_watcher *w, const char *name)
{
    for (size_t i = 0; i < w->n_bundles; i++)
        if (strcmp(w->bundles[i].name, name) == 0)
            return &w->bundles[i];
    if (w->n_bundles == w->cap_bundles) {
        size_t cap = w->cap_bundles ? 2 * w->cap_bundles : 16;
        watched_bundle *grown = realloc(w->bundles, cap * sizeof *grown);
        if (grown == NULL)
            return NULL;
        w->bundles = grown;
        w->cap_bundles = cap;
    }
    watched_bundle *b = &w->bundles[w->n_bundles++];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    return b;
}

/* Sets every bundle's `now` from the directory: 0 for those not there. */
static int scan(pjs_watcher *w, pjs_error *err)
{
    DIR *d = opendir(w->repository);
    if (d == NULL)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND, "model repository %s: %s", w->repository,
                             strerror(errno));
    for (size_t i = 0; i < w->n_bundles; i++)
        w->bundles[i].now = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char path[PJS_BUNDLE_DIR_MAX + 300];
        if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof w->bundles->name)
            continue;
        snprintf(path, sizeof path, "%s/%s", w->repository, de->d_name);
        uint64_t fp = fingerprint(path);
        watched_bundle *b = fp != 0 ? find_or_add(w, de->d_name) : NULL;
        if (b != NULL)
            b->now = fp;
        else if (fp != 0)
            pjs_warn("repository: out of memory; bundle %s is not watched", de->d_name);
    }
    closedir(d);
    return 0;
}

/* ---- actions ----------------------------------------------------------------- */

/* Whether a version of model `name` serves requests now. */
static bool serving(pjs_server *s, const char *name)
{
    pjs_model *m = NULL;
    pjs_error err;
    pjs_server_get_model(s, name, NULL, &m, &err);
    pjs_model_unref(m);
    return m != NULL;
}

/* Brings the server's repository from state `before` of bundle `name` to
 * state `now` (fingerprints; 0: absent). Loads run on the server's load
 * threads; this thread waits for them. False when the server's load queue
 * was full: the change is acted on at a later poll. */
static bool act(pjs_watcher *w, const char *name, uint64_t before, uint64_t now)
{
    pjs_error err;
    if (now == 0) {
        pjs_info("repository: model %s removed, dropping it", name);
        if (pjs_server_remove_model(w->server, name, &err) != 0 && err.code != PJS_ERR_NOT_FOUND)
            pjs_warn("repository: model %s not removed: %s", name, err.msg);
        return true;
    }
    pjs_info("repository: model %s %s", name, before == 0 ? "added, loading" : "changed, reloading");
    if (pjs_server_load_model(w->server, name, &err) == 0)
        return true;
    if (err.code == PJS_ERR_RESOURCE_EXHAUSTED) {
        pjs_warn("repository: model %s: %s; trying again at the next poll", name, err.msg);
        return false;
    }
    if (before == 0)
        pjs_warn("repository: new model %s failed to load; not retried until its bundle "
                 "changes: %s",
                 name, err.msg);
    else
        pjs_warn("repository: changed model %s failed to load, %s; not retried until its "
                 "bundle changes again: %s",
                 name,
                 serving(w->server, name) ? "the previous version keeps serving"
                                          : "no version of it is serving",
                 err.msg);
    return true;
}

static bool stop_requested(pjs_watcher *w)
{
    pthread_mutex_lock(&w->lock);
    bool stopping = w->stopping;
    pthread_mutex_unlock(&w->lock);
    return stopping;
}

/* One scan and the actions it calls for; none is started once the watcher
 * is asked to stop (a load takes seconds; shutdown waits for it). */
static void poll_once(pjs_watcher *w)
{
    pjs_error err;
    if (scan(w, &err) != 0) {
        if (!w->repository_missing)
            pjs_warn("repository: %s; models keep serving as they are until it is back",
                     err.msg);
        w->repository_missing = true;
        return;
    }
    if (w->repository_missing)
        pjs_info("repository: %s is readable again", w->repository);
    w->repository_missing = false;
    size_t kept = 0;
    for (size_t i = 0; i < w->n_bundles; i++) {
        watched_bundle *b = &w->bundles[i];
        if (b->now == b->last && b->now != b->acted && !stop_requested(w) &&
            act(w, b->name, b->acted, b->now))
            b->acted = b->now;
        b->last = b->now;
        if (b->last != 0 || b->acted != 0)
            w->bundles[kept++] = *b;
    }
    w->n_bundles = kept;
}

/* ---- the thread ---------------------------------------------------------- */

/* Sleeps one poll interval; false when the watcher is stopping. */
static bool wait_poll(pjs_watcher *w)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + (w->poll_ms % 1000) * 1000000ULL;
    until.tv_sec += (time_t)(w->poll_ms / 1000 + ns / 1000000000ULL);
    until.tv_nsec = (long)(ns % 1000000000ULL);
    pthread_mutex_lock(&w->lock);
    while (!w->stopping && pthread_cond_timedwait(&w->wake, &w->lock, &until) != ETIMEDOUT)
        ;
    bool go = !w->stopping;
    pthread_mutex_unlock(&w->lock);
    return go;
}

static void *watch(void *arg)
{
    pjs_watcher *w = arg;
    while (wait_poll(w))
        poll_once(w);
    return NULL;
}

int pjs_watcher_start(pjs_server *s, const char *repository, uint64_t poll_ms,
                      pjs_watcher **out, pjs_error *err)
{
    *out = NULL;
    pjs_watcher *w = calloc(1, sizeof *w);
    if (w == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    w->server = s;
    w->poll_ms = poll_ms;
    snprintf(w->repository, sizeof w->repository, "%s", repository);
    int rc = scan(w, err);
    size_t n = w->n_bundles; /* the thread owns the list once started */
    for (size_t i = 0; rc == 0 && i < n; i++)
        w->bundles[i].last = w->bundles[i].acted = w->bundles[i].now;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&w->lock, NULL);
    int e = rc == 0 ? pthread_create(&w->thread, NULL, watch, w) : 0;
    if (rc == 0 && e == 0)
        pjs_thread_name(w->thread, "pjs-watch");
    if (e != 0)
        rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                           "repository watcher: cannot start its thread: %s", strerror(e));
    if (rc != 0) {
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->wake);
        free(w->bundles);
        free(w);
        return rc;
    }
    pjs_info("repository: watching %s every %llu ms (%zu bundles); a change is acted on once "
             "seen on two polls in a row",
             repository, (unsigned long long)poll_ms, n);
    *out = w;
    return 0;
}

void pjs_watcher_stop(pjs_watcher *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->lock);
    w->stopping = true;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->wake);
    free(w->bundles);
    free(w);
}
