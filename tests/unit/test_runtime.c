/*
 * test_runtime.c - the PJRT runtime against the real CPU plugin.
 *
 * Loads the xla-cpu-pjrt plugin from the project's .venv, compiles small
 * StableHLO text modules, checks the signature read back from the compiler,
 * runs them and compares values, with either way of waiting for events
 * (Await, OnReady callbacks); and checks that plugin, compile and transfer
 * errors come back as pjs_errors carrying the plugin's message.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec_cache.h"
#include "runtime/runtime.h"

/* w (2x3 f32, a weight) + x (2x3 f32); also returns the i32 scalar 7 and a
 * bf16 copy of x. */
static const char add_module[] =
    "module @add {\n"
    "  func.func public @main(%w: tensor<2x3xf32>, %x: tensor<2x3xf32>)\n"
    "      -> (tensor<2x3xf32>, tensor<i32>, tensor<2x3xbf16>) {\n"
    "    %0 = stablehlo.add %w, %x : tensor<2x3xf32>\n"
    "    %c = stablehlo.constant dense<7> : tensor<i32>\n"
    "    %b = stablehlo.convert %x : (tensor<2x3xf32>) -> tensor<2x3xbf16>\n"
    "    return %0, %c, %b : tensor<2x3xf32>, tensor<i32>, tensor<2x3xbf16>\n"
    "  }\n"
    "}\n";

/* One result only: a non-tuple program shape. */
static const char neg_module[] =
    "module @neg {\n"
    "  func.func public @main(%x: tensor<4xi64>) -> tensor<4xi64> {\n"
    "    %0 = stablehlo.negate %x : tensor<4xi64>\n"
    "    return %0 : tensor<4xi64>\n"
    "  }\n"
    "}\n";

static pjs_rt_client *client;

static int setup(void **state)
{
    (void)state;
    char path[4096];
    pjs_error err;
    pjs_rt_plugin *p;
    if (pjs_rt_plugin_resolve(NULL, path, sizeof path, &err) != 0 ||
        pjs_rt_plugin_load(path, &p, &err) != 0 ||
        pjs_rt_client_create(p, NULL, 0, &client, &err) != 0) {
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

static void test_plugin_info(void **state)
{
    (void)state;
    const pjs_rt_plugin_info *info = pjs_rt_plugin_get_info(pjs_rt_client_plugin(client));
    assert_int_equal(info->api_major, 0);
    assert_true(info->api_minor >= PJS_RT_MIN_API_MINOR);
    assert_true(info->stablehlo_current[0] >= 1);
    assert_true(info->stablehlo_minimum[0] >= 0);
    assert_string_equal(pjs_rt_client_platform(client), "cpu");
    assert_true(pjs_rt_client_device_count(client) >= 1);
    char desc[256];
    pjs_rt_client_describe_device(client, 0, desc, sizeof desc);
    assert_non_null(strstr(desc, "cpu"));
}

static void test_loading_the_same_plugin_twice_returns_it(void **state)
{
    (void)state;
    pjs_rt_plugin *again;
    pjs_error err;
    pjs_rt_plugin *first = pjs_rt_client_plugin(client);
    assert_int_equal(pjs_rt_plugin_load(pjs_rt_plugin_get_info(first)->path, &again, &err), 0);
    assert_ptr_equal(again, first);
}

static void test_plugin_errors(void **state)
{
    (void)state;
    pjs_rt_plugin *p;
    pjs_error err;
    assert_int_equal(pjs_rt_plugin_load("/nonexistent/plugin.so", &p, &err), PJS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "/nonexistent/plugin.so"));
    /* A shared library that is not a PJRT plugin. */
    assert_int_equal(pjs_rt_plugin_load("/lib/x86_64-linux-gnu/libm.so.6", &p, &err),
                     PJS_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "GetPjrtApi"));
    /* A file that is not a shared library at all. */
    assert_int_equal(pjs_rt_plugin_load("/etc/hostname", &p, &err), PJS_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "cannot load PJRT plugin"));
}

static void test_plugin_resolve_prefers_explicit_then_env(void **state)
{
    (void)state;
    char out[256];
    pjs_error err;
    assert_int_equal(pjs_rt_plugin_resolve("/x/explicit.so", out, sizeof out, &err), 0);
    assert_string_equal(out, "/x/explicit.so");
    setenv("PJSERVE_PJRT_PLUGIN", "/x/env.so", 1);
    assert_int_equal(pjs_rt_plugin_resolve(NULL, out, sizeof out, &err), 0);
    assert_string_equal(out, "/x/env.so");
    unsetenv("PJSERVE_PJRT_PLUGIN");
}

static void test_compile_reads_signature(void **state)
{
    (void)state;
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, add_module, strlen(add_module), NULL, "add", &e, &err), 0);
    assert_false(e->from_cache);
    assert_int_equal(e->n_params, 2);
    assert_int_equal(e->params[0].dtype, PJS_DTYPE_F32);
    assert_int_equal(e->params[0].shape.rank, 2);
    assert_int_equal(e->params[0].shape.dims[0], 2);
    assert_int_equal(e->params[0].shape.dims[1], 3);
    assert_int_equal(e->n_results, 3);
    assert_int_equal(e->results[0].dtype, PJS_DTYPE_F32);
    assert_int_equal(e->results[1].dtype, PJS_DTYPE_I32);
    assert_int_equal(e->results[1].shape.rank, 0);
    assert_int_equal(e->results[2].dtype, PJS_DTYPE_BF16);
    pjs_rt_executable_destroy(e);

    assert_int_equal(pjs_rt_compile(client, neg_module, strlen(neg_module), NULL, "neg", &e, &err), 0);
    assert_int_equal(e->n_params, 1);
    assert_int_equal(e->params[0].dtype, PJS_DTYPE_I64);
    assert_int_equal(e->n_results, 1);
    assert_int_equal(e->results[0].shape.dims[0], 4);
    pjs_rt_executable_destroy(e);
}

