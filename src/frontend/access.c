/*
 * access.c - the classes of routes and methods, the token files, and the
 * access decision (see access.h for the rules).
 *
 * The tables below are the only place a call gets its class. REST patterns
 * are matched segment by segment: "*" stands for one segment, a final "**"
 * for any number (zero included). Tokens live in the pjs_access until it is
 * destroyed, when they are wiped.
 */
#include "frontend/access.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/log.h"
#include "frontend/client_id.h"

/* ---- the classes ----------------------------------------------------------- */

#define SVC "/inference.GRPCInferenceService/"
#define CONTROL "/pjserve.control.v1.ModelControl/"

static const struct {
    const char *method;
    pjs_access_class cls;
} grpc_classes[] = {
    {SVC "ServerLive", PJS_ACCESS_OPEN},
    {SVC "ServerReady", PJS_ACCESS_OPEN},
    {"/grpc.health.v1.Health/Check", PJS_ACCESS_OPEN},
    {"/grpc.health.v1.Health/Watch", PJS_ACCESS_OPEN},
    /* Reflection describes the services pjserve ships, never models. */
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", PJS_ACCESS_OPEN},
    {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", PJS_ACCESS_OPEN},
    {SVC "ModelReady", PJS_ACCESS_INFER},
    {SVC "ServerMetadata", PJS_ACCESS_INFER},
    {SVC "ModelMetadata", PJS_ACCESS_INFER},
    {SVC "ModelInfer", PJS_ACCESS_INFER},
    {SVC "ModelStreamInfer", PJS_ACCESS_INFER},
    {SVC "ModelConfig", PJS_ACCESS_INFER},
    {SVC "ModelStatistics", PJS_ACCESS_INFER},
    {SVC "RepositoryIndex", PJS_ACCESS_INFER},
    {CONTROL "ModelControlStatus", PJS_ACCESS_INFER},
    {CONTROL "NodeStatus", PJS_ACCESS_INFER},
    {SVC "RepositoryModelLoad", PJS_ACCESS_ADMIN},
    {SVC "RepositoryModelUnload", PJS_ACCESS_ADMIN},
    {SVC "SystemSharedMemoryStatus", PJS_ACCESS_ADMIN},
    {SVC "SystemSharedMemoryRegister", PJS_ACCESS_ADMIN},
    {SVC "SystemSharedMemoryUnregister", PJS_ACCESS_ADMIN},
    {SVC "CudaSharedMemoryStatus", PJS_ACCESS_ADMIN},
    {SVC "CudaSharedMemoryRegister", PJS_ACCESS_ADMIN},
    {SVC "CudaSharedMemoryUnregister", PJS_ACCESS_ADMIN},
    {SVC "TraceSetting", PJS_ACCESS_ADMIN},
    {SVC "LogSettings", PJS_ACCESS_ADMIN},
    {CONTROL "SetModelResidency", PJS_ACCESS_ADMIN},
    {CONTROL "SetModelPolicy", PJS_ACCESS_ADMIN},
    {CONTROL "Compact", PJS_ACCESS_ADMIN},
};

static const struct {
    const char *pattern;
    pjs_access_class cls;
} rest_classes[] = {
    {"/v2/health/live", PJS_ACCESS_OPEN},
    {"/v2/health/ready", PJS_ACCESS_OPEN},
    {"/v2", PJS_ACCESS_INFER},
    {"/v2/models/*/trace/setting", PJS_ACCESS_ADMIN},
    {"/v2/models/**", PJS_ACCESS_INFER},
    {"/v2/repository/index", PJS_ACCESS_INFER},
    {"/v2/pjserve/control", PJS_ACCESS_INFER},
    {"/v2/pjserve/node", PJS_ACCESS_INFER},
    {"/metrics", PJS_ACCESS_INFER},
    {"/v2/repository/models/*/load", PJS_ACCESS_ADMIN},
    {"/v2/repository/models/*/unload", PJS_ACCESS_ADMIN},
    {"/v2/pjserve/compact", PJS_ACCESS_ADMIN},
    {"/v2/pjserve/models/*/residency", PJS_ACCESS_ADMIN},
    {"/v2/pjserve/models/*/policy", PJS_ACCESS_ADMIN},
    {"/v2/systemsharedmemory/**", PJS_ACCESS_ADMIN},
    {"/v2/cudasharedmemory/**", PJS_ACCESS_ADMIN},
    {"/v2/logging", PJS_ACCESS_ADMIN},
    {"/v2/trace/**", PJS_ACCESS_ADMIN},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int grpc_index(const char *method)
{
    for (size_t i = 0; method != NULL && i < N_OF(grpc_classes); i++)
        if (strcmp(grpc_classes[i].method, method) == 0)
            return (int)i;
    return -1;
}

pjs_access_class pjs_access_grpc_class(const char *method)
{
    int i = grpc_index(method);
    return i < 0 ? PJS_ACCESS_ADMIN : grpc_classes[i].cls;
}

bool pjs_access_grpc_classified(const char *method)
{
    return grpc_index(method) >= 0;
}

/* The next non-empty segment of *p (advanced past it); its length in *len,
 * NULL when none is left. */
static const char *next_segment(const char **p, size_t *len)
{
    const char *s = *p;
    while (*s == '/')
        s++;
    if (*s == '\0')
        return NULL;
    const char *end = strchr(s, '/');
    *len = end != NULL ? (size_t)(end - s) : strlen(s);
    *p = s + *len;
    return s;
}

static bool rest_match(const char *pattern, const char *url)
{
    for (;;) {
        size_t plen = 0, ulen = 0;
        const char *ps = next_segment(&pattern, &plen);
        if (ps != NULL && plen == 2 && memcmp(ps, "**", 2) == 0)
            return true;
        const char *us = next_segment(&url, &ulen);
        if (ps == NULL || us == NULL)
            return ps == NULL && us == NULL;
        bool any = plen == 1 && ps[0] == '*';
        if (!any && (plen != ulen || memcmp(ps, us, ulen) != 0))
            return false;
    }
}

pjs_access_class pjs_access_rest_class(const char *url)
{
    for (size_t i = 0; url != NULL && i < N_OF(rest_classes); i++)
        if (rest_match(rest_classes[i].pattern, url))
            return rest_classes[i].cls;
    return PJS_ACCESS_ADMIN;
}

/* ---- peers ------------------------------------------------------------------ */

static bool v6_is_loopback(const struct in6_addr *a)
{
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

bool pjs_access_sockaddr_is_loopback(const struct sockaddr *sa)
{
    if (sa == NULL)
        return false;
    switch (sa->sa_family) {
    case AF_UNIX: return true;
    case AF_INET:
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    case AF_INET6: return v6_is_loopback(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    default: return false;
    }
}

bool pjs_access_peer_is_loopback(const char *peer)
{
    /* The peer's address as client_id.c reads gRPC peer strings (an
     * IPv4-mapped IPv6 address written as the IPv4 one). */
    char id[PJS_CLIENT_ID_MAX];
    struct in_addr a4;
    struct in6_addr a6;
    pjs_client_id_of_grpc_peer(peer, id);
    if (strcmp(id, "unix") == 0)
        return true;
    if (inet_pton(AF_INET, id, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, id, &a6) == 1 && v6_is_loopback(&a6);
}

/* ---- tokens ----------------------------------------------------------------- */

typedef struct access_token {
    char *bytes; /* NULL: none configured */
    size_t len;
} access_token;

struct pjs_access {
    access_token admin;
    access_token infer;
    char admin_file[256]; /* for the start-up log */
    char infer_file[256];
};

static bool visible_ascii(unsigned char c)
{
    return c > 0x20 && c < 0x7f;
}

/* Checks what was read from a token file and keeps it in t. */
static int accept_token(const char *flag, const char *path, char *buf, size_t n,
                        access_token *t, pjs_error *err)
{
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (n == 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s %s: the file is empty; put the token on its first line", flag,
                             path);
    for (size_t i = 0; i < n; i++)
        if (!visible_ascii((unsigned char)buf[i]))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s %s: byte %zu is not a visible ASCII character; the file "
                                 "must hold one line with the token only (no spaces)",
                                 flag, path, i);
    if (n < PJS_ACCESS_TOKEN_WARN_BELOW)
        pjs_warn("%s %s: the token is only %zu characters; use at least 32 random ones "
                 "(openssl rand -hex 32)",
                 flag, path, n);
    t->bytes = buf;
    t->len = n;
    return 0;
}

static int read_token(const char *flag, const char *path, access_token *t, pjs_error *err)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pjs_error_set(err, PJS_ERR_IO, "%s %s: cannot open it: %s", flag, path,
                             strerror(errno));
    char *buf = NULL;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = pjs_error_set(err, PJS_ERR_IO, "%s %s: %s", flag, path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s %s: not a regular file", flag,
                           path);
    } else if ((st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) != 0) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s %s: the file is readable or writable by group or others (mode "
                           "%04o); make it private: chmod 600 %s",
                           flag, path, (unsigned)(st.st_mode & 07777), path);
    } else if (st.st_size > PJS_ACCESS_TOKEN_MAX) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s %s: %lld bytes is too large for a token file (at most %d)", flag,
                           path, (long long)st.st_size, PJS_ACCESS_TOKEN_MAX);
    } else if ((buf = malloc(PJS_ACCESS_TOKEN_MAX + 1)) == NULL) {
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "no memory for %s", flag);
    }
    size_t n = 0;
    while (rc == 0 && n <= PJS_ACCESS_TOKEN_MAX) {
        ssize_t got = read(fd, buf + n, PJS_ACCESS_TOKEN_MAX + 1 - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc = pjs_error_set(err, PJS_ERR_IO, "%s %s: cannot read it: %s", flag, path,
                               strerror(errno));
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    if (rc == 0 && n > PJS_ACCESS_TOKEN_MAX)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s %s: too large for a token file (at most %d bytes)", flag, path,
                           PJS_ACCESS_TOKEN_MAX);
    if (rc == 0)
        rc = accept_token(flag, path, buf, n, t, err);
    if (rc != 0 && buf != NULL) {
        explicit_bzero(buf, PJS_ACCESS_TOKEN_MAX + 1);
        free(buf);
    }
    return rc;
}

