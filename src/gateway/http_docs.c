/*
 * http_docs.c - metrics relabelling, index and statistics merging, and the
 * sequence id scan of the gateway's HTTP proxy (see http_docs.h).
 *
 * Metrics. The text format wants every sample of a family together, after
 * its HELP and TYPE, so the texts are not simply concatenated: one pass
 * over every text records, per family (in order of first appearance), its
 * HELP and TYPE lines and where each of its sample lines is; a second pass
 * writes them out family by family. A sample belongs to the family whose
 * HELP or TYPE came last when its name is that family's name or extends it
 * with '_' (histogram buckets, sums and counts); otherwise to the family of
 * its own name. Families are found by name through an open-addressing hash.
 *
 * The sequence scan walks the object's top level, skipping values by their
 * brackets and strings without building them, and looks inside
 * "parameters" only: its cost is one pass over the bytes before
 * "parameters" (usually a few hundred), never a JSON decode of the tensors.
 */
#include "gateway/http_docs.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- metrics ---------------------------------------------------------------- */

typedef struct span {
    const char *p;
    size_t len;
} span;

typedef struct sample_ref {
    span line;
    unsigned worker;
} sample_ref;

typedef struct family {
    span name;
    span help, type; /* whole lines; len 0: none seen */
    sample_ref *samples;
    size_t n_samples, cap_samples;
} family;

typedef struct family_table {
    family *families; /* in order of first appearance */
    size_t n, cap;
    uint32_t *slots; /* index + 1 into families; 0: empty */
    size_t n_slots;  /* a power of two, at least twice n */
} family_table;

static uint64_t hash_name(span s)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < s.len; i++)
        h = (h ^ (unsigned char)s.p[i]) * 1099511628211ull;
    return h;
}

static bool span_eq(span a, span b)
{
    return a.len == b.len && memcmp(a.p, b.p, a.len) == 0;
}

static int grow_slots(family_table *t)
{
    size_t n_slots = t->n_slots ? t->n_slots * 2 : 64;
    uint32_t *slots = calloc(n_slots, sizeof *slots);
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < t->n; i++) {
        size_t k = hash_name(t->families[i].name) & (n_slots - 1);
        while (slots[k] != 0)
            k = (k + 1) & (n_slots - 1);
        slots[k] = (uint32_t)i + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->n_slots = n_slots;
    return 0;
}

/* The family called `name`, added when new; NULL: out of memory. */
static family *family_get(family_table *t, span name)
{
    if (2 * (t->n + 1) > t->n_slots && grow_slots(t) != 0)
        return NULL;
    size_t k = hash_name(name) & (t->n_slots - 1);
    while (t->slots[k] != 0) {
        family *f = &t->families[t->slots[k] - 1];
        if (span_eq(f->name, name))
            return f;
        k = (k + 1) & (t->n_slots - 1);
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        family *grown = realloc(t->families, cap * sizeof *grown);
        if (grown == NULL)
            return NULL;
        t->families = grown;
        t->cap = cap;
    }
    family *f = &t->families[t->n];
    memset(f, 0, sizeof *f);
    f->name = name;
    t->slots[k] = (uint32_t)++t->n;
    return f;
}

static void family_table_free(family_table *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->families[i].samples);
    free(t->families);
    free(t->slots);
}

static int add_sample(family *f, span line, unsigned worker)
{
    if (f->n_samples == f->cap_samples) {
        size_t cap = f->cap_samples ? f->cap_samples * 2 : 8;
        sample_ref *grown = realloc(f->samples, cap * sizeof *grown);
        if (grown == NULL)
            return -1;
        f->samples = grown;
        f->cap_samples = cap;
    }
    f->samples[f->n_samples++] = (sample_ref){line, worker};
    return 0;
}

static bool name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}

static bool name_char(char c)
{
    return name_start(c) || (c >= '0' && c <= '9');
}

/* The metric name at the start of s (length 0: none). */
static span metric_name(span s)
{
    size_t n = 0;
    if (s.len > 0 && name_start(s.p[0]))
        while (n < s.len && name_char(s.p[n]))
            n++;
    return (span){s.p, n};
}

/* Whether a sample called `name` belongs to family f (its own name, or its
 * name followed by '_' and more: _bucket, _sum, _count, _total). */
