/*
 * hooks.c - loading a bundle's model.so (see hooks.h).
 *
 * pjserve_init runs with a load-time context: it may set an error, log, and
 * read the bundle directory and model name; request services (memory that
 * lives until a response is sent, scratch, sub-calls, responses) answer
 * PJSERVE_UNSUPPORTED there.
 */
#include "registry/hooks.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"

pjs_log_level pjs_hooks_log_level(int level)
{
    return level <= PJSERVE_LOG_ERROR  ? PJS_LOG_ERROR
           : level == PJSERVE_LOG_WARN ? PJS_LOG_WARN
           : level == PJSERVE_LOG_INFO ? PJS_LOG_INFO
                                       : PJS_LOG_DEBUG;
}

/* ---- the context pjserve_init runs with --------------------------------- */

typedef struct load_ctx {
    pjserve_ctx base; /* first: hooks see a pjserve_ctx */
    const char *dir;
    const char *model;
    char message[1024];
} load_ctx;

static load_ctx *as_load(pjserve_ctx *c) { return (load_ctx *)c; }

static void *load_alloc(pjserve_ctx *c, size_t n)
{
    (void)n;
    snprintf(as_load(c)->message, sizeof as_load(c)->message,
             "pjserve_alloc is for requests; pjserve_init allocates with malloc and frees in "
             "pjserve_fini");
    return NULL;
}

static void load_set_error(pjserve_ctx *c, const char *msg)
{
    snprintf(as_load(c)->message, sizeof as_load(c)->message, "%s", msg);
}

static void load_log(pjserve_ctx *c, int level, const char *msg)
{
    pjs_log(pjs_hooks_log_level(level), "model %s: %s", as_load(c)->model, msg);
}

static void *load_state(pjserve_ctx *c)
{
    (void)c;
    return NULL;
}

static const char *load_dir(pjserve_ctx *c) { return as_load(c)->dir; }
static const char *load_model(pjserve_ctx *c) { return as_load(c)->model; }
static const char *load_request_id(pjserve_ctx *c)
{
    (void)c;
    return "";
}
static int64_t load_remaining(pjserve_ctx *c)
{
    (void)c;
    return INT64_MAX;
}

static int load_unsupported(pjserve_ctx *c, const char *what)
{
    snprintf(as_load(c)->message, sizeof as_load(c)->message,
             "%s is only available while serving a request, not in pjserve_init", what);
    return PJSERVE_UNSUPPORTED;
}

static int load_scratch(pjserve_ctx *c, const size_t *sizes, size_t n, void **out)
{
    (void)sizes, (void)n, (void)out;
    return load_unsupported(c, "pjserve_scratch");
}

static int load_call_start(pjserve_ctx *c, const char *model, const pjserve_tensor *in, size_t n,
                           pjserve_subcall **out)
{
    (void)model, (void)in, (void)n, (void)out;
    return load_unsupported(c, "pjserve_call_start");
}

static int load_call_wait(pjserve_ctx *c, pjserve_subcall *call, const pjserve_tensor **out,
                          size_t *n)
{
    (void)call, (void)out, (void)n;
    return load_unsupported(c, "pjserve_call_wait");
}

static int load_respond(pjserve_ctx *c, const pjserve_tensor *out, size_t n, bool final)
{
    (void)out, (void)n, (void)final;
    return load_unsupported(c, "pjserve_respond");
}

/* A load has no client to lose and no deadline. */
static bool load_cancelled(pjserve_ctx *c)
{
    (void)c;
    return false;
}

static const pjserve_api load_api = {
    .abi_version = PJSERVE_MODEL_ABI_VERSION,
    .size = sizeof(pjserve_api),
    .alloc = load_alloc,
    .set_error = load_set_error,
    .log = load_log,
    .state = load_state,
    .bundle_dir = load_dir,
    .model_name = load_model,
    .request_id = load_request_id,
    .remaining_ns = load_remaining,
    .scratch = load_scratch,
    .call_start = load_call_start,
    .call_wait = load_call_wait,
    .respond = load_respond,
    .cancelled = load_cancelled,
};

/* ---- files ------------------------------------------------------------- */

