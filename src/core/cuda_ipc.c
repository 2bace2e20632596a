/*
 * cuda_ipc.c - CUDA IPC memory through the NVIDIA driver API, loaded with
 * dlopen so that pjserve neither builds nor links against CUDA.
 *
 * The driver's functions are resolved once per process (pthread_once) into
 * a table that nothing changes afterwards; a failure to load or to
 * initialise the driver is kept as a message that every open returns. The
 * few types used are declared here as the CUDA driver API (cuda.h) defines
 * their ABI on 64-bit Linux: CUresult and CUdevice are ints, CUcontext a
 * pointer, CUdeviceptr an unsigned long long, CUipcMemHandle a struct of
 * 64 bytes passed by value.
 *
 * Each mapping holds a reference on its device's primary context
 * (cuDevicePrimaryCtxRetain), the context the CUDA runtime and the PJRT
 * plugin use too, and pushes it around every driver call, so any thread
 * may copy: the push and pop touch only the calling thread's context
 * stack. Copies are synchronous: cuMemcpyDtoH/HtoD through host memory,
 * and cuMemcpyDtoD (device to device, which returns before the copy is
 * done) followed by a wait on the legacy default stream it was queued on.
 */
#include "core/cuda_ipc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- the driver ABI (CUDA driver API, cuda.h) ------------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct CUstream_st *CUstream; /* NULL: the legacy default stream */
typedef struct CUipcMemHandle {
    char reserved[PJS_CUDA_IPC_HANDLE_SIZE];
} CUipcMemHandle;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
};

typedef struct driver {
    CUresult (*init)(unsigned int flags);
    CUresult (*device_get)(CUdevice *dev, int ordinal);
    CUresult (*device_get_count)(int *count);
    CUresult (*primary_ctx_retain)(CUcontext *ctx, CUdevice dev);
    CUresult (*primary_ctx_release)(CUdevice dev);
    CUresult (*ctx_push)(CUcontext ctx);
    CUresult (*ctx_pop)(CUcontext *ctx);
    CUresult (*ipc_open)(CUdeviceptr *ptr, CUipcMemHandle handle, unsigned int flags);
    CUresult (*ipc_close)(CUdeviceptr ptr);
    CUresult (*address_range)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
    CUresult (*copy_dtoh)(void *dst, CUdeviceptr src, size_t n);
    CUresult (*copy_htod)(CUdeviceptr dst, const void *src, size_t n);
    CUresult (*copy_dtod)(CUdeviceptr dst, CUdeviceptr src, size_t n);
    CUresult (*stream_synchronize)(CUstream stream);
    CUresult (*error_name)(CUresult rc, const char **name);
    CUresult (*error_string)(CUresult rc, const char **text);
    /* Why the driver cannot be used ("" when it can). */
    char unusable[PJS_ERROR_MSG_MAX];
} driver;

static driver the_driver;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

struct pjs_cuda_ipc_mapping {
    CUdevice device;
    CUcontext context; /* the device's primary context, retained */
    CUdeviceptr ptr;   /* the opened allocation's start */
};

/* Sets err to code with "what: NAME (text)" for the driver's rc. */
static int driver_error(pjs_error *err, pjs_status code, CUresult rc, const char *what)
{
    const char *name = NULL, *text = NULL;
    if (the_driver.error_name == NULL || the_driver.error_name(rc, &name) != CUDA_SUCCESS)
        name = NULL;
    if (the_driver.error_string == NULL || the_driver.error_string(rc, &text) != CUDA_SUCCESS)
        text = NULL;
    if (rc == CUDA_ERROR_OUT_OF_MEMORY)
        code = PJS_ERR_RESOURCE_EXHAUSTED;
    return pjs_error_set(err, code, "%s: CUDA driver error %d %s (%s)", what, rc,
                         name != NULL ? name : "", text != NULL ? text : "no description");
}

static void *resolve(void *lib, const char *name, const char *fallback, bool *missing)
{
    void *f = dlsym(lib, name);
    if (f == NULL && fallback != NULL)
        f = dlsym(lib, fallback);
    if (f == NULL && !*missing) {
        *missing = true;
        snprintf(the_driver.unusable, sizeof the_driver.unusable,
                 "the NVIDIA driver's libcuda.so.1 has no %s", name);
    }
    return f;
}

