/*
 * shm_json.c - reads the CUDA shared-memory register body: a JSON object
 * (jansson, bounded by the control-body limit before it gets here) whose
 * raw_handle is standard, padded base64 (RFC 4648 section 4, as Python's
 * base64.b64encode writes it) of exactly PJS_CUDA_IPC_HANDLE_SIZE bytes.
 * The decoder refuses anything else: other alphabets, whitespace, missing
 * or misplaced padding, and text that decodes to another length.
 */
#include "frontend/http/shm_json.h"

#include <jansson.h>
#include <stdbool.h>
#include <string.h>

/* The value of base64 digit ch, or -1. */
static int digit(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+')
        return 62;
    if (ch == '/')
        return 63;
    return -1;
}

/* Decodes text[len] into out[cap]; the decoded size into *n, or -1 when
 * text is not padded base64 or decodes to more than cap bytes. */
static int decode_base64(const char *text, size_t len, unsigned char *out, size_t cap,
                         size_t *n)
{
    if (len % 4 != 0)
        return -1;
    size_t done = 0;
    for (size_t i = 0; i < len; i += 4) {
        const unsigned char *q = (const unsigned char *)text + i;
        bool last = i + 4 == len;
        int pad = last && q[3] == '=' ? (q[2] == '=' ? 2 : 1) : 0;
        int v[4] = {digit(q[0]), digit(q[1]), pad == 2 ? 0 : digit(q[2]),
                    pad >= 1 ? 0 : digit(q[3])};
        if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0)
            return -1;
        unsigned bits = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 |
                        (unsigned)v[3];
        size_t bytes = 3 - (size_t)pad;
        if (done + bytes > cap)
            return -1;
        out[done++] = (unsigned char)(bits >> 16);
        if (bytes > 1)
            out[done++] = (unsigned char)(bits >> 8);
        if (bytes > 2)
            out[done++] = (unsigned char)bits;
    }
    *n = done;
    return 0;
}

static int refuse(pjs_error *err, const char *what)
{
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "CUDA shared memory register: %s; the body is {\"raw_handle\": "
                         "{\"b64\": base64 of the %d-byte CUDA IPC handle}, \"device_id\": "
                         "non-negative integer, \"byte_size\": non-negative integer}",
                         what, PJS_CUDA_IPC_HANDLE_SIZE);
}

static int read_handle(const json_t *raw, pjs_cuda_shm_register_body *out, pjs_error *err)
{
    const json_t *b64 = json_is_object(raw) ? json_object_get(raw, "b64") : NULL;
    if (!json_is_string(b64))
        return refuse(err, "raw_handle must be an object with a string \"b64\"");
    size_t n = 0;
    if (decode_base64(json_string_value(b64), json_string_length(b64), out->raw_handle,
                      sizeof out->raw_handle, &n) != 0)
        return refuse(err, "raw_handle.b64 is not padded base64 of at most 64 bytes");
    if (n != sizeof out->raw_handle)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "CUDA shared memory register: raw_handle.b64 decodes to %zu "
                             "bytes; a CUDA IPC handle (cudaIpcGetMemHandle) has %d",
                             n, PJS_CUDA_IPC_HANDLE_SIZE);
    return 0;
}

int pjs_cuda_shm_parse_register(const char *body, size_t len, pjs_cuda_shm_register_body *out,
                                pjs_error *err)
{
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (doc == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "CUDA shared memory register: malformed JSON body at line %d, "
                             "column %d: %s",
                             jerr.line, jerr.column, jerr.text);
    const json_t *device = json_object_get(doc, "device_id");
    const json_t *size = json_object_get(doc, "byte_size");
    int rc;
    if (!json_is_object(doc))
        rc = refuse(err, "the body must be a JSON object");
    else if (!json_is_integer(device) || json_integer_value(device) < 0)
        rc = refuse(err, "device_id must be a non-negative integer");
    else if (!json_is_integer(size) || json_integer_value(size) < 0)
        rc = refuse(err, "byte_size must be a non-negative integer");
    else
        rc = read_handle(json_object_get(doc, "raw_handle"), out, err);
    if (rc == 0) {
        out->device_id = (int64_t)json_integer_value(device);
        out->byte_size = (uint64_t)json_integer_value(size);
    }
    json_decref(doc);
    return rc;
}
