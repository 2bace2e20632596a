/*
 * probe.c - the node's blocking HTTP/1.1 client (probe.h).
 *
 * One non-blocking socket driven by poll(2) against one deadline: connect,
 * write the whole request, then read until the peer closes or the body
 * announced by Content-Length is in. The reply is parsed once it is all in.
 */
#include "node/probe.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/unix_addr.h"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for `events` on fd until the deadline: 1 ready, 0 timed out. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return 1;
        if (n == 0)
            return 0;
        if (errno != EINTR)
            return 1; /* let the next call report the error */
    }
}

/* The worker's address for messages: "host:port" or "unix:/path". One
 * per message, so a buffer of the calling thread's own will do. */
static const char *where(const pjs_probe_request *req)
{
    static _Thread_local char buf[PJS_UNIX_PATH_MAX + 80];
    if (pjs_unix_path(req->host) != NULL)
        snprintf(buf, sizeof buf, "%s", req->host);
    else
        snprintf(buf, sizeof buf, "%s:%d", req->host, req->port);
    return buf;
}

/* Connects to the worker's Unix socket (core/unix_addr.h). A Unix socket
 * connects at once or fails: refused (nothing listens yet, or the path is
 * missing) and a full queue (EAGAIN) are UNAVAILABLE, as a refused TCP
 * connection is. */
static int connect_unix(const pjs_probe_request *req, const char *path, int *out,
                        pjs_error *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) > PJS_UNIX_PATH_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: the path is too long",
                             where(req));
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return pjs_error_set(err, PJS_ERR_IO, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "%s: connect: %s", where(req),
                             strerror(e));
    }
    *out = fd;
    return 0;
}

static int connect_to(const pjs_probe_request *req, int64_t deadline, int *out, pjs_error *err)
{
    if (pjs_unix_path(req->host) != NULL)
        return connect_unix(req, pjs_unix_path(req->host), out, err);
    char port[16];
    snprintf(port, sizeof port, "%d", req->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(req->host, port, &hints, &res);
    if (gai != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: cannot resolve: %s",
                             where(req), gai_strerror(gai));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return pjs_error_set(err, PJS_ERR_IO, "socket: %s", strerror(errno));
    }
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "%s: connect: %s", where(req),
                             strerror(e));
    }
    if (rc != 0) {
        if (!wait_fd(fd, POLLOUT, deadline)) {
            close(fd);
            return pjs_error_set(err, PJS_ERR_DEADLINE_EXCEEDED,
                                 "%s: no connection within %u ms", where(req),
                                 req->timeout_ms);
        }
        int so = 0;
        socklen_t len = sizeof so;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
        if (so != 0) {
            close(fd);
            return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "%s: connect: %s", where(req),
                                 strerror(so));
        }
    }
    *out = fd;
    return 0;
}

static int send_all(int fd, const char *data, size_t len, const pjs_probe_request *req,
                    int64_t deadline, pjs_error *err)
{
    size_t sent = 0;
    while (sent < len) {
        ssize_t n = send(fd, data + sent, len - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_fd(fd, POLLOUT, deadline))
                return pjs_error_set(err, PJS_ERR_DEADLINE_EXCEEDED,
                                     "%s %s %s: request not sent within %u ms", where(req),
                                     req->method, req->path, req->timeout_ms);
            continue;
        }
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "%s %s %s: send: %s", where(req),
                             req->method, req->path, strerror(errno));
    }
    return 0;
}

/* The value of header `name` in the header block [h, end), or NULL. */
static const char *find_header(const char *h, const char *end, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    const char *line = memchr(h, '\n', (size_t)(end - h)); /* skip the status line */
    while (line != NULL && line + 1 < end) {
        line++;
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL)
            eol = end;
        if ((size_t)(eol - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            const char *ve = eol;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
                ve--;
            *len = (size_t)(ve - v);
            return v;
        }
        line = eol < end ? eol : NULL;
    }
    return NULL;
}

/* Where the body starts (after "\r\n\r\n"), or NULL while the headers are
 * not all in. */
static const char *body_start(const char *buf, size_t len)
{
    for (size_t i = 0; i + 3 < len; i++)
        if (memcmp(buf + i, "\r\n\r\n", 4) == 0)
            return buf + i + 4;
    return NULL;
}

/* Content-Length of the headers in buf, or -1 when absent. */
static long long content_length(const char *buf, const char *body)
{
    size_t len = 0;
    const char *v = find_header(buf, body, "Content-Length", &len);
    if (v == NULL || len == 0 || len > 18)
        return -1;
    char num[20];
    memcpy(num, v, len);
    num[len] = '\0';
    char *end;
    long long n = strtoll(num, &end, 10);
    return *end == '\0' && n >= 0 ? n : -1;
}