/* Compiles of one module share one loaded executable until the last holder
 * lets go; another module gets its own. */
static void test_identical_modules_share_one_executable(void **state)
{
    (void)state;
    pjs_rt_executable *a, *b, *c, *other;
    bool shared = true;
    pjs_error err;
    assert_int_equal(pjs_rt_compile_shared(client, add_module, strlen(add_module), NULL, "add",
                                           &a, &shared, &err),
                     0);
    assert_false(shared);
    assert_int_equal(pjs_rt_compile_shared(client, add_module, strlen(add_module), NULL, "add2",
                                           &b, &shared, &err),
                     0);
    assert_true(shared);
    assert_ptr_equal(a, b);
    assert_int_equal(pjs_rt_compile_shared(client, neg_module, strlen(neg_module), NULL, "neg",
                                           &other, &shared, &err),
                     0);
    assert_false(shared);
    assert_ptr_not_equal(other, a);
    /* one holder goes; the other still executes with it */
    pjs_rt_executable_destroy(a);
    float w[6] = {1, 2, 3, 4, 5, 6}, x[6] = {1, 1, 1, 1, 1, 1}, sum[6];
    pjrt_buffer *args[2], *out[3];
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &b->params[0].shape,
                                             &b->params[0], w, &args[0], &err),
                     0);
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &b->params[1].shape,
                                             &b->params[1], x, &args[1], &err),
                     0);
    assert_int_equal(pjs_rt_execute(b, args, out, &err), 0);
    assert_int_equal(pjs_rt_buffer_to_host(client, out[0], sum, sizeof sum, &err), 0);
    for (int i = 0; i < 6; i++)
        assert_true(sum[i] == w[i] + 1);
    for (int i = 0; i < 3; i++)
        pjs_rt_buffer_destroy(client, out[i]);
    for (int i = 0; i < 2; i++)
        pjs_rt_buffer_destroy(client, args[i]);
    pjs_rt_executable_destroy(b);
    /* the last holder went: the next compile loads it afresh */
    assert_int_equal(pjs_rt_compile_shared(client, add_module, strlen(add_module), NULL, "add",
                                           &c, &shared, &err),
                     0);
    assert_false(shared);
    pjs_rt_executable_destroy(c);
    pjs_rt_executable_destroy(other);
}

static void test_execute_values(void **state)
{
    (void)state;
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, add_module, strlen(add_module), NULL, "add", &e, &err), 0);
    float w[6] = {1, 2, 3, 4, 5, 6}, x[6] = {0.5f, -1, 10, 20, 30, 1e6f}, sum[6];
    int32_t seven = 0;
    uint16_t xb[6];
    pjrt_buffer *args[2], *out[3];
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &e->params[0].shape, &e->params[0], w, &args[0], &err), 0);
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &e->params[1].shape, &e->params[1], x, &args[1], &err), 0);
    assert_int_equal(pjs_rt_execute(e, args, out, &err), 0);
    assert_int_equal(pjs_rt_buffer_to_host(client, out[0], sum, sizeof sum, &err), 0);
    assert_int_equal(pjs_rt_buffer_to_host(client, out[1], &seven, sizeof seven, &err), 0);
    assert_int_equal(pjs_rt_buffer_to_host(client, out[2], xb, sizeof xb, &err), 0);
    for (int i = 0; i < 6; i++)
        assert_true(sum[i] == w[i] + x[i]);
    assert_int_equal(seven, 7);
    assert_int_equal(xb[0], 0x3f00); /* 0.5 in bf16 */
    assert_int_equal(xb[1], 0xbf80); /* -1 */

    /* Reading back into a buffer of the wrong size is refused. */
    assert_int_equal(pjs_rt_buffer_to_host(client, out[0], sum, 8, &err), PJS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "24 bytes"));
    for (int i = 0; i < 3; i++)
        pjs_rt_buffer_destroy(client, out[i]);
    for (int i = 0; i < 2; i++)
        pjs_rt_buffer_destroy(client, args[i]);
    pjs_rt_executable_destroy(e);
}

static void test_execute_with_wrong_argument_shape_fails_cleanly(void **state)
{
    (void)state;
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, neg_module, strlen(neg_module), NULL, "neg", &e, &err), 0);
    int64_t v[5] = {1, 2, 3, 4, 5};
    pjs_shape wrong = {.rank = 1, .dims = {5}};
    pjrt_buffer *arg, *out[1];
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_I64, &wrong, NULL, v, &arg, &err), 0);
    assert_true(pjs_rt_execute(e, &arg, out, &err) < 0);
    assert_non_null(strstr(err.msg, "executing failed"));
    assert_null(out[0]);
    pjs_rt_buffer_destroy(client, arg);
    pjs_rt_executable_destroy(e);
}

