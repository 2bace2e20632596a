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
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "registry/bundle.h"

/* What the scan knows of one bundle directory. */
typedef struct watched_bundle {
    char name[256];
    uint64_t now;   /* this poll's fingerprint; 0: absent */
    uint64_t last;  /* the previous poll's */
    uint64_t acted; /* the state the caller's repository reflects */
    bool pending;   /* fingerprinted at the next poll: an event named it, or its
                       change has not settled and been acted on yet */
    int wd;         /* the inotify watch on its directory; -1: none */
} watched_bundle;

struct pjs_repo_scan {
    char repository[PJS_BUNDLE_DIR_MAX];
    bool repository_missing; /* the last poll could not open it (warned once) */
    watched_bundle *bundles;
    size_t n_bundles;
    size_t cap_bundles;
    /* Bundle index + 1 by name (open addressing; 0: empty slot), rebuilt
     * when the list grows past half of it or is compacted. */
    uint32_t *index;
    size_t index_cap;
    /* Change notification: -1 when every poll scans the whole repository. */
    int inotify_fd;
    int repo_wd;
    /* Bundle index + 1 by watch descriptor; -1: a watch of several bundles
     * (links to one directory), whose events call for a full scan. */
    int64_t *owners;
    size_t n_owners;
    bool full_scan_due;       /* an overflow, or the repository replaced */
    uint64_t polls_since_full;
    uint64_t fingerprints;    /* taken so far */
};

static void note_owner(pjs_repo_scan *s, int wd, size_t i);

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

static uint64_t name_hash(const char *name)
{
    return mix(fnv1a(0xcbf29ce484222325ULL, name, strlen(name)));
}

/* Rebuilds the name index and the watch owners from the bundle list (after
 * it grew or was compacted). False when out of memory. */
static bool reindex(pjs_repo_scan *s)
{
    size_t cap = 64;
    while (cap < 2 * s->n_bundles + 2)
        cap *= 2;
    uint32_t *index = calloc(cap, sizeof *index);
    if (index == NULL)
        return false;
    for (size_t i = 0; i < s->n_bundles; i++) {
        size_t at = (size_t)name_hash(s->bundles[i].name) & (cap - 1);
        while (index[at] != 0)
            at = (at + 1) & (cap - 1);
        index[at] = (uint32_t)i + 1;
    }
    free(s->index);
    s->index = index;
    s->index_cap = cap;
    for (size_t w = 0; w < s->n_owners; w++)
        s->owners[w] = 0;
    for (size_t i = 0; i < s->n_bundles; i++)
        note_owner(s, s->bundles[i].wd, i);
    return true;
}

static watched_bundle *find(pjs_repo_scan *s, const char *name)
{
    if (s->index_cap == 0)
        return NULL;
    for (size_t at = (size_t)name_hash(name) & (s->index_cap - 1); s->index[at] != 0;
         at = (at + 1) & (s->index_cap - 1)) {
        watched_bundle *b = &s->bundles[s->index[at] - 1];
        if (strcmp(b->name, name) == 0)
            return b;
    }
    return NULL;
}

static watched_bundle *find_or_add(pjs_repo_scan *s, const char *name)
{
    watched_bundle *b = find(s, name);
    if (b != NULL)
        return b;
    if (s->n_bundles == s->cap_bundles) {
        size_t cap = s->cap_bundles ? 2 * s->cap_bundles : 16;
        watched_bundle *grown = realloc(s->bundles, cap * sizeof *grown);
        if (grown == NULL)
            return NULL;
        s->bundles = grown;
        s->cap_bundles = cap;
    }
    b = &s->bundles[s->n_bundles++];
    memset(b, 0, sizeof *b);
    b->wd = -1;
    snprintf(b->name, sizeof b->name, "%s", name);
    if (2 * s->n_bundles + 2 > s->index_cap) {
        if (!reindex(s)) {
            s->n_bundles--;
            return NULL;
        }
    } else {
        size_t at = (size_t)name_hash(name) & (s->index_cap - 1);
        while (s->index[at] != 0)
            at = (at + 1) & (s->index_cap - 1);
        s->index[at] = (uint32_t)(s->n_bundles);
    }
    return b;
}

/* ---- change notification (inotify) ------------------------------------------ */

