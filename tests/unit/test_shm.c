/*
 * test_shm.c - unit tests of the client shared-memory registry
 * (src/core/shm.c) against real POSIX shared-memory objects: registration,
 * views, copies in and out, objects that shrink under the registry, the
 * limits, and one descriptor per object.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/shm.h"

#define OBJECT_SIZE 8192

static char key[64];

/* Creates (again) the object `k` with OBJECT_SIZE bytes holding 0, 1, 2, ... */
static int make_object(const char *k)
{
    int fd = shm_open(k, O_CREAT | O_RDWR | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, OBJECT_SIZE) != 0)
        return -1;
    unsigned char bytes[OBJECT_SIZE];
    for (int i = 0; i < OBJECT_SIZE; i++)
        bytes[i] = (unsigned char)i;
    int rc = pwrite(fd, bytes, sizeof bytes, 0) == (ssize_t)sizeof bytes ? 0 : -1;
    close(fd);
    return rc;
}

static int setup(void **state)
{
    (void)state;
    snprintf(key, sizeof key, "/pjs_test_shm_%d", (int)getpid());
    return make_object(key);
}

static int teardown(void **state)
{
    (void)state;
    shm_unlink(key);
    return 0;
}

static pjs_shm_registry *registry_with(const pjs_shm_options *o)
{
    pjs_shm_registry *r = NULL;
    pjs_error err;
    assert_int_equal(pjs_shm_registry_create(o, &r, &err), 0);
    return r;
}

static pjs_shm_registry *registry(bool allowed)
{
    pjs_shm_options o = {.allowed = allowed};
    return registry_with(&o);
}

/* The size of `k` now. */
static long long object_size(const char *k)
{
    int fd = shm_open(k, O_RDONLY, 0);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    close(fd);
    return (long long)st.st_size;
}

static void truncate_object(const char *k, off_t size)
{
    int fd = shm_open(k, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, size), 0);
    close(fd);
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static void test_refused_when_not_allowed(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry(false);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "in", key, 0, 64, &err), PJS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "--allow-client-shm"));
    pjs_shm_registry_destroy(r);
}

static void test_register_view_unregister(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry(true);
    pjs_error err;
    /* An offset that is not page aligned. */
    assert_int_equal(pjs_shm_register(r, "in", key, 4100, 1000, &err), 0);
    pjs_shm_view v, late;
    assert_int_equal(pjs_shm_view_get(r, "in", 10, 20, &v, &err), 0);
    assert_int_equal(pjs_shm_view_get(r, "in", 30, 5, &late, &err), 0);
    assert_int_equal(v.size, 20);
    assert_null(v.data);
    assert_int_equal(pjs_shm_view_read(&v, &err), 0);
    assert_int_equal(v.data[0], (unsigned char)(4100 + 10));
    assert_int_equal(v.data[19], (unsigned char)(4100 + 29));
    pjs_shm_info info[4];
    assert_int_equal(pjs_shm_status(r, NULL, info, 4, &err), 1);
    assert_string_equal(info[0].name, "in");
    assert_string_equal(info[0].key, key);
    assert_int_equal(info[0].offset, 4100);
    assert_int_equal(info[0].byte_size, 1000);
    /* Unregistering keeps the views' region and descriptor until released. */
    assert_int_equal(pjs_shm_unregister(r, "in", &err), 0);
    assert_int_equal(pjs_shm_open_objects(r), 0);
    assert_int_equal(pjs_shm_view_read(&late, &err), 0);
    assert_int_equal(late.data[0], (unsigned char)(4100 + 30));
    unsigned char out[3] = {0xaa, 0xbb, 0xcc};
    assert_int_equal(pjs_shm_view_write(&late, out, sizeof out, &err), 0);
    pjs_shm_view_release(&v);
    pjs_shm_view_release(&late);
    assert_null(late.region);
    int fd = shm_open(key, O_RDONLY, 0);
    unsigned char back[3];
    assert_int_equal(pread(fd, back, sizeof back, 4130), 3);
    close(fd);
    assert_memory_equal(back, out, sizeof out);
    assert_int_equal(pjs_shm_status(r, NULL, info, 4, &err), 0);
    assert_int_equal(pjs_shm_view_get(r, "in", 0, 1, &v, &err), PJS_ERR_NOT_FOUND);
    pjs_shm_registry_destroy(r);
    assert_int_equal(make_object(key), 0);
}

