/*
 * test_shm_cuda.c - unit tests of CUDA regions in the shared-memory registry
 * (src/core/shm.c) over a fake of the CUDA IPC operations (host memory
 * standing for device allocations): one namespace with system regions,
 * status and unregistering per kind, bounds, the limits both kinds share,
 * the request byte budget, a mapping closed with its last reference, and
 * what the dispatcher uses on the device: a window's device and address,
 * reads into the caller's memory and device-to-device writes.
 * Also the real driver's answer on a machine without libcuda.so.1.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/shm.h"

/* ---- the fake device: allocations chosen by the handle's first byte --------------- */

#define ALLOCATIONS 2
#define ALLOCATION_SIZE 1024

static unsigned char device_memory[ALLOCATIONS][ALLOCATION_SIZE];
static int opens, closes;
static int open_fails; /* the next open fails with INVALID_ARGUMENT */

struct pjs_cuda_ipc_mapping {
    unsigned char *base;
    int64_t device_id;
};

static int fake_open(const unsigned char *handle, int64_t device_id, uint64_t byte_size,
                     pjs_cuda_ipc_mapping **out, pjs_error *err)
{
    if (open_fails) {
        open_fails = 0;
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "cuIpcOpenMemHandle: refused");
    }
    if (handle[0] >= ALLOCATIONS || byte_size > ALLOCATION_SIZE)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "outside the allocation");
    pjs_cuda_ipc_mapping *m = malloc(sizeof *m);
    assert_non_null(m);
    m->base = device_memory[handle[0]];
    m->device_id = device_id;
    opens++;
    *out = m;
    return 0;
}

static int fake_read(pjs_cuda_ipc_mapping *m, uint64_t offset, void *dst, size_t n,
                     pjs_error *err)
{
    (void)err;
    memcpy(dst, m->base + offset, n);
    return 0;
}

static int fake_write(pjs_cuda_ipc_mapping *m, uint64_t offset, const void *src, size_t n,
                      pjs_error *err)
{
    (void)err;
    memcpy(m->base + offset, src, n);
    return 0;
}

/* Device addresses of the fake are host addresses. */
static uint64_t fake_address(const pjs_cuda_ipc_mapping *m)
{
    return (uint64_t)(uintptr_t)m->base;
}

static int fake_write_from_device(pjs_cuda_ipc_mapping *m, uint64_t offset, uint64_t src,
                                  size_t n, pjs_error *err)
{
    (void)err;
    memcpy(m->base + offset, (const void *)(uintptr_t)src, n);
    return 0;
}

static void fake_close(pjs_cuda_ipc_mapping *m)
{
    closes++;
    free(m);
}

static const pjs_cuda_ipc_ops fake = {.open = fake_open,
                                      .read = fake_read,
                                      .write = fake_write,
                                      .address = fake_address,
                                      .write_from_device = fake_write_from_device,
                                      .close = fake_close};

/* ---- helpers --------------------------------------------------------------------- */

static char key[64];

static int setup(void **state)
{
    (void)state;
    opens = closes = open_fails = 0;
    for (int a = 0; a < ALLOCATIONS; a++)
        for (int i = 0; i < ALLOCATION_SIZE; i++)
            device_memory[a][i] = (unsigned char)(i + a);
    snprintf(key, sizeof key, "/pjs_test_shm_cuda_%d", (int)getpid());
    int fd = shm_open(key, O_CREAT | O_RDWR | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0)
        return -1;
    close(fd);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    shm_unlink(key);
    return 0;
}

static pjs_shm_registry *registry_with(pjs_shm_options o)
{
    o.cuda = &fake;
    pjs_shm_registry *r = NULL;
    pjs_error err;
    assert_int_equal(pjs_shm_registry_create(&o, &r, &err), 0);
    return r;
}

static pjs_shm_registry *registry(void)
{
    return registry_with((pjs_shm_options){.allowed = true});
}

/* A handle naming fake allocation a. */
static const unsigned char *handle_of(int a)
{
    static unsigned char h[ALLOCATIONS][PJS_CUDA_IPC_HANDLE_SIZE];
    memset(h[a], 0xab, sizeof h[a]);
    h[a][0] = (unsigned char)a;
    return h[a];
}

