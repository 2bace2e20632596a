/*
 * npy.c - reading and writing numpy .npy files (see npy.h).
 *
 * A .npy file is "\x93NUMPY", a major and minor version byte, a little-endian
 * header length (2 bytes in 1.0, 4 bytes in 2.0 and 3.0), a header that is the
 * repr() of a Python dict, and the raw array bytes. numpy reads the header
 * with ast.literal_eval; we do not evaluate Python, so the reader below is a
 * small strict parser for the one form numpy writes:
 *
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *
 * Keys may come in any order, strings may use either quote (no escapes), the
 * shape is a tuple of non-negative decimal integers (a one-element tuple needs
 * its comma, `()` is a scalar, a Python 2 'L' suffix is tolerated) and
 * whitespace may appear between tokens. Anything else - other keys, duplicate
 * keys, structured descrs, expressions - is refused with a message naming the
 * label (usually the path) and the header field. The data must be exactly as
 * long as dtype and shape say: short files and trailing bytes are both errors.
 *
 * The writer produces version 1.0 files byte-identical to numpy.save's:
 * sorted keys, numpy's spare space for growing the first axis, and padding
 * with spaces and a final '\n' so that the data starts at a multiple of 64.
 * It writes a temporary file beside the target and renames it into place.
 *
 * Everything here works on caller-owned memory; any thread may call it.
 */
#include "core/npy.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/mapped_file.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64
/* numpy leaves room for the first extent to grow to this many digits. */
#define NPY_GROWTH_DIGITS 21

/* ---- header parsing ------------------------------------------------------ */

/* A cursor over the header text; errors name `label`. */
struct hdr {
    const char *p;
    const char *begin;
    const char *end;
    const char *label;
    pjs_error *err;
};

/* The three keys, as found so far. */
struct hdr_fields {
    bool have_descr, have_fortran, have_shape;
    const char *descr;
    size_t descr_len;
    bool fortran_order;
    pjs_shape shape;
};

static void hdr_skip_ws(struct hdr *h)
{
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static int hdr_fail(struct hdr *h, const char *what)
{
    return pjs_error_set(h->err, PJS_ERR_INVALID_ARGUMENT,
                         "%s: header: malformed dict at offset %td: %s", h->label,
                         h->p - h->begin, what);
}

static int hdr_field_fail(struct hdr *h, const char *field, const char *what)
{
    return pjs_error_set(h->err, PJS_ERR_INVALID_ARGUMENT, "%s: header field '%s': %s",
                         h->label, field, what);
}

/* Copies at most 32 bytes of untrusted text into buf for a message, with
 * anything but printable ASCII shown as '?'. */
static const char *printable(const char *s, size_t n, char *buf, size_t bufsize)
{
    size_t i = 0;
    for (; i < n && i < 32 && i + 1 < bufsize; i++)
        buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    buf[i] = '\0';
    return buf;
}

/* Skips whitespace, then consumes `c` if it is next. */
static bool hdr_accept(struct hdr *h, char c)
{
    hdr_skip_ws(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return true;
    }
    return false;
}

/* A quoted string without escapes; the result points into the header. */
static int hdr_string(struct hdr *h, const char **out, size_t *out_len)
{
    hdr_skip_ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
        return hdr_fail(h, "expected a quoted string");
    char quote = *h->p++;
    const char *s = h->p;
    while (h->p < h->end && *h->p != quote) {
        if (*h->p == '\\' || *h->p == '\n')
            return hdr_fail(h, "escapes and newlines are not allowed in strings");
        h->p++;
    }
    if (h->p >= h->end)
        return hdr_fail(h, "unterminated string");
    *out = s;
    *out_len = (size_t)(h->p - s);
    h->p++;
    return 0;
}

/* Consumes `word` if the next token is exactly it (not a prefix of a name). */
static bool hdr_word(struct hdr *h, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(h->end - h->p) < n || memcmp(h->p, word, n) != 0)
        return false;
    const char *after = h->p + n;
    if (after < h->end && (*after == '_' || (*after >= 'a' && *after <= 'z') ||
                           (*after >= 'A' && *after <= 'Z') || (*after >= '0' && *after <= '9')))
        return false;
    h->p = after;
    return true;
}

