/*
 * manifest.c - parse and validate a bundle's manifest.yaml (see manifest.h and
 * docs/bundle-format.md for the schema).
 *
 * Parsing takes two passes over the bytes with libyaml. The first pass reads
 * events only and refuses what the schema never needs but an attacker might
 * use: aliases and anchors (billion laughs), tags, more than one document, and
 * nesting deeper than MAX_DEPTH; it also reports syntax errors with their line.
 * The second pass loads the document tree, which is then walked by the schema
 * itself: every mapping is read through a table of the keys allowed there
 * (unknown and duplicate keys are errors), so the walk never descends further
 * than the schema goes. Scalars are typed by their style: numbers must be plain
 * scalars; string fields take any non-null scalar.
 *
 * Results are built into a local pjs_manifest and moved to the caller's only
 * on success; every failure frees what was built (pjs_manifest_free handles a
 * partially filled struct). Every validation error is
 * PJS_ERR_INVALID_ARGUMENT with "label: field.path: what is wrong (line N)".
 * No global state: any thread may parse its own manifest.
 */
#include "core/manifest.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "core/mapped_file.h"

#define SUPPORTED_VERSION "2.0"
#define MAX_DEPTH 32         /* the schema needs 5 levels; refuse deeper input */
#define NAME_MAX_LEN 128     /* model, tensor and call names */
#define BATCH_SIZE_MAX 65536
#define PATH_MAX_LEN 160     /* field paths are built from known keys and indices */

/* State of one parse: where messages go and what they start with. */
struct ctx {
    yaml_document_t *doc;
    const char *label;
    pjs_error *err;
};

/* One allowed key of a mapping; `value` is set when the key is present. */
struct field {
    const char *key;
    yaml_node_t *value;
};

/* ---- messages ---------------------------------------------------------- */

/* Writes s[0..len) quoted into buf, at most 64 bytes of it, with bytes that
 * are not printable ASCII shown as '?', so hostile keys cannot garble logs. */
static const char *quote(const void *s, size_t len, char *buf, size_t bufsize)
{
    const unsigned char *p = s;
    size_t shown = len < 64 ? len : 64;
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < shown && o + 5 < bufsize; i++)
        buf[o++] = (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"') ? (char)p[i] : '?';
    if (shown < len && o + 5 < bufsize) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

#define QUOTE_BUF 80
#define QUOTE_NODE(n, buf)                                                                    \
    quote((n)->data.scalar.value, (n)->data.scalar.length, (buf), sizeof(buf))

/* Sets "label: path: message (line N)" and returns PJS_ERR_INVALID_ARGUMENT.
 * An empty path leaves out the "path: " part; a NULL node the line. */
__attribute__((format(printf, 4, 5))) static int fail(struct ctx *c, const yaml_node_t *node,
                                                      const char *path, const char *fmt, ...)
{
    char msg[PJS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char line[32] = "";
    if (node != NULL)
        snprintf(line, sizeof line, " (line %lu)", (unsigned long)node->start_mark.line + 1);
    return pjs_error_set(c->err, PJS_ERR_INVALID_ARGUMENT, "%s: %s%s%s%s", c->label, path,
                         path[0] ? ": " : "", msg, line);
}

static int fail_nomem(struct ctx *c, const char *path)
{
    return pjs_error_set(c->err, PJS_ERR_NOMEM, "%s: %s: out of memory", c->label, path);
}

/* Formats a field path into out (PATH_MAX_LEN bytes). Paths are made of
 * known keys and indices, so they fit; if one ever did not, it ends in "...". */
__attribute__((format(printf, 2, 3))) static void path_set(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, PATH_MAX_LEN, fmt, ap);
    va_end(ap);
    if (n >= PATH_MAX_LEN)
        memcpy(out + PATH_MAX_LEN - 4, "...", 4);
}

/* Appends ".key" (or "key" at the top level) or "[i]" to a parent path. */
static void path_key(char *out, const char *parent, const char *key)
{
    path_set(out, "%s%s%s", parent, parent[0] ? "." : "", key);
}

static void path_index(char *out, const char *parent, size_t i)
{
    path_set(out, "%s[%zu]", parent, i);
}

/* ---- first pass: events ------------------------------------------------ */

static int syntax_error(const yaml_parser_t *p, const char *label, pjs_error *err)
{
    if (p->error == YAML_MEMORY_ERROR)
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory parsing YAML", label);
    const char *problem = p->problem != NULL ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: byte %zu: invalid YAML input: %s",
                             label, p->problem_offset, problem);
    if (p->context != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: line %lu: YAML syntax error: %s (%s from line %lu)", label,
                             (unsigned long)p->problem_mark.line + 1, problem, p->context,
                             (unsigned long)p->context_mark.line + 1);
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: line %lu: YAML syntax error: %s",
                         label, (unsigned long)p->problem_mark.line + 1, problem);
}

/* Refuses the YAML features the schema has no use for (see the top comment).
 * *depth and *documents carry the nesting level and document count between
 * events of one stream. */
