/*
 * manifest.c - parse and validate a bundle's manifest.yaml (see manifest.h and
 * docs/bundle-format.md for the schema).
 *
 * The YAML itself is read by yaml_strict (core/yaml_strict.h), which refuses
 * anchors, aliases, tags, several documents and deep nesting, reports syntax
 * errors with their line, and gives the typed getters and key tables that
 * this file's schema walk is made of. What is the manifest's own lives here:
 * the top-level keys and the two kinds, format_version, dtypes, shapes with
 * their `batch` axis, batch_sizes, meta calls, an ensemble's steps and
 * the checks of its tensor graph, residency, the variants section, and the
 * labels files of classification outputs (named by the
 * parse, read by pjs_manifest_load from beside the manifest). Every mapping
 * is read through a table of the keys allowed there, so the walk never
 * descends further than the schema goes.
 *
 * Results are built into a local pjs_manifest and moved to the caller's only
 * on success; every failure frees what was built (pjs_manifest_free handles a
 * partially filled struct). Every validation error is
 * PJS_ERR_INVALID_ARGUMENT with "label: field.path: what is wrong (line N)".
 * No global state: any thread may parse its own manifest.
 */
#include "core/manifest.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/classify.h"
#include "core/mapped_file.h"
#include "core/yaml_strict.h"

#define SUPPORTED_VERSION "2.0"
#define BATCH_SIZE_MAX 65536

/* ---- tensors -------------------------------------------------------------- */

static void dtype_choices(char *buf, size_t size)
{
    size_t o = 0;
    for (int t = PJS_DTYPE_INVALID + 1; t < PJS_DTYPE_COUNT && o < size; t++) {
        int w = snprintf(buf + o, size - o, "%s%s", o ? ", " : "", pjs_dtype_name((pjs_dtype)t));
        o += w > 0 ? (size_t)w : 0;
    }
}

/* `client`: a client_inputs / client_outputs tensor, which may be bytes. */
static int parse_dtype(pjs_yaml *y, yaml_node_t *n, const char *path, bool client,
                       pjs_dtype *out)
{
    int rc = pjs_yaml_get_string(y, n, path);
    if (rc != 0)
        return rc;
    pjs_dtype t = pjs_dtype_parse((const char *)n->data.scalar.value, n->data.scalar.length);
    if (t == PJS_DTYPE_INVALID) {
        char q[PJS_YAML_QUOTE_MAX], choices[256];
        dtype_choices(choices, sizeof choices);
        return pjs_yaml_fail(y, n, path,
                             "unknown dtype %s (expected one of %s, or a KServe name such as FP32)",
                             pjs_yaml_quote_node(n, q, sizeof q), choices);
    }
    if (t == PJS_DTYPE_BYTES && !client)
        return pjs_yaml_fail(y, n, path,
                             "bytes (strings) only in client_inputs and client_outputs: no "
                             "executable takes or returns strings; declare the string tensors "
                             "there and convert them in the bundle's hooks");
    *out = t;
    return 0;
}

/* `client`: extents may be -1 (any extent is accepted there). */
static int parse_shape(pjs_yaml *y, yaml_node_t *n, const char *path, bool client,
                       pjs_tensor_spec *t)
{
    size_t rank = 0;
    int rc = pjs_yaml_get_list(y, n, path, false, &rank);
    if (rc != 0)
        return rc;
    if (rank > PJS_MAX_RANK)
        return pjs_yaml_fail(y, n, path, "rank %zu exceeds the maximum of %d", rank, PJS_MAX_RANK);
    t->shape.rank = (int)rank;
    for (size_t i = 0; i < rank; i++) {
        yaml_node_t *d = pjs_yaml_list_item(y, n, i);
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_path_index(sub, path, i);
        if (pjs_yaml_is_plain(d) && pjs_yaml_scalar_is(d, "batch")) {
            if (i != 0)
                return pjs_yaml_fail(y, d, sub, "\"batch\" is only allowed as the first dimension");
            t->batched = true;
            t->shape.dims[0] = -1;
            continue;
        }
        int64_t v = 0;
        if ((rc = pjs_yaml_get_int(y, d, sub, &v)) != 0)
            return rc;
        if (v < 0 && !(client && v == -1))
            return pjs_yaml_fail(y, d, sub, "must be non-negative%s, got %lld",
                                 client ? " or -1 (any extent)" : "", (long long)v);
        t->shape.dims[i] = v;
    }
    /* The fixed extents must not overflow on their own (batch and varying
     * extents counted as 1). */
    pjs_shape fixed = t->shape;
    for (int d = 0; d < fixed.rank; d++)
        if (fixed.dims[d] < 0)
            fixed.dims[d] = 1;
    int64_t numel = 0;
    if (!pjs_shape_numel(&fixed, &numel))
        return pjs_yaml_fail(y, n, path, "element count overflows");
    return 0;
}

const char *pjs_tensor_format_name(pjs_tensor_format f)
{
    switch (f) {
    case PJS_FORMAT_NHWC: return "FORMAT_NHWC";
    case PJS_FORMAT_NCHW: return "FORMAT_NCHW";
    default: return "FORMAT_NONE";
    }
}

/* An input's `format`: NHWC or NCHW, on a tensor with three extents besides
 * the batch axis (the image clients read C, H and W from them). */
static int parse_format(pjs_yaml *y, yaml_node_t *n, const char *path, pjs_tensor_spec *t)
{
    int rc = pjs_yaml_get_string(y, n, path);
    if (rc != 0)
        return rc;
    char q[PJS_YAML_QUOTE_MAX];
    if (pjs_yaml_scalar_is(n, "NHWC"))
        t->format = PJS_FORMAT_NHWC;
    else if (pjs_yaml_scalar_is(n, "NCHW"))
        t->format = PJS_FORMAT_NCHW;
    else
        return pjs_yaml_fail(y, n, path, "unknown format %s (expected NHWC or NCHW)",
                             pjs_yaml_quote_node(n, q, sizeof q));
    int image_rank = t->batched ? 4 : 3;
    if (t->shape.rank != image_rank)
        return pjs_yaml_fail(y, n, path,
                             "an image format needs three extents besides the batch axis "
                             "(H, W, C or C, H, W); this tensor has %d",
                             t->shape.rank - (t->batched ? 1 : 0));
    return 0;
}

/* An output's `labels`: the name of a file in the bundle directory (the
 * rule of names, so it cannot leave the directory); read at load. */
static int parse_labels(pjs_yaml *y, yaml_node_t *n, const char *path, pjs_tensor_spec *t)
{
    if ((t->labels = calloc(1, sizeof *t->labels)) == NULL)
        return pjs_yaml_fail_nomem(y, path);
    return pjs_yaml_get_name(y, n, path, &t->labels->file);
}

/* Inputs may have a `format`, outputs `labels`; the fourth field is that. */
static int parse_tensor(pjs_yaml *y, yaml_node_t *n, const char *path, bool input, bool client,
                        pjs_tensor_spec *t)
{
    pjs_yaml_field f[] = {{"name", NULL}, {"dtype", NULL}, {"shape", NULL},
                          {input ? "format" : "labels", NULL}};
    char sub[PJS_YAML_PATH_MAX];
    int rc = pjs_yaml_get_fields(y, n, path, f, 4);
    for (size_t i = 0; rc == 0 && i < 3; i++)
        rc = pjs_yaml_require(y, &f[i], path, n);
    if (rc != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "name");
    if ((rc = pjs_yaml_get_name(y, f[0].value, sub, &t->name)) != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "dtype");
    if ((rc = parse_dtype(y, f[1].value, sub, client, &t->dtype)) != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "shape");
    if ((rc = parse_shape(y, f[2].value, sub, client, t)) != 0 || f[3].value == NULL)
        return rc;
    pjs_yaml_path_key(sub, path, f[3].key);
    if (input)
        return parse_format(y, f[3].value, sub, t);
    if (!pjs_classify_supported(t->dtype))
        return pjs_yaml_fail(y, f[3].value, sub,
                             "only a numeric output has classes to label; this one is %s",
                             pjs_dtype_name(t->dtype));
    return parse_labels(y, f[3].value, sub, t);
}

/* A non-empty list of tensors with unique names; `path` says which list
 * ("client_..." lists may hold bytes and -1 extents). *out and *out_n are
 * set as soon as the array exists, so the caller frees it on any failure. */
static int parse_tensors(pjs_yaml *y, yaml_node_t *n, const char *path, bool inputs,
                         pjs_tensor_spec **out, size_t *out_n)
{
    size_t count = 0;
    int rc = pjs_yaml_get_list(y, n, path, true, &count);
    if (rc != 0)
        return rc;
    pjs_tensor_spec *v = calloc(count, sizeof *v);
    if (v == NULL)
        return pjs_yaml_fail_nomem(y, path);
    *out = v;
    *out_n = count;
    for (size_t i = 0; i < count; i++) {
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_path_index(sub, path, i);
        if ((rc = parse_tensor(y, pjs_yaml_list_item(y, n, i), sub, inputs,
                               strncmp(path, "client_", 7) == 0, &v[i])) != 0)
            return rc;
    }
    const char **names = malloc(count * sizeof *names);
    if (names == NULL)
        return pjs_yaml_fail_nomem(y, path);
    for (size_t i = 0; i < count; i++)
        names[i] = v[i].name;
    rc = pjs_yaml_check_unique(y, n, path, names, count, ".name");
    free(names);
    return rc;
}

/* ---- top-level fields ------------------------------------------------------ */

static int parse_version(pjs_yaml *y, yaml_node_t *n)
{
    /* "2.0" quoted, or the plain 2.0 that YAML would read as a float. */
    if (n->type == YAML_SCALAR_NODE && pjs_yaml_scalar_is(n, SUPPORTED_VERSION))
        return 0;
    char q[PJS_YAML_QUOTE_MAX];
    return pjs_yaml_fail(
        y, n, "format_version", "unsupported version %s (this server reads \"%s\")",
        n->type == YAML_SCALAR_NODE ? pjs_yaml_quote_node(n, q, sizeof q) : pjs_yaml_kind_name(n),
        SUPPORTED_VERSION);
}

