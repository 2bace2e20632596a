/*
 * yaml_strict.c - strict YAML: the event scan, loading, typed scalars and
 * key tables shared by the schemas of pjserve's files (see yaml_strict.h).
 *
 * Nothing here knows a schema. Scalars are typed by their style: numbers and
 * booleans must be plain, strings may be any non-null scalar. Text given
 * outside a file (environment, flags) is wrapped in a plain scalar node, so
 * it is read by the same getters with the same messages.
 */
#include "core/yaml_strict.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- messages and paths -------------------------------------------------- */

const char *pjs_yaml_quote(const void *s, size_t len, char *buf, size_t bufsize)
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

const char *pjs_yaml_quote_node(const yaml_node_t *n, char *buf, size_t bufsize)
{
    return pjs_yaml_quote(n->data.scalar.value, n->data.scalar.length, buf, bufsize);
}

#define QUOTE_NODE(n, buf) pjs_yaml_quote_node((n), (buf), sizeof(buf))

int pjs_yaml_fail(pjs_yaml *y, const yaml_node_t *node, const char *path, const char *fmt, ...)
{
    char msg[PJS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char line[32] = "";
    if (node != NULL && y->loaded)
        snprintf(line, sizeof line, " (line %lu)", (unsigned long)node->start_mark.line + 1);
    return pjs_error_set(y->err, PJS_ERR_INVALID_ARGUMENT, "%s: %s%s%s%s", y->label, path,
                         path[0] ? ": " : "", msg, line);
}

int pjs_yaml_fail_nomem(pjs_yaml *y, const char *path)
{
    return pjs_error_set(y->err, PJS_ERR_NOMEM, "%s: %s: out of memory", y->label, path);
}

void pjs_yaml_path_set(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, PJS_YAML_PATH_MAX, fmt, ap);
    va_end(ap);
    if (n >= PJS_YAML_PATH_MAX)
        memcpy(out + PJS_YAML_PATH_MAX - 4, "...", 4);
}

void pjs_yaml_path_key(char *out, const char *parent, const char *key)
{
    pjs_yaml_path_set(out, "%s%s%s", parent, parent[0] ? "." : "", key);
}

void pjs_yaml_path_index(char *out, const char *parent, size_t i)
{
    pjs_yaml_path_set(out, "%s[%zu]", parent, i);
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

/* Refuses the YAML features no schema of ours uses (see yaml_strict.h).
 * *depth and *documents carry the nesting level and document count between
 * events of one stream. */
static int check_event(const yaml_event_t *ev, int *depth, int *documents, const char *label,
                       pjs_error *err)
{
    unsigned long line = (unsigned long)ev->start_mark.line + 1;
    const yaml_char_t *anchor = NULL, *tag = NULL;
    char q[PJS_YAML_QUOTE_MAX];
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
                             pjs_yaml_quote(ev->data.alias.anchor,
                                            strlen((const char *)ev->data.alias.anchor), q,
                                            sizeof q));
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
                             pjs_yaml_quote(anchor, strlen((const char *)anchor), q, sizeof q));
    if (tag != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: line %lu: YAML tags are not allowed (tag %s)", label, line,
                             pjs_yaml_quote(tag, strlen((const char *)tag), q, sizeof q));
    if (*depth > PJS_YAML_MAX_DEPTH)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: line %lu: nested deeper than %d levels", label, line,
                             PJS_YAML_MAX_DEPTH);
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
    return rc;
}

/* ---- second pass: the tree ---------------------------------------------- */

int pjs_yaml_load(pjs_yaml *y, const char *yaml, size_t len, const char *label, pjs_error *err,
                  yaml_node_t **out_root)
{
    *y = (pjs_yaml){.label = label, .err = err};
    *out_root = NULL;
    int rc = scan_events(yaml, len, label, err);
    if (rc != 0)
        return rc;
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory parsing YAML", label);
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &y->doc))
        rc = syntax_error(&parser, label, err);
    else {
        y->loaded = true;
        *out_root = yaml_document_get_root_node(&y->doc);
    }
    yaml_parser_delete(&parser);
    return rc;
}

