/*
 * test_repo_watch.c - unit tests of the repository scan
 * (src/registry/repo_watch.c): fingerprints and the two-poll rule, on a
 * temporary directory, with a fake action that records what it is asked.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "registry/repo_watch.h"

typedef struct recorder {
    char calls[16][300]; /* "name added|changed|removed" */
    size_t n;
    bool refuse; /* the action asks to be called again */
} recorder;

static bool record(void *ctx, const char *name, uint64_t before, uint64_t now)
{
    recorder *r = ctx;
    if (r->n < 16)
        snprintf(r->calls[r->n++], sizeof r->calls[0], "%s %s", name,
                 now == 0 ? "removed" : before == 0 ? "added" : "changed");
    return !r->refuse;
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void make_bundle(const char *repo, const char *name, const char *weights)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", repo, name);
    mkdir(dir, 0700);
    write_file(dir, "manifest.yaml", "name: x\n");
    write_file(dir, "weights.safetensors", weights);
}

static void poll_n(pjs_repo_scan *s, recorder *r, int n)
{
    for (int i = 0; i < n; i++)
        pjs_repo_scan_poll(s, record, r, NULL);
}

/* The same story with change notification and with scans at every poll. */
static void settled_changes_are_acted_on_once(pjs_repo_notify notify)
{
    char repo[] = "/tmp/pjs-repo-watch-XXXXXX";
    assert_non_null(mkdtemp(repo));
    make_bundle(repo, "kept", "aaaa");
    pjs_repo_scan *s;
    pjs_error err;
    assert_int_equal(pjs_repo_scan_open(repo, notify, &s, &err), 0);
    assert_int_equal(pjs_repo_scan_notified(s), notify == PJS_REPO_NOTIFY_AUTO);
    assert_int_equal(pjs_repo_scan_count(s), 1);
    recorder r = {0};
    poll_n(s, &r, 3); /* the state at open counts as acted on */
    assert_int_equal(r.n, 0);

    make_bundle(repo, "newcomer", "bb");
    pjs_repo_scan_poll(s, record, &r, NULL); /* seen once: not yet */
    assert_int_equal(r.n, 0);
    poll_n(s, &r, 3); /* twice in a row: once, and not again */
    assert_int_equal(r.n, 1);
    assert_string_equal(r.calls[0], "newcomer added");

    char dir[512];
    snprintf(dir, sizeof dir, "%s/newcomer", repo);
    write_file(dir, "weights.safetensors", "cccccc");
    write_file(dir, "notes.txt", "not read by a load"); /* does not count */
    poll_n(s, &r, 3);
    assert_int_equal(r.n, 2);
    assert_string_equal(r.calls[1], "newcomer changed");

    /* Refused (a full load queue): asked again at the next poll. */
    write_file(dir, "weights.safetensors", "ddddddd");
    r.refuse = true;
    poll_n(s, &r, 3);
    assert_int_equal(r.n, 4);
    r.refuse = false;
    pjs_repo_scan_poll(s, record, &r, NULL);
    assert_int_equal(r.n, 5);
    poll_n(s, &r, 2);
    assert_int_equal(r.n, 5);

    /* Stopping: no action starts. */
    write_file(dir, "weights.safetensors", "e");
    atomic_bool stop = true;
    for (int i = 0; i < 3; i++)
        pjs_repo_scan_poll(s, record, &r, &stop);
    assert_int_equal(r.n, 5);

    char path[600];
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/manifest.yaml", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    unlink(path);
    rmdir(dir);
    poll_n(s, &r, 3);
    assert_int_equal(r.n, 6);
    assert_string_equal(r.calls[5], "newcomer removed");
    assert_int_equal(pjs_repo_scan_count(s), 1);
    pjs_repo_scan_close(s);

    snprintf(dir, sizeof dir, "%s/kept", repo);
    snprintf(path, sizeof path, "%s/manifest.yaml", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    unlink(path);
    rmdir(dir);
    rmdir(repo);
}

static void test_settled_changes_are_acted_on_once(void **state)
{
    (void)state;
    settled_changes_are_acted_on_once(PJS_REPO_NOTIFY_AUTO);
}

static void test_settled_changes_without_notification(void **state)
{
    (void)state;
    settled_changes_are_acted_on_once(PJS_REPO_NOTIFY_NONE);
}

static void remove_bundle(const char *repo, const char *name)
{
    char path[600];
    const char *files[] = {"manifest.yaml", "weights.safetensors"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s/%s", repo, name, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/%s", repo, name);
    rmdir(path);
}

/* With notification an idle repository costs no fingerprint per poll, a
 * change one bundle's, until the periodic full scan; a link retargeted to
 * another directory counts as that bundle's change. */
static void test_notified_polls_look_only_at_what_changed(void **state)
{
    (void)state;
    char repo[] = "/tmp/pjs-repo-watch-XXXXXX";
    assert_non_null(mkdtemp(repo));
    enum { N = 300 };
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "m%03d", i);
        make_bundle(repo, name, "w");
    }
    pjs_repo_scan *s;
    pjs_error err;
    assert_int_equal(pjs_repo_scan_open(repo, PJS_REPO_NOTIFY_AUTO, &s, &err), 0);
    if (!pjs_repo_scan_notified(s)) {
        pjs_repo_scan_close(s);
        skip(); /* no inotify here: the scanning story is tested above */
    }
    assert_int_equal(pjs_repo_scan_count(s), N);
    uint64_t f0 = pjs_repo_scan_fingerprints(s);
    recorder r = {0};
    poll_n(s, &r, 5);
    assert_int_equal(pjs_repo_scan_fingerprints(s), f0); /* nothing happened: nothing read */
    assert_int_equal(r.n, 0);

    char dir[512];
    snprintf(dir, sizeof dir, "%s/m123", repo);
    write_file(dir, "weights.safetensors", "changed");
    poll_n(s, &r, 3);
    assert_int_equal(r.n, 1);
    assert_string_equal(r.calls[0], "m123 changed");
    uint64_t looked = pjs_repo_scan_fingerprints(s) - f0;
    assert_true(looked >= 2 && looked <= 4); /* seen, confirmed, settled */

    /* a link to another directory, then retargeted */
    char other[] = "/tmp/pjs-repo-watch-other-XXXXXX";
    assert_non_null(mkdtemp(other));
    make_bundle(other, "a", "first");
    make_bundle(other, "b", "second");
    char link[600], target[600];
    snprintf(link, sizeof link, "%s/linked", repo);
    snprintf(target, sizeof target, "%s/a", other);
    assert_int_equal(symlink(target, link), 0);
    poll_n(s, &r, 3);
    assert_int_equal(r.n, 2);
    assert_string_equal(r.calls[1], "linked added");
    char tmp[620];
    snprintf(tmp, sizeof tmp, "%s/.linked-new", repo);
    snprintf(target, sizeof target, "%s/b", other);
    assert_int_equal(symlink(target, tmp), 0);
    assert_int_equal(rename(tmp, link), 0);
    poll_n(s, &r, 3);
    assert_int_equal(r.n, 3);
    assert_string_equal(r.calls[2], "linked changed");
    snprintf(dir, sizeof dir, "%s/b", other); /* written in place through the new link */
    write_file(dir, "weights.safetensors", "second, changed");
    poll_n(s, &r, 3);
    assert_int_equal(r.n, 4);
    assert_string_equal(r.calls[3], "linked changed");

    /* the periodic full scan finds what no notification said */
    uint64_t before = pjs_repo_scan_fingerprints(s);
    poll_n(s, &r, PJS_REPO_FULL_SCAN_POLLS);
    assert_true(pjs_repo_scan_fingerprints(s) - before >= N);
    assert_int_equal(r.n, 4);
    pjs_repo_scan_close(s);

    unlink(link);
    remove_bundle(other, "a");
    remove_bundle(other, "b");
    rmdir(other);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "m%03d", i);
        remove_bundle(repo, name);
    }
    rmdir(repo);
}

static void test_missing_repository(void **state)
{
    (void)state;
    pjs_repo_scan *s = NULL;
    pjs_error err;
    assert_int_equal(pjs_repo_scan_open("/nonexistent/pjs-repo", PJS_REPO_NOTIFY_AUTO, &s, &err),
                     PJS_ERR_NOT_FOUND);
    assert_null(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_settled_changes_are_acted_on_once),
        cmocka_unit_test(test_settled_changes_without_notification),
        cmocka_unit_test(test_notified_polls_look_only_at_what_changed),
        cmocka_unit_test(test_missing_repository),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
