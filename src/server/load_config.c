/*
 * load_config.c - a load's configuration override (see load_config.h).
 *
 * The parse walks the document once with a table of known fields per
 * object (either JSON spelling of a field counts, twice is an error). A
 * field pjserve cannot apply is collected, not fatal, so that the refusal
 * names all of them at once; a value of the wrong type or out of range
 * stops the walk with a message naming its path. The apply step compares
 * what the config restates with what ModelConfig reports for the bundle
 * (the same rules as frontend/http/model_json.c and
 * frontend/grpc/model_info.c: dims without the batch axis when the model
 * batches, TYPE_ names, FORMAT_ names) and works out the served cap.
 */
#include "server/load_config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/infer.h"
#include "sched/coalesce.h"
#include "server/config.h"

/* Most inputs or outputs a config may list (the messages spell it out). */
#define MAX_CONFIG_TENSORS 256
_Static_assert(PJS_MAX_RANK == 8, "read_dims's message says 8");

struct pjs_load_config {
    char *text;                  /* NUL-terminated copy of what was parsed */
    json_t *doc;
    const char *name;            /* the fields below borrow from doc; NULL: absent */
    const char *platform;
    const char *backend;
    int64_t max_batch_size;      /* absent: 0, as protobuf reads it */
    bool dynamic_batching;       /* the object is present */
    const json_t *preferred;     /* dynamic_batching.preferred_batch_size, or NULL */
    int64_t default_timeout_us;  /* -1: absent */
    int64_t max_queue_size;      /* 0: absent (Triton: no bound) */
    const json_t *inputs;        /* arrays of objects already type-checked, or NULL */
    const json_t *outputs;
};

/* ---- the walk ---------------------------------------------------------------------- */

typedef struct walk {
    const char *model;
    pjs_error *err;
    pjs_load_config *c;
    char refused[640];           /* "'a', 'b.c'": fits a message with the rest */
    size_t n_refused;
    bool refused_truncated;
} walk;

typedef int (*field_fn)(walk *w, const char *path, json_t *value);

typedef struct field {
    const char *name;            /* snake_case; lowerCamelCase matches too */
    field_fn read;               /* NULL: pjserve cannot apply it */
} field;

/* Whether `key` is `snake` in snake_case or lowerCamelCase. */
static bool field_is(const char *key, const char *snake)
{
    const char *k = key;
    if (strcmp(key, snake) == 0)
        return true;
    for (const char *s = snake; *s != '\0'; s++, k++) {
        char want = *s;
        if (want == '_' && s[1] != '\0')
            want = (char)toupper((unsigned char)*++s);
        if (*k != want)
            return false;
    }
    return *k == '\0';
}

static void refuse(walk *w, const char *path)
{
    size_t used = strlen(w->refused);
    int n = snprintf(w->refused + used, sizeof w->refused - used, "%s'%s'",
                     w->n_refused > 0 ? ", " : "", path);
    if (n < 0 || (size_t)n >= sizeof w->refused - used) {
        w->refused[used] = '\0';
        w->refused_truncated = true;
    }
    w->n_refused++;
}

/* A short rendering of v for messages. */
static const char *show(const json_t *v, char *buf, size_t size)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(buf, size, "%s", s != NULL ? s : "?");
    if (s != NULL && strlen(s) >= size && size > 4)
        memcpy(buf + size - 4, "...", 4);
    free(s);
    return buf;
}

static int type_error(walk *w, const char *path, const char *want, const json_t *v)
{
    char got[64];
    return pjs_error_set(w->err, PJS_ERR_INVALID_ARGUMENT,
                         "config override: model %s: %s must be %s, got %s", w->model, path,
                         want, show(v, got, sizeof got));
}

/* An integer in [min, max]: a JSON integer or, as protobuf writes 64-bit
 * integers, a string of decimal digits. */
