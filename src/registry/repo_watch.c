/*
 * repo_watch.c - fingerprints, the two-poll rule and the polling thread of
 * a repository watcher (repo_watch.h).
 *
 * A scan's bundle list is touched by one thread only (the caller of
 * pjs_repo_scan_poll; the watcher's thread once started). Entries whose
 * bundle is absent and was acted on as such are dropped.
 *
 * A fingerprint sums one mixed hash per loaded file, so it does not depend
 * on the order readdir lists them in.
 */
#include "core/thread_name.h"
#include "registry/repo_watch.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/log.h"
#include "registry/bundle.h"

/* What the scan knows of one bundle directory. */
typedef struct watched_bundle {
    char name[256];
    uint64_t now;   /* this poll's fingerprint; 0: absent */
    uint64_t last;  /* the previous poll's */
    uint64_t acted; /* the state the caller's repository reflects */
} watched_bundle;

struct pjs_repo_scan {
    char repository[PJS_BUNDLE_DIR_MAX];
    bool repository_missing; /* the last poll could not open it (warned once) */
    watched_bundle *bundles;
    size_t n_bundles;
    size_t cap_bundles;
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

static watched_bundle *find_or_add(pjs_repo_scan *s, const char *name)
{
    for (size_t i = 0; i < s->n_bundles; i++)
        if (strcmp(s->bundles[i].name, name) == 0)
            return &s->bundles[i];
    if (s->n_bundles == s->cap_bundles) {
        size_t cap = s->cap_bundles ? 2 * s->cap_bundles : 16;
        watched_bundle *grown = realloc(s->bundles, cap * sizeof *grown);
        if (grown == NULL)
            return NULL;
        s->bundles = grown;
        s->cap_bundles = cap;
    }
    watched_bundle *b = &s->bundles[s->n_bundles++];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    return b;
}

/* Sets every bundle's `now` from the directory: 0 for those not there. */
static int scan(pjs_repo_scan *s, pjs_error *err)
{
    DIR *d = opendir(s->repository);
    if (d == NULL)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND, "model repository %s: %s", s->repository,
                             strerror(errno));
    for (size_t i = 0; i < s->n_bundles; i++)
        s->bundles[i].now = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char path[PJS_BUNDLE_DIR_MAX + 300];
        if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof s->bundles->name)
            continue;
        snprintf(path, sizeof path, "%s/%s", s->repository, de->d_name);
        uint64_t fp = fingerprint(path);
        watched_bundle *b = fp != 0 ? find_or_add(s, de->d_name) : NULL;
        if (b != NULL)
            b->now = fp;
        else if (fp != 0)
            pjs_warn("repository: out of memory; bundle %s is not watched", de->d_name);
    }
    closedir(d);
    return 0;
}

/* ---- the scan -------------------------------------------------------------- */

int pjs_repo_scan_open(const char *repository, pjs_repo_scan **out, pjs_error *err)
{
    *out = NULL;
    pjs_repo_scan *s = calloc(1, sizeof *s);
    if (s == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    snprintf(s->repository, sizeof s->repository, "%s", repository);
    int rc = scan(s, err);
    if (rc != 0) {
        pjs_repo_scan_close(s);
        return rc;
    }
    for (size_t i = 0; i < s->n_bundles; i++)
        s->bundles[i].last = s->bundles[i].acted = s->bundles[i].now;
    *out = s;
    return 0;
}

size_t pjs_repo_scan_count(const pjs_repo_scan *s)
{
    return s->n_bundles;
}

void pjs_repo_scan_poll(pjs_repo_scan *s, pjs_repo_act_fn act, void *ctx,
                        const atomic_bool *stop)
{
    pjs_error err;
    if (scan(s, &err) != 0) {
        if (!s->repository_missing)
            pjs_warn("repository: %s; models keep serving as they are until it is back",
                     err.msg);
        s->repository_missing = true;
        return;
    }
    if (s->repository_missing)
        pjs_info("repository: %s is readable again", s->repository);
    s->repository_missing = false;
    size_t kept = 0;
    for (size_t i = 0; i < s->n_bundles; i++) {
        watched_bundle *b = &s->bundles[i];
        if (b->now == b->last && b->now != b->acted && (stop == NULL || !atomic_load(stop)) &&
            act(ctx, b->name, b->acted, b->now))
            b->acted = b->now;
        b->last = b->now;
        if (b->last != 0 || b->acted != 0)
            s->bundles[kept++] = *b;
    }
    s->n_bundles = kept;
}

void pjs_repo_scan_close(pjs_repo_scan *s)
{
    if (s == NULL)
        return;
    free(s->bundles);
    free(s);
}

/* ---- the thread ---------------------------------------------------------- */

struct pjs_repo_watch {
    pjs_repo_scan *scan; /* the thread's once started */
    uint64_t poll_ms;
    pjs_repo_act_fn act;
    void *ctx;
    atomic_bool stopping;
    pthread_mutex_t lock; /* with wake: the sleep between polls */
    pthread_cond_t wake;  /* stopping was set */
    pthread_t thread;
};

/* Sleeps one poll interval; false when the watcher is stopping. */
static bool wait_poll(pjs_repo_watch *w)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + (w->poll_ms % 1000) * 1000000ULL;
    until.tv_sec += (time_t)(w->poll_ms / 1000 + ns / 1000000000ULL);
    until.tv_nsec = (long)(ns % 1000000000ULL);
    pthread_mutex_lock(&w->lock);
    while (!atomic_load(&w->stopping) &&
           pthread_cond_timedwait(&w->wake, &w->lock, &until) != ETIMEDOUT)
        ;
    pthread_mutex_unlock(&w->lock);
    return !atomic_load(&w->stopping);
}

static void *watch(void *arg)
{
    pjs_repo_watch *w = arg;
    while (wait_poll(w))
        pjs_repo_scan_poll(w->scan, w->act, w->ctx, &w->stopping);
    return NULL;
}

int pjs_repo_watch_start(const char *repository, uint64_t poll_ms, pjs_repo_act_fn act,
                         void *ctx, pjs_repo_watch **out, pjs_error *err)
{
    *out = NULL;
    pjs_repo_watch *w = calloc(1, sizeof *w);
    if (w == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    w->poll_ms = poll_ms;
    w->act = act;
    w->ctx = ctx;
    atomic_init(&w->stopping, false);
    int rc = pjs_repo_scan_open(repository, &w->scan, err);
    size_t n = rc == 0 ? pjs_repo_scan_count(w->scan) : 0;
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
        pjs_repo_scan_close(w->scan);
        free(w);
        return rc;
    }
    pjs_info("repository: watching %s every %llu ms (%zu bundles); a change is acted on once "
             "seen on two polls in a row",
             repository, (unsigned long long)poll_ms, n);
    *out = w;
    return 0;
}

void pjs_repo_watch_stop(pjs_repo_watch *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->lock);
    atomic_store(&w->stopping, true);
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->wake);
    pjs_repo_scan_close(w->scan);
    free(w);
}