/* pjs_rt_execute_read in both orders (copies after the execution, the CPU
 * plugin's default; copies queued before waiting, the device plugins'): the
 * same values, an output left out, and a wrong size refused with nothing
 * left behind. */
static void test_execute_read_in_both_orders(void **state)
{
    (void)state;
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, add_module, strlen(add_module), NULL, "add", &e, &err), 0);
    float w[6] = {1, 2, 3, 4, 5, 6}, x[6] = {0.5f, -1, 10, 20, 30, 1e6f};
    for (int round = 0; round < 4; round++) {
        int ahead = round % 2;
        pjs_rt_client_set_read_ahead(client, ahead);
        /* both ways of waiting: the plugin's Await and its OnReady callback */
        pjs_rt_set_wait_mode(round < 2 ? PJS_RT_WAIT_AWAIT : PJS_RT_WAIT_CALLBACK);
        pjrt_buffer *args[2], *out[3];
        assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &e->params[0].shape, &e->params[0], w, &args[0], &err), 0);
        assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &e->params[1].shape, &e->params[1], x, &args[1], &err), 0);
        float sum[6] = {0};
        uint16_t xb[6] = {0};
        void *dst[3] = {sum, NULL, xb};
        size_t sizes[3] = {sizeof sum, sizeof(int32_t), sizeof xb};
        pjs_rt_exec_times times = {.want_cpu = true};
        assert_int_equal(pjs_rt_execute_read(e, args, out, dst, sizes, &times, &err), 0);
        assert_true(times.executed_ns > 0);
        /* launching an execution takes some of this thread's CPU time */
        assert_true(times.launch_cpu_ns > 0);
        /* the CPU plugin's dense outputs are copied from the buffers' memory */
        assert_int_equal(pjs_rt_executable_read_path(e), PJS_RT_READ_IN_PLACE);
        /* the execution's time is kept for the next waits */
        assert_true(atomic_load(&e->usual_exec_ns) > 0);
        for (int i = 0; i < 6; i++)
            assert_true(sum[i] == w[i] + x[i]);
        assert_int_equal(xb[1], 0xbf80); /* -1 in bf16 */
        for (int i = 0; i < 3; i++)
            pjs_rt_buffer_destroy(client, out[i]);

        sizes[2] = 4; /* wrong: the bf16 output holds 12 bytes */
        assert_int_equal(pjs_rt_execute_read(e, args, out, dst, sizes, NULL, &err), PJS_ERR_INTERNAL);
        assert_non_null(strstr(err.msg, "12 bytes"));
        for (int i = 0; i < 3; i++)
            assert_null(out[i]);
        for (int i = 0; i < 2; i++)
            pjs_rt_buffer_destroy(client, args[i]);
    }
    pjs_rt_client_set_read_ahead(client, false);
    pjs_rt_set_wait_mode(PJS_RT_WAIT_AWAIT);
    pjs_rt_executable_destroy(e);
}

/* Arguments a module lays out in another order than row-major
 * (mhlo.layout_mode on a parameter) are read as the row-major values
 * uploaded: the result, row-major, equals them. */
static void test_arguments_in_other_layouts_are_read_row_major(void **state)
{
    (void)state;
    static const char module[] =
        "module @arg_layouts {\n"
        "  func.func public @main(%x: tensor<2x3xf32> {mhlo.layout_mode = \"{0,1}\"},\n"
        "                         %y: tensor<2x3x4xi32> {mhlo.layout_mode = \"{1,0,2}\"})\n"
        "      -> (tensor<2x3xf32>, tensor<2x3x4xi32>) {\n"
        "    %0 = stablehlo.negate %x : tensor<2x3xf32>\n"
        "    %1 = stablehlo.negate %y : tensor<2x3x4xi32>\n"
        "    return %0, %1 : tensor<2x3xf32>, tensor<2x3x4xi32>\n"
        "  }\n"
        "}\n";
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, module, strlen(module), NULL, "arg_layouts", &e, &err),
                     0);
    assert_true(e->params[0].other_layout);
    assert_int_equal(e->params[0].minor_to_major[0], 0);
    assert_true(e->params[1].other_layout);
    assert_false(e->results[0].other_layout);
    float x[6] = {1, 2, 3, 4, 5, 6};
    int32_t y[24];
    for (int i = 0; i < 24; i++)
        y[i] = i;
    pjrt_buffer *args[2];
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &e->params[0].shape,
                                             &e->params[0], x, &args[0], &err),
                     0);
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_I32, &e->params[1].shape,
                                             &e->params[1], y, &args[1], &err),
                     0);
    float a[6] = {0};
    int32_t c[24] = {0};
    void *dst[2] = {a, c};
    size_t sizes[2] = {sizeof a, sizeof c};
    pjrt_buffer *out[2];
    assert_int_equal(pjs_rt_execute_read(e, args, out, dst, sizes, NULL, &err), 0);
    for (int i = 0; i < 6; i++)
        assert_true(a[i] == -x[i]);
    for (int i = 0; i < 24; i++)
        assert_int_equal(c[i], -i);
    for (int i = 0; i < 2; i++) {
        pjs_rt_buffer_destroy(client, out[i]);
        pjs_rt_buffer_destroy(client, args[i]);
    }
    pjs_rt_executable_destroy(e);
}