static int check_event(const yaml_event_t *ev, int *depth, int *documents, const char *label,
                       pjs_error *err)
{
    unsigned long line = (unsigned long)ev->start_mark.line + 1;
    const yaml_char_t *anchor = NULL, *tag = NULL;
    char q[QUOTE_BUF];
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++*documents > 1)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: line %lu: multiple YAML documents are not allowed", label,
                                 line);
        break;
    case YAML_ALIAS_EVENT:
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: line %lu: YAML aliases are not allowed (alias %s)", label, line,
                             quote(ev->data.alias.anchor, strlen((const char *)ev->data.alias.anchor),
                                   q, sizeof q));
    case YAML_SCALAR_EVENT:
        anchor = ev->data.scalar.anchor;
        tag = ev->data.scalar.tag;
        break;
    case YAML_SEQUENCE_START_EVENT:
        anchor = ev->data.sequence_start.anchor;
        tag = ev->data.sequence_start.tag;
        ++*depth;
        break;
    case YAML_MAPPING_START_EVENT:
        anchor = ev->data.mapping_start.anchor;
        tag = ev->data.mapping_start.tag;
        ++*depth;
        break;
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        --*depth;
        break;
    default:
        break;
    }
    if (anchor != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: line %lu: YAML anchors are not allowed (anchor %s)", label, line,
                             quote(anchor, strlen((const char *)anchor), q, sizeof q));
    if (tag != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: line %lu: YAML tags are not allowed (tag %s)", label, line,
                             quote(tag, strlen((const char *)tag), q, sizeof q));
    if (*depth > MAX_DEPTH)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: line %lu: nested deeper than %d levels", label, line, MAX_DEPTH);
    return 0;
}

static int scan_events(const char *yaml, size_t len, const char *label, pjs_error *err)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory parsing YAML", label);
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    int rc = 0, depth = 0, documents = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            rc = syntax_error(&parser, label, err);
            break;
        }
        yaml_event_type_t type = ev.type;
        rc = check_event(&ev, &depth, &documents, label, err);
        yaml_event_delete(&ev);
        if (rc != 0 || type == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&parser);
    if (rc == 0 && documents == 0)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: empty manifest (no YAML document)",
                           label);
    return rc;
}

/* ---- typed scalars ------------------------------------------------------ */

static const char *node_kind_name(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "a scalar";
    }
}

static bool scalar_is(const yaml_node_t *n, const char *text)
{
    size_t len = strlen(text);
    return n->type == YAML_SCALAR_NODE && n->data.scalar.length == len &&
           memcmp(n->data.scalar.value, text, len) == 0;
}

static bool is_plain(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* A plain scalar that the YAML core schema reads as null. */
static bool is_null(const yaml_node_t *n)
{
    return is_plain(n) && (n->data.scalar.length == 0 || scalar_is(n, "~") ||
                           scalar_is(n, "null") || scalar_is(n, "Null") || scalar_is(n, "NULL"));
}

/* Any non-null scalar without NUL bytes (so it can be kept as a C string). */
static int get_string(struct ctx *c, yaml_node_t *n, const char *path)
{
    if (n->type != YAML_SCALAR_NODE)
        return fail(c, n, path, "must be a string, got %s", node_kind_name(n));
    if (is_null(n))
        return fail(c, n, path, "must be a string, got null");
    if (memchr(n->data.scalar.value, '\0', n->data.scalar.length) != NULL)
        return fail(c, n, path, "must not contain NUL characters");
    return 0;
}

static int dup_string(struct ctx *c, yaml_node_t *n, const char *path, char **out)
{
    char *s = malloc(n->data.scalar.length + 1);
    if (s == NULL)
        return fail_nomem(c, path);
    memcpy(s, n->data.scalar.value, n->data.scalar.length);
    s[n->data.scalar.length] = '\0';
    *out = s;
    return 0;
}

static bool name_char_ok(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '.' || ch == '-';
}

/* A model, tensor or call name: [A-Za-z0-9_.-]{1,128}, not starting with '.'. */
static int get_name(struct ctx *c, yaml_node_t *n, const char *path, char **out)
{
    int rc = get_string(c, n, path);
    if (rc != 0)
        return rc;
    const unsigned char *s = n->data.scalar.value;
    size_t len = n->data.scalar.length;
    char q[QUOTE_BUF];
    if (len == 0 || len > NAME_MAX_LEN)
        return fail(c, n, path, "must be 1..%d characters long, got %zu", NAME_MAX_LEN, len);
    if (s[0] == '.')
        return fail(c, n, path, "%s must not start with '.'", QUOTE_NODE(n, q));
    for (size_t i = 0; i < len; i++)
        if (!name_char_ok(s[i]))
            return fail(c, n, path, "%s may only contain A-Z a-z 0-9 _ . -",
                        QUOTE_NODE(n, q));
    return dup_string(c, n, path, out);
}

/* A plain decimal integer: optional sign, digits, no leading zeros (YAML 1.1
 * would read 010 as octal), within int64. */
static int get_int(struct ctx *c, yaml_node_t *n, const char *path, int64_t *out)
{
    char q[QUOTE_BUF];
    if (n->type != YAML_SCALAR_NODE)
        return fail(c, n, path, "must be an integer, got %s", node_kind_name(n));
    if (!is_plain(n))
        return fail(c, n, path, "must be an integer, got the quoted string %s", QUOTE_NODE(n, q));
    if (is_null(n))
        return fail(c, n, path, "must be an integer, got null");
    const char *s = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;
    size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    bool ok = i < len && len < 32;
    for (size_t k = i; ok && k < len; k++)
        ok = s[k] >= '0' && s[k] <= '9';
    if (ok && s[i] == '0' && len - i > 1)
        ok = false;
    if (!ok)
        return fail(c, n, path, "must be a decimal integer, got %s", QUOTE_NODE(n, q));
    char buf[32];
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    char *end = NULL;
    long long v = strtoll(buf, &end, 10);
    if (errno == ERANGE || end != buf + len)
        return fail(c, n, path, "integer %s is out of range", QUOTE_NODE(n, q));
    *out = v;
    return 0;
}

/* A plain decimal number: [-+]? digits [. digits] [e [-+] digits], or with the
 * digits only after the point; no inf/nan/hex (strtod would take those). */
static bool number_syntax_ok(const char *s, size_t len)
{
    size_t i = 0, int_digits = 0, frac_digits = 0;
    if (i < len && (s[i] == '-' || s[i] == '+'))
        i++;
    while (i < len && s[i] >= '0' && s[i] <= '9')
        i++, int_digits++;
    if (i < len && s[i] == '.') {
        i++;
        while (i < len && s[i] >= '0' && s[i] <= '9')
            i++, frac_digits++;
    }
    if (int_digits + frac_digits == 0)
        return false;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '-' || s[i] == '+'))
            i++;
        size_t exp_digits = 0;
        while (i < len && s[i] >= '0' && s[i] <= '9')
            i++, exp_digits++;
        if (exp_digits == 0)
            return false;
    }
    return i == len;
}

