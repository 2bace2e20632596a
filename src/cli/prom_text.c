/*
 * prom_text.c - the strict Prometheus text reader (see prom_text.h).
 *
 * One pass over a private copy of the text, line by line. A cursor walks
 * the line; names and label values are cut out of the copy by writing NUL
 * bytes behind them (a value is unescaped in place: it never grows). Samples
 * and labels go into arrays that double up to their bounds; a sample keeps
 * the index of its first label until the end, when the label array no
 * longer moves and the indexes become pointers.
 */
#include "cli/prom_text.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    char *p;       /* the cursor */
    char *end;     /* end of the current line (its '\n' or the text's end) */
    size_t line;   /* 1-based, for messages */
    pjs_prom_doc *doc;
    size_t *first_label; /* per sample, until the end */
    size_t samples_cap, n_labels, labels_cap;
    pjs_error *err;
} parser;

static int fail(parser *ps, const char *what)
{
    return pjs_error_set(ps->err, PJS_ERR_INVALID_ARGUMENT, "line %zu: %s", ps->line, what);
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

static void skip_blanks(parser *ps)
{
    while (ps->p < ps->end && is_blank(*ps->p))
        ps->p++;
}

static bool name_start(char c, bool colon)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}

static bool name_char(char c, bool colon)
{
    return name_start(c, colon) || (c >= '0' && c <= '9');
}

/* A metric name (colon) or label name at the cursor; its end, or NULL. */
static char *scan_name(parser *ps, bool colon)
{
    if (ps->p >= ps->end || !name_start(*ps->p, colon))
        return NULL;
    char *q = ps->p + 1;
    while (q < ps->end && name_char(*q, colon))
        q++;
    return q;
}

/* "NaN", "+Inf", "-Inf" or a decimal number, the whole of [s, e). */
static int parse_number(const char *s, const char *e, double *out)
{
    size_t n = (size_t)(e - s);
    if (n == 3 && memcmp(s, "NaN", 3) == 0) {
        *out = NAN;
        return 0;
    }
    if (n == 4 && (memcmp(s, "+Inf", 4) == 0 || memcmp(s, "-Inf", 4) == 0)) {
        *out = s[0] == '+' ? INFINITY : -INFINITY;
        return 0;
    }
    /* Digits, one point, an exponent: what strtod reads as decimal, and no
     * hexadecimal, "inf" or "nan(...)" spellings. */
    char buf[64];
    if (n == 0 || n >= sizeof buf)
        return -1;
    size_t i = 0, digits = 0;
    if (s[i] == '+' || s[i] == '-')
        i++;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        digits++;
    if (i < n && s[i] == '.')
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            digits++;
    if (digits == 0)
        return -1;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t exp_digits = 0;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            exp_digits++;
        if (exp_digits == 0)
            return -1;
    }
    if (i != n)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    char *stop;
    double v = strtod(buf, &stop);
    if (*stop != '\0')
        return -1;
    *out = v; /* overflow gives +-HUGE_VAL, underflow 0: both fine here */
    return 0;
}

/* The token at the cursor, up to a blank or the line's end. */
static char *token_end(parser *ps)
{
    char *q = ps->p;
    while (q < ps->end && !is_blank(*q))
        q++;
    return q;
}

static int add_label(parser *ps, const char *name, const char *value)
{
    if (ps->n_labels == ps->labels_cap) {
        size_t cap = ps->labels_cap ? ps->labels_cap * 2 : 64;
        pjs_prom_label *grown = realloc(ps->doc->labels, cap * sizeof *grown);
        if (grown == NULL)
            return pjs_error_set(ps->err, PJS_ERR_NOMEM, "out of memory reading metrics");
        ps->doc->labels = grown;
        ps->labels_cap = cap;
    }
    ps->doc->labels[ps->n_labels++] = (pjs_prom_label){name, value};
    return 0;
}

/* A quoted label value at the cursor, unescaped in place and cut with a
 * NUL where its closing quote was. */