#define REPO_EVENTS                                                                             \
    (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_CLOSE_WRITE |         \
     IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
#define BUNDLE_EVENTS                                                                           \
    (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_CLOSE_WRITE |         \
     IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)

/* Stops notification: every poll scans from now on. */
static void stop_notifying(pjs_repo_scan *s, const char *why)
{
    if (s->inotify_fd < 0)
        return;
    pjs_warn("repository: %s; scanning every bundle at each poll instead", why);
    close(s->inotify_fd);
    s->inotify_fd = -1;
}

/* Records that watch wd is bundle i's; a watch two names share (links to
 * one directory) makes its events call for a full scan. */
static void note_owner(pjs_repo_scan *s, int wd, size_t i)
{
    if (wd < 0)
        return;
    if ((size_t)wd >= s->n_owners) {
        size_t n = s->n_owners ? s->n_owners : 64;
        while (n <= (size_t)wd)
            n *= 2;
        int64_t *grown = realloc(s->owners, n * sizeof *grown);
        if (grown == NULL) {
            stop_notifying(s, "out of memory for its change notifications");
            return;
        }
        memset(grown + s->n_owners, 0, (n - s->n_owners) * sizeof *grown);
        s->owners = grown;
        s->n_owners = n;
    }
    int64_t mine = (int64_t)i + 1;
    s->owners[wd] = s->owners[wd] == 0 || s->owners[wd] == mine ? mine : -1;
}

/* Watches bundle b's directory (following a link to it). */
static void watch_bundle(pjs_repo_scan *s, watched_bundle *b)
{
    if (s->inotify_fd < 0)
        return;
    char path[PJS_BUNDLE_DIR_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", s->repository, b->name);
    int wd = inotify_add_watch(s->inotify_fd, path, BUNDLE_EVENTS);
    if (wd < 0) {
        if (errno == ENOSPC)
            stop_notifying(s, "the system's inotify watches are used up (fs.inotify."
                              "max_user_watches)");
        else if (errno != ENOENT && errno != ENOTDIR)
            stop_notifying(s, strerror(errno));
        return;
    }
    b->wd = wd;
    note_owner(s, wd, (size_t)(b - s->bundles));
}

static void start_notifying(pjs_repo_scan *s)
{
    s->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (s->inotify_fd < 0) {
        pjs_warn("repository: no change notification (%s); scanning every bundle at each poll",
                 strerror(errno));
        return;
    }
    s->repo_wd = inotify_add_watch(s->inotify_fd, s->repository, REPO_EVENTS);
    if (s->repo_wd < 0)
        stop_notifying(s, strerror(errno));
}

/* Reads what happened since the last poll: the bundles it names become
 * pending; an overflow, the repository itself replaced or a shared watch
 * asks for a full scan. */
static void drain_events(pjs_repo_scan *s)
{
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t len = read(s->inotify_fd, buf, sizeof buf);
        if (len <= 0) {
            if (len < 0 && errno == EINTR)
                continue;
            if (len < 0 && errno != EAGAIN)
                stop_notifying(s, strerror(errno));
            return;
        }
        for (char *p = buf; p < buf + len;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            p += sizeof *ev + ev->len;
            if (ev->mask & IN_Q_OVERFLOW) {
                s->full_scan_due = true;
            } else if (ev->wd == s->repo_wd) {
                if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED))
                    s->full_scan_due = true;
                else if (ev->len > 0 && ev->name[0] != '.' && strlen(ev->name) < 256) {
                    watched_bundle *b = find_or_add(s, ev->name);
                    if (b == NULL) {
                        s->full_scan_due = true;
                        continue;
                    }
                    b->pending = true;
                    if (ev->mask & (IN_CREATE | IN_MOVED_TO | IN_ATTRIB))
                        watch_bundle(s, b); /* a new directory, or a link retargeted */
                }
            } else if (ev->wd >= 0 && (size_t)ev->wd < s->n_owners && s->owners[ev->wd] != 0) {
                if (s->owners[ev->wd] < 0)
                    s->full_scan_due = true;
                else
                    s->bundles[s->owners[ev->wd] - 1].pending = true;
            }
        }
        if (s->inotify_fd < 0)
            return;
    }
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
        s->fingerprints++;
        watched_bundle *b = fp != 0 ? find_or_add(s, de->d_name) : NULL;
        if (b != NULL) {
            b->now = fp;
            if (s->inotify_fd >= 0)
                watch_bundle(s, b);
        } else if (fp != 0) {
            pjs_warn("repository: out of memory; bundle %s is not watched", de->d_name);
        }
    }
    closedir(d);
    return 0;
}