static void test_bounds(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry(true);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "big", key, 0, OBJECT_SIZE + 1, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "outside"));
    assert_int_equal(pjs_shm_register(r, "far", key, UINT64_MAX, 2, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_register(r, "zero", key, 0, 0, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_open_objects(r), 0); /* refusals keep no descriptor */
    assert_int_equal(pjs_shm_register(r, "in", key, 0, 100, &err), 0);
    pjs_shm_view v;
    assert_int_equal(pjs_shm_view_get(r, "in", 0, 100, &v, &err), 0);
    pjs_shm_view_release(&v);
    assert_int_equal(pjs_shm_view_get(r, "in", 1, 100, &v, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_view_get(r, "in", UINT64_MAX, 2, &v, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_view_get(r, "in", 50, UINT64_MAX, &v, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_null(v.region);
    pjs_shm_registry_destroy(r);
}

static void test_bad_names_and_keys(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry(true);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "", key, 0, 8, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_register(r, "x", "/a/b", 0, 8, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_register(r, "x", "/pjs_no_such_object", 0, 8, &err),
                     PJS_ERR_NOT_FOUND);
    assert_int_equal(pjs_shm_register(r, "x", key, 0, 8, &err), 0);
    assert_int_equal(pjs_shm_register(r, "x", key, 0, 8, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "already registered"));
    assert_int_equal(pjs_shm_unregister(r, "y", &err), PJS_ERR_NOT_FOUND);
    pjs_shm_info info;
    assert_int_equal(pjs_shm_status(r, "y", &info, 1, &err), PJS_ERR_NOT_FOUND);
    /* A FIFO under /dev/shm opens, but it is not a shared-memory object. */
    char fifo[96], fifo_key[64];
    snprintf(fifo_key, sizeof fifo_key, "/pjs_test_fifo_%d", (int)getpid());
    snprintf(fifo, sizeof fifo, "/dev/shm%s", fifo_key);
    if (mkfifo(fifo, 0600) == 0) {
        assert_int_equal(pjs_shm_register(r, "f", fifo_key, 0, 8, &err),
                         PJS_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, "not a shared memory object"));
        unlink(fifo);
    }
    pjs_shm_registry_destroy(r);
}

static void test_unregister_all(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry(true);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "a", key, 0, 8, &err), 0);
    assert_int_equal(pjs_shm_register(r, "b", key, 8, 8, &err), 0);
    pjs_shm_info info[1];
    assert_int_equal(pjs_shm_status(r, "", info, 1, &err), 2); /* count beyond cap */
    assert_int_equal(pjs_shm_unregister(r, NULL, &err), 0);
    assert_int_equal(pjs_shm_status(r, NULL, info, 1, &err), 0);
    assert_int_equal(pjs_shm_open_objects(r), 0);
    pjs_shm_registry_destroy(r);
}

/* The client truncates its object after registering: reads and writes of
 * the region fail with an error naming it, and nothing grows the object. */
static void test_truncated_after_register(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry(true);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "in", key, 4096, 4096, &err), 0);
    assert_int_equal(pjs_shm_register(r, "head", key, 0, 64, &err), 0);
    pjs_shm_view in, out, head;
    assert_int_equal(pjs_shm_view_get(r, "in", 0, 4096, &in, &err), 0);
    assert_int_equal(pjs_shm_view_get(r, "in", 2048, 64, &out, &err), 0);
    truncate_object(key, 4096 + 1000); /* a part of the region is left */

    assert_int_equal(pjs_shm_view_read(&in, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "shared memory region \"in\" shrank"));
    assert_non_null(strstr(err.msg, "now holds 5096 bytes"));
    assert_null(in.data);
    unsigned char bytes[64] = {1};
    assert_int_equal(pjs_shm_view_write(&out, bytes, sizeof bytes, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "shrank"));
    assert_int_equal(object_size(key), 4096 + 1000); /* not grown back */

    truncate_object(key, 0); /* none of it is left */
    assert_int_equal(pjs_shm_view_read(&in, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_view_write(&out, bytes, 1, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(object_size(key), 0);
    assert_int_equal(pjs_shm_view_get(r, "head", 0, 64, &head, &err), 0);
    assert_int_equal(pjs_shm_view_read(&head, &err), PJS_ERR_INVALID_ARGUMENT);
    pjs_shm_view_release(&head);

    /* Grown again, the same registration serves again. */
    assert_int_equal(make_object(key), 0);
    assert_int_equal(pjs_shm_view_read(&in, &err), 0);
    assert_int_equal(in.data[1], 1);
    assert_int_equal(pjs_shm_view_write(&out, bytes, sizeof bytes, &err), 0);
    pjs_shm_view_release(&in);
    pjs_shm_view_release(&out);
    pjs_shm_registry_destroy(r);
    assert_int_equal(make_object(key), 0);
}

/* The client removes its object's name: the descriptor keeps the object. */
static void test_unlinked_after_register(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry(true);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "in", key, 0, 16, &err), 0);
    shm_unlink(key);
    pjs_shm_view v;
    assert_int_equal(pjs_shm_view_get(r, "in", 0, 16, &v, &err), 0);
    assert_int_equal(pjs_shm_view_read(&v, &err), 0);
    assert_int_equal(v.data[15], 15);
    pjs_shm_view_release(&v);
    /* A new object under the same key is a new object, not the old one. */
    assert_int_equal(make_object(key), 0);
    assert_int_equal(pjs_shm_register(r, "again", key, 0, 16, &err), 0);
    assert_int_equal(pjs_shm_open_objects(r), 2);
    pjs_shm_registry_destroy(r);
}

static void test_region_limits(void **state)
{
    (void)state;
    pjs_shm_options o = {.allowed = true, .max_regions = 3, .max_bytes = 100};
    pjs_shm_registry *r = registry_with(&o);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "a", key, 0, 60, &err), 0);
    assert_int_equal(pjs_shm_register(r, "b", key, 0, 50, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "--max-shm-bytes"));
    assert_int_equal(pjs_shm_register(r, "b", key, 0, 40, &err), 0); /* exactly the limit */
    assert_int_equal(pjs_shm_register(r, "c", key, 0, 1, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_int_equal(pjs_shm_unregister(r, "a", &err), 0);
    assert_int_equal(pjs_shm_register(r, "c", key, 0, 1, &err), 0);
    assert_int_equal(pjs_shm_register(r, "d", key, 0, 1, &err), 0);
    assert_int_equal(pjs_shm_register(r, "e", key, 0, 1, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "--max-shm-regions"));
    /* A refused duplicate is a duplicate, whatever the count. */
    assert_int_equal(pjs_shm_register(r, "d", key, 0, 1, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_unregister(r, NULL, &err), 0);
    assert_int_equal(pjs_shm_register(r, "a", key, 0, 100, &err), 0);
    pjs_shm_registry_destroy(r);

    /* The defaults. */
    r = registry(true);
    char name[32];
    int n = 0;
    for (; n < 2000; n++) {
        snprintf(name, sizeof name, "r%d", n);
        if (pjs_shm_register(r, name, key, 0, 8, &err) != 0)
            break;
    }
    assert_int_equal(n, PJS_SHM_DEFAULT_MAX_REGIONS);
    assert_int_equal(err.code, PJS_ERR_RESOURCE_EXHAUSTED);
    pjs_shm_registry_destroy(r);
}

/* However many regions lie in one object, one descriptor is held. */
static void test_one_descriptor_per_object(void **state)
{
    (void)state;
    char other[80];
    snprintf(other, sizeof other, "%s_other", key);
    assert_int_equal(make_object(other), 0);
    int before = open_fds();
    pjs_shm_registry *r = registry(true);
    pjs_error err;
    char name[32];
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof name, "r%d", i);
        assert_int_equal(pjs_shm_register(r, name, key, (uint64_t)i * 8, 8, &err), 0);
    }
    assert_int_equal(pjs_shm_open_objects(r), 1);
    assert_int_equal(open_fds(), before + 1);
    assert_int_equal(pjs_shm_register(r, "other", other, 0, 8, &err), 0);
    assert_int_equal(pjs_shm_open_objects(r), 2);
    assert_int_equal(open_fds(), before + 2);
    /* The descriptor goes with the last region over the object, and stays
     * while a view holds that region. */
    pjs_shm_view v;
    assert_int_equal(pjs_shm_view_get(r, "other", 0, 8, &v, &err), 0);
    assert_int_equal(pjs_shm_unregister(r, "other", &err), 0);
    assert_int_equal(pjs_shm_open_objects(r), 1);
    assert_int_equal(open_fds(), before + 2);
    pjs_shm_view_release(&v);
    assert_int_equal(open_fds(), before + 1);
    assert_int_equal(pjs_shm_unregister(r, "r0", &err), 0);
    assert_int_equal(open_fds(), before + 1);
    assert_int_equal(pjs_shm_unregister(r, NULL, &err), 0);
    assert_int_equal(open_fds(), before);
    pjs_shm_registry_destroy(r);
    shm_unlink(other);
}

