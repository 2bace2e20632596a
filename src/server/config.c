/*
 * config.c - the server's configuration (see config.h and the Configuration
 * section of docs/serving.md).
 *
 * Every setting is read by one function per table (set_sched_key,
 * set_model_key, set_meta_key) from a YAML node: a node of the file, or, for environment
 * variables and flags, a plain scalar made from their text
 * (pjs_yaml_text_scalar), so all three origins follow the same rules and say
 * the same words. Integer settings are range-checked here; after each
 * scheduler setting the whole pjs_sched_config goes through
 * pjs_sched_config_check, so a value out of range is reported where it was
 * given (file and line, variable, or flag).
 *
 * Each public function works on a copy and replaces the caller's
 * configuration only on success. No global state.
 */
#include "server/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mapped_file.h"
#include "core/yaml_strict.h"
#include "server/server.h" /* PJS_DEFAULT_META_CONCURRENCY */

#define WARMUP_RUNS_MAX 100

enum sched_key {
    S_DISCIPLINE, S_HALF_LIFE_MS, S_COALESCE_DISCOUNT, S_FAIR_CLAMP, S_COST_SMOOTHING,
    S_EDF_LAXITY_MARGIN_US, S_MAX_QUEUE_DEPTH, S_DEFAULT_TIMEOUT_US, S_WARMUP_RUNS,
    S_COLD_MODEL_DEFER_MS, S_EVICTION_POLICY, S_WEIGHT_PREFETCH, S_HAND_OFF, S_COUNT
};

static const char *const sched_keys[S_COUNT] = {
    [S_DISCIPLINE] = "discipline",
    [S_HALF_LIFE_MS] = "half_life_ms",
    [S_COALESCE_DISCOUNT] = "coalesce_discount",
    [S_FAIR_CLAMP] = "fair_clamp",
    [S_COST_SMOOTHING] = "cost_smoothing",
    [S_EDF_LAXITY_MARGIN_US] = "edf_laxity_margin_us",
    [S_MAX_QUEUE_DEPTH] = "max_queue_depth",
    [S_DEFAULT_TIMEOUT_US] = "default_timeout_us",
    [S_WARMUP_RUNS] = "warmup_runs",
    [S_COLD_MODEL_DEFER_MS] = "cold_model_defer_ms",
    [S_EVICTION_POLICY] = "eviction_policy",
    [S_WEIGHT_PREFETCH] = "weight_prefetch",
    [S_HAND_OFF] = "hand_off",
};

enum model_key { M_WEIGHT, M_MAX_QUEUE_DEPTH, M_DEFAULT_TIMEOUT_US, M_COUNT };

static const char *const model_keys[M_COUNT] = {
    [M_WEIGHT] = "weight",
    [M_MAX_QUEUE_DEPTH] = "max_queue_depth",
    [M_DEFAULT_TIMEOUT_US] = "default_timeout_us",
};

enum meta_key { MT_CONCURRENCY, MT_SCRATCH_BYTES, MT_COUNT };

static const char *const meta_keys[MT_COUNT] = {
    [MT_CONCURRENCY] = "concurrency",
    [MT_SCRATCH_BYTES] = "scratch_bytes",
};

/* ---- the configuration as a value ------------------------------------------ */

void pjs_server_config_init(pjs_server_config *c)
{
    memset(c, 0, sizeof *c);
    pjs_sched_config_defaults(&c->sched);
    c->meta.concurrency = PJS_DEFAULT_META_CONCURRENCY;
}

void pjs_server_config_free(pjs_server_config *c)
{
    for (size_t i = 0; i < c->n_models; i++)
        free(c->models[i].name);
    free(c->models);
    c->models = NULL;
    c->n_models = 0;
}

