/*
 * bundle.c - opening, validating and compiling bundles (see bundle.h).
 */
#include "registry/bundle.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/cpus.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/thread_name.h"

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The last component of path, ignoring trailing slashes; its length goes to
 * *len (it may be followed by slashes, so it is not always NUL-terminated). */
static const char *last_component(const char *path, size_t *len)
{
    const char *end = path + strlen(path);
    while (end > path + 1 && end[-1] == '/')
        end--;
    const char *p = end;
    while (p > path && p[-1] != '/')
        p--;
    *len = (size_t)(end - p);
    return p;
}

/* The file name of a path that has no trailing slash. */
static const char *file_name(const char *path)
{
    size_t len;
    return last_component(path, &len);
}

static int check_layout(pjs_bundle *b, pjs_error *err)
{
    const pjs_manifest *m = &b->manifest;
    size_t dirlen;
    const char *dirname = last_component(b->dir, &dirlen);
    if (strlen(m->name) != dirlen || strncmp(m->name, dirname, dirlen) != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "manifest.yaml: name: \"%s\" does not match the bundle directory "
                             "name \"%.*s\"",
                             m->name, (int)dirlen, dirname);
    return 0;
}

/* The file name of a variant's module for batch size n. */
static void module_file_name(const pjs_manifest *m, size_t variant, int64_t n, char *buf,
                             size_t size)
{
    if (variant == 0)
        snprintf(buf, size, "model.b%lld.mlir", (long long)n);
    else
        snprintf(buf, size, "model.%s.b%lld.mlir", m->variants[variant].name, (long long)n);
}

/* One module per (variant, batch size), variant-major; each file must exist. */
static int find_modules(pjs_bundle *b, pjs_error *err)
{
    const pjs_manifest *m = &b->manifest;
    size_t count = m->n_variants * m->n_batch_sizes;
    b->modules = calloc(count ? count : 1, sizeof *b->modules);
    if (b->modules == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    for (size_t v = 0; v < m->n_variants; v++) {
        for (size_t i = 0; i < m->n_batch_sizes; i++) {
            pjs_bundle_module *mod = pjs_bundle_module_at(b, v, i);
            char file[192];
            mod->variant = v;
            mod->stage = -1;
            mod->batch_size = m->batch_sizes[i];
            module_file_name(m, v, mod->batch_size, file, sizeof file);
            snprintf(mod->path, sizeof mod->path, "%s/%s", b->dir, file);
            if (!file_exists(mod->path)) {
                if (v == 0)
                    return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                                         "%s: missing (manifest.yaml batch_sizes lists %lld)",
                                         file, (long long)mod->batch_size);
                return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                                     "%s: missing (manifest.yaml variants[%zu] \"%s\" needs one "
                                     "module per batch size; batch_sizes lists %lld)",
                                     file, v - 1, m->variants[v].name,
                                     (long long)mod->batch_size);
            }
            b->n_modules++;
        }
    }
    return 0;
}

/* The module files of the swap-in stages, stage-major; each must exist. */
static int find_stage_modules(pjs_bundle *b, pjs_error *err)
{
    const pjs_manifest *m = &b->manifest;
    size_t count = m->n_stages * m->n_batch_sizes;
    if (count == 0)
        return 0;
    b->stage_modules = calloc(count, sizeof *b->stage_modules);
    if (b->stage_modules == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < m->n_stages; k++) {
        for (size_t i = 0; i < m->n_batch_sizes; i++) {
            pjs_bundle_module *mod = pjs_bundle_stage_module_at(b, k, i);
            char file[64];
            mod->stage = (int)k;
            mod->batch_size = m->batch_sizes[i];
            snprintf(file, sizeof file, "swap_in.s%zu.b%lld.mlir", k, (long long)mod->batch_size);
            snprintf(mod->path, sizeof mod->path, "%s/%s", b->dir, file);
            if (!file_exists(mod->path))
                return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                                     "%s: missing (manifest.yaml swap_in_stages[%zu] needs one "
                                     "module per batch size; batch_sizes lists %lld)",
                                     file, k, (long long)mod->batch_size);
            b->n_stage_modules++;
        }
    }
    return 0;
}