static int parse_kind(pjs_yaml *y, yaml_node_t *n, pjs_model_kind *out)
{
    int rc = pjs_yaml_get_string(y, n, "kind");
    if (rc != 0)
        return rc;
    if (pjs_yaml_scalar_is(n, "model"))
        *out = PJS_KIND_MODEL;
    else if (pjs_yaml_scalar_is(n, "meta"))
        *out = PJS_KIND_META;
    else if (pjs_yaml_scalar_is(n, "ensemble"))
        *out = PJS_KIND_ENSEMBLE;
    else {
        char q[PJS_YAML_QUOTE_MAX];
        return pjs_yaml_fail(y, n, "kind", "unknown kind %s (expected model, meta or ensemble)",
                             pjs_yaml_quote_node(n, q, sizeof q));
    }
    return 0;
}

static int parse_residency(pjs_yaml *y, yaml_node_t *n, pjs_residency *out)
{
    int rc = pjs_yaml_get_string(y, n, "residency");
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < PJS_N_RESIDENCIES; i++) {
        if (pjs_yaml_scalar_is(n, pjs_residencies[i].name)) {
            *out = pjs_residencies[i].residency;
            return 0;
        }
    }
    char q[PJS_YAML_QUOTE_MAX];
    return pjs_yaml_fail(y, n, "residency", "unknown residency %s (expected %s)",
                         pjs_yaml_quote_node(n, q, sizeof q), pjs_residency_choices());
}

static int parse_batch_sizes(pjs_yaml *y, yaml_node_t *n, pjs_manifest *m)
{
    size_t count = 0;
    int rc = pjs_yaml_get_list(y, n, "batch_sizes", true, &count);
    if (rc != 0)
        return rc;
    m->batch_sizes = calloc(count, sizeof *m->batch_sizes);
    if (m->batch_sizes == NULL)
        return pjs_yaml_fail_nomem(y, "batch_sizes");
    m->n_batch_sizes = count;
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *item = pjs_yaml_list_item(y, n, i);
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_path_index(sub, "batch_sizes", i);
        int64_t v = 0;
        if ((rc = pjs_yaml_get_int(y, item, sub, &v)) != 0)
            return rc;
        if (v < 1 || v > BATCH_SIZE_MAX)
            return pjs_yaml_fail(y, item, sub, "must be in 1..%d, got %lld", BATCH_SIZE_MAX,
                                 (long long)v);
        if (i > 0 && v <= m->batch_sizes[i - 1])
            return pjs_yaml_fail(y, item, "batch_sizes",
                                 "must be strictly ascending (%lld after %lld)", (long long)v,
                                 (long long)m->batch_sizes[i - 1]);
        m->batch_sizes[i] = v;
    }
    return 0;
}

static int parse_meta(pjs_yaml *y, yaml_node_t *n, pjs_manifest *m)
{
    pjs_yaml_field f[] = {{"calls", NULL}};
    int rc = pjs_yaml_get_fields(y, n, "meta", f, 1);
    if (rc == 0)
        rc = pjs_yaml_require(y, &f[0], "meta", n);
    size_t count = 0;
    if (rc == 0)
        rc = pjs_yaml_get_list(y, f[0].value, "meta.calls", false, &count);
    if (rc != 0 || count == 0)
        return rc;
    m->calls = calloc(count, sizeof *m->calls);
    if (m->calls == NULL)
        return pjs_yaml_fail_nomem(y, "meta.calls");
    m->n_calls = count;
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *item = pjs_yaml_list_item(y, f[0].value, i);
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_path_index(sub, "meta.calls", i);
        if ((rc = pjs_yaml_get_name(y, item, sub, &m->calls[i])) != 0)
            return rc;
        if (strcmp(m->calls[i], m->name) == 0)
            return pjs_yaml_fail(y, item, sub, "a model cannot call itself");
    }
    return pjs_yaml_check_unique(y, f[0].value, "meta.calls", (const char **)m->calls, count, "");
}

/* ---- swap-in stages ------------------------------------------------------- */

/* One entry of `swap_in_stages` at `path`; `last` has no outputs. */
static int parse_stage(pjs_yaml *y, yaml_node_t *n, const char *path, bool last,
                       pjs_swap_in_stage *st)
{
    pjs_yaml_field f[] = {{"weights", NULL}, {"outputs", NULL}};
    char sub[PJS_YAML_PATH_MAX], item_path[PJS_YAML_PATH_MAX];
    int rc = pjs_yaml_get_fields(y, n, path, f, 2);
    if (rc == 0)
        rc = pjs_yaml_require(y, &f[0], path, n);
    if (rc != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "outputs");
    if (last && f[1].value != NULL)
        return pjs_yaml_fail(y, f[1].value, sub,
                             "the last stage returns the model's outputs and declares none");
    if (!last && f[1].value == NULL)
        return pjs_yaml_fail(y, n, path, "missing \"outputs\": what this stage passes to the "
                                         "next");
    if (!last && (rc = parse_tensors(y, f[1].value, sub, false, &st->outputs,
                                     &st->n_outputs)) != 0)
        return rc;
    for (size_t i = 0; i < st->n_outputs; i++)
        if (st->outputs[i].labels != NULL) {
            pjs_yaml_path_index(item_path, sub, i);
            return pjs_yaml_fail(y, n, item_path, "a stage's outputs have no labels");
        }
    size_t count = 0;
    pjs_yaml_path_key(sub, path, "weights");
    if ((rc = pjs_yaml_get_list(y, f[0].value, sub, false, &count)) != 0 || count == 0)
        return rc;
    if ((st->weights = calloc(count, sizeof *st->weights)) == NULL)
        return pjs_yaml_fail_nomem(y, sub);
    st->n_weights = count;
    for (size_t i = 0; i < count; i++) {
        pjs_yaml_path_index(item_path, sub, i);
        yaml_node_t *item = pjs_yaml_list_item(y, f[0].value, i);
        if ((rc = pjs_yaml_get_string(y, item, item_path)) != 0 ||
            (rc = pjs_yaml_dup_string(y, item, item_path, &st->weights[i])) != 0)
            return rc;
    }
    return pjs_yaml_check_unique(y, f[0].value, sub, (const char **)st->weights, count, "");
}

static int parse_swap_in_stages(pjs_yaml *y, yaml_node_t *n, yaml_node_t *variants,
                                pjs_manifest *m)
{
    size_t count = 0;
    int rc = pjs_yaml_get_list(y, n, "swap_in_stages", true, &count);
    if (rc != 0)
        return rc;
    if (variants != NULL)
        return pjs_yaml_fail(y, n, "swap_in_stages", "not allowed together with variants");
    if (count < 2 || count > PJS_MANIFEST_MAX_STAGES)
        return pjs_yaml_fail(y, n, "swap_in_stages", "a model has 2 to %d stages, not %zu",
                             PJS_MANIFEST_MAX_STAGES, count);
    if ((m->stages = calloc(count, sizeof *m->stages)) == NULL)
        return pjs_yaml_fail_nomem(y, "swap_in_stages");
    m->n_stages = count;
    for (size_t k = 0; k < count; k++) {
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_path_index(sub, "swap_in_stages", k);
        if ((rc = parse_stage(y, pjs_yaml_list_item(y, n, k), sub, k + 1 == count,
                              &m->stages[k])) != 0)
            return rc;
    }
    return 0;
}

/* ---- variants ------------------------------------------------------------ */

#define DEFAULT_VARIANT "default"

/* A tensor's name and its index among the top-level tensors. */
struct tensor_name {
    const char *name;
    size_t index;
};

static int cmp_tensor_name(const void *a, const void *b)
{
    const struct tensor_name *x = a, *y = b;
    return strcmp(x->name, y->name);
}

/* The top-level tensors of one kind ("inputs" or "outputs"), with their
 * names sorted so that variant keys are looked up in log time (a hostile
 * manifest may have many tensors and many keys). Names are unique
 * (parse_tensors checked them). */
struct tensor_table {
    const char *kind;
    const pjs_tensor_spec *specs;
    size_t n;
    struct tensor_name *sorted;
};

static int table_init(pjs_yaml *y, struct tensor_table *t, const char *kind,
                      const pjs_tensor_spec *specs, size_t n)
{
    *t = (struct tensor_table){kind, specs, n, malloc(n * sizeof *t->sorted)};
    if (t->sorted == NULL)
        return pjs_yaml_fail_nomem(y, "variants");
    for (size_t i = 0; i < n; i++)
        t->sorted[i] = (struct tensor_name){specs[i].name, i};
    qsort(t->sorted, n, sizeof *t->sorted, cmp_tensor_name);
    return 0;
}

/* The index of the tensor named by scalar key, or t->n. */
static size_t table_find(const struct tensor_table *t, const yaml_node_t *key)
{
    const char *k = (const char *)key->data.scalar.value;
    size_t len = key->data.scalar.length, lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *name = t->sorted[mid].name;
        int r = strncmp(name, k, len);
        if (r == 0)
            r = name[len] != '\0'; /* same prefix: a longer name sorts after */
        if (r == 0)
            return t->sorted[mid].index;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return t->n;
}

/* One "name: shape" entry of a variant's inputs or outputs: the shape
 * replaces the top-level one of the tensor of that name, whose rank and
 * batch axis it keeps. seen[] marks the tensors already given. */