/* Results a module lays out in another order than row-major
 * (mhlo.layout_mode: column-major, and a rank-3 permutation) come back
 * row-major, like the row-major one beside them, read in place on the CPU
 * plugin, in both read orders. */
static void test_results_in_other_layouts_come_back_row_major(void **state)
{
    (void)state;
    static const char module[] =
        "module @layouts {\n"
        "  func.func public @main(%x: tensor<2x3xf32>, %y: tensor<2x3x4xi32>)\n"
        "      -> (tensor<2x3xf32>, tensor<2x3xf32> {mhlo.layout_mode = \"{0,1}\"},\n"
        "          tensor<2x3x4xi32> {mhlo.layout_mode = \"{1,0,2}\"}) {\n"
        "    %0 = stablehlo.negate %x : tensor<2x3xf32>\n"
        "    %1 = stablehlo.negate %x : tensor<2x3xf32>\n"
        "    %2 = stablehlo.negate %y : tensor<2x3x4xi32>\n"
        "    return %0, %1, %2 : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3x4xi32>\n"
        "  }\n"
        "}\n";
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, module, strlen(module), NULL, "layouts", &e, &err), 0);
    assert_int_equal(pjs_rt_executable_read_path(e), PJS_RT_READ_UNDECIDED);
    float x[6] = {1, 2, 3, 4, 5, 6};
    int32_t y[24];
    for (int i = 0; i < 24; i++)
        y[i] = i;
    pjrt_buffer *args[2];
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &e->params[0].shape, &e->params[0], x, &args[0], &err), 0);
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_I32, &e->params[1].shape, &e->params[1], y, &args[1], &err), 0);
    for (int round = 0; round < 4; round++) {
        int ahead = round % 2;
        pjs_rt_client_set_read_ahead(client, ahead);
        /* both ways of waiting: the plugin's Await and its OnReady callback */
        pjs_rt_set_wait_mode(round < 2 ? PJS_RT_WAIT_AWAIT : PJS_RT_WAIT_CALLBACK);
        float a[6] = {0}, b[6] = {0};
        int32_t c[24] = {0};
        void *dst[3] = {a, b, c};
        size_t sizes[3] = {sizeof a, sizeof b, sizeof c};
        pjrt_buffer *out[3];
        assert_int_equal(pjs_rt_execute_read(e, args, out, dst, sizes, NULL, &err), 0);
        for (int i = 0; i < 6; i++) {
            assert_true(a[i] == -x[i]);
            assert_true(b[i] == -x[i]);
        }
        for (int i = 0; i < 24; i++)
            assert_int_equal(c[i], -i);
        for (int i = 0; i < 3; i++)
            pjs_rt_buffer_destroy(client, out[i]);
        assert_int_equal(pjs_rt_executable_read_path(e), PJS_RT_READ_IN_PLACE);
    }
    pjs_rt_client_set_read_ahead(client, false);
    for (int i = 0; i < 2; i++)
        pjs_rt_buffer_destroy(client, args[i]);
    pjs_rt_executable_destroy(e);
}

/* What the dispatcher uses for CUDA shared memory, on the CPU plugin, whose
 * device memory is host memory: an argument viewing memory executes on its
 * values in place, a result's device address holds its row-major bytes,
 * the row-major flag is known only once an execution read the outputs
 * (false for a result in another order), and the device's number is 0. */
static void test_device_views_and_addresses(void **state)
{
    (void)state;
    static const char module[] =
        "module @views {\n"
        "  func.func public @main(%x: tensor<2x3xf32>)\n"
        "      -> (tensor<2x3xf32>, tensor<2x3xf32> {mhlo.layout_mode = \"{0,1}\"}) {\n"
        "    %0 = stablehlo.negate %x : tensor<2x3xf32>\n"
        "    return %0, %0 : tensor<2x3xf32>, tensor<2x3xf32>\n"
        "  }\n"
        "}\n";
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, module, strlen(module), NULL, "views", &e, &err), 0);
    assert_int_equal(pjs_rt_client_hardware_id(client), 0);
    assert_false(pjs_rt_output_device_row_major(e, 0));
    _Alignas(256) float x[6] = {1, -2, 3, -4, 5, -6};
    pjrt_buffer *arg, *out[2];
    assert_int_equal(pjs_rt_buffer_view_device(client, PJS_DTYPE_F32, &e->params[0].shape,
                                               &e->params[0], (uint64_t)(uintptr_t)x, &arg, &err),
                     0);
    float a[6], b[6];
    void *dst[2] = {a, b};
    size_t sizes[2] = {sizeof a, sizeof b};
    assert_int_equal(pjs_rt_execute_read(e, &arg, out, dst, sizes, NULL, &err), 0);
    for (int i = 0; i < 6; i++)
        assert_true(a[i] == -x[i] && b[i] == -x[i]);
    assert_true(pjs_rt_output_device_row_major(e, 0));
    assert_false(pjs_rt_output_device_row_major(e, 1)); /* column-major there */
    assert_false(pjs_rt_output_device_row_major(e, 2)); /* no such output */
    uint64_t address = 0;
    assert_int_equal(pjs_rt_buffer_device_address(client, out[0], &address, &err), 0);
    assert_memory_equal((const void *)(uintptr_t)address, a, sizeof a);
    for (int i = 0; i < 2; i++)
        pjs_rt_buffer_destroy(client, out[i]);
    pjs_rt_buffer_destroy(client, arg);

    /* a parameter the module wants in another order is not viewed */
    pjs_rt_tensor_type other = e->params[0];
    other.other_layout = true;
    assert_int_equal(pjs_rt_buffer_view_device(client, PJS_DTYPE_F32, &other.shape, &other,
                                               (uint64_t)(uintptr_t)x, &arg, &err),
                     PJS_ERR_UNSUPPORTED);
    pjs_rt_executable_destroy(e);
}

