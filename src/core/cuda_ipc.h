/*
 * cuda_ipc.h - device memory another process shares through a CUDA IPC
 * handle, opened, copied from and to, and closed.
 *
 * A client allocates device memory, takes its IPC handle
 * (cudaIpcGetMemHandle: 64 opaque bytes) and registers it; pjserve opens
 * the handle on the named device and copies a window of it to host memory
 * for an input, or from host memory for an output. Where the model runs on
 * the region's device, the runtime reads the region in place instead (its
 * address) and writes outputs into it device to device.
 *
 * The operations are a table of functions so that the shared-memory
 * registry (core/shm.c) can be tested with a fake. pjs_cuda_ipc_driver()
 * is the real one: it loads the NVIDIA driver's libcuda.so.1 at run time,
 * once, so pjserve builds and runs without CUDA; where the library is
 * missing, opening says so (UNSUPPORTED) and nothing else changes.
 *
 * A mapping may be read and written by several threads at once (each call
 * makes the device's primary context current on its own thread); it is
 * closed once, by whoever drops its last use.
 */
#ifndef PJS_CORE_CUDA_IPC_H
#define PJS_CORE_CUDA_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* The size of a CUDA IPC memory handle (CUipcMemHandle, cudaIpcMemHandle_t). */
#define PJS_CUDA_IPC_HANDLE_SIZE 64

typedef struct pjs_cuda_ipc_mapping pjs_cuda_ipc_mapping;

typedef struct pjs_cuda_ipc_ops {
    /* Opens handle[PJS_CUDA_IPC_HANDLE_SIZE] on device `device_id` and checks
     * that the allocation behind it holds byte_size bytes. Errors:
     * UNSUPPORTED without the driver or without devices, INVALID_ARGUMENT
     * for a device out of range, a handle the driver refuses, or an
     * allocation smaller than byte_size; every driver error names the
     * driver's error name and text. */
    int (*open)(const unsigned char *handle, int64_t device_id, uint64_t byte_size,
                pjs_cuda_ipc_mapping **out, pjs_error *err);
    /* Copies n bytes at `offset` into the mapping to dst (host memory). */
    int (*read)(pjs_cuda_ipc_mapping *m, uint64_t offset, void *dst, size_t n, pjs_error *err);
    /* Copies n bytes from src (host memory) to `offset` into the mapping. */
    int (*write)(pjs_cuda_ipc_mapping *m, uint64_t offset, const void *src, size_t n,
                 pjs_error *err);
    /* The device address of the allocation's first byte. */
    uint64_t (*address)(const pjs_cuda_ipc_mapping *m);
    /* Copies n bytes from device address src (memory of the same device) to
     * `offset` into the mapping, and waits until they are there. */
    int (*write_from_device)(pjs_cuda_ipc_mapping *m, uint64_t offset, uint64_t src, size_t n,
                             pjs_error *err);
    /* Closes the handle and lets go of the device context. */
    void (*close)(pjs_cuda_ipc_mapping *m);
} pjs_cuda_ipc_ops;

/* The operations of the NVIDIA driver (libcuda.so.1, loaded on first use). */
const pjs_cuda_ipc_ops *pjs_cuda_ipc_driver(void);

#endif