static int hdr_bool(struct hdr *h, const char *field, bool *out)
{
    hdr_skip_ws(h);
    if (hdr_word(h, "True")) {
        *out = true;
        return 0;
    }
    if (hdr_word(h, "False")) {
        *out = false;
        return 0;
    }
    return hdr_field_fail(h, field, "expected True or False");
}

/* A non-negative decimal int64, without leading zeros, optionally followed by
 * the 'L' that Python 2 put after longs. */
static int hdr_extent(struct hdr *h, int64_t *out)
{
    hdr_skip_ws(h);
    if (h->p < h->end && *h->p == '-')
        return hdr_field_fail(h, "shape", "negative extent");
    if (h->p >= h->end || *h->p < '0' || *h->p > '9')
        return hdr_field_fail(h, "shape", "expected an integer extent");
    if (*h->p == '0' && h->p + 1 < h->end && h->p[1] >= '0' && h->p[1] <= '9')
        return hdr_field_fail(h, "shape", "extent with a leading zero");
    int64_t v = 0;
    while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *h->p - '0', &v))
            return hdr_field_fail(h, "shape", "extent does not fit in 64 bits");
        h->p++;
    }
    if (h->p < h->end && *h->p == 'L')
        h->p++;
    *out = v;
    return 0;
}

/* A tuple of extents: "()", "(3,)", "(2, 3)", "(2, 3,)". */
static int hdr_shape(struct hdr *h, pjs_shape *out)
{
    memset(out, 0, sizeof *out);
    if (!hdr_accept(h, '('))
        return hdr_field_fail(h, "shape", "expected a tuple");
    if (hdr_accept(h, ')'))
        return 0;
    for (;;) {
        int64_t v = 0;
        int rc = hdr_extent(h, &v);
        if (rc != 0)
            return rc;
        if (out->rank == PJS_MAX_RANK) {
            char msg[64];
            snprintf(msg, sizeof msg, "rank exceeds the maximum of %d", PJS_MAX_RANK);
            return hdr_field_fail(h, "shape", msg);
        }
        out->dims[out->rank++] = v;
        if (hdr_accept(h, ',')) {
            if (hdr_accept(h, ')'))
                return 0;
            continue;
        }
        if (!hdr_accept(h, ')'))
            return hdr_field_fail(h, "shape", "expected ',' or ')' in the tuple");
        if (out->rank == 1)
            return hdr_field_fail(h, "shape", "a one-element tuple needs a trailing comma");
        return 0;
    }
}

/* Parses one "key: value" pair into f. */
static int hdr_entry(struct hdr *h, struct hdr_fields *f)
{
    const char *key;
    size_t key_len;
    int rc = hdr_string(h, &key, &key_len);
    if (rc != 0)
        return rc;
    if (!hdr_accept(h, ':'))
        return hdr_fail(h, "expected ':' after a key");
    hdr_skip_ws(h);
    if (key_len == 5 && memcmp(key, "descr", 5) == 0) {
        if (f->have_descr)
            return hdr_field_fail(h, "descr", "duplicate key");
        f->have_descr = true;
        if (h->p < h->end && (*h->p == '[' || *h->p == '('))
            return hdr_field_fail(h, "descr", "structured dtypes are not supported");
        return hdr_string(h, &f->descr, &f->descr_len);
    }
    if (key_len == 13 && memcmp(key, "fortran_order", 13) == 0) {
        if (f->have_fortran)
            return hdr_field_fail(h, "fortran_order", "duplicate key");
        f->have_fortran = true;
        return hdr_bool(h, "fortran_order", &f->fortran_order);
    }
    if (key_len == 5 && memcmp(key, "shape", 5) == 0) {
        if (f->have_shape)
            return hdr_field_fail(h, "shape", "duplicate key");
        f->have_shape = true;
        return hdr_shape(h, &f->shape);
    }
    char shown[40];
    return pjs_error_set(h->err, PJS_ERR_INVALID_ARGUMENT, "%s: header: unexpected key '%s'",
                         h->label, printable(key, key_len, shown, sizeof shown));
}