static int get_positive_number(struct ctx *c, yaml_node_t *n, const char *path, double *out)
{
    char q[QUOTE_BUF];
    if (!is_plain(n) || is_null(n) ||
        !number_syntax_ok((const char *)n->data.scalar.value, n->data.scalar.length) ||
        n->data.scalar.length >= 64)
        return fail(c, n, path, "must be a positive number, got %s",
                    n->type == YAML_SCALAR_NODE ? QUOTE_NODE(n, q) : node_kind_name(n));
    char buf[64];
    memcpy(buf, n->data.scalar.value, n->data.scalar.length);
    buf[n->data.scalar.length] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    if (errno == ERANGE || !isfinite(v) || !(v > 0))
        return fail(c, n, path, "must be a positive finite number, got %s", QUOTE_NODE(n, q));
    *out = v;
    return 0;
}

/* ---- mappings and lists ------------------------------------------------- */

/* Fills fields[].value from mapping n. Duplicate keys are errors at once; the
 * first unknown key is returned in *out_unknown for the caller to report (so
 * the top level can check format_version first). */
static int collect_fields(struct ctx *c, yaml_node_t *n, const char *path, struct field *fields,
                          size_t n_fields, yaml_node_t **out_unknown)
{
    *out_unknown = NULL;
    if (n->type != YAML_MAPPING_NODE)
        return fail(c, n, path, "must be a mapping, got %s", node_kind_name(n));
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *key = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *value = yaml_document_get_node(c->doc, p->value);
        if (key == NULL || value == NULL)
            return pjs_error_set(c->err, PJS_ERR_INTERNAL, "%s: %s: broken YAML node", c->label,
                                 path);
        if (key->type != YAML_SCALAR_NODE)
            return fail(c, key, path, "mapping keys must be strings, got %s",
                        node_kind_name(key));
        struct field *f = NULL;
        for (size_t i = 0; i < n_fields && f == NULL; i++)
            if (scalar_is(key, fields[i].key))
                f = &fields[i];
        if (f == NULL) {
            if (*out_unknown == NULL)
                *out_unknown = key;
            continue;
        }
        if (f->value != NULL) {
            char sub[PATH_MAX_LEN];
            path_key(sub, path, f->key);
            return fail(c, key, sub, "duplicate key");
        }
        f->value = value;
    }
    return 0;
}

static int unknown_key(struct ctx *c, yaml_node_t *key, const char *path)
{
    char q[QUOTE_BUF];
    if (path[0] == '\0')
        return fail(c, key, "", "unknown key %s at top level", QUOTE_NODE(key, q));
    return fail(c, key, path, "unknown key %s", QUOTE_NODE(key, q));
}

static int get_fields(struct ctx *c, yaml_node_t *n, const char *path, struct field *fields,
                      size_t n_fields)
{
    yaml_node_t *unknown = NULL;
    int rc = collect_fields(c, n, path, fields, n_fields, &unknown);
    if (rc == 0 && unknown != NULL)
        rc = unknown_key(c, unknown, path);
    return rc;
}

static int require(struct ctx *c, const struct field *f, const char *parent, const yaml_node_t *at)
{
    if (f->value != NULL)
        return 0;
    char sub[PATH_MAX_LEN];
    path_key(sub, parent, f->key);
    return fail(c, at, sub, "required key is missing");
}

static int get_list(struct ctx *c, yaml_node_t *n, const char *path, bool non_empty,
                    size_t *out_count)
{
    if (n->type != YAML_SEQUENCE_NODE)
        return fail(c, n, path, "must be a list, got %s", node_kind_name(n));
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (non_empty && count == 0)
        return fail(c, n, path, "must not be empty");
    *out_count = count;
    return 0;
}

static yaml_node_t *list_item(struct ctx *c, yaml_node_t *list, size_t i)
{
    return yaml_document_get_node(c->doc, list->data.sequence.items.start[i]);
}

/* ---- names must be unique ------------------------------------------------ */

struct named {
    const char *name;
    size_t index;
};

static int cmp_named(const void *a, const void *b)
{
    const struct named *x = a, *y = b;
    int r = strcmp(x->name, y->name);
    return r != 0 ? r : (x->index > y->index) - (x->index < y->index);
}

