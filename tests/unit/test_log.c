/*
 * test_log.c - log lines cannot be forged: control characters in a message
 * are escaped (pjs_log_escape), and pjs_log writes exactly one line per call
 * whatever its arguments hold; a rate-limited source writes one line a
 * second at most and counts the rest in the next line it writes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/log.h"

static void escapes_control_characters(void **state)
{
    (void)state;
    char out[128];
    const char in[] = "a\nb\rc\td\x1b[31m\x7f\x01z";
    size_t n = pjs_log_escape(in, sizeof in - 1, out, sizeof out);
    assert_string_equal(out, "a\\nb\\rc\\td\\x1b[31m\\x7f\\x01z");
    assert_int_equal(n, strlen(out));
}

static void keeps_printable_and_utf8(void **state)
{
    (void)state;
    char out[64];
    const char in[] = "mlp \\n \xc3\xa9t\xc3\xa9 ~";
    pjs_log_escape(in, sizeof in - 1, out, sizeof out);
    assert_string_equal(out, in);
}

static void escapes_nul_inside_the_length(void **state)
{
    (void)state;
    char out[16];
    const char in[] = {'a', '\0', 'b'};
    pjs_log_escape(in, sizeof in, out, sizeof out);
    assert_string_equal(out, "a\\x00b");
}

static void never_splits_an_escape(void **state)
{
    (void)state;
    char out[6]; /* room for 5 bytes and the NUL */
    size_t n = pjs_log_escape("ab\x1b", 3, out, sizeof out);
    assert_string_equal(out, "ab"); /* "\x1b" needs 4 bytes: left out whole */
    assert_int_equal(n, 2);
    assert_int_equal(pjs_log_escape("x", 1, out, 0), 0);
}

/* Runs pjs_log with stderr on a pipe and returns what it wrote. */
static size_t capture_log(const char *name, char *buf, size_t size)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fds[1], STDERR_FILENO) >= 0);
    pjs_info("model %s not found", name);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], buf, size - 1);
    close(fds[0]);
    assert_true(n > 0);
    buf[n] = '\0';
    return (size_t)n;
}

static void one_line_per_call(void **state)
{
    (void)state;
    char buf[4096];
    capture_log("mlp\n2026-11-23T18:00:00.000Z ERROR forged\r\x1b[2J", buf, sizeof buf);
    char *nl = strchr(buf, '\n');
    assert_non_null(nl);
    assert_ptr_equal(nl, buf + strlen(buf) - 1); /* the only newline ends the line */
    assert_non_null(strstr(buf, "INFO  model mlp\\n2026-11-23T18:00:00.000Z ERROR forged\\r"
                                "\\x1b[2J not found\n"));
}

static void a_long_message_is_cut_into_one_line(void **state)
{
    (void)state;
    char name[3000], buf[8192];
    for (size_t i = 0; i < sizeof name - 1; i++)
        name[i] = i % 2 ? '\n' : 'x';
    name[sizeof name - 1] = '\0';
    size_t n = capture_log(name, buf, sizeof buf);
    assert_true(n <= 2048);
    assert_ptr_equal(strchr(buf, '\n'), buf + n - 1);
}

/* Points stderr at a pipe; restore_stderr puts it back and returns what was
 * written in between. */
static int redirect_stderr(int fds[2])
{
    assert_int_equal(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fds[1], STDERR_FILENO) >= 0);
    return saved;
}

static size_t restore_stderr(int saved, int fds[2], char *buf, size_t size)
{
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], buf, size - 1);
    close(fds[0]);
    buf[n > 0 ? n : 0] = '\0';
    return n > 0 ? (size_t)n : 0;
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void a_limited_source_writes_one_line_a_second_and_counts_the_rest(void **state)
{
    (void)state;
    pjs_log_limiter limiter = {0};
    char buf[8192];
    int fds[2];
    int saved = redirect_stderr(fds);
    for (int i = 0; i < 50; i++)
        pjs_log_limited(&limiter, PJS_LOG_WARN, "model %s: over budget", "big");
    restore_stderr(saved, fds, buf, sizeof buf);
    assert_int_equal(count_lines(buf), 1);
    assert_non_null(strstr(buf, "WARN  model big: over budget\n"));
    assert_int_equal(atomic_load(&limiter.dropped), 49);

    /* A second later the next line is written, with the count. */
    atomic_fetch_sub(&limiter.next_ms, 1000);
    saved = redirect_stderr(fds);
    pjs_log_limited(&limiter, PJS_LOG_WARN, "model %s: over budget", "big");
    pjs_log_limited(&limiter, PJS_LOG_WARN, "model %s: over budget", "big");
    restore_stderr(saved, fds, buf, sizeof buf);
    assert_int_equal(count_lines(buf), 1);
    assert_non_null(strstr(buf, "WARN  model big: over budget (49 more like this in the last 1."));
    assert_non_null(strstr(buf, " s)\n"));
    assert_int_equal(atomic_load(&limiter.dropped), 1); /* the call just after it */

    /* A line under the threshold is neither written nor counted. */
    pjs_log_set_level(PJS_LOG_ERROR);
    atomic_fetch_sub(&limiter.next_ms, 1000);
    pjs_log_limited(&limiter, PJS_LOG_WARN, "quiet");
    pjs_log_set_level(PJS_LOG_INFO);
    assert_int_equal(atomic_load(&limiter.dropped), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(escapes_control_characters),
        cmocka_unit_test(keeps_printable_and_utf8),
        cmocka_unit_test(escapes_nul_inside_the_length),
        cmocka_unit_test(never_splits_an_escape),
        cmocka_unit_test(one_line_per_call),
        cmocka_unit_test(a_long_message_is_cut_into_one_line),
        cmocka_unit_test(a_limited_source_writes_one_line_a_second_and_counts_the_rest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
