/*
 * test_cpu_threads.c - the XLA CPU plugin's thread count (runtime/cpu_threads.h).
 *
 * Without a plugin: parsing --cpu-intra-op-threads, XLA's default count from
 * PJRT_NPROC / NPROC / the CPUs, the auto rule and the work estimate of a
 * bundle. Against the real CPU plugin: the client option sizes the plugin's
 * intra-op pool (counted as threads named tf_XLAEigen in /proc/self/task),
 * leaves PJRT_NPROC as it was, puts the client on one device unless
 * cpu_device_count is given, refuses bad values; and executables compiled
 * under one count are never loaded from the cache under another.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cpu_threads.h"
#include "runtime/exec_cache.h"
#include "runtime/runtime.h"

static void clear_env(void)
{
    unsetenv("PJRT_NPROC");
    unsetenv("NPROC");
}

static int cpus(void)
{
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    return CPU_COUNT(&set);
}

/* ---- without a plugin ------------------------------------------------- */

static void test_parse(void **state)
{
    (void)state;
    int n = -1;
    pjs_error err;
    assert_int_equal(pjs_rt_cpu_threads_parse("auto", &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(pjs_rt_cpu_threads_parse("1", &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(pjs_rt_cpu_threads_parse("256", &n, &err), 0);
    assert_int_equal(n, 256);
    const char *bad[] = {"0", "257", "-1", "", "two", "2x", "1.5", "AUTO"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(pjs_rt_cpu_threads_parse(bad[i], &n, &err), PJS_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, "--cpu-intra-op-threads"));
    }
}

static void test_xla_default_reads_pjrt_nproc_then_nproc_then_cpus(void **state)
{
    (void)state;
    clear_env();
    assert_int_equal(pjs_rt_cpu_threads_xla_default(), cpus());
    setenv("NPROC", "5", 1);
    assert_int_equal(pjs_rt_cpu_threads_xla_default(), 5);
    setenv("PJRT_NPROC", "3", 1);
    assert_int_equal(pjs_rt_cpu_threads_xla_default(), 3);
    setenv("PJRT_NPROC", "many", 1); /* not a number: XLA goes on to NPROC */
    assert_int_equal(pjs_rt_cpu_threads_xla_default(), 5);
    setenv("PJRT_NPROC", "0", 1); /* XLA's floor of 1 */
    assert_int_equal(pjs_rt_cpu_threads_xla_default(), 1);
    clear_env();
}

static void test_auto_rule(void **state)
{
    (void)state;
    clear_env();
    assert_int_equal(pjs_rt_cpu_threads_auto(0), 1);
    assert_int_equal(pjs_rt_cpu_threads_auto(PJS_RT_CPU_PARALLEL_FLOPS - 1), 1);
    assert_int_equal(pjs_rt_cpu_threads_auto(PJS_RT_CPU_PARALLEL_FLOPS), cpus());
    assert_int_equal(pjs_rt_cpu_threads_auto(-1), 1); /* no model known */
    setenv("PJRT_NPROC", "3", 1); /* the environment wins over the rule */
    assert_int_equal(pjs_rt_cpu_threads_auto(0), 3);
    assert_int_equal(pjs_rt_cpu_threads_auto(1e12), 3);
    clear_env();
}

static pjs_shape shape_of(int rank, const int64_t *dims)
{
    pjs_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++)
        s.dims[i] = dims[i];
    return s;
}

/* A bundle's manifest (batch sizes 2 and 8, one input) and weights: a 3x3
 * convolution kernel from 3 to 32 channels, its bias, and a dense matrix.
 * The estimate is of the smallest batch size. */
static void estimate_case(const int64_t *input_dims, int input_rank, pjs_tensor_format format,
                          double expected_macs_per_example)
{
    int64_t batch_sizes[] = {2, 8};
    pjs_tensor_spec input = {.name = "x", .dtype = PJS_DTYPE_F32, .batched = true,
                             .format = format, .shape = shape_of(input_rank, input_dims)};
    pjs_variant variant = {.name = "default", .inputs = &input};
    pjs_manifest m = {.n_inputs = 1, .inputs = &input, .n_batch_sizes = 2,
                      .batch_sizes = batch_sizes, .n_variants = 1, .variants = &variant};
    int64_t kernel[] = {3, 3, 3, 32}, bias[] = {32}, dense[] = {2304, 10};
    pjs_st_tensor tensors[] = {
        {.name = "conv.w", .dtype = PJS_DTYPE_F32, .shape = shape_of(4, kernel)},
        {.name = "conv.b", .dtype = PJS_DTYPE_F32, .shape = shape_of(1, bias)},
        {.name = "dense.w", .dtype = PJS_DTYPE_F32, .shape = shape_of(2, dense)},
    };
    pjs_safetensors w = {.fd = -1, .n_tensors = 3, .tensors = tensors};
    assert_float_equal(pjs_rt_cpu_flops_estimate(&m, &w), 2 * 2 * expected_macs_per_example, 0.5);
}

static void test_work_estimate(void **state)
{
    (void)state;
    const double kernel = 3 * 3 * 3 * 32, rest = 32 + 2304 * 10;
    /* NHWC 24x24x3: the kernel once per each of 576 positions. */
    int64_t nhwc[] = {-1, 24, 24, 3};
    estimate_case(nhwc, 4, PJS_FORMAT_NHWC, kernel * 576 + rest);
    /* NCHW 3x24x24: the same positions, the channel axis first. */
    int64_t nchw[] = {-1, 3, 24, 24};
    estimate_case(nchw, 4, PJS_FORMAT_NCHW, kernel * 576 + rest);
    /* No format: the last extent is the channel (12x24 positions). */
    int64_t hwc[] = {-1, 12, 24, 3};
    estimate_case(hwc, 4, PJS_FORMAT_NONE, kernel * 288 + rest);
    /* A flat input has no spatial extent: every weight once per example. */
    int64_t flat[] = {-1, 16};
    estimate_case(flat, 2, PJS_FORMAT_NONE, kernel + rest);

    /* No weights, or no batch sizes: nothing to estimate. */
    pjs_manifest empty = {0};
    pjs_safetensors none = {.fd = -1};
    assert_float_equal(pjs_rt_cpu_flops_estimate(&empty, &none), 0, 0);
}

/* ---- against the CPU plugin -------------------------------------------- */

static pjs_rt_plugin *plugin;

static int load_plugin(void **state)
{
    (void)state;
    char path[4096];
    pjs_error err;
    if (pjs_rt_plugin_resolve(NULL, path, sizeof path, &err) != 0 ||
        pjs_rt_plugin_load(path, &plugin, &err) != 0) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Threads of this process named tf_XLAEigen: the plugin's intra-op pool. */
static int intra_op_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char path[300], name[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(name, sizeof name, f) != NULL && strncmp(name, "tf_XLAEigen", 11) == 0)
            n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

static pjs_rt_client *create(const char *const *kvs, size_t n)
{
    pjs_rt_option options[4];
    pjs_error err;
    for (size_t i = 0; i < n; i++)
        assert_int_equal(pjs_rt_option_parse(kvs[i], &options[i], &err), 0);
    pjs_rt_client *c = NULL;
    if (pjs_rt_client_create(plugin, options, n, &c, &err) != 0)
        fail_msg("%s", err.msg);
    return c;
}

static void test_option_sizes_the_pools(void **state)
{
    (void)state;
    clear_env();
    for (int threads = 1; threads <= 3; threads++) {
        char kv[64];
        snprintf(kv, sizeof kv, "%s=%d", PJS_RT_OPTION_CPU_THREADS, threads);
        const char *kvs[] = {kv};
        pjs_rt_client *c = create(kvs, 1);
        assert_int_equal(pjs_rt_client_cpu_threads(c), threads);
        assert_int_equal(pjs_rt_client_device_count(c), 1);
        assert_int_equal(intra_op_threads(), threads);
        pjs_rt_client_destroy(c);
    }
    assert_int_equal(intra_op_threads(), 0);
}

static void test_without_the_option_the_plugin_decides(void **state)
{
    (void)state;
    clear_env();
    pjs_rt_client *c = create(NULL, 0);
    /* The plugin's four devices raise its pools to four threads or more. */
    int devices = (int)pjs_rt_client_device_count(c);
    int expected = cpus() > devices ? cpus() : devices;
    assert_int_equal(pjs_rt_client_cpu_threads(c), expected);
    assert_int_equal(intra_op_threads(), expected);
    pjs_rt_client_destroy(c);
}

static void test_device_count_given_is_kept_and_floors_the_pools(void **state)
{
    (void)state;
    clear_env();
    const char *kvs[] = {PJS_RT_OPTION_CPU_THREADS "=1", "cpu_device_count=2"};
    pjs_rt_client *c = create(kvs, 2);
    assert_int_equal(pjs_rt_client_device_count(c), 2);
    assert_int_equal(pjs_rt_client_cpu_threads(c), 2);
    assert_int_equal(intra_op_threads(), 2);
    pjs_rt_client_destroy(c);
}

static void test_pjrt_nproc_is_restored(void **state)
{
    (void)state;
    clear_env();
    const char *kvs[] = {PJS_RT_OPTION_CPU_THREADS "=1"};
    pjs_rt_client_destroy(create(kvs, 1));
    assert_null(getenv("PJRT_NPROC"));
    setenv("PJRT_NPROC", "7", 1);
    pjs_rt_client *c = create(kvs, 1);
    assert_int_equal(intra_op_threads(), 1); /* the option wins over the environment */
    pjs_rt_client_destroy(c);
    assert_string_equal(getenv("PJRT_NPROC"), "7");
    clear_env();
}

static void test_bad_option_values_are_refused(void **state)
{
    (void)state;
    const char *bad[] = {PJS_RT_OPTION_CPU_THREADS "=0", PJS_RT_OPTION_CPU_THREADS "=999",
                         PJS_RT_OPTION_CPU_THREADS "=true", PJS_RT_OPTION_CPU_THREADS "=auto"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pjs_rt_option o;
        pjs_error err;
        pjs_rt_client *c = NULL;
        assert_int_equal(pjs_rt_option_parse(bad[i], &o, &err), 0);
        assert_int_equal(pjs_rt_client_create(plugin, &o, 1, &c, &err), PJS_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, PJS_RT_OPTION_CPU_THREADS));
        assert_null(c);
    }
}

static const char tanh_module[] =
    "module @tanh {\n"
    "  func.func public @main(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {\n"
    "    %0 = stablehlo.tanh %x : tensor<64x64xf32>\n"
    "    return %0 : tensor<64x64xf32>\n"
    "  }\n"
    "}\n";

static bool compile_from_cache(pjs_rt_client *c, pjs_exec_cache *cache)
{
    pjs_rt_executable *e = NULL;
    pjs_error err;
    if (pjs_rt_compile(c, tanh_module, strlen(tanh_module), cache, "tanh", &e, &err) != 0)
        fail_msg("%s", err.msg);
    bool hit = e->from_cache;
    pjs_rt_executable_destroy(e);
    return hit;
}

static void test_cache_entries_are_per_thread_count(void **state)
{
    (void)state;
    clear_env();
    char dir[] = "/tmp/pjs-test-cpu-threads-XXXXXX";
    assert_non_null(mkdtemp(dir));
    pjs_exec_cache *cache;
    pjs_error err;
    assert_int_equal(pjs_exec_cache_open(dir, &cache, &err), 0);
    const char *one[] = {PJS_RT_OPTION_CPU_THREADS "=1"}, *two[] = {PJS_RT_OPTION_CPU_THREADS "=2"};

    pjs_rt_client *c = create(one, 1);
    assert_false(compile_from_cache(c, cache));
    assert_true(compile_from_cache(c, cache));
    pjs_rt_client_destroy(c);

    c = create(two, 1); /* the 1-thread entry is not reused */
    assert_false(compile_from_cache(c, cache));
    assert_true(compile_from_cache(c, cache));
    pjs_rt_client_destroy(c);

    c = create(one, 1); /* and the 1-thread entry is still there */
    assert_true(compile_from_cache(c, cache));
    pjs_rt_client_destroy(c);

    pjs_exec_cache_close(cache);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_xla_default_reads_pjrt_nproc_then_nproc_then_cpus),
        cmocka_unit_test(test_auto_rule),
        cmocka_unit_test(test_work_estimate),
    };
    const struct CMUnitTest with_plugin[] = {
        cmocka_unit_test(test_option_sizes_the_pools),
        cmocka_unit_test(test_without_the_option_the_plugin_decides),
        cmocka_unit_test(test_device_count_given_is_kept_and_floors_the_pools),
        cmocka_unit_test(test_pjrt_nproc_is_restored),
        cmocka_unit_test(test_bad_option_values_are_refused),
        cmocka_unit_test(test_cache_entries_are_per_thread_count),
    };
    int failed = cmocka_run_group_tests_name("cpu_threads", pure, NULL, NULL);
    failed += cmocka_run_group_tests_name("cpu_threads_plugin", with_plugin, load_plugin, NULL);
    return failed;
}
