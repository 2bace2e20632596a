/*
 * test_weight_store.c - unit tests of the shared host weight store
 * (src/registry/weight_store.c) in real directories under /dev/shm: the
 * segment format and its checks, create then attach, modes, a bad segment
 * (bytes, size, header) refused and replaced, a held segment that changed
 * caught by verify, reclamation after a holder died, a stale temporary of a
 * creator that died, creators racing in several processes, and the
 * directory checks of open.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/checksum.h"
#include "registry/weight_store.h"

#define N_WEIGHTS 3

static char dir[128];
static pjs_shape shapes[N_WEIGHTS] = {{2, {100, 30}}, {1, {7}}, {1, {5000}}};
static unsigned char *bytes[N_WEIGHTS];
static pjs_wstore_tensor tensors[N_WEIGHTS];
static int fills; /* fill calls in this process */

static int fill(void *ctx, size_t i, void *dst, pjs_error *err)
{
    (void)ctx;
    (void)err;
    assert_int_equal((uintptr_t)dst % PJS_WSTORE_ALIGN, 0);
    memcpy(dst, bytes[i], (size_t)tensors[i].nbytes);
    fills++;
    return 0;
}

static int failing_fill(void *ctx, size_t i, void *dst, pjs_error *err)
{
    (void)ctx;
    (void)i;
    (void)dst;
    return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION, "the weights file changed");
}

static void make_tensors(unsigned seed)
{
    static const char *names[N_WEIGHTS] = {"dense.w", "dense.b", "embed"};
    for (size_t i = 0; i < N_WEIGHTS; i++) {
        uint64_t n = 4;
        for (int d = 0; d < shapes[i].rank; d++)
            n *= (uint64_t)shapes[i].dims[d];
        free(bytes[i]);
        bytes[i] = malloc((size_t)n);
        for (uint64_t k = 0; k < n; k++)
            bytes[i][k] = (unsigned char)(k * 31 + i * 7 + seed);
        tensors[i] = (pjs_wstore_tensor){.name = names[i], .dtype = PJS_DTYPE_F32,
                                         .shape = &shapes[i], .nbytes = n,
                                         .sum = pjs_checksum_of(bytes[i], (size_t)n)};
    }
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/dev/shm/pjs-test-wstore-%d", (int)getpid());
    make_tensors(0);
    fills = 0;
    return 0;
}

/* Removes dir and what is in it. */
static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
    for (size_t i = 0; i < N_WEIGHTS; i++) {
        free(bytes[i]);
        bytes[i] = NULL;
    }
    return 0;
}

static pjs_wstore *open_store(const char *group)
{
    pjs_wstore_options o = {.dir = dir, .group = group};
    pjs_wstore *s = NULL;
    pjs_error err = {0};
    int rc = pjs_wstore_open(&o, &s, &err);
    if (rc != 0)
        fail_msg("pjs_wstore_open: %s", err.msg);
    return s;
}

static pjs_wstore_segment *acquire(pjs_wstore *s)
{
    pjs_wstore_segment *seg = NULL;
    pjs_error err = {0};
    int rc = pjs_wstore_acquire(s, "m", tensors, N_WEIGHTS, fill, NULL, &seg, &err);
    if (rc != 0)
        fail_msg("pjs_wstore_acquire: %s", err.msg);
    return seg;
}

static void assert_weights_are(const pjs_wstore_segment *seg)
{
    for (size_t i = 0; i < N_WEIGHTS; i++)
        assert_memory_equal(pjs_wstore_segment_weight(seg, i), bytes[i],
                            (size_t)tensors[i].nbytes);
}

/* Files in dir that the store makes (the lock file aside). */
static int count_segments(void)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".weights") != NULL || strstr(e->d_name, ".creating") != NULL;
    closedir(d);
    return n;
}

static void segment_path(char *out, size_t size)
{
    pjs_wstore_layout l;
    pjs_error err;
    assert_int_equal(pjs_wstore_layout_init(&l, tensors, N_WEIGHTS, &err), 0);
    char name[32];
    pjs_wstore_segment_name(l.key, name);
    snprintf(out, size, "%s/%s", dir, name);
    pjs_wstore_layout_free(&l);
}

/* ---- the format ------------------------------------------------------------ */