static int register_cuda(pjs_shm_registry *r, const char *name, int a, uint64_t size,
                         pjs_error *err)
{
    return pjs_shm_register_cuda(r, name, handle_of(a), PJS_CUDA_IPC_HANDLE_SIZE, 1, size, err);
}

/* ---- tests ----------------------------------------------------------------------- */

static void test_read_write_status(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry();
    pjs_error err;
    assert_int_equal(register_cuda(r, "dev", 1, 512, &err), 0);
    pjs_shm_info info[2];
    assert_int_equal(pjs_shm_status_kind(r, PJS_SHM_CUDA, NULL, info, 2, &err), 1);
    assert_int_equal(info[0].kind, PJS_SHM_CUDA);
    assert_string_equal(info[0].name, "dev");
    assert_int_equal(info[0].device_id, 1);
    assert_int_equal(info[0].byte_size, 512);
    assert_int_equal(pjs_shm_status(r, NULL, info, 2, &err), 0);

    pjs_shm_view v;
    assert_int_equal(pjs_shm_view_get(r, "dev", 16, 32, &v, &err), 0);
    assert_int_equal(pjs_shm_view_read(&v, &err), 0);
    assert_int_equal(v.data[0], 17);
    assert_int_equal(v.data[31], 48);
    unsigned char out[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    assert_int_equal(pjs_shm_view_write(&v, out, sizeof out, &err), 0);
    assert_memory_equal(device_memory[1] + 16, out, sizeof out);
    assert_int_equal(device_memory[1][24], 25);
    pjs_shm_view_release(&v);
    pjs_shm_registry_destroy(r);
    assert_int_equal(opens, 1);
    assert_int_equal(closes, 1);
}

static void test_window_on_the_device(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry();
    pjs_error err;
    assert_int_equal(register_cuda(r, "dev", 1, 512, &err), 0);
    assert_int_equal(pjs_shm_register(r, "sys", key, 0, 64, &err), 0);
    pjs_shm_view v, s;
    assert_int_equal(pjs_shm_view_get(r, "dev", 16, 32, &v, &err), 0);
    assert_int_equal(pjs_shm_view_get(r, "sys", 0, 8, &s, &err), 0);
    int64_t device_id = -1;
    uint64_t address = 0;
    assert_true(pjs_shm_view_device(&v, &device_id, &address));
    assert_int_equal(device_id, 1);
    assert_ptr_equal((void *)(uintptr_t)address, device_memory[1] + 16);
    assert_false(pjs_shm_view_device(&s, &device_id, &address));

    unsigned char into[32];
    assert_int_equal(pjs_shm_view_read_into(&v, into, &err), 0);
    assert_memory_equal(into, device_memory[1] + 16, sizeof into);
    assert_null(v.data); /* the caller's memory, not the view's */

    unsigned char result[4] = {1, 2, 3, 4};
    assert_int_equal(
        pjs_shm_view_write_from_device(&v, (uint64_t)(uintptr_t)result, sizeof result, &err), 0);
    assert_memory_equal(device_memory[1] + 16, result, sizeof result);
    assert_int_equal(device_memory[1][20], 21);
    /* more than the window, or a system window: refused, nothing written */
    assert_int_equal(pjs_shm_view_write_from_device(&v, (uint64_t)(uintptr_t)into, 33, &err),
                     PJS_ERR_INTERNAL);
    assert_int_equal(pjs_shm_view_write_from_device(&s, (uint64_t)(uintptr_t)result, 4, &err),
                     PJS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "no device copy"));
    pjs_shm_view_release(&v);
    pjs_shm_view_release(&s);
    pjs_shm_registry_destroy(r);
}