/* Fingerprints only the bundles an event or an unsettled change named;
 * the others are as they were. */
static void scan_pending(pjs_repo_scan *s)
{
    for (size_t i = 0; i < s->n_bundles; i++) {
        watched_bundle *b = &s->bundles[i];
        if (!b->pending) {
            b->now = b->last;
            continue;
        }
        char path[PJS_BUNDLE_DIR_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", s->repository, b->name);
        b->now = fingerprint(path);
        s->fingerprints++;
    }
}

/* ---- the scan -------------------------------------------------------------- */

int pjs_repo_scan_open(const char *repository, pjs_repo_notify notify, pjs_repo_scan **out,
                       pjs_error *err)
{
    *out = NULL;
    pjs_repo_scan *s = calloc(1, sizeof *s);
    if (s == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    snprintf(s->repository, sizeof s->repository, "%s", repository);
    s->inotify_fd = -1;
    s->repo_wd = -1;
    DIR *d = opendir(repository); /* missing: refused before anything is watched */
    if (d == NULL) {
        int e = errno;
        free(s);
        return pjs_error_set(err, PJS_ERR_NOT_FOUND, "model repository %s: %s", repository,
                             strerror(e));
    }
    closedir(d);
    if (notify == PJS_REPO_NOTIFY_AUTO)
        start_notifying(s);
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

bool pjs_repo_scan_notified(const pjs_repo_scan *s)
{
    return s->inotify_fd >= 0;
}

uint64_t pjs_repo_scan_fingerprints(const pjs_repo_scan *s)
{
    return s->fingerprints;
}

void pjs_repo_scan_poll(pjs_repo_scan *s, pjs_repo_act_fn act, void *ctx,
                        const atomic_bool *stop)
{
    if (s->inotify_fd >= 0)
        drain_events(s);
    bool full = s->inotify_fd < 0 || s->full_scan_due || s->repository_missing ||
                ++s->polls_since_full >= PJS_REPO_FULL_SCAN_POLLS;
    if (full) {
        pjs_error err;
        if (scan(s, &err) != 0) {
            if (!s->repository_missing)
                pjs_warn("repository: %s; models keep serving as they are until it is back",
                         err.msg);
            s->repository_missing = true;
            return;
        }
        if (s->repository_missing) {
            pjs_info("repository: %s is readable again", s->repository);
            if (s->inotify_fd >= 0) { /* the directory may be another one now */
                inotify_rm_watch(s->inotify_fd, s->repo_wd);
                s->repo_wd = inotify_add_watch(s->inotify_fd, s->repository, REPO_EVENTS);
                if (s->repo_wd < 0)
                    stop_notifying(s, strerror(errno));
            }
        }
        s->repository_missing = false;
        s->full_scan_due = false;
        s->polls_since_full = 0;
    } else {
        scan_pending(s);
    }
    size_t kept = 0;
    for (size_t i = 0; i < s->n_bundles; i++) {
        watched_bundle *b = &s->bundles[i];
        if (b->now == b->last && b->now != b->acted && (stop == NULL || !atomic_load(stop)) &&
            act(ctx, b->name, b->acted, b->now))
            b->acted = b->now;
        /* looked at again next poll until it settled */
        b->pending = b->now != b->last || b->now != b->acted;
        b->last = b->now;
        if (b->last != 0 || b->acted != 0)
            s->bundles[kept++] = *b;
    }
    bool dropped = kept != s->n_bundles;
    s->n_bundles = kept;
    if (dropped && !reindex(s))
        s->full_scan_due = true; /* the index is stale: find_or_add and events go wrong */
}

void pjs_repo_scan_close(pjs_repo_scan *s)
{
    if (s == NULL)
        return;
    if (s->inotify_fd >= 0)
        close(s->inotify_fd);
    free(s->owners);
    free(s->index);
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
    int rc = pjs_repo_scan_open(repository, PJS_REPO_NOTIFY_AUTO, &w->scan, err);
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
    pjs_info("repository: watching %s every %llu ms (%zu bundles, %s); a change is acted on "
             "once seen on two polls in a row",
             repository, (unsigned long long)poll_ms, n,
             rc == 0 && pjs_repo_scan_notified(w->scan)
                 ? "changes notified by the kernel, all scanned every 300 polls"
                 : "every bundle scanned at each poll");
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