static int parse_shape_override(pjs_yaml *y, yaml_node_t *key, yaml_node_t *value,
                                const char *path, const struct tensor_table *t, bool *seen,
                                pjs_tensor_spec *specs)
{
    int rc = pjs_yaml_get_string(y, key, path);
    if (rc != 0)
        return rc;
    char q[PJS_YAML_QUOTE_MAX], sub[PJS_YAML_PATH_MAX], top_path[PJS_YAML_PATH_MAX];
    size_t i = table_find(t, key);
    if (i == t->n)
        return pjs_yaml_fail(y, key, path, "%s is not one of the model's %s",
                             pjs_yaml_quote_node(key, q, sizeof q), t->kind);
    const pjs_tensor_spec *top = &t->specs[i];
    pjs_yaml_path_key(sub, path, top->name);
    pjs_yaml_path_index(top_path, t->kind, i);
    if (seen[i])
        return pjs_yaml_fail(y, key, sub, "duplicate key");
    seen[i] = true;
    pjs_tensor_spec parsed = {0};
    if ((rc = parse_shape(y, value, sub, false, &parsed)) != 0)
        return rc;
    if (top->batched && !parsed.batched)
        return pjs_yaml_fail(y, value, sub,
                             "must start with \"batch\" like %s (a variant keeps the batch "
                             "axis)", top_path);
    if (!top->batched && parsed.batched)
        return pjs_yaml_fail(y, value, sub, "must not have a batch axis: %s has none", top_path);
    if (parsed.shape.rank != top->shape.rank)
        return pjs_yaml_fail(y, value, sub,
                             "rank %d differs from the rank %d of %s (a variant changes "
                             "extents, not ranks)", parsed.shape.rank, top->shape.rank, top_path);
    specs[i].shape = parsed.shape;
    return 0;
}

/* A variant's inputs or outputs: a mapping from top-level tensor names to
 * shapes, written over specs (a copy of the top-level tensors). */
static int parse_shape_overrides(pjs_yaml *y, yaml_node_t *n, const char *path,
                                 const struct tensor_table *t, pjs_tensor_spec *specs)
{
    if (n->type != YAML_MAPPING_NODE)
        return pjs_yaml_fail(y, n, path, "must be a mapping from tensor names to shapes, got %s",
                             pjs_yaml_kind_name(n));
    bool *seen = calloc(t->n, sizeof *seen);
    if (seen == NULL)
        return pjs_yaml_fail_nomem(y, path);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < pjs_yaml_map_size(n); i++) {
        yaml_node_t *key = NULL, *value = NULL;
        rc = pjs_yaml_map_pair(y, n, i, path, &key, &value);
        if (rc == 0)
            rc = parse_shape_override(y, key, value, path, t, seen, specs);
    }
    free(seen);
    return rc;
}

/* A variant's tensors start as copies of the top-level ones. */
static int copy_tensors(pjs_yaml *y, const struct tensor_table *t, pjs_tensor_spec **out,
                        const char *path)
{
    pjs_tensor_spec *v = calloc(t->n, sizeof *v);
    if (v == NULL)
        return pjs_yaml_fail_nomem(y, path);
    *out = v;
    for (size_t i = 0; i < t->n; i++) {
        v[i] = t->specs[i];
        if ((v[i].name = strdup(t->specs[i].name)) == NULL)
            return pjs_yaml_fail_nomem(y, path);
    }
    return 0;
}

/* One entry of `variants`; what it builds is freed with the manifest. */
static int parse_variant(pjs_yaml *y, yaml_node_t *n, const char *path,
                         const struct tensor_table *ins, const struct tensor_table *outs,
                         pjs_variant *v)
{
    pjs_yaml_field f[] = {{"name", NULL}, {"inputs", NULL}, {"outputs", NULL}};
    char sub[PJS_YAML_PATH_MAX];
    int rc = pjs_yaml_get_fields(y, n, path, f, 3);
    for (size_t i = 0; rc == 0 && i < 2; i++)
        rc = pjs_yaml_require(y, &f[i], path, n);
    if (rc != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "name");
    if ((rc = pjs_yaml_get_name(y, f[0].value, sub, &v->name)) != 0)
        return rc;
    if (strcmp(v->name, DEFAULT_VARIANT) == 0)
        return pjs_yaml_fail(y, f[0].value, sub,
                             "\"" DEFAULT_VARIANT "\" names the top-level shapes; "
                             "choose another name");
    if ((rc = copy_tensors(y, ins, &v->inputs, path)) != 0 ||
        (rc = copy_tensors(y, outs, &v->outputs, path)) != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "inputs");
    if ((rc = parse_shape_overrides(y, f[1].value, sub, ins, v->inputs)) != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "outputs");
    return f[2].value != NULL ? parse_shape_overrides(y, f[2].value, sub, outs, v->outputs) : 0;
}

static bool same_input_shapes(const pjs_manifest *m, const pjs_variant *a, const pjs_variant *b)
{
    for (size_t i = 0; i < m->n_inputs; i++)
        if (!pjs_shape_equal(&a->inputs[i].shape, &b->inputs[i].shape))
            return false;
    return true;
}

/* Variant k (m->variants[k], k >= 1, from variants[k - 1]) against the ones
 * before it: a new name, and input shapes of its own. */
static int check_variant_distinct(pjs_yaml *y, yaml_node_t *item, const char *path,
                                  const pjs_manifest *m, size_t k)
{
    const pjs_variant *v = &m->variants[k];
    char sub[PJS_YAML_PATH_MAX], other[PJS_YAML_PATH_MAX + 32];
    for (size_t u = 0; u < k; u++) {
        if (u > 0 && strcmp(m->variants[u].name, v->name) == 0) {
            pjs_yaml_path_key(sub, path, "name");
            return pjs_yaml_fail(y, item, sub, "duplicate name \"%s\" (also variants[%zu])",
                                 v->name, u - 1);
        }
        if (!same_input_shapes(m, &m->variants[u], v))
            continue;
        if (u == 0)
            snprintf(other, sizeof other, "the top-level inputs (\"" DEFAULT_VARIANT "\")");
        else
            snprintf(other, sizeof other, "variants[%zu] (\"%s\")", u - 1, m->variants[u].name);
        pjs_yaml_path_key(sub, path, "inputs");
        return pjs_yaml_fail(y, item, sub,
                             "the same input shapes as %s; requests could not tell them "
                             "apart", other);
    }
    return 0;
}

/* Builds m->variants: "default" (aliasing the top-level tensors), then one
 * per entry of the optional `variants` list n. */
static int parse_variants(pjs_yaml *y, yaml_node_t *n, pjs_manifest *m)
{
    size_t count = 0;
    int rc = n != NULL ? pjs_yaml_get_list(y, n, "variants", true, &count) : 0;
    if (rc != 0)
        return rc;
    if (count > PJS_MANIFEST_MAX_VARIANTS)
        return pjs_yaml_fail(y, n, "variants",
                             "%zu variants, more than the %d allowed besides "
                             "\"" DEFAULT_VARIANT "\"", count, PJS_MANIFEST_MAX_VARIANTS);
    m->variants = calloc(count + 1, sizeof *m->variants);
    if (m->variants == NULL || (m->variants[0].name = strdup(DEFAULT_VARIANT)) == NULL)
        return pjs_yaml_fail_nomem(y, "variants");
    m->n_variants = 1;
    m->variants[0].inputs = m->inputs;
    m->variants[0].outputs = m->outputs;
    if (count == 0)
        return 0;
    struct tensor_table ins = {0}, outs = {0};
    if ((rc = table_init(y, &ins, "inputs", m->inputs, m->n_inputs)) == 0)
        rc = table_init(y, &outs, "outputs", m->outputs, m->n_outputs);
    for (size_t k = 1; rc == 0 && k <= count; k++) {
        yaml_node_t *item = pjs_yaml_list_item(y, n, k - 1);
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_path_index(sub, "variants", k - 1);
        m->n_variants++; /* counted first, so that a partly built variant is freed */
        rc = parse_variant(y, item, sub, &ins, &outs, &m->variants[k]);
        if (rc == 0)
            rc = check_variant_distinct(y, item, sub, m, k);
    }
    free(ins.sorted);
    free(outs.sorted);
    return rc;
}

/* ---- ensembles --------------------------------------------------------------- */

/* A step's input_map or output_map: a mapping from the step model's tensor
 * names to ensemble tensor names, both names, 1..PJS_ENSEMBLE_MAX_MAP of
 * them. *out and *out_n are set as soon as the array exists. */
static int parse_step_map(pjs_yaml *y, yaml_node_t *n, const char *path, pjs_ensemble_map **out,
                          size_t *out_n)
{
    size_t count = 0;
    int rc = pjs_yaml_get_map(y, n, path, &count);
    if (rc != 0)
        return rc;
    if (count == 0)
        return pjs_yaml_fail(y, n, path, "must map at least one tensor");
    if (count > PJS_ENSEMBLE_MAX_MAP)
        return pjs_yaml_fail(y, n, path, "%zu entries, more than the %d allowed", count,
                             PJS_ENSEMBLE_MAX_MAP);
    pjs_ensemble_map *v = calloc(count, sizeof *v);
    if (v == NULL)
        return pjs_yaml_fail_nomem(y, path);
    *out = v;
    *out_n = count;
    for (size_t i = 0; rc == 0 && i < count; i++) {
        yaml_node_t *key = NULL, *value = NULL;
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_map_entry(y, n, i, &key, &value);
        if ((rc = pjs_yaml_get_name(y, key, path, &v[i].model_tensor)) != 0)
            break;
        pjs_yaml_path_key(sub, path, v[i].model_tensor);
        rc = pjs_yaml_get_name(y, value, sub, &v[i].ensemble_tensor);
    }
    return rc;
}