static void test_one_namespace(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry();
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "a", key, 0, 64, &err), 0);
    assert_int_equal(register_cuda(r, "a", 0, 64, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "already registered as system shared memory"));
    assert_int_equal(opens, 0); /* refused before the device is touched */
    assert_int_equal(register_cuda(r, "b", 0, 64, &err), 0);
    assert_int_equal(pjs_shm_register(r, "b", key, 0, 64, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "already registered as CUDA shared memory"));
    assert_int_equal(register_cuda(r, "b", 1, 64, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_null(strstr(err.msg, " as "));
    assert_int_equal(opens, 1);
    pjs_shm_registry_destroy(r);
    assert_int_equal(closes, 1);
}

static void test_status_and_unregister_per_kind(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry();
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "sys", key, 0, 64, &err), 0);
    assert_int_equal(register_cuda(r, "dev", 0, 64, &err), 0);
    pjs_shm_info info[2];
    assert_int_equal(pjs_shm_status_kind(r, PJS_SHM_CUDA, "sys", info, 2, &err),
                     PJS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "CUDA shared memory region \"sys\""));
    assert_int_equal(pjs_shm_status(r, "dev", info, 2, &err), PJS_ERR_NOT_FOUND);
    assert_int_equal(pjs_shm_unregister_kind(r, PJS_SHM_CUDA, "sys", &err), PJS_ERR_NOT_FOUND);
    assert_int_equal(pjs_shm_unregister(r, "dev", &err), PJS_ERR_NOT_FOUND);

    assert_int_equal(pjs_shm_unregister_kind(r, PJS_SHM_CUDA, NULL, &err), 0);
    assert_int_equal(closes, 1);
    assert_int_equal(pjs_shm_status(r, NULL, info, 2, &err), 1);
    assert_string_equal(info[0].name, "sys");
    assert_int_equal(pjs_shm_open_objects(r), 1);

    assert_int_equal(register_cuda(r, "dev", 0, 64, &err), 0);
    assert_int_equal(pjs_shm_unregister(r, "", &err), 0);
    assert_int_equal(pjs_shm_status_kind(r, PJS_SHM_CUDA, "", info, 2, &err), 1);
    assert_int_equal(pjs_shm_open_objects(r), 0);
    pjs_shm_registry_destroy(r);
    assert_int_equal(closes, 2);
}