static void test_header_round_trip_and_refusals(void **state)
{
    (void)state;
    pjs_wstore_layout l;
    pjs_error err = {0};
    assert_int_equal(pjs_wstore_layout_init(&l, tensors, N_WEIGHTS, &err), 0);
    assert_int_equal(l.header_bytes, 4096);
    assert_int_equal(l.offsets[0], 4096);
    for (size_t i = 0; i < N_WEIGHTS; i++)
        assert_int_equal(l.offsets[i] % PJS_WSTORE_ALIGN, 0);
    assert_int_equal(l.total_bytes % 4096, 0);
    unsigned char *seg = calloc(1, (size_t)l.total_bytes);
    pjs_wstore_header_write(&l, seg);
    for (size_t i = 0; i < N_WEIGHTS; i++)
        memcpy(seg + l.offsets[i], bytes[i], (size_t)tensors[i].nbytes);
    assert_int_equal(pjs_wstore_header_check(&l, seg, (size_t)l.total_bytes, &err), 0);
    assert_int_equal(pjs_wstore_data_check(&l, seg, &err), 0);

    assert_int_not_equal(pjs_wstore_header_check(&l, seg, (size_t)l.total_bytes - 4096, &err), 0);
    assert_non_null(strstr(err.msg, "size"));

    unsigned char saved[8];
    memcpy(saved, seg, 8);
    seg[0] ^= 1;
    assert_int_not_equal(pjs_wstore_header_check(&l, seg, (size_t)l.total_bytes, &err), 0);
    assert_non_null(strstr(err.msg, "magic"));
    memcpy(seg, saved, 8);

    seg[32] ^= 1; /* the content key */
    assert_int_not_equal(pjs_wstore_header_check(&l, seg, (size_t)l.total_bytes, &err), 0);
    assert_non_null(strstr(err.msg, "content key"));
    seg[32] ^= 1;

    seg[64 + 24 + 16] ^= 1; /* weight 1's checksum in its entry */
    assert_int_not_equal(pjs_wstore_header_check(&l, seg, (size_t)l.total_bytes, &err), 0);
    assert_non_null(strstr(err.msg, "header checksum"));
    seg[64 + 24 + 16] ^= 1;

    seg[l.offsets[2] + 100] ^= 0x40;
    assert_int_equal(pjs_wstore_header_check(&l, seg, (size_t)l.total_bytes, &err), 0);
    assert_int_not_equal(pjs_wstore_data_check(&l, seg, &err), 0);
    assert_non_null(strstr(err.msg, "\"embed\""));
    free(seg);
    pjs_wstore_layout_free(&l);
}

static void test_key_follows_content(void **state)
{
    (void)state;
    pjs_wstore_layout a, b, c;
    pjs_error err;
    assert_int_equal(pjs_wstore_layout_init(&a, tensors, N_WEIGHTS, &err), 0);
    assert_int_equal(pjs_wstore_layout_init(&b, tensors, N_WEIGHTS, &err), 0);
    assert_true(a.key == b.key);
    pjs_wstore_tensor changed[N_WEIGHTS];
    memcpy(changed, tensors, sizeof changed);
    changed[1].sum ^= 1;
    assert_int_equal(pjs_wstore_layout_init(&c, changed, N_WEIGHTS, &err), 0);
    assert_true(c.key != a.key);
    pjs_wstore_layout_free(&c);
    changed[1] = tensors[1];
    changed[1].name = "dense.bias";
    assert_int_equal(pjs_wstore_layout_init(&c, changed, N_WEIGHTS, &err), 0);
    assert_true(c.key != a.key);
    pjs_wstore_layout_free(&a);
    pjs_wstore_layout_free(&b);
    pjs_wstore_layout_free(&c);
}

/* ---- create, attach, release ------------------------------------------------- */

static void test_create_then_attach_then_removed_with_the_last(void **state)
{
    (void)state;
    pjs_wstore *s = open_store(NULL);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0700);

    pjs_wstore_segment *a = acquire(s);
    assert_int_equal(fills, N_WEIGHTS);
    assert_weights_are(a);
    char path[256];
    segment_path(path, sizeof path);
    assert_string_equal(pjs_wstore_segment_path(a), path);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);

    pjs_wstore_segment *b = acquire(s); /* attaches: no fill */
    assert_int_equal(fills, N_WEIGHTS);
    assert_weights_are(b);
    pjs_error err = {0};
    assert_int_equal(pjs_wstore_segment_verify(b, &err), 0);

    pjs_wstore_release(s, a);
    assert_int_equal(stat(path, &st), 0); /* b still maps it */
    pjs_wstore_release(s, b);
    assert_int_not_equal(stat(path, &st), 0);
    assert_int_equal(count_segments(), 0);
    pjs_wstore_close(s);
}