static int get_int(walk *w, const char *path, json_t *v, int64_t min, int64_t max,
                   int64_t *out)
{
    int64_t x = 0;
    bool ok = false;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
        ok = true;
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end = NULL;
        errno = 0;
        long long parsed = strtoll(s, &end, 10);
        ok = s[0] != '\0' && !isspace((unsigned char)s[0]) && s[0] != '+' && *end == '\0' &&
             errno == 0 && (size_t)(end - s) == json_string_length(v);
        x = parsed;
    }
    if (!ok || x < min || x > max) {
        char want[96];
        snprintf(want, sizeof want, "an integer in %" PRId64 "..%" PRId64, min, max);
        return type_error(w, path, want, v);
    }
    *out = x;
    return 0;
}

/* The value of an integer get_int accepted (a number or a decimal string). */
static int64_t checked_int(const json_t *v)
{
    return json_is_integer(v) ? json_integer_value(v) : strtoll(json_string_value(v), NULL, 10);
}

static int get_bool(walk *w, const char *path, json_t *v, bool *out)
{
    if (!json_is_boolean(v))
        return type_error(w, path, "true or false", v);
    *out = json_is_true(v);
    return 0;
}

static int get_string(walk *w, const char *path, json_t *v, const char **out)
{
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return type_error(w, path, "a string", v);
    *out = json_string_value(v);
    return 0;
}