/* One of ensemble.steps: {model, version?, input_map, output_map}. */
static int parse_step(pjs_yaml *y, yaml_node_t *n, const char *path, const char *ensemble,
                      pjs_ensemble_step *s)
{
    pjs_yaml_field f[] = {{"model", NULL}, {"input_map", NULL}, {"output_map", NULL},
                          {"version", NULL}};
    char sub[PJS_YAML_PATH_MAX];
    int rc = pjs_yaml_get_fields(y, n, path, f, 4);
    for (size_t i = 0; rc == 0 && i < 3; i++)
        rc = pjs_yaml_require(y, &f[i], path, n);
    if (rc != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "model");
    if ((rc = pjs_yaml_get_name(y, f[0].value, sub, &s->model)) != 0)
        return rc;
    if (strcmp(s->model, ensemble) == 0)
        return pjs_yaml_fail(y, f[0].value, sub, "an ensemble cannot call itself");
    s->version = -1;
    pjs_yaml_path_key(sub, path, "version");
    if (f[3].value != NULL && (rc = pjs_yaml_get_int(y, f[3].value, sub, &s->version)) != 0)
        return rc;
    if (s->version == 0 || s->version < -1)
        return pjs_yaml_fail(y, f[3].value, sub,
                             "must be a version number (1 or more) or -1 (the version served), "
                             "got %lld", (long long)s->version);
    pjs_yaml_path_key(sub, path, "input_map");
    if ((rc = parse_step_map(y, f[1].value, sub, &s->inputs, &s->n_inputs)) != 0)
        return rc;
    pjs_yaml_path_key(sub, path, "output_map");
    return parse_step_map(y, f[2].value, sub, &s->outputs, &s->n_outputs);
}

/* Where an ensemble tensor comes from: a client input, or the output_map
 * entry `entry` of step `step`. */
struct ens_source {
    const char *name;
    size_t step;  /* SIZE_MAX: a client input */
    size_t entry; /* client input index, or the output_map entry */
};

static int cmp_source(const void *a, const void *b)
{
    return strcmp(((const struct ens_source *)a)->name, ((const struct ens_source *)b)->name);
}

static const struct ens_source *find_source(const struct ens_source *v, size_t n,
                                            const char *name)
{
    struct ens_source key = {name, 0, 0};
    return bsearch(&key, v, n, sizeof *v, cmp_source);
}

/* "client_inputs[0]" or "ensemble.steps[1].output_map.y", for messages. */
static void source_path(const struct ens_source *src, const pjs_manifest *m, char *buf,
                        size_t size)
{
    if (src->step == SIZE_MAX)
        snprintf(buf, size, "client_inputs[%zu]", src->entry);
    else
        snprintf(buf, size, "ensemble.steps[%zu].output_map.%s", src->step,
                 m->steps[src->step].outputs[src->entry].model_tensor);
}

/* Every ensemble tensor with its one writer, sorted by name: a second
 * writer of a name is an error naming both. */
static int collect_sources(pjs_yaml *y, yaml_node_t *steps_node, const pjs_manifest *m,
                           struct ens_source **out, size_t *out_n)
{
    size_t n = m->n_client_inputs;
    for (size_t s = 0; s < m->n_steps; s++)
        n += m->steps[s].n_outputs;
    struct ens_source *v = calloc(n + 1, sizeof *v);
    if (v == NULL)
        return pjs_yaml_fail_nomem(y, "ensemble.steps");
    *out = v;
    *out_n = n;
    size_t k = 0;
    for (size_t i = 0; i < m->n_client_inputs; i++)
        v[k++] = (struct ens_source){m->client_inputs[i].name, SIZE_MAX, i};
    for (size_t s = 0; s < m->n_steps; s++)
        for (size_t e = 0; e < m->steps[s].n_outputs; e++)
            v[k++] = (struct ens_source){m->steps[s].outputs[e].ensemble_tensor, s, e};
    qsort(v, n, sizeof *v, cmp_source);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(v[i].name, v[i - 1].name) != 0)
            continue;
        /* Report the later writer in manifest order (client inputs first). */
        const struct ens_source *a = &v[i - 1], *b = &v[i];
        if (a->step != SIZE_MAX && (b->step == SIZE_MAX || b->step < a->step ||
                                    (b->step == a->step && b->entry < a->entry))) {
            const struct ens_source *t = a;
            a = b;
            b = t;
        }
        char first[PJS_YAML_PATH_MAX], second[PJS_YAML_PATH_MAX];
        source_path(a, m, first, sizeof first);
        source_path(b, m, second, sizeof second);
        return pjs_yaml_fail(y, pjs_yaml_list_item(y, steps_node, b->step), second,
                             "ensemble tensor \"%s\" is written already by %s; each ensemble "
                             "tensor has one writer (rename one of them)",
                             b->name, first);
    }
    return 0;
}

/* Every tensor a step or a client output reads has a writer, and every
 * client input is read by some step. */
static int check_reads(pjs_yaml *y, yaml_node_t *steps_node, const pjs_manifest *m,
                       const struct ens_source *src, size_t n_src)
{
    char path[PJS_YAML_PATH_MAX];
    for (size_t s = 0; s < m->n_steps; s++) {
        const pjs_ensemble_step *st = &m->steps[s];
        for (size_t e = 0; e < st->n_inputs; e++) {
            if (find_source(src, n_src, st->inputs[e].ensemble_tensor) != NULL)
                continue;
            pjs_yaml_path_set(path, "ensemble.steps[%zu].input_map.%s", s,
                              st->inputs[e].model_tensor);
            return pjs_yaml_fail(y, pjs_yaml_list_item(y, steps_node, s), path,
                                 "step %zu (model %s) reads ensemble tensor \"%s\", which is "
                                 "neither a client input nor any step's output",
                                 s, st->model, st->inputs[e].ensemble_tensor);
        }
    }
    for (size_t i = 0; i < m->n_client_outputs; i++) {
        const struct ens_source *w = find_source(src, n_src, m->client_outputs[i].name);
        pjs_yaml_path_index(path, "client_outputs", i);
        if (w == NULL)
            return pjs_yaml_fail(y, NULL, path,
                                 "no step writes \"%s\" (name it in some step's output_map)",
                                 m->client_outputs[i].name);
        if (w->step == SIZE_MAX)
            return pjs_yaml_fail(y, NULL, path,
                                 "\"%s\" is a client input; a client output is written by a "
                                 "step", m->client_outputs[i].name);
    }
    for (size_t i = 0; i < m->n_client_inputs; i++) {
        bool read = false;
        for (size_t s = 0; !read && s < m->n_steps; s++)
            for (size_t e = 0; !read && e < m->steps[s].n_inputs; e++)
                read = strcmp(m->steps[s].inputs[e].ensemble_tensor,
                              m->client_inputs[i].name) == 0;
        pjs_yaml_path_index(path, "client_inputs", i);
        if (!read)
            return pjs_yaml_fail(y, NULL, path,
                                 "no step reads \"%s\" (map it in some step's input_map, or "
                                 "remove it)", m->client_inputs[i].name);
    }
    return 0;
}

/* m->step_order: steps in waves, each step once every tensor it reads is
 * written. A step never ready reads, directly or not, its own output. */
static int order_steps(pjs_yaml *y, yaml_node_t *steps_node, pjs_manifest *m,
                       const struct ens_source *src, size_t n_src)
{
    bool *done = calloc(m->n_steps + 1, sizeof *done);
    m->step_order = calloc(m->n_steps + 1, sizeof *m->step_order);
    if (done == NULL || m->step_order == NULL) {
        free(done);
        return pjs_yaml_fail_nomem(y, "ensemble.steps");
    }
    size_t placed = 0;
    for (bool progress = true; progress && placed < m->n_steps;) {
        progress = false;
        size_t wave_start = placed;
        for (size_t s = 0; s < m->n_steps; s++) {
            bool ready = !done[s];
            for (size_t e = 0; ready && e < m->steps[s].n_inputs; e++) {
                const struct ens_source *w =
                    find_source(src, n_src, m->steps[s].inputs[e].ensemble_tensor);
                /* Written by a step of an earlier wave (this wave's are not
                 * marked done yet). */
                ready = w->step == SIZE_MAX || done[w->step];
            }
            if (ready)
                m->step_order[placed++] = s;
        }
        for (size_t k = wave_start; k < placed; k++)
            done[m->step_order[k]] = true;
        progress = placed > wave_start;
    }
    int rc = 0;
    for (size_t s = 0; rc == 0 && s < m->n_steps; s++) {
        if (done[s])
            continue;
        const pjs_ensemble_step *st = &m->steps[s];
        /* The first input whose writer is a step that never ran (there is
         * one: a step whose writers all ran would have run). */
        size_t e = 0;
        for (; e + 1 < st->n_inputs; e++) {
            size_t w = find_source(src, n_src, st->inputs[e].ensemble_tensor)->step;
            if (w != SIZE_MAX && !done[w])
                break;
        }
        char path[PJS_YAML_PATH_MAX];
        pjs_yaml_path_set(path, "ensemble.steps[%zu].input_map.%s", s,
                          st->inputs[e].model_tensor);
        rc = pjs_yaml_fail(y, pjs_yaml_list_item(y, steps_node, s), path,
                           "step %zu (model %s) reads \"%s\", which depends on the step's own "
                           "output: the steps form a cycle",
                           s, st->model, st->inputs[e].ensemble_tensor);
    }
    free(done);
    return rc;
}

/* m->calls: each step model once, in the order of first use. */
static int collect_step_models(pjs_yaml *y, pjs_manifest *m)
{
    m->calls = calloc(m->n_steps, sizeof *m->calls);
    if (m->calls == NULL)
        return pjs_yaml_fail_nomem(y, "ensemble.steps");
    for (size_t s = 0; s < m->n_steps; s++) {
        bool seen = false;
        for (size_t k = 0; !seen && k < m->n_calls; k++)
            seen = strcmp(m->calls[k], m->steps[s].model) == 0;
        if (!seen && (m->calls[m->n_calls++] = strdup(m->steps[s].model)) == NULL)
            return pjs_yaml_fail_nomem(y, "ensemble.steps");
    }
    return 0;
}