/* The whole dict, then only whitespace up to the end of the header. */
static int hdr_dict(struct hdr *h, struct hdr_fields *f)
{
    if (!hdr_accept(h, '{'))
        return hdr_fail(h, "expected '{'");
    while (!hdr_accept(h, '}')) {
        int rc = hdr_entry(h, f);
        if (rc != 0)
            return rc;
        if (hdr_accept(h, ','))
            continue;
        if (!hdr_accept(h, '}'))
            return hdr_fail(h, "expected ',' or '}' after a value");
        break;
    }
    hdr_skip_ws(h);
    if (h->p != h->end)
        return hdr_fail(h, "unexpected text after the dict");
    if (!f->have_descr)
        return hdr_field_fail(h, "descr", "missing");
    if (!f->have_fortran)
        return hdr_field_fail(h, "fortran_order", "missing");
    if (!f->have_shape)
        return hdr_field_fail(h, "shape", "missing");
    return 0;
}

/* Maps the descr string to a dtype, honouring void2_as for "<V2"/"|V2". */
static int descr_dtype(const struct hdr_fields *f, pjs_dtype void2_as, const char *label,
                       pjs_dtype *out, pjs_error *err)
{
    const char *d = f->descr;
    size_t n = f->descr_len;
    char shown[40];
    printable(d, n, shown, sizeof shown);
    if (n == 3 && (d[0] == '<' || d[0] == '|') && d[1] == 'V' && d[2] == '2') {
        if (void2_as != PJS_DTYPE_BF16)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: header field 'descr': '%s' is a raw 2-byte type; bf16 "
                                 "arrays are saved this way (ml_dtypes), and are read only "
                                 "where the model declares the input bf16",
                                 label, shown);
        *out = PJS_DTYPE_BF16;
        return 0;
    }
    if (n > 0 && (d[0] == '>' || d[0] == '!'))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: header field 'descr': unsupported dtype '%s' (big-endian)",
                             label, shown);
    *out = pjs_dtype_from_numpy_descr(d, n);
    if (*out == PJS_DTYPE_INVALID)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: header field 'descr': unsupported dtype '%s'", label, shown);
    return 0;
}

/* Numpy's fixed-width strings: "|S<n>" (bytes) and "<U<n>" (UTF-32LE code
 * points). *width is n; 0 when descr is neither (width 0 is refused). */
enum str_kind { STR_NONE, STR_BYTES, STR_UTF32 };