/* Resolves each stage's weight names and the run of weights it copies:
 * along argument_order, the stage that first uses a weight (the last stage
 * for a weight none uses) never decreases. */
static int resolve_stages(pjs_bundle *b, pjs_error *err)
{
    const pjs_manifest *m = &b->manifest;
    size_t n_w = b->weights.n_tensors;
    if (m->n_stages == 0)
        return 0;
    b->stages = calloc(m->n_stages, sizeof *b->stages);
    size_t *first_use = malloc((n_w + 1) * sizeof *first_use);
    int rc = b->stages != NULL && first_use != NULL
                 ? 0
                 : pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < n_w; i++)
        first_use[i] = m->n_stages - 1;
    for (size_t k = m->n_stages; rc == 0 && k-- > 0;) {
        const pjs_swap_in_stage *st = &m->stages[k];
        b->stages[k].weights = calloc(st->n_weights + 1, sizeof *b->stages[k].weights);
        if (b->stages[k].weights == NULL)
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
        for (size_t j = 0; rc == 0 && j < st->n_weights; j++) {
            const pjs_st_tensor *t = pjs_safetensors_find(&b->weights, st->weights[j]);
            if (t == NULL) {
                rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                   "manifest.yaml swap_in_stages[%zu].weights[%zu]: no weight "
                                   "\"%s\" in weights.safetensors",
                                   k, j, st->weights[j]);
                break;
            }
            size_t i = (size_t)(t - b->weights.tensors);
            b->stages[k].weights[j] = i;
            first_use[i] = k;
        }
    }
    size_t stage = 0;
    for (size_t i = 0; rc == 0 && i < n_w; i++) {
        if (first_use[i] < stage)
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "weights.safetensors argument_order: weight \"%s\", first used by "
                               "swap_in_stages[%zu], comes after weights of swap_in_stages[%zu]; "
                               "order the weights by the stage that first uses them",
                               b->weights.tensors[i].name, first_use[i], stage);
        for (; rc == 0 && stage < first_use[i]; stage++)
            b->stages[stage + 1].first = b->stages[stage].end = i;
        if (rc == 0)
            b->stages[stage].end = i + 1;
    }
    for (; rc == 0 && stage + 1 < m->n_stages; stage++)
        b->stages[stage + 1].first = b->stages[stage + 1].end = b->stages[stage].end;
    free(first_use);
    return rc;
}

int pjs_bundle_open(const char *dir, pjs_bundle **out, pjs_error *err)
{
    pjs_bundle *b = calloc(1, sizeof *b);
    if (b == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    int rc;
    char path[PJS_BUNDLE_PATH_MAX];
    if (strlen(dir) >= sizeof b->dir - 64) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "path too long");
        goto fail;
    }
    snprintf(b->dir, sizeof b->dir, "%s", dir);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        rc = pjs_error_set(err, PJS_ERR_NOT_FOUND, "not a directory");
        goto fail;
    }
    snprintf(path, sizeof path, "%s/manifest.yaml", dir);
    rc = pjs_manifest_load(&b->manifest, path, err);
    if (rc != 0)
        goto fail;
    rc = check_layout(b, err);
    if (rc == 0)
        rc = pjs_hooks_open(dir, &b->manifest, &b->hooks, err);
    if (rc != 0)
        goto fail;
    if (b->manifest.kind != PJS_KIND_MODEL) {
        /* A meta or an ensemble has no executable: no weights, no modules. */
        *out = b;
        return 0;
    }
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    rc = pjs_safetensors_open(&b->weights, path, err);
    if (rc != 0)
        goto fail;
    b->weight_sums = calloc(b->weights.n_tensors + 1, sizeof *b->weight_sums);
    b->summed = calloc(b->weights.n_tensors + 1, sizeof *b->summed);
    if (b->weight_sums == NULL || b->summed == NULL) {
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rc = find_modules(b, err);
    if (rc == 0)
        rc = find_stage_modules(b, err);
    if (rc == 0)
        rc = resolve_stages(b, err);
    if (rc != 0)
        goto fail;
    *out = b;
    return 0;
fail:
    pjs_error_prefix(err, "bundle %s: ", dir);
    pjs_bundle_close(b);
    return rc;
}

