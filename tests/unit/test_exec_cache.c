/*
 * test_exec_cache.c - the on-disk executable cache.
 *
 * Entry files: round trip, and every kind of damage (truncation, flipped
 * payload byte, wrong magic, an entry copied under another key) is detected,
 * reported as a miss and removed. Through the runtime: a second compile of
 * the same module is a cache hit that runs and gives the same results, and a
 * damaged entry is rebuilt.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/exec_cache.h"
#include "runtime/runtime.h"

static char dir[256];

static int make_dir(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/pjs-test-cache-XXXXXX");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void key_of(const char *s, unsigned char key[PJS_EXEC_CACHE_KEY_SIZE])
{
    pjs_exec_cache_key_builder *b = pjs_exec_cache_key_begin();
    assert_non_null(b);
    pjs_exec_cache_key_add(b, s, strlen(s));
    pjs_exec_cache_key_finish(b, key);
}

/* Path of the only entry file in the cache directory. */
static void only_entry(char *out, size_t size)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, ".pjx") != NULL) {
            snprintf(out, size, "%s/%s", dir, e->d_name);
            found++;
        }
    }
    closedir(d);
    assert_int_equal(found, 1);
}

static int entry_count(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".pjx") != NULL;
    closedir(d);
    return n;
}

static void test_key_is_deterministic_and_length_prefixed(void **state)
{
    (void)state;
    unsigned char a[32], b[32], c[32], d[32];
    key_of("module", a);
    key_of("module", b);
    assert_memory_equal(a, b, 32);
    key_of("modulf", c);
    assert_memory_not_equal(a, c, 32);
    /* ("ab","c") and ("a","bc") must differ. */
    pjs_exec_cache_key_builder *k = pjs_exec_cache_key_begin();
    pjs_exec_cache_key_add(k, "ab", 2);
    pjs_exec_cache_key_add(k, "c", 1);
    pjs_exec_cache_key_finish(k, c);
    k = pjs_exec_cache_key_begin();
    pjs_exec_cache_key_add(k, "a", 1);
    pjs_exec_cache_key_add(k, "bc", 2);
    pjs_exec_cache_key_finish(k, d);
    assert_memory_not_equal(c, d, 32);
}

static void test_store_and_lookup(void **state)
{
    (void)state;
    pjs_exec_cache *cache;
    pjs_error err;
    assert_int_equal(pjs_exec_cache_open(dir, &cache, &err), 0);
    unsigned char key[32], other[32];
    key_of("k1", key);
    key_of("k2", other);
    void *payload = NULL;
    size_t size = 0;
    assert_int_equal(pjs_exec_cache_lookup(cache, key, &payload, &size), 0);
    assert_int_equal(pjs_exec_cache_store(cache, key, "hello cache", 11, &err), 0);
    assert_int_equal(pjs_exec_cache_lookup(cache, key, &payload, &size), 1);
    assert_int_equal(size, 11);
    assert_memory_equal(payload, "hello cache", 11);
    free(payload);
    assert_int_equal(pjs_exec_cache_lookup(cache, other, &payload, &size), 0);
    pjs_exec_cache_evict(cache, key);
    assert_int_equal(entry_count(), 0);
    pjs_exec_cache_close(cache);
}

/* Stores an entry, damages it with `damage`, and expects a miss + removal. */
static void expect_damage_detected(void (*damage)(const char *path))
{
    pjs_exec_cache *cache;
    pjs_error err;
    assert_int_equal(pjs_exec_cache_open(dir, &cache, &err), 0);
    unsigned char key[32];
    key_of("damaged", key);
    assert_int_equal(pjs_exec_cache_store(cache, key, "0123456789abcdef", 16, &err), 0);
    char path[512];
    only_entry(path, sizeof path);
    damage(path);
    void *payload = NULL;
    size_t size = 0;
    assert_int_equal(pjs_exec_cache_lookup(cache, key, &payload, &size), 0);
    assert_null(payload);
    assert_int_equal(entry_count(), 0);
    pjs_exec_cache_close(cache);
}

static void flip_last_byte(const char *path)
{
    FILE *f = fopen(path, "r+b");
    fseek(f, -1, SEEK_END);
    int c = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(c ^ 0xff, f);
    fclose(f);
}

static void truncate_payload(const char *path) { assert_int_equal(truncate(path, 90), 0); }
static void truncate_header(const char *path) { assert_int_equal(truncate(path, 10), 0); }

static void clobber_magic(const char *path)
{
    FILE *f = fopen(path, "r+b");
    fputs("NOTPJSXC", f);
    fclose(f);
}

static void clobber_key(const char *path)
{
    FILE *f = fopen(path, "r+b");
    fseek(f, 8, SEEK_SET);
    fputc(0, f);
    fputc(0, f);
    fclose(f);
}

static void test_flipped_payload_byte(void **state) { (void)state; expect_damage_detected(flip_last_byte); }
static void test_truncated_payload(void **state) { (void)state; expect_damage_detected(truncate_payload); }
static void test_truncated_header(void **state) { (void)state; expect_damage_detected(truncate_header); }
static void test_wrong_magic(void **state) { (void)state; expect_damage_detected(clobber_magic); }
static void test_wrong_key(void **state) { (void)state; expect_damage_detected(clobber_key); }

static const char mul_module[] =
    "module @mul {\n"
    "  func.func public @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {\n"
    "    %0 = stablehlo.multiply %a, %b : tensor<3xf32>\n"
    "    return %0 : tensor<3xf32>\n"
    "  }\n"
    "}\n";