/* dst = a deep copy of src; dst holds nothing on failure. */
static int config_copy(pjs_server_config *dst, const pjs_server_config *src, pjs_error *err)
{
    *dst = (pjs_server_config){.sched = src->sched, .meta = src->meta};
    if (src->n_models == 0)
        return 0;
    dst->models = calloc(src->n_models, sizeof *dst->models);
    if (dst->models == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "configuration: out of memory");
    for (size_t i = 0; i < src->n_models; i++) {
        dst->models[i] = src->models[i];
        dst->models[i].name = strdup(src->models[i].name);
        dst->n_models = i + 1;
        if (dst->models[i].name == NULL) {
            pjs_server_config_free(dst);
            return pjs_error_set(err, PJS_ERR_NOMEM, "configuration: out of memory");
        }
    }
    return 0;
}

/* Frees c and moves tmp into it. */
static void config_replace(pjs_server_config *c, pjs_server_config *tmp)
{
    pjs_server_config_free(c);
    *c = *tmp;
    *tmp = (pjs_server_config){0};
}

const pjs_model_policy *pjs_server_config_model(const pjs_server_config *c, const char *name)
{
    for (size_t i = 0; i < c->n_models; i++)
        if (strcmp(c->models[i].name, name) == 0)
            return &c->models[i];
    return NULL;
}

/* The policy of `name`, added with every setting inherited when there is
 * none; NULL when out of memory. */
static pjs_model_policy *model_find_or_add(pjs_server_config *c, const char *name)
{
    pjs_model_policy *p = (pjs_model_policy *)pjs_server_config_model(c, name);
    if (p != NULL)
        return p;
    pjs_model_policy *v = realloc(c->models, (c->n_models + 1) * sizeof *v);
    if (v == NULL)
        return NULL;
    c->models = v;
    p = &v[c->n_models];
    *p = (pjs_model_policy){.name = strdup(name), .default_timeout_us = -1};
    if (p->name == NULL)
        return NULL;
    c->n_models++;
    return p;
}

/* ---- one setting ------------------------------------------------------------- */

static int get_int_in(pjs_yaml *y, const yaml_node_t *n, const char *path, int64_t min,
                      int64_t max, int64_t *out)
{
    int rc = pjs_yaml_get_int(y, n, path, out);
    if (rc == 0 && (*out < min || *out > max))
        return pjs_yaml_fail(y, n, path, "must be in %lld..%lld, got %lld", (long long)min,
                             (long long)max, (long long)*out);
    return rc;
}

/* A keyword setting: the scalar's text through parse (-1: not one of its
 * words), refused as "X is not <what> (expected <words>)". */
static int get_keyword(pjs_yaml *y, const yaml_node_t *n, const char *path,
                       int (*parse)(const char *), const char *what, const char *words,
                       int *out)
{
    int rc = pjs_yaml_get_string(y, n, path);
    if (rc != 0)
        return rc;
    char text[16];
    int v = -1;
    if (n->data.scalar.length < sizeof text) {
        memcpy(text, n->data.scalar.value, n->data.scalar.length);
        text[n->data.scalar.length] = '\0';
        v = parse(text);
    }
    char q[PJS_YAML_QUOTE_MAX];
    if (v < 0)
        return pjs_yaml_fail(y, n, path, "%s is not %s (expected %s)",
                             pjs_yaml_quote_node(n, q, sizeof q), what, words);
    *out = v;
    return 0;
}

/* Reads scheduler setting k from n into *s, which is left unchanged on
 * error (a value of the right type but out of range included). */