void pjs_bundle_close(pjs_bundle *b)
{
    if (b == NULL)
        return;
    for (size_t i = 0; i < b->n_modules; i++)
        pjs_rt_executable_destroy(b->modules[i].exec);
    free(b->modules);
    for (size_t i = 0; i < b->n_stage_modules; i++)
        pjs_rt_executable_destroy(b->stage_modules[i].exec);
    free(b->stage_modules);
    for (size_t k = 0; b->stages != NULL && k < b->manifest.n_stages; k++)
        free(b->stages[k].weights);
    free(b->stages);
    free(b->weight_sums);
    free(b->summed);
    pjs_safetensors_close(&b->weights);
    pjs_hooks_close(b->hooks);
    pjs_manifest_free(&b->manifest);
    free(b);
}

pjs_bundle_module *pjs_bundle_module_for(pjs_bundle *b, size_t variant, int64_t batch_size)
{
    const pjs_manifest *m = &b->manifest;
    if (variant >= m->n_variants)
        return NULL;
    for (size_t i = 0; i < m->n_batch_sizes; i++)
        if (m->batch_sizes[i] == batch_size)
            return pjs_bundle_module_at(b, variant, i);
    return NULL;
}

int64_t pjs_bundle_pick_batch_size(const pjs_bundle *b, int64_t n)
{
    const pjs_manifest *m = &b->manifest;
    for (size_t i = 0; i < m->n_batch_sizes; i++)
        if (m->batch_sizes[i] >= n)
            return m->batch_sizes[i];
    return m->n_batch_sizes ? m->batch_sizes[m->n_batch_sizes - 1] : 0;
}

/* The manifest's shape for a tensor at batch size n. */
static pjs_shape spec_shape(const pjs_tensor_spec *t, int64_t n)
{
    pjs_shape s = t->shape;
    if (t->batched)
        s.dims[0] = n;
    return s;
}

/* Compares one module parameter or result with what the bundle declares. */
static int check_type(const pjs_rt_tensor_type *got, pjs_dtype want_dtype, const pjs_shape *want,
                      const char *module, const char *what, const char *source, pjs_error *err)
{
    char a[128], b[128];
    if (got->dtype != want_dtype)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: %s has dtype %s but %s says %s", module, what,
                             pjs_dtype_name(got->dtype), source, pjs_dtype_name(want_dtype));
    if (!pjs_shape_equal(&got->shape, want))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: %s has shape %s but %s says %s",
                             module, what, pjs_shape_format(&got->shape, a, sizeof a), source,
                             pjs_shape_format(want, b, sizeof b));
    return 0;
}

/* "manifest.yaml inputs[0]", or for a variant's tensor
 * "manifest.yaml inputs[0] in variant \"wide\"". */
static const char *spec_source(const pjs_manifest *m, size_t variant, const char *kind, size_t i,
                               char *buf, size_t size)
{
    if (variant == 0)
        snprintf(buf, size, "manifest.yaml %s[%zu]", kind, i);
    else
        snprintf(buf, size, "manifest.yaml %s[%zu] in variant \"%s\"", kind, i,
                 m->variants[variant].name);
    return buf;
}