static void test_group_mode(void **state)
{
    (void)state;
    char group[32];
    snprintf(group, sizeof group, "%u", (unsigned)getegid());
    pjs_wstore *s = open_store(group);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 07777, 02770);
    pjs_wstore_segment *a = acquire(s);
    assert_int_equal(stat(pjs_wstore_segment_path(a), &st), 0);
    assert_int_equal(st.st_mode & 07777, 0660);
    assert_int_equal(st.st_gid, getegid());
    pjs_wstore_release(s, a);
    pjs_wstore_close(s);

    /* A supervisor's sweep keeps the lock file the group's. */
    pjs_error err = {0};
    assert_int_equal(pjs_wstore_sweep_dir(dir, &err), 0);
    char lock[256];
    snprintf(lock, sizeof lock, "%s/.lock", dir);
    assert_int_equal(stat(lock, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0660);
}

static void test_fill_error_returned_and_nothing_left(void **state)
{
    (void)state;
    pjs_wstore *s = open_store(NULL);
    pjs_wstore_segment *seg = NULL;
    pjs_error err = {0};
    assert_int_equal(pjs_wstore_acquire(s, "m", tensors, N_WEIGHTS, failing_fill, NULL, &seg,
                                        &err),
                     PJS_ERR_FAILED_PRECONDITION);
    assert_null(seg);
    assert_non_null(strstr(err.msg, "the weights file changed"));
    assert_int_equal(count_segments(), 0);
    pjs_wstore_close(s);
}

static void test_changed_bundle_gets_a_new_segment(void **state)
{
    (void)state;
    pjs_wstore *s = open_store(NULL);
    pjs_wstore_segment *a = acquire(s);
    make_tensors(1);
    pjs_wstore_segment *b = acquire(s);
    assert_string_not_equal(pjs_wstore_segment_path(a), pjs_wstore_segment_path(b));
    assert_int_equal(fills, 2 * N_WEIGHTS);
    assert_weights_are(b);
    assert_int_equal(count_segments(), 2);
    pjs_wstore_release(s, a);
    assert_int_equal(count_segments(), 1);
    pjs_wstore_release(s, b);
    pjs_wstore_close(s);
}

/* ---- bad segments -------------------------------------------------------------- */

/* With `held` mapping the segment (so no sweep removes it), corrupt() changes
 * the file; a new acquire must refuse it and make a fresh copy, and held's
 * verify must fail when the weights' bytes or size changed (a header that
 * changed does not change the weights held serves). */
static void refused_and_replaced(void (*corrupt)(int fd, const pjs_wstore_layout *l),
                                 bool weights_changed)
{
    pjs_wstore *s = open_store(NULL);
    pjs_wstore_segment *held = acquire(s);
    struct stat before, after;
    assert_int_equal(stat(pjs_wstore_segment_path(held), &before), 0);
    pjs_wstore_layout l;
    pjs_error err = {0};
    assert_int_equal(pjs_wstore_layout_init(&l, tensors, N_WEIGHTS, &err), 0);
    int fd = open(pjs_wstore_segment_path(held), O_RDWR);
    assert_true(fd >= 0);
    corrupt(fd, &l);
    close(fd);
    pjs_wstore_layout_free(&l);

    pjs_wstore_segment *fresh = acquire(s);
    assert_int_equal(fills, 2 * N_WEIGHTS); /* filled again */
    assert_weights_are(fresh);
    assert_int_equal(stat(pjs_wstore_segment_path(fresh), &after), 0);
    assert_true(after.st_ino != before.st_ino);
    assert_int_equal(pjs_wstore_segment_verify(fresh, &err), 0);

    if (weights_changed) {
        assert_int_equal(pjs_wstore_segment_verify(held, &err), PJS_ERR_FAILED_PRECONDITION);
        assert_non_null(strstr(err.msg, pjs_wstore_segment_path(held)));
    } else {
        assert_int_equal(pjs_wstore_segment_verify(held, &err), 0);
    }
    pjs_wstore_release(s, held);
    pjs_wstore_release(s, fresh);
    assert_int_equal(count_segments(), 0);
    pjs_wstore_close(s);
}

static void flip_a_weight_byte(int fd, const pjs_wstore_layout *l)
{
    unsigned char b;
    off_t at = (off_t)l->offsets[0] + 17;
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x80;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
}