/* Weights copied as one block and viewed at their offsets in it execute as
 * buffers of their own would; an offset off PJS_RT_BLOCK_ALIGN is refused
 * as UNSUPPORTED with nothing made (the caller then uploads one by one). */
static void test_weights_as_views_of_one_block(void **state)
{
    (void)state;
    static const char module[] =
        "module @block {\n"
        "  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3xf32>) -> tensor<2x3xf32> {\n"
        "    %0 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<3xf32>) -> tensor<2x3xf32>\n"
        "    %1 = stablehlo.add %a, %0 : tensor<2x3xf32>\n"
        "    return %1 : tensor<2x3xf32>\n"
        "  }\n"
        "}\n";
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, module, strlen(module), NULL, "block", &e, &err), 0);
    _Alignas(256) unsigned char floor[2 * PJS_RT_BLOCK_ALIGN] = {0};
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30};
    memcpy(floor, a, sizeof a);
    memcpy(floor + PJS_RT_BLOCK_ALIGN, b, sizeof b);
    pjs_rt_upload uploads[2] = {{.dtype = PJS_DTYPE_F32, .shape = &e->params[0].shape},
                                {.dtype = PJS_DTYPE_F32, .shape = &e->params[1].shape}};
    size_t offsets[2] = {0, PJS_RT_BLOCK_ALIGN};
    pjrt_buffer *block, *views[2];
    assert_int_equal(pjs_rt_block_from_host(client, floor, sizeof floor, 2, uploads, offsets,
                                            &block, views, &err),
                     0);
    memset(floor, 0, sizeof floor); /* the block is the device's copy */
    float y[6];
    void *dst[1] = {y};
    size_t size[1] = {sizeof y};
    pjrt_buffer *out;
    assert_int_equal(pjs_rt_execute_read(e, views, &out, dst, size, NULL, &err), 0);
    for (int i = 0; i < 6; i++)
        assert_true(y[i] == a[i] + b[i % 3]);
    pjs_rt_buffer_destroy(client, out);
    for (int i = 0; i < 2; i++)
        pjs_rt_buffer_destroy(client, views[i]);
    pjs_rt_buffer_destroy(client, block);

    offsets[1] = 64;
    assert_int_equal(pjs_rt_block_from_host(client, floor, sizeof floor, 2, uploads, offsets,
                                            &block, views, &err),
                     PJS_ERR_UNSUPPORTED);
    assert_null(block);
    assert_null(views[0]);
    assert_null(views[1]);
    pjs_rt_executable_destroy(e);
}

/* Pipelined swap-in's parts: two blocks started before either is waited
 * for, the first stage launched without a wait and its output fed to the
 * second, which alone is waited for; and a started block cancelled. */
static void test_blocks_in_flight_feed_launched_stages(void **state)
{
    (void)state;
    static const char stage0[] =
        "module @stage0 {\n"
        "  func.func public @main(%w: tensor<4xf32>, %x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "    %0 = stablehlo.multiply %w, %x : tensor<4xf32>\n"
        "    return %0 : tensor<4xf32>\n"
        "  }\n"
        "}\n";
    static const char stage1[] =
        "module @stage1 {\n"
        "  func.func public @main(%b: tensor<4xf32>, %h: tensor<4xf32>) -> tensor<4xf32> {\n"
        "    %0 = stablehlo.add %b, %h : tensor<4xf32>\n"
        "    return %0 : tensor<4xf32>\n"
        "  }\n"
        "}\n";
    pjs_rt_executable *e0, *e1;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, stage0, strlen(stage0), NULL, "s0", &e0, &err), 0);
    assert_int_equal(pjs_rt_compile(client, stage1, strlen(stage1), NULL, "s1", &e1, &err), 0);
    _Alignas(256) float floor[2][PJS_RT_BLOCK_ALIGN / sizeof(float)] = {{2, 3, 4, 5},
                                                                         {10, 20, 30, 40}};
    pjs_rt_upload upload = {.dtype = PJS_DTYPE_F32, .shape = &e0->params[0].shape};
    size_t offset = 0;
    pjs_rt_block_upload u[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(pjs_rt_block_upload_start(client, floor[k], sizeof floor[k], 1, &upload,
                                                   &offset, &u[k], &err),
                         0);
    pjrt_buffer *block[2], *w[2];
    assert_int_equal(pjs_rt_block_upload_finish(client, &u[0], 1, &upload, &offset, &block[0],
                                                &w[0], &err),
                     0);
    const float x[4] = {1, 1, 2, -1};
    pjrt_buffer *in, *h;
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &e0->params[1].shape, NULL, x,
                                             &in, &err),
                     0);
    assert_int_equal(pjs_rt_execute_launch(e0, (pjrt_buffer *[]){w[0], in}, &h, &err), 0);
    assert_int_equal(pjs_rt_block_upload_finish(client, &u[1], 1, &upload, &offset, &block[1],
                                                &w[1], &err),
                     0);
    float y[4];
    pjrt_buffer *out;
    assert_int_equal(pjs_rt_execute_read(e1, (pjrt_buffer *[]){w[1], h}, &out, (void *[]){y},
                                         (size_t[]){sizeof y}, NULL, &err),
                     0);
    for (int i = 0; i < 4; i++)
        assert_true(y[i] == floor[0][i] * x[i] + floor[1][i]);
    pjs_rt_buffer_destroy(client, out);
    pjs_rt_buffer_destroy(client, h);
    pjs_rt_buffer_destroy(client, in);
    for (int k = 0; k < 2; k++) {
        pjs_rt_buffer_destroy(client, w[k]);
        pjs_rt_buffer_destroy(client, block[k]);
    }

    assert_int_equal(pjs_rt_block_upload_start(client, floor[0], sizeof floor[0], 1, &upload,
                                               &offset, &u[0], &err),
                     0);
    pjs_rt_block_upload_cancel(client, &u[0]);
    assert_null(u[0].block);
    offset = 64; /* not a view's alignment: nothing is started */
    assert_int_equal(pjs_rt_block_upload_start(client, floor[0], sizeof floor[0], 1, &upload,
                                               &offset, &u[0], &err),
                     PJS_ERR_UNSUPPORTED);
    assert_null(u[0].block);
    pjs_rt_executable_destroy(e0);
    pjs_rt_executable_destroy(e1);
}