static int set_sched_key(pjs_yaml *y, pjs_sched_config *s, enum sched_key k, const yaml_node_t *n)
{
    char path[PJS_YAML_PATH_MAX];
    pjs_yaml_path_key(path, "scheduler", sched_keys[k]);
    pjs_sched_config v = *s;
    int64_t i = 0;
    int i32 = 0;
    double ms = 0;
    int rc = 0;
    switch (k) {
    case S_DISCIPLINE:
        rc = get_keyword(y, n, path, pjs_discipline_parse, "a discipline", "fair, fifo or edf",
                         &i32);
        v.discipline = (pjs_discipline)i32;
        break;
    case S_HALF_LIFE_MS:
        rc = pjs_yaml_get_number(y, n, path, &ms);
        v.half_life_s = ms / 1000;
        break;
    case S_COALESCE_DISCOUNT: rc = pjs_yaml_get_number(y, n, path, &v.coalesce_discount); break;
    case S_FAIR_CLAMP: rc = pjs_yaml_get_number(y, n, path, &v.fair_clamp); break;
    case S_COST_SMOOTHING: rc = pjs_yaml_get_number(y, n, path, &v.cost_smoothing); break;
    case S_EDF_LAXITY_MARGIN_US:
        rc = get_int_in(y, n, path, 0, PJS_CONFIG_MAX_DURATION_US, &i);
        v.edf_laxity_margin_us = (uint64_t)i;
        break;
    case S_MAX_QUEUE_DEPTH:
        rc = get_int_in(y, n, path, 1, PJS_CONFIG_MAX_QUEUE_DEPTH, &i);
        v.max_queue_depth = (size_t)i;
        break;
    case S_DEFAULT_TIMEOUT_US:
        rc = get_int_in(y, n, path, 0, PJS_CONFIG_MAX_DURATION_US, &i);
        v.default_timeout_us = (uint64_t)i;
        break;
    case S_WARMUP_RUNS:
        rc = get_int_in(y, n, path, 0, WARMUP_RUNS_MAX, &i);
        v.warmup_runs = (int)i;
        break;
    case S_COLD_MODEL_DEFER_MS:
        rc = pjs_yaml_get_number(y, n, path, &v.cold_model_defer_ms);
        break;
    case S_EVICTION_POLICY:
        rc = get_keyword(y, n, path, pjs_eviction_parse, "an eviction policy", "lfu or lru", &i32);
        v.eviction = (pjs_eviction)i32;
        break;
    case S_WEIGHT_PREFETCH: rc = pjs_yaml_get_bool(y, n, path, &v.weight_prefetch); break;
    case S_HAND_OFF:
        rc = get_keyword(y, n, path, pjs_hand_off_parse, "a hand-off setting", "on or off", &i32);
        v.hand_off = (pjs_hand_off)i32;
        break;
    case S_COUNT: break;
    }
    if (rc != 0)
        return rc;
    pjs_error check;
    char q[PJS_YAML_QUOTE_MAX];
    if (pjs_sched_config_check(&v, &check) != 0) /* its message starts with the key */
        return pjs_yaml_fail(y, n, "", "%s, got %s", check.msg,
                             pjs_yaml_quote_node(n, q, sizeof q));
    *s = v;
    return 0;
}

/* Reads model setting k of model `name` from n into *p (unchanged on error). */
static int set_model_key(pjs_yaml *y, pjs_model_policy *p, const char *name, enum model_key k,
                         const yaml_node_t *n)
{
    char path[PJS_YAML_PATH_MAX];
    pjs_yaml_path_set(path, "models.%s.%s", name, model_keys[k]);
    int64_t i = 0;
    int rc = 0;
    switch (k) {
    case M_WEIGHT: rc = pjs_yaml_get_positive_number(y, n, path, &p->weight); break;
    case M_MAX_QUEUE_DEPTH:
        if ((rc = get_int_in(y, n, path, 1, PJS_CONFIG_MAX_QUEUE_DEPTH, &i)) == 0)
            p->max_queue_depth = (size_t)i;
        break;
    case M_DEFAULT_TIMEOUT_US:
        if ((rc = get_int_in(y, n, path, 0, PJS_CONFIG_MAX_DURATION_US, &i)) == 0)
            p->default_timeout_us = i;
        break;
    case M_COUNT: break;
    }
    return rc;
}

bool pjs_server_config_parse_bytes(const char *text, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t scale;
    } units[] = {{"", 1},           {"K", 1000},        {"M", 1000000},     {"G", 1000000000},
                 {"Ki", 1ULL << 10}, {"Mi", 1ULL << 20}, {"Gi", 1ULL << 30}};
    uint64_t v = 0;
    const char *s = text;
    if (*s < '0' || *s > '9')
        return false;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    size_t len = strlen(s);
    if (len > 0 && s[len - 1] == 'B')
        len--; /* "64MiB" as "64Mi", "4096B" as "4096" */
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strlen(units[i].suffix) == len && memcmp(s, units[i].suffix, len) == 0) {
            if (v > UINT64_MAX / units[i].scale)
                return false;
            *out = v * units[i].scale;
            return true;
        }
    return false;
}

