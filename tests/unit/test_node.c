/*
 * test_node.c - unit tests of the node's pure parts and its HTTP probe:
 * the restart backoff and budget (src/node/restart.c) on a virtual clock,
 * the device list, the worker token and the run directory (made fresh and
 * private, a given one refused when it is a symbolic link, another user's or
 * open to others; src/node/setup.c), and
 * pjs_probe_http (src/node/probe.c) against a canned server on a loopback
 * socket: replies by Content-Length and by end of connection, a refused
 * connection, a peer that accepts and never answers (a stopped worker), a
 * reply that is not HTTP and a chunked one.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/probe.h"
#include "node/restart.h"
#include "node/setup.h"

/* ---- restart policy ------------------------------------------------------- */

static void test_backoff_doubles_to_the_cap(void **state)
{
    (void)state;
    pjs_node_restart_policy p = {.backoff_initial_ms = 100, .backoff_max_ms = 1000,
                                 .stable_ms = 30000, .max_restarts = 100, .window_ms = 60000};
    pjs_node_restart r;
    pjs_node_restart_init(&r, &p);
    int64_t want[] = {100, 200, 400, 800, 1000, 1000};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        assert_int_equal(pjs_node_restart_next(&r, (int64_t)i * 10, -1), want[i]);
}

static void test_stable_worker_starts_again_from_the_first_delay(void **state)
{
    (void)state;
    pjs_node_restart_policy p;
    pjs_node_restart_policy_init(&p);
    p.max_restarts = 100;
    pjs_node_restart r;
    pjs_node_restart_init(&r, &p);
    assert_int_equal(pjs_node_restart_next(&r, 0, -1), 100);
    assert_int_equal(pjs_node_restart_next(&r, 1000, 500), 200);
    /* Ready for 30 s before it went down: back to 100 ms. */
    assert_int_equal(pjs_node_restart_next(&r, 40000, 10000), 100);
    /* Ready for less: the doubling goes on. */
    assert_int_equal(pjs_node_restart_next(&r, 41000, 40500), 200);
}

static void test_budget_counts_restarts_within_the_window(void **state)
{
    (void)state;
    pjs_node_restart_policy p = {.backoff_initial_ms = 10, .backoff_max_ms = 10,
                                 .stable_ms = 1000, .max_restarts = 3, .window_ms = 60000};
    pjs_node_restart r;
    pjs_node_restart_init(&r, &p);
    assert_true(pjs_node_restart_next(&r, 0, -1) >= 0);
    assert_true(pjs_node_restart_next(&r, 1000, -1) >= 0);
    assert_true(pjs_node_restart_next(&r, 2000, -1) >= 0);
    assert_int_equal(pjs_node_restart_next(&r, 3000, -1), -1);
    /* Once the first restart left the window, one more is allowed. */
    assert_true(pjs_node_restart_next(&r, 60001, -1) >= 0);
    assert_int_equal(pjs_node_restart_next(&r, 60002, -1), -1);
}

static void test_no_restarts_allowed(void **state)
{
    (void)state;
    pjs_node_restart_policy p;
    pjs_node_restart_policy_init(&p);
    p.max_restarts = 0;
    pjs_node_restart r;
    pjs_node_restart_init(&r, &p);
    assert_int_equal(pjs_node_restart_next(&r, 0, -1), -1);
}

/* ---- setup ------------------------------------------------------------------ */

static void test_device_list(void **state)
{
    (void)state;
    char ids[4][32];
    pjs_error err;
    assert_int_equal(pjs_node_parse_device_list("0,1,3", ids, 4, &err), 3);
    assert_string_equal(ids[2], "3");
    assert_int_equal(pjs_node_parse_device_list("GPU-8a1f-22", ids, 4, &err), 1);
    assert_string_equal(ids[0], "GPU-8a1f-22");
    assert_int_equal(pjs_node_parse_device_list("0,,1", ids, 4, &err), -1);
    assert_non_null(strstr(err.msg, "separated by commas"));
    assert_int_equal(pjs_node_parse_device_list("0,0", ids, 4, &err), -1);
    assert_non_null(strstr(err.msg, "listed twice"));
    assert_int_equal(pjs_node_parse_device_list("0;rm", ids, 4, &err), -1);
    assert_int_equal(pjs_node_parse_device_list("0,1,2,3,4", ids, 4, &err), -1);
    assert_non_null(strstr(err.msg, "at most 4"));
    assert_string_equal(pjs_node_visible_devices_variable("cuda"), "CUDA_VISIBLE_DEVICES");
    assert_null(pjs_node_visible_devices_variable("cpu"));
}