/* `ensemble: {steps: [...]}`, after client_inputs and client_outputs. */
static int parse_ensemble(pjs_yaml *y, yaml_node_t *n, pjs_manifest *m)
{
    pjs_yaml_field f[] = {{"steps", NULL}};
    size_t count = 0;
    int rc = pjs_yaml_get_fields(y, n, "ensemble", f, 1);
    if (rc == 0)
        rc = pjs_yaml_require(y, &f[0], "ensemble", n);
    if (rc == 0)
        rc = pjs_yaml_get_list(y, f[0].value, "ensemble.steps", true, &count);
    if (rc != 0)
        return rc;
    if (count > PJS_ENSEMBLE_MAX_STEPS)
        return pjs_yaml_fail(y, f[0].value, "ensemble.steps", "%zu steps, more than the %d allowed",
                             count, PJS_ENSEMBLE_MAX_STEPS);
    if ((m->steps = calloc(count, sizeof *m->steps)) == NULL)
        return pjs_yaml_fail_nomem(y, "ensemble.steps");
    for (size_t s = 0; s < count; s++) {
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_path_index(sub, "ensemble.steps", s);
        m->n_steps++; /* counted first, so that a partly built step is freed */
        if ((rc = parse_step(y, pjs_yaml_list_item(y, f[0].value, s), sub, m->name,
                             &m->steps[s])) != 0)
            return rc;
    }
    struct ens_source *src = NULL;
    size_t n_src = 0;
    rc = collect_sources(y, f[0].value, m, &src, &n_src);
    if (rc == 0)
        rc = check_reads(y, f[0].value, m, src, n_src);
    if (rc == 0)
        rc = order_steps(y, f[0].value, m, src, n_src);
    free(src);
    return rc != 0 ? rc : collect_step_models(y, m);
}

static void free_step_map(pjs_ensemble_map *v, size_t n)
{
    for (size_t i = 0; v != NULL && i < n; i++) {
        free(v[i].model_tensor);
        free(v[i].ensemble_tensor);
    }
    free(v);
}

enum top_key {
    K_FORMAT_VERSION, K_NAME, K_KIND, K_DESCRIPTION, K_BATCH_SIZES, K_INPUTS, K_OUTPUTS,
    K_VARIANTS, K_RESIDENCY, K_WEIGHT, K_META, K_CLIENT_INPUTS, K_CLIENT_OUTPUTS, K_ENSEMBLE,
    K_DECOUPLED, K_SEQUENCE, K_HOOKS_LIBRARIES, K_SWAP_IN_STAGES, K_COUNT
};

static const char *kind_name(pjs_model_kind kind)
{
    return kind == PJS_KIND_MODEL ? "model" : kind == PJS_KIND_META ? "meta" : "ensemble";
}

/* Keys that only some kinds may carry, and what to say to the others. A
 * model may declare client_inputs / client_outputs too (a hooked bundle); a
 * meta or an ensemble may not carry what describes an executable. */
static int check_kind_keys(pjs_yaml *y, const pjs_yaml_field *f, pjs_model_kind kind)
{
    static const enum top_key model_keys[] = {K_BATCH_SIZES, K_INPUTS, K_OUTPUTS, K_VARIANTS};
    static const enum top_key meta_keys[] = {K_META, K_CLIENT_INPUTS, K_CLIENT_OUTPUTS};
    static const enum top_key ensemble_keys[] = {K_ENSEMBLE, K_CLIENT_INPUTS, K_CLIENT_OUTPUTS};
    static const struct {
        const enum top_key *required; /* the first three of it are */
        enum top_key forbidden[8];
        size_t n_forbidden;
    } rules[] = {
        [PJS_KIND_MODEL] = {model_keys, {K_META, K_ENSEMBLE}, 2},
        [PJS_KIND_META] = {meta_keys, {K_BATCH_SIZES, K_INPUTS, K_OUTPUTS, K_VARIANTS,
                                       K_ENSEMBLE, K_SEQUENCE, K_SWAP_IN_STAGES}, 7},
        [PJS_KIND_ENSEMBLE] = {ensemble_keys, {K_BATCH_SIZES, K_INPUTS, K_OUTPUTS, K_VARIANTS,
                                               K_META, K_SEQUENCE, K_HOOKS_LIBRARIES,
                                               K_SWAP_IN_STAGES}, 8},
    };
    for (size_t i = 0; i < rules[kind].n_forbidden; i++) {
        enum top_key k = rules[kind].forbidden[i];
        const pjs_yaml_field *x = &f[k];
        if (x->value != NULL)
            return pjs_yaml_fail(y, x->value, x->key, "not allowed in a manifest of kind %s%s",
                                 kind_name(kind),
                                 k == K_INPUTS      ? " (use client_inputs)"
                                 : k == K_OUTPUTS   ? " (use client_outputs)"
                                 : k == K_META      ? " (an ensemble lists ensemble.steps)"
                                 : k == K_ENSEMBLE  ? " (only kind: ensemble has steps)"
                                 : k == K_SEQUENCE  ? " (only kind: model keeps state)"
                                 : k == K_HOOKS_LIBRARIES ? " (an ensemble has no model.c)"
                                 : k == K_SWAP_IN_STAGES  ? " (only kind: model has modules)"
                                                    : "");
    }
    for (size_t i = 0; i < 3; i++) {
        const pjs_yaml_field *x = &f[rules[kind].required[i]];
        if (x->value == NULL)
            return pjs_yaml_fail(y, NULL, x->key, "required key is missing (kind %s)",
                                 kind_name(kind));
    }
    return 0;
}

/* `hooks_libraries: [NAME, ...]`: the libraries model.c links with, which
 * `pjserve build-hooks` passes to the compiler as -lNAME. A name is what
 * follows -l and nothing else: 1 to 64 of [A-Za-z0-9_+.-], not starting with
 * '-' (so it can never read as another compiler option), each once. */
static int parse_hooks_libraries(pjs_yaml *y, const yaml_node_t *n, pjs_manifest *m)
{
    size_t count = 0;
    int rc = pjs_yaml_get_list(y, n, "hooks_libraries", false, &count);
    if (rc != 0 || count == 0)
        return rc;
    m->hooks_libraries = calloc(count, sizeof *m->hooks_libraries);
    if (m->hooks_libraries == NULL)
        return pjs_yaml_fail_nomem(y, "hooks_libraries");
    m->n_hooks_libraries = count;
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *item = pjs_yaml_list_item(y, n, i);
        char sub[PJS_YAML_PATH_MAX];
        pjs_yaml_path_index(sub, "hooks_libraries", i);
        if ((rc = pjs_yaml_get_string(y, item, sub)) != 0)
            return rc;
        const char *name = (const char *)item->data.scalar.value;
        size_t len = item->data.scalar.length;
        bool ok = len >= 1 && len <= PJS_MANIFEST_LIBRARY_MAX && name[0] != '-';
        for (size_t c = 0; ok && c < len; c++)
            ok = isalnum((unsigned char)name[c]) || strchr("_+.-", name[c]) != NULL;
        if (!ok)
            return pjs_yaml_fail(y, item, sub,
                                 "a library is named as it follows -l: 1 to %d of "
                                 "[A-Za-z0-9_+.-], not starting with '-' (e.g. turbojpeg for "
                                 "-lturbojpeg)",
                                 PJS_MANIFEST_LIBRARY_MAX);
        if ((rc = pjs_yaml_dup_string(y, item, sub, &m->hooks_libraries[i])) != 0)
            return rc;
    }
    return pjs_yaml_check_unique(y, n, "hooks_libraries", (const char **)m->hooks_libraries,
                                 count, "");
}

/* `decoupled: true|false`: a meta whose pjserve_run may send zero, one or
 * many responses per request (pjserve_respond). A model's responses are its
 * executable's (or its hooks') one answer, and an ensemble's its last
 * steps', so only a meta may be decoupled. */
static int parse_decoupled(pjs_yaml *y, const yaml_node_t *n, pjs_manifest *m)
{
    int rc = pjs_yaml_get_bool(y, n, "decoupled", &m->decoupled);
    if (rc != 0 || !m->decoupled || m->kind == PJS_KIND_META)
        return rc;
    return pjs_yaml_fail(y, n, "decoupled",
                         "only a manifest of kind meta may be decoupled (kind %s answers each "
                         "request once): move the streaming loop into a meta's pjserve_run, "
                         "which sends each response with pjserve_respond",
                         kind_name(m->kind));
}

/* ---- sequence (stateful models) ------------------------------------------- */

static size_t tensor_index(const pjs_tensor_spec *t, size_t n, const char *name)
{
    size_t i = 0;
    while (i < n && strcmp(t[i].name, name) != 0)
        i++;
    return i;
}