/* A byte count (pjs_server_config_parse_bytes) in 0..max, from any scalar:
 * "64Mi" may be quoted or not. */
static int get_bytes_in(pjs_yaml *y, const yaml_node_t *n, const char *path, uint64_t max,
                        uint64_t *out)
{
    int rc = pjs_yaml_get_string(y, n, path);
    if (rc != 0)
        return rc;
    char text[32], q[PJS_YAML_QUOTE_MAX];
    uint64_t v = 0;
    bool ok = n->data.scalar.length < sizeof text;
    if (ok) {
        memcpy(text, n->data.scalar.value, n->data.scalar.length);
        text[n->data.scalar.length] = '\0';
        ok = pjs_server_config_parse_bytes(text, &v);
    }
    if (!ok)
        return pjs_yaml_fail(y, n, path,
                             "must be a number of bytes, optionally followed by K, M, G "
                             "(powers of 1000) or Ki, Mi, Gi (powers of 1024) and B, got %s",
                             pjs_yaml_quote_node(n, q, sizeof q));
    if (v > max)
        return pjs_yaml_fail(y, n, path, "must be at most %llu bytes, got %s",
                             (unsigned long long)max, pjs_yaml_quote_node(n, q, sizeof q));
    *out = v;
    return 0;
}

/* Reads meta setting k from n into *m (unchanged on error). */
static int set_meta_key(pjs_yaml *y, pjs_meta_config *m, enum meta_key k, const yaml_node_t *n)
{
    char path[PJS_YAML_PATH_MAX];
    pjs_yaml_path_key(path, "meta", meta_keys[k]);
    int64_t i = 0;
    int rc = 0;
    switch (k) {
    case MT_CONCURRENCY:
        if ((rc = get_int_in(y, n, path, 1, PJS_CONFIG_MAX_META_CONCURRENCY, &i)) == 0)
            m->concurrency = (int)i;
        break;
    case MT_SCRATCH_BYTES:
        rc = get_bytes_in(y, n, path, PJS_CONFIG_MAX_SCRATCH_BYTES, &m->scratch_bytes);
        break;
    case MT_COUNT: break;
    }
    return rc;
}

/* ---- the file ---------------------------------------------------------------- */

static int apply_scheduler(pjs_yaml *y, const yaml_node_t *n, pjs_sched_config *s)
{
    pjs_yaml_field f[S_COUNT];
    for (size_t k = 0; k < S_COUNT; k++)
        f[k] = (pjs_yaml_field){sched_keys[k], NULL};
    int rc = pjs_yaml_get_fields(y, n, "scheduler", f, S_COUNT);
    for (size_t k = 0; rc == 0 && k < S_COUNT; k++)
        if (f[k].value != NULL)
            rc = set_sched_key(y, s, (enum sched_key)k, f[k].value);
    return rc;
}

/* models.<name>: a mapping of model keys, or null (a policy inheriting all). */
static int apply_model(pjs_yaml *y, const yaml_node_t *key, const yaml_node_t *value,
                       pjs_server_config *c)
{
    char *name = NULL;
    int rc = pjs_yaml_get_name(y, key, "models", &name);
    if (rc != 0)
        return rc;
    char path[PJS_YAML_PATH_MAX];
    pjs_yaml_path_key(path, "models", name);
    pjs_yaml_field f[M_COUNT];
    for (size_t k = 0; k < M_COUNT; k++)
        f[k] = (pjs_yaml_field){model_keys[k], NULL};
    if (!pjs_yaml_is_null(value))
        rc = pjs_yaml_get_fields(y, value, path, f, M_COUNT);
    pjs_model_policy *p = rc == 0 ? model_find_or_add(c, name) : NULL;
    if (rc == 0 && p == NULL)
        rc = pjs_yaml_fail_nomem(y, path);
    for (size_t k = 0; rc == 0 && k < M_COUNT; k++)
        if (f[k].value != NULL)
            rc = set_model_key(y, p, name, (enum model_key)k, f[k].value);
    free(name);
    return rc;
}

