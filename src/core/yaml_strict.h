/*
 * yaml_strict.h - strict YAML for pjserve's own files (bundle manifests, the
 * server configuration), on libyaml.
 *
 * A document is read in two passes. The first reads events only and refuses
 * what our schemas never need but an attacker might use: anchors and aliases
 * (billion laughs), tags, more than one document, nesting deeper than
 * PJS_YAML_MAX_DEPTH; it reports syntax errors with their line. The second
 * loads the node tree, which the caller's schema walks with the helpers
 * below: every mapping through a table of the keys allowed there (unknown
 * and duplicate keys are errors), scalars through typed getters. Numbers and
 * booleans must be plain scalars (`"4"` is a string, not a number); integers
 * are decimal without leading zeros (YAML 1.1 would read 010 as octal);
 * numbers are finite decimals (no .inf, .nan or hex).
 *
 * Every message is "label: field.path: problem (line N)": the label names
 * the file (or, for a value given as text, its origin: an environment
 * variable or a flag), the path the field. An empty path leaves out its
 * part, a NULL node (or a value given as text) the line. Every failure is
 * PJS_ERR_INVALID_ARGUMENT, or PJS_ERR_NOMEM (PJS_ERR_INTERNAL: a broken tree).
 *
 * A pjs_yaml is one parse, owned by one thread; there is no global state.
 */
#ifndef PJS_CORE_YAML_STRICT_H
#define PJS_CORE_YAML_STRICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "core/status.h"

#define PJS_YAML_MAX_DEPTH 32    /* our schemas need at most 5 levels; refuse deeper input */
#define PJS_YAML_PATH_MAX 160    /* field paths are built from known keys and indices */
#define PJS_YAML_QUOTE_MAX 80    /* buffer for pjs_yaml_quote: 64 bytes shown, quotes, "..." */
#define PJS_YAML_NAME_MAX 128    /* longest name pjs_yaml_get_name accepts */

/* One parse: the document (when loaded from bytes), where messages go and
 * what they start with. */
typedef struct pjs_yaml {
    yaml_document_t doc;
    bool loaded;             /* doc holds a tree: pjs_yaml_free deletes it; lines are known */
    const char *label;
    pjs_error *err;
} pjs_yaml;

/* One allowed key of a mapping; `value` is set when the key is present. */
typedef struct pjs_yaml_field {
    const char *key;
    yaml_node_t *value;
} pjs_yaml_field;

/* ---- loading ----------------------------------------------------------- */

/* Checks yaml[0..len) (first pass) and loads its tree into y (second).
 * *out_root is NULL when the input holds no document (empty, or comments
 * only); whether that is an error is the caller's to say. Call
 * pjs_yaml_free(y) afterwards, whatever this returned. */
int pjs_yaml_load(pjs_yaml *y, const char *yaml, size_t len, const char *label, pjs_error *err,
                  yaml_node_t **out_root);
void pjs_yaml_free(pjs_yaml *y);

/* For a value given as text (an environment variable, a flag): a parse
 * without a document, whose messages start with `label` and carry no line,
 * and a plain scalar node holding `text`, to pass to the typed getters so the
 * text follows the file's rules. The node points into text; it is not
 * written through. */
void pjs_yaml_init_text(pjs_yaml *y, const char *label, pjs_error *err);
void pjs_yaml_text_scalar(yaml_node_t *n, const char *text);

/* ---- messages and paths ---------------------------------------------------- */

/* Writes s[0..len) quoted into buf (at least PJS_YAML_QUOTE_MAX bytes), at
 * most 64 bytes of it, with bytes that are not printable ASCII shown as '?',
 * so hostile input cannot garble logs. Returns buf. */
const char *pjs_yaml_quote(const void *s, size_t len, char *buf, size_t bufsize);
/* The same for a scalar node's text. */
const char *pjs_yaml_quote_node(const yaml_node_t *n, char *buf, size_t bufsize);

/* Sets "label: path: message (line N)" and returns PJS_ERR_INVALID_ARGUMENT. */
int pjs_yaml_fail(pjs_yaml *y, const yaml_node_t *node, const char *path, const char *fmt,
                  ...) __attribute__((format(printf, 4, 5)));
/* Sets "label: path: out of memory" and returns PJS_ERR_NOMEM. */
int pjs_yaml_fail_nomem(pjs_yaml *y, const char *path);

/* Formats a field path into out (PJS_YAML_PATH_MAX bytes); one that would
 * not fit ends in "...". */