static int check_signature(const pjs_bundle *b, const pjs_bundle_module *mod, pjs_error *err)
{
    const pjs_manifest *m = &b->manifest;
    const pjs_variant *var = &m->variants[mod->variant];
    const pjs_rt_executable *e = mod->exec;
    const char *file = file_name(mod->path);
    size_t n_weights = b->weights.n_tensors;
    char what[512], source[512];
    if (e->n_params != n_weights + m->n_inputs)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: takes %zu parameters but the bundle provides %zu (%zu weights "
                             "in weights.safetensors argument_order + %zu inputs in manifest.yaml)",
                             file, e->n_params, n_weights + m->n_inputs, n_weights, m->n_inputs);
    if (e->n_results != m->n_outputs)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: returns %zu results but manifest.yaml declares %zu outputs", file,
                             e->n_results, m->n_outputs);
    for (size_t i = 0; i < n_weights; i++) {
        const pjs_st_tensor *t = &b->weights.tensors[i];
        snprintf(what, sizeof what, "parameter %zu (weight \"%s\")", i, t->name);
        snprintf(source, sizeof source, "weights.safetensors");
        int rc = check_type(&e->params[i], t->dtype, &t->shape, file, what, source, err);
        if (rc != 0)
            return rc;
        /* One device copy of a weight serves every module; inputs, uploaded
         * per execution, may take each module's own layout. */
        if (e->params[i].other_layout)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: %s is laid out in another order than row-major "
                                 "(mhlo.layout_mode); pjserve passes weights row-major: export "
                                 "the function without a layout for its weights",
                                 file, what);
    }
    for (size_t i = 0; i < m->n_inputs; i++) {
        const pjs_tensor_spec *t = &var->inputs[i];
        pjs_shape want = spec_shape(t, mod->batch_size);
        snprintf(what, sizeof what, "parameter %zu (input \"%s\")", n_weights + i, t->name);
        spec_source(m, mod->variant, "inputs", i, source, sizeof source);
        int rc = check_type(&e->params[n_weights + i], t->dtype, &want, file, what, source, err);
        if (rc != 0)
            return rc;
    }
    for (size_t i = 0; i < m->n_outputs; i++) {
        const pjs_tensor_spec *t = &var->outputs[i];
        pjs_shape want = spec_shape(t, mod->batch_size);
        snprintf(what, sizeof what, "result %zu (output \"%s\")", i, t->name);
        spec_source(m, mod->variant, "outputs", i, source, sizeof source);
        int rc = check_type(&e->results[i], t->dtype, &want, file, what, source, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* A list of tensors a stage module takes or returns, at batch size n. */
static int check_stage_tensors(const pjs_tensor_spec *specs, size_t n_specs,
                               const pjs_rt_tensor_type *got, size_t first, int64_t n,
                               const char *file, const char *kind, const char *source,
                               pjs_error *err)
{
    char what[512], from[512];
    for (size_t i = 0; i < n_specs; i++) {
        pjs_shape want = spec_shape(&specs[i], n);
        snprintf(what, sizeof what, "%s %zu (\"%s\")", kind, first + i, specs[i].name);
        snprintf(from, sizeof from, "%s[%zu]", source, i);
        int rc = check_type(&got[first + i], specs[i].dtype, &want, file, what, from, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Stage k takes its weights, then stage k-1's outputs (stage 0: the
 * model's inputs), and returns its outputs (the last stage: the model's). */
static int check_stage_signature(const pjs_bundle *b, const pjs_bundle_module *mod,
                                 pjs_error *err)
{
    const pjs_manifest *m = &b->manifest;
    size_t k = (size_t)mod->stage;
    const pjs_swap_in_stage *st = &m->stages[k];
    const pjs_rt_executable *e = mod->exec;
    const char *file = file_name(mod->path);
    char what[512], source[512];
    const pjs_tensor_spec *ins = k == 0 ? m->inputs : m->stages[k - 1].outputs;
    size_t n_ins = k == 0 ? m->n_inputs : m->stages[k - 1].n_outputs;
    bool last = k + 1 == m->n_stages;
    const pjs_tensor_spec *outs = last ? m->outputs : st->outputs;
    size_t n_outs = last ? m->n_outputs : st->n_outputs;
    if (e->n_params != st->n_weights + n_ins || e->n_results != n_outs)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: takes %zu parameters and returns %zu results, but "
                             "manifest.yaml swap_in_stages[%zu] says %zu weights + %zu inputs "
                             "and %zu outputs",
                             file, e->n_params, e->n_results, k, st->n_weights, n_ins, n_outs);
    for (size_t j = 0; j < st->n_weights; j++) {
        const pjs_st_tensor *t = &b->weights.tensors[b->stages[k].weights[j]];
        snprintf(what, sizeof what, "parameter %zu (weight \"%s\", swap_in_stages[%zu].weights[%zu])",
                 j, t->name, k, j);
        int rc = check_type(&e->params[j], t->dtype, &t->shape, file, what,
                            "weights.safetensors", err);
        if (rc == 0 && e->params[j].other_layout)
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "%s: %s is laid out in another order than row-major", file, what);
        if (rc != 0)
            return rc;
    }
    if (k == 0)
        snprintf(source, sizeof source, "manifest.yaml inputs");
    else
        snprintf(source, sizeof source, "manifest.yaml swap_in_stages[%zu].outputs", k - 1);
    int rc = check_stage_tensors(ins, n_ins, e->params, st->n_weights, mod->batch_size, file,
                                 "parameter", source, err);
    if (rc != 0)
        return rc;
    if (last)
        snprintf(source, sizeof source, "manifest.yaml outputs");
    else
        snprintf(source, sizeof source, "manifest.yaml swap_in_stages[%zu].outputs", k);
    return check_stage_tensors(outs, n_outs, e->results, 0, mod->batch_size, file, "result",
                               source, err);
}

int pjs_bundle_compile_module(pjs_bundle *b, pjs_bundle_module *mod, pjs_rt_client *c,
                              pjs_exec_cache *cache, pjs_error *err)
{
    if (mod->exec != NULL)
        return 0;
    pjs_mapped_file mf;
    int rc = pjs_mapped_file_open(&mf, mod->path, err);
    if (rc == 0) {
        char label[256];
        snprintf(label, sizeof label, "%s", file_name(mod->path));
        rc = pjs_rt_compile_shared(c, mf.data, mf.size, cache, label, &mod->exec, &mod->shared,
                                   err);
        pjs_mapped_file_close(&mf);
    }
    if (rc == 0) {
        rc = mod->stage < 0 ? check_signature(b, mod, err) : check_stage_signature(b, mod, err);
        if (rc != 0) {
            pjs_rt_executable_destroy(mod->exec);
            mod->exec = NULL;
        }
    }
    if (rc != 0)
        pjs_error_prefix(err, "bundle %s: ", b->manifest.name);
    return rc;
}

/* Bytes read per piece when only a checksum is wanted. */
#define SUM_PIECE ((size_t)1 << 20)

/* Records weight i's checksum, or checks it once sealed. */
static int check_sum(pjs_bundle *b, size_t i, uint64_t sum, pjs_error *err)
{
    if (!b->sealed) {
        b->weight_sums[i] = sum;
        b->summed[i] = true;
        return 0;
    }
    if (b->summed[i] && b->weight_sums[i] == sum)
        return 0;
    return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                         "%s/weights.safetensors: weight \"%s\" holds other bytes than when the "
                         "model was loaded (the file was rewritten in place)",
                         b->dir, b->weights.tensors[i].name);
}

int pjs_bundle_read_weight(pjs_bundle *b, size_t i, void *dst, pjs_error *err)
{
    const pjs_st_tensor *t = &b->weights.tensors[i];
    pjs_checksum sum;
    pjs_checksum_init(&sum);
    int rc = pjs_safetensors_read_summed(&b->weights, t, dst, &sum, err);
    if (rc == 0)
        rc = check_sum(b, i, pjs_checksum_final(&sum), err);
    if (rc == PJS_ERR_FAILED_PRECONDITION || rc == PJS_ERR_IO) {
        char detail[PJS_ERROR_MSG_MAX];
        snprintf(detail, sizeof detail, "%s", err->msg);
        rc = pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                           "weights refused: %s; reload the model (RepositoryModelLoad, or POST "
                           "/v2/repository/models/%s/load) to serve the file as it is now",
                           detail, b->manifest.name);
    } else if (rc != 0) {
        pjs_error_prefix(err, "model %s: ", b->manifest.name);
    }
    return rc;
}

