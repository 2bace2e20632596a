/*
 * hooks.h - a bundle's model.so, loaded: its entry points and the state its
 * pjserve_init returned (the ABI is include/pjserve/model.h).
 *
 * Loading copies model.so to a private file first and opens that copy:
 * dlopen hands back the object already mapped for a path it has seen, so a
 * rebuilt model.so under the same name would otherwise never be picked up by
 * a reload. The copy is unlinked at once; the mapping keeps it alive until
 * the last model holding these hooks is freed (pjs_hooks_close, which runs
 * pjserve_fini first).
 *
 * A bundle is refused with a message that says what to do when: model.so
 * has another ABI version than PJSERVE_MODEL_ABI_VERSION (or none), model.c
 * is newer than model.so or has none beside it (run `pjserve build-hooks`),
 * a meta has no pjserve_run, a model declares client_inputs without
 * pjserve_preprocess (client_outputs without pjserve_postprocess), or the
 * other way round, or pjserve_init fails.
 *
 * The entry points are called from many request threads at once; the
 * struct is read-only after pjs_hooks_open.
 */
#ifndef PJS_REGISTRY_HOOKS_H
#define PJS_REGISTRY_HOOKS_H

#include <stdbool.h>

#define PJSERVE_HOST_SIDE
#include "pjserve/model.h"

#include "core/log.h"
#include "core/manifest.h"
#include "core/status.h"

typedef int (*pjs_hook_fn)(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                           pjserve_tensor *out, size_t n_out);

typedef struct pjs_hooks {
    void *library;            /* dlopen handle of the private copy */
    pjs_hook_fn preprocess;   /* NULL when not exported */
    pjs_hook_fn postprocess;
    pjs_hook_fn run;          /* kind meta only */
    void (*fini)(void *state);
    void *state;              /* what pjserve_init stored */
} pjs_hooks;

/* Whether the bundle in `dir` carries hooks (model.so or model.c). */
bool pjs_hooks_present(const char *dir);

/* Loads dir/model.so for the bundle whose manifest is m (checking the rules
 * above) and runs its pjserve_init. *out is NULL (and 0 is returned) when
 * the bundle has neither model.so nor model.c and needs none. Messages name
 * the file. */
int pjs_hooks_open(const char *dir, const pjs_manifest *m, pjs_hooks **out, pjs_error *err);
/* The log level of a bundle's PJSERVE_LOG_* level. */
pjs_log_level pjs_hooks_log_level(int level);

/* Runs pjserve_fini and unloads. NULL is fine. */
void pjs_hooks_close(pjs_hooks *h);

/* The API version and the entry points' names, for messages and docs. */
#define PJS_HOOKS_FILE "model.so"
#define PJS_HOOKS_SOURCE "model.c"

#endif