static void truncate_it(int fd, const pjs_wstore_layout *l)
{
    assert_int_equal(ftruncate(fd, (off_t)l->offsets[1]), 0);
}

static void change_the_key(int fd, const pjs_wstore_layout *l)
{
    (void)l;
    uint64_t key = 0x1234;
    assert_int_equal(pwrite(fd, &key, sizeof key, 32), (ssize_t)sizeof key);
}

static void test_bad_bytes_refused(void **state)
{
    (void)state;
    refused_and_replaced(flip_a_weight_byte, true);
}

static void test_bad_size_refused(void **state)
{
    (void)state;
    refused_and_replaced(truncate_it, true);
}

static void test_bad_header_refused(void **state)
{
    (void)state;
    refused_and_replaced(change_the_key, false);
}

/* ---- processes ----------------------------------------------------------------- */

static void test_segment_of_a_dead_holder_is_reclaimed(void **state)
{
    (void)state;
    pjs_wstore *s = open_store(NULL);
    char path[256];
    segment_path(path, sizeof path);
    pid_t pid = fork();
    if (pid == 0) {
        pjs_wstore_segment *seg = NULL;
        pjs_error err;
        _exit(pjs_wstore_acquire(s, "m", tensors, N_WEIGHTS, fill, NULL, &seg, &err) == 0 ? 0
                                                                                          : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0); /* left behind: nobody released it */
    pjs_error err = {0};
    assert_int_equal(pjs_wstore_sweep_dir(dir, &err), 1);
    assert_int_not_equal(stat(path, &st), 0);
    pjs_wstore_close(s);
}

static void test_stale_temporary_of_a_dead_creator(void **state)
{
    (void)state;
    pjs_wstore *s = open_store(NULL);
    char path[256], tmp[300];
    segment_path(path, sizeof path);
    const char *name = strrchr(path, '/') + 1;
    snprintf(tmp, sizeof tmp, "%s/.%.16s.creating", dir, name);
    int fd = open(tmp, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 100), 0);
    close(fd);
    pjs_wstore_segment *seg = acquire(s);
    assert_weights_are(seg);
    assert_int_equal(count_segments(), 1);
    assert_int_not_equal(access(tmp, F_OK), 0);
    pjs_wstore_release(s, seg);
    pjs_wstore_close(s);
}

#define RACERS 4

static void test_racing_creators_make_one_segment(void **state)
{
    (void)state;
    pjs_wstore *s = open_store(NULL);
    /* go: closed to start them all at once; acquired: each writes a byte once
     * it maps the segment; done: closed when all have, so each holds it
     * until then (a segment nobody holds may be swept and made again). */
    int go[2], acquired[2], done[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(acquired), 0);
    assert_int_equal(pipe(done), 0);
    pid_t pids[RACERS];
    for (int i = 0; i < RACERS; i++) {
        if ((pids[i] = fork()) == 0) {
            char c;
            close(go[1]);
            close(done[1]);
            if (read(go[0], &c, 1) != 0)
                _exit(3);
            pjs_wstore_segment *seg = NULL;
            pjs_error err;
            fills = 0;
            if (pjs_wstore_acquire(s, "m", tensors, N_WEIGHTS, fill, NULL, &seg, &err) != 0)
                _exit(2);
            for (size_t k = 0; k < N_WEIGHTS; k++)
                if (memcmp(pjs_wstore_segment_weight(seg, k), bytes[k],
                           (size_t)tensors[k].nbytes) != 0)
                    _exit(2);
            if (write(acquired[1], "", 1) != 1 || read(done[0], &c, 1) != 0)
                _exit(3);
            _exit(fills > 0 ? 1 : 0); /* 1: this one created it */
        }
    }
    close(go[0]);
    close(go[1]); /* every racer reads EOF at once */
    close(acquired[1]);
    close(done[0]);
    char c;
    int n_acquired = 0;
    while (read(acquired[0], &c, 1) == 1)
        if (++n_acquired == RACERS)
            break;
    assert_int_equal(n_acquired, RACERS);
    assert_int_equal(count_segments(), 1);
    close(done[1]);
    close(acquired[0]);
    int creators = 0;
    for (int i = 0; i < RACERS; i++) {
        int status;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) <= 1);
        creators += WEXITSTATUS(status);
    }
    assert_int_equal(creators, 1);
    assert_int_equal(count_segments(), 1);
    pjs_error err = {0};
    assert_int_equal(pjs_wstore_sweep_dir(dir, &err), 1);
    pjs_wstore_close(s);
}