static void driver_load(void)
{
    driver *d = &the_driver;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        snprintf(d->unusable, sizeof d->unusable,
                 "CUDA shared memory needs the NVIDIA driver (libcuda.so.1), which this machine "
                 "does not have; use system shared memory");
        return;
    }
    bool missing = false;
    d->init = resolve(lib, "cuInit", NULL, &missing);
    d->device_get = resolve(lib, "cuDeviceGet", NULL, &missing);
    d->device_get_count = resolve(lib, "cuDeviceGetCount", NULL, &missing);
    d->primary_ctx_retain = resolve(lib, "cuDevicePrimaryCtxRetain", NULL, &missing);
    d->primary_ctx_release =
        resolve(lib, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", &missing);
    d->ctx_push = resolve(lib, "cuCtxPushCurrent_v2", NULL, &missing);
    d->ctx_pop = resolve(lib, "cuCtxPopCurrent_v2", NULL, &missing);
    d->ipc_open = resolve(lib, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", &missing);
    d->ipc_close = resolve(lib, "cuIpcCloseMemHandle", NULL, &missing);
    d->address_range = resolve(lib, "cuMemGetAddressRange_v2", NULL, &missing);
    d->copy_dtoh = resolve(lib, "cuMemcpyDtoH_v2", NULL, &missing);
    d->copy_htod = resolve(lib, "cuMemcpyHtoD_v2", NULL, &missing);
    d->copy_dtod = resolve(lib, "cuMemcpyDtoD_v2", NULL, &missing);
    d->stream_synchronize = resolve(lib, "cuStreamSynchronize", NULL, &missing);
    d->error_name = resolve(lib, "cuGetErrorName", NULL, &missing);
    d->error_string = resolve(lib, "cuGetErrorString", NULL, &missing);
    if (missing)
        return; /* the library stays loaded: the process may use it otherwise */
    CUresult rc = d->init(0);
    if (rc != CUDA_SUCCESS) {
        pjs_error err;
        driver_error(&err, PJS_ERR_UNSUPPORTED, rc, "CUDA shared memory: cuInit");
        snprintf(d->unusable, sizeof d->unusable, "%s", err.msg);
    }
}

/* The loaded driver into *out, or UNSUPPORTED saying why there is none. */
static int driver_get(const driver **out, pjs_error *err)
{
    pthread_once(&driver_once, driver_load);
    if (the_driver.unusable[0] != '\0')
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED, "%s", the_driver.unusable);
    *out = &the_driver;
    return 0;
}

/* Makes m's context current on this thread. */
static int push(const driver *d, const pjs_cuda_ipc_mapping *m, pjs_error *err)
{
    CUresult rc = d->ctx_push(m->context);
    return rc == CUDA_SUCCESS ? 0 : driver_error(err, PJS_ERR_INTERNAL, rc, "cuCtxPushCurrent");
}

static void pop(const driver *d)
{
    CUcontext popped;
    d->ctx_pop(&popped);
}

/* Checks that the allocation opened at m->ptr holds byte_size bytes. */
static int check_extent(const driver *d, const pjs_cuda_ipc_mapping *m, uint64_t byte_size,
                        pjs_error *err)
{
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult rc = d->address_range(&base, &size, m->ptr);
    if (rc != CUDA_SUCCESS)
        return driver_error(err, PJS_ERR_INVALID_ARGUMENT, rc, "cuMemGetAddressRange");
    uint64_t held = (uint64_t)(base + size - m->ptr);
    if (m->ptr < base || byte_size > held)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "byte_size %llu is larger than the %llu bytes of the device "
                             "allocation the handle shares",
                             (unsigned long long)byte_size, (unsigned long long)held);
    return 0;
}