/* sequence.state[i]: {input: NAME, output: NAME, initial: zeros}. */
static int parse_state(pjs_yaml *y, yaml_node_t *n, const char *path, pjs_manifest *m,
                       pjs_state_pair *out)
{
    enum { S_INPUT, S_OUTPUT, S_INITIAL, S_COUNT };
    pjs_yaml_field f[S_COUNT] = {
        [S_INPUT] = {"input", NULL}, [S_OUTPUT] = {"output", NULL}, [S_INITIAL] = {"initial", NULL}};
    int rc = pjs_yaml_get_fields(y, n, path, f, S_COUNT);
    if (rc == 0)
        rc = pjs_yaml_require(y, &f[S_INPUT], path, n);
    if (rc == 0)
        rc = pjs_yaml_require(y, &f[S_OUTPUT], path, n);
    if (rc == 0 && f[S_INITIAL].value != NULL && !pjs_yaml_scalar_is(f[S_INITIAL].value, "zeros"))
        return pjs_yaml_fail(y, f[S_INITIAL].value, path,
                             "initial: only \"zeros\" is supported (a sequence's state starts "
                             "as zeros)");
    char *in_name = NULL, *out_name = NULL;
    if (rc == 0)
        rc = pjs_yaml_get_name(y, f[S_INPUT].value, path, &in_name);
    if (rc == 0)
        rc = pjs_yaml_get_name(y, f[S_OUTPUT].value, path, &out_name);
    if (rc == 0) {
        out->input = tensor_index(m->inputs, m->n_inputs, in_name);
        out->output = tensor_index(m->outputs, m->n_outputs, out_name);
        if (out->input == m->n_inputs)
            rc = pjs_yaml_fail(y, f[S_INPUT].value, path,
                               "input \"%s\" is not one of the model's inputs", in_name);
        else if (out->output == m->n_outputs)
            rc = pjs_yaml_fail(y, f[S_OUTPUT].value, path,
                               "output \"%s\" is not one of the model's outputs", out_name);
    }
    if (rc == 0) {
        const pjs_tensor_spec *a = &m->inputs[out->input], *b = &m->outputs[out->output];
        char sa[160], sb[160];
        if (!a->batched || !b->batched)
            rc = pjs_yaml_fail(y, n, path,
                               "state tensors must have the batch axis (each sequence's state "
                               "is one row of the batch)");
        else if (a->dtype != b->dtype || !pjs_shape_equal(&a->shape, &b->shape))
            rc = pjs_yaml_fail(y, n, path,
                               "input \"%s\" (%s %s) and output \"%s\" (%s %s) must have the "
                               "same dtype and shape: the output is the next step's input",
                               a->name, pjs_dtype_name(a->dtype),
                               pjs_shape_format(&a->shape, sa, sizeof sa), b->name,
                               pjs_dtype_name(b->dtype), pjs_shape_format(&b->shape, sb, sizeof sb));
    }
    free(in_name);
    free(out_name);
    return rc;
}

/* The client's view of a stateful model: inputs and outputs without the
 * state and control tensors. */
static int sequence_client_view(pjs_yaml *y, pjs_manifest *m, bool output)
{
    pjs_sequence_spec *q = &m->sequence;
    size_t n = output ? m->n_outputs : m->n_inputs;
    pjs_tensor_spec *all = output ? m->outputs : m->inputs;
    pjs_tensor_spec *view = calloc(n ? n : 1, sizeof *view);
    if (view == NULL)
        return pjs_yaml_fail_nomem(y, "sequence");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool server_fills = false;
        for (size_t j = 0; j < q->n_state; j++)
            server_fills = server_fills || (output ? q->state[j].output : q->state[j].input) == i;
        for (int c = 0; c < PJS_CONTROL_COUNT && !output; c++)
            server_fills = server_fills || q->control[c] == i;
        if (!server_fills)
            view[k++] = all[i];
    }
    if (output) {
        q->client_outputs = view;
        q->n_client_outputs = k;
    } else {
        q->client_inputs = view;
        q->n_client_inputs = k;
    }
    return 0;
}

const char *pjs_sequence_control_name(pjs_sequence_control k)
{
    static const char *const names[PJS_CONTROL_COUNT] = {
        [PJS_CONTROL_START] = "start", [PJS_CONTROL_END] = "end",
        [PJS_CONTROL_READY] = "ready", [PJS_CONTROL_CORRID] = "corrid"};
    return k < PJS_CONTROL_COUNT ? names[k] : "?";
}

/* Whether a control input may have dtype t: flags are bool, i32 or f32
 * (0 and 1), as Triton's *_false_true; the id is an integer. */
static bool control_dtype_ok(pjs_sequence_control k, pjs_dtype t)
{
    if (k == PJS_CONTROL_CORRID)
        return t == PJS_DTYPE_I32 || t == PJS_DTYPE_I64 || t == PJS_DTYPE_U32 ||
               t == PJS_DTYPE_U64;
    return t == PJS_DTYPE_BOOL || t == PJS_DTYPE_I32 || t == PJS_DTYPE_F32;
}

/* sequence.controls: {start: NAME, end: NAME, ready: NAME, corrid: NAME},
 * each optional, each naming an input no other control or state uses. */
static int parse_controls(pjs_yaml *y, yaml_node_t *n, pjs_manifest *m)
{
    pjs_sequence_spec *q = &m->sequence;
    pjs_yaml_field f[PJS_CONTROL_COUNT];
    for (int k = 0; k < PJS_CONTROL_COUNT; k++)
        f[k] = (pjs_yaml_field){pjs_sequence_control_name(k), NULL};
    int rc = pjs_yaml_get_fields(y, n, "sequence.controls", f, PJS_CONTROL_COUNT);
    for (int k = 0; rc == 0 && k < PJS_CONTROL_COUNT; k++) {
        if (f[k].value == NULL)
            continue;
        char path[64], *name = NULL;
        snprintf(path, sizeof path, "sequence.controls.%s", pjs_sequence_control_name(k));
        if ((rc = pjs_yaml_get_name(y, f[k].value, path, &name)) != 0)
            break;
        size_t i = tensor_index(m->inputs, m->n_inputs, name);
        const pjs_tensor_spec *t = i < m->n_inputs ? &m->inputs[i] : NULL;
        bool taken = false;
        for (size_t j = 0; j < q->n_state; j++)
            taken = taken || q->state[j].input == i;
        for (int c = 0; c < k; c++)
            taken = taken || q->control[c] == i;
        if (t == NULL)
            rc = pjs_yaml_fail(y, f[k].value, path, "input \"%s\" is not one of the model's inputs",
                               name);
        else if (taken)
            rc = pjs_yaml_fail(y, f[k].value, path,
                               "input \"%s\" already takes sequence state or another control",
                               name);
        else if (!t->batched || pjs_tensor_spec_row_elements(t) != 1)
            rc = pjs_yaml_fail(y, f[k].value, path,
                               "input \"%s\" must have the batch axis and one element per row "
                               "(shape [batch] or [batch, 1]): the server writes each request's "
                               "row",
                               name);
        else if (!control_dtype_ok(k, t->dtype))
            rc = pjs_yaml_fail(y, f[k].value, path,
                               k == PJS_CONTROL_CORRID
                                   ? "input \"%s\" is %s; the sequence id goes into i32, i64, u32 "
                                     "or u64"
                                   : "input \"%s\" is %s; a flag goes into bool, i32 or f32 (0 or 1)",
                               name, pjs_dtype_name(t->dtype));
        else
            q->control[k] = i;
        free(name);
    }
    return rc;
}

/* `sequence: {state: [...], controls: {...}, idle_timeout_ms: N,
 * max_sequences: N, max_sequences_per_client: N, evict_after_idle_ms: N}`. */
static int parse_sequence(pjs_yaml *y, yaml_node_t *n, pjs_manifest *m)
{
    enum { Q_STATE, Q_CONTROLS, Q_IDLE, Q_MAX, Q_PER_CLIENT, Q_EVICT, Q_COUNT };
    pjs_yaml_field f[Q_COUNT] = {[Q_STATE] = {"state", NULL},
                                 [Q_CONTROLS] = {"controls", NULL},
                                 [Q_IDLE] = {"idle_timeout_ms", NULL},
                                 [Q_MAX] = {"max_sequences", NULL},
                                 [Q_PER_CLIENT] = {"max_sequences_per_client", NULL},
                                 [Q_EVICT] = {"evict_after_idle_ms", NULL}};
    pjs_sequence_spec *q = &m->sequence;
    q->idle_timeout_ms = 60000;
    q->max_sequences = 1024;
    int rc = pjs_yaml_get_fields(y, n, "sequence", f, Q_COUNT);
    if (rc != 0)
        return rc;
    if (f[Q_STATE].value == NULL && f[Q_CONTROLS].value == NULL)
        return pjs_yaml_fail(y, n, "sequence",
                             "declare the sequence's state (state: [{input, output}]), its "
                             "control inputs (controls: {start, end, ready, corrid}) or both");
    if (m->client_inputs != NULL || m->client_outputs != NULL)
        return pjs_yaml_fail(y, n, "sequence",
                             "a stateful model takes no client_inputs or client_outputs (hooks "
                             "and sequence state do not combine)");
    if (m->n_variants > 1)
        return pjs_yaml_fail(y, n, "sequence",
                             "a stateful model has no variants (its state rows have one shape)");
    if (f[Q_IDLE].value != NULL &&
        (rc = pjs_yaml_get_int(y, f[Q_IDLE].value, "sequence.idle_timeout_ms",
                               &q->idle_timeout_ms)) != 0)
        return rc;
    if (q->idle_timeout_ms < 1 || q->idle_timeout_ms > 86400000)
        return pjs_yaml_fail(y, f[Q_IDLE].value, "sequence.idle_timeout_ms",
                             "must be 1..86400000 (milliseconds), got %lld",
                             (long long)q->idle_timeout_ms);
    if (f[Q_MAX].value != NULL &&
        (rc = pjs_yaml_get_int(y, f[Q_MAX].value, "sequence.max_sequences",
                               &q->max_sequences)) != 0)
        return rc;
    if (q->max_sequences < 1 || q->max_sequences > 1000000)
        return pjs_yaml_fail(y, f[Q_MAX].value, "sequence.max_sequences",
                             "must be 1..1000000, got %lld", (long long)q->max_sequences);
    q->max_sequences_per_client = q->max_sequences >= 4 ? q->max_sequences / 4 : 1;
    if (f[Q_PER_CLIENT].value != NULL &&
        (rc = pjs_yaml_get_int(y, f[Q_PER_CLIENT].value, "sequence.max_sequences_per_client",
                               &q->max_sequences_per_client)) != 0)
        return rc;
    if (q->max_sequences_per_client < 1 || q->max_sequences_per_client > q->max_sequences)
        return pjs_yaml_fail(y, f[Q_PER_CLIENT].value, "sequence.max_sequences_per_client",
                             "must be 1..%lld (sequence.max_sequences), got %lld",
                             (long long)q->max_sequences, (long long)q->max_sequences_per_client);
    q->evict_after_idle_ms = q->idle_timeout_ms < 1000 ? q->idle_timeout_ms : 1000;
    if (f[Q_EVICT].value != NULL &&
        (rc = pjs_yaml_get_int(y, f[Q_EVICT].value, "sequence.evict_after_idle_ms",
                               &q->evict_after_idle_ms)) != 0)
        return rc;
    if (q->evict_after_idle_ms < 1 || q->evict_after_idle_ms > q->idle_timeout_ms)
        return pjs_yaml_fail(y, f[Q_EVICT].value, "sequence.evict_after_idle_ms",
                             "must be 1..%lld (the idle timeout, milliseconds), got %lld",
                             (long long)q->idle_timeout_ms, (long long)q->evict_after_idle_ms);
    size_t count = 0;
    if (f[Q_STATE].value != NULL &&
        (rc = pjs_yaml_get_list(y, f[Q_STATE].value, "sequence.state", true, &count)) != 0)
        return rc;
    if (count > PJS_SEQUENCE_MAX_STATE)
        return pjs_yaml_fail(y, f[Q_STATE].value, "sequence.state",
                             "%zu state tensors, more than the %d allowed", count,
                             PJS_SEQUENCE_MAX_STATE);
    for (size_t i = 0; i < count; i++) {
        char path[64];
        snprintf(path, sizeof path, "sequence.state[%zu]", i);
        pjs_state_pair *st = &q->state[i];
        if ((rc = parse_state(y, pjs_yaml_list_item(y, f[Q_STATE].value, i), path, m, st)) != 0)
            return rc;
        for (size_t j = 0; j < i; j++)
            if (q->state[j].input == st->input || q->state[j].output == st->output)
                return pjs_yaml_fail(y, f[Q_STATE].value, path,
                                     "input or output already used by sequence.state[%zu]", j);
        q->n_state = i + 1;
    }
    if (f[Q_CONTROLS].value != NULL && (rc = parse_controls(y, f[Q_CONTROLS].value, m)) != 0)
        return rc;
    size_t n_controls = 0;
    for (int k = 0; k < PJS_CONTROL_COUNT; k++)
        n_controls += q->control[k] != PJS_CONTROL_NONE;
    if (q->n_state + n_controls == m->n_inputs)
        return pjs_yaml_fail(y, n, "sequence",
                             "every input is state or a control: a client must send at least "
                             "one input");
    m->stateful = true;
    if ((rc = sequence_client_view(y, m, false)) != 0)
        return rc;
    return sequence_client_view(y, m, true);
}

