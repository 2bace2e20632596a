/*
 * watcher.c - the repository watcher of serve: what a settled change of a
 * bundle asks of the server (watcher.h). The scan, its fingerprints and the
 * two-poll rule are registry/repo_watch.c, shared with `pjserve node`.
 */
#include "server/watcher.h"

#include <stdbool.h>

#include "core/log.h"
#include "registry/repo_watch.h"
#include "server/server.h"

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
static bool act(void *ctx, const char *name, uint64_t before, uint64_t now)
{
    pjs_server *server = ctx;
    pjs_error err;
    if (now == 0) {
        pjs_info("repository: model %s removed, dropping it", name);
        if (pjs_server_remove_model(server, name, &err) != 0 && err.code != PJS_ERR_NOT_FOUND)
            pjs_warn("repository: model %s not removed: %s", name, err.msg);
        return true;
    }
    pjs_info("repository: model %s %s", name, before == 0 ? "added, loading" : "changed, reloading");
    if (pjs_server_load_model(server, name, &err) == 0)
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
                 serving(server, name) ? "the previous version keeps serving"
                                          : "no version of it is serving",
                 err.msg);
    return true;
}

int pjs_watcher_start(pjs_server *s, const char *repository, uint64_t poll_ms,
                      pjs_watcher **out, pjs_error *err)
{
    return pjs_repo_watch_start(repository, poll_ms, act, s, out, err);
}

void pjs_watcher_stop(pjs_watcher *w)
{
    pjs_repo_watch_stop(w);
}