/* Walks object v at `path` ("" at the top) with its table of fields. */
static int walk_object(walk *w, const char *path, json_t *v, const field *fields, size_t n)
{
    if (!json_is_object(v))
        return type_error(w, path[0] ? path : "the config", "a JSON object", v);
    bool seen[16] = {false}; /* every table is shorter */
    const char *key;
    json_t *value;
    json_object_foreach(v, key, value) {
        char sub[160];
        snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", key);
        size_t i = 0;
        while (i < n && !field_is(key, fields[i].name))
            i++;
        if (i == n || fields[i].read == NULL) {
            refuse(w, sub);
            continue;
        }
        if (seen[i])
            return pjs_error_set(w->err, PJS_ERR_INVALID_ARGUMENT,
                                 "config override: model %s: %s: field %s given twice (its "
                                 "snake_case and lowerCamelCase spellings are one field)",
                                 w->model, sub, fields[i].name);
        seen[i] = true;
        int rc = fields[i].read(w, sub, value);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- top level ------------------------------------------------------------------------ */

static int read_name(walk *w, const char *path, json_t *v)
{
    return get_string(w, path, v, &w->c->name);
}

static int read_platform(walk *w, const char *path, json_t *v)
{
    return get_string(w, path, v, &w->c->platform);
}

static int read_backend(walk *w, const char *path, json_t *v)
{
    return get_string(w, path, v, &w->c->backend);
}

static int read_max_batch_size(walk *w, const char *path, json_t *v)
{
    return get_int(w, path, v, 0, INT32_MAX, &w->c->max_batch_size);
}

/* version_policy: only {"latest": {"num_versions": 1}} (or latest with no
 * count) restates what pjserve serves, its one version. */
static int read_num_versions(walk *w, const char *path, json_t *v)
{
    int64_t n;
    int rc = get_int(w, path, v, 0, UINT32_MAX, &n);
    if (rc == 0 && n > 1)
        refuse(w, path);
    return rc;
}

static int read_latest(walk *w, const char *path, json_t *v)
{
    static const field fields[] = {{"num_versions", read_num_versions}};
    return walk_object(w, path, v, fields, 1);
}

static int read_version_policy(walk *w, const char *path, json_t *v)
{
    static const field fields[] = {{"latest", read_latest}, {"all", NULL}, {"specific", NULL}};
    return walk_object(w, path, v, fields, 3);
}

/* ---- inputs and outputs ------------------------------------------------------------- */

/* A string compared with the model's by pjs_load_config_apply. */
static int read_string_field(walk *w, const char *path, json_t *v)
{
    const char *s;
    return get_string(w, path, v, &s);
}

static int read_dims(walk *w, const char *path, json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) > PJS_MAX_RANK)
        return type_error(w, path, "an array of at most 8 integers",
                          v);
    size_t i;
    json_t *d;
    json_array_foreach(v, i, d) {
        char sub[176];
        int64_t x;
        snprintf(sub, sizeof sub, "%s[%zu]", path, i);
        int rc = get_int(w, sub, d, -1, INT64_MAX, &x);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* A flag that restates the model when false. */
static int read_false_flag(walk *w, const char *path, json_t *v)
{
    bool b = false;
    int rc = get_bool(w, path, v, &b);
    if (rc == 0 && b)
        refuse(w, path);
    return rc;
}

static const field input_fields[] = {
    {"name", read_string_field},         {"data_type", read_string_field},
    {"format", read_string_field},       {"dims", read_dims},
    {"is_shape_tensor", read_false_flag}, {"allow_ragged_batch", read_false_flag},
    {"optional", read_false_flag},      {"reshape", NULL},
    {"is_non_linear_format_io", read_false_flag},
};

static const field output_fields[] = {
    {"name", read_string_field},         {"data_type", read_string_field},
    {"dims", read_dims},                {"label_filename", read_string_field},
    {"is_shape_tensor", read_false_flag}, {"reshape", NULL},
    {"is_non_linear_format_io", read_false_flag},
};

static int read_tensors(walk *w, const char *path, json_t *v, bool output)
{
    if (!json_is_array(v) || json_array_size(v) > MAX_CONFIG_TENSORS)
        return type_error(w, path, "an array of at most 256 objects",
                          v);
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        char sub[176];
        snprintf(sub, sizeof sub, "%s[%zu]", path, i);
        int rc = output ? walk_object(w, sub, t, output_fields,
                                      sizeof output_fields / sizeof output_fields[0])
                        : walk_object(w, sub, t, input_fields,
                                      sizeof input_fields / sizeof input_fields[0]);
        if (rc != 0)
            return rc;
        if (json_object_get(t, "name") == NULL)
            return pjs_error_set(w->err, PJS_ERR_INVALID_ARGUMENT,
                                 "config override: model %s: %s has no name", w->model, sub);
    }
    if (output)
        w->c->outputs = v;
    else
        w->c->inputs = v;
    return 0;
}

static int read_inputs(walk *w, const char *path, json_t *v)
{
    return read_tensors(w, path, v, false);
}

static int read_outputs(walk *w, const char *path, json_t *v)
{
    return read_tensors(w, path, v, true);
}

/* ---- dynamic_batching ---------------------------------------------------------------- */

static int read_preferred(walk *w, const char *path, json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) > 64)
        return type_error(w, path, "an array of at most 64 batch sizes", v);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        char sub[176];
        int64_t x;
        snprintf(sub, sizeof sub, "%s[%zu]", path, i);
        int rc = get_int(w, sub, s, 1, INT32_MAX, &x);
        if (rc != 0)
            return rc;
    }
    w->c->preferred = v;
    return 0;
}

static int read_queue_delay(walk *w, const char *path, json_t *v)
{
    int64_t us;
    int rc = get_int(w, path, v, 0, INT64_MAX, &us);
    if (rc == 0 && us != 0)
        rc = pjs_error_set(w->err, PJS_ERR_INVALID_ARGUMENT,
                           "config override: model %s: %s is %" PRId64 ", but pjserve never "
                           "holds a request back to wait for others (it coalesces the requests "
                           "queued when the device frees up); give 0 or leave it out",
                           w->model, path, us);
    return rc;
}

/* A count that restates pjserve (no priorities) when 0. */
static int read_zero_count(walk *w, const char *path, json_t *v)
{
    int64_t n;
    int rc = get_int(w, path, v, 0, INT64_MAX, &n);
    if (rc == 0 && n != 0)
        refuse(w, path);
    return rc;
}

static int read_timeout_action(walk *w, const char *path, json_t *v)
{
    const char *s;
    int rc = get_string(w, path, v, &s);
    if (rc != 0)
        return rc;
    if (strcmp(s, "DELAY") == 0)
        refuse(w, path);
    else if (strcmp(s, "REJECT") != 0)
        return type_error(w, path, "\"REJECT\" or \"DELAY\"", v);
    return 0;
}

