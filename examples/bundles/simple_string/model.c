/*
 * simple_string: integers written as text, added and subtracted by an
 * executable, behind two hooks. Clients send INPUT0 and INPUT1, BYTES
 * [batch, 16] of decimal numerals, and get OUTPUT0 = INPUT0 + INPUT1 and
 * OUTPUT1 = INPUT0 - INPUT1, as numerals again (Triton's simple_string
 * example model, which its example clients call).
 *
 * preprocess parses every numeral into the executable's i32 inputs `a` and
 * `b` and refuses, with the element's position and text, a numeral that is
 * not one (optional sign, then decimal digits, nothing else), one outside
 * the 32-bit range, and a pair whose sum or difference leaves that range
 * (the executable would wrap around); and a batch of more rows than the
 * executable's largest batch size (8, as Triton's max_batch_size). postprocess writes `sum` and
 * `difference` back as numerals: "-" for negatives, no leading zeros.
 */
#include <pjserve/model.h>

#include <stdint.h>

#define WIDTH 16           /* numerals per row */
#define MAX_ROWS 8         /* the executable's largest batch size (Triton's max_batch_size) */
#define NUMERAL_MAX 11     /* "-2147483648" */
#define SHOWN_MAX 40       /* bytes of a bad element quoted in a message */

/* The element's bytes for a message: printable ASCII as is, the rest as
 * \xNN, cut at SHOWN_MAX. */
static const char *shown(const char *s, uint32_t len, char *buf, size_t size)
{
    size_t at = 0;
    for (uint32_t i = 0; i < len && at + 8 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == SHOWN_MAX) {
            at += (size_t)snprintf(buf + at, size - at, "...");
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            buf[at++] = (char)c;
        else
            at += (size_t)snprintf(buf + at, size - at, "\\x%02x", c);
    }
    buf[at] = '\0';
    return buf;
}

#define NOT_A_NUMERAL "is not an integer numeral (an optional sign, then decimal digits)"
#define OUT_OF_RANGE "is out of range: numerals must lie in -2147483648..2147483647"

/* INVALID_ARGUMENT naming element `element` of `input`, its text and why. */
static int refuse(pjserve_ctx *ctx, const char *input, int64_t element, const char *s,
                  uint32_t len, const char *why)
{
    char q[4 * SHOWN_MAX + 8];
    pjserve_error(ctx, "%s[%lld][%lld]: \"%s\" %s", input, (long long)(element / WIDTH),
                  (long long)(element % WIDTH), shown(s, len, q, sizeof q), why);
    return PJSERVE_INVALID_ARGUMENT;
}

/* A numeral: an optional sign and 1 or more decimal digits, within the
 * 32-bit range. */
static int parse_numeral(pjserve_ctx *ctx, const char *input, int64_t element, const char *s,
                         uint32_t len, int32_t *out)
{
    uint32_t i = len > 0 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
    bool negative = i == 1 && s[0] == '-';
    if (i == len)
        return refuse(ctx, input, element, s, len, NOT_A_NUMERAL);
    int64_t magnitude = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return refuse(ctx, input, element, s, len, NOT_A_NUMERAL);
        magnitude = magnitude * 10 + (s[i] - '0');
        if (magnitude > (int64_t)INT32_MAX + 1)
            return refuse(ctx, input, element, s, len, OUT_OF_RANGE);
    }
    int64_t v = negative ? -magnitude : magnitude;
    if (v > INT32_MAX)
        return refuse(ctx, input, element, s, len, OUT_OF_RANGE);
    *out = (int32_t)v;
    return PJSERVE_OK;
}

/* INPUT0, INPUT1 bytes [n, 16] -> a, b i32 [n, 16]. */
int pjserve_preprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                       pjserve_tensor *out, size_t n_out)
{
    (void)n_in, (void)n_out;
    int64_t rows = in[0].shape[0];
    if (rows > MAX_ROWS) {
        pjserve_error(ctx, "a batch of %lld rows: simple_string takes at most %d per request "
                      "(its max_batch_size)",
                      (long long)rows, MAX_ROWS);
        return PJSERVE_INVALID_ARGUMENT;
    }
    if (in[1].shape[0] != rows) {
        pjserve_error(ctx, "INPUT0 has %lld rows and INPUT1 %lld: give both the same batch",
                      (long long)rows, (long long)in[1].shape[0]);
        return PJSERVE_INVALID_ARGUMENT;
    }
    size_t count = (size_t)rows * WIDTH;
    int32_t *values[2];
    for (int t = 0; t < 2; t++) {
        values[t] = pjserve_alloc(ctx, count * sizeof(int32_t));
        if (values[t] == NULL) {
            pjserve_error(ctx, "out of memory for %zu numerals", count);
            return PJSERVE_RESOURCE_EXHAUSTED;
        }
        pjserve_bytes_reader r = pjserve_bytes_begin(&in[t]);
        const char *s;
        uint32_t len;
        for (int64_t e = 0; pjserve_bytes_next(&r, &s, &len); e++) {
            int rc = parse_numeral(ctx, t == 0 ? "INPUT0" : "INPUT1", e, s, len, &values[t][e]);
            if (rc != PJSERVE_OK)
                return rc;
        }
        out[t].shape[0] = rows;
        out[t].data = values[t];
        out[t].nbytes = count * sizeof(int32_t);
    }
    for (size_t e = 0; e < count; e++) {
        int64_t a = values[0][e], b = values[1][e];
        int64_t sum = a + b, difference = a - b;
        if (sum < INT32_MIN || sum > INT32_MAX || difference < INT32_MIN ||
            difference > INT32_MAX) {
            pjserve_error(ctx, "element [%zu][%zu]: %s of %lld and %lld is %lld, outside the "
                          "32-bit range of the results",
                          e / WIDTH, e % WIDTH,
                          sum < INT32_MIN || sum > INT32_MAX ? "the sum" : "the difference",
                          (long long)a, (long long)b,
                          (long long)(sum < INT32_MIN || sum > INT32_MAX ? sum : difference));
            return PJSERVE_INVALID_ARGUMENT;
        }
    }
    return PJSERVE_OK;
}

/* One i32 tensor [n, 16] as numerals into a BYTES slot. */
static int write_numerals(pjserve_ctx *ctx, const pjserve_tensor *values, pjserve_tensor *out)
{
    size_t count = (size_t)values->shape[0] * WIDTH;
    const int32_t *v = values->data;
    pjserve_bytes_writer w;
    int rc = pjserve_bytes_reserve(ctx, &w, out, count * NUMERAL_MAX, count);
    if (rc != PJSERVE_OK)
        return rc;
    for (size_t e = 0; e < count; e++) {
        char text[NUMERAL_MAX + 1];
        int len = snprintf(text, sizeof text, "%d", (int)v[e]);
        pjserve_bytes_put(&w, text, (uint32_t)len);
    }
    out->shape[0] = values->shape[0];
    return PJSERVE_OK;
}

/* sum, difference i32 [n, 16] -> OUTPUT0, OUTPUT1 bytes [n, 16]. */
int pjserve_postprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                        pjserve_tensor *out, size_t n_out)
{
    (void)n_in, (void)n_out;
    int rc = write_numerals(ctx, &in[0], &out[0]);
    return rc != PJSERVE_OK ? rc : write_numerals(ctx, &in[1], &out[1]);
}
