/*
 * prom_text.h - a strict reader of the Prometheus text exposition format
 * (version 0.0.4), for `pjserve top`, which reads a server's /metrics over
 * the network: the bytes are untrusted.
 *
 * The reader copies the text once and parses the copy in place: sample
 * names, label names and (unescaped) label values point into it. Every
 * line must be a sample, a comment, or blank; a sample is
 *
 *     name[{label="value",...}] value [timestamp]
 *
 * with names of [a-zA-Z_:][a-zA-Z0-9_:]*, label names of
 * [a-zA-Z_][a-zA-Z0-9_]*, values escaped with \\, \" and \n only, each label
 * at most once, a value that is a decimal number, NaN, +Inf or -Inf, and an
 * optional integer timestamp. "# TYPE" comments must name a known type.
 * Anything else is refused with the line number and what was expected.
 * The document holds at most PJS_PROM_MAX_SAMPLES samples of at most
 * PJS_PROM_MAX_LABELS labels each. No threads; a document belongs to its
 * caller.
 */
#ifndef PJS_CLI_PROM_TEXT_H
#define PJS_CLI_PROM_TEXT_H

#include <stddef.h>

#include "core/status.h"

#define PJS_PROM_MAX_SAMPLES 1000000
#define PJS_PROM_MAX_LABELS 32

typedef struct pjs_prom_label {
    const char *name;  /* NUL-terminated, inside the document's copy */
    const char *value; /* unescaped; may be empty */
} pjs_prom_label;

typedef struct pjs_prom_sample {
    const char *name;
    const pjs_prom_label *labels; /* n_labels of them, in the text's order */
    size_t n_labels;
    double value;
} pjs_prom_sample;

typedef struct pjs_prom_doc {
    pjs_prom_sample *samples; /* in the text's order */
    size_t n_samples;
    char *text;               /* the copy everything points into */
    pjs_prom_label *labels;   /* every sample's labels, back to back */
} pjs_prom_doc;

/* Parses len bytes of text into out (which the caller frees with
 * pjs_prom_free, also after a failure). INVALID_ARGUMENT with "line N: ..."
 * for text that is not the format; RESOURCE_EXHAUSTED past the bounds;
 * NOMEM. */
int pjs_prom_parse(const char *text, size_t len, pjs_prom_doc *out, pjs_error *err);

void pjs_prom_free(pjs_prom_doc *doc);

/* The value of label `name` of sample s, or NULL. */
const char *pjs_prom_label_value(const pjs_prom_sample *s, const char *name);

#endif