static int read_default_timeout(walk *w, const char *path, json_t *v)
{
    return get_int(w, path, v, 0, PJS_CONFIG_MAX_DURATION_US, &w->c->default_timeout_us);
}

/* A request's own timeout always counts in pjserve: true restates it. */
static int read_allow_override(walk *w, const char *path, json_t *v)
{
    bool b = false;
    int rc = get_bool(w, path, v, &b);
    if (rc == 0 && !b)
        refuse(w, path);
    return rc;
}

static int read_max_queue_size(walk *w, const char *path, json_t *v)
{
    return get_int(w, path, v, 0, PJS_CONFIG_MAX_QUEUE_DEPTH, &w->c->max_queue_size);
}

static int read_queue_policy(walk *w, const char *path, json_t *v)
{
    static const field fields[] = {
        {"timeout_action", read_timeout_action},
        {"default_timeout_microseconds", read_default_timeout},
        {"allow_timeout_override", read_allow_override},
        {"max_queue_size", read_max_queue_size},
    };
    return walk_object(w, path, v, fields, sizeof fields / sizeof fields[0]);
}

/* priority_queue_policy: an empty map restates; any level is refused. */
static int read_priority_policy(walk *w, const char *path, json_t *v)
{
    if (!json_is_object(v))
        return type_error(w, path, "a JSON object", v);
    if (json_object_size(v) > 0)
        refuse(w, path);
    return 0;
}

static int read_dynamic_batching(walk *w, const char *path, json_t *v)
{
    static const field fields[] = {
        {"preferred_batch_size", read_preferred},
        {"max_queue_delay_microseconds", read_queue_delay},
        {"preserve_ordering", read_false_flag},
        {"priority_levels", read_zero_count},
        {"default_priority_level", read_zero_count},
        {"default_queue_policy", read_queue_policy},
        {"priority_queue_policy", read_priority_policy},
    };
    w->c->dynamic_batching = true;
    return walk_object(w, path, v, fields, sizeof fields / sizeof fields[0]);
}

static const field config_fields[] = {
    {"name", read_name},
    {"platform", read_platform},
    {"backend", read_backend},
    {"version_policy", read_version_policy},
    {"max_batch_size", read_max_batch_size},
    {"input", read_inputs},
    {"output", read_outputs},
    {"dynamic_batching", read_dynamic_batching},
};

/* ---- parse ------------------------------------------------------------------------------ */

void pjs_load_config_free(pjs_load_config *c)
{
    if (c == NULL)
        return;
    json_decref(c->doc);
    free(c->text);
    free(c);
}

const char *pjs_load_config_text(const pjs_load_config *c)
{
    return c->text;
}