static int parse_root(pjs_yaml *y, yaml_node_t *root, pjs_manifest *m)
{
    pjs_yaml_field f[K_COUNT] = {
        [K_FORMAT_VERSION] = {"format_version", NULL}, [K_NAME] = {"name", NULL},
        [K_KIND] = {"kind", NULL},                     [K_DESCRIPTION] = {"description", NULL},
        [K_BATCH_SIZES] = {"batch_sizes", NULL},       [K_INPUTS] = {"inputs", NULL},
        [K_OUTPUTS] = {"outputs", NULL},               [K_VARIANTS] = {"variants", NULL},
        [K_RESIDENCY] = {"residency", NULL},
        [K_WEIGHT] = {"weight", NULL},                 [K_META] = {"meta", NULL},
        [K_CLIENT_INPUTS] = {"client_inputs", NULL},   [K_CLIENT_OUTPUTS] = {"client_outputs", NULL},
        [K_ENSEMBLE] = {"ensemble", NULL},             [K_DECOUPLED] = {"decoupled", NULL},
        [K_SEQUENCE] = {"sequence", NULL},             [K_HOOKS_LIBRARIES] = {"hooks_libraries", NULL},
        [K_SWAP_IN_STAGES] = {"swap_in_stages", NULL},
    };
    if (root->type != YAML_MAPPING_NODE)
        return pjs_yaml_fail(y, root, "", "the top level must be a mapping, got %s",
                             pjs_yaml_kind_name(root));
    yaml_node_t *unknown = NULL;
    int rc = pjs_yaml_collect_fields(y, root, "", f, K_COUNT, &unknown);
    if (rc != 0)
        return rc;
    /* The version decides the schema, so it is checked before unknown keys. */
    if ((rc = pjs_yaml_require(y, &f[K_FORMAT_VERSION], "", NULL)) != 0 ||
        (rc = parse_version(y, f[K_FORMAT_VERSION].value)) != 0)
        return rc;
    if (unknown != NULL)
        return pjs_yaml_unknown_key(y, unknown, "");
    if ((rc = pjs_yaml_require(y, &f[K_NAME], "", NULL)) != 0 ||
        (rc = pjs_yaml_get_name(y, f[K_NAME].value, "name", &m->name)) != 0)
        return rc;
    if (f[K_KIND].value != NULL && (rc = parse_kind(y, f[K_KIND].value, &m->kind)) != 0)
        return rc;
    if ((rc = check_kind_keys(y, f, m->kind)) != 0)
        return rc;
    if (f[K_DESCRIPTION].value != NULL &&
        ((rc = pjs_yaml_get_string(y, f[K_DESCRIPTION].value, "description")) != 0 ||
         (rc = pjs_yaml_dup_string(y, f[K_DESCRIPTION].value, "description",
                                   &m->description)) != 0))
        return rc;
    if (f[K_RESIDENCY].value != NULL &&
        (rc = parse_residency(y, f[K_RESIDENCY].value, &m->residency)) != 0)
        return rc;
    if (f[K_WEIGHT].value != NULL &&
        (rc = pjs_yaml_get_positive_number(y, f[K_WEIGHT].value, "weight", &m->weight)) != 0)
        return rc;
    if (m->kind == PJS_KIND_MODEL) {
        if ((rc = parse_batch_sizes(y, f[K_BATCH_SIZES].value, m)) != 0 ||
            (rc = parse_tensors(y, f[K_INPUTS].value, "inputs", true, &m->inputs,
                                &m->n_inputs)) != 0 ||
            (rc = parse_tensors(y, f[K_OUTPUTS].value, "outputs", false, &m->outputs,
                                &m->n_outputs)) != 0)
            return rc;
        if ((rc = parse_variants(y, f[K_VARIANTS].value, m)) != 0)
            return rc;
    } else if (m->kind == PJS_KIND_META && (rc = parse_meta(y, f[K_META].value, m)) != 0) {
        return rc;
    }
    if (f[K_CLIENT_INPUTS].value != NULL &&
        (rc = parse_tensors(y, f[K_CLIENT_INPUTS].value, "client_inputs", true,
                            &m->client_inputs, &m->n_client_inputs)) != 0)
        return rc;
    if (f[K_CLIENT_OUTPUTS].value != NULL &&
        (rc = parse_tensors(y, f[K_CLIENT_OUTPUTS].value, "client_outputs", false,
                            &m->client_outputs, &m->n_client_outputs)) != 0)
        return rc;
    if (f[K_DECOUPLED].value != NULL && (rc = parse_decoupled(y, f[K_DECOUPLED].value, m)) != 0)
        return rc;
    if (f[K_SEQUENCE].value != NULL && (rc = parse_sequence(y, f[K_SEQUENCE].value, m)) != 0)
        return rc;
    if (f[K_HOOKS_LIBRARIES].value != NULL &&
        (rc = parse_hooks_libraries(y, f[K_HOOKS_LIBRARIES].value, m)) != 0)
        return rc;
    if (f[K_SWAP_IN_STAGES].value != NULL &&
        (rc = parse_swap_in_stages(y, f[K_SWAP_IN_STAGES].value, f[K_VARIANTS].value, m)) != 0)
        return rc;
    if (m->kind == PJS_KIND_ENSEMBLE)
        return parse_ensemble(y, f[K_ENSEMBLE].value, m);
    return 0;
}

/* ---- public API ------------------------------------------------------------ */

int pjs_manifest_parse(pjs_manifest *m, const char *yaml, size_t len, const char *label,
                       pjs_error *err)
{
    pjs_manifest tmp = {.kind = PJS_KIND_MODEL, .residency = PJS_RESIDENCY_HOST, .weight = 1.0};
    for (int k = 0; k < PJS_CONTROL_COUNT; k++)
        tmp.sequence.control[k] = PJS_CONTROL_NONE;
    pjs_yaml y = {0};
    yaml_node_t *root = NULL;
    int rc;
    if (label == NULL)
        label = "manifest";
    memset(m, 0, sizeof *m);
    if (yaml == NULL && len > 0) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: no manifest bytes", label);
        goto out;
    }
    if (yaml == NULL)
        yaml = "";
    if (len > PJS_MANIFEST_MAX_BYTES) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: %zu bytes, more than the %u allowed",
                           label, len, PJS_MANIFEST_MAX_BYTES);
        goto out;
    }
    if ((rc = pjs_yaml_load(&y, yaml, len, label, err, &root)) != 0)
        goto out;
    if (root == NULL) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: empty manifest (no YAML document)",
                           label);
        goto out;
    }
    if ((rc = parse_root(&y, root, &tmp)) != 0)
        goto out;
    *m = tmp;
    memset(&tmp, 0, sizeof tmp);
out:
    pjs_manifest_free(&tmp);
    pjs_yaml_free(&y);
    return rc;
}

/* ---- labels files ---------------------------------------------------------- */

/* Splits text (size bytes, NUL-terminated by pjs_read_file) into lines in
 * place: a "\n" or "\r\n" ends a line, a last line may lack it. */