static void forget_token(access_token *t)
{
    if (t->bytes != NULL) {
        explicit_bzero(t->bytes, t->len);
        free(t->bytes);
    }
    t->bytes = NULL;
    t->len = 0;
}

/* Whether `given` is t's token, in time that depends on t's length only. */
static bool token_equal(const char *given, size_t n, const access_token *t)
{
    if (t->bytes == NULL)
        return false;
    volatile unsigned char diff = n != t->len;
    for (size_t i = 0; i < t->len; i++)
        diff |= (unsigned char)t->bytes[i] ^ (unsigned char)(i < n ? given[i] : 0);
    return diff == 0;
}

int pjs_access_create(const char *admin_token_file, const char *infer_token_file,
                      pjs_access **out, pjs_error *err)
{
    *out = NULL;
    pjs_access *a = calloc(1, sizeof *a);
    if (a == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory");
    int rc = 0;
    if (admin_token_file != NULL) {
        rc = read_token("--admin-token-file", admin_token_file, &a->admin, err);
        snprintf(a->admin_file, sizeof a->admin_file, "%s", admin_token_file);
    }
    if (rc == 0 && infer_token_file != NULL) {
        rc = read_token("--infer-token-file", infer_token_file, &a->infer, err);
        snprintf(a->infer_file, sizeof a->infer_file, "%s", infer_token_file);
    }
    if (rc == 0 && a->admin.bytes != NULL &&
        token_equal(a->infer.bytes, a->infer.len, &a->admin))
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "--admin-token-file and --infer-token-file hold the same token; "
                           "give the admin token only to operators and a different one to "
                           "clients");
    if (rc != 0) {
        pjs_access_destroy(a);
        return rc;
    }
    *out = a;
    return 0;
}