int pjs_load_config_parse(const char *model, const char *text, size_t len,
                          pjs_load_config **out, pjs_error *err)
{
    *out = NULL;
    if (len > PJS_LOAD_CONFIG_MAX_BYTES)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "config override: model %s: %zu bytes, more than the %u a config "
                             "may have",
                             model, len, PJS_LOAD_CONFIG_MAX_BYTES);
    pjs_load_config *c = calloc(1, sizeof *c);
    if (c == NULL || (c->text = malloc(len + 1)) == NULL) {
        free(c);
        return pjs_error_set(err, PJS_ERR_NOMEM, "config override: model %s: out of memory",
                             model);
    }
    memcpy(c->text, text, len);
    c->text[len] = '\0';
    c->default_timeout_us = -1;
    json_error_t jerr;
    c->doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (c->doc == NULL) {
        pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                      "config override: model %s: not a JSON ModelConfig: %s (line %d, column "
                      "%d)",
                      model, jerr.text, jerr.line, jerr.column);
        pjs_load_config_free(c);
        return PJS_ERR_INVALID_ARGUMENT;
    }
    walk w = {.model = model, .err = err, .c = c};
    int rc = walk_object(&w, "", c->doc, config_fields,
                         sizeof config_fields / sizeof config_fields[0]);
    if (rc == 0 && w.n_refused > 0)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "config override: model %s: pjserve cannot apply %s%s; it honours "
                           "max_batch_size, dynamic_batching (present: coalesce; absent: do "
                           "not) with default_queue_policy's default_timeout_microseconds and "
                           "max_queue_size, and accepts name, platform, backend, "
                           "version_policy, input and output that restate the model",
                           model, w.refused, w.refused_truncated ? " and more" : "");
    if (rc != 0) {
        pjs_load_config_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* ---- apply ------------------------------------------------------------------------------ */

/* "1, 4, 8" */
static const char *format_sizes(const pjs_manifest *man, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < man->n_batch_sizes && used < size; i++) {
        int n = snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "",
                         man->batch_sizes[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    return buf;
}

/* The bundle's own max_batch_size (registry/model.c's rule): its largest
 * compiled size when an input has a batch axis, else 0. */
static int64_t compiled_max_batch_size(const pjs_manifest *man)
{
    for (size_t i = 0; i < man->n_inputs; i++)
        if (man->inputs[i].batched)
            return man->batch_sizes[man->n_batch_sizes - 1];
    return 0;
}

/* The cap is 0 for a model without a batch axis, else one of its compiled
 * sizes: executions run at compiled sizes, so a cap between two of them
 * would let a coalesced execution hold more rows than it. */
static int check_cap(const char *model, const pjs_manifest *man, int64_t cap, size_t *n_served,
                     pjs_error *err)
{
    char sizes[256];
    int64_t own = compiled_max_batch_size(man);
    *n_served = man->n_batch_sizes;
    if (own == 0) {
        if (cap == 0)
            return 0;
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "config override: model %s: max_batch_size %" PRId64 ", but no "
                             "input of the model has a batch axis; it is served with "
                             "max_batch_size 0",
                             model, cap);
    }
    if (cap == 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "config override: model %s: max_batch_size 0 (or absent) would serve "
                             "it without a batch axis, but it is compiled with one (batch sizes "
                             "%s); give max_batch_size one of them",
                             model, format_sizes(man, sizes, sizeof sizes));
    if (cap > own)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "config override: model %s: max_batch_size %" PRId64 " is larger "
                             "than its largest compiled batch size (compiled: %s)",
                             model, cap, format_sizes(man, sizes, sizeof sizes));
    for (size_t i = 0; i < man->n_batch_sizes; i++) {
        if (man->batch_sizes[i] == cap) {
            *n_served = i + 1;
            return 0;
        }
    }
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "config override: model %s: max_batch_size %" PRId64 " is not one of "
                         "its compiled batch sizes (%s); pjserve runs executions at those sizes, "
                         "so a cap must be one of them",
                         model, cap, format_sizes(man, sizes, sizeof sizes));
}

static int check_dynamic_batching(const pjs_load_config *c, const char *model,
                                  const pjs_manifest *man, int64_t cap, size_t n_served,
                                  pjs_error *err)
{
    if (!c->dynamic_batching)
        return 0;
    if (!pjs_model_coalesces(man, cap))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "config override: model %s: dynamic_batching, but its requests "
                             "cannot be coalesced (%s); leave dynamic_batching out",
                             model,
                             cap == 0 ? "it has no batch axis"
                                      : "an input or output has no batch axis to join them on");
    size_t i;
    const json_t *s;
    json_array_foreach(c->preferred, i, s) {
        int64_t want = checked_int(s);
        size_t k = 0;
        while (k < n_served && man->batch_sizes[k] != want)
            k++;
        if (k == n_served) {
            char sizes[256];
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "config override: model %s: "
                                 "dynamic_batching.preferred_batch_size[%zu] is %" PRId64 ", not "
                                 "a compiled batch size up to max_batch_size %" PRId64
                                 " (compiled: %s); pjserve prefers every compiled size",
                                 model, i, want, cap, format_sizes(man, sizes, sizeof sizes));
        }
    }
    return 0;
}

