/*
 * fuzz_auth_header.c - libFuzzer driver for what a client hands the access
 * rules (src/frontend/access.c): the Authorization value, the gRPC peer
 * string and the request path.
 *
 * Input: one selector byte (modulo 4) then the bytes:
 *   0  an Authorization value for pjs_access_parse_bearer: a token found
 *      must lie inside the value, be non-empty visible ASCII, and start
 *      after "Bearer " (any case);
 *   1  the same value through pjs_access_check for every class, against
 *      fixed admin and inference tokens: the answer is 0, UNAUTHENTICATED
 *      or PERMISSION_DENIED with a message, never the token; only the
 *      exact tokens are let in where a token is needed;
 *   2  a gRPC peer string (pjs_access_peer_is_loopback): no crash, and
 *      only strings of the loopback kinds are loopback;
 *   3  a path (pjs_access_rest_class): a class of the three.
 * Anything else aborts. Seeds: fuzz/corpus/fuzz_auth_header/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend/access.h"

#define ADMIN_TOKEN "fuzz-admin-token-0123456789abcdef"
#define INFER_TOKEN "fuzz-infer-token-0123456789abcdef"

/* A token file holding `token`, for the one pjs_access of the run. */
static void write_token(char *path, const char *token)
{
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, token, strlen(token)) != (ssize_t)strlen(token) ||
        fchmod(fd, 0600) != 0)
        abort();
    close(fd);
}

static const pjs_access *fuzz_access(void)
{
    static pjs_access *a;
    if (a == NULL) {
        char admin[] = "/tmp/fuzz_auth_admin_XXXXXX", infer[] = "/tmp/fuzz_auth_infer_XXXXXX";
        pjs_error err;
        write_token(admin, ADMIN_TOKEN);
        write_token(infer, INFER_TOKEN);
        int rc = pjs_access_create(admin, infer, &a, &err);
        unlink(admin);
        unlink(infer);
        if (rc != 0)
            abort();
    }
    return a;
}

static void bearer(const char *value, size_t len)
{
    const char *token;
    size_t n;
    if (pjs_access_parse_bearer(value, len, &token, &n) != 0)
        return;
    if (len < 7 || strncasecmp(value, "Bearer ", 7) != 0 || n == 0 || token < value + 7 ||
        token + n > value + len)
        abort();
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)token[i] <= 0x20 || (unsigned char)token[i] >= 0x7f)
            abort();
}

static void check(const char *value, size_t len)
{
    const pjs_access *a = fuzz_access();
    const char *token;
    size_t n;
    bool parsed = pjs_access_parse_bearer(value, len, &token, &n) == 0;
    bool is_admin = parsed && n == strlen(ADMIN_TOKEN) && memcmp(token, ADMIN_TOKEN, n) == 0;
    bool is_infer = parsed && n == strlen(INFER_TOKEN) && memcmp(token, INFER_TOKEN, n) == 0;
    for (int cls = PJS_ACCESS_OPEN; cls <= PJS_ACCESS_ADMIN; cls++) {
        for (int loopback = 0; loopback < 2; loopback++) {
            pjs_access_caller who = {value, len, 1, loopback != 0};
            pjs_error err;
            int rc = pjs_access_check(a, (pjs_access_class)cls, &who, "fuzz", &err);
            bool want = cls == PJS_ACCESS_OPEN || is_admin ||
                        (cls == PJS_ACCESS_INFER && is_infer);
            if ((rc == 0) != want)
                abort();
            if (rc != 0 && (err.msg[0] == '\0' || strstr(err.msg, ADMIN_TOKEN) != NULL ||
                            strstr(err.msg, INFER_TOKEN) != NULL ||
                            (rc != PJS_ERR_UNAUTHENTICATED && rc != PJS_ERR_PERMISSION_DENIED)))
                abort();
        }
    }
}

static void peer(const char *s)
{
    if (pjs_access_peer_is_loopback(s) && strncmp(s, "ipv4:127.", 9) != 0 &&
        strncmp(s, "ipv6:", 5) != 0 && strncmp(s, "unix:", 5) != 0 &&
        strncmp(s, "unix-abstract:", 14) != 0)
        abort();
}

static void path(const char *s)
{
    pjs_access_class c = pjs_access_rest_class(s);
    if (c != PJS_ACCESS_OPEN && c != PJS_ACCESS_INFER && c != PJS_ACCESS_ADMIN)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t len = size - 1;
    char *s = malloc(len + 1); /* NUL-terminated copy for the string functions */
    if (s == NULL)
        return 0;
    memcpy(s, data + 1, len);
    s[len] = '\0';
    switch (data[0] % 4) {
    case 0: bearer(s, len); break;
    case 1: check(s, len); break;
    case 2: peer(s); break;
    default: path(s); break;
    }
    free(s);
    return 0;
}