/* Sorts the names (n log n, so long hostile lists stay cheap) and reports the
 * first index, in document order, whose name already occurred. */
static int check_unique(struct ctx *c, yaml_node_t *list, const char *path, const char **names,
                        size_t n, const char *field_suffix)
{
    if (n < 2)
        return 0;
    struct named *v = malloc(n * sizeof *v);
    if (v == NULL)
        return fail_nomem(c, path);
    for (size_t i = 0; i < n; i++)
        v[i] = (struct named){names[i], i};
    qsort(v, n, sizeof *v, cmp_named);
    size_t dup = n, first = 0;
    for (size_t i = 1; i < n; i++) {
        if (strcmp(v[i - 1].name, v[i].name) == 0 && (i < 2 || strcmp(v[i - 2].name, v[i].name)) &&
            v[i].index < dup) {
            dup = v[i].index;
            first = v[i - 1].index;
        }
    }
    free(v);
    if (dup == n)
        return 0;
    char sub[PATH_MAX_LEN], q[QUOTE_BUF];
    path_set(sub, "%s[%zu]%s", path, dup, field_suffix);
    return fail(c, list_item(c, list, dup), sub, "duplicate name %s (also %s[%zu])",
                quote(names[dup], strlen(names[dup]), q, sizeof q), path, first);
}

/* ---- tensors -------------------------------------------------------------- */

static void dtype_choices(char *buf, size_t size)
{
    size_t o = 0;
    for (int t = PJS_DTYPE_INVALID + 1; t < PJS_DTYPE_COUNT && o < size; t++) {
        int w = snprintf(buf + o, size - o, "%s%s", o ? ", " : "", pjs_dtype_name((pjs_dtype)t));
        o += w > 0 ? (size_t)w : 0;
    }
}

static int parse_dtype(struct ctx *c, yaml_node_t *n, const char *path, pjs_dtype *out)
{
    int rc = get_string(c, n, path);
    if (rc != 0)
        return rc;
    pjs_dtype t = pjs_dtype_parse((const char *)n->data.scalar.value, n->data.scalar.length);
    if (t == PJS_DTYPE_INVALID) {
        char q[QUOTE_BUF], choices[256];
        dtype_choices(choices, sizeof choices);
        return fail(c, n, path, "unknown dtype %s (expected one of %s, or a KServe name such as FP32)",
                    QUOTE_NODE(n, q), choices);
    }
    *out = t;
    return 0;
}

static int parse_shape(struct ctx *c, yaml_node_t *n, const char *path, pjs_tensor_spec *t)
{
    size_t rank = 0;
    int rc = get_list(c, n, path, false, &rank);
    if (rc != 0)
        return rc;
    if (rank > PJS_MAX_RANK)
        return fail(c, n, path, "rank %zu exceeds the maximum of %d", rank, PJS_MAX_RANK);
    t->shape.rank = (int)rank;
    for (size_t i = 0; i < rank; i++) {
        yaml_node_t *d = list_item(c, n, i);
        char sub[PATH_MAX_LEN];
        path_index(sub, path, i);
        if (is_plain(d) && scalar_is(d, "batch")) {
            if (i != 0)
                return fail(c, d, sub, "\"batch\" is only allowed as the first dimension");
            t->batched = true;
            t->shape.dims[0] = -1;
            continue;
        }
        int64_t v = 0;
        if ((rc = get_int(c, d, sub, &v)) != 0)
            return rc;
        if (v < 0)
            return fail(c, d, sub, "must be non-negative, got %lld", (long long)v);
        t->shape.dims[i] = v;
    }
    /* The fixed extents must not overflow on their own (batch counted as 1). */
    pjs_shape fixed = t->shape;
    if (t->batched)
        fixed.dims[0] = 1;
    int64_t numel = 0;
    if (!pjs_shape_numel(&fixed, &numel))
        return fail(c, n, path, "element count overflows");
    return 0;
}

static int parse_tensor(struct ctx *c, yaml_node_t *n, const char *path, pjs_tensor_spec *t)
{
    struct field f[] = {{"name", NULL}, {"dtype", NULL}, {"shape", NULL}};
    char sub[PATH_MAX_LEN];
    int rc = get_fields(c, n, path, f, 3);
    for (size_t i = 0; rc == 0 && i < 3; i++)
        rc = require(c, &f[i], path, n);
    if (rc != 0)
        return rc;
    path_key(sub, path, "name");
    if ((rc = get_name(c, f[0].value, sub, &t->name)) != 0)
        return rc;
    path_key(sub, path, "dtype");
    if ((rc = parse_dtype(c, f[1].value, sub, &t->dtype)) != 0)
        return rc;
    path_key(sub, path, "shape");
    return parse_shape(c, f[2].value, sub, t);
}

/* A non-empty list of tensors with unique names. *out and *out_n are set as
 * soon as the array exists, so the caller frees it on any failure. */
static int parse_tensors(struct ctx *c, yaml_node_t *n, const char *path, pjs_tensor_spec **out,
                         size_t *out_n)
{
    size_t count = 0;
    int rc = get_list(c, n, path, true, &count);
    if (rc != 0)
        return rc;
    pjs_tensor_spec *v = calloc(count, sizeof *v);
    if (v == NULL)
        return fail_nomem(c, path);
    *out = v;
    *out_n = count;
    for (size_t i = 0; i < count; i++) {
        char sub[PATH_MAX_LEN];
        path_index(sub, path, i);
        if ((rc = parse_tensor(c, list_item(c, n, i), sub, &v[i])) != 0)
            return rc;
    }
    const char **names = malloc(count * sizeof *names);
    if (names == NULL)
        return fail_nomem(c, path);
    for (size_t i = 0; i < count; i++)
        names[i] = v[i].name;
    rc = check_unique(c, n, path, names, count, ".name");
    free(names);
    return rc;
}