/* Bytes read into requests come out of the request byte budget. */
static void test_read_takes_from_budget(void **state)
{
    (void)state;
    pjs_byte_budget budget;
    pjs_byte_budget_init(&budget, 100);
    pjs_shm_options o = {.allowed = true, .budget = &budget};
    pjs_shm_registry *r = registry_with(&o);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "in", key, 0, 256, &err), 0);
    pjs_shm_view a, b;
    assert_int_equal(pjs_shm_view_get(r, "in", 0, 64, &a, &err), 0);
    assert_int_equal(pjs_shm_view_get(r, "in", 64, 64, &b, &err), 0);
    assert_int_equal(pjs_shm_view_read(&a, &err), 0);
    assert_int_equal(pjs_byte_budget_used(&budget), 64);
    assert_int_equal(pjs_shm_view_read(&b, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "--max-inflight-request-bytes"));
    assert_int_equal(pjs_byte_budget_used(&budget), 64);
    pjs_shm_view_release(&a);
    assert_int_equal(pjs_byte_budget_used(&budget), 0);
    assert_int_equal(pjs_shm_view_read(&b, &err), 0);
    assert_int_equal(b.data[0], 64);
    /* A failed read gives its bytes back. */
    truncate_object(key, 10);
    pjs_shm_view c;
    assert_int_equal(pjs_shm_view_get(r, "in", 0, 32, &c, &err), 0);
    assert_int_equal(pjs_shm_view_read(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_byte_budget_used(&budget), 64);
    pjs_shm_view_release(&c);
    pjs_shm_view_release(&b);
    assert_int_equal(pjs_byte_budget_used(&budget), 0);
    pjs_shm_registry_destroy(r);
    assert_int_equal(make_object(key), 0);
}