static bool stat_file(const char *dir, const char *name, struct stat *st)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, st) == 0 && S_ISREG(st->st_mode);
}

bool pjs_hooks_present(const char *dir)
{
    struct stat st;
    return stat_file(dir, PJS_HOOKS_FILE, &st) || stat_file(dir, PJS_HOOKS_SOURCE, &st);
}

static bool newer(const struct stat *a, const struct stat *b)
{
    return a->st_mtim.tv_sec > b->st_mtim.tv_sec ||
           (a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec > b->st_mtim.tv_nsec);
}

/* Copies dir/model.so to a fresh private file and opens that. */
static void *open_private_copy(const char *dir, pjs_error *err)
{
    char src[4200], copy[4200];
    snprintf(src, sizeof src, "%s/%s", dir, PJS_HOOKS_FILE);
    const char *tmp = getenv("TMPDIR");
    snprintf(copy, sizeof copy, "%s/pjserve-hooks-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    int out = mkstemp(copy);
    if (out < 0) {
        pjs_error_set(err, PJS_ERR_IO, "%s: cannot make a private copy in %s: %s", PJS_HOOKS_FILE,
                      copy, strerror(errno));
        return NULL;
    }
    int in = open(src, O_RDONLY | O_CLOEXEC);
    bool ok = in >= 0;
    char buf[65536];
    ssize_t n = 0;
    while (ok && (n = read(in, buf, sizeof buf)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        ok = n > 0 && write(out, buf, (size_t)n) == n;
    }
    int e = errno;
    if (in >= 0)
        close(in);
    ok = close(out) == 0 && ok;
    void *lib = NULL;
    if (!ok)
        pjs_error_set(err, PJS_ERR_IO, "%s: cannot copy it to %s: %s", PJS_HOOKS_FILE, copy,
                      strerror(e));
    else if ((lib = dlopen(copy, RTLD_NOW | RTLD_LOCAL)) == NULL)
        pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: cannot load it: %s", PJS_HOOKS_FILE,
                      dlerror());
    unlink(copy);
    return lib;
}

/* ---- rules ------------------------------------------------------------- */

static int check_abi(void *lib, pjs_error *err)
{
    const uint32_t *version = dlsym(lib, "pjserve_model_abi_version");
    if (version == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: no pjserve_model_abi_version symbol: build it from C that "
                             "includes <pjserve/model.h> (pjserve build-hooks does), which "
                             "defines it; this server wants ABI version %u",
                             PJS_HOOKS_FILE, PJSERVE_MODEL_ABI_VERSION);
    if (*version != PJSERVE_MODEL_ABI_VERSION)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: built for bundle ABI version %u, this server wants version %u: "
                             "rebuild it against this server's pjserve/model.h "
                             "(pjserve build-hooks BUNDLE)",
                             PJS_HOOKS_FILE, *version, PJSERVE_MODEL_ABI_VERSION);
    return 0;
}

/* Declared client tensors and hooks come in pairs. */
static int check_entry_points(const pjs_hooks *h, const pjs_manifest *m, pjs_error *err)
{
    if (m->kind == PJS_KIND_META) {
        if (h->run == NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: a meta model's model.so must export pjserve_run",
                                 PJS_HOOKS_FILE);
        if (h->preprocess != NULL || h->postprocess != NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: a meta model has no pre/post hooks (its pjserve_run does "
                                 "all the work); remove pjserve_preprocess / pjserve_postprocess",
                                 PJS_HOOKS_FILE);
        return 0;
    }
    if (h->run != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: exports pjserve_run, which only kind: meta bundles have",
                             PJS_HOOKS_FILE);
    struct {
        bool declared, exported;
        const char *key, *fn;
    } pairs[] = {
        {m->client_inputs != NULL, h->preprocess != NULL, "client_inputs", "pjserve_preprocess"},
        {m->client_outputs != NULL, h->postprocess != NULL, "client_outputs",
         "pjserve_postprocess"},
    };
    for (size_t i = 0; i < 2; i++) {
        if (pairs[i].declared && !pairs[i].exported)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "manifest.yaml declares %s but %s does not export %s, which "
                                 "would produce them",
                                 pairs[i].key, PJS_HOOKS_FILE, pairs[i].fn);
        if (!pairs[i].declared && pairs[i].exported)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s exports %s but manifest.yaml declares no %s: declare what "
                                 "clients send and get there",
                                 PJS_HOOKS_FILE, pairs[i].fn, pairs[i].key);
    }
    if (h->preprocess == NULL && h->postprocess == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s exports neither pjserve_preprocess nor pjserve_postprocess",
                             PJS_HOOKS_FILE);
    return 0;
}

