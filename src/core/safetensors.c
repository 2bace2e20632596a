/*
 * safetensors.c - the validating safetensors reader (see safetensors.h).
 *
 * Parsing runs in fixed stages, each of which either passes or names the
 * offending field, so nothing is sized or read from a value that has not been
 * checked:
 *
 *   1. the 8-byte little-endian header length, against the file size and
 *      PJS_SAFETENSORS_MAX_HEADER;
 *   2. the JSON header, decoded by jansson (which checks UTF-8 and, with
 *      JSON_REJECT_DUPLICATES, duplicate keys), which must be an object;
 *   3. "__metadata__": an object of string values;
 *   4. every tensor entry, in header order, into a scratch array of
 *      `st_entry` (names borrowed from the JSON): exactly dtype, shape and
 *      data_offsets; offsets inside the data region; sizes equal to
 *      numel * element size, computed with overflow checks;
 *   5. no two tensors share a byte (entries sorted by begin; empty tensors
 *      share no bytes, and gaps between tensors are allowed);
 *   6. argument_order, a string holding a JSON list that must name every
 *      tensor exactly once; the tensors are then copied out in that order
 *      with absolute file offsets and owned names.
 *
 * All scratch state (JSON trees, the entry array, the name index) lives in
 * one `parse_ctx` freed at a single exit, so every error path is leak-free.
 * A pjs_safetensors is zeroed before parsing and on close, so closing a
 * zeroed or failed one is safe. No globals; any thread may parse its own.
 */
#include "core/safetensors.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#define METADATA_KEY "__metadata__"
#define ORDER_KEY "argument_order"

/* One tensor entry as read from the header, before reordering. */
typedef struct st_entry {
    const char *name; /* borrowed from the header JSON */
    pjs_dtype dtype;
    pjs_shape shape;
    uint64_t begin; /* relative to the data region; begin <= end <= data size */
    uint64_t end;
    bool placed; /* named by argument_order already */
} st_entry;

/* Everything a parse allocates; freed by ctx_free whatever the outcome. */
typedef struct parse_ctx {
    const char *label;
    pjs_error *err;
    uint64_t header_len;
    uint64_t data_size;   /* bytes after the header */
    json_t *header;       /* the decoded header object */
    json_t *order;        /* the decoded argument_order list, or NULL */
    json_t *index;        /* tensor name -> position in `entries` */
    st_entry *entries;    /* in header order */
    size_t n_entries;
    pjs_st_tensor *out;   /* in argument order; handed to the caller */
} parse_ctx;