/* An input above PJS_RT_STAGED_UPLOAD_MAX is read in place until its transfer
 * completes; below, the plugin copies it within the call: the same values. */
static void test_upload_either_side_of_the_staging_limit(void **state)
{
    (void)state;
    enum { N = PJS_RT_STAGED_UPLOAD_MAX / 8 + 8 }; /* i64: just over the limit */
    static const char fmt[] =
        "module @neg {\n"
        "  func.func public @main(%%x: tensor<%dxi64>) -> tensor<%dxi64> {\n"
        "    %%0 = stablehlo.negate %%x : tensor<%dxi64>\n"
        "    return %%0 : tensor<%dxi64>\n"
        "  }\n"
        "}\n";
    int sizes[2] = {16, N};
    int64_t *v = malloc(N * sizeof *v), *got = malloc(N * sizeof *got);
    assert_non_null(v);
    assert_non_null(got);
    for (int k = 0; k < 2; k++) {
        int n = sizes[k];
        char text[512];
        snprintf(text, sizeof text, fmt, n, n, n, n);
        pjs_rt_executable *e;
        pjs_error err;
        assert_int_equal(pjs_rt_compile(client, text, strlen(text), NULL, "neg", &e, &err), 0);
        for (int i = 0; i < n; i++)
            v[i] = i * 3 - 7;
        pjrt_buffer *arg, *out[1];
        assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_I64, &e->params[0].shape, &e->params[0], v, &arg, &err), 0);
        memset(v, 0, (size_t)n * sizeof *v); /* the upload may not read it any more */
        void *dst[1] = {got};
        size_t bytes[1] = {(size_t)n * sizeof *got};
        assert_int_equal(pjs_rt_execute_read(e, &arg, out, dst, bytes, NULL, &err), 0);
        for (int i = 0; i < n; i++)
            assert_true(got[i] == -(int64_t)(i * 3 - 7));
        pjs_rt_buffer_destroy(client, out[0]);
        pjs_rt_buffer_destroy(client, arg);
        pjs_rt_executable_destroy(e);
    }
    free(v);
    free(got);
}

/* Many weights uploaded at once (pjs_rt_buffers_from_host), small and above
 * the staging limit alike: each buffer holds its own values once the call
 * returns and the host copies are overwritten; a failing upload leaves no
 * buffer and names its index. */
static void test_many_uploads_in_flight_at_once(void **state)
{
    (void)state;
    enum { N = 24, BIG = PJS_RT_STAGED_UPLOAD_MAX / 4 + 4 }; /* f32 elements */
    pjs_shape shapes[N];
    pjs_rt_upload uploads[N];
    float *data[N];
    pjrt_buffer *out[N];
    for (int i = 0; i < N; i++) {
        int64_t n = i % 5 == 0 ? BIG : 3 + i;
        shapes[i] = (pjs_shape){.rank = 1, .dims = {n}};
        data[i] = malloc((size_t)n * sizeof(float));
        assert_non_null(data[i]);
        for (int64_t j = 0; j < n; j++)
            data[i][j] = (float)(i * 1000 + j % 997);
        uploads[i] = (pjs_rt_upload){.dtype = PJS_DTYPE_F32, .shape = &shapes[i],
                                     .data = data[i]};
    }
    size_t failed = 99;
    pjs_error err;
    assert_int_equal(pjs_rt_buffers_from_host(client, N, uploads, out, &failed, &err), 0);
    for (int i = 0; i < N; i++) /* the uploads may not read them any more */
        memset(data[i], 0, (size_t)shapes[i].dims[0] * sizeof(float));
    for (int i = 0; i < N; i++) {
        size_t bytes = (size_t)shapes[i].dims[0] * sizeof(float);
        float *got = malloc(bytes);
        assert_non_null(got);
        assert_int_equal(pjs_rt_buffer_to_host(client, out[i], got, bytes, &err), 0);
        for (int64_t j = 0; j < shapes[i].dims[0]; j++)
            assert_true(got[j] == (float)(i * 1000 + j % 997));
        free(got);
        pjs_rt_buffer_destroy(client, out[i]);
    }
    /* the seventh cannot be made: no buffer is left, its index is said */
    shapes[6] = (pjs_shape){.rank = 1, .dims = {-5}};
    assert_int_not_equal(pjs_rt_buffers_from_host(client, N, uploads, out, &failed, &err), 0);
    assert_int_equal(failed, 6);
    for (int i = 0; i < N; i++)
        assert_null(out[i]);
    for (int i = 0; i < N; i++)
        free(data[i]);
}

