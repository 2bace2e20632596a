/*
 * shm.c - client system shared-memory regions: register, look up, unmap.
 *
 * The table is a singly linked list (clients register a handful of regions)
 * under one mutex. Each region holds a reference count: the table's own
 * reference plus one per live view. Unregistering removes the region from
 * the table and drops the table's reference; munmap happens with the last
 * reference, so a request still reading a region keeps a valid mapping.
 */
#include "core/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct pjs_shm_region {
    pjs_shm_info info;
    void *map;          /* the whole mapping, page aligned */
    size_t map_size;
    unsigned char *base; /* info.offset into the object */
    atomic_int refs;
    pjs_shm_region *next;
};

struct pjs_shm_registry {
    bool allowed;
    pthread_mutex_t lock;
    pjs_shm_region *regions;
};

int pjs_shm_registry_create(bool allowed, pjs_shm_registry **out, pjs_error *err)
{
    pjs_shm_registry *r = calloc(1, sizeof *r);
    if (r == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    r->allowed = allowed;
    pthread_mutex_init(&r->lock, NULL);
    *out = r;
    return 0;
}

static void region_unref(pjs_shm_region *g)
{
    if (atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    if (g->map != NULL)
        munmap(g->map, g->map_size);
    free(g);
}

void pjs_shm_registry_destroy(pjs_shm_registry *r)
{
    if (r == NULL)
        return;
    pjs_shm_region *g = r->regions;
    while (g != NULL) {
        pjs_shm_region *next = g->next;
        region_unref(g);
        g = next;
    }
    pthread_mutex_destroy(&r->lock);
    free(r);
}

bool pjs_shm_registry_allowed(const pjs_shm_registry *r)
{
    return r->allowed;
}

static pjs_shm_region *find_locked(pjs_shm_registry *r, const char *name)
{
    for (pjs_shm_region *g = r->regions; g != NULL; g = g->next)
        if (strcmp(g->info.name, name) == 0)
            return g;
    return NULL;
}

static int map_region(pjs_shm_region *g, pjs_error *err)
{
    const pjs_shm_info *in = &g->info;
    int fd = shm_open(in->key, O_RDWR, 0);
    if (fd < 0)
        return pjs_error_set(err, errno == ENOENT ? PJS_ERR_NOT_FOUND : PJS_ERR_INVALID_ARGUMENT,
                             "shared memory region \"%s\": cannot open key \"%s\": %s", in->name,
                             in->key, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = pjs_error_set(err, PJS_ERR_IO, "shared memory region \"%s\": %s", in->name,
                           strerror(errno));
        goto out;
    }
    uint64_t object_size = (uint64_t)st.st_size;
    if (in->byte_size == 0 || in->offset > object_size || in->byte_size > object_size - in->offset) {
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "shared memory region \"%s\": offset %llu + byte_size %llu is outside "
                           "the %llu bytes of \"%s\"",
                           in->name, (unsigned long long)in->offset,
                           (unsigned long long)in->byte_size, (unsigned long long)object_size,
                           in->key);
        goto out;
    }
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t map_offset = in->offset / page * page;
    g->map_size = (size_t)(in->offset - map_offset + in->byte_size);
    g->map = mmap(NULL, g->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)map_offset);
    if (g->map == MAP_FAILED) {
        g->map = NULL;
        rc = pjs_error_set(err, PJS_ERR_IO, "shared memory region \"%s\": mmap: %s", in->name,
                           strerror(errno));
        goto out;
    }
    g->base = (unsigned char *)g->map + (in->offset - map_offset);
out:
    close(fd);
    return rc;
}