void pjs_access_destroy(pjs_access *a)
{
    if (a == NULL)
        return;
    forget_token(&a->admin);
    forget_token(&a->infer);
    free(a);
}

void pjs_access_describe_admin(const pjs_access *a, char *buf, size_t size)
{
    if (a != NULL && a->admin.bytes != NULL)
        snprintf(buf, size,
                 "admin calls (repository load/unload, model control changes, shared memory, "
                 "logging and trace settings) need the bearer token of %s, from any peer",
                 a->admin_file);
    else
        snprintf(buf, size,
                 "admin calls (repository load/unload, model control changes, shared memory, "
                 "logging and trace settings) are accepted from loopback peers only (no "
                 "--admin-token-file)");
}

void pjs_access_describe_infer(const pjs_access *a, char *buf, size_t size)
{
    if (a != NULL && a->infer.bytes != NULL)
        snprintf(buf, size,
                 "inference and read calls need the bearer token of %s (or the admin token); "
                 "health endpoints stay open",
                 a->infer_file);
    else
        snprintf(buf, size, "inference and read calls are open to any peer (no "
                            "--infer-token-file)");
}

/* ---- the decision ----------------------------------------------------------- */

int pjs_access_parse_bearer(const char *value, size_t len, const char **token,
                            size_t *token_len)
{
    static const char scheme[] = "Bearer";
    const size_t n = sizeof scheme - 1;
    if (value == NULL || len <= n || strncasecmp(value, scheme, n) != 0 || value[n] != ' ')
        return -1;
    size_t start = n;
    while (start < len && value[start] == ' ')
        start++;
    size_t end = len;
    while (end > start && (value[end - 1] == ' ' || value[end - 1] == '\t'))
        end--;
    if (end == start)
        return -1;
    for (size_t i = start; i < end; i++)
        if (!visible_ascii((unsigned char)value[i]))
            return -1;
    *token = value + start;
    *token_len = end - start;
    return 0;
}