/* ---- top-level fields ------------------------------------------------------ */

static int parse_version(struct ctx *c, yaml_node_t *n)
{
    /* "2.0" quoted, or the plain 2.0 that YAML would read as a float. */
    if (n->type == YAML_SCALAR_NODE && scalar_is(n, SUPPORTED_VERSION))
        return 0;
    char q[QUOTE_BUF];
    return fail(c, n, "format_version", "unsupported version %s (this server reads \"%s\")",
                n->type == YAML_SCALAR_NODE ? QUOTE_NODE(n, q) : node_kind_name(n),
                SUPPORTED_VERSION);
}

static int parse_kind(struct ctx *c, yaml_node_t *n, pjs_model_kind *out)
{
    int rc = get_string(c, n, "kind");
    if (rc != 0)
        return rc;
    if (scalar_is(n, "model"))
        *out = PJS_KIND_MODEL;
    else if (scalar_is(n, "meta"))
        *out = PJS_KIND_META;
    else {
        char q[QUOTE_BUF];
        return fail(c, n, "kind", "unknown kind %s (expected model or meta)", QUOTE_NODE(n, q));
    }
    return 0;
}

static int parse_residency(struct ctx *c, yaml_node_t *n, pjs_residency *out)
{
    static const pjs_residency all[] = {PJS_RESIDENCY_HOST, PJS_RESIDENCY_DEVICE,
                                        PJS_RESIDENCY_UNPINNED};
    int rc = get_string(c, n, "residency");
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (scalar_is(n, pjs_residency_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    }
    char q[QUOTE_BUF];
    return fail(c, n, "residency", "unknown residency %s (expected host, device or unpinned)",
                QUOTE_NODE(n, q));
}

static int parse_batch_sizes(struct ctx *c, yaml_node_t *n, pjs_manifest *m)
{
    size_t count = 0;
    int rc = get_list(c, n, "batch_sizes", true, &count);
    if (rc != 0)
        return rc;
    m->batch_sizes = calloc(count, sizeof *m->batch_sizes);
    if (m->batch_sizes == NULL)
        return fail_nomem(c, "batch_sizes");
    m->n_batch_sizes = count;
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *item = list_item(c, n, i);
        char sub[PATH_MAX_LEN];
        path_index(sub, "batch_sizes", i);
        int64_t v = 0;
        if ((rc = get_int(c, item, sub, &v)) != 0)
            return rc;
        if (v < 1 || v > BATCH_SIZE_MAX)
            return fail(c, item, sub, "must be in 1..%d, got %lld", BATCH_SIZE_MAX, (long long)v);
        if (i > 0 && v <= m->batch_sizes[i - 1])
            return fail(c, item, "batch_sizes", "must be strictly ascending (%lld after %lld)",
                        (long long)v, (long long)m->batch_sizes[i - 1]);
        m->batch_sizes[i] = v;
    }
    return 0;
}

static int parse_meta(struct ctx *c, yaml_node_t *n, pjs_manifest *m)
{
    struct field f[] = {{"calls", NULL}};
    int rc = get_fields(c, n, "meta", f, 1);
    if (rc == 0)
        rc = require(c, &f[0], "meta", n);
    size_t count = 0;
    if (rc == 0)
        rc = get_list(c, f[0].value, "meta.calls", false, &count);
    if (rc != 0 || count == 0)
        return rc;
    m->calls = calloc(count, sizeof *m->calls);
    if (m->calls == NULL)
        return fail_nomem(c, "meta.calls");
    m->n_calls = count;
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *item = list_item(c, f[0].value, i);
        char sub[PATH_MAX_LEN];
        path_index(sub, "meta.calls", i);
        if ((rc = get_name(c, item, sub, &m->calls[i])) != 0)
            return rc;
        if (strcmp(m->calls[i], m->name) == 0)
            return fail(c, item, sub, "a model cannot call itself");
    }
    return check_unique(c, f[0].value, "meta.calls", (const char **)m->calls, count, "");
}

/* ---- variants ------------------------------------------------------------ */

#define DEFAULT_VARIANT "default"

/* The top-level tensors of one kind ("inputs" or "outputs"), with their
 * names sorted so that variant keys are looked up in log time (a hostile
 * manifest may have many tensors and many keys). */
struct tensor_table {
    const char *kind;
    const pjs_tensor_spec *specs;
    size_t n;
    struct named *sorted;
};