static void test_bounds_and_refusals(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry();
    pjs_error err;
    unsigned char h[PJS_CUDA_IPC_HANDLE_SIZE + 1] = {0};
    assert_int_equal(pjs_shm_register_cuda(r, "c", h, sizeof h - 2, 0, 64, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "64 bytes"));
    assert_int_equal(pjs_shm_register_cuda(r, "c", h, sizeof h, 0, 64, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_register_cuda(r, "c", h, PJS_CUDA_IPC_HANDLE_SIZE, -1, 64, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_register_cuda(r, "c", h, PJS_CUDA_IPC_HANDLE_SIZE, 0, 0, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_register_cuda(r, "", h, PJS_CUDA_IPC_HANDLE_SIZE, 0, 64, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(opens, 0);

    /* What the driver refuses comes back with the region's name. */
    assert_int_equal(register_cuda(r, "big", 0, ALLOCATION_SIZE + 1, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "CUDA shared memory region \"big\": outside"));
    open_fails = 1;
    assert_int_equal(register_cuda(r, "refused", 0, 64, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "cuIpcOpenMemHandle"));
    pjs_shm_info info[1];
    assert_int_equal(pjs_shm_status_kind(r, PJS_SHM_CUDA, NULL, info, 1, &err), 0);

    assert_int_equal(register_cuda(r, "c", 0, 256, &err), 0);
    pjs_shm_view v;
    assert_int_equal(pjs_shm_view_get(r, "c", 200, 57, &v, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_view_get(r, "c", 257, 0, &v, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_shm_view_get(r, "c", 200, 56, &v, &err), 0);
    pjs_shm_view_release(&v);
    pjs_shm_registry_destroy(r);
    assert_int_equal(opens, closes);
}

static void test_refused_when_not_allowed(void **state)
{
    (void)state;
    pjs_shm_registry *r = registry_with((pjs_shm_options){.allowed = false});
    pjs_error err;
    assert_int_equal(register_cuda(r, "c", 0, 64, &err), PJS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "--allow-client-shm"));
    assert_int_equal(opens, 0);
    pjs_shm_registry_destroy(r);
}

static void test_limits_count_both_kinds(void **state)
{
    (void)state;
    pjs_shm_registry *r =
        registry_with((pjs_shm_options){.allowed = true, .max_regions = 2, .max_bytes = 200});
    pjs_error err;
    assert_int_equal(pjs_shm_register(r, "sys", key, 0, 100, &err), 0);
    assert_int_equal(register_cuda(r, "big", 0, 101, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "--max-shm-bytes"));
    assert_int_equal(register_cuda(r, "dev", 0, 100, &err), 0);
    assert_int_equal(register_cuda(r, "third", 1, 1, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "--max-shm-regions"));
    assert_int_equal(pjs_shm_register(r, "third", key, 0, 1, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_int_equal(opens, 1);
    assert_int_equal(pjs_shm_unregister_kind(r, PJS_SHM_CUDA, "dev", &err), 0);
    assert_int_equal(register_cuda(r, "third", 1, 100, &err), 0);
    pjs_shm_registry_destroy(r);
    assert_int_equal(closes, 2);
}

static void test_view_outlives_unregister(void **state)
{
    (void)state;
    pjs_byte_budget budget;
    pjs_byte_budget_init(&budget, 100);
    pjs_shm_registry *r = registry_with((pjs_shm_options){.allowed = true, .budget = &budget});
    pjs_error err;
    assert_int_equal(register_cuda(r, "dev", 0, 512, &err), 0);
    pjs_shm_view in, out;
    assert_int_equal(pjs_shm_view_get(r, "dev", 0, 64, &in, &err), 0);
    assert_int_equal(pjs_shm_view_get(r, "dev", 256, 128, &out, &err), 0);
    assert_int_equal(pjs_shm_view_read(&in, &err), 0);
    assert_int_equal(pjs_byte_budget_used(&budget), 64);
    pjs_shm_view too_big;
    assert_int_equal(pjs_shm_view_get(r, "dev", 64, 64, &too_big, &err), 0);
    assert_int_equal(pjs_shm_view_read(&too_big, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    pjs_shm_view_release(&too_big);

    assert_int_equal(pjs_shm_unregister_kind(r, PJS_SHM_CUDA, "dev", &err), 0);
    assert_int_equal(closes, 0); /* the views keep the mapping open */
    pjs_shm_view gone;
    assert_int_equal(pjs_shm_view_get(r, "dev", 0, 1, &gone, &err), PJS_ERR_NOT_FOUND);
    unsigned char bytes[4] = {1, 2, 3, 4};
    assert_int_equal(pjs_shm_view_write(&out, bytes, sizeof bytes, &err), 0);
    assert_memory_equal(device_memory[0] + 256, bytes, sizeof bytes);
    pjs_shm_view_release(&in);
    assert_int_equal(pjs_byte_budget_used(&budget), 0);
    assert_int_equal(closes, 0);
    pjs_shm_view_release(&out);
    assert_int_equal(closes, 1);
    pjs_shm_registry_destroy(r);
    assert_int_equal(closes, 1);
}

/* Without the NVIDIA driver, opening says what is missing. */
static void test_driver_missing(void **state)
{
    (void)state;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib != NULL) {
        dlclose(lib);
        skip();
    }
    pjs_shm_options o = {.allowed = true};
    pjs_shm_registry *r = NULL;
    pjs_error err;
    assert_int_equal(pjs_shm_registry_create(&o, &r, &err), 0);
    assert_int_equal(pjs_shm_register_cuda(r, "c", handle_of(0), PJS_CUDA_IPC_HANDLE_SIZE, 0, 64,
                                           &err),
                     PJS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "CUDA shared memory region \"c\""));
    assert_non_null(strstr(err.msg, "libcuda.so.1"));
    assert_non_null(strstr(err.msg, "system shared memory"));
    pjs_shm_info info[1];
    assert_int_equal(pjs_shm_status_kind(r, PJS_SHM_CUDA, NULL, info, 1, &err), 0);
    pjs_shm_registry_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_read_write_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_window_on_the_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_namespace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_and_unregister_per_kind, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bounds_and_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_when_not_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits_count_both_kinds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_outlives_unregister, setup, teardown),
        cmocka_unit_test_setup_teardown(test_driver_missing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