static void test_token_file_is_private_and_random(void **state)
{
    (void)state;
    char dir[] = "/tmp/pjs-test-node-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int dir_fd = open(dir, O_RDONLY | O_DIRECTORY);
    assert_true(dir_fd >= 0);
    char path[64], target[64], token[65], again[65];
    snprintf(path, sizeof path, "%s/token", dir);
    snprintf(target, sizeof target, "%s/target", dir);
    pjs_error err;
    assert_int_equal(pjs_node_write_token(dir_fd, "token", token, &err), 0);
    assert_int_equal(strlen(token), 64);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    char line[80] = "";
    FILE *written = fopen(path, "r");
    assert_non_null(written);
    assert_non_null(fgets(line, sizeof line, written));
    fclose(written);
    assert_int_equal(strcspn(line, "\n"), 64);
    line[64] = '\0';
    assert_string_equal(line, token);
    /* A symbolic link in its place is replaced, never written through. */
    unlink(path);
    FILE *f = fopen(target, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(pjs_node_write_token(dir_fd, "token", again, &err), 0);
    assert_string_not_equal(token, again);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_size, 0);
    close(dir_fd);
    unlink(path);
    unlink(target);
    rmdir(dir);
}

/* ---- the run directory ------------------------------------------------------ */

static void assert_private_dir(const pjs_node_run_dir *d)
{
    struct stat st;
    assert_true(d->fd >= 0);
    assert_int_equal(fstat(d->fd, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(st.st_uid, geteuid());
    assert_int_equal(lstat(d->path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
}

static void test_default_run_dir_is_fresh_and_private(void **state)
{
    (void)state;
    char xdg[] = "/tmp/pjs-test-xdg-XXXXXX";
    assert_non_null(mkdtemp(xdg));
    char *saved = getenv("XDG_RUNTIME_DIR") ? strdup(getenv("XDG_RUNTIME_DIR")) : NULL;
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    pjs_node_run_dir a, b;
    pjs_error err;
    assert_int_equal(pjs_node_run_dir_create(NULL, &a, &err), 0);
    assert_int_equal(pjs_node_run_dir_create(NULL, &b, &err), 0);
    assert_private_dir(&a);
    assert_private_dir(&b);
    assert_true(a.created && b.created);
    assert_string_not_equal(a.path, b.path);
    /* Under $XDG_RUNTIME_DIR, named by chance, not by the pid. */
    char pid_name[64];
    snprintf(pid_name, sizeof pid_name, "pjserve-node-%d", (int)getpid());
    assert_int_equal(strncmp(a.path, xdg, strlen(xdg)), 0);
    assert_int_equal(strncmp(a.name, "pjserve-node-", 13), 0);
    assert_int_equal(strlen(a.name), 13 + 6);
    assert_string_not_equal(a.name, pid_name);
    /* The node's files in it go with it. */
    int fd = openat(a.fd, PJS_NODE_STATUS_NAME, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);
    char path[sizeof a.path];
    snprintf(path, sizeof path, "%s", a.path);
    pjs_node_run_dir_close(&a);
    pjs_node_run_dir_close(&b);
    struct stat st;
    assert_int_equal(lstat(path, &st), -1);
    /* An $XDG_RUNTIME_DIR open to others is not used: /tmp is. */
    chmod(xdg, 0755);
    assert_int_equal(pjs_node_run_dir_create(NULL, &a, &err), 0);
    assert_int_equal(strncmp(a.path, "/tmp/pjserve-node-", 18), 0);
    assert_private_dir(&a);
    pjs_node_run_dir_close(&a);
    if (saved != NULL)
        setenv("XDG_RUNTIME_DIR", saved, 1);
    else
        unsetenv("XDG_RUNTIME_DIR");
    free(saved);
    rmdir(xdg);
}

static void test_given_run_dir_is_made_or_checked(void **state)
{
    (void)state;
    char top[] = "/tmp/pjs-test-run-XXXXXX";
    assert_non_null(mkdtemp(top));
    char given[128], target[128], link[128], open_dir[128], loose[128], inner[160];
    snprintf(given, sizeof given, "%s/run/", top);
    snprintf(target, sizeof target, "%s/target", top);
    snprintf(link, sizeof link, "%s/link", top);
    snprintf(open_dir, sizeof open_dir, "%s/open", top);
    snprintf(loose, sizeof loose, "%s/loose", top);
    snprintf(inner, sizeof inner, "%s/loose/run", top);
    pjs_node_run_dir d;
    pjs_error err;
    struct stat st;

    /* Absent: made 0700, and removed at close. */
    assert_int_equal(pjs_node_run_dir_create(given, &d, &err), 0);
    assert_true(d.created);
    assert_string_equal(d.name, "run");
    assert_private_dir(&d);
    pjs_node_run_dir_close(&d);
    assert_int_equal(lstat(given, &st), -1);

    /* Present and private: used, and left at close. */
    assert_int_equal(mkdir(given, 0700), 0);
    assert_int_equal(pjs_node_run_dir_create(given, &d, &err), 0);
    assert_false(d.created);
    pjs_node_run_dir_close(&d);
    assert_int_equal(lstat(given, &st), 0);
    rmdir(given);

    /* A symbolic link, even to a private directory of ours: refused. */
    assert_int_equal(mkdir(target, 0700), 0);
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(pjs_node_run_dir_create(link, &d, &err), PJS_ERR_PERMISSION_DENIED);
    assert_non_null(strstr(err.msg, "symbolic link"));
    assert_int_equal(d.fd, -1);

    /* Open to group or others. */
    assert_int_equal(mkdir(open_dir, 0700), 0);
    chmod(open_dir, 0750);
    assert_int_equal(pjs_node_run_dir_create(open_dir, &d, &err), PJS_ERR_PERMISSION_DENIED);
    assert_non_null(strstr(err.msg, "chmod 700"));

    /* Inside a directory others may change (no sticky bit). */
    assert_int_equal(mkdir(loose, 0700), 0);
    chmod(loose, 0777);
    assert_int_equal(pjs_node_run_dir_create(inner, &d, &err), PJS_ERR_PERMISSION_DENIED);
    assert_non_null(strstr(err.msg, "lets others replace it"));
    assert_int_equal(lstat(inner, &st), -1);

    /* Another user's (only root can make one here). */
    if (geteuid() == 0) {
        chmod(open_dir, 0700);
        assert_int_equal(chown(open_dir, 65534, 65534), 0);
        assert_int_equal(pjs_node_run_dir_create(open_dir, &d, &err),
                         PJS_ERR_PERMISSION_DENIED);
        assert_non_null(strstr(err.msg, "belongs to uid 65534"));
    }

    assert_int_equal(pjs_node_run_dir_create("/", &d, &err), PJS_ERR_INVALID_ARGUMENT);
    unlink(link);
    rmdir(target);
    rmdir(open_dir);
    rmdir(loose);
    rmdir(top);
}

static void test_free_ports_differ(void **state)
{
    (void)state;
    int ports[6];
    pjs_error err;
    assert_int_equal(pjs_node_free_ports(ports, 6, NULL, 0, &err), 0);
    for (int i = 0; i < 6; i++) {
        assert_true(ports[i] > 0);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(ports[i], ports[j]);
    }
}

/* Ports in the avoid list are never picked, even when they are free: each
 * round avoids the ports the one before picked, which were just released. */
static void test_free_ports_avoid_the_ones_given(void **state)
{
    (void)state;
    int ports[6], avoid[6];
    pjs_error err;
    assert_int_equal(pjs_node_free_ports(avoid, 6, NULL, 0, &err), 0);
    for (int round = 0; round < 50; round++) {
        assert_int_equal(pjs_node_free_ports(ports, 6, avoid, 6, &err), 0);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 6; j++)
                assert_int_not_equal(ports[i], avoid[j]);
        memcpy(avoid, ports, sizeof avoid);
    }
}

/* ---- the probe against a canned server -------------------------------------- */

typedef struct canned {
    int listen_fd;
    int port;
    const char *reply; /* NULL: accept and never answer */
    char request[2048];
    pthread_t thread;
} canned;

static void *serve_once(void *arg)
{
    canned *c = arg;
    int fd = accept(c->listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    size_t n = 0;
    /* Read the request head (and the small body after it). */
    while (n + 1 < sizeof c->request) {
        ssize_t r = recv(fd, c->request + n, sizeof c->request - 1 - n, 0);
        if (r <= 0)
            break;
        n += (size_t)r;
        c->request[n] = '\0';
        char *head_end = strstr(c->request, "\r\n\r\n");
        if (head_end != NULL) {
            const char *cl = strstr(c->request, "Content-Length: ");
            size_t body = cl ? (size_t)atoi(cl + 16) : 0;
            if ((size_t)(head_end + 4 - c->request) + body <= n)
                break;
        }
    }
    if (c->reply != NULL) {
        ssize_t w = send(fd, c->reply, strlen(c->reply), MSG_NOSIGNAL);
        (void)w;
        close(fd);
    } else {
        usleep(400 * 1000); /* longer than the probe waits */
        close(fd);
    }
    return NULL;
}

static void canned_start(canned *c, const char *reply)
{
    memset(c, 0, sizeof *c);
    c->reply = reply;
    c->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(c->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(c->listen_fd, 4), 0);
    assert_int_equal(getsockname(c->listen_fd, (struct sockaddr *)&a, &len), 0);
    c->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&c->thread, NULL, serve_once, c), 0);
}

static void canned_stop(canned *c)
{
    pthread_join(c->thread, NULL);
    close(c->listen_fd);
}

static void test_probe_reads_a_content_length_reply(void **state)
{
    (void)state;
    canned c;
    canned_start(&c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     "Content-Length: 11\r\n\r\n[\"a\", \"b\"]\nTRAILING");
    pjs_probe_request req = {.host = "127.0.0.1", .port = c.port, .method = "POST",
                             .path = "/v2/repository/index", .body = "{}", .body_len = 2,
                             .bearer_token = "tok", .timeout_ms = 2000};
    pjs_probe_reply reply;
    pjs_error err;
    assert_int_equal(pjs_probe_http(&req, &reply, &err), 0);
    canned_stop(&c);
    assert_int_equal(reply.status, 200);
    assert_int_equal(reply.body_len, 11);
    assert_string_equal(reply.body, "[\"a\", \"b\"]\n");
    assert_non_null(strstr(c.request, "POST /v2/repository/index HTTP/1.1\r\n"));
    assert_non_null(strstr(c.request, "Authorization: Bearer tok\r\n"));
    assert_non_null(strstr(c.request, "Content-Length: 2\r\n"));
    assert_non_null(strstr(c.request, "\r\n\r\n{}"));
    pjs_probe_reply_free(&reply);
}

static void test_probe_reads_to_the_end_of_the_connection(void **state)
{
    (void)state;
    canned c;
    canned_start(&c, "HTTP/1.0 503 Service Unavailable\r\n\r\nnot ready");
    pjs_probe_request req = {.host = "127.0.0.1", .port = c.port, .method = "GET",
                             .path = "/v2/health/live"};
    pjs_probe_reply reply;
    pjs_error err;
    assert_int_equal(pjs_probe_http(&req, &reply, &err), 0);
    canned_stop(&c);
    assert_int_equal(reply.status, 503);
    assert_string_equal(reply.body, "not ready");
    assert_null(strstr(c.request, "Authorization"));
    pjs_probe_reply_free(&reply);
}

static void test_probe_refused_is_unavailable(void **state)
{
    (void)state;
    int port[1];
    pjs_error err;
    assert_int_equal(pjs_node_free_ports(port, 1, NULL, 0, &err), 0);
    pjs_probe_request req = {.host = "127.0.0.1", .port = port[0], .method = "GET",
                             .path = "/v2/health/live", .timeout_ms = 500};
    pjs_probe_reply reply;
    assert_int_equal(pjs_probe_http(&req, &reply, &err), PJS_ERR_UNAVAILABLE);
    assert_non_null(strstr(err.msg, "connect"));
}

static void test_probe_of_a_silent_peer_times_out(void **state)
{
    (void)state;
    canned c;
    canned_start(&c, NULL);
    pjs_probe_request req = {.host = "127.0.0.1", .port = c.port, .method = "GET",
                             .path = "/v2/health/live", .timeout_ms = 100};
    pjs_probe_reply reply;
    pjs_error err;
    assert_int_equal(pjs_probe_http(&req, &reply, &err), PJS_ERR_DEADLINE_EXCEEDED);
    assert_non_null(strstr(err.msg, "no reply within 100 ms"));
    canned_stop(&c);
}

static void test_probe_refuses_what_is_not_http(void **state)
{
    (void)state;
    static const char *const replies[] = {
        "SSH-2.0-OpenSSH\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
        "",
    };
    pjs_status want[] = {PJS_ERR_INVALID_ARGUMENT, PJS_ERR_UNSUPPORTED, PJS_ERR_UNAVAILABLE,
                         PJS_ERR_UNAVAILABLE};
    for (size_t i = 0; i < sizeof replies / sizeof replies[0]; i++) {
        canned c;
        canned_start(&c, replies[i]);
        pjs_probe_request req = {.host = "127.0.0.1", .port = c.port, .method = "GET",
                                 .path = "/x", .timeout_ms = 2000};
        pjs_probe_reply reply;
        pjs_error err;
        assert_int_equal(pjs_probe_http(&req, &reply, &err), want[i]);
        canned_stop(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff_doubles_to_the_cap),
        cmocka_unit_test(test_stable_worker_starts_again_from_the_first_delay),
        cmocka_unit_test(test_budget_counts_restarts_within_the_window),
        cmocka_unit_test(test_no_restarts_allowed),
        cmocka_unit_test(test_device_list),
        cmocka_unit_test(test_token_file_is_private_and_random),
        cmocka_unit_test(test_default_run_dir_is_fresh_and_private),
        cmocka_unit_test(test_given_run_dir_is_made_or_checked),
        cmocka_unit_test(test_free_ports_differ),
        cmocka_unit_test(test_free_ports_avoid_the_ones_given),
        cmocka_unit_test(test_probe_reads_a_content_length_reply),
        cmocka_unit_test(test_probe_reads_to_the_end_of_the_connection),
        cmocka_unit_test(test_probe_refused_is_unavailable),
        cmocka_unit_test(test_probe_of_a_silent_peer_times_out),
        cmocka_unit_test(test_probe_refuses_what_is_not_http),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
