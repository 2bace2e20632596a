/*
 * repo_watch.h - following a model repository directory: the fingerprints
 * of its bundles, the two-poll rule that decides a change has settled, and
 * a thread that polls. What a settled change leads to is the caller's: serve
 * loads, reloads or drops the model (server/watcher.c), a node with a
 * gateway tells every worker (cli/cmd_node.c).
 *
 * A bundle directory's fingerprint comes from what loading reads: the name,
 * size, modification and change times and inode of manifest.yaml,
 * weights.safetensors, every model*.mlir and the hook files model.c and
 * model.so; 0 stands for "absent". Each bundle keeps two fingerprints:
 * `last`, what the previous poll saw, and `acted`, the state the caller's
 * repository reflects. A poll that sees `now` asks the caller to act only
 * when now == last (unchanged for two polls, so a bundle still being written
 * is not loaded half-way) and now != acted; once the caller returns true,
 * acted = now, whatever the outcome of the action, so a bundle that failed
 * to load is tried again only once its files change again. A caller that
 * returns false (its load queue was full) is asked again at the next poll.
 *
 * The scan is opened on the repository as it is (every bundle counts as
 * acted on: the caller's start-up load reads that state) before the caller
 * loads it, so a bundle changed during start-up is picked up.
 *
 * Where the kernel notifies changes (inotify), a poll fingerprints only the
 * bundles a notification named since the last poll and those whose change
 * has not settled yet, so an idle repository of 10,000 bundles costs nothing
 * to watch; every PJS_REPO_FULL_SCAN_POLLS polls (and after a notification
 * overflow, or the repository directory itself replaced) it scans them all,
 * for the changes no notification reports (a network file system's, made
 * elsewhere). Without notification (none, or the system's watches used up:
 * logged) every poll scans them all.
 */
#ifndef PJS_REGISTRY_REPO_WATCH_H
#define PJS_REGISTRY_REPO_WATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

/* Brings the caller's repository from state `before` of bundle `name` to
 * state `now` (fingerprints; 0: absent); false to be asked again at the
 * next poll. */
typedef bool (*pjs_repo_act_fn)(void *ctx, const char *name, uint64_t before, uint64_t now);

/* ---- the scan: one thread's, no thread of its own ---------------------------- */

typedef struct pjs_repo_scan pjs_repo_scan;

typedef enum pjs_repo_notify {
    PJS_REPO_NOTIFY_AUTO = 0, /* the kernel's change notification where it has one */
    PJS_REPO_NOTIFY_NONE = 1, /* scan every bundle at every poll */
} pjs_repo_notify;

/* Polls between two scans of every bundle while notifications arrive. */
#define PJS_REPO_FULL_SCAN_POLLS 300

/* Fingerprints every bundle directory of `repository` as it is now, each
 * counted as acted on. NOT_FOUND when the directory cannot be read. */
int pjs_repo_scan_open(const char *repository, pjs_repo_notify notify, pjs_repo_scan **out,
                       pjs_error *err);
/* The bundles fingerprinted at the last scan. */
size_t pjs_repo_scan_count(const pjs_repo_scan *s);
/* Whether changes are notified (false: every poll scans every bundle). */
bool pjs_repo_scan_notified(const pjs_repo_scan *s);
/* Bundle fingerprints taken so far (what a poll costs). */
uint64_t pjs_repo_scan_fingerprints(const pjs_repo_scan *s);
/* Scans once and calls act for every change that settled, in the order
 * readdir listed the bundles; none once *stop (NULL: never) is set. A
 * repository that cannot be read is warned about once (models keep serving
 * as they are) and is no change. */
void pjs_repo_scan_poll(pjs_repo_scan *s, pjs_repo_act_fn act, void *ctx,
                        const atomic_bool *stop);
void pjs_repo_scan_close(pjs_repo_scan *s);

/* ---- the watcher: a scan polled by a thread of its own ----------------------- */

typedef struct pjs_repo_watch pjs_repo_watch;

/* Opens the scan (pjs_repo_scan_open) and starts the thread, which polls it
 * every poll_ms milliseconds and calls act from that thread; logs what it
 * watches. */
int pjs_repo_watch_start(const char *repository, uint64_t poll_ms, pjs_repo_act_fn act,
                         void *ctx, pjs_repo_watch **out, pjs_error *err);
/* Stops the thread, waiting for an action in progress, and frees w (NULL:
 * nothing to do). No action starts once this is called. */
void pjs_repo_watch_stop(pjs_repo_watch *w);

#endif