static int split_labels(pjs_labels *l, char *text, size_t size, const char *file, pjs_error *err)
{
    size_t lines = 0;
    for (size_t i = 0; i < size; i++) {
        if (text[i] == '\0')
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: line %zu holds a NUL byte (a labels file is text, one "
                                 "class name per line)",
                                 file, lines + 1);
        lines += text[i] == '\n';
    }
    lines += size > 0 && text[size - 1] != '\n';
    l->names = calloc(lines > 0 ? lines : 1, sizeof *l->names);
    if (l->names == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory for %zu labels", file, lines);
    l->text = text;
    for (char *at = text, *end = text + size; at < end; l->count++) {
        char *nl = memchr(at, '\n', (size_t)(end - at));
        char *stop = nl != NULL ? nl : end;
        if (stop > at && stop[-1] == '\r')
            stop[-1] = '\0';
        *stop = '\0';
        l->names[l->count] = at;
        at = stop + 1;
    }
    return 0;
}

/* Reads the labels file of outputs[i] (listed as `what`) from dir and checks
 * that it names every class of the output at each variant's shape. */
static int load_labels(const pjs_manifest *m, const pjs_tensor_spec *outputs, size_t i,
                       const char *what, const char *dir, const char *manifest_path,
                       pjs_error *err)
{
    pjs_labels *l = outputs[i].labels;
    char path[4096];
    int w = snprintf(path, sizeof path, "%s/%s", dir, l->file);
    if (w < 0 || (size_t)w >= sizeof path)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: %s[%zu].labels: path too long",
                             manifest_path, what, i);
    char *text = NULL;
    size_t size = 0;
    int rc = pjs_read_file(path, PJS_LABELS_MAX_BYTES, &text, &size, err);
    if (rc == 0 && (rc = split_labels(l, text, size, path, err)) != 0)
        free(text);
    if (rc != 0)
        return pjs_error_prefix(err, "%s: %s[%zu].labels: ", manifest_path, what, i);
    bool executable = outputs == m->outputs;
    for (size_t v = 0; v < (executable ? m->n_variants : 1); v++) {
        const pjs_tensor_spec *s = executable ? &m->variants[v].outputs[i] : &outputs[i];
        int64_t classes = pjs_tensor_spec_row_elements(s);
        if (classes >= 0 && l->count < (uint64_t)classes)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: %s[%zu].labels: %s has %zu lines but output \"%s\" has "
                                 "%lld classes per row%s%s%s (one label per line, line i names "
                                 "class i)",
                                 manifest_path, what, i, l->file, l->count, s->name,
                                 (long long)classes, v > 0 ? " in variant \"" : "",
                                 v > 0 ? m->variants[v].name : "", v > 0 ? "\"" : "");
    }
    return 0;
}

static int load_labels_files(const pjs_manifest *m, const char *manifest_path, pjs_error *err)
{
    char dir[4096];
    const char *slash = strrchr(manifest_path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - manifest_path), manifest_path);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < m->n_outputs; i++)
        if (m->outputs[i].labels != NULL)
            rc = load_labels(m, m->outputs, i, "outputs", dir, manifest_path, err);
    for (size_t i = 0; rc == 0 && i < m->n_client_outputs; i++)
        if (m->client_outputs[i].labels != NULL)
            rc = load_labels(m, m->client_outputs, i, "client_outputs", dir, manifest_path, err);
    return rc;
}

int pjs_manifest_load(pjs_manifest *m, const char *path, pjs_error *err)
{
    char *data = NULL;
    size_t size = 0;
    memset(m, 0, sizeof *m);
    int rc = pjs_read_file(path, PJS_MANIFEST_MAX_BYTES, &data, &size, err);
    if (rc == 0)
        rc = pjs_manifest_parse(m, data, size, path, err);
    free(data);
    if (rc == 0 && (rc = load_labels_files(m, path, err)) != 0)
        pjs_manifest_free(m);
    return rc;
}

/* The tensors of a list; `owner`: the top-level list, whose labels its
 * variants' copies share. */
static void free_tensors(pjs_tensor_spec *v, size_t n, bool owner)
{
    for (size_t i = 0; v != NULL && i < n; i++) {
        free(v[i].name);
        if (owner && v[i].labels != NULL) {
            free(v[i].labels->file);
            free(v[i].labels->names);
            free(v[i].labels->text);
            free(v[i].labels);
        }
    }
    free(v);
}

void pjs_manifest_free(pjs_manifest *m)
{
    if (m == NULL)
        return;
    free(m->name);
    free(m->description);
    free_tensors(m->inputs, m->n_inputs, true);
    free_tensors(m->outputs, m->n_outputs, true);
    free_tensors(m->client_inputs, m->n_client_inputs, true);
    free_tensors(m->client_outputs, m->n_client_outputs, true);
    free(m->batch_sizes);
    for (size_t v = 0; m->variants != NULL && v < m->n_variants; v++) {
        free(m->variants[v].name);
        if (v > 0) {
            free_tensors(m->variants[v].inputs, m->n_inputs, false);
            free_tensors(m->variants[v].outputs, m->n_outputs, false);
        }
    }
    free(m->variants);
    for (size_t i = 0; m->calls != NULL && i < m->n_calls; i++)
        free(m->calls[i]);
    free(m->calls);
    for (size_t i = 0; m->hooks_libraries != NULL && i < m->n_hooks_libraries; i++)
        free(m->hooks_libraries[i]);
    free(m->hooks_libraries);
    for (size_t s = 0; m->steps != NULL && s < m->n_steps; s++) {
        free(m->steps[s].model);
        free_step_map(m->steps[s].inputs, m->steps[s].n_inputs);
        free_step_map(m->steps[s].outputs, m->steps[s].n_outputs);
    }
    free(m->steps);
    free(m->step_order);
    free(m->sequence.client_inputs);
    free(m->sequence.client_outputs);
    for (size_t k = 0; m->stages != NULL && k < m->n_stages; k++) {
        for (size_t i = 0; m->stages[k].weights != NULL && i < m->stages[k].n_weights; i++)
            free(m->stages[k].weights[i]);
        free(m->stages[k].weights);
        free_tensors(m->stages[k].outputs, m->stages[k].n_outputs, true);
    }
    free(m->stages);
    memset(m, 0, sizeof *m);
}

size_t pjs_tensor_spec_row_bytes(const pjs_tensor_spec *s)
{
    size_t bytes = pjs_dtype_size(s->dtype);
    for (int d = s->batched ? 1 : 0; d < s->shape.rank; d++)
        bytes *= (size_t)s->shape.dims[d];
    return bytes;
}

int64_t pjs_tensor_spec_row_elements(const pjs_tensor_spec *s)
{
    int64_t n = 1;
    for (int d = s->batched ? 1 : 0; d < s->shape.rank; d++) {
        if (s->shape.dims[d] < 0)
            return -1;
        n *= s->shape.dims[d];
    }
    return n;
}

const pjs_tensor_spec *pjs_manifest_client_tensors(const pjs_manifest *m, bool output, size_t *n)
{
    if (m->stateful) {
        *n = output ? m->sequence.n_client_outputs : m->sequence.n_client_inputs;
        return output ? m->sequence.client_outputs : m->sequence.client_inputs;
    }
    if (output ? m->client_outputs != NULL : m->client_inputs != NULL) {
        *n = output ? m->n_client_outputs : m->n_client_inputs;
        return output ? m->client_outputs : m->client_inputs;
    }
    *n = output ? m->n_outputs : m->n_inputs;
    return output ? m->outputs : m->inputs;
}

pjs_shape pjs_manifest_client_shape(const pjs_manifest *m, bool output, size_t i)
{
    if (m->stateful) /* no variants */
        return (output ? m->sequence.client_outputs : m->sequence.client_inputs)[i].shape;
    if (output ? m->client_outputs != NULL : m->client_inputs != NULL)
        return (output ? m->client_outputs : m->client_inputs)[i].shape;
    pjs_shape s = (output ? m->outputs : m->inputs)[i].shape;
    for (size_t v = 1; v < m->n_variants; v++) {
        const pjs_variant *var = &m->variants[v];
        const pjs_shape *other = &(output ? var->outputs : var->inputs)[i].shape;
        for (int d = 0; d < s.rank; d++)
            if (other->dims[d] != s.dims[d])
                s.dims[d] = -1;
    }
    return s;
}

static bool input_fits(const pjs_tensor_spec *t, const pjs_shape *s)
{
    if (s->rank != t->shape.rank)
        return false;
    for (int d = t->batched ? 1 : 0; d < s->rank; d++)
        if (s->dims[d] != t->shape.dims[d])
            return false;
    return true;
}

bool pjs_manifest_find_variant(const pjs_manifest *m, const pjs_shape *const *shapes,
                               size_t *variant)
{
    for (size_t v = 0; v < m->n_variants; v++) {
        size_t i = 0;
        while (i < m->n_inputs && input_fits(&m->variants[v].inputs[i], shapes[i]))
            i++;
        if (i == m->n_inputs) {
            *variant = v;
            return true;
        }
    }
    return false;
}

/* Appends formatted text at buf[*used], never past size (the end is cut). */
__attribute__((format(printf, 4, 5))) static void append(char *buf, size_t size, size_t *used,
                                                         const char *fmt, ...)
{
    if (*used >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, size - *used, fmt, ap);
    va_end(ap);
    *used = n < 0 ? size : *used + (size_t)n;
}

const char *pjs_manifest_format_variants(const pjs_manifest *m, char *buf, size_t size)
{
    size_t used = 0;
    bool several = m->n_inputs > 1;
    buf[0] = '\0';
    for (size_t v = 0; v < m->n_variants; v++) {
        append(buf, size, &used, "%s%s %s", v ? ", " : "", m->variants[v].name,
               several ? "(" : "");
        for (size_t i = 0; i < m->n_inputs; i++) {
            const pjs_tensor_spec *t = &m->variants[v].inputs[i];
            char shape[160];
            pjs_shape_format(&t->shape, shape, sizeof shape);
            if (several)
                append(buf, size, &used, "%s%s %s", i ? ", " : "", t->name, shape);
            else
                append(buf, size, &used, "%s", shape);
        }
        append(buf, size, &used, "%s", several ? ")" : "");
    }
    return buf;
}