static int table_init(struct ctx *c, struct tensor_table *t, const char *kind,
                      const pjs_tensor_spec *specs, size_t n)
{
    *t = (struct tensor_table){kind, specs, n, malloc(n * sizeof *t->sorted)};
    if (t->sorted == NULL)
        return fail_nomem(c, "variants");
    for (size_t i = 0; i < n; i++)
        t->sorted[i] = (struct named){specs[i].name, i};
    qsort(t->sorted, n, sizeof *t->sorted, cmp_named);
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
static int parse_shape_override(struct ctx *c, yaml_node_t *key, yaml_node_t *value,
                                const char *path, const struct tensor_table *t, bool *seen,
                                pjs_tensor_spec *specs)
{
    if (key->type != YAML_SCALAR_NODE)
        return fail(c, key, path, "mapping keys must be strings, got %s", node_kind_name(key));
    int rc = get_string(c, key, path);
    if (rc != 0)
        return rc;
    char q[QUOTE_BUF], sub[PATH_MAX_LEN], top_path[PATH_MAX_LEN];
    size_t i = table_find(t, key);
    if (i == t->n)
        return fail(c, key, path, "%s is not one of the model's %s", QUOTE_NODE(key, q), t->kind);
    const pjs_tensor_spec *top = &t->specs[i];
    path_key(sub, path, top->name);
    path_index(top_path, t->kind, i);
    if (seen[i])
        return fail(c, key, sub, "duplicate key");
    seen[i] = true;
    pjs_tensor_spec parsed = {0};
    if ((rc = parse_shape(c, value, sub, &parsed)) != 0)
        return rc;
    if (top->batched && !parsed.batched)
        return fail(c, value, sub, "must start with \"batch\" like %s (a variant keeps the "
                    "batch axis)", top_path);
    if (!top->batched && parsed.batched)
        return fail(c, value, sub, "must not have a batch axis: %s has none", top_path);
    if (parsed.shape.rank != top->shape.rank)
        return fail(c, value, sub, "rank %d differs from the rank %d of %s (a variant changes "
                    "extents, not ranks)", parsed.shape.rank, top->shape.rank, top_path);
    specs[i].shape = parsed.shape;
    return 0;
}

/* A variant's inputs or outputs: a mapping from top-level tensor names to
 * shapes, written over specs (a copy of the top-level tensors). */
static int parse_shape_overrides(struct ctx *c, yaml_node_t *n, const char *path,
                                 const struct tensor_table *t, pjs_tensor_spec *specs)
{
    if (n->type != YAML_MAPPING_NODE)
        return fail(c, n, path, "must be a mapping from tensor names to shapes, got %s",
                    node_kind_name(n));
    bool *seen = calloc(t->n, sizeof *seen);
    if (seen == NULL)
        return fail_nomem(c, path);
    int rc = 0;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start;
         rc == 0 && p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *key = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *value = yaml_document_get_node(c->doc, p->value);
        if (key == NULL || value == NULL)
            rc = pjs_error_set(c->err, PJS_ERR_INTERNAL, "%s: %s: broken YAML node", c->label,
                               path);
        else
            rc = parse_shape_override(c, key, value, path, t, seen, specs);
    }
    free(seen);
    return rc;
}

/* A variant's tensors start as copies of the top-level ones. */
static int copy_tensors(struct ctx *c, const struct tensor_table *t, pjs_tensor_spec **out,
                        const char *path)
{
    pjs_tensor_spec *v = calloc(t->n, sizeof *v);
    if (v == NULL)
        return fail_nomem(c, path);
    *out = v;
    for (size_t i = 0; i < t->n; i++) {
        v[i] = t->specs[i];
        if ((v[i].name = strdup(t->specs[i].name)) == NULL)
            return fail_nomem(c, path);
    }
    return 0;
}