static int apply_meta(pjs_yaml *y, const yaml_node_t *n, pjs_meta_config *m)
{
    pjs_yaml_field f[MT_COUNT];
    for (size_t k = 0; k < MT_COUNT; k++)
        f[k] = (pjs_yaml_field){meta_keys[k], NULL};
    int rc = pjs_yaml_get_fields(y, n, "meta", f, MT_COUNT);
    for (size_t k = 0; rc == 0 && k < MT_COUNT; k++)
        if (f[k].value != NULL)
            rc = set_meta_key(y, m, (enum meta_key)k, f[k].value);
    return rc;
}

static int apply_models(pjs_yaml *y, const yaml_node_t *n, pjs_server_config *c)
{
    size_t count = 0;
    int rc = pjs_yaml_get_map(y, n, "models", &count);
    for (size_t i = 0; rc == 0 && i < count; i++) {
        yaml_node_t *key = NULL, *value = NULL;
        pjs_yaml_map_entry(y, n, i, &key, &value);
        rc = apply_model(y, key, value, c);
    }
    return rc;
}

/* The top level: `scheduler`, `models` and `meta`, each optional and each
 * may be empty (null), so a file of commented-out settings is valid. */
static int apply_root(pjs_yaml *y, const yaml_node_t *root, pjs_server_config *c)
{
    if (pjs_yaml_is_null(root))
        return 0;
    if (root->type != YAML_MAPPING_NODE)
        return pjs_yaml_fail(y, root, "", "the top level must be a mapping, got %s",
                             pjs_yaml_kind_name(root));
    pjs_yaml_field f[] = {{"scheduler", NULL}, {"models", NULL}, {"meta", NULL}};
    int rc = pjs_yaml_get_fields(y, root, "", f, 3);
    if (rc == 0 && f[0].value != NULL && !pjs_yaml_is_null(f[0].value))
        rc = apply_scheduler(y, f[0].value, &c->sched);
    if (rc == 0 && f[1].value != NULL && !pjs_yaml_is_null(f[1].value))
        rc = apply_models(y, f[1].value, c);
    if (rc == 0 && f[2].value != NULL && !pjs_yaml_is_null(f[2].value))
        rc = apply_meta(y, f[2].value, &c->meta);
    return rc;
}

int pjs_server_config_parse(pjs_server_config *c, const char *yaml, size_t len,
                            const char *label, pjs_error *err)
{
    if (label == NULL)
        label = "configuration";
    if (yaml == NULL && len > 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: no configuration bytes", label);
    if (len > PJS_CONFIG_MAX_BYTES)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: %zu bytes, more than the %u allowed",
                             label, len, PJS_CONFIG_MAX_BYTES);
    pjs_server_config tmp = {0};
    pjs_yaml y;
    yaml_node_t *root = NULL;
    int rc = pjs_yaml_load(&y, yaml != NULL ? yaml : "", len, label, err, &root);
    if (rc == 0)
        rc = config_copy(&tmp, c, err);
    if (rc == 0 && root != NULL)
        rc = apply_root(&y, root, &tmp);
    if (rc == 0)
        config_replace(c, &tmp);
    pjs_server_config_free(&tmp);
    pjs_yaml_free(&y);
    return rc;
}

int pjs_server_config_load_file(pjs_server_config *c, const char *path, pjs_error *err)
{
    char *data = NULL;
    size_t size = 0;
    int rc = pjs_read_file(path, PJS_CONFIG_MAX_BYTES, &data, &size, err);
    if (rc == 0)
        rc = pjs_server_config_parse(c, data, size, path, err);
    free(data);
    return rc;
}

/* ---- text: environment and flags -------------------------------------------- */

static int find_key(const char *const *keys, size_t n, const char *key, size_t len)
{
    for (size_t k = 0; k < n; k++)
        if (strlen(keys[k]) == len && memcmp(keys[k], key, len) == 0)
            return (int)k;
    return -1;
}

/* models.<name>.<key> = value: the name is everything up to the last dot
 * (names may contain dots, keys do not). */
