/*
 * shm.h - the registry of client shared-memory regions: system shared
 * memory (POSIX objects) and CUDA shared memory (device memory shared
 * through CUDA IPC handles).
 *
 * A client creates a POSIX shared-memory object, registers (name, key,
 * offset, byte_size) with the server, then names the region in requests
 * instead of sending tensor bytes. Registration is refused unless the server
 * was started with --allow-client-shm.
 *
 * The client keeps full control of the object: it may shrink or remove it
 * at any time. The server therefore never maps it. The registry keeps one
 * open descriptor per object (shared by every region registered over it)
 * and copies bytes with pread and pwrite: an input is read into memory the
 * request owns, an output is written after checking that the object still
 * holds the region. A region that shrank is an INVALID_ARGUMENT error for
 * the request that names it, never a signal in the server.
 *
 * A CUDA region is (name, raw IPC handle, device_id, byte_size): the
 * registry opens the handle through core/cuda_ipc.h and copies between the
 * device memory and memory the request owns, so requests name either kind
 * of region alike; or it tells the window's device address, for the
 * dispatcher to read and write on the device itself. Names are one namespace across both kinds (a name
 * registered as one kind cannot be registered as the other); status and
 * unregistering are per kind.
 *
 * Input bytes read into a request come out of the request byte budget given
 * at creation (the server's --max-inflight-request-bytes) while the view
 * holds them. The number of regions and their total registered size, both
 * kinds together, are bounded (--max-shm-regions, --max-shm-bytes).
 *
 * Regions and objects are reference counted: a view keeps its region and its
 * object's descriptor (or its CUDA mapping), so unregistering while a
 * request reads or writes a region is safe (the descriptor closes when the
 * last region over it goes; a CUDA handle closes with its region's last
 * reference). One mutex guards the tables; any thread may call these
 * functions.
 */
#ifndef PJS_CORE_SHM_H
#define PJS_CORE_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/byte_budget.h"
#include "core/cuda_ipc.h"
#include "core/status.h"

#define PJS_SHM_NAME_MAX 256

/* Defaults of --max-shm-regions and --max-shm-bytes. */
#define PJS_SHM_DEFAULT_MAX_REGIONS 1024u
#define PJS_SHM_DEFAULT_MAX_BYTES (64ULL << 30)

typedef struct pjs_shm_registry pjs_shm_registry;
typedef struct pjs_shm_region pjs_shm_region;

typedef enum pjs_shm_kind {
    PJS_SHM_SYSTEM, /* a POSIX shared-memory object */
    PJS_SHM_CUDA,   /* device memory behind a CUDA IPC handle */
} pjs_shm_kind;

/* What a registry accepts. */
typedef struct pjs_shm_options {
    bool allowed;            /* --allow-client-shm */
    uint64_t max_regions;    /* regions registered at once; 0: PJS_SHM_DEFAULT_MAX_REGIONS */
    uint64_t max_bytes;      /* sum of their byte_size; 0: PJS_SHM_DEFAULT_MAX_BYTES */
    pjs_byte_budget *budget; /* input bytes read into requests; NULL: unbounded */
    const pjs_cuda_ipc_ops *cuda; /* CUDA regions; NULL: pjs_cuda_ipc_driver() */
} pjs_shm_options;

/* A region as reported by status calls. */
typedef struct pjs_shm_info {
    pjs_shm_kind kind;
    char name[PJS_SHM_NAME_MAX];
    char key[PJS_SHM_NAME_MAX]; /* system; "" for CUDA */
    uint64_t offset;            /* system; 0 for CUDA */
    int64_t device_id;          /* CUDA; 0 for system */
    uint64_t byte_size;
} pjs_shm_info;

/* A bounds-checked window into a registered region. */
typedef struct pjs_shm_view {
    pjs_shm_region *region; /* reference held until pjs_shm_view_release */
    uint64_t offset;        /* into the region's registered window */
    size_t size;
    /* The window's bytes as pjs_shm_view_read copied them (NULL before);
     * owned by the view, their size taken from `budget` until release. */
    unsigned char *data;
    pjs_byte_budget *budget;
} pjs_shm_view;

int pjs_shm_registry_create(const pjs_shm_options *o, pjs_shm_registry **out, pjs_error *err);
void pjs_shm_registry_destroy(pjs_shm_registry *r);
bool pjs_shm_registry_allowed(const pjs_shm_registry *r);

