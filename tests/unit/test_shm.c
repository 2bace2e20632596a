/*
 * test_shm.c - unit tests of the client shared-memory registry
 * (src/core/shm.c) against real POSIX shared-memory objects.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/shm.h"

#define OBJECT_SIZE 8192

static char key[64];

/* A fresh shared-memory object of OBJECT_SIZE bytes holding 0, 1, 2, ... */
static int setup(void **state)
{
    (void)state;
    snprintf(key, sizeof key, "/pjs_test_shm_%d", (int)getpid());
    int fd = shm_open(key, O_CREAT | O_RDWR | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, OBJECT_SIZE) != 0)
        return -1;
    unsigned char *p = mmap(NULL, OBJECT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return -1;
    for (int i = 0; i < OBJECT_SIZE; i++)
        p[i] = (unsigned char)i;
    munmap(p, OBJECT_SIZE);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    shm_unlink(key);
    return 0;
}

static pjs_shm_registry *registry(bool allowed)
{
    pjs_shm_registry *r = NULL;
    pjs_error err;
    assert_int_equal(pjs_shm_registry_create(allowed, &r, &err), 0);
    return r;
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
    pjs_shm_view v;
    assert_int_equal(pjs_shm_view_get(r, "in", 10, 20, &v, &err), 0);
    assert_int_equal(v.size, 20);
    assert_int_equal(v.data[0], (unsigned char)(4100 + 10));
    pjs_shm_info info[4];
    assert_int_equal(pjs_shm_status(r, NULL, info, 4, &err), 1);
    assert_string_equal(info[0].name, "in");
    assert_string_equal(info[0].key, key);
    assert_int_equal(info[0].offset, 4100);
    assert_int_equal(info[0].byte_size, 1000);
    /* Unregistering keeps the view's mapping valid until it is released. */
    assert_int_equal(pjs_shm_unregister(r, "in", &err), 0);
    assert_int_equal(v.data[19], (unsigned char)(4100 + 29));
    pjs_shm_view_release(&v);
    assert_int_equal(pjs_shm_status(r, NULL, info, 4, &err), 0);
    assert_int_equal(pjs_shm_view_get(r, "in", 0, 1, &v, &err), PJS_ERR_NOT_FOUND);
    pjs_shm_registry_destroy(r);
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
    pjs_shm_registry_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_when_not_allowed),
        cmocka_unit_test(test_register_view_unregister),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_bad_names_and_keys),
        cmocka_unit_test(test_unregister_all),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