bool pjs_access_holds_admin_token(const pjs_access *a, const pjs_access_caller *who)
{
    const char *token;
    size_t len;
    return a != NULL && a->admin.bytes != NULL && who->n_authorization == 1 &&
           pjs_access_parse_bearer(who->authorization, who->authorization_len, &token, &len) ==
               0 &&
           token_equal(token, len, &a->admin);
}

/* Whether a call of class cls must carry a token (the peer rule aside). */
static bool token_needed(const pjs_access *a, pjs_access_class cls)
{
    if (a == NULL || cls == PJS_ACCESS_OPEN)
        return false;
    return a->infer.bytes != NULL || (cls == PJS_ACCESS_ADMIN && a->admin.bytes != NULL);
}

int pjs_access_check(const pjs_access *a, pjs_access_class cls, const pjs_access_caller *who,
                     const char *what, pjs_error *err)
{
    if (cls == PJS_ACCESS_OPEN)
        return 0;
    bool admin_token = a != NULL && a->admin.bytes != NULL;
    if (cls == PJS_ACCESS_ADMIN && !admin_token && !who->loopback)
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "%.256s is an admin call, and admin calls are accepted only from "
                             "loopback peers because the server has no admin token; start "
                             "pjserve with --admin-token-file FILE and send 'Authorization: "
                             "Bearer <token>'",
                             what);
    if (!token_needed(a, cls))
        return 0;
    const char *need = cls == PJS_ACCESS_ADMIN && admin_token ? "the admin token"
                                                             : "the inference or admin token";
    if (who->n_authorization == 0)
        return pjs_error_set(err, PJS_ERR_UNAUTHENTICATED,
                             "%.256s needs credentials: send 'Authorization: Bearer <token>' "
                             "with %s",
                             what, need);
    const char *token;
    size_t len;
    if (who->n_authorization > 1 ||
        pjs_access_parse_bearer(who->authorization, who->authorization_len, &token, &len) != 0)
        return pjs_error_set(err, PJS_ERR_UNAUTHENTICATED,
                             "%.256s: malformed credentials; send exactly one 'Authorization: "
                             "Bearer <token>' with %s",
                             what, need);
    bool admin_ok = token_equal(token, len, &a->admin);
    bool infer_ok = token_equal(token, len, &a->infer);
    bool ok = cls == PJS_ACCESS_ADMIN && admin_token ? admin_ok : (admin_ok || infer_ok);
    if (!ok)
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "%.256s: the bearer token given does not allow this call; it "
                             "needs %s",
                             what, need);
    return 0;
}