/* Registers [offset, offset+byte_size) of the shared-memory object `key` (as
 * shm_open names it, e.g. "/input0") under `name`. Errors: UNSUPPORTED when
 * client shared memory is off, INVALID_ARGUMENT for a bad key, an object that
 * is not a regular file, a range outside the object or a name already
 * registered, NOT_FOUND when the object does not exist, RESOURCE_EXHAUSTED
 * past --max-shm-regions or --max-shm-bytes. */
int pjs_shm_register(pjs_shm_registry *r, const char *name, const char *key, uint64_t offset,
                     uint64_t byte_size, pjs_error *err);
/* Registers byte_size bytes of the device memory that the CUDA IPC handle
 * raw_handle[handle_len] shares, on device `device_id`, under `name`.
 * Errors: UNSUPPORTED when client shared memory is off or the machine has no
 * NVIDIA driver; INVALID_ARGUMENT for a handle that is not
 * PJS_CUDA_IPC_HANDLE_SIZE bytes or that the driver refuses, a device out of
 * range, a byte_size of 0 or past the allocation, or a name already
 * registered (as either kind); RESOURCE_EXHAUSTED past the limits. */
int pjs_shm_register_cuda(pjs_shm_registry *r, const char *name, const void *raw_handle,
                          size_t handle_len, int64_t device_id, uint64_t byte_size,
                          pjs_error *err);

/* Unregisters `name`, or every region of `kind` when name is NULL or "";
 * regions of the other kind stay. NOT_FOUND for a name not registered as
 * `kind`. */
int pjs_shm_unregister_kind(pjs_shm_registry *r, pjs_shm_kind kind, const char *name,
                            pjs_error *err);
/* pjs_shm_unregister_kind of system regions. */
int pjs_shm_unregister(pjs_shm_registry *r, const char *name, pjs_error *err);

/* Status of `name` (NULL or "": every region of `kind`) into out[cap];
 * returns the number of regions (may exceed cap) or NOT_FOUND for a name
 * not registered as `kind`. */
int pjs_shm_status_kind(pjs_shm_registry *r, pjs_shm_kind kind, const char *name,
                        pjs_shm_info *out, size_t cap, pjs_error *err);
/* pjs_shm_status_kind of system regions. */
int pjs_shm_status(pjs_shm_registry *r, const char *name, pjs_shm_info *out, size_t cap,
                   pjs_error *err);

/* Objects with registered regions: each is held open by one descriptor,
 * however many regions lie in it. */
size_t pjs_shm_open_objects(pjs_shm_registry *r);

/* A view of bytes [offset, offset+size) of region `name`, of either kind
 * (offsets relative to the registered window); no bytes are read yet. Errors: NOT_FOUND
 * unknown region, INVALID_ARGUMENT out of bounds. */
int pjs_shm_view_get(pjs_shm_registry *r, const char *name, uint64_t offset, uint64_t size,
                     pjs_shm_view *out, pjs_error *err);
/* Reads the window into v->data (request-owned memory). Errors:
 * RESOURCE_EXHAUSTED when the request byte budget cannot hold v->size more
 * bytes, INVALID_ARGUMENT when the object no longer holds the window (the
 * client shrank it), IO when the read (or the device copy) fails. */
int pjs_shm_view_read(pjs_shm_view *v, pjs_error *err);
/* Copies the window's v->size bytes into dst (the caller's memory, outside
 * the request byte budget); errors as pjs_shm_view_read. */
int pjs_shm_view_read_into(const pjs_shm_view *v, void *dst, pjs_error *err);
/* Whether the window is device memory (a CUDA region): then its device_id
 * and the device address of its first byte, which the region's reference
 * keeps valid. */
bool pjs_shm_view_device(const pjs_shm_view *v, int64_t *device_id, uint64_t *address);
/* Copies n bytes (n <= v->size) from device address src, memory of the
 * window's device, to the start of a CUDA window, device to device; IO when
 * the copy fails. */
int pjs_shm_view_write_from_device(const pjs_shm_view *v, uint64_t src, size_t n,
                                   pjs_error *err);
/* Copies n bytes (n <= v->size) to the start of the window, after checking
 * that the object still holds it (INVALID_ARGUMENT when it shrank; IO when
 * the write fails). Concurrent requests may name the same output window (as
 * perf_analyzer does); their writes then interleave in the client's object,
 * by the client's design, as on Triton. */
int pjs_shm_view_write(const pjs_shm_view *v, const void *src, size_t n, pjs_error *err);
/* Frees the copy read (giving its bytes back to the budget) and drops the
 * region. */
void pjs_shm_view_release(pjs_shm_view *v);

#endif
