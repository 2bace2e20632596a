/*
 * test_access.c - unit tests of the access rules (src/frontend/access.c):
 * every gRPC method the front end serves has a class in the table (and the
 * methods whose state machines never consult it are open), REST paths get
 * the class the router's split would give them, token files are refused for
 * each fault with the flag named, the bearer parser, loopback peers in both
 * forms, and the decision for each class, token set and peer, with the
 * credentials never echoed; client ids (src/frontend/client_id.c) from
 * peers in every form and from the header a gateway sets, one id per
 * address however it is written, and who holds the admin token.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "frontend/access.h"
#include "frontend/client_id.h"
#include "frontend/grpc/internal.h"

#define ADMIN "admin-0123456789abcdef0123456789"
#define INFER "infer-0123456789abcdef0123456789"

/* Writes `bytes` to a fresh file with `mode`; the path goes into `path`. */
static void token_file(char *path, const char *bytes, size_t len, mode_t mode)
{
    strcpy(path, "/tmp/test_access_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, bytes, len), (ssize_t)len);
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
}

/* A pjs_access from token strings (NULL: that file not given). */
static pjs_access *make_access(const char *admin, const char *infer)
{
    char a[64], i[64];
    pjs_access *out = NULL;
    pjs_error err;
    if (admin != NULL)
        token_file(a, admin, strlen(admin), 0600);
    if (infer != NULL)
        token_file(i, infer, strlen(infer), 0600);
    assert_int_equal(
        pjs_access_create(admin ? a : NULL, infer ? i : NULL, &out, &err), 0);
    if (admin != NULL)
        unlink(a);
    if (infer != NULL)
        unlink(i);
    return out;
}

/* The result of reading one token file holding `bytes` with `mode`. */
static int try_file(const char *bytes, size_t len, mode_t mode, pjs_error *err)
{
    char path[64];
    pjs_access *a = NULL;
    token_file(path, bytes, len, mode);
    int rc = pjs_access_create(path, NULL, &a, err);
    unlink(path);
    pjs_access_destroy(a);
    return rc;
}

static void test_every_grpc_method_classified(void **state)
{
    (void)state;
    for (size_t i = 0; i < pjs__grpc_n_methods; i++) {
        const pjs_grpc_method *m = &pjs__grpc_methods[i];
        if (!pjs_access_grpc_classified(m->path))
            fail_msg("%s has no class in src/frontend/access.c", m->path);
        /* Health/Watch and reflection never consult the rules. */
        if (m->kind == PJS_GRPC_HEALTH_WATCH || m->kind == PJS_GRPC_REFLECTION)
            assert_int_equal(pjs_access_grpc_class(m->path), PJS_ACCESS_OPEN);
    }
}

static void test_grpc_classes(void **state)
{
    (void)state;
    const char *svc = "/inference.GRPCInferenceService/";
    char path[128];
    const struct {
        const char *name;
        pjs_access_class cls;
    } cases[] = {
        {"ServerLive", PJS_ACCESS_OPEN},          {"ServerReady", PJS_ACCESS_OPEN},
        {"ModelInfer", PJS_ACCESS_INFER},         {"ModelStreamInfer", PJS_ACCESS_INFER},
        {"ModelMetadata", PJS_ACCESS_INFER},      {"RepositoryIndex", PJS_ACCESS_INFER},
        {"RepositoryModelLoad", PJS_ACCESS_ADMIN}, {"RepositoryModelUnload", PJS_ACCESS_ADMIN},
        {"SystemSharedMemoryStatus", PJS_ACCESS_ADMIN},
        {"SystemSharedMemoryRegister", PJS_ACCESS_ADMIN},
        {"LogSettings", PJS_ACCESS_ADMIN},        {"TraceSetting", PJS_ACCESS_ADMIN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s%s", svc, cases[i].name);
        assert_int_equal(pjs_access_grpc_class(path), cases[i].cls);
    }
    assert_int_equal(pjs_access_grpc_class("/pjserve.control.v1.ModelControl/ModelControlStatus"),
                     PJS_ACCESS_INFER);
    assert_int_equal(pjs_access_grpc_class("/pjserve.control.v1.ModelControl/Compact"),
                     PJS_ACCESS_ADMIN);
    assert_int_equal(pjs_access_grpc_class("/grpc.health.v1.Health/Check"), PJS_ACCESS_OPEN);
    /* Unknown methods fail closed. */
    assert_false(pjs_access_grpc_classified("/inference.GRPCInferenceService/NewThing"));
    assert_int_equal(pjs_access_grpc_class("/inference.GRPCInferenceService/NewThing"),
                     PJS_ACCESS_ADMIN);
    assert_int_equal(pjs_access_grpc_class(NULL), PJS_ACCESS_ADMIN);
}

static void test_rest_classes(void **state)
{
    (void)state;
    const struct {
        const char *url;
        pjs_access_class cls;
    } cases[] = {
        {"/v2/health/live", PJS_ACCESS_OPEN},
        {"//v2//health/ready/", PJS_ACCESS_OPEN}, /* as the router splits it */
        {"/v2/health", PJS_ACCESS_ADMIN},          /* not a route: the default */
        {"/v2/health/live/x", PJS_ACCESS_ADMIN},
        {"/v2", PJS_ACCESS_INFER},
        {"/v2/", PJS_ACCESS_INFER},
        {"/v2/models/mlp/infer", PJS_ACCESS_INFER},
        {"/v2/models/mlp/versions/1/infer", PJS_ACCESS_INFER},
        {"/v2/models/stats", PJS_ACCESS_INFER},
        {"/v2/repository/index", PJS_ACCESS_INFER},
        {"/v2/pjserve/control", PJS_ACCESS_INFER},
        {"/v2/pjserve/node", PJS_ACCESS_INFER},
        {"/metrics", PJS_ACCESS_INFER},
        {"/v2/repository/models/mlp/load", PJS_ACCESS_ADMIN},
        {"/v2/repository/models/mlp/unload", PJS_ACCESS_ADMIN},
        {"/v2/systemsharedmemory/status", PJS_ACCESS_ADMIN},
        {"/v2/systemsharedmemory/region/r/register", PJS_ACCESS_ADMIN},
        {"/v2/cudasharedmemory/status", PJS_ACCESS_ADMIN},
        {"/v2/logging", PJS_ACCESS_ADMIN},
        {"/v2/pjserve/compact", PJS_ACCESS_ADMIN},
        {"/v2/pjserve/models/mlp/residency", PJS_ACCESS_ADMIN},
        {"/v2/pjserve/models/mlp/policy", PJS_ACCESS_ADMIN},
        {"/v2/healthy/live", PJS_ACCESS_ADMIN},
        {"/", PJS_ACCESS_ADMIN},
        {"", PJS_ACCESS_ADMIN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (pjs_access_rest_class(cases[i].url) != cases[i].cls)
            fail_msg("%s: class %d, expected %d", cases[i].url,
                     pjs_access_rest_class(cases[i].url), cases[i].cls);
}

static void test_token_files(void **state)
{
    (void)state;
    pjs_error err;
    assert_int_equal(try_file(ADMIN "\n", strlen(ADMIN) + 1, 0600, &err), 0);
    assert_int_equal(try_file(ADMIN "\r\n", strlen(ADMIN) + 2, 0400, &err), 0);
    assert_int_equal(try_file("", 0, 0600, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "--admin-token-file"));
    assert_non_null(strstr(err.msg, "empty"));
    assert_int_equal(try_file("\n", 1, 0600, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(try_file(ADMIN "\n\n", strlen(ADMIN) + 2, 0600, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(try_file("two words", 9, 0600, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_null(strstr(err.msg, "two")); /* never the token */
    assert_int_equal(try_file(ADMIN, strlen(ADMIN), 0640, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "chmod 600"));
    assert_int_equal(try_file(ADMIN, strlen(ADMIN), 0604, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(try_file(ADMIN, strlen(ADMIN), 0620, &err), PJS_ERR_INVALID_ARGUMENT);
    char big[PJS_ACCESS_TOKEN_MAX + 2];
    memset(big, 'a', sizeof big);
    assert_int_equal(try_file(big, sizeof big, 0600, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(try_file(big, PJS_ACCESS_TOKEN_MAX, 0600, &err), 0);

    pjs_access *a = NULL;
    assert_int_equal(pjs_access_create("/nonexistent/token", NULL, &a, &err), PJS_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/token"));
    assert_int_equal(pjs_access_create(NULL, "/tmp", &a, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "--infer-token-file"));
    assert_null(a);

    /* The same token in both files is refused. */
    char p1[64], p2[64];
    token_file(p1, ADMIN "\n", strlen(ADMIN) + 1, 0600);
    token_file(p2, ADMIN, strlen(ADMIN), 0600);
    assert_int_equal(pjs_access_create(p1, p2, &a, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "same token"));
    unlink(p1);
    unlink(p2);
}

static void test_parse_bearer(void **state)
{
    (void)state;
    const char *t;
    size_t n;
    const char *v = "Bearer abc.DEF-123";
    assert_int_equal(pjs_access_parse_bearer(v, strlen(v), &t, &n), 0);
    assert_int_equal(n, 11);
    assert_memory_equal(t, "abc.DEF-123", 11);
    v = "bearer    tok  \t";
    assert_int_equal(pjs_access_parse_bearer(v, strlen(v), &t, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(t, "tok", 3);
    const char *bad[] = {"", "Bearer", "Bearer ", "Bearer    ", "Basic dXNlcjpwYXNz",
                         "Bearertok", "Bearer\ttok", "Bearer to ken", "Bearer tok\x01",
                         "Bearer t\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(pjs_access_parse_bearer(bad[i], strlen(bad[i]), &t, &n), -1);
    /* The length given is the bound, not a NUL. */
    assert_int_equal(pjs_access_parse_bearer("Bearer tok", 8, &t, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(pjs_access_parse_bearer(NULL, 0, &t, &n), -1);
}

static void test_loopback_peers(void **state)
{
    (void)state;
    const char *yes[] = {"ipv4:127.0.0.1:5000", "ipv4:127.255.0.9:1", "ipv6:[::1]:5000",
                         "ipv6:%5B::1%5D:5000", "ipv6:%5b::ffff:127.0.0.1%5d:80",
                         "ipv6:[::ffff:127.1.2.3]:80", "unix:/tmp/sock", "unix-abstract:x"};
    const char *no[] = {"ipv4:10.0.0.1:5000", "ipv4:128.0.0.1:5000", "ipv4:1270.0.0.1:1",
                        "ipv4:", "ipv6:[::2]:5000", "ipv6:::1:5000", "ipv6:[::1",
                        "ipv6:[::ffff:10.0.0.1]:1", "127.0.0.1:5000", "vsock:1:2", "",
                        "ipv4:127.0.0.1.evil.com:1"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (!pjs_access_peer_is_loopback(yes[i]))
            fail_msg("%s should be loopback", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (pjs_access_peer_is_loopback(no[i]))
            fail_msg("%s should not be loopback", no[i]);
    assert_false(pjs_access_peer_is_loopback(NULL));

    struct sockaddr_in v4 = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.3.2.1", &v4.sin_addr);
    assert_true(pjs_access_sockaddr_is_loopback((struct sockaddr *)&v4));
    inet_pton(AF_INET, "192.168.1.1", &v4.sin_addr);
    assert_false(pjs_access_sockaddr_is_loopback((struct sockaddr *)&v4));
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "::1", &v6.sin6_addr);
    assert_true(pjs_access_sockaddr_is_loopback((struct sockaddr *)&v6));
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &v6.sin6_addr);
    assert_true(pjs_access_sockaddr_is_loopback((struct sockaddr *)&v6));
    inet_pton(AF_INET6, "fe80::1", &v6.sin6_addr);
    assert_false(pjs_access_sockaddr_is_loopback((struct sockaddr *)&v6));
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    assert_true(pjs_access_sockaddr_is_loopback((struct sockaddr *)&un));
    assert_false(pjs_access_sockaddr_is_loopback(NULL));
}

static void test_client_ids(void **state)
{
    (void)state;
    const char *peers[][2] = {{"ipv4:192.0.2.7:5000", "192.0.2.7"},
                              {"ipv4:127.0.0.2:1", "127.0.0.2"},
                              {"ipv6:[2001:db8:0::1]:5000", "2001:db8::1"},
                              {"ipv6:%5B::1%5D:5000", "::1"},
                              {"ipv6:[::ffff:127.0.0.1]:80", "127.0.0.1"},
                              {"unix:/run/pjserve/worker.sock", "unix"},
                              {"unix-abstract:x", "unix"},
                              {"ipv4:1270.0.0.1:1", ""},
                              {"ipv6:::1:5000", ""},
                              {"vsock:1:2", ""},
                              {"", ""}};
    char id[PJS_CLIENT_ID_MAX];
    for (size_t i = 0; i < sizeof peers / sizeof peers[0]; i++) {
        pjs_client_id_of_grpc_peer(peers[i][0], id);
        if (strcmp(id, peers[i][1]) != 0)
            fail_msg("peer %s: id \"%s\", expected \"%s\"", peers[i][0], id, peers[i][1]);
    }
    pjs_client_id_of_grpc_peer(NULL, id);
    assert_string_equal(id, "");
    assert_true(pjs_client_grpc_peer_is_unix("unix:/x"));
    assert_false(pjs_client_grpc_peer_is_unix("ipv4:127.0.0.1:1"));

    struct sockaddr_in v4 = {.sin_family = AF_INET};
    inet_pton(AF_INET, "192.0.2.7", &v4.sin_addr);
    pjs_client_id_of_sockaddr((struct sockaddr *)&v4, id);
    assert_string_equal(id, "192.0.2.7");
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "::ffff:192.0.2.7", &v6.sin6_addr);
    pjs_client_id_of_sockaddr((struct sockaddr *)&v6, id);
    assert_string_equal(id, "192.0.2.7"); /* the same client on a dual-stack port */
    inet_pton(AF_INET6, "2001:DB8::0:1", &v6.sin6_addr);
    pjs_client_id_of_sockaddr((struct sockaddr *)&v6, id);
    assert_string_equal(id, "2001:db8::1");
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    pjs_client_id_of_sockaddr((struct sockaddr *)&un, id);
    assert_string_equal(id, "unix");
    pjs_client_id_of_sockaddr(NULL, id);
    assert_string_equal(id, "");

    /* The header: addresses (rewritten in the one form) and "unix" only. */
    const char *good[][2] = {{"192.0.2.7", "192.0.2.7"}, {"2001:DB8::0:1", "2001:db8::1"},
                             {"::ffff:10.1.2.3", "10.1.2.3"}, {"unix", "unix"}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_true(pjs_client_id_parse(good[i][0], strlen(good[i][0]), id));
        assert_string_equal(id, good[i][1]);
    }
    const char *bad[] = {"", "anyone", "192.0.2.7:80", "192.0.2.7 ", "[::1]", "unix:/x",
                         "1.2.3.4.5", "0123456789abcdef0123456789abcdef0123456789abcdef99"};
    snprintf(id, sizeof id, "kept");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (pjs_client_id_parse(bad[i], strlen(bad[i]), id))
            fail_msg("\"%s\" should not be a client id", bad[i]);
    assert_string_equal(id, "kept");
    /* Not NUL-terminated: only len bytes count. */
    assert_true(pjs_client_id_parse("10.0.0.1trailing", 8, id));
    assert_string_equal(id, "10.0.0.1");
}

static void test_admin_token_holders(void **state)
{
    (void)state;
    pjs_access *a = make_access(ADMIN, INFER);
    pjs_access_caller admin = {"Bearer " ADMIN, strlen("Bearer " ADMIN), 1, false};
    pjs_access_caller infer = {"Bearer " INFER, strlen("Bearer " INFER), 1, false};
    pjs_access_caller two = {"Bearer " ADMIN, strlen("Bearer " ADMIN), 2, false};
    pjs_access_caller none = {0};
    assert_true(pjs_access_holds_admin_token(a, &admin));
    assert_false(pjs_access_holds_admin_token(a, &infer));
    assert_false(pjs_access_holds_admin_token(a, &two));
    assert_false(pjs_access_holds_admin_token(a, &none));
    pjs_access_destroy(a);
    a = make_access(NULL, NULL);
    assert_false(pjs_access_holds_admin_token(a, &admin));
    assert_false(pjs_access_holds_admin_token(NULL, &admin));
    pjs_access_destroy(a);
}

/* The decision for one class, header and peer. */
static int decide(const pjs_access *a, pjs_access_class cls, const char *header, bool loopback,
                  pjs_error *err)
{
    pjs_access_caller who = {header, header ? strlen(header) : 0, header ? 1 : 0, loopback};
    int rc = pjs_access_check(a, cls, &who, "TestCall", err);
    if (rc != 0) {
        assert_non_null(strstr(err->msg, "TestCall"));
        assert_null(strstr(err->msg, ADMIN));
        assert_null(strstr(err->msg, INFER));
        assert_null(strstr(err->msg, "wrong-token"));
    }
    return rc;
}

static void test_no_tokens(void **state)
{
    (void)state;
    pjs_error err;
    pjs_access *a = make_access(NULL, NULL);
    const pjs_access *both[] = {a, NULL}; /* NULL behaves as no tokens */
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(decide(both[i], PJS_ACCESS_OPEN, NULL, false, &err), 0);
        assert_int_equal(decide(both[i], PJS_ACCESS_INFER, NULL, false, &err), 0);
        assert_int_equal(decide(both[i], PJS_ACCESS_ADMIN, NULL, true, &err), 0);
        assert_int_equal(decide(both[i], PJS_ACCESS_ADMIN, NULL, false, &err),
                         PJS_ERR_PERMISSION_DENIED);
        assert_non_null(strstr(err.msg, "--admin-token-file"));
        assert_non_null(strstr(err.msg, "loopback"));
        /* A token changes nothing for a remote peer. */
        assert_int_equal(decide(both[i], PJS_ACCESS_ADMIN, "Bearer " ADMIN, false, &err),
                         PJS_ERR_PERMISSION_DENIED);
    }
    char line[512];
    pjs_access_describe_admin(a, line, sizeof line);
    assert_non_null(strstr(line, "loopback"));
    pjs_access_describe_infer(a, line, sizeof line);
    assert_non_null(strstr(line, "open"));
    pjs_access_destroy(a);
}

static void test_admin_token(void **state)
{
    (void)state;
    pjs_error err;
    pjs_access *a = make_access(ADMIN, NULL);
    for (int loopback = 0; loopback < 2; loopback++) {
        assert_int_equal(decide(a, PJS_ACCESS_ADMIN, NULL, loopback, &err),
                         PJS_ERR_UNAUTHENTICATED);
        assert_non_null(strstr(err.msg, "Authorization: Bearer"));
        assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Bearer wrong-token", loopback, &err),
                         PJS_ERR_PERMISSION_DENIED);
        assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Bearer " ADMIN "x", loopback, &err),
                         PJS_ERR_PERMISSION_DENIED);
        assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Bearer admin", loopback, &err),
                         PJS_ERR_PERMISSION_DENIED);
        assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Basic " ADMIN, loopback, &err),
                         PJS_ERR_UNAUTHENTICATED);
        assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Bearer " ADMIN, loopback, &err), 0);
        assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "bearer  " ADMIN " ", loopback, &err), 0);
        /* Inference stays open without an inference token. */
        assert_int_equal(decide(a, PJS_ACCESS_INFER, NULL, loopback, &err), 0);
    }
    /* Two Authorization values are refused even when the first is right. */
    pjs_access_caller two = {"Bearer " ADMIN, strlen("Bearer " ADMIN), 2, true};
    assert_int_equal(pjs_access_check(a, PJS_ACCESS_ADMIN, &two, "TestCall", &err),
                     PJS_ERR_UNAUTHENTICATED);
    char line[512];
    pjs_access_describe_admin(a, line, sizeof line);
    assert_non_null(strstr(line, "bearer token"));
    assert_null(strstr(line, ADMIN));
    pjs_access_destroy(a);
}

static void test_both_tokens(void **state)
{
    (void)state;
    pjs_error err;
    pjs_access *a = make_access(ADMIN, INFER);
    assert_int_equal(decide(a, PJS_ACCESS_OPEN, NULL, false, &err), 0);
    assert_int_equal(decide(a, PJS_ACCESS_INFER, NULL, true, &err), PJS_ERR_UNAUTHENTICATED);
    assert_int_equal(decide(a, PJS_ACCESS_INFER, "Bearer wrong-token", false, &err),
                     PJS_ERR_PERMISSION_DENIED);
    assert_int_equal(decide(a, PJS_ACCESS_INFER, "Bearer " INFER, false, &err), 0);
    assert_int_equal(decide(a, PJS_ACCESS_INFER, "Bearer " ADMIN, false, &err), 0);
    assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Bearer " INFER, true, &err),
                     PJS_ERR_PERMISSION_DENIED);
    assert_non_null(strstr(err.msg, "admin token"));
    assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Bearer " ADMIN, false, &err), 0);
    pjs_access_destroy(a);
}

static void test_infer_token_only(void **state)
{
    (void)state;
    pjs_error err;
    pjs_access *a = make_access(NULL, INFER);
    assert_int_equal(decide(a, PJS_ACCESS_INFER, NULL, true, &err), PJS_ERR_UNAUTHENTICATED);
    assert_int_equal(decide(a, PJS_ACCESS_INFER, "Bearer " INFER, false, &err), 0);
    /* Admin calls: loopback and the inference token. */
    assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Bearer " INFER, false, &err),
                     PJS_ERR_PERMISSION_DENIED);
    assert_int_equal(decide(a, PJS_ACCESS_ADMIN, NULL, true, &err), PJS_ERR_UNAUTHENTICATED);
    assert_int_equal(decide(a, PJS_ACCESS_ADMIN, "Bearer " INFER, true, &err), 0);
    char line[512];
    pjs_access_describe_infer(a, line, sizeof line);
    assert_non_null(strstr(line, "bearer token"));
    pjs_access_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_grpc_method_classified),
        cmocka_unit_test(test_grpc_classes),
        cmocka_unit_test(test_rest_classes),
        cmocka_unit_test(test_token_files),
        cmocka_unit_test(test_parse_bearer),
        cmocka_unit_test(test_loopback_peers),
        cmocka_unit_test(test_client_ids),
        cmocka_unit_test(test_admin_token_holders),
        cmocka_unit_test(test_no_tokens),
        cmocka_unit_test(test_admin_token),
        cmocka_unit_test(test_both_tokens),
        cmocka_unit_test(test_infer_token_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