/* Sets an INVALID_ARGUMENT error that starts with the file's label. */
static int fail(parse_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(parse_ctx *c, const char *fmt, ...)
{
    char detail[PJS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return pjs_error_set(c->err, PJS_ERR_INVALID_ARGUMENT, "%s: %s", c->label, detail);
}

static int nomem(parse_ctx *c, const char *what)
{
    return pjs_error_set(c->err, PJS_ERR_NOMEM, "%s: out of memory for %s", c->label, what);
}

static void free_tensors(pjs_st_tensor *t, size_t n)
{
    for (size_t i = 0; t != NULL && i < n; i++)
        free(t[i].name);
    free(t);
}

static void ctx_free(parse_ctx *c)
{
    free_tensors(c->out, c->n_entries);
    free(c->entries);
    json_decref(c->index);
    json_decref(c->order);
    json_decref(c->header);
}

/* ---- stage 1: the length prefix ------------------------------------------ */

static int read_header_length(parse_ctx *c, const unsigned char *bytes, size_t size)
{
    if (size < 8)
        return fail(c, "file is %zu bytes, too short for the 8-byte header length", size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | bytes[i];
    if (n > PJS_SAFETENSORS_MAX_HEADER)
        return fail(c, "header length %llu exceeds the limit of %u bytes", (unsigned long long)n,
                    PJS_SAFETENSORS_MAX_HEADER);
    if (n > size - 8)
        return fail(c, "header length %llu exceeds file size %zu", (unsigned long long)n, size);
    c->header_len = n;
    c->data_size = size - 8 - n;
    return 0;
}

/* ---- stage 2: the JSON ---------------------------------------------------- */

static int decode_header(parse_ctx *c, const unsigned char *bytes)
{
    json_error_t jerr;
    c->header = json_loadb((const char *)bytes + 8, (size_t)c->header_len, JSON_REJECT_DUPLICATES,
                           &jerr);
    if (c->header == NULL)
        return fail(c, "header is not valid JSON: %s at line %d column %d", jerr.text, jerr.line,
                    jerr.column);
    if (!json_is_object(c->header))
        return fail(c, "header is not a JSON object");
    return 0;
}

/* ---- stage 3: __metadata__ ------------------------------------------------ */

/* Checks __metadata__ and decodes argument_order into c->order (left NULL
 * when absent; whether that is allowed is decided once tensors are counted). */
static int read_metadata(parse_ctx *c)
{
    json_t *meta = json_object_get(c->header, METADATA_KEY);
    if (meta == NULL)
        return 0;
    if (!json_is_object(meta))
        return fail(c, "%s is not an object", METADATA_KEY);
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value) {
        if (!json_is_string(value))
            return fail(c, "%s value for \"%s\" is not a string", METADATA_KEY, key);
    }
    json_t *order = json_object_get(meta, ORDER_KEY);
    if (order == NULL)
        return 0;
    json_error_t jerr;
    c->order = json_loadb(json_string_value(order), json_string_length(order),
                          JSON_REJECT_DUPLICATES, &jerr);
    if (c->order == NULL)
        return fail(c, "%s.%s is not a JSON list: %s at column %d", METADATA_KEY, ORDER_KEY,
                    jerr.text, jerr.column);
    if (!json_is_array(c->order))
        return fail(c, "%s.%s is not a JSON list", METADATA_KEY, ORDER_KEY);
    return 0;
}

/* ---- stage 4: tensor entries ---------------------------------------------- */

static int read_dtype(parse_ctx *c, st_entry *e, json_t *v)
{
    if (!json_is_string(v))
        return fail(c, "tensor \"%s\": dtype is not a string", e->name);
    e->dtype = pjs_dtype_from_safetensors(json_string_value(v), json_string_length(v));
    if (e->dtype == PJS_DTYPE_INVALID)
        return fail(c, "unknown dtype \"%s\" for tensor \"%s\"", json_string_value(v), e->name);
    return 0;
}

static int read_shape(parse_ctx *c, st_entry *e, json_t *v)
{
    if (!json_is_array(v))
        return fail(c, "tensor \"%s\": shape is not a list", e->name);
    if (json_array_size(v) > PJS_MAX_RANK)
        return fail(c, "tensor \"%s\": shape has rank %zu, more than the %d supported", e->name,
                    json_array_size(v), PJS_MAX_RANK);
    e->shape.rank = (int)json_array_size(v);
    for (int i = 0; i < e->shape.rank; i++) {
        json_t *d = json_array_get(v, (size_t)i);
        if (!json_is_integer(d))
            return fail(c, "tensor \"%s\": shape[%d] is not an integer", e->name, i);
        if (json_integer_value(d) < 0)
            return fail(c, "tensor \"%s\": shape[%d] is negative (%lld)", e->name, i,
                        (long long)json_integer_value(d));
        e->shape.dims[i] = (int64_t)json_integer_value(d);
    }
    return 0;
}

static int read_offsets(parse_ctx *c, st_entry *e, json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) != 2 ||
        !json_is_integer(json_array_get(v, 0)) || !json_is_integer(json_array_get(v, 1)))
        return fail(c, "tensor \"%s\": data_offsets is not a list of two integers", e->name);
    json_int_t begin = json_integer_value(json_array_get(v, 0));
    json_int_t end = json_integer_value(json_array_get(v, 1));
    if (begin < 0 || end < 0)
        return fail(c, "tensor \"%s\": data_offsets [%lld, %lld] has a negative offset", e->name,
                    (long long)begin, (long long)end);
    if (begin > end)
        return fail(c, "tensor \"%s\": data_offsets [%lld, %lld] begin is after end", e->name,
                    (long long)begin, (long long)end);
    if ((uint64_t)end > c->data_size)
        return fail(c, "tensor \"%s\": data_offsets [%lld, %lld] past the end of the data region "
                    "(%llu bytes)", e->name, (long long)begin, (long long)end,
                    (unsigned long long)c->data_size);
    e->begin = (uint64_t)begin;
    e->end = (uint64_t)end;
    return 0;
}