static int check_files(const char *dir, const pjs_manifest *m, bool *has_so, pjs_error *err)
{
    struct stat so, src;
    *has_so = stat_file(dir, PJS_HOOKS_FILE, &so);
    bool has_src = stat_file(dir, PJS_HOOKS_SOURCE, &src);
    if (m->kind == PJS_KIND_ENSEMBLE && (*has_so || has_src))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "a kind: ensemble bundle runs no C code (its steps are the "
                             "manifest's ensemble.steps): remove %s, or make it kind: meta",
                             *has_so ? PJS_HOOKS_FILE : PJS_HOOKS_SOURCE);
    if (has_src && !*has_so)
        return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                             "%s has no %s beside it: run `pjserve build-hooks %s`",
                             PJS_HOOKS_SOURCE, PJS_HOOKS_FILE, dir);
    if (has_src && newer(&src, &so))
        return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                             "%s is newer than %s: rebuild it with `pjserve build-hooks %s`",
                             PJS_HOOKS_SOURCE, PJS_HOOKS_FILE, dir);
    if (!*has_so && m->kind == PJS_KIND_META)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "a kind: meta bundle needs %s (its pjserve_run): write %s and run "
                             "`pjserve build-hooks %s`",
                             PJS_HOOKS_FILE, PJS_HOOKS_SOURCE, dir);
    if (!*has_so && m->kind == PJS_KIND_MODEL &&
        (m->client_inputs != NULL || m->client_outputs != NULL))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "manifest.yaml declares %s, which only hooks in %s can produce",
                             m->client_inputs != NULL ? "client_inputs" : "client_outputs",
                             PJS_HOOKS_FILE);
    return 0;
}

/* ---- public ------------------------------------------------------------ */

int pjs_hooks_open(const char *dir, const pjs_manifest *m, pjs_hooks **out, pjs_error *err)
{
    *out = NULL;
    bool has_so = false;
    int rc = check_files(dir, m, &has_so, err);
    if (rc != 0 || !has_so)
        return rc;
    pjs_hooks *h = calloc(1, sizeof *h);
    if (h == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    if ((h->library = open_private_copy(dir, err)) == NULL) {
        free(h);
        return err->code;
    }
    if ((rc = check_abi(h->library, err)) != 0)
        goto fail;
    /* dlsym returns void *; POSIX guarantees it converts to a function pointer. */
    *(void **)&h->preprocess = dlsym(h->library, "pjserve_preprocess");
    *(void **)&h->postprocess = dlsym(h->library, "pjserve_postprocess");
    *(void **)&h->run = dlsym(h->library, "pjserve_run");
    *(void **)&h->fini = dlsym(h->library, "pjserve_fini");
    if ((rc = check_entry_points(h, m, err)) != 0)
        goto fail;
    int (*init)(pjserve_ctx *, void **);
    *(void **)&init = dlsym(h->library, "pjserve_init");
    if (init != NULL) {
        load_ctx ctx = {.base = {&load_api}, .dir = dir, .model = m->name};
        int status = init(&ctx.base, &h->state);
        if (status != PJSERVE_OK) {
            h->fini = NULL; /* nothing to finish: init failed */
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: pjserve_init failed (%d): %s",
                               PJS_HOOKS_FILE, status,
                               ctx.message[0] ? ctx.message : "it set no message");
            goto fail;
        }
    }
    *out = h;
    return 0;
fail:
    pjs_hooks_close(h);
    return rc;
}

void pjs_hooks_close(pjs_hooks *h)
{
    if (h == NULL)
        return;
    if (h->fini != NULL)
        h->fini(h->state);
    if (h->library != NULL)
        dlclose(h->library);
    free(h);
}