static int label_value(parser *ps, const char **out)
{
    if (ps->p >= ps->end || *ps->p != '"')
        return fail(ps, "a label value must be in double quotes");
    char *src = ps->p + 1, *dst = src;
    *out = dst;
    for (; src < ps->end && *src != '"'; src++) {
        if (*src != '\\') {
            *dst++ = *src;
            continue;
        }
        if (++src >= ps->end)
            break;
        if (*src == 'n')
            *dst++ = '\n';
        else if (*src == '\\' || *src == '"')
            *dst++ = *src;
        else
            return fail(ps, "a label value has an escape other than \\\\, \\\" or \\n");
    }
    if (src >= ps->end)
        return fail(ps, "a label value is not closed with '\"'");
    *dst = '\0';
    ps->p = src + 1;
    return 0;
}

/* {name="value", ...} at the cursor; labels appended from `first`. */
static int label_set(parser *ps, size_t first)
{
    ps->p++; /* '{' */
    for (;;) {
        skip_blanks(ps);
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            return 0;
        }
        char *name = ps->p, *name_end = scan_name(ps, false);
        if (name_end == NULL)
            return fail(ps, "expected a label name ([a-zA-Z_][a-zA-Z0-9_]*) or '}'");
        ps->p = name_end;
        skip_blanks(ps);
        if (ps->p >= ps->end || *ps->p != '=')
            return fail(ps, "expected '=' after a label name");
        *name_end = '\0'; /* the '=' or a blank before it */
        ps->p++;
        skip_blanks(ps);
        const char *value = NULL;
        int rc = label_value(ps, &value);
        if (rc != 0)
            return rc;
        for (size_t i = first; i < ps->n_labels; i++)
            if (strcmp(ps->doc->labels[i].name, name) == 0)
                return fail(ps, "a label is given twice in one sample");
        if (ps->n_labels - first >= PJS_PROM_MAX_LABELS)
            return pjs_error_set(ps->err, PJS_ERR_RESOURCE_EXHAUSTED,
                                 "line %zu: more than %d labels in one sample", ps->line,
                                 PJS_PROM_MAX_LABELS);
        if ((rc = add_label(ps, name, value)) != 0)
            return rc;
        skip_blanks(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            return 0;
        }
        return fail(ps, "expected ',' or '}' after a label");
    }
}

static int add_sample(parser *ps, const char *name, size_t first, double value)
{
    pjs_prom_doc *d = ps->doc;
    if (d->n_samples == PJS_PROM_MAX_SAMPLES)
        return pjs_error_set(ps->err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "more than %d samples in the metrics", PJS_PROM_MAX_SAMPLES);
    if (d->n_samples == ps->samples_cap) {
        size_t cap = ps->samples_cap ? ps->samples_cap * 2 : 64;
        pjs_prom_sample *grown = realloc(d->samples, cap * sizeof *grown);
        size_t *grown_first = realloc(ps->first_label, cap * sizeof *grown_first);
        if (grown != NULL)
            d->samples = grown;
        if (grown_first != NULL)
            ps->first_label = grown_first;
        if (grown == NULL || grown_first == NULL)
            return pjs_error_set(ps->err, PJS_ERR_NOMEM, "out of memory reading metrics");
        ps->samples_cap = cap;
    }
    ps->first_label[d->n_samples] = first;
    d->samples[d->n_samples++] =
        (pjs_prom_sample){.name = name, .n_labels = ps->n_labels - first, .value = value};
    return 0;
}

