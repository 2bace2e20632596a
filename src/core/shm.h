/*
 * shm.h - the registry of client system shared-memory regions.
 *
 * A client creates a POSIX shared-memory object, registers (name, key,
 * offset, byte_size) with the server, then names the region in requests
 * instead of sending tensor bytes. The registry maps each region once and
 * hands out bounds-checked views. Registration is refused unless the server
 * was started with --allow-client-shm.
 *
 * Regions are reference counted: a view keeps its region mapped, so
 * unregistering while a request reads or writes a region is safe (the
 * mapping goes when the last view is released). One mutex guards the table;
 * any thread may call these functions.
 */
#ifndef PJS_CORE_SHM_H
#define PJS_CORE_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define PJS_SHM_NAME_MAX 256

typedef struct pjs_shm_registry pjs_shm_registry;
typedef struct pjs_shm_region pjs_shm_region;

/* A region as reported by status calls. */
typedef struct pjs_shm_info {
    char name[PJS_SHM_NAME_MAX];
    char key[PJS_SHM_NAME_MAX];
    uint64_t offset;
    uint64_t byte_size;
} pjs_shm_info;

/* A bounds-checked window into a registered region. */
typedef struct pjs_shm_view {
    pjs_shm_region *region; /* reference held until pjs_shm_view_release */
    unsigned char *data;
    size_t size;
} pjs_shm_view;

int pjs_shm_registry_create(bool allowed, pjs_shm_registry **out, pjs_error *err);
void pjs_shm_registry_destroy(pjs_shm_registry *r);
bool pjs_shm_registry_allowed(const pjs_shm_registry *r);

/* Maps [offset, offset+byte_size) of the shared-memory object `key` (as
 * shm_open names it, e.g. "/input0") under `name`. Errors: UNSUPPORTED when
 * client shared memory is off, INVALID_ARGUMENT for a bad key, a range
 * outside the object or a name already registered, NOT_FOUND when the object
 * does not exist. */
int pjs_shm_register(pjs_shm_registry *r, const char *name, const char *key, uint64_t offset,
                     uint64_t byte_size, pjs_error *err);
/* Unregisters `name`, or every region when name is NULL or "". NOT_FOUND for
 * an unknown name. */
int pjs_shm_unregister(pjs_shm_registry *r, const char *name, pjs_error *err);

/* Status of `name` (NULL or "": every region) into out[cap]; returns the
 * number of regions (may exceed cap) or NOT_FOUND for an unknown name. */
int pjs_shm_status(pjs_shm_registry *r, const char *name, pjs_shm_info *out, size_t cap,
                   pjs_error *err);

/* A view of bytes [offset, offset+size) of region `name` (offsets relative
 * to the registered window). Errors: NOT_FOUND unknown region,
 * INVALID_ARGUMENT out of bounds. */
int pjs_shm_view_get(pjs_shm_registry *r, const char *name, uint64_t offset, uint64_t size,
                     pjs_shm_view *out, pjs_error *err);
void pjs_shm_view_release(pjs_shm_view *v);

/* Copies n bytes (n <= v->size) to the start of a view. The region is the
 * client's memory: concurrent requests may name the same output region (as
 * perf_analyzer does), and then their copies race by the client's design,
 * as on Triton. tests/tsan.supp names this function for that reason. */
void pjs_shm_view_write(const pjs_shm_view *v, const void *src, size_t n);

#endif
