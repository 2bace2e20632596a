/*
 * watcher.h - the repository watcher of --model-control-mode dynamic.
 *
 * One thread scans the repository directory every poll interval and
 * fingerprints each bundle directory from what loading reads: the name,
 * size, modification and change times and inode of manifest.yaml,
 * weights.safetensors, every model*.mlir and the hook files model.c and
 * model.so. A bundle that appeared, changed or disappeared is acted on only
 * once it was seen in the same state on two consecutive polls, so a bundle
 * still being written is not loaded half-way: a new bundle is loaded, a
 * changed one reloaded (pjs_server_load_model, on the server's load threads:
 * when the new version fails to load, the previous one keeps serving), a
 * removed one dropped from the repository (pjs_server_remove_model). A state
 * acted on, successfully or not, is not acted on again until the bundle
 * changes; one the server's load queue had no room for is tried again at
 * the next poll.
 *
 * The server starts the watcher before it loads the repository (so a bundle
 * changed during start-up is picked up) and stops it first when it drains.
 * Only the watcher's thread touches its bundle list.
 */
#ifndef PJS_SERVER_WATCHER_H
#define PJS_SERVER_WATCHER_H

#include <stdint.h>

#include "core/status.h"

typedef struct pjs_server pjs_server;
typedef struct pjs_watcher pjs_watcher;

/* Fingerprints every bundle directory of `repository` as it is now (the
 * state the server's start-up load reads) and starts the thread, which
 * scans it every poll_ms milliseconds. */
int pjs_watcher_start(pjs_server *s, const char *repository, uint64_t poll_ms,
                      pjs_watcher **out, pjs_error *err);
/* Stops the thread, waiting for a load in progress, and frees w (NULL:
 * nothing to do). */
void pjs_watcher_stop(pjs_watcher *w);

#endif