void pjs_yaml_free(pjs_yaml *y)
{
    if (y->loaded)
        yaml_document_delete(&y->doc);
    y->loaded = false;
}

void pjs_yaml_init_text(pjs_yaml *y, const char *label, pjs_error *err)
{
    *y = (pjs_yaml){.label = label, .err = err};
}

void pjs_yaml_text_scalar(yaml_node_t *n, const char *text)
{
    memset(n, 0, sizeof *n);
    n->type = YAML_SCALAR_NODE;
    /* libyaml's field is not const; the getters only read it. */
    n->data.scalar.value = (yaml_char_t *)(uintptr_t)text;
    n->data.scalar.length = strlen(text);
    n->data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
}

/* ---- nodes and scalars ----------------------------------------------------- */

const char *pjs_yaml_kind_name(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "a scalar";
    }
}

bool pjs_yaml_scalar_is(const yaml_node_t *n, const char *text)
{
    size_t len = strlen(text);
    return n->type == YAML_SCALAR_NODE && n->data.scalar.length == len &&
           memcmp(n->data.scalar.value, text, len) == 0;
}

bool pjs_yaml_is_plain(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

bool pjs_yaml_is_null(const yaml_node_t *n)
{
    return pjs_yaml_is_plain(n) &&
           (n->data.scalar.length == 0 || pjs_yaml_scalar_is(n, "~") ||
            pjs_yaml_scalar_is(n, "null") || pjs_yaml_scalar_is(n, "Null") ||
            pjs_yaml_scalar_is(n, "NULL"));
}

int pjs_yaml_get_string(pjs_yaml *y, const yaml_node_t *n, const char *path)
{
    if (n->type != YAML_SCALAR_NODE)
        return pjs_yaml_fail(y, n, path, "must be a string, got %s", pjs_yaml_kind_name(n));
    if (pjs_yaml_is_null(n))
        return pjs_yaml_fail(y, n, path, "must be a string, got null");
    if (memchr(n->data.scalar.value, '\0', n->data.scalar.length) != NULL)
        return pjs_yaml_fail(y, n, path, "must not contain NUL characters");
    return 0;
}

int pjs_yaml_dup_string(pjs_yaml *y, const yaml_node_t *n, const char *path, char **out)
{
    char *s = malloc(n->data.scalar.length + 1);
    if (s == NULL)
        return pjs_yaml_fail_nomem(y, path);
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

int pjs_yaml_get_name(pjs_yaml *y, const yaml_node_t *n, const char *path, char **out)
{
    int rc = pjs_yaml_get_string(y, n, path);
    if (rc != 0)
        return rc;
    const unsigned char *s = n->data.scalar.value;
    size_t len = n->data.scalar.length;
    char q[PJS_YAML_QUOTE_MAX];
    if (len == 0 || len > PJS_YAML_NAME_MAX)
        return pjs_yaml_fail(y, n, path, "must be 1..%d characters long, got %zu",
                             PJS_YAML_NAME_MAX, len);
    if (s[0] == '.')
        return pjs_yaml_fail(y, n, path, "%s must not start with '.'", QUOTE_NODE(n, q));
    for (size_t i = 0; i < len; i++)
        if (!name_char_ok(s[i]))
            return pjs_yaml_fail(y, n, path, "%s may only contain A-Z a-z 0-9 _ . -",
                                 QUOTE_NODE(n, q));
    return pjs_yaml_dup_string(y, n, path, out);
}

int pjs_yaml_get_int(pjs_yaml *y, const yaml_node_t *n, const char *path, int64_t *out)
{
    char q[PJS_YAML_QUOTE_MAX];
    if (n->type != YAML_SCALAR_NODE)
        return pjs_yaml_fail(y, n, path, "must be an integer, got %s", pjs_yaml_kind_name(n));
    if (!pjs_yaml_is_plain(n))
        return pjs_yaml_fail(y, n, path, "must be an integer, got the quoted string %s",
                             QUOTE_NODE(n, q));
    if (pjs_yaml_is_null(n))
        return pjs_yaml_fail(y, n, path, "must be an integer, got null");
    const char *s = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;
    size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    bool ok = i < len && len < 32;
    for (size_t k = i; ok && k < len; k++)
        ok = s[k] >= '0' && s[k] <= '9';
    if (ok && s[i] == '0' && len - i > 1)
        ok = false;
    if (!ok)
        return pjs_yaml_fail(y, n, path, "must be a decimal integer, got %s", QUOTE_NODE(n, q));
    char buf[32];
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    char *end = NULL;
    long long v = strtoll(buf, &end, 10);
    if (errno == ERANGE || end != buf + len)
        return pjs_yaml_fail(y, n, path, "integer %s is out of range", QUOTE_NODE(n, q));
    *out = v;
    return 0;
}

/* [-+]? digits [. digits] [e [-+] digits], or with the digits only after the
 * point; no inf/nan/hex (strtod would take those). */
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

/* Reads a number's syntax; `what` ("a number", "a positive number") words
 * the message. *out_erange: strtod over- or underflowed. */
static int read_number(pjs_yaml *y, const yaml_node_t *n, const char *path, const char *what,
                       double *out, bool *out_erange)
{
    char q[PJS_YAML_QUOTE_MAX];
    if (!pjs_yaml_is_plain(n) || pjs_yaml_is_null(n) ||
        !number_syntax_ok((const char *)n->data.scalar.value, n->data.scalar.length) ||
        n->data.scalar.length >= 64)
        return pjs_yaml_fail(y, n, path, "must be %s, got %s", what,
                             n->type == YAML_SCALAR_NODE ? QUOTE_NODE(n, q)
                                                         : pjs_yaml_kind_name(n));
    char buf[64];
    memcpy(buf, n->data.scalar.value, n->data.scalar.length);
    buf[n->data.scalar.length] = '\0';
    errno = 0;
    *out = strtod(buf, NULL);
    *out_erange = errno == ERANGE;
    return 0;
}

int pjs_yaml_get_number(pjs_yaml *y, const yaml_node_t *n, const char *path, double *out)
{
    double v = 0;
    bool erange = false;
    int rc = read_number(y, n, path, "a number", &v, &erange);
    if (rc != 0)
        return rc;
    char q[PJS_YAML_QUOTE_MAX];
    if (erange || !isfinite(v))
        return pjs_yaml_fail(y, n, path, "must be a finite number, got %s", QUOTE_NODE(n, q));
    *out = v;
    return 0;
}

int pjs_yaml_get_positive_number(pjs_yaml *y, const yaml_node_t *n, const char *path,
                                 double *out)
{
    double v = 0;
    bool erange = false;
    int rc = read_number(y, n, path, "a positive number", &v, &erange);
    if (rc != 0)
        return rc;
    char q[PJS_YAML_QUOTE_MAX];
    if (erange || !isfinite(v) || !(v > 0))
        return pjs_yaml_fail(y, n, path, "must be a positive finite number, got %s",
                             QUOTE_NODE(n, q));
    *out = v;
    return 0;
}

int pjs_yaml_get_bool(pjs_yaml *y, const yaml_node_t *n, const char *path, bool *out)
{
    static const char *const yes[] = {"true", "True", "TRUE"};
    static const char *const no[] = {"false", "False", "FALSE"};
    for (size_t i = 0; pjs_yaml_is_plain(n) && i < 3; i++) {
        if (pjs_yaml_scalar_is(n, yes[i]) || pjs_yaml_scalar_is(n, no[i])) {
            *out = pjs_yaml_scalar_is(n, yes[i]);
            return 0;
        }
    }
    char q[PJS_YAML_QUOTE_MAX];
    return pjs_yaml_fail(y, n, path, "must be true or false, got %s",
                         n->type == YAML_SCALAR_NODE ? QUOTE_NODE(n, q) : pjs_yaml_kind_name(n));
}

/* ---- mappings ------------------------------------------------------------ */

int pjs_yaml_map_pair(pjs_yaml *y, const yaml_node_t *n, size_t i, const char *path,
                      yaml_node_t **key, yaml_node_t **value)
{
    const yaml_node_pair_t *p = &n->data.mapping.pairs.start[i];
    *key = yaml_document_get_node(&y->doc, p->key);
    *value = yaml_document_get_node(&y->doc, p->value);
    if (*key == NULL || *value == NULL)
        return pjs_error_set(y->err, PJS_ERR_INTERNAL, "%s: %s: broken YAML node", y->label,
                             path);
    if ((*key)->type != YAML_SCALAR_NODE)
        return pjs_yaml_fail(y, *key, path, "mapping keys must be strings, got %s",
                             pjs_yaml_kind_name(*key));
    return 0;
}

size_t pjs_yaml_map_size(const yaml_node_t *n)
{
    return (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
}

int pjs_yaml_collect_fields(pjs_yaml *y, const yaml_node_t *n, const char *path,
                            pjs_yaml_field *fields, size_t n_fields, yaml_node_t **out_unknown)
{
    *out_unknown = NULL;
    if (n->type != YAML_MAPPING_NODE)
        return pjs_yaml_fail(y, n, path, "must be a mapping, got %s", pjs_yaml_kind_name(n));
    for (size_t i = 0; i < pjs_yaml_map_size(n); i++) {
        yaml_node_t *key = NULL, *value = NULL;
        int rc = pjs_yaml_map_pair(y, n, i, path, &key, &value);
        if (rc != 0)
            return rc;
        pjs_yaml_field *f = NULL;
        for (size_t k = 0; k < n_fields && f == NULL; k++)
            if (pjs_yaml_scalar_is(key, fields[k].key))
                f = &fields[k];
        if (f == NULL) {
            if (*out_unknown == NULL)
                *out_unknown = key;
            continue;
        }
        if (f->value != NULL) {
            char sub[PJS_YAML_PATH_MAX];
            pjs_yaml_path_key(sub, path, f->key);
            return pjs_yaml_fail(y, key, sub, "duplicate key");
        }
        f->value = value;
    }
    return 0;
}

int pjs_yaml_unknown_key(pjs_yaml *y, const yaml_node_t *key, const char *path)
{
    char q[PJS_YAML_QUOTE_MAX];
    if (path[0] == '\0')
        return pjs_yaml_fail(y, key, "", "unknown key %s at top level", QUOTE_NODE(key, q));
    return pjs_yaml_fail(y, key, path, "unknown key %s", QUOTE_NODE(key, q));
}

int pjs_yaml_get_fields(pjs_yaml *y, const yaml_node_t *n, const char *path,
                        pjs_yaml_field *fields, size_t n_fields)
{
    yaml_node_t *unknown = NULL;
    int rc = pjs_yaml_collect_fields(y, n, path, fields, n_fields, &unknown);
    if (rc == 0 && unknown != NULL)
        rc = pjs_yaml_unknown_key(y, unknown, path);
    return rc;
}

int pjs_yaml_require(pjs_yaml *y, const pjs_yaml_field *f, const char *parent,
                     const yaml_node_t *at)
{
    if (f->value != NULL)
        return 0;
    char sub[PJS_YAML_PATH_MAX];
    pjs_yaml_path_key(sub, parent, f->key);
    return pjs_yaml_fail(y, at, sub, "required key is missing");
}

/* ---- names must be unique ------------------------------------------------ */

/* A name of a list item or a mapping key, and where it stands. */
struct named {
    const char *text;
    size_t len;
    size_t index;
};

static int cmp_named(const void *a, const void *b)
{
    const struct named *x = a, *y = b;
    size_t len = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->text, y->text, len);
    if (r == 0)
        r = (x->len > y->len) - (x->len < y->len);
    return r != 0 ? r : (x->index > y->index) - (x->index < y->index);
}

static bool same_name(const struct named *x, const struct named *y)
{
    return x->len == y->len && memcmp(x->text, y->text, x->len) == 0;
}

/* Sorts v (n log n, so long hostile inputs stay cheap) and returns the first
 * index, in document order, whose name occurred before (n if none), and in
 * *out_first where it occurred first. */
static size_t first_duplicate(struct named *v, size_t n, size_t *out_first)
{
    qsort(v, n, sizeof *v, cmp_named);
    size_t dup = n;
    for (size_t i = 1; i < n; i++) {
        if (same_name(&v[i - 1], &v[i]) && (i < 2 || !same_name(&v[i - 2], &v[i])) &&
            v[i].index < dup) {
            dup = v[i].index;
            *out_first = v[i - 1].index;
        }
    }
    return dup;
}

int pjs_yaml_get_map(pjs_yaml *y, const yaml_node_t *n, const char *path, size_t *out_count)
{
    if (n->type != YAML_MAPPING_NODE)
        return pjs_yaml_fail(y, n, path, "must be a mapping, got %s", pjs_yaml_kind_name(n));
    size_t count = pjs_yaml_map_size(n);
    struct named *v = malloc((count > 0 ? count : 1) * sizeof *v);
    if (v == NULL)
        return pjs_yaml_fail_nomem(y, path);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < count; i++) {
        yaml_node_t *key = NULL, *value = NULL;
        rc = pjs_yaml_map_pair(y, n, i, path, &key, &value);
        if (rc == 0)
            v[i] = (struct named){(const char *)key->data.scalar.value, key->data.scalar.length, i};
    }
    size_t first = 0, dup = rc == 0 ? first_duplicate(v, count, &first) : count;
    free(v);
    if (rc != 0 || dup == count) {
        *out_count = count;
        return rc;
    }
    yaml_node_t *key = NULL, *value = NULL;
    pjs_yaml_map_pair(y, n, dup, path, &key, &value);
    char q[PJS_YAML_QUOTE_MAX];
    return pjs_yaml_fail(y, key, path, "duplicate key %s", QUOTE_NODE(key, q));
}

void pjs_yaml_map_entry(pjs_yaml *y, const yaml_node_t *map, size_t i, yaml_node_t **key,
                        yaml_node_t **value)
{
    const yaml_node_pair_t *p = &map->data.mapping.pairs.start[i];
    *key = yaml_document_get_node(&y->doc, p->key);
    *value = yaml_document_get_node(&y->doc, p->value);
}

/* ---- lists --------------------------------------------------------------- */

int pjs_yaml_get_list(pjs_yaml *y, const yaml_node_t *n, const char *path, bool non_empty,
                      size_t *out_count)
{
    if (n->type != YAML_SEQUENCE_NODE)
        return pjs_yaml_fail(y, n, path, "must be a list, got %s", pjs_yaml_kind_name(n));
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (non_empty && count == 0)
        return pjs_yaml_fail(y, n, path, "must not be empty");
    *out_count = count;
    return 0;
}

yaml_node_t *pjs_yaml_list_item(pjs_yaml *y, const yaml_node_t *list, size_t i)
{
    return yaml_document_get_node(&y->doc, list->data.sequence.items.start[i]);
}

int pjs_yaml_check_unique(pjs_yaml *y, const yaml_node_t *list, const char *path,
                          const char **names, size_t n, const char *field_suffix)
{
    if (n < 2)
        return 0;
    struct named *v = malloc(n * sizeof *v);
    if (v == NULL)
        return pjs_yaml_fail_nomem(y, path);
    for (size_t i = 0; i < n; i++)
        v[i] = (struct named){names[i], strlen(names[i]), i};
    size_t first = 0, dup = first_duplicate(v, n, &first);
    free(v);
    if (dup == n)
        return 0;
    char sub[PJS_YAML_PATH_MAX], q[PJS_YAML_QUOTE_MAX];
    pjs_yaml_path_set(sub, "%s[%zu]%s", path, dup, field_suffix);
    return pjs_yaml_fail(y, pjs_yaml_list_item(y, list, dup), sub,
                         "duplicate name %s (also %s[%zu])",
                         pjs_yaml_quote(names[dup], strlen(names[dup]), q, sizeof q), path, first);
}