static bool belongs(const family *f, span name)
{
    return f != NULL && name.len >= f->name.len && memcmp(name.p, f->name.p, f->name.len) == 0 &&
           (name.len == f->name.len || name.p[f->name.len] == '_');
}

/* "# HELP name ..." or "# TYPE name ...": which (0 help, 1 type) and the
 * name; -1 for any other comment. */
static int descriptor(span line, span *name)
{
    static const char help[] = "# HELP ", type[] = "# TYPE ";
    size_t k = sizeof help - 1;
    int which = -1;
    if (line.len > k && memcmp(line.p, help, k) == 0)
        which = 0;
    else if (line.len > k && memcmp(line.p, type, k) == 0)
        which = 1;
    if (which < 0)
        return -1;
    *name = metric_name((span){line.p + k, line.len - k});
    return name->len > 0 ? which : -1;
}

/* Records the lines of one text in t. */
static int scan_text(family_table *t, const pjs_gw_metrics_text *m)
{
    const char *p = m->text, *end = m->text + m->len;
    family *current = NULL;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        span line = {p, (size_t)((nl ? nl : end) - p)};
        p = nl ? nl + 1 : end;
        if (line.len > 0 && line.p[line.len - 1] == '\r')
            line.len--;
        if (line.len == 0)
            continue;
        if (line.p[0] == '#') {
            span name;
            int which = descriptor(line, &name);
            if (which < 0)
                continue;
            if ((current = family_get(t, name)) == NULL)
                return -1;
            span *slot = which == 0 ? &current->help : &current->type;
            if (slot->len == 0)
                *slot = line;
            continue;
        }
        span name = metric_name(line);
        if (name.len == 0)
            continue; /* not a sample */
        family *f = belongs(current, name) ? current : family_get(t, name);
        if (f == NULL || add_sample(f, line, m->worker) != 0)
            return -1;
    }
    return 0;
}

static int write_line(pjs_http_buf *out, span line, pjs_error *err)
{
    int rc = pjs_http_buf_append(out, line.p, line.len, err);
    return rc != 0 ? rc : pjs_http_buf_append(out, "\n", 1, err);
}

/* A sample line with worker="N" put first among its labels. */
static int write_sample(pjs_http_buf *out, const sample_ref *s, pjs_error *err)
{
    span name = metric_name(s->line);
    const char *rest = s->line.p + name.len;
    size_t rest_len = s->line.len - name.len;
    int rc = pjs_http_buf_append(out, name.p, name.len, err);
    if (rc != 0)
        return rc;
    if (rest_len > 0 && rest[0] == '{') {
        bool empty = rest_len > 1 && rest[1] == '}';
        rc = pjs_http_buf_printf(out, err, "{worker=\"%u\"%s", s->worker, empty ? "" : ",");
        rest++;
        rest_len--;
    } else {
        rc = pjs_http_buf_printf(out, err, "{worker=\"%u\"}", s->worker);
    }
    return rc != 0 ? rc : write_line(out, (span){rest, rest_len}, err);
}

int pjs_gw_metrics_merge(const pjs_gw_metrics_text *texts, size_t n, pjs_http_buf *out,
                         pjs_error *err)
{
    family_table t = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (scan_text(&t, &texts[i]) != 0)
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory merging the workers' metrics");
    for (size_t i = 0; rc == 0 && i < t.n; i++) {
        const family *f = &t.families[i];
        if (f->help.len > 0)
            rc = write_line(out, f->help, err);
        if (rc == 0 && f->type.len > 0)
            rc = write_line(out, f->type, err);
        for (size_t k = 0; rc == 0 && k < f->n_samples; k++)
            rc = write_sample(out, &f->samples[k], err);
    }
    family_table_free(&t);
    return rc;
}

/* ---- repository index --------------------------------------------------------- */

/* "name\nversion" of an entry, the key merged entries share; NULL when the
 * entry has no string name. The version may be absent. */
static char *entry_key(const json_t *e)
{
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *version = json_string_value(json_object_get(e, "version"));
    if (name == NULL)
        return NULL;
    if (version == NULL)
        version = "";
    size_t a = strlen(name), b = strlen(version);
    char *key = malloc(a + b + 2);
    if (key != NULL) {
        memcpy(key, name, a);
        key[a] = '\n';
        memcpy(key + a + 1, version, b + 1);
    }
    return key;
}