/* ---- reading every weight ------------------------------------------------ */

/* Bundles of at least this many bytes of weights are read by several
 * threads: one thread copies and checks a bf16 ResNet-50's 51 MB in about
 * 30 ms on an H200's host, from a file already in memory. */
#define PARALLEL_READ_MIN_BYTES ((uint64_t)16 << 20)
#define PARALLEL_READ_THREADS_MAX 8
#define PARALLEL_READ_THREADS_AUTO 4 /* pjs_bundle_read_threads' most */

typedef struct weights_read {
    pjs_bundle *b;
    void *const *host;
    size_t *order;     /* tensor indices, largest first */
    size_t n;
    atomic_size_t next; /* the next index of order to read; n once one failed */
    pthread_mutex_t lock; /* guards rc and err */
    int rc;
    pjs_error err;
} weights_read;

static void *read_weights_worker(void *arg)
{
    weights_read *r = arg;
    for (size_t k; (k = atomic_fetch_add(&r->next, 1)) < r->n;) {
        size_t i = r->order[k];
        pjs_error err;
        if (pjs_bundle_read_weight(r->b, i, r->host[i], &err) == 0)
            continue;
        atomic_store(&r->next, r->n);
        pthread_mutex_lock(&r->lock);
        if (r->rc == 0) {
            r->rc = err.code;
            r->err = err;
        }
        pthread_mutex_unlock(&r->lock);
    }
    return NULL;
}