/* ---- the directory ------------------------------------------------------------- */

static void test_open_refuses_unsafe_directories(void **state)
{
    (void)state;
    pjs_wstore_options o = {.dir = dir};
    pjs_wstore *s = NULL;
    pjs_error err = {0};
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(chmod(dir, 0777), 0);
    assert_int_equal(pjs_wstore_open(&o, &s, &err), PJS_ERR_PERMISSION_DENIED);
    assert_non_null(strstr(err.msg, "writable by others"));
    assert_int_equal(chmod(dir, 0770), 0);
    assert_int_equal(pjs_wstore_open(&o, &s, &err), PJS_ERR_PERMISSION_DENIED);
    assert_non_null(strstr(err.msg, "--shared-weights-group"));
    assert_int_equal(chmod(dir, 0700), 0);

    char not_tmpfs[] = "/tmp/pjs-test-wstore-XXXXXX";
    assert_non_null(mkdtemp(not_tmpfs));
    o.dir = not_tmpfs;
    int rc = pjs_wstore_open(&o, &s, &err);
    if (rc == 0) /* /tmp is a tmpfs on this machine: nothing to check */
        pjs_wstore_close(s);
    else
        assert_non_null(strstr(err.msg, "not on a tmpfs"));
    rmdir(not_tmpfs);

    pjs_wstore_options bad_group = {.dir = dir, .group = "no-such-group-pjserve"};
    assert_int_equal(pjs_wstore_open(&bad_group, &s, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "no such group"));

    /* A symbolic link to a good directory: refused, not followed. */
    char link[300];
    snprintf(link, sizeof link, "%s-link", dir);
    assert_int_equal(symlink(dir, link), 0);
    o.dir = link;
    assert_int_equal(pjs_wstore_open(&o, &s, &err), PJS_ERR_PERMISSION_DENIED);
    assert_non_null(strstr(err.msg, "a symbolic link, which is not followed"));
    unlink(link);
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0);
    assert_int_equal(st.st_nlink, 2); /* nothing made inside */

    /* Another user's directory (only root can make one here). */
    if (geteuid() == 0) {
        assert_int_equal(chown(dir, 65534, 65534), 0);
        o.dir = dir;
        assert_int_equal(pjs_wstore_open(&o, &s, &err), PJS_ERR_PERMISSION_DENIED);
        assert_non_null(strstr(err.msg, "owned by uid 65534"));
        assert_non_null(strstr(err.msg, "--shared-weights auto"));
    }
}

static void test_private_directory_made_and_removed(void **state)
{
    (void)state;
    char a[sizeof dir], b[sizeof dir];
    pjs_error err = {0};
    assert_int_equal(pjs_wstore_dir_make_private("/dev/shm", a, sizeof a, &err), 0);
    assert_int_equal(pjs_wstore_dir_make_private("/dev/shm", b, sizeof b, &err), 0);
    assert_string_not_equal(a, b);
    assert_int_equal(strncmp(a, "/dev/shm/pjserve-weights-", 25), 0);
    assert_int_equal(strlen(a), 25 + 6);
    struct stat st;
    assert_int_equal(lstat(a, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0700);
    /* Used as a store, then removed with what is left in it. */
    snprintf(dir, sizeof dir, "%s", a);
    pjs_wstore *s = open_store(NULL);
    pjs_wstore_segment *seg = acquire(s);
    pjs_wstore_release(s, seg);
    pjs_wstore_close(s);
    pjs_wstore_dir_remove(a);
    pjs_wstore_dir_remove(b);
    assert_int_not_equal(lstat(a, &st), 0);
    assert_int_not_equal(lstat(b, &st), 0);
    assert_int_equal(pjs_wstore_dir_make_private("/no/such/place", a, sizeof a, &err),
                     PJS_ERR_UNAVAILABLE);
    assert_non_null(strstr(err.msg, "name a DIR on a tmpfs"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_header_round_trip_and_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_follows_content, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_then_attach_then_removed_with_the_last,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fill_error_returned_and_nothing_left, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_changed_bundle_gets_a_new_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_bytes_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_size_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_header_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_segment_of_a_dead_holder_is_reclaimed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stale_temporary_of_a_dead_creator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_racing_creators_make_one_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_refuses_unsafe_directories, setup, teardown),
        cmocka_unit_test_setup_teardown(test_private_directory_made_and_removed, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