/* Reads until EOF or the announced body is in; *buf is malloc'd. */
static int read_reply(int fd, const pjs_probe_request *req, int64_t deadline, char **buf,
                      size_t *len, pjs_error *err)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap + 1);
    if (b == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory reading a probe reply");
    for (;;) {
        const char *body = body_start(b, n);
        if (body != NULL) {
            long long cl = content_length(b, body);
            if (cl >= 0 && (size_t)(body - b) + (size_t)cl <= n)
                break;
        }
        if (n == cap) {
            if (cap >= PJS_PROBE_MAX_REPLY) {
                free(b);
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "%s %s %s: reply larger than %u bytes", where(req),
                                     req->method, req->path, PJS_PROBE_MAX_REPLY);
            }
            cap *= 2;
            char *nb = realloc(b, cap + 1);
            if (nb == NULL) {
                free(b);
                return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory reading a probe reply");
            }
            b = nb;
        }
        ssize_t r = recv(fd, b + n, cap - n, 0);
        if (r > 0) {
            n += (size_t)r;
            continue;
        }
        if (r == 0)
            break;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!wait_fd(fd, POLLIN, deadline)) {
                free(b);
                return pjs_error_set(err, PJS_ERR_DEADLINE_EXCEEDED,
                                     "%s %s %s: no reply within %u ms", where(req),
                                     req->method, req->path, req->timeout_ms);
            }
            continue;
        }
        int e = errno;
        free(b);
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "%s %s %s: recv: %s", where(req),
                             req->method, req->path, strerror(e));
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

/* Fills out from the whole reply in buf (taken over). */
static int parse_reply(const pjs_probe_request *req, char *buf, size_t n, pjs_probe_reply *out,
                       pjs_error *err)
{
    int status = 0;
    const char *body = body_start(buf, n);
    bool ok = body != NULL && n >= 12 && memcmp(buf, "HTTP/1.", 7) == 0 && buf[8] == ' ' &&
              sscanf(buf + 9, "%3d", &status) == 1 && status >= 100 && status <= 599;
    size_t te_len = 0;
    if (ok && find_header(buf, body, "Transfer-Encoding", &te_len) != NULL) {
        free(buf);
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED, "%s %s %s: chunked reply not read",
                             where(req), req->method, req->path);
    }
    if (!ok) {
        free(buf);
        return pjs_error_set(err, n == 0 ? PJS_ERR_UNAVAILABLE : PJS_ERR_INVALID_ARGUMENT,
                             "%s %s %s: %s", where(req), req->method, req->path,
                             n == 0 ? "connection closed without a reply"
                                    : "the reply is not HTTP/1.x");
    }
    long long cl = content_length(buf, body);
    size_t have = n - (size_t)(body - buf);
    size_t body_len = cl >= 0 && (size_t)cl < have ? (size_t)cl : have;
    if (cl >= 0 && (size_t)cl > have) {
        free(buf);
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                             "%s %s %s: connection closed after %zu of %lld body bytes",
                             where(req), req->method, req->path, have, cl);
    }
    size_t off = (size_t)(body - buf);
    memmove(buf, buf + off, body_len);
    buf[body_len] = '\0';
    out->status = status;
    out->body = buf;
    out->body_len = body_len;
    return 0;
}

int pjs_probe_http(const pjs_probe_request *req, pjs_probe_reply *out, pjs_error *err)
{
    pjs_probe_request r = *req;
    if (r.timeout_ms == 0)
        r.timeout_ms = 1000;
    memset(out, 0, sizeof *out);
    int64_t deadline = now_ms() + r.timeout_ms;
    char head[1024];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n"
                      "Content-Length: %zu\r\n%s%s%s%s\r\n",
                      r.method, r.path, pjs_unix_path(r.host) ? "localhost" : where(&r),
                      r.body ? r.body_len : 0,
                      r.body ? "Content-Type: application/json\r\n" : "",
                      r.bearer_token ? "Authorization: Bearer " : "",
                      r.bearer_token ? r.bearer_token : "", r.bearer_token ? "\r\n" : "");
    if (hl < 0 || (size_t)hl >= sizeof head)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s %s: request line too long",
                             r.method, r.path);
    int fd = -1;
    int rc = connect_to(&r, deadline, &fd, err);
    if (rc != 0)
        return rc;
    char *buf = NULL;
    size_t n = 0;
    rc = send_all(fd, head, (size_t)hl, &r, deadline, err);
    if (rc == 0 && r.body != NULL)
        rc = send_all(fd, r.body, r.body_len, &r, deadline, err);
    if (rc == 0)
        rc = read_reply(fd, &r, deadline, &buf, &n, err);
    close(fd);
    if (rc != 0)
        return rc;
    return parse_reply(&r, buf, n, out, err);
}

void pjs_probe_reply_free(pjs_probe_reply *r)
{
    if (r == NULL)
        return;
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
}
