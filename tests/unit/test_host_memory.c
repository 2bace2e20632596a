/*
 * test_host_memory.c - host memory of the transfer path on the CPU plugin.
 *
 * The CPU plugin maps no host memory for DMA, so every test here runs the
 * fallback: pjs_rt_host_pin says UNSUPPORTED, pjs_rt_host_alloc hands out
 * pageable memory and the client reports "pageable"; and weights copied to
 * the device from such memory come back unchanged, from a block holding
 * several weights at the offsets a model's host floor gives them; a freed
 * block is reused, zeroed, by the next allocation of its size.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"

static pjs_rt_client *client;

static int setup(void **state)
{
    (void)state;
    pjs_error err;
    if (pjs_rt_client_open(NULL, NULL, 0, &client, &err) != 0) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pjs_rt_client_destroy(client);
    return 0;
}

static void test_cpu_plugin_maps_no_host_memory(void **state)
{
    (void)state;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    pjs_rt_host_memory m;
    pjs_error err;
    assert_int_equal(pjs_rt_host_alloc(client, page, &m, &err), 0);
    pjs_error pin_err;
    assert_int_equal(pjs_rt_host_pin(client, m.data, m.size, &pin_err), PJS_ERR_UNSUPPORTED);
    assert_non_null(strstr(pin_err.msg, "page-locking host memory"));
    pjs_rt_host_free(client, &m);
}

static void test_allocation_falls_back_to_pageable_memory(void **state)
{
    (void)state;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    pjs_rt_host_memory m;
    pjs_error err;
    assert_int_equal(pjs_rt_host_alloc(client, page + 1, &m, &err), 0);
    assert_non_null(m.data);
    assert_false(m.pinned);
    assert_int_equal(m.size, 2 * page);
    assert_int_equal((uintptr_t)m.data % page, 0);
    const unsigned char *bytes = m.data;
    for (size_t i = 0; i < m.size; i++)
        assert_int_equal(bytes[i], 0);
    memset(m.data, 0xab, m.size);
    assert_string_equal(pjs_rt_client_host_memory(client), "pageable");
    pjs_rt_host_free(client, &m);
    assert_null(m.data);
    assert_int_equal(m.size, 0);
    pjs_rt_host_free(client, &m); /* a freed (zeroed) block is a no-op */
}

static void test_empty_allocation_holds_nothing(void **state)
{
    (void)state;
    pjs_rt_host_memory m;
    pjs_error err;
    assert_int_equal(pjs_rt_host_alloc(client, 0, &m, &err), 0);
    assert_null(m.data);
    assert_int_equal(m.size, 0);
    assert_false(m.pinned);
    pjs_rt_host_free(client, &m);
}

/* A freed block is handed to the next allocation of its size, zero-filled
 * like a fresh one; one of another size is not. */
static void test_freed_block_is_reused_zeroed(void **state)
{
    (void)state;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    pjs_rt_host_memory a, b, c;
    pjs_error err;
    assert_int_equal(pjs_rt_host_alloc(client, 3 * page, &a, &err), 0);
    memset(a.data, 0x5a, a.size);
    void *where = a.data;
    pjs_rt_host_free(client, &a);
    assert_null(a.data);
    assert_int_equal(pjs_rt_host_alloc(client, 5 * page, &c, &err), 0);
    assert_ptr_not_equal(c.data, where);
    assert_int_equal(pjs_rt_host_alloc(client, 3 * page - 7, &b, &err), 0);
    assert_ptr_equal(b.data, where);
    assert_int_equal(b.size, 3 * page);
    const unsigned char *bytes = b.data;
    for (size_t i = 0; i < b.size; i++)
        assert_int_equal(bytes[i], 0);
    pjs_rt_host_free(client, &b);
    pjs_rt_host_free(client, &c);
}

/* Two weights in one block at 64-byte strides, as a model's floor lays them
 * out, each copied to the device and back. */
static void test_weights_load_from_a_fallback_block(void **state)
{
    (void)state;
    enum { N_W = 24, N_B = 5 };
    size_t stride_w = (N_W * sizeof(float) + 63) / 64 * 64;
    pjs_rt_host_memory m;
    pjs_error err;
    assert_int_equal(pjs_rt_host_alloc(client, stride_w + N_B * sizeof(int64_t), &m, &err), 0);
    float *w = m.data;
    int64_t *b = (int64_t *)((char *)m.data + stride_w);
    for (int i = 0; i < N_W; i++)
        w[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < N_B; i++)
        b[i] = (int64_t)i * 1000000007LL;

    pjs_shape shape_w = {.rank = 2, .dims = {4, 6}};
    pjs_shape shape_b = {.rank = 1, .dims = {N_B}};
    pjrt_buffer *dw = NULL, *db = NULL;
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &shape_w, NULL, w, &dw, &err), 0);
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_I64, &shape_b, NULL, b, &db, &err), 0);

    float back_w[N_W];
    int64_t back_b[N_B];
    assert_int_equal(pjs_rt_buffer_to_host(client, dw, back_w, sizeof back_w, &err), 0);
    assert_int_equal(pjs_rt_buffer_to_host(client, db, back_b, sizeof back_b, &err), 0);
    assert_memory_equal(back_w, w, sizeof back_w);
    assert_memory_equal(back_b, b, sizeof back_b);

    pjs_rt_buffer_destroy(client, dw);
    pjs_rt_buffer_destroy(client, db);
    pjs_rt_host_free(client, &m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_plugin_maps_no_host_memory),
        cmocka_unit_test(test_allocation_falls_back_to_pageable_memory),
        cmocka_unit_test(test_empty_allocation_holds_nothing),
        cmocka_unit_test(test_freed_block_is_reused_zeroed),
        cmocka_unit_test(test_weights_load_from_a_fallback_block),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