static int set_model_text(pjs_yaml *y, pjs_server_config *c, const char *rest,
                          const yaml_node_t *value, const char *key)
{
    const char *dot = strrchr(rest, '.');
    int k = dot != NULL ? find_key(model_keys, M_COUNT, dot + 1, strlen(dot + 1)) : -1;
    char q[PJS_YAML_QUOTE_MAX];
    if (k < 0)
        return pjs_yaml_fail(y, NULL, "", "unknown setting %s (a model has weight, "
                             "max_queue_depth and default_timeout_us)",
                             pjs_yaml_quote(key, strlen(key), q, sizeof q));
    char *text = strndup(rest, (size_t)(dot - rest)), *name = NULL;
    if (text == NULL)
        return pjs_yaml_fail_nomem(y, key);
    yaml_node_t name_node;
    pjs_yaml_text_scalar(&name_node, text);
    int rc = pjs_yaml_get_name(y, &name_node, "models", &name);
    pjs_model_policy v = {.default_timeout_us = -1};
    const pjs_model_policy *old = rc == 0 ? pjs_server_config_model(c, name) : NULL;
    if (old != NULL)
        v = *old;
    if (rc == 0)
        rc = set_model_key(y, &v, name, (enum model_key)k, value);
    pjs_model_policy *p = rc == 0 ? model_find_or_add(c, name) : NULL;
    if (rc == 0 && p == NULL)
        rc = pjs_yaml_fail_nomem(y, key);
    if (rc == 0) {
        v.name = p->name;
        *p = v;
    }
    free(name);
    free(text);
    return rc;
}

int pjs_server_config_set(pjs_server_config *c, const char *key, const char *value,
                          const char *origin, pjs_error *err)
{
    pjs_yaml y;
    pjs_yaml_init_text(&y, origin, err);
    yaml_node_t n;
    pjs_yaml_text_scalar(&n, value);
    static const char scheduler[] = "scheduler.", models[] = "models.", meta[] = "meta.";
    if (strncmp(key, scheduler, sizeof scheduler - 1) == 0) {
        const char *k = key + sizeof scheduler - 1;
        int i = find_key(sched_keys, S_COUNT, k, strlen(k));
        if (i >= 0)
            return set_sched_key(&y, &c->sched, (enum sched_key)i, &n);
    } else if (strncmp(key, meta, sizeof meta - 1) == 0) {
        const char *k = key + sizeof meta - 1;
        int i = find_key(meta_keys, MT_COUNT, k, strlen(k));
        if (i >= 0)
            return set_meta_key(&y, &c->meta, (enum meta_key)i, &n);
    } else if (strncmp(key, models, sizeof models - 1) == 0) {
        return set_model_text(&y, c, key + sizeof models - 1, &n, key);
    }
    char q[PJS_YAML_QUOTE_MAX];
    return pjs_yaml_fail(&y, NULL, "", "unknown setting %s",
                         pjs_yaml_quote(key, strlen(key), q, sizeof q));
}

/* The settings an environment variable prefix reaches. */
typedef struct env_section {
    const char *prefix;      /* "PJSERVE_SCHEDULER_" */
    const char *what;        /* "a scheduler setting" */
    const char *const *keys;
    size_t n_keys;
} env_section;

static const env_section env_sections[] = {
    {"PJSERVE_SCHEDULER_", "a scheduler setting", sched_keys, S_COUNT},
    {"PJSERVE_META_", "a meta model setting", meta_keys, MT_COUNT},
};

/* The section's keys in upper case, "DISCIPLINE, HALF_LIFE_MS, ...", for the
 * message about an unknown variable. */
static void env_names(const env_section *sec, char *buf, size_t size)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < sec->n_keys && o + 1 < size; k++) {
        if (k > 0)
            o += (size_t)snprintf(buf + o, size - o, ", ");
        for (const char *s = sec->keys[k]; *s != '\0' && o + 1 < size; s++)
            buf[o++] = (char)(*s >= 'a' && *s <= 'z' ? *s - 'a' + 'A' : *s);
        buf[o] = '\0';
    }
}