int pjs_shm_register(pjs_shm_registry *r, const char *name, const char *key, uint64_t offset,
                     uint64_t byte_size, pjs_error *err)
{
    if (!r->allowed)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "client shared memory is disabled on this server (start pjserve "
                             "with --allow-client-shm to enable it)");
    if (name == NULL || name[0] == '\0' || strlen(name) >= PJS_SHM_NAME_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "shared memory region name must be 1 to %d bytes",
                             PJS_SHM_NAME_MAX - 1);
    if (key == NULL || key[0] == '\0' || strlen(key) >= PJS_SHM_NAME_MAX ||
        strchr(key + 1, '/') != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "shared memory region \"%s\": key must be a shm_open name such as "
                             "\"/input0\" (no '/' after the first character)",
                             name);
    pjs_shm_region *g = calloc(1, sizeof *g);
    if (g == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    snprintf(g->info.name, sizeof g->info.name, "%s", name);
    snprintf(g->info.key, sizeof g->info.key, "%s", key);
    g->info.offset = offset;
    g->info.byte_size = byte_size;
    atomic_init(&g->refs, 1);
    int rc = map_region(g, err);
    if (rc != 0) {
        free(g);
        return rc;
    }
    pthread_mutex_lock(&r->lock);
    if (find_locked(r, name) != NULL) {
        pthread_mutex_unlock(&r->lock);
        region_unref(g);
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "shared memory region \"%s\" is already registered; unregister it "
                             "first",
                             name);
    }
    g->next = r->regions;
    r->regions = g;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

int pjs_shm_unregister(pjs_shm_registry *r, const char *name, pjs_error *err)
{
    pjs_shm_region *dropped = NULL;
    pthread_mutex_lock(&r->lock);
    pjs_shm_region **link = &r->regions;
    bool found = false;
    while (*link != NULL) {
        pjs_shm_region *g = *link;
        if (name == NULL || name[0] == '\0' || strcmp(g->info.name, name) == 0) {
            *link = g->next;
            g->next = dropped;
            dropped = g;
            found = true;
        } else {
            link = &g->next;
        }
    }
    pthread_mutex_unlock(&r->lock);
    while (dropped != NULL) {
        pjs_shm_region *next = dropped->next;
        region_unref(dropped);
        dropped = next;
    }
    if (!found && name != NULL && name[0] != '\0')
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "shared memory region \"%.256s\" is not registered", name);
    return 0;
}

int pjs_shm_status(pjs_shm_registry *r, const char *name, pjs_shm_info *out, size_t cap,
                   pjs_error *err)
{
    size_t n = 0;
    pthread_mutex_lock(&r->lock);
    for (pjs_shm_region *g = r->regions; g != NULL; g = g->next) {
        if (name != NULL && name[0] != '\0' && strcmp(g->info.name, name) != 0)
            continue;
        if (n < cap)
            out[n] = g->info;
        n++;
    }
    pthread_mutex_unlock(&r->lock);
    if (n == 0 && name != NULL && name[0] != '\0')
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "shared memory region \"%.256s\" is not registered", name);
    return (int)n;
}

int pjs_shm_view_get(pjs_shm_registry *r, const char *name, uint64_t offset, uint64_t size,
                     pjs_shm_view *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->lock);
    pjs_shm_region *g = name != NULL ? find_locked(r, name) : NULL;
    if (g != NULL)
        atomic_fetch_add(&g->refs, 1);
    pthread_mutex_unlock(&r->lock);
    if (g == NULL)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "shared memory region \"%.256s\" is not registered",
                             name ? name : "");
    if (offset > g->info.byte_size || size > g->info.byte_size - offset) {
        int rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "shared memory region \"%s\": offset %llu + size %llu exceeds its "
                               "%llu bytes",
                               g->info.name, (unsigned long long)offset,
                               (unsigned long long)size, (unsigned long long)g->info.byte_size);
        region_unref(g);
        return rc;
    }
    out->region = g;
    out->data = g->base + offset;
    out->size = (size_t)size;
    return 0;
}

__attribute__((noinline)) void pjs_shm_view_write(const pjs_shm_view *v, const void *src, size_t n)
{
    memcpy(v->data, src, n);
}

void pjs_shm_view_release(pjs_shm_view *v)
{
    if (v->region != NULL)
        region_unref(v->region);
    memset(v, 0, sizeof *v);
}