/* Requests writing one output window at once while its region is
 * unregistered and registered again: the copies go through the kernel, so
 * the sanitizer builds see no race (tests/tsan.supp names none). */
typedef struct writer {
    pjs_shm_registry *r;
    unsigned char fill;
    int failures;
} writer;

static void *write_loop(void *arg)
{
    writer *w = arg;
    unsigned char bytes[256];
    memset(bytes, w->fill, sizeof bytes);
    for (int i = 0; i < 300; i++) {
        pjs_shm_view v;
        pjs_error err;
        if (pjs_shm_view_get(w->r, "out", 0, sizeof bytes, &v, &err) != 0)
            continue; /* between unregister and register */
        if (pjs_shm_view_write(&v, bytes, sizeof bytes, &err) != 0 ||
            pjs_shm_view_read(&v, &err) != 0)
            w->failures++;
        pjs_shm_view_release(&v);
    }
    return NULL;
}

static void test_concurrent_writes(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry(true);
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "out", key, 0, 256, &err), 0);
    writer w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (writer){.r = r, .fill = (unsigned char)(i + 1)};
        assert_int_equal(pthread_create(&t[i], NULL, write_loop, &w[i]), 0);
    }
    for (int i = 0; i < 100; i++) {
        pjs_shm_unregister(r, "out", &err);
        assert_int_equal(pjs_shm_register(r, "out", key, 0, 256, &err), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(w[i].failures, 0);
    }
    pjs_shm_registry_destroy(r);
    assert_int_equal(make_object(key), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_when_not_allowed),
        cmocka_unit_test(test_register_view_unregister),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_bad_names_and_keys),
        cmocka_unit_test(test_unregister_all),
        cmocka_unit_test(test_truncated_after_register),
        cmocka_unit_test(test_unlinked_after_register),
        cmocka_unit_test(test_region_limits),
        cmocka_unit_test(test_one_descriptor_per_object),
        cmocka_unit_test(test_read_takes_from_budget),
        cmocka_unit_test(test_concurrent_writes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