/* One entry of `variants`; what it builds is freed with the manifest. */
static int parse_variant(struct ctx *c, yaml_node_t *n, const char *path,
                         const struct tensor_table *ins, const struct tensor_table *outs,
                         pjs_variant *v)
{
    struct field f[] = {{"name", NULL}, {"inputs", NULL}, {"outputs", NULL}};
    char sub[PATH_MAX_LEN];
    int rc = get_fields(c, n, path, f, 3);
    for (size_t i = 0; rc == 0 && i < 2; i++)
        rc = require(c, &f[i], path, n);
    if (rc != 0)
        return rc;
    path_key(sub, path, "name");
    if ((rc = get_name(c, f[0].value, sub, &v->name)) != 0)
        return rc;
    if (strcmp(v->name, DEFAULT_VARIANT) == 0)
        return fail(c, f[0].value, sub, "\"" DEFAULT_VARIANT "\" names the top-level shapes; "
                    "choose another name");
    if ((rc = copy_tensors(c, ins, &v->inputs, path)) != 0 ||
        (rc = copy_tensors(c, outs, &v->outputs, path)) != 0)
        return rc;
    path_key(sub, path, "inputs");
    if ((rc = parse_shape_overrides(c, f[1].value, sub, ins, v->inputs)) != 0)
        return rc;
    path_key(sub, path, "outputs");
    return f[2].value != NULL ? parse_shape_overrides(c, f[2].value, sub, outs, v->outputs) : 0;
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
static int check_variant_distinct(struct ctx *c, yaml_node_t *item, const char *path,
                                  const pjs_manifest *m, size_t k)
{
    const pjs_variant *v = &m->variants[k];
    char sub[PATH_MAX_LEN], other[PATH_MAX_LEN + 32];
    for (size_t u = 0; u < k; u++) {
        if (u > 0 && strcmp(m->variants[u].name, v->name) == 0) {
            path_key(sub, path, "name");
            return fail(c, item, sub, "duplicate name \"%s\" (also variants[%zu])", v->name,
                        u - 1);
        }
        if (!same_input_shapes(m, &m->variants[u], v))
            continue;
        if (u == 0)
            snprintf(other, sizeof other, "the top-level inputs (\"" DEFAULT_VARIANT "\")");
        else
            snprintf(other, sizeof other, "variants[%zu] (\"%s\")", u - 1, m->variants[u].name);
        path_key(sub, path, "inputs");
        return fail(c, item, sub, "the same input shapes as %s; requests could not tell them "
                    "apart", other);
    }
    return 0;
}

/* Builds m->variants: "default" (aliasing the top-level tensors), then one
 * per entry of the optional `variants` list n. */
static int parse_variants(struct ctx *c, yaml_node_t *n, pjs_manifest *m)
{
    size_t count = 0;
    int rc = n != NULL ? get_list(c, n, "variants", true, &count) : 0;
    if (rc != 0)
        return rc;
    if (count > PJS_MANIFEST_MAX_VARIANTS)
        return fail(c, n, "variants", "%zu variants, more than the %d allowed besides "
                    "\"" DEFAULT_VARIANT "\"", count, PJS_MANIFEST_MAX_VARIANTS);
    m->variants = calloc(count + 1, sizeof *m->variants);
    if (m->variants == NULL || (m->variants[0].name = strdup(DEFAULT_VARIANT)) == NULL)
        return fail_nomem(c, "variants");
    m->n_variants = 1;
    m->variants[0].inputs = m->inputs;
    m->variants[0].outputs = m->outputs;
    if (count == 0)
        return 0;
    struct tensor_table ins = {0}, outs = {0};
    if ((rc = table_init(c, &ins, "inputs", m->inputs, m->n_inputs)) == 0)
        rc = table_init(c, &outs, "outputs", m->outputs, m->n_outputs);
    for (size_t k = 1; rc == 0 && k <= count; k++) {
        yaml_node_t *item = list_item(c, n, k - 1);
        char sub[PATH_MAX_LEN];
        path_index(sub, "variants", k - 1);
        m->n_variants++; /* counted first, so that a partly built variant is freed */
        rc = parse_variant(c, item, sub, &ins, &outs, &m->variants[k]);
        if (rc == 0)
            rc = check_variant_distinct(c, item, sub, m, k);
    }
    free(ins.sorted);
    free(outs.sorted);
    return rc;
}

enum top_key {
    K_FORMAT_VERSION, K_NAME, K_KIND, K_DESCRIPTION, K_BATCH_SIZES, K_INPUTS, K_OUTPUTS,
    K_VARIANTS, K_RESIDENCY, K_WEIGHT, K_META, K_CLIENT_INPUTS, K_CLIENT_OUTPUTS, K_COUNT
};

/* Keys that only one kind may carry, and what to say to the other. The first
 * three of each list are required for their kind. */
static int check_kind_keys(struct ctx *c, const struct field *f, pjs_model_kind kind)
{
    static const enum top_key model_only[] = {K_BATCH_SIZES, K_INPUTS, K_OUTPUTS, K_VARIANTS};
    static const enum top_key meta_only[] = {K_META, K_CLIENT_INPUTS, K_CLIENT_OUTPUTS};
    const enum top_key *forbidden = kind == PJS_KIND_MODEL ? meta_only : model_only;
    const enum top_key *required = kind == PJS_KIND_MODEL ? model_only : meta_only;
    size_t n_forbidden = kind == PJS_KIND_MODEL ? 3 : 4;
    for (size_t i = 0; i < n_forbidden; i++) {
        const struct field *x = &f[forbidden[i]];
        if (x->value != NULL)
            return fail(c, x->value, x->key, "not allowed in a manifest of kind %s%s",
                        kind == PJS_KIND_MODEL ? "model" : "meta",
                        forbidden[i] == K_INPUTS    ? " (use client_inputs)"
                        : forbidden[i] == K_OUTPUTS ? " (use client_outputs)"
                                                    : "");
    }
    for (size_t i = 0; i < 3; i++) {
        const struct field *x = &f[required[i]];
        if (x->value == NULL)
            return fail(c, NULL, x->key, "required key is missing (kind %s)",
                        kind == PJS_KIND_MODEL ? "model" : "meta");
    }
    return 0;
}

static int parse_root(struct ctx *c, yaml_node_t *root, pjs_manifest *m)
{
    struct field f[K_COUNT] = {
        [K_FORMAT_VERSION] = {"format_version", NULL}, [K_NAME] = {"name", NULL},
        [K_KIND] = {"kind", NULL},                     [K_DESCRIPTION] = {"description", NULL},
        [K_BATCH_SIZES] = {"batch_sizes", NULL},       [K_INPUTS] = {"inputs", NULL},
        [K_OUTPUTS] = {"outputs", NULL},               [K_VARIANTS] = {"variants", NULL},
        [K_RESIDENCY] = {"residency", NULL},
        [K_WEIGHT] = {"weight", NULL},                 [K_META] = {"meta", NULL},
        [K_CLIENT_INPUTS] = {"client_inputs", NULL},   [K_CLIENT_OUTPUTS] = {"client_outputs", NULL},
    };
    if (root->type != YAML_MAPPING_NODE)
        return fail(c, root, "", "the top level must be a mapping, got %s", node_kind_name(root));
    yaml_node_t *unknown = NULL;
    int rc = collect_fields(c, root, "", f, K_COUNT, &unknown);
    if (rc != 0)
        return rc;
    /* The version decides the schema, so it is checked before unknown keys. */
    if ((rc = require(c, &f[K_FORMAT_VERSION], "", NULL)) != 0 ||
        (rc = parse_version(c, f[K_FORMAT_VERSION].value)) != 0)
        return rc;
    if (unknown != NULL)
        return unknown_key(c, unknown, "");
    if ((rc = require(c, &f[K_NAME], "", NULL)) != 0 ||
        (rc = get_name(c, f[K_NAME].value, "name", &m->name)) != 0)
        return rc;
    if (f[K_KIND].value != NULL && (rc = parse_kind(c, f[K_KIND].value, &m->kind)) != 0)
        return rc;
    if ((rc = check_kind_keys(c, f, m->kind)) != 0)
        return rc;
    if (f[K_DESCRIPTION].value != NULL &&
        ((rc = get_string(c, f[K_DESCRIPTION].value, "description")) != 0 ||
         (rc = dup_string(c, f[K_DESCRIPTION].value, "description", &m->description)) != 0))
        return rc;
    if (f[K_RESIDENCY].value != NULL &&
        (rc = parse_residency(c, f[K_RESIDENCY].value, &m->residency)) != 0)
        return rc;
    if (f[K_WEIGHT].value != NULL &&
        (rc = get_positive_number(c, f[K_WEIGHT].value, "weight", &m->weight)) != 0)
        return rc;
    if (m->kind == PJS_KIND_MODEL) {
        if ((rc = parse_batch_sizes(c, f[K_BATCH_SIZES].value, m)) != 0 ||
            (rc = parse_tensors(c, f[K_INPUTS].value, "inputs", &m->inputs, &m->n_inputs)) != 0 ||
            (rc = parse_tensors(c, f[K_OUTPUTS].value, "outputs", &m->outputs, &m->n_outputs)) != 0)
            return rc;
        return parse_variants(c, f[K_VARIANTS].value, m);
    }
    if ((rc = parse_meta(c, f[K_META].value, m)) != 0 ||
        (rc = parse_tensors(c, f[K_CLIENT_INPUTS].value, "client_inputs", &m->inputs,
                            &m->n_inputs)) != 0)
        return rc;
    return parse_tensors(c, f[K_CLIENT_OUTPUTS].value, "client_outputs", &m->outputs,
                         &m->n_outputs);
}

/* ---- public API ------------------------------------------------------------ */

int pjs_manifest_parse(pjs_manifest *m, const char *yaml, size_t len, const char *label,
                       pjs_error *err)
{
    pjs_manifest tmp = {.kind = PJS_KIND_MODEL, .residency = PJS_RESIDENCY_HOST, .weight = 1.0};
    yaml_parser_t parser;
    yaml_document_t doc;
    bool parser_ok = false, doc_ok = false;
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
    if ((rc = scan_events(yaml, len, label, err)) != 0)
        goto out;
    if (!yaml_parser_initialize(&parser)) {
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory parsing YAML", label);
        goto out;
    }
    parser_ok = true;
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = syntax_error(&parser, label, err);
        goto out;
    }
    doc_ok = true;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root == NULL) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: empty manifest", label);
        goto out;
    }
    struct ctx c = {.doc = &doc, .label = label, .err = err};
    if ((rc = parse_root(&c, root, &tmp)) != 0)
        goto out;
    *m = tmp;
    memset(&tmp, 0, sizeof tmp);