static int descr_string(const struct hdr_fields *f, const char *label, enum str_kind *kind,
                        uint32_t *width, pjs_error *err)
{
    const char *d = f->descr;
    size_t n = f->descr_len;
    *kind = STR_NONE;
    if (n < 3 || (d[1] != 'S' && d[1] != 'U') || !(d[0] == '|' || d[0] == '<' || d[0] == '='))
        return 0;
    uint64_t w = 0;
    for (size_t i = 2; i < n; i++) {
        if (d[i] < '0' || d[i] > '9' || w > UINT32_MAX / 10)
            return 0; /* not a width: left to the dtype table, which refuses it */
        w = w * 10 + (uint64_t)(d[i] - '0');
    }
    char shown[40];
    if (w == 0 || w > INT32_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: header field 'descr': string width in '%s' must be 1..%d",
                             label, printable(d, n, shown, sizeof shown), INT32_MAX);
    *kind = d[1] == 'S' ? STR_BYTES : STR_UTF32;
    *width = (uint32_t)w;
    return 0;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Appends code point c as UTF-8; false for surrogates and c > 0x10FFFF. */
static bool put_utf8(unsigned char **out, uint32_t c)
{
    unsigned char *o = *out;
    if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF)
        return false;
    if (c < 0x80) {
        *o++ = (unsigned char)c;
    } else if (c < 0x800) {
        *o++ = (unsigned char)(0xC0 | (c >> 6));
        *o++ = (unsigned char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        *o++ = (unsigned char)(0xE0 | (c >> 12));
        *o++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        *o++ = (unsigned char)(0x80 | (c & 0x3F));
    } else {
        *o++ = (unsigned char)(0xF0 | (c >> 18));
        *o++ = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
        *o++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        *o++ = (unsigned char)(0x80 | (c & 0x3F));
    }
    *out = o;
    return true;
}

/* Turns `count` fixed-width strings at raw into a BYTES tensor (each
 * element without numpy's trailing NUL padding; UTF-32 as UTF-8). */
static int strings_to_bytes(const unsigned char *raw, uint64_t count, enum str_kind kind,
                            uint32_t width, const char *label, pjs_npy *a, pjs_error *err)
{
    size_t unit = kind == STR_UTF32 ? 4 : 1;
    /* UTF-8 takes at most 4 bytes per code point: never more than the raw size */
    size_t cap = (size_t)count * (PJS_BYTES_PREFIX + (size_t)width * unit);
    unsigned char *out = malloc(cap > 0 ? cap : 1);
    /* one element's UTF-8, only where there are elements: with none, the
     * header's width is bounded by nothing the file holds */
    bool need_elem = kind == STR_UTF32 && count > 0;
    unsigned char *elem = need_elem ? malloc((size_t)width * unit) : NULL;
    if (out == NULL || (need_elem && elem == NULL)) {
        free(out);
        free(elem);
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory for %llu strings", label,
                             (unsigned long long)count);
    }
    pjs_bytes_writer w = pjs_bytes_writer_init(out, cap);
    for (uint64_t i = 0; i < count; i++) {
        const unsigned char *s = raw + i * width * unit;
        size_t len = width;
        if (kind == STR_BYTES) {
            while (len > 0 && s[len - 1] == 0)
                len--;
            pjs_bytes_put(&w, s, len);
            continue;
        }
        while (len > 0 && le32(s + 4 * (len - 1)) == 0)
            len--;
        unsigned char *o = elem;
        for (size_t k = 0; k < len; k++) {
            uint32_t c = le32(s + 4 * k);
            if (!put_utf8(&o, c)) {
                free(out);
                free(elem);
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "%s: data: element %llu, character %zu: U+%X is not a "
                                     "Unicode scalar value",
                                     label, (unsigned long long)i, k, (unsigned)c);
            }
        }
        pjs_bytes_put(&w, elem, (size_t)(o - elem));
    }
    free(elem);
    a->dtype = PJS_DTYPE_BYTES;
    a->nbytes = (size_t)(w.at - out);
    a->data = a->nbytes > 0 ? out : NULL;
    if (a->data == NULL)
        free(out);
    return 0;
}

/* ---- reading ------------------------------------------------------------- */

static uint32_t read_le(const unsigned char *p, int n)
{
    uint32_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Checks magic and version; sets the offset and length of the header. */
static int parse_preamble(const unsigned char *bytes, size_t size, const char *label,
                          size_t *out_hdr_off, size_t *out_hdr_len, pjs_error *err)
{
    if (size < NPY_MAGIC_LEN + 2 || memcmp(bytes, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: not a .npy file (bad magic; %zu bytes)", label, size);
    int major = bytes[6], minor = bytes[7];
    if (minor != 0 || major < 1 || major > 3)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: unsupported .npy format version %d.%d (1.0, 2.0 or 3.0)",
                             label, major, minor);
    int len_bytes = major == 1 ? 2 : 4;
    size_t off = NPY_MAGIC_LEN + 2 + (size_t)len_bytes;
    if (size < off)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: truncated: %zu bytes end inside the header length", label, size);
    uint32_t hlen = read_le(bytes + NPY_MAGIC_LEN + 2, len_bytes);
    if (hlen > PJS_NPY_MAX_HEADER)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: header of %u bytes is larger than the %u allowed", label,
                             (unsigned)hlen, PJS_NPY_MAX_HEADER);
    if (size - off < hlen)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: truncated: header needs %u bytes, %zu present", label,
                             (unsigned)hlen, size - off);
    *out_hdr_off = off;
    *out_hdr_len = hlen;
    return 0;
}