/* The byte count the offsets span must be what the dtype and shape need. */
static int check_size(parse_ctx *c, const st_entry *e)
{
    char shape[256];
    pjs_shape_format(&e->shape, shape, sizeof shape);
    uint64_t need;
    if (!pjs_shape_nbytes(&e->shape, pjs_dtype_size(e->dtype), &need))
        return fail(c, "tensor \"%s\": shape %s of %s is too large", e->name, shape,
                    pjs_dtype_safetensors_name(e->dtype));
    if (e->end - e->begin != need)
        return fail(c, "tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes but shape %s of "
                    "%s needs %llu", e->name, (unsigned long long)e->begin,
                    (unsigned long long)e->end, (unsigned long long)(e->end - e->begin), shape,
                    pjs_dtype_safetensors_name(e->dtype), (unsigned long long)need);
    return 0;
}

static int read_entry(parse_ctx *c, st_entry *e, const char *name, json_t *obj)
{
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    e->name = name;
    if (!json_is_object(obj))
        return fail(c, "tensor \"%s\" is not an object", name);
    for (size_t i = 0; i < 3; i++)
        if (json_object_get(obj, fields[i]) == NULL)
            return fail(c, "tensor \"%s\" has no \"%s\"", name, fields[i]);
    if (json_object_size(obj) != 3) {
        const char *key;
        json_t *value;
        json_object_foreach(obj, key, value) {
            (void)value;
            if (strcmp(key, fields[0]) != 0 && strcmp(key, fields[1]) != 0 &&
                strcmp(key, fields[2]) != 0)
                return fail(c, "tensor \"%s\" has unexpected field \"%s\"", name, key);
        }
    }
    int rc = read_dtype(c, e, json_object_get(obj, "dtype"));
    if (rc == 0)
        rc = read_shape(c, e, json_object_get(obj, "shape"));
    if (rc == 0)
        rc = read_offsets(c, e, json_object_get(obj, "data_offsets"));
    if (rc == 0)
        rc = check_size(c, e);
    return rc;
}

/* Reads every tensor entry and indexes the names (name -> entry position). */
static int read_entries(parse_ctx *c)
{
    size_t n = json_object_size(c->header);
    if (json_object_get(c->header, METADATA_KEY) != NULL)
        n--;
    c->index = json_object();
    c->entries = calloc(n > 0 ? n : 1, sizeof *c->entries);
    if (c->index == NULL || c->entries == NULL)
        return nomem(c, "the tensor table");
    const char *key;
    json_t *value;
    json_object_foreach(c->header, key, value) {
        if (strcmp(key, METADATA_KEY) == 0)
            continue;
        int rc = read_entry(c, &c->entries[c->n_entries], key, value);
        if (rc != 0)
            return rc;
        if (json_object_set_new(c->index, key, json_integer((json_int_t)c->n_entries)) != 0)
            return nomem(c, "the tensor index");
        c->n_entries++;
    }
    return 0;
}

/* ---- stage 5: overlaps ---------------------------------------------------- */