out:
    pjs_manifest_free(&tmp);
    if (doc_ok)
        yaml_document_delete(&doc);
    if (parser_ok)
        yaml_parser_delete(&parser);
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
    return rc;
}

static void free_tensors(pjs_tensor_spec *v, size_t n)
{
    for (size_t i = 0; v != NULL && i < n; i++)
        free(v[i].name);
    free(v);
}

void pjs_manifest_free(pjs_manifest *m)
{
    if (m == NULL)
        return;
    free(m->name);
    free(m->description);
    free_tensors(m->inputs, m->n_inputs);
    free_tensors(m->outputs, m->n_outputs);
    free(m->batch_sizes);
    for (size_t v = 0; m->variants != NULL && v < m->n_variants; v++) {
        free(m->variants[v].name);
        if (v > 0) {
            free_tensors(m->variants[v].inputs, m->n_inputs);
            free_tensors(m->variants[v].outputs, m->n_outputs);
        }
    }
    free(m->variants);
    for (size_t i = 0; m->calls != NULL && i < m->n_calls; i++)
        free(m->calls[i]);
    free(m->calls);
    memset(m, 0, sizeof *m);
}

const char *pjs_residency_name(pjs_residency r)
{
    switch (r) {
    case PJS_RESIDENCY_HOST: return "host";
    case PJS_RESIDENCY_DEVICE: return "device";
    case PJS_RESIDENCY_UNPINNED: return "unpinned";
    }
    return "invalid";
}

size_t pjs_tensor_spec_row_bytes(const pjs_tensor_spec *s)
{
    size_t bytes = pjs_dtype_size(s->dtype);
    for (int d = s->batched ? 1 : 0; d < s->shape.rank; d++)
        bytes *= (size_t)s->shape.dims[d];
    return bytes;
}

pjs_shape pjs_manifest_client_shape(const pjs_manifest *m, bool output, size_t i)
{
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

bool pjs_manifest_input_fits(const pjs_manifest *m, size_t variant, size_t i, const pjs_shape *s)
{
    const pjs_tensor_spec *t = &m->variants[variant].inputs[i];
    if (s->rank != t->shape.rank)
        return false;
    for (int d = t->batched ? 1 : 0; d < s->rank; d++)
        if (s->dims[d] != t->shape.dims[d])
            return false;
    return true;
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