void pjs_yaml_path_set(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* out = parent + ".key" ("key" when parent is empty). */
void pjs_yaml_path_key(char *out, const char *parent, const char *key);
/* out = parent + "[i]". */
void pjs_yaml_path_index(char *out, const char *parent, size_t i);

/* ---- nodes and scalars ----------------------------------------------------- */

const char *pjs_yaml_kind_name(const yaml_node_t *n); /* "a scalar", "a list", "a mapping" */
/* n is a scalar whose text is exactly `text` (any style). */
bool pjs_yaml_scalar_is(const yaml_node_t *n, const char *text);
bool pjs_yaml_is_plain(const yaml_node_t *n);
/* A plain scalar that the YAML core schema reads as null ("", ~, null). */
bool pjs_yaml_is_null(const yaml_node_t *n);

/* Any non-null scalar without NUL bytes (so it can be kept as a C string). */
int pjs_yaml_get_string(pjs_yaml *y, const yaml_node_t *n, const char *path);
/* A malloc'd copy of a scalar's text (check it with pjs_yaml_get_string). */
int pjs_yaml_dup_string(pjs_yaml *y, const yaml_node_t *n, const char *path, char **out);
/* A name of a model, tensor or call: [A-Za-z0-9_.-]{1,128}, not starting
 * with '.'; *out is a malloc'd copy. */
int pjs_yaml_get_name(pjs_yaml *y, const yaml_node_t *n, const char *path, char **out);
/* A plain decimal integer: optional sign, digits, no leading zeros, within
 * int64. */
int pjs_yaml_get_int(pjs_yaml *y, const yaml_node_t *n, const char *path, int64_t *out);
/* A plain decimal number, [-+]? digits [. digits] [e [-+] digits] (or the
 * digits after the point only), finite. */
int pjs_yaml_get_number(pjs_yaml *y, const yaml_node_t *n, const char *path, double *out);
/* The same, > 0. */
int pjs_yaml_get_positive_number(pjs_yaml *y, const yaml_node_t *n, const char *path,
                                 double *out);
/* A plain true, True, TRUE, false, False or FALSE (not YAML 1.1's yes/no/on/off). */
int pjs_yaml_get_bool(pjs_yaml *y, const yaml_node_t *n, const char *path, bool *out);

/* ---- mappings and lists ---------------------------------------------------- */

/* Fills fields[].value from mapping n. Duplicate keys are errors at once;
 * the first unknown key is returned in *out_unknown for the caller to report
 * (so a caller can check a version key before the others). */
int pjs_yaml_collect_fields(pjs_yaml *y, const yaml_node_t *n, const char *path,
                            pjs_yaml_field *fields, size_t n_fields, yaml_node_t **out_unknown);
/* "unknown key \"k\"" at path (or "at top level"). */
int pjs_yaml_unknown_key(pjs_yaml *y, const yaml_node_t *key, const char *path);
/* pjs_yaml_collect_fields, with an unknown key an error. */
int pjs_yaml_get_fields(pjs_yaml *y, const yaml_node_t *n, const char *path,
                        pjs_yaml_field *fields, size_t n_fields);
/* "parent.key: required key is missing", at node `at` (may be NULL). */
int pjs_yaml_require(pjs_yaml *y, const pjs_yaml_field *f, const char *parent,
                     const yaml_node_t *at);

/* Walking a mapping n pair by pair, for a schema with rules of its own on
 * keys: its pair count, and the key and value of pair i, where a key that
 * is not a scalar is an error ("path: mapping keys must be strings"). */
size_t pjs_yaml_map_size(const yaml_node_t *n);
int pjs_yaml_map_pair(pjs_yaml *y, const yaml_node_t *n, size_t i, const char *path,
                      yaml_node_t **key, yaml_node_t **value);

/* A mapping whose keys are names the schema does not know in advance (model
 * names): every key a scalar, no key twice. Then iterate with
 * pjs_yaml_map_entry over i in [0, *out_count). */
int pjs_yaml_get_map(pjs_yaml *y, const yaml_node_t *n, const char *path,
                     size_t *out_count);
void pjs_yaml_map_entry(pjs_yaml *y, const yaml_node_t *map, size_t i, yaml_node_t **key,
                        yaml_node_t **value);

/* A list (non-empty when asked); its length in *out_count. */
int pjs_yaml_get_list(pjs_yaml *y, const yaml_node_t *n, const char *path, bool non_empty,
                      size_t *out_count);
yaml_node_t *pjs_yaml_list_item(pjs_yaml *y, const yaml_node_t *list, size_t i);
/* names[i] belongs to item i of `list`: reports the first item, in document
 * order, whose name occurred before, as "path[i]suffix: duplicate name". */
int pjs_yaml_check_unique(pjs_yaml *y, const yaml_node_t *list, const char *path,
                          const char **names, size_t n, const char *field_suffix);

#endif