int pjs_npy_parse(pjs_npy *a, const unsigned char *bytes, size_t size, pjs_dtype void2_as,
                  const char *label, pjs_error *err)
{
    memset(a, 0, sizeof *a);
    if (label == NULL)
        label = "npy";
    if (bytes == NULL)
        size = 0;
    int rc;
    void *data = NULL;
    size_t hdr_off = 0, hdr_len = 0;
    rc = parse_preamble(bytes, size, label, &hdr_off, &hdr_len, err);
    if (rc != 0)
        goto out;

    struct hdr_fields f = {0};
    struct hdr h = {(const char *)bytes + hdr_off, (const char *)bytes + hdr_off,
                    (const char *)bytes + hdr_off + hdr_len, label, err};
    rc = hdr_dict(&h, &f);
    if (rc != 0)
        goto out;
    if (f.fortran_order) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s: header field 'fortran_order': Fortran-order arrays are not "
                           "supported (save a C-contiguous array)", label);
        goto out;
    }
    enum str_kind str;
    uint32_t width = 0;
    rc = descr_string(&f, label, &str, &width, err);
    if (rc != 0)
        goto out;
    pjs_dtype dtype = PJS_DTYPE_BYTES;
    if (str == STR_NONE && (rc = descr_dtype(&f, void2_as, label, &dtype, err)) != 0)
        goto out;
    size_t elem_size = str == STR_NONE    ? pjs_dtype_size(dtype)
                       : str == STR_BYTES ? (size_t)width
                                          : 4 * (size_t)width;

    char shape_str[256];
    pjs_shape_format(&f.shape, shape_str, sizeof shape_str);
    uint64_t nbytes;
    if (!pjs_shape_nbytes(&f.shape, elem_size, &nbytes) || nbytes > SIZE_MAX / 2) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s: header field 'shape': %s of %s overflows the byte count", label,
                           shape_str, pjs_dtype_name(dtype));
        goto out;
    }
    size_t have = size - hdr_off - hdr_len;
    if (have != nbytes) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s: data: shape %s of %s needs %llu bytes, the file has %zu (%s)",
                           label, shape_str, pjs_dtype_name(dtype), (unsigned long long)nbytes,
                           have, have < nbytes ? "truncated" : "trailing bytes");
        goto out;
    }
    if (str != STR_NONE) {
        uint64_t count = 0;
        pjs_shape_nbytes(&f.shape, 1, &count);
        rc = strings_to_bytes(bytes + hdr_off + hdr_len, count, str, width, label, a, err);
        if (rc == 0)
            a->shape = f.shape;
        goto out;
    }
    if (nbytes > 0) {
        data = malloc((size_t)nbytes);
        if (data == NULL) {
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory for %llu bytes of data",
                               label, (unsigned long long)nbytes);
            goto out;
        }
        memcpy(data, bytes + hdr_off + hdr_len, (size_t)nbytes);
    }
    a->dtype = dtype;
    a->shape = f.shape;
    a->data = data;
    a->nbytes = (size_t)nbytes;
    data = NULL;
out:
    free(data);
    return rc;
}

int pjs_npy_load(pjs_npy *a, const char *path, pjs_dtype void2_as, pjs_error *err)
{
    memset(a, 0, sizeof *a);
    pjs_mapped_file mf;
    int rc = pjs_mapped_file_open(&mf, path, err);
    if (rc != 0)
        return rc;
    rc = pjs_npy_parse(a, mf.data, mf.size, void2_as, path, err);
    pjs_mapped_file_close(&mf);
    return rc;
}