static bool is_ready(const json_t *e)
{
    const char *state = json_string_value(json_object_get(e, "state"));
    return state != NULL && strcmp(state, "READY") == 0;
}

json_t *pjs_gw_merge_index(json_t *const *docs, size_t n)
{
    json_t *merged = json_array();
    json_t *seen = json_object(); /* key -> the merged entry */
    bool failed = merged == NULL || seen == NULL;
    for (size_t d = 0; !failed && d < n; d++) {
        size_t i;
        json_t *e;
        json_array_foreach(docs[d], i, e) {
            if (!json_is_object(e))
                continue;
            char *key = entry_key(e);
            if (key == NULL)
                continue;
            json_t *have = json_object_get(seen, key);
            if (have == NULL) {
                json_t *copy = json_deep_copy(e);
                failed = copy == NULL || json_object_set(seen, key, copy) != 0 ||
                         json_array_append_new(merged, copy) != 0;
            } else if (!is_ready(have) && is_ready(e)) {
                failed = json_object_update(have, e) != 0; /* the ready worker's entry wins */
            }
            free(key);
            if (failed)
                break;
        }
    }
    json_decref(seen);
    if (failed) {
        json_decref(merged);
        return NULL;
    }
    return merged;
}

/* ---- statistics ----------------------------------------------------------------- */

static int merge_stats_object(json_t *into, const json_t *from);

/* batch_stats: entries of the same batch_size merged, others added. */
static int merge_batch_stats(json_t *into, const json_t *from)
{
    size_t i;
    json_t *b;
    json_array_foreach(from, i, b) {
        json_t *size = json_object_get(b, "batch_size");
        if (!json_is_object(b) || !json_is_integer(size))
            continue;
        json_t *match = NULL;
        size_t k;
        json_t *a;
        json_array_foreach(into, k, a) {
            if (json_integer_value(json_object_get(a, "batch_size")) == json_integer_value(size)) {
                match = a;
                break;
            }
        }
        int rc = match != NULL ? merge_stats_object(match, b)
                               : json_array_append_new(into, json_deep_copy(b));
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* Sums the numbers of `from` into `into`, field by field, recursively. */
static int merge_stats_object(json_t *into, const json_t *from)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)from, key, v) {
        json_t *have = json_object_get(into, key);
        if (have == NULL) {
            if (json_object_set_new(into, key, json_deep_copy(v)) != 0)
                return -1;
        } else if (json_is_integer(have) && json_is_integer(v)) {
            json_int_t a = json_integer_value(have), b = json_integer_value(v);
            if (strcmp(key, "batch_size") == 0)
                continue;
            json_int_t r = strcmp(key, "last_inference") == 0 ? (a > b ? a : b)
                           : b > 0 && a > INT64_MAX - b        ? INT64_MAX
                                                               : a + b;
            if (json_integer_set(have, r) != 0)
                return -1;
        } else if (json_is_object(have) && json_is_object(v)) {
            if (merge_stats_object(have, v) != 0)
                return -1;
        } else if (json_is_array(have) && json_is_array(v) && strcmp(key, "batch_stats") == 0) {
            if (merge_batch_stats(have, v) != 0)
                return -1;
        }
    }
    return 0;
}

json_t *pjs_gw_merge_stats(json_t *const *docs, size_t n)
{
    json_t *list = json_array();
    json_t *seen = json_object(); /* key -> the merged entry */
    bool failed = list == NULL || seen == NULL;
    for (size_t d = 0; !failed && d < n; d++) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(docs[d], "model_stats"), i, e) {
            if (!json_is_object(e))
                continue;
            char *key = entry_key(e);
            if (key == NULL)
                continue;
            json_t *have = json_object_get(seen, key);
            if (have == NULL) {
                json_t *copy = json_deep_copy(e);
                failed = copy == NULL || json_object_set(seen, key, copy) != 0 ||
                         json_array_append_new(list, copy) != 0;
            } else {
                failed = merge_stats_object(have, e) != 0;
            }
            free(key);
            if (failed)
                break;
        }
    }
    json_decref(seen);
    if (failed) {
        json_decref(list);
        return NULL;
    }
    return json_pack("{s:o}", "model_stats", list); /* takes list, even when it fails */
}