static int driver_open(const unsigned char *handle, int64_t device_id, uint64_t byte_size,
                       pjs_cuda_ipc_mapping **out, pjs_error *err)
{
    const driver *d = NULL;
    int result = driver_get(&d, err);
    if (result != 0)
        return result;
    int count = 0;
    CUresult rc = d->device_get_count(&count);
    if (rc != CUDA_SUCCESS)
        return driver_error(err, PJS_ERR_UNSUPPORTED, rc, "cuDeviceGetCount");
    if (device_id < 0 || device_id >= count)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "device_id %lld is not a device of this server (it sees %d CUDA "
                             "device%s)",
                             (long long)device_id, count, count == 1 ? "" : "s");
    pjs_cuda_ipc_mapping *m = calloc(1, sizeof *m);
    if (m == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    bool retained = false, pushed = false, opened = false;
    if ((rc = d->device_get(&m->device, (int)device_id)) != CUDA_SUCCESS) {
        result = driver_error(err, PJS_ERR_INVALID_ARGUMENT, rc, "cuDeviceGet");
        goto out;
    }
    if ((rc = d->primary_ctx_retain(&m->context, m->device)) != CUDA_SUCCESS) {
        result = driver_error(err, PJS_ERR_UNSUPPORTED, rc, "cuDevicePrimaryCtxRetain");
        goto out;
    }
    retained = true;
    if ((result = push(d, m, err)) != 0)
        goto out;
    pushed = true;
    CUipcMemHandle h;
    for (size_t i = 0; i < sizeof h.reserved; i++)
        h.reserved[i] = (char)handle[i];
    if ((rc = d->ipc_open(&m->ptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != CUDA_SUCCESS) {
        result = driver_error(err, PJS_ERR_INVALID_ARGUMENT, rc, "cuIpcOpenMemHandle");
        goto out;
    }
    opened = true;
    result = check_extent(d, m, byte_size, err);
out:
    if (result != 0 && opened)
        d->ipc_close(m->ptr);
    if (pushed)
        pop(d);
    if (result != 0 && retained)
        d->primary_ctx_release(m->device);
    if (result != 0)
        free(m);
    else
        *out = m;
    return result;
}

static int driver_read(pjs_cuda_ipc_mapping *m, uint64_t offset, void *dst, size_t n,
                       pjs_error *err)
{
    const driver *d = &the_driver; /* loaded: m was opened */
    int result = push(d, m, err);
    if (result != 0)
        return result;
    CUresult rc = d->copy_dtoh(dst, m->ptr + offset, n);
    if (rc != CUDA_SUCCESS)
        result = driver_error(err, PJS_ERR_IO, rc, "cuMemcpyDtoH");
    pop(d);
    return result;
}

static int driver_write(pjs_cuda_ipc_mapping *m, uint64_t offset, const void *src, size_t n,
                        pjs_error *err)
{
    const driver *d = &the_driver;
    int result = push(d, m, err);
    if (result != 0)
        return result;
    CUresult rc = d->copy_htod(m->ptr + offset, src, n);
    if (rc != CUDA_SUCCESS)
        result = driver_error(err, PJS_ERR_IO, rc, "cuMemcpyHtoD");
    pop(d);
    return result;
}

static uint64_t driver_address(const pjs_cuda_ipc_mapping *m)
{
    return (uint64_t)m->ptr;
}

static int driver_write_from_device(pjs_cuda_ipc_mapping *m, uint64_t offset, uint64_t src,
                                    size_t n, pjs_error *err)
{
    const driver *d = &the_driver;
    int result = push(d, m, err);
    if (result != 0)
        return result;
    CUresult rc = d->copy_dtod(m->ptr + offset, (CUdeviceptr)src, n);
    if (rc != CUDA_SUCCESS)
        result = driver_error(err, PJS_ERR_IO, rc, "cuMemcpyDtoD");
    else if ((rc = d->stream_synchronize(NULL)) != CUDA_SUCCESS)
        result = driver_error(err, PJS_ERR_IO, rc, "cuStreamSynchronize after cuMemcpyDtoD");
    pop(d);
    return result;
}

static void driver_close(pjs_cuda_ipc_mapping *m)
{
    const driver *d = &the_driver;
    pjs_error ignored;
    if (push(d, m, &ignored) == 0) {
        d->ipc_close(m->ptr);
        pop(d);
    }
    d->primary_ctx_release(m->device);
    free(m);
}

static const pjs_cuda_ipc_ops driver_ops = {
    .open = driver_open,
    .read = driver_read,
    .write = driver_write,
    .address = driver_address,
    .write_from_device = driver_write_from_device,
    .close = driver_close,
};

const pjs_cuda_ipc_ops *pjs_cuda_ipc_driver(void)
{
    return &driver_ops;
}
