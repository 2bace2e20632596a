/*
 * http_route_util.c - what every route set of the HTTP front end shares:
 * path splitting, method checks, JSON bodies, the body limit of control
 * requests and the access decision.
 *
 * Paths. A path with a "." or ".." segment, or an empty one ("//", a
 * trailing "/"), is refused before anything else looks at it, as
 * libmicrohttpd hands it over (decoded: "%2e%2e" is ".." here). Every
 * later reader (the access table, the routers, the gateway rebuilding the
 * path for a worker) then sees one meaning of the path: no reader can
 * take "/v2/models/../logging" for a model's route while another
 * resolves it to /v2/logging.
 */
#include "frontend/http/http_internal.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"

/* Largest body of a POST other than an inference (repository, shared
 * memory, logging and control requests: small JSON objects). */
#define CONTROL_BODY_MAX ((size_t)1 << 20)

static bool is(const char *a, const char *b)
{
    return strcmp(a, b) == 0;
}

/* The first segment of url that is ".", ".." or empty, as a short name for
 * the message, or NULL when every segment is a name. */
static const char *unclean_segment(const char *url)
{
    if (url[0] != '/')
        return "a path that does not start with /";
    if (url[1] == '\0')
        return NULL; /* "/" alone: no segment */
    for (const char *s = url + 1;;) {
        const char *end = strchr(s, '/');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (len == 0)
            return "an empty segment";
        if (len == 1 && s[0] == '.')
            return "a \".\" segment";
        if (len == 2 && s[0] == '.' && s[1] == '.')
            return "a \"..\" segment";
        if (end == NULL)
            return NULL;
        s = end + 1;
    }
}

bool pjs__http_path_clean(pjs__http_call *c)
{
    const char *what = unclean_segment(c->url);
    if (what == NULL)
        return true;
    pjs_debug("http %s %.256s: refused: %s", c->method, c->url, what);
    pjs__http_reply_message(c, 400,
                            "%s %.256s: the path has %s; paths are names separated by single "
                            "slashes, without \".\" or \"..\" (spell each model name out)",
                            c->method, c->url, what);
    return false;
}

bool pjs__http_split_path(const char *url, pjs__http_path *p)
{
    size_t len = strlen(url);
    if (len >= sizeof p->text)
        return false;
    memcpy(p->text, url, len + 1);
    p->n = 0;
    char *rest = NULL;
    for (char *s = strtok_r(p->text, "/", &rest); s != NULL; s = strtok_r(NULL, "/", &rest)) {
        if (p->n == PJS_HTTP_PATH_MAX_SEGMENTS)
            return false;
        p->seg[p->n++] = s;
    }
    return true;
}

bool pjs__http_method_ok(pjs__http_call *c, const char *method)
{
    if (is(c->method, method) || (is(method, "GET") && is(c->method, "HEAD")))
        return true;
    pjs__http_reply_message(c, 405, "%s %s: this endpoint takes %s", c->method, c->url, method);
    c->reply.allow = is(method, "GET") ? "GET, HEAD" : method;
    return false;
}

bool pjs__http_body_object(pjs__http_call *c, json_t **out)
{
    *out = NULL;
    if (!pjs__http_body_ready(c))
        return false;
    if (c->body.len == 0)
        return true;
    json_error_t jerr;
    json_t *doc = json_loadb(c->body.data, c->body.len, 0, &jerr);
    if (!json_is_object(doc)) {
        if (doc == NULL)
            pjs__http_reply_message(c, 400, "malformed JSON body at line %d, column %d: %s",
                                    jerr.line, jerr.column, jerr.text);
        else
            pjs__http_reply_message(c, 400, "the JSON body must be an object");
        json_decref(doc);
        return false;
    }
    *out = doc;
    return true;
}

bool pjs__http_infer_path(const char *url, char *model, size_t model_size, char *version,
                          size_t version_size)
{
    pjs__http_path p;
    if (!pjs__http_split_path(url, &p) || p.n < 4 || !is(p.seg[0], "v2") ||
        !is(p.seg[1], "models") || !is(p.seg[p.n - 1], "infer"))
        return false;
    const char *v = "";
    if (p.n == 6 && is(p.seg[3], "versions"))
        v = p.seg[4];
    else if (p.n != 4)
        return false;
    int a = snprintf(model, model_size, "%s", p.seg[2]);
    int b = snprintf(version, version_size, "%s", v);
    return a >= 0 && (size_t)a < model_size && b >= 0 && (size_t)b < version_size;
}

void pjs__http_limit_control_body(pjs__http_call *c)
{
    if (c->body_limit <= CONTROL_BODY_MAX)
        return;
    c->body_limit = CONTROL_BODY_MAX;
    snprintf(c->limit_what, sizeof c->limit_what,
             "%zu bytes, the most a request to an endpoint other than inference takes",
             c->body_limit);
}

/* ---- access ---------------------------------------------------------------- */

/* Keeps the first Authorization header in the caller and counts them all. */
static enum MHD_Result find_authorization(void *cls, enum MHD_ValueKind kind, const char *key,
                                          size_t key_size, const char *value,
                                          size_t value_size)
{
    (void)kind;
    static const char name[] = MHD_HTTP_HEADER_AUTHORIZATION;
    pjs_access_caller *who = cls;
    if (key_size == sizeof name - 1 && strncasecmp(key, name, key_size) == 0 &&
        who->n_authorization++ == 0) {
        who->authorization = value;
        who->authorization_len = value_size;
    }
    return MHD_YES;
}

void pjs__http_client_id(pjs__http_call *c, char *out)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *peer = info != NULL ? info->client_addr : NULL;
    pjs_access_caller who = {0};
    MHD_get_connection_values_n(c->conn, MHD_HEADER_KIND, find_authorization, &who);
    bool trusted = (peer != NULL && peer->sa_family == AF_UNIX) ||
                   pjs_access_holds_admin_token(c->fe->access, &who);
    const char *named =
        trusted ? MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, PJS_CLIENT_HEADER) : NULL;
    if (named == NULL || !pjs_client_id_parse(named, strlen(named), out))
        pjs_client_id_of_sockaddr(peer, out);
}

bool pjs__http_access_allowed(pjs__http_call *c)
{
    pjs_access_class cls = pjs_access_rest_class(c->url);
    if (cls == PJS_ACCESS_OPEN)
        return true;
    pjs_access_caller who = {0};
    MHD_get_connection_values_n(c->conn, MHD_HEADER_KIND, find_authorization, &who);
    if (cls == PJS_ACCESS_ADMIN) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        who.loopback = info != NULL && pjs_access_sockaddr_is_loopback(info->client_addr);
    }
    char what[PJS_HTTP_PATH_MAX_BYTES];
    snprintf(what, sizeof what, "%s %.256s", c->method, c->url);
    pjs_error err;
    if (pjs_access_check(c->fe->access, cls, &who, what, &err) == 0)
        return true;
    pjs_debug("http %s: refused: %s", what, err.msg);
    pjs__http_reply_error(c, &err);
    c->reply.www_authenticate = err.code == PJS_ERR_UNAUTHENTICATED;
    return false;
}