/* Applies one "<prefix><KEY>=value" entry of section sec to c. */
static int apply_env_entry(pjs_server_config *c, const env_section *sec, const char *entry,
                           pjs_error *err)
{
    const char *eq = strchr(entry, '=');
    size_t name_len = eq != NULL ? (size_t)(eq - entry) : strlen(entry);
    const char *suffix = entry + strlen(sec->prefix);
    size_t suffix_len = name_len - strlen(sec->prefix);
    char lower[64];
    int k = -1;
    if (suffix_len < sizeof lower) {
        /* Variable names are exact: a lower-case letter matches no key. */
        for (size_t i = 0; i < suffix_len; i++)
            lower[i] = (char)(suffix[i] >= 'A' && suffix[i] <= 'Z' ? suffix[i] - 'A' + 'a'
                              : suffix[i] >= 'a' && suffix[i] <= 'z' ? '?'
                                                                     : suffix[i]);
        k = find_key(sec->keys, sec->n_keys, lower, suffix_len);
    }
    char name[96], q[PJS_YAML_QUOTE_MAX];
    if (k < 0) {
        char names[256];
        env_names(sec, names, sizeof names);
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "environment variable %s is not %s (expected %s<KEY>, KEY one of "
                             "%s)",
                             pjs_yaml_quote(entry, name_len, q, sizeof q), sec->what,
                             sec->prefix, names);
    }
    snprintf(name, sizeof name, "%s%.*s", sec->prefix, (int)suffix_len, suffix);
    pjs_yaml y;
    pjs_yaml_init_text(&y, name, err);
    yaml_node_t n;
    pjs_yaml_text_scalar(&n, eq != NULL ? eq + 1 : "");
    if (sec->keys == meta_keys)
        return set_meta_key(&y, &c->meta, (enum meta_key)k, &n);
    return set_sched_key(&y, &c->sched, (enum sched_key)k, &n);
}

int pjs_server_config_apply_env(pjs_server_config *c, char *const *envp, pjs_error *err)
{
    /* Settings only: the model policies (which own memory) are not touched. */
    pjs_server_config tmp = {.sched = c->sched, .meta = c->meta};
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        for (size_t s = 0; s < sizeof env_sections / sizeof env_sections[0]; s++) {
            const env_section *sec = &env_sections[s];
            if (strncmp(envp[i], sec->prefix, strlen(sec->prefix)) != 0)
                continue;
            int rc = apply_env_entry(&tmp, sec, envp[i], err);
            if (rc != 0)
                return rc;
        }
    }
    c->sched = tmp.sched;
    c->meta = tmp.meta;
    return 0;
}

/* ---- checks and descriptions -------------------------------------------------- */

int pjs_server_config_check(const pjs_server_config *c, pjs_error *err)
{
    int rc = pjs_sched_config_check(&c->sched, err);
    if (rc != 0)
        return rc;
    if (c->sched.max_queue_depth > PJS_CONFIG_MAX_QUEUE_DEPTH)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.max_queue_depth: must be in 1..%d, got %zu",
                             PJS_CONFIG_MAX_QUEUE_DEPTH, c->sched.max_queue_depth);
    if (c->sched.default_timeout_us > (uint64_t)PJS_CONFIG_MAX_DURATION_US)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.default_timeout_us: must be in 0..%lld, got %llu",
                             PJS_CONFIG_MAX_DURATION_US,
                             (unsigned long long)c->sched.default_timeout_us);
    if (c->sched.edf_laxity_margin_us > (uint64_t)PJS_CONFIG_MAX_DURATION_US)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.edf_laxity_margin_us: must be in 0..%lld, got %llu",
                             PJS_CONFIG_MAX_DURATION_US,
                             (unsigned long long)c->sched.edf_laxity_margin_us);
    if (c->meta.concurrency < 1 || c->meta.concurrency > PJS_CONFIG_MAX_META_CONCURRENCY)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "meta.concurrency: must be in 1..%d, got %d",
                             PJS_CONFIG_MAX_META_CONCURRENCY, c->meta.concurrency);
    if (c->meta.scratch_bytes > PJS_CONFIG_MAX_SCRATCH_BYTES)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "meta.scratch_bytes: must be at most %llu bytes, got %llu",
                             PJS_CONFIG_MAX_SCRATCH_BYTES,
                             (unsigned long long)c->meta.scratch_bytes);
    for (size_t i = 0; i < c->n_models; i++) {
        const pjs_model_policy *p = &c->models[i];
        if (p->name == NULL || p->name[0] == '\0')
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "models: a policy has no name");
        if (!(p->weight >= 0) || !isfinite(p->weight))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "models.%s.weight: must be a positive finite number, got %g",
                                 p->name, p->weight);
        if (p->max_queue_depth > PJS_CONFIG_MAX_QUEUE_DEPTH)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "models.%s.max_queue_depth: must be in 1..%d, got %zu", p->name,
                                 PJS_CONFIG_MAX_QUEUE_DEPTH, p->max_queue_depth);
        if (p->default_timeout_us < -1 || p->default_timeout_us > PJS_CONFIG_MAX_DURATION_US)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "models.%s.default_timeout_us: must be in 0..%lld, got %lld",
                                 p->name, PJS_CONFIG_MAX_DURATION_US,
                                 (long long)p->default_timeout_us);
    }
    return 0;
}