static void test_compile_error_carries_plugin_message(void **state)
{
    (void)state;
    pjs_rt_executable *e = NULL;
    pjs_error err;
    const char bad[] = "module { func.func @main() -> tensor<f32> { return } }";
    int rc = pjs_rt_compile(client, bad, strlen(bad), NULL, "broken.mlir", &e, &err);
    assert_true(rc < 0);
    assert_null(e);
    assert_non_null(strstr(err.msg, "broken.mlir: compiling failed (PJRT"));
    /* The plugin's own diagnostic follows. */
    assert_true(strlen(strstr(err.msg, "):")) > 4);
}

/* Waiting by callback from several threads at once: each gets its own
 * execution's answer, many times over. */
struct callback_worker {
    pjs_rt_executable *e;
    int seed;
    int failures;
};

static void *run_callback_worker(void *arg)
{
    struct callback_worker *wk = arg;
    pjs_error err;
    for (int it = 0; it < 300; it++) {
        float w[6], x[6], sum[6] = {0};
        for (int i = 0; i < 6; i++) {
            w[i] = (float)(wk->seed * 1000 + it);
            x[i] = (float)i;
        }
        pjrt_buffer *args[2], *out[3];
        if (pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &wk->e->params[0].shape,
                                    &wk->e->params[0], w, &args[0], &err) != 0 ||
            pjs_rt_buffer_from_host(client, PJS_DTYPE_F32, &wk->e->params[1].shape,
                                    &wk->e->params[1], x, &args[1], &err) != 0) {
            wk->failures++;
            return NULL;
        }
        void *dst[3] = {sum, NULL, NULL};
        size_t sizes[3] = {sizeof sum, 0, 0};
        if (pjs_rt_execute_read(wk->e, args, out, dst, sizes, NULL, &err) != 0)
            wk->failures++;
        else
            for (int i = 0; i < 3; i++)
                pjs_rt_buffer_destroy(client, out[i]);
        for (int i = 0; i < 6; i++)
            wk->failures += sum[i] != w[i] + x[i];
        for (int i = 0; i < 2; i++)
            pjs_rt_buffer_destroy(client, args[i]);
    }
    return NULL;
}