void pjs_npy_free(pjs_npy *a)
{
    if (a == NULL)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---- writing ------------------------------------------------------------- */

/* Formats the complete 1.0 preamble + header into buf (NPY_ALIGN-multiple
 * long, like numpy's); returns its length or 0 when buf is too small. */
static size_t format_header(char *buf, size_t bufsize, const char *descr, const pjs_shape *s)
{
    char dict[512];
    size_t n = (size_t)snprintf(dict, sizeof dict,
                                "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < s->rank && n < sizeof dict; i++)
        n += (size_t)snprintf(dict + n, sizeof dict - n, "%s%lld", i ? ", " : "",
                              (long long)s->dims[i]);
    if (n < sizeof dict)
        n += (size_t)snprintf(dict + n, sizeof dict - n, "%s), }", s->rank == 1 ? "," : "");
    if (n >= sizeof dict)
        return 0;
    if (s->rank > 0) {
        char first[32];
        int digits = snprintf(first, sizeof first, "%lld", (long long)s->dims[0]);
        for (int i = digits; i < NPY_GROWTH_DIGITS && n + 1 < sizeof dict; i++)
            dict[n++] = ' ';
    }
    /* numpy: padlen = 64 - ((10 + len + 1) % 64), then the '\n'. */
    size_t pad = NPY_ALIGN - ((NPY_MAGIC_LEN + 4 + n + 1) % NPY_ALIGN);
    size_t hlen = n + pad + 1;
    size_t total = NPY_MAGIC_LEN + 4 + hlen;
    if (total > bufsize || hlen > 0xffff)
        return 0;
    memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (char)(hlen & 0xff);
    buf[9] = (char)(hlen >> 8);
    memcpy(buf + 10, dict, n);
    memset(buf + 10 + n, ' ', pad);
    buf[total - 1] = '\n';
    return total;
}

/* Written atomically (pjs_write_file_atomic_parts): no reader ever sees a
 * half-written file and a failed save leaves nothing behind. */
/* numpy strips trailing NULs when it reads "|S<n>", so an element ending
 * in one is refused rather than changed. */
int pjs_npy_save_bytes(const char *path, const pjs_shape *shape, const void *data, size_t nbytes,
                       pjs_error *err)
{
    uint64_t count = 0, have = 0;
    if (shape == NULL || !pjs_shape_nbytes(shape, 1, &count))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: invalid shape for BYTES", path);
    if (pjs_bytes_count(data, nbytes, &have, err) != 0)
        return pjs_error_prefix(err, "%s: ", path);
    if (have != count)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: the shape holds %llu strings, the data %llu", path,
                             (unsigned long long)count, (unsigned long long)have);
    size_t width = 1;
    const unsigned char *s;
    uint32_t len;
    uint64_t i = 0;
    pjs_bytes_reader r = pjs_bytes_reader_init(data, nbytes);
    while (pjs_bytes_next(&r, &s, &len)) {
        if (len > 0 && s[len - 1] == 0)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: string %llu ends with a NUL byte, which numpy's "
                                 "fixed-width strings drop when read",
                                 path, (unsigned long long)i);
        if (len > width)
            width = len;
        i++;
    }
    if (count > 0 && width > (SIZE_MAX - 1) / count)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: too large", path);
    unsigned char *fixed = calloc(count > 0 ? (size_t)count : 1, width);
    if (fixed == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory", path);
    r = pjs_bytes_reader_init(data, nbytes);
    for (i = 0; pjs_bytes_next(&r, &s, &len); i++)
        memcpy(fixed + i * width, s, len);
    char descr[24], header[1024];
    snprintf(descr, sizeof descr, "|S%zu", width);
    size_t hlen = format_header(header, sizeof header, descr, shape);
    int rc = hlen == 0 ? pjs_error_set(err, PJS_ERR_INTERNAL, "%s: header does not fit", path)
                       : pjs_write_file_atomic_parts(
                             path, (pjs_file_part[]){{header, hlen}, {fixed, count * width}}, 2,
                             err);
    free(fixed);
    return rc;
}

int pjs_npy_save(const char *path, pjs_dtype dtype, const pjs_shape *shape, const void *data,
                 pjs_error *err)
{
    const char *descr = dtype == PJS_DTYPE_BF16 ? "<V2" : pjs_dtype_numpy_descr(dtype);
    if (descr == NULL || pjs_dtype_size(dtype) == 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: cannot save dtype '%s'", path,
                             pjs_dtype_name(dtype));
    uint64_t nbytes;
    if (shape == NULL || !pjs_shape_nbytes(shape, pjs_dtype_size(dtype), &nbytes) ||
        nbytes > SIZE_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: invalid shape for %s", path,
                             pjs_dtype_name(dtype));
    if (nbytes > 0 && data == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: no data for %llu bytes", path,
                             (unsigned long long)nbytes);
    char header[1024];
    size_t hlen = format_header(header, sizeof header, descr, shape);
    if (hlen == 0)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "%s: header does not fit", path);
    pjs_file_part parts[2] = {{header, hlen}, {data, (size_t)nbytes}};
    return pjs_write_file_atomic_parts(path, parts, 2, err);
}