static void describe_timeout(char *buf, size_t size, uint64_t us)
{
    if (us == 0)
        snprintf(buf, size, "none");
    else
        snprintf(buf, size, "%llu us", (unsigned long long)us);
}

void pjs_server_config_describe(const pjs_server_config *c, char *buf, size_t size)
{
    const pjs_sched_config *s = &c->sched;
    char timeout[32];
    describe_timeout(timeout, sizeof timeout, s->default_timeout_us);
    snprintf(buf, size,
             "scheduler: %s, half-life %g ms, coalesce discount %g, fair clamp %g, cost "
             "smoothing %g, edf laxity margin %llu us, max queue depth %zu per model, default "
             "timeout %s, warm-up runs %d, cold models deferred up to %g ms, %s eviction, "
             "weight prefetch %s, hand-off %s, %zu model %s",
             pjs_discipline_name(s->discipline), s->half_life_s * 1000, s->coalesce_discount,
             s->fair_clamp, s->cost_smoothing, (unsigned long long)s->edf_laxity_margin_us,
             s->max_queue_depth, timeout, s->warmup_runs, s->cold_model_defer_ms,
             pjs_eviction_name(s->eviction), s->weight_prefetch ? "on" : "off",
             pjs_hand_off_name(s->hand_off), c->n_models,
             c->n_models == 1 ? "policy" : "policies");
}

void pjs_model_policy_describe(const pjs_model_policy *p, char *buf, size_t size)
{
    char parts[3][48];
    size_t n = 0;
    if (p->weight > 0)
        snprintf(parts[n++], sizeof parts[0], "weight %g", p->weight);
    if (p->max_queue_depth > 0)
        snprintf(parts[n++], sizeof parts[0], "max queue depth %zu", p->max_queue_depth);
    if (p->default_timeout_us >= 0) {
        char t[32];
        describe_timeout(t, sizeof t, (uint64_t)p->default_timeout_us);
        snprintf(parts[n++], sizeof parts[0], "default timeout %s", t);
    }
    if (n == 0)
        snprintf(buf, size, "model policy %s: the scheduler's defaults", p->name);
    else
        snprintf(buf, size, "model policy %s: %s%s%s%s%s", p->name, parts[0],
                 n > 1 ? ", " : "", n > 1 ? parts[1] : "", n > 2 ? ", " : "",
                 n > 2 ? parts[2] : "");
}

void pjs_meta_config_describe(const pjs_meta_config *m, char *buf, size_t size)
{
    char pool[64];
    if (m->scratch_bytes == 0)
        snprintf(pool, sizeof pool, "no scratch pool (plain memory)");
    else
        snprintf(pool, sizeof pool, "scratch pool %llu bytes",
                 (unsigned long long)m->scratch_bytes);
    snprintf(buf, size, "meta models: %d %s (compute-only metas take none), %s",
             m->concurrency, m->concurrency == 1 ? "permit" : "permits", pool);
}