static int larger_first(const void *a, const void *b, void *tensors)
{
    const pjs_st_tensor *t = tensors;
    uint64_t x = t[*(const size_t *)a].nbytes, y = t[*(const size_t *)b].nbytes;
    return x < y ? 1 : x > y ? -1 : 0;
}

size_t pjs_bundle_read_threads(const pjs_bundle *b)
{
    size_t n = b->weights.n_tensors;
    if (pjs_safetensors_total_bytes(&b->weights) < PARALLEL_READ_MIN_BYTES || n < 2)
        return 1;
    size_t t = (size_t)pjs_cpus_schedulable() / 4;
    if (t > PARALLEL_READ_THREADS_AUTO)
        t = PARALLEL_READ_THREADS_AUTO;
    return t < 1 ? 1 : t > n ? n : t;
}

int pjs_bundle_read_weights(pjs_bundle *b, void *const *host, size_t threads, pjs_error *err)
{
    size_t n = b->weights.n_tensors;
    if (threads > n)
        threads = n;
    if (threads <= 1) {
        for (size_t i = 0; i < n; i++)
            if (pjs_bundle_read_weight(b, i, host[i], err) != 0)
                return err->code;
        return 0;
    }
    weights_read r = {.b = b, .host = host, .n = n};
    r.order = malloc(n * sizeof *r.order);
    if (r.order == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "bundle %s: out of memory", b->manifest.name);
    for (size_t i = 0; i < n; i++)
        r.order[i] = i;
    qsort_r(r.order, n, sizeof *r.order, larger_first, b->weights.tensors);
    atomic_init(&r.next, 0);
    pthread_mutex_init(&r.lock, NULL);
    pthread_t helpers[PARALLEL_READ_THREADS_MAX];
    if (threads > PARALLEL_READ_THREADS_MAX)
        threads = PARALLEL_READ_THREADS_MAX;
    size_t started = 0;
    for (; started + 1 < threads; started++) {
        if (pthread_create(&helpers[started], NULL, read_weights_worker, &r) != 0)
            break; /* fewer helpers: the reading still completes */
        pjs_thread_name(helpers[started], "pjs-read");
    }
    read_weights_worker(&r);
    for (size_t i = 0; i < started; i++)
        pthread_join(helpers[i], NULL);
    pthread_mutex_destroy(&r.lock);
    free(r.order);
    if (r.rc != 0)
        *err = r.err;
    return r.rc;
}