/* ---- sequence id ----------------------------------------------------------------- */

typedef struct scanner {
    const char *p, *end;
} scanner;

static void skip_ws(scanner *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

/* At a '"': moves past the closing quote; the contents in *out. */
static bool read_string(scanner *s, span *out)
{
    const char *start = ++s->p;
    while (s->p < s->end && *s->p != '"') {
        if (*s->p == '\\' && s->end - s->p < 2)
            return false;
        s->p += *s->p == '\\' ? 2 : 1;
    }
    if (s->p >= s->end)
        return false;
    *out = (span){start, (size_t)(s->p - start)};
    s->p++;
    return true;
}

/* Moves past one value: a string, a bracketed structure (by counting
 * brackets outside strings), or a scalar (up to the next delimiter). */
static bool skip_value(scanner *s)
{
    if (s->p >= s->end)
        return false;
    span ignored;
    if (*s->p == '"')
        return read_string(s, &ignored);
    if (*s->p == '{' || *s->p == '[') {
        size_t depth = 0;
        while (s->p < s->end) {
            char c = *s->p;
            if (c == '"') {
                if (!read_string(s, &ignored))
                    return false;
                continue;
            }
            s->p++;
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return true;
        }
        return false;
    }
    const char *start = s->p;
    while (s->p < s->end && !strchr(",}] \t\r\n", *s->p))
        s->p++;
    return s->p > start;
}

/* Calls on_member(key, s, ctx) at each member's value of the object at s,
 * which consumes the value (returns 1 to stop early, -1 on malformed). */
static int walk_object(scanner *s, int (*on_member)(span key, scanner *s, void *ctx), void *ctx)
{
    skip_ws(s);
    if (s->p >= s->end || *s->p != '{')
        return -1;
    s->p++;
    for (;;) {
        skip_ws(s);
        if (s->p < s->end && *s->p == '}')
            return 0;
        span key;
        if (s->p >= s->end || *s->p != '"' || !read_string(s, &key))
            return -1;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':')
            return -1;
        s->p++;
        skip_ws(s);
        int rc = on_member(key, s, ctx);
        if (rc != 0)
            return rc;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',')
            s->p++;
        else if (s->p < s->end && *s->p == '}')
            return 0;
        else
            return -1;
    }
}

static bool key_is(span key, const char *name)
{
    return key.len == strlen(name) && memcmp(key.p, name, key.len) == 0;
}

typedef struct sequence_found {
    char *out;
    size_t size;
    int result; /* 1: copied */
} sequence_found;

static int on_parameter(span key, scanner *s, void *ctx)
{
    sequence_found *f = ctx;
    if (!key_is(key, "sequence_id"))
        return skip_value(s) ? 0 : -1;
    span text;
    if (s->p < s->end && *s->p == '"') {
        if (!read_string(s, &text))
            return -1;
    } else {
        const char *start = s->p;
        if (!skip_value(s))
            return -1;
        text = (span){start, (size_t)(s->p - start)};
        if (text.len == 0 || !(text.p[0] == '-' || (text.p[0] >= '0' && text.p[0] <= '9')))
            return 1; /* not a number or string: no sequence */
    }
    bool none = text.len == 0 || (text.len == 1 && text.p[0] == '0') ||
                memchr(text.p, '\0', text.len) != NULL; /* not valid JSON: the worker refuses it */
    if (!none && text.len < f->size) {
        memcpy(f->out, text.p, text.len);
        f->out[text.len] = '\0';
        f->result = 1;
    }
    return 1;
}

static int on_top_member(span key, scanner *s, void *ctx)
{
    if (key_is(key, "parameters") && s->p < s->end && *s->p == '{')
        return walk_object(s, on_parameter, ctx) < 0 ? -1 : 1;
    return skip_value(s) ? 0 : -1;
}

int pjs_gw_sequence_key(const char *json, size_t json_len, char *out, size_t out_size)
{
    scanner s = {json, json + json_len};
    sequence_found f = {out, out_size, 0};
    if (out_size > 0)
        out[0] = '\0';
    int rc = walk_object(&s, on_top_member, &f);
    return rc < 0 ? -1 : f.result;
}
