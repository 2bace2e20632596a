/*
 * watcher.h - the repository watcher of --model-control-mode dynamic.
 *
 * A registry/repo_watch.h watcher over the server's repository: a bundle
 * that appeared, changed or disappeared, once seen in the same state on two
 * consecutive polls, is loaded, reloaded (pjs_server_load_model, on the
 * server's load threads: when the new version fails to load, the previous
 * one keeps serving) or dropped from the repository
 * (pjs_server_remove_model). A state acted on, successfully or not, is not
 * acted on again until the bundle changes; one the server's load queue had
 * no room for is tried again at the next poll.
 *
 * The server starts the watcher before it loads the repository (so a bundle
 * changed during start-up is picked up) and stops it first when it drains.
 */
#ifndef PJS_SERVER_WATCHER_H
#define PJS_SERVER_WATCHER_H

#include <stdint.h>

#include "core/status.h"
#include "registry/repo_watch.h"

typedef struct pjs_server pjs_server;
typedef pjs_repo_watch pjs_watcher;

/* Fingerprints every bundle directory of `repository` as it is now (the
 * state the server's start-up load reads) and starts the thread, which
 * scans it every poll_ms milliseconds. */
int pjs_watcher_start(pjs_server *s, const char *repository, uint64_t poll_ms,
                      pjs_watcher **out, pjs_error *err);
/* Stops the thread, waiting for a load in progress, and frees w (NULL:
 * nothing to do). */
void pjs_watcher_stop(pjs_watcher *w);

#endif