static int sample_line(parser *ps)
{
    char *name = ps->p, *name_end = scan_name(ps, true);
    if (name_end == NULL)
        return fail(ps, "expected a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), a comment or a "
                        "blank line");
    ps->p = name_end;
    skip_blanks(ps);
    size_t first = ps->n_labels;
    if (ps->p < ps->end && *ps->p == '{') {
        int rc = label_set(ps, first);
        if (rc != 0)
            return rc;
    } else {
        ps->p = name_end;
    }
    if (ps->p >= ps->end || !is_blank(*ps->p))
        return fail(ps, "expected a blank and a value after the metric name and labels");
    skip_blanks(ps);
    *name_end = '\0'; /* a blank or the '{', both behind the cursor now */
    char *v_end = token_end(ps);
    double value;
    if (parse_number(ps->p, v_end, &value) != 0)
        return fail(ps, "the value is not a number (decimal, NaN, +Inf or -Inf)");
    ps->p = v_end;
    skip_blanks(ps);
    if (ps->p < ps->end) {
        char *t_end = token_end(ps), *q = ps->p;
        if (*q == '-')
            q++;
        if (q == t_end)
            return fail(ps, "the timestamp is not an integer");
        for (; q < t_end; q++)
            if (*q < '0' || *q > '9')
                return fail(ps, "the timestamp is not an integer");
        ps->p = t_end;
        skip_blanks(ps);
        if (ps->p < ps->end)
            return fail(ps, "unexpected text after the sample's timestamp");
    }
    return add_sample(ps, name, first, value);
}

/* "# HELP name text", "# TYPE name type", or any other comment. */
static int comment_line(parser *ps)
{
    ps->p++;
    skip_blanks(ps);
    char *kw_end = token_end(ps);
    size_t kw = (size_t)(kw_end - ps->p);
    bool help = kw == 4 && memcmp(ps->p, "HELP", 4) == 0;
    bool type = kw == 4 && memcmp(ps->p, "TYPE", 4) == 0;
    if (!help && !type)
        return 0;
    ps->p = kw_end;
    skip_blanks(ps);
    char *name_end = scan_name(ps, true);
    if (name_end == NULL || (name_end < ps->end && !is_blank(*name_end)))
        return fail(ps, help ? "# HELP must name a metric" : "# TYPE must name a metric");
    if (!type)
        return 0;
    ps->p = name_end;
    skip_blanks(ps);
    static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    char *t_end = token_end(ps);
    size_t n = (size_t)(t_end - ps->p);
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (n == strlen(types[i]) && memcmp(ps->p, types[i], n) == 0) {
            ps->p = t_end;
            skip_blanks(ps);
            return ps->p == ps->end ? 0 : fail(ps, "unexpected text after the # TYPE line's type");
        }
    return fail(ps, "# TYPE must be counter, gauge, histogram, summary or untyped");
}

int pjs_prom_parse(const char *text, size_t len, pjs_prom_doc *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    if (memchr(text, '\0', len) != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "a NUL byte in the metrics: this is not Prometheus text");
    out->text = malloc(len + 1);
    if (out->text == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory reading metrics");
    memcpy(out->text, text, len);
    out->text[len] = '\0';
    parser ps = {.p = out->text, .line = 0, .doc = out, .err = err};
    char *text_end = out->text + len;
    int rc = 0;
    while (rc == 0 && ps.p < text_end) {
        ps.line++;
        char *nl = memchr(ps.p, '\n', (size_t)(text_end - ps.p));
        ps.end = nl != NULL ? nl : text_end;
        if (ps.end > ps.p && ps.end[-1] == '\r')
            rc = fail(&ps, "a carriage return ends the line (the format uses '\\n' only)");
        skip_blanks(&ps);
        if (rc == 0 && ps.p < ps.end)
            rc = *ps.p == '#' ? comment_line(&ps) : sample_line(&ps);
        ps.p = ps.end + (nl != NULL ? 1 : 0);
    }
    for (size_t i = 0; rc == 0 && i < out->n_samples; i++)
        out->samples[i].labels = out->labels + ps.first_label[i];
    free(ps.first_label);
    return rc;
}

void pjs_prom_free(pjs_prom_doc *doc)
{
    free(doc->samples);
    free(doc->labels);
    free(doc->text);
    memset(doc, 0, sizeof *doc);
}

const char *pjs_prom_label_value(const pjs_prom_sample *s, const char *name)
{
    for (size_t i = 0; i < s->n_labels; i++)
        if (strcmp(s->labels[i].name, name) == 0)
            return s->labels[i].value;
    return NULL;
}