void *pjs_bundle_host_weight(pjs_bundle *b, size_t i, pjs_error *err)
{
    const pjs_st_tensor *t = &b->weights.tensors[i];
    size_t size = (size_t)t->nbytes;
    void *aligned = aligned_alloc(64, (size + 63) / 64 * 64 + 64);
    if (aligned == NULL) {
        pjs_error_set(err, PJS_ERR_NOMEM, "bundle %s: out of memory for weight \"%s\"",
                      b->manifest.name, t->name);
        return NULL;
    }
    if (pjs_bundle_read_weight(b, i, aligned, err) != 0) {
        free(aligned);
        return NULL;
    }
    return aligned;
}

int pjs_bundle_seal_weights(pjs_bundle *b, pjs_error *err)
{
    unsigned char *piece = NULL;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < b->weights.n_tensors; i++) {
        const pjs_st_tensor *t = &b->weights.tensors[i];
        if (b->summed[i])
            continue;
        if (piece == NULL && (piece = malloc(SUM_PIECE)) == NULL) {
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "bundle %s: out of memory", b->manifest.name);
            break;
        }
        pjs_checksum sum;
        pjs_checksum_init(&sum);
        for (uint64_t at = 0; rc == 0 && at < t->nbytes; at += SUM_PIECE) {
            size_t n = t->nbytes - at < SUM_PIECE ? (size_t)(t->nbytes - at) : SUM_PIECE;
            rc = pjs_safetensors_read(&b->weights, t, at, n, piece, err);
            if (rc == 0)
                pjs_checksum_update(&sum, piece, n);
        }
        if (rc == 0)
            rc = check_sum(b, i, pjs_checksum_final(&sum), err);
        else
            pjs_error_prefix(err, "bundle %s: ", b->manifest.name);
    }
    free(piece);
    if (rc == 0)
        b->sealed = true;
    return rc;
}

/* Weights in host memory: every copy in flight at once. */
static int upload_from_host(pjs_bundle *b, pjs_rt_client *c, void *const *host,
                            pjrt_buffer **out, pjs_error *err)
{
    size_t n = b->weights.n_tensors;
    pjs_rt_upload *uploads = calloc(n > 0 ? n : 1, sizeof *uploads);
    if (uploads == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "bundle %s: out of memory", b->manifest.name);
    for (size_t i = 0; i < n; i++) {
        const pjs_st_tensor *t = &b->weights.tensors[i];
        uploads[i] = (pjs_rt_upload){.dtype = t->dtype, .shape = &t->shape, .data = host[i]};
    }
    size_t failed;
    int rc = pjs_rt_buffers_from_host(c, n, uploads, out, &failed, err);
    if (rc != 0)
        pjs_error_prefix(err, "bundle %s: weight \"%s\": ", b->manifest.name,
                         b->weights.tensors[failed].name);
    free(uploads);
    return rc;
}

int pjs_bundle_upload_weights(pjs_bundle *b, pjs_rt_client *c, void *const *host,
                              pjrt_buffer **out, pjs_error *err)
{
    if (host != NULL)
        return upload_from_host(b, c, host, out, err);
    /* Read from the file one weight at a time: one weight's copy in memory. */
    size_t n = b->weights.n_tensors;
    size_t done = 0;
    int rc = 0;
    for (; done < n; done++) {
        const pjs_st_tensor *t = &b->weights.tensors[done];
        void *copy = pjs_bundle_host_weight(b, done, err);
        if (copy == NULL) {
            rc = err->code;
            break;
        }
        rc = pjs_rt_buffer_from_host(c, t->dtype, &t->shape, NULL, copy, &out[done], err);
        free(copy);
        if (rc != 0) {
            pjs_error_prefix(err, "bundle %s: weight \"%s\": ", b->manifest.name, t->name);
            break;
        }
    }
    if (rc != 0) {
        for (size_t i = 0; i < done; i++) {
            pjs_rt_buffer_destroy(c, out[i]);
            out[i] = NULL;
        }
    }
    return rc;
}