static int by_begin(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a;
    const st_entry *y = *(const st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static int check_overlaps(parse_ctx *c)
{
    if (c->n_entries < 2)
        return 0;
    int rc = 0;
    const st_entry **sorted = malloc(c->n_entries * sizeof *sorted);
    if (sorted == NULL)
        return nomem(c, "the overlap check");
    for (size_t i = 0; i < c->n_entries; i++)
        sorted[i] = &c->entries[i];
    qsort(sorted, c->n_entries, sizeof *sorted, by_begin);
    /* `reach` is the non-empty tensor whose bytes extend furthest so far. */
    const st_entry *reach = NULL;
    for (size_t i = 0; i < c->n_entries && rc == 0; i++) {
        const st_entry *e = sorted[i];
        if (e->begin == e->end)
            continue;
        if (reach != NULL && e->begin < reach->end)
            rc = fail(c, "tensor \"%s\": data_offsets [%llu, %llu] overlap tensor \"%s\" "
                      "[%llu, %llu]", e->name, (unsigned long long)e->begin,
                      (unsigned long long)e->end, reach->name, (unsigned long long)reach->begin,
                      (unsigned long long)reach->end);
        if (reach == NULL || e->end > reach->end)
            reach = e;
    }
    free(sorted);
    return rc;
}

/* ---- stage 6: argument_order ---------------------------------------------- */

static int place(parse_ctx *c, size_t pos, st_entry *e)
{
    pjs_st_tensor *t = &c->out[pos];
    t->name = strdup(e->name);
    if (t->name == NULL)
        return nomem(c, "a tensor name");
    t->dtype = e->dtype;
    t->shape = e->shape;
    t->offset = 8 + c->header_len + e->begin;
    t->nbytes = e->end - e->begin;
    e->placed = true;
    return 0;
}

static int apply_order(parse_ctx *c)
{
    if (c->order == NULL) {
        if (c->n_entries > 0)
            return fail(c, "%s.%s is missing (required when the file has tensors)", METADATA_KEY,
                        ORDER_KEY);
        return 0;
    }
    if (c->n_entries > 0 && (c->out = calloc(c->n_entries, sizeof *c->out)) == NULL)
        return nomem(c, "the tensor list");
    size_t placed = 0;
    size_t i;
    json_t *item;
    json_array_foreach(c->order, i, item) {
        if (!json_is_string(item))
            return fail(c, "%s.%s[%zu] is not a string", METADATA_KEY, ORDER_KEY, i);
        const char *name = json_string_value(item);
        json_t *slot = json_object_get(c->index, name);
        if (slot == NULL || strlen(name) != json_string_length(item))
            return fail(c, "%s.%s names \"%s\" which is not a tensor in the file", METADATA_KEY,
                        ORDER_KEY, name);
        st_entry *e = &c->entries[json_integer_value(slot)];
        if (e->placed)
            return fail(c, "%s.%s names \"%s\" more than once", METADATA_KEY, ORDER_KEY, name);
        int rc = place(c, placed, e);
        if (rc != 0)
            return rc;
        placed++;
    }
    for (size_t k = 0; k < c->n_entries; k++)
        if (!c->entries[k].placed)
            return fail(c, "%s.%s does not name tensor \"%s\"", METADATA_KEY, ORDER_KEY,
                        c->entries[k].name);
    return 0;
}

/* ---- public API ----------------------------------------------------------- */

/* Parses a header whose first 8 + header length bytes are in head, of a
 * file of `size` bytes. */
static int parse_header(pjs_safetensors *st, const unsigned char *head, size_t size,
                        const char *label, pjs_error *err)
{
    parse_ctx c = {.label = label != NULL ? label : "<safetensors>", .err = err};
    int rc = read_header_length(&c, head, size);
    if (rc == 0)
        rc = decode_header(&c, head);
    if (rc == 0)
        rc = read_metadata(&c);
    if (rc == 0)
        rc = read_entries(&c);
    if (rc == 0)
        rc = check_overlaps(&c);
    if (rc == 0)
        rc = apply_order(&c);
    if (rc == 0) {
        st->size = size;
        st->n_tensors = c.n_entries;
        st->tensors = c.out; /* NULL when there are no tensors */
        c.out = NULL;
    }
    ctx_free(&c);
    return rc;
}

int pjs_safetensors_parse(pjs_safetensors *st, const unsigned char *bytes, size_t size,
                          const char *label, pjs_error *err)
{
    memset(st, 0, sizeof *st);
    st->fd = -1;
    int rc = parse_header(st, bytes, size, label, err);
    if (rc == 0)
        st->bytes = bytes;
    return rc;
}

/* The first 8 + header length bytes of the file (*len of them; fewer when
 * the length is out of bounds: parsing then refuses it before reading on). */
static int read_head(const pjs_safetensors *st, unsigned char **out, size_t *len, pjs_error *err)
{
    unsigned char prefix[8];
    size_t want = st->size < 8 ? (size_t)st->size : 8;
    int rc = pjs_pread_exact(st->fd, prefix, want, 0, st->path, err);
    if (rc != 0)
        return rc;
    uint64_t n = 0;
    for (int i = (int)want - 1; i >= 0; i--)
        n = (n << 8) | prefix[i];
    if (want == 8 && n <= PJS_SAFETENSORS_MAX_HEADER && n <= st->size - 8)
        want = 8 + (size_t)n;
    unsigned char *head = malloc(want + 1);
    if (head == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory for the header", st->path);
    memcpy(head, prefix, want < 8 ? want : 8);
    if (want > 8 && (rc = pjs_pread_exact(st->fd, head + 8, want - 8, 8, st->path, err)) != 0) {
        free(head);
        return rc;
    }
    *out = head;
    *len = want;
    return 0;
}

int pjs_safetensors_open(pjs_safetensors *st, const char *path, pjs_error *err)
{
    memset(st, 0, sizeof *st);
    st->fd = pjs_file_open_identity(path, &st->identity, err);
    if (st->fd < 0) {
        int rc = st->fd;
        st->fd = -1;
        return rc;
    }
    unsigned char *head = NULL;
    size_t len = 0;
    int rc = 0;
    if ((st->path = strdup(path)) == NULL)
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory", path);
    st->size = (size_t)st->identity.size;
    if (rc == 0)
        rc = read_head(st, &head, &len, err);
    if (rc == 0)
        rc = parse_header(st, head, (size_t)st->identity.size, path, err);
    free(head);
    if (rc != 0)
        pjs_safetensors_close(st);
    return rc;
}

void pjs_safetensors_close(pjs_safetensors *st)
{
    if (st == NULL)
        return;
    free_tensors(st->tensors, st->n_tensors);
    if (st->path != NULL && st->fd >= 0)
        close(st->fd);
    free(st->path);
    memset(st, 0, sizeof *st);
    st->fd = -1;
}

void pjs_safetensors_release_fd(pjs_safetensors *st)
{
    if (st->path != NULL && st->fd >= 0)
        close(st->fd);
    st->fd = -1;
}

/* The descriptor to read st's file through: its own, or the path opened
 * again and checked to be the file opened (close it with done_reading). */
static int reading_fd(const pjs_safetensors *st, pjs_error *err)
{
    pjs_file_identity now;
    int fd = st->fd >= 0 ? st->fd : pjs_file_open_identity(st->path, &now, err);
    if (fd < 0)
        return fd;
    int rc = st->fd >= 0 ? pjs_file_identity_of(fd, st->path, &now, err) : 0;
    if (rc == 0 && !pjs_file_identity_equal(&now, &st->identity))
        rc = pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                           "%s changed since it was opened (%s); its bytes are not read "
                           "again",
                           st->path,
                           now.dev != st->identity.dev || now.ino != st->identity.ino
                               ? "another file is there now"
                           : now.size != st->identity.size ? "its size differs"
                                                           : "it was written");
    if (rc != 0) {
        if (fd != st->fd)
            close(fd);
        return rc;
    }
    return fd;
}

static void done_reading(const pjs_safetensors *st, int fd)
{
    if (fd != st->fd)
        close(fd);
}

/* Bytes read per piece by pjs_safetensors_read_summed. */
#define SUMMED_PIECE ((size_t)1 << 20)

int pjs_safetensors_read_summed(const pjs_safetensors *st, const pjs_st_tensor *t, void *dst,
                                pjs_checksum *sum, pjs_error *err)
{
    int fd = st->path != NULL ? reading_fd(st, err) : -1;
    if (st->path != NULL && fd < 0)
        return fd;
    int rc = 0;
    for (uint64_t at = 0; rc == 0 && at < t->nbytes; at += SUMMED_PIECE) {
        size_t n = t->nbytes - at < SUMMED_PIECE ? (size_t)(t->nbytes - at) : SUMMED_PIECE;
        char *to = (char *)dst + at;
        if (st->path == NULL)
            memcpy(to, st->bytes + t->offset + at, n);
        else
            rc = pjs_pread_exact(fd, to, n, t->offset + at, st->path, err);
        if (rc == 0)
            pjs_checksum_update(sum, to, n);
    }
    if (st->path != NULL)
        done_reading(st, fd);
    return rc;
}

int pjs_safetensors_read(const pjs_safetensors *st, const pjs_st_tensor *t, uint64_t begin,
                         size_t n, void *dst, pjs_error *err)
{
    if (begin > t->nbytes || n > t->nbytes - begin)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "tensor \"%s\": bytes [%llu, +%zu) read outside its %llu bytes",
                             t->name, (unsigned long long)begin, n,
                             (unsigned long long)t->nbytes);
    if (st->path == NULL) {
        if (n > 0)
            memcpy(dst, st->bytes + t->offset + begin, n);
        return 0;
    }
    int fd = reading_fd(st, err);
    if (fd < 0)
        return fd;
    int rc = pjs_pread_exact(fd, dst, n, t->offset + begin, st->path, err);
    done_reading(st, fd);
    return rc;
}

const pjs_st_tensor *pjs_safetensors_find(const pjs_safetensors *st, const char *name)
{
    for (size_t i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0)
            return &st->tensors[i];
    return NULL;
}

const void *pjs_safetensors_data(const pjs_safetensors *st, const pjs_st_tensor *t)
{
    return st->bytes != NULL ? st->bytes + t->offset : NULL;
}

uint64_t pjs_safetensors_total_bytes(const pjs_safetensors *st)
{
    uint64_t total = 0;
    for (size_t i = 0; i < st->n_tensors; i++)
        total += st->tensors[i].nbytes;
    return total;
}