/* Field `snake` of object t in either spelling, or NULL. */
static const json_t *field_value(const json_t *t, const char *snake)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)t, key, value)
        if (field_is(key, snake))
            return value;
    return NULL;
}

/* A string field the parse checked, or NULL when absent. */
static const char *string_field(const json_t *t, const char *snake)
{
    const json_t *v = field_value(t, snake);
    return v != NULL ? json_string_value(v) : NULL;
}

static int restate_error(pjs_error *err, const char *model, const char *what, size_t i,
                         const char *name, const char *key, const char *given, const char *own)
{
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "config override: model %s: %s[%zu] (\"%.64s\"): %s %s differs from "
                         "the model's %s; a config may restate inputs and outputs, not change "
                         "them",
                         model, what, i, name, key, given, own);
}

/* "[16, 3]" of dims[first..rank). */
static const char *format_dims(const pjs_shape *s, int first, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = first; d < s->rank && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, d > first ? ", " : "",
                                 s->dims[d]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

/* Checks config tensor t (element i of input or output) against the
 * model's tensor spec s, shown with shape `shape`. */
static int check_tensor(const json_t *t, size_t i, bool output, const pjs_tensor_spec *s,
                        pjs_shape shape, int64_t cap, const char *model, pjs_error *err)
{
    const char *what = output ? "output" : "input";
    char own[96], given[96];
    const char *dt = string_field(t, "data_type");
    snprintf(own, sizeof own, "TYPE_%s",
             s->dtype == PJS_DTYPE_BYTES ? "STRING" : pjs_dtype_kserve_name(s->dtype));
    if (dt != NULL && strcmp(dt, own) != 0) {
        snprintf(given, sizeof given, "\"%.64s\"", dt);
        return restate_error(err, model, what, i, s->name, "data_type", given, own);
    }
    const json_t *dims = field_value(t, "dims");
    int first = s->batched && cap > 0 ? 1 : 0;
    if (dims != NULL) {
        bool same = json_array_size(dims) == (size_t)(shape.rank - first);
        for (size_t d = 0; same && d < json_array_size(dims); d++) {
            same = checked_int(json_array_get(dims, d)) == shape.dims[first + (int)d];
        }
        if (!same) {
            char g[96];
            show(dims, g, sizeof g);
            return restate_error(err, model, what, i, s->name, "dims", g,
                          format_dims(&shape, first, own, sizeof own));
        }
    }
    const char *format = output ? NULL : string_field(t, "format");
    if (format != NULL && strcmp(format, pjs_tensor_format_name(s->format)) != 0) {
        snprintf(given, sizeof given, "\"%.64s\"", format);
        return restate_error(err, model, what, i, s->name, "format", given,
                      pjs_tensor_format_name(s->format));
    }
    const char *labels = output ? string_field(t, "label_filename") : NULL;
    const char *own_labels = s->labels != NULL ? s->labels->file : "";
    if (labels != NULL && strcmp(labels, own_labels) != 0) {
        snprintf(given, sizeof given, "\"%.64s\"", labels);
        snprintf(own, sizeof own, "\"%.64s\"", own_labels);
        return restate_error(err, model, what, i, s->name, "label_filename", given, own);
    }
    return 0;
}

static int check_tensors(const json_t *list, bool output, const char *model,
                         const pjs_manifest *man, int64_t cap, pjs_error *err)
{
    size_t n = 0;
    const pjs_tensor_spec *specs = pjs_manifest_client_tensors(man, output, &n);
    const char *what = output ? "output" : "input";
    bool seen[PJS_INFER_MAX_TENSORS] = {false};
    size_t i;
    const json_t *t;
    json_array_foreach(list, i, t) {
        const char *name = string_field(t, "name");
        size_t k = 0;
        while (k < n && strcmp(specs[k].name, name) != 0)
            k++;
        if (k == n) {
            char names[512] = "";
            size_t used = 0;
            for (size_t j = 0; j < n && used < sizeof names; j++)
                used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'",
                                         j ? ", " : "", specs[j].name);
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "config override: model %s: %s[%zu]: the model has no %s "
                                 "\"%.64s\" (its %ss: %s)",
                                 model, what, i, what, name, what, names);
        }
        if (k < PJS_INFER_MAX_TENSORS && seen[k])
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "config override: model %s: %s[%zu]: %s \"%.64s\" listed twice",
                                 model, what, i, what, name);
        if (k < PJS_INFER_MAX_TENSORS)
            seen[k] = true;
        int rc = check_tensor(t, i, output, &specs[k], pjs_manifest_client_shape(man, output, k),
                              cap, model, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int pjs_load_config_apply(const pjs_load_config *c, const char *model, const char *platform,
                          const pjs_manifest *man, pjs_load_override *out, pjs_error *err)
{
    if (c->name != NULL && strcmp(c->name, model) != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "config override: name \"%.64s\" is not the model being loaded "
                             "(\"%s\")",
                             c->name, model);
    if (c->platform != NULL && c->platform[0] != '\0' && strcmp(c->platform, platform) != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "config override: model %s: platform \"%.64s\" is not the one it "
                             "is served on (\"%s\"); leave it out or restate it",
                             model, c->platform, platform);
    if (c->backend != NULL && c->backend[0] != '\0' && strcmp(c->backend, "pjserve") != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "config override: model %s: backend \"%.64s\": pjserve is the only "
                             "backend (\"pjserve\"); leave it out or restate it",
                             model, c->backend);
    size_t n_served;
    int rc = check_cap(model, man, c->max_batch_size, &n_served, err);
    if (rc == 0)
        rc = check_dynamic_batching(c, model, man, c->max_batch_size, n_served, err);
    if (rc == 0 && c->inputs != NULL)
        rc = check_tensors(c->inputs, false, model, man, c->max_batch_size, err);
    if (rc == 0 && c->outputs != NULL)
        rc = check_tensors(c->outputs, true, model, man, c->max_batch_size, err);
    if (rc != 0)
        return rc;
    *out = (pjs_load_override){
        .max_batch_size = c->max_batch_size,
        .n_served_sizes = n_served,
        .coalesce = c->dynamic_batching,
        .default_timeout_us = c->default_timeout_us,
        .max_queue_depth = (size_t)c->max_queue_size,
    };
    return 0;
}

/* Why the path of a `file:` override could not be a file inside a model
 * directory (empty, absolute, a ".." or empty component, a component longer
 * than a file name may be), or NULL when it could. */
static const char *file_path_problem(const char *path)
{
    if (*path == '\0')
        return "it is empty";
    if (*path == '/')
        return "it is absolute";
    if (strlen(path) > 4095)
        return "it is longer than 4095 bytes";
    for (const char *p = path; *p != '\0';) {
        size_t len = strcspn(p, "/");
        if (len == 0 || (len == 2 && p[0] == '.' && p[1] == '.'))
            return "it has an empty or \"..\" component";
        if (len > 255)
            return "a component is longer than the 255 bytes a file name may have";
        p += len + (p[len] == '/');
    }
    return NULL;
}

int pjs_load_parameter_check(const char *model, const char *key, pjs_error *err)
{
    if (strncmp(key, "file:", 5) != 0)
        return 0;
    /* A path no model directory could hold fails as Triton's does when it
     * writes the files (INTERNAL, the words its clients look for). */
    const char *problem = file_path_problem(key + 5);
    if (problem != NULL)
        return pjs_error_set(err, PJS_ERR_IO,
                             "model %s: failed to poll from model repository: load parameter "
                             "\"%.64s%s\" cannot name a file in a model directory: %s",
                             model, key, strlen(key) > 64 ? "..." : "", problem);
    return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                         "model %s: load parameter \"%.128s\" refused: pjserve takes no model "
                         "files in a load request, since that would let a client write files "
                         "into the model repository; put the bundle into the repository and "
                         "load it by name (a \"config\" override alone is honoured)",
                         model, key);
}