static void run_mul(pjs_rt_client *c, pjs_rt_executable *e)
{
    float a[3] = {1, 2, 3}, b[3] = {4, 5, -6}, out[3];
    pjrt_buffer *args[2], *res[1];
    pjs_error err;
    for (int i = 0; i < 2; i++)
        assert_int_equal(pjs_rt_buffer_from_host(c, PJS_DTYPE_F32, &e->params[i].shape,
                                                 &e->params[i], i == 0 ? a : b, &args[i], &err),
                         0);
    assert_int_equal(pjs_rt_execute(e, args, res, &err), 0);
    assert_int_equal(pjs_rt_buffer_to_host(c, res[0], out, sizeof out, &err), 0);
    assert_true(out[0] == 4 && out[1] == 10 && out[2] == -18);
    pjs_rt_buffer_destroy(c, res[0]);
    pjs_rt_buffer_destroy(c, args[0]);
    pjs_rt_buffer_destroy(c, args[1]);
}

/* A client of the default plugin and a cache in the test's directory. */
static void open_client_and_cache(pjs_rt_client **c, pjs_exec_cache **cache)
{
    char path[4096];
    pjs_error err;
    pjs_rt_plugin *p;
    assert_int_equal(pjs_rt_plugin_resolve(NULL, path, sizeof path, &err), 0);
    assert_int_equal(pjs_rt_plugin_load(path, &p, &err), 0);
    assert_int_equal(pjs_rt_client_create(p, NULL, 0, c, &err), 0);
    assert_int_equal(pjs_exec_cache_open(dir, cache, &err), 0);
}

static void test_compile_through_the_cache(void **state)
{
    (void)state;
    pjs_error err;
    pjs_rt_client *c;
    pjs_exec_cache *cache;
    open_client_and_cache(&c, &cache);

    pjs_rt_executable *e;
    assert_int_equal(pjs_rt_compile(c, mul_module, strlen(mul_module), cache, "mul", &e, &err), 0);
    assert_false(e->from_cache);
    assert_int_equal(entry_count(), 1);
    pjs_rt_executable_destroy(e);

    assert_int_equal(pjs_rt_compile(c, mul_module, strlen(mul_module), cache, "mul", &e, &err), 0);
    assert_true(e->from_cache);
    assert_int_equal(e->n_params, 2);
    assert_int_equal(e->n_results, 1);
    assert_int_equal(e->results[0].shape.dims[0], 3);
    run_mul(c, e);
    pjs_rt_executable_destroy(e);

    /* A damaged entry is ignored, the module recompiled and stored again. */
    char entry[512];
    only_entry(entry, sizeof entry);
    flip_last_byte(entry);
    assert_int_equal(pjs_rt_compile(c, mul_module, strlen(mul_module), cache, "mul", &e, &err), 0);
    assert_false(e->from_cache);
    run_mul(c, e);
    pjs_rt_executable_destroy(e);
    assert_int_equal(pjs_rt_compile(c, mul_module, strlen(mul_module), cache, "mul", &e, &err), 0);
    assert_true(e->from_cache);
    pjs_rt_executable_destroy(e);

    pjs_exec_cache_close(cache);
    pjs_rt_client_destroy(c);
}

/* A parameter's layout (mhlo.layout_mode) is stored with the executable and
 * comes back with it from the cache. */
static void test_cached_executable_keeps_parameter_layouts(void **state)
{
    (void)state;
    static const char module[] =
        "module @transposed {\n"
        "  func.func public @main(%x: tensor<2x3xf32> {mhlo.layout_mode = \"{0,1}\"})\n"
        "      -> tensor<2x3xf32> {\n"
        "    %0 = stablehlo.negate %x : tensor<2x3xf32>\n"
        "    return %0 : tensor<2x3xf32>\n"
        "  }\n"
        "}\n";
    pjs_error err;
    pjs_rt_client *c;
    pjs_exec_cache *cache;
    open_client_and_cache(&c, &cache);
    for (int pass = 0; pass < 2; pass++) {
        pjs_rt_executable *e;
        assert_int_equal(pjs_rt_compile(c, module, strlen(module), cache, "transposed", &e, &err),
                         0);
        assert_int_equal(e->from_cache, pass == 1);
        assert_true(e->params[0].other_layout);
        assert_int_equal(e->params[0].minor_to_major[0], 0);
        assert_int_equal(e->params[0].minor_to_major[1], 1);
        assert_false(e->results[0].other_layout);
        float x[6] = {1, 2, 3, 4, 5, 6}, y[6];
        pjrt_buffer *arg, *res;
        assert_int_equal(pjs_rt_buffer_from_host(c, PJS_DTYPE_F32, &e->params[0].shape,
                                                 &e->params[0], x, &arg, &err),
                         0);
        assert_int_equal(pjs_rt_execute(e, &arg, &res, &err), 0);
        assert_int_equal(pjs_rt_buffer_to_host(c, res, y, sizeof y, &err), 0);
        for (int i = 0; i < 6; i++)
            assert_true(y[i] == -x[i]);
        pjs_rt_buffer_destroy(c, res);
        pjs_rt_buffer_destroy(c, arg);
        pjs_rt_executable_destroy(e);
    }
    pjs_exec_cache_close(cache);
    pjs_rt_client_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_is_deterministic_and_length_prefixed),
        cmocka_unit_test_setup_teardown(test_store_and_lookup, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_flipped_payload_byte, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_truncated_payload, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_truncated_header, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_wrong_magic, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_wrong_key, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_compile_through_the_cache, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_cached_executable_keeps_parameter_layouts, make_dir,
                                        remove_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