static void test_callback_waits_under_concurrency(void **state)
{
    (void)state;
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, add_module, strlen(add_module), NULL, "add", &e, &err), 0);
    pjs_rt_set_wait_mode(PJS_RT_WAIT_CALLBACK);
    for (int ahead = 0; ahead < 2; ahead++) {
        pjs_rt_client_set_read_ahead(client, ahead);
        struct callback_worker wk[4];
        pthread_t t[4];
        for (int i = 0; i < 4; i++) {
            wk[i] = (struct callback_worker){.e = e, .seed = i + 1};
            assert_int_equal(pthread_create(&t[i], NULL, run_callback_worker, &wk[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(t[i], NULL);
            assert_int_equal(wk[i].failures, 0);
        }
    }
    pjs_rt_client_set_read_ahead(client, false);
    pjs_rt_set_wait_mode(PJS_RT_WAIT_AWAIT);
    pjs_rt_executable_destroy(e);
}

/* A failed execution's error reaches the caller through the callback too. */
static void test_callback_wait_reports_errors(void **state)
{
    (void)state;
    pjs_rt_executable *e;
    pjs_error err;
    assert_int_equal(pjs_rt_compile(client, neg_module, strlen(neg_module), NULL, "neg", &e, &err), 0);
    pjs_rt_set_wait_mode(PJS_RT_WAIT_CALLBACK);
    int64_t v[5] = {1, 2, 3, 4, 5};
    pjs_shape wrong = {.rank = 1, .dims = {5}};
    pjrt_buffer *arg, *out[1];
    assert_int_equal(pjs_rt_buffer_from_host(client, PJS_DTYPE_I64, &wrong, NULL, v, &arg, &err), 0);
    assert_true(pjs_rt_execute(e, &arg, out, &err) < 0);
    assert_non_null(strstr(err.msg, "executing failed"));
    assert_null(out[0]);
    pjs_rt_buffer_destroy(client, arg);
    pjs_rt_set_wait_mode(PJS_RT_WAIT_AWAIT);
    pjs_rt_executable_destroy(e);
}

static void test_wait_and_schedule_settings(void **state)
{
    (void)state;
    pjs_error err;
    pjs_rt_wait_mode m;
    assert_int_equal(pjs_rt_wait_mode_parse("callback", &m, &err), 0);
    assert_int_equal(m, PJS_RT_WAIT_CALLBACK);
    assert_int_equal(pjs_rt_wait_mode_parse("await", &m, &err), 0);
    assert_int_equal(m, PJS_RT_WAIT_AWAIT);
    assert_int_equal(pjs_rt_wait_mode_parse("poll", &m, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "await or callback"));

    assert_int_equal(pjs_rt_set_device_schedule("blocking_sync", &err), 0);
    assert_string_equal(getenv(PJS_RT_DEVICE_SCHEDULE_ENV), "blocking_sync");
    assert_int_equal(pjs_rt_set_device_schedule("auto", &err), 0);
    assert_null(getenv(PJS_RT_DEVICE_SCHEDULE_ENV));
    assert_int_equal(pjs_rt_set_device_schedule("busy", &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "blocking_sync"));
}

/* XLA_FLAGS shapes what the plugin compiles: an executable cached under one
 * value is not taken under another, and is again under the first. */
static void test_xla_flags_are_part_of_the_cache_key(void **state)
{
    (void)state;
    char dir[] = "/tmp/pjs-test-runtime-cache-XXXXXX";
    assert_non_null(mkdtemp(dir));
    pjs_exec_cache *cache;
    pjs_error err;
    assert_int_equal(pjs_exec_cache_open(dir, &cache, &err), 0);
    const char *before = getenv("XLA_FLAGS");
    char *saved = before ? strdup(before) : NULL;
    unsetenv("XLA_FLAGS");
    bool from_cache[4];
    for (int i = 0; i < 4; i++) {
        if (i == 2)
            assert_int_equal(pjs_rt_add_xla_flags("--xla_cpu_enable_fast_math=false", &err), 0);
        if (i == 3)
            unsetenv("XLA_FLAGS");
        pjs_rt_executable *e;
        assert_int_equal(pjs_rt_compile(client, neg_module, strlen(neg_module), cache, "neg", &e,
                                        &err), 0);
        from_cache[i] = e->from_cache;
        pjs_rt_executable_destroy(e);
    }
    assert_false(from_cache[0]); /* compiled, stored */
    assert_true(from_cache[1]);  /* the same flags: taken */
    assert_false(from_cache[2]); /* other flags: compiled again */
    assert_true(from_cache[3]);  /* the first flags again */
    assert_int_equal(pjs_rt_add_xla_flags("--a\n--b", &err), PJS_ERR_INVALID_ARGUMENT);
    if (saved != NULL) {
        setenv("XLA_FLAGS", saved, 1);
        free(saved);
    }
    pjs_exec_cache_close(cache);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_option_parse(void **state)
{
    (void)state;
    pjs_rt_option o;
    pjs_error err;
    assert_int_equal(pjs_rt_option_parse("preallocate=false", &o, &err), 0);
    assert_int_equal(o.type, PJRT_NAMED_BOOL);
    assert_false(o.bool_value);
    assert_int_equal(pjs_rt_option_parse("memory_fraction=0.5", &o, &err), 0);
    assert_int_equal(o.type, PJRT_NAMED_FLOAT);
    assert_true(o.float_value == 0.5f);
    assert_int_equal(pjs_rt_option_parse("visible_devices=3", &o, &err), 0);
    assert_int_equal(o.type, PJRT_NAMED_INT64);
    assert_int_equal(o.int_value, 3);
    assert_int_equal(pjs_rt_option_parse("allocator=bfc", &o, &err), 0);
    assert_int_equal(o.type, PJRT_NAMED_STRING);
    assert_string_equal(o.string_value, "bfc");
    assert_int_equal(pjs_rt_option_parse("novalue", &o, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "KEY=VALUE"));
    assert_int_equal(pjs_rt_option_parse("=1", &o, &err), PJS_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plugin_info),
        cmocka_unit_test(test_loading_the_same_plugin_twice_returns_it),
        cmocka_unit_test(test_plugin_errors),
        cmocka_unit_test(test_plugin_resolve_prefers_explicit_then_env),
        cmocka_unit_test(test_compile_reads_signature),
        cmocka_unit_test(test_identical_modules_share_one_executable),
        cmocka_unit_test(test_execute_values),
        cmocka_unit_test(test_execute_with_wrong_argument_shape_fails_cleanly),
        cmocka_unit_test(test_execute_read_in_both_orders),
        cmocka_unit_test(test_results_in_other_layouts_come_back_row_major),
        cmocka_unit_test(test_arguments_in_other_layouts_are_read_row_major),
        cmocka_unit_test(test_device_views_and_addresses),
        cmocka_unit_test(test_upload_either_side_of_the_staging_limit),
        cmocka_unit_test(test_many_uploads_in_flight_at_once),
        cmocka_unit_test(test_compile_error_carries_plugin_message),
        cmocka_unit_test(test_option_parse),
        cmocka_unit_test(test_callback_waits_under_concurrency),
        cmocka_unit_test(test_callback_wait_reports_errors),
        cmocka_unit_test(test_wait_and_schedule_settings),
        cmocka_unit_test(test_xla_flags_are_part_of_the_cache_key),
        cmocka_unit_test(test_weights_as_views_of_one_block),
        cmocka_unit_test(test_blocks_in_flight_feed_launched_stages),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
