/*
 * shm.c - client shared-memory regions, system and CUDA: register, look up,
 * copy.
 *
 * Two lists under one mutex: the regions (clients register a handful; the
 * count is bounded by --max-shm-regions) and the objects they lie in, one
 * per (device, inode) with the descriptor opened at its first registration.
 * Objects are found by identity, not by key, so a key whose object the
 * client removed and created again gets a fresh descriptor instead of the
 * stale one.
 *
 * Lifetimes. A region's reference count is the table's reference plus one
 * per live view. An object's count is one while it is listed plus one per
 * region struct over it; `registered` (under the mutex) counts the listed
 * regions over it, and when it reaches zero the object leaves the list. The
 * descriptor is closed with the object's last reference, so a request whose
 * region was unregistered meanwhile still reads and writes a valid
 * descriptor.
 *
 * Copies go through pread and pwrite, which report a shrunken object as a
 * short read or as a size check that fails; nothing here maps client memory,
 * so nothing the client does to its object can raise SIGBUS in the server.
 * A pwrite racing a truncate between the size check and the write may grow
 * the client's object back to the region's end; that is the client's own
 * object, within the size it registered.
 *
 * A CUDA region owns the mapping of its IPC handle instead of an object;
 * the mapping is closed with the region's last reference, outside the
 * lock, like a descriptor. Its bytes are copied through the registry's
 * pjs_cuda_ipc_ops (the driver, or a test's fake).
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

typedef struct shm_object shm_object;

struct shm_object {
    int fd; /* O_RDWR, close-on-exec; closed with the last reference */
    dev_t dev;
    ino_t ino;
    atomic_int refs;   /* 1 while listed + 1 per region struct over it */
    size_t registered; /* listed regions over it; under the registry's lock */
    shm_object *next;  /* the registry's list; under its lock */
};

struct pjs_shm_region {
    pjs_shm_info info;
    shm_object *object; /* system: holds one of its references; NULL for CUDA */
    pjs_cuda_ipc_mapping *mapping; /* CUDA: closed with the last reference */
    const pjs_cuda_ipc_ops *cuda;  /* CUDA: what opened the mapping */
    pjs_byte_budget *budget;
    atomic_int refs; /* the table's + one per view */
    pjs_shm_region *next;
};

struct pjs_shm_registry {
    bool allowed;
    uint64_t max_regions, max_bytes;
    pjs_byte_budget *budget;
    const pjs_cuda_ipc_ops *cuda;
    pthread_mutex_t lock;
    pjs_shm_region *regions; /* registered */
    uint64_t n_regions, n_bytes;
    shm_object *objects; /* with at least one registered region */
    size_t n_objects;
};

int pjs_shm_registry_create(const pjs_shm_options *o, pjs_shm_registry **out, pjs_error *err)
{
    pjs_shm_registry *r = calloc(1, sizeof *r);
    if (r == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    r->allowed = o->allowed;
    r->max_regions = o->max_regions != 0 ? o->max_regions : PJS_SHM_DEFAULT_MAX_REGIONS;
    r->max_bytes = o->max_bytes != 0 ? o->max_bytes : PJS_SHM_DEFAULT_MAX_BYTES;
    r->budget = o->budget;
    r->cuda = o->cuda != NULL ? o->cuda : pjs_cuda_ipc_driver();
    pthread_mutex_init(&r->lock, NULL);
    *out = r;
    return 0;
}

static void object_unref(shm_object *ob)
{
    if (atomic_fetch_sub(&ob->refs, 1) != 1)
        return;
    close(ob->fd);
    free(ob);
}

static void region_unref(pjs_shm_region *g)
{
    if (atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    if (g->object != NULL)
        object_unref(g->object);
    if (g->mapping != NULL)
        g->cuda->close(g->mapping);
    free(g);
}

void pjs_shm_registry_destroy(pjs_shm_registry *r)
{
    if (r == NULL)
        return;
    for (pjs_shm_region *g = r->regions, *next; g != NULL; g = next) {
        next = g->next;
        region_unref(g);
    }
    for (shm_object *ob = r->objects, *next; ob != NULL; ob = next) {
        next = ob->next;
        object_unref(ob);
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

/* Opens the object of g's key and checks that it holds g's window; *fd and
 * *st describe it on success. */
static int open_object(const pjs_shm_info *in, int *fd, struct stat *st, pjs_error *err)
{
    *fd = shm_open(in->key, O_RDWR, 0);
    if (*fd < 0)
        return pjs_error_set(err, errno == ENOENT ? PJS_ERR_NOT_FOUND : PJS_ERR_INVALID_ARGUMENT,
                             "shared memory region \"%s\": cannot open key \"%s\": %s", in->name,
                             in->key, strerror(errno));
    int rc = 0;
    if (fstat(*fd, st) != 0)
        rc = pjs_error_set(err, PJS_ERR_IO, "shared memory region \"%s\": %s", in->name,
                           strerror(errno));
    else if (!S_ISREG(st->st_mode))
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "shared memory region \"%s\": key \"%s\" is not a shared memory "
                           "object",
                           in->name, in->key);
    else if (in->byte_size == 0 || in->offset > (uint64_t)st->st_size ||
             in->byte_size > (uint64_t)st->st_size - in->offset)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "shared memory region \"%s\": offset %llu + byte_size %llu is outside "
                           "the %llu bytes of \"%s\"",
                           in->name, (unsigned long long)in->offset,
                           (unsigned long long)in->byte_size, (unsigned long long)st->st_size,
                           in->key);
    if (rc != 0) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

/* " as CUDA shared memory" for a region of the other kind than `kind`. */
static const char *other_kind(const pjs_shm_region *g, pjs_shm_kind kind)
{
    if (g->info.kind == kind)
        return "";
    return g->info.kind == PJS_SHM_CUDA ? " as CUDA shared memory" : " as system shared memory";
}

/* Refuses g when its name is taken (by either kind) or it would pass a
 * limit. */
static int admit_locked(pjs_shm_registry *r, const pjs_shm_info *in, pjs_error *err)
{
    const pjs_shm_region *taken = find_locked(r, in->name);
    if (taken != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "shared memory region \"%s\" is already registered%s; unregister "
                             "it first",
                             in->name, other_kind(taken, in->kind));
    if (r->n_regions >= r->max_regions)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "shared memory region \"%s\": the server's limit of %llu "
                             "registered regions is reached; unregister regions no longer used, "
                             "or raise --max-shm-regions",
                             in->name, (unsigned long long)r->max_regions);
    if (in->byte_size > r->max_bytes - r->n_bytes)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "shared memory region \"%s\": its %llu bytes would pass the "
                             "server's limit of %llu registered bytes (%llu are registered); "
                             "unregister regions no longer used, or raise --max-shm-bytes",
                             in->name, (unsigned long long)in->byte_size,
                             (unsigned long long)r->max_bytes, (unsigned long long)r->n_bytes);
    return 0;
}

/* The listed object with st's identity, or a new listed one owning *fd
 * (then *fd becomes -1); NULL when out of memory. */
static shm_object *object_for_locked(pjs_shm_registry *r, int *fd, const struct stat *st)
{
    shm_object *ob = r->objects;
    while (ob != NULL && (ob->dev != st->st_dev || ob->ino != st->st_ino))
        ob = ob->next;
    if (ob == NULL) {
        ob = calloc(1, sizeof *ob);
        if (ob == NULL)
            return NULL;
        ob->fd = *fd;
        *fd = -1;
        ob->dev = st->st_dev;
        ob->ino = st->st_ino;
        atomic_init(&ob->refs, 1);
        ob->next = r->objects;
        r->objects = ob;
        r->n_objects++;
    }
    atomic_fetch_add(&ob->refs, 1);
    ob->registered++;
    return ob;
}

/* Refuses a registration when client shared memory is off or the name is
 * not one the registry can keep. */
static int check_allowed_name(const pjs_shm_registry *r, const char *name, pjs_error *err)
{
    if (!r->allowed)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "client shared memory is disabled on this server (start pjserve "
                             "with --allow-client-shm to enable it)");
    if (name == NULL || name[0] == '\0' || strlen(name) >= PJS_SHM_NAME_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "shared memory region name must be 1 to %d bytes",
                             PJS_SHM_NAME_MAX - 1);
    return 0;
}

/* Lists g, a region admitted under the lock. */
static void insert_locked(pjs_shm_registry *r, pjs_shm_region *g)
{
    g->next = r->regions;
    r->regions = g;
    r->n_regions++;
    r->n_bytes += g->info.byte_size;
}

int pjs_shm_register(pjs_shm_registry *r, const char *name, const char *key, uint64_t offset,
                     uint64_t byte_size, pjs_error *err)
{
    int rc = check_allowed_name(r, name, err);
    if (rc != 0)
        return rc;
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
    g->info.kind = PJS_SHM_SYSTEM;
    g->info.offset = offset;
    g->info.byte_size = byte_size;
    g->budget = r->budget;
    atomic_init(&g->refs, 1);
    int fd;
    struct stat st;
    rc = open_object(&g->info, &fd, &st, err);
    if (rc != 0) {
        free(g);
        return rc;
    }
    pthread_mutex_lock(&r->lock);
    rc = admit_locked(r, &g->info, err);
    if (rc == 0 && (g->object = object_for_locked(r, &fd, &st)) == NULL)
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    if (rc == 0)
        insert_locked(r, g);
    pthread_mutex_unlock(&r->lock);
    if (fd >= 0) /* the object was open already, or the region was refused */
        close(fd);
    if (rc != 0)
        free(g);
    return rc;
}

/* Admits the region under the lock, listing it when `insert`. */
static int admit(pjs_shm_registry *r, pjs_shm_region *g, bool insert, pjs_error *err)
{
    pthread_mutex_lock(&r->lock);
    int rc = admit_locked(r, &g->info, err);
    if (rc == 0 && insert)
        insert_locked(r, g);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int pjs_shm_register_cuda(pjs_shm_registry *r, const char *name, const void *raw_handle,
                          size_t handle_len, int64_t device_id, uint64_t byte_size,
                          pjs_error *err)
{
    int rc = check_allowed_name(r, name, err);
    if (rc != 0)
        return rc;
    if (raw_handle == NULL || handle_len != PJS_CUDA_IPC_HANDLE_SIZE)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "CUDA shared memory region \"%s\": raw_handle must be the %d "
                             "bytes of a CUDA IPC memory handle (cudaIpcGetMemHandle), not %zu",
                             name, PJS_CUDA_IPC_HANDLE_SIZE, raw_handle ? handle_len : 0);
    if (device_id < 0 || byte_size == 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "CUDA shared memory region \"%s\": device_id must be 0 or more "
                             "and byte_size more than 0 (got %lld and %llu)",
                             name, (long long)device_id, (unsigned long long)byte_size);
    pjs_shm_region *g = calloc(1, sizeof *g);
    if (g == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    g->info.kind = PJS_SHM_CUDA;
    snprintf(g->info.name, sizeof g->info.name, "%s", name);
    g->info.device_id = device_id;
    g->info.byte_size = byte_size;
    g->budget = r->budget;
    g->cuda = r->cuda;
    atomic_init(&g->refs, 1);
    /* Names and limits are checked before the device is touched, and again
     * once the handle is open (another registration may have come first). */
    if ((rc = admit(r, g, false, err)) != 0)
        goto out;
    if ((rc = r->cuda->open(raw_handle, device_id, byte_size, &g->mapping, err)) != 0) {
        pjs_error_prefix(err, "CUDA shared memory region \"%s\": ", name);
        goto out;
    }
    rc = admit(r, g, true, err);
out:
    if (rc != 0) {
        if (g->mapping != NULL)
            r->cuda->close(g->mapping);
        free(g);
    }
    return rc;
}

int pjs_shm_unregister(pjs_shm_registry *r, const char *name, pjs_error *err)
{
    return pjs_shm_unregister_kind(r, PJS_SHM_SYSTEM, name, err);
}

/* NOT_FOUND for `name`, not registered as `kind`. */
static int not_registered(pjs_shm_kind kind, const char *name, pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_NOT_FOUND, "%sshared memory region \"%.256s\" is not "
                         "registered", kind == PJS_SHM_CUDA ? "CUDA " : "", name);
}

int pjs_shm_unregister_kind(pjs_shm_registry *r, pjs_shm_kind kind, const char *name,
                            pjs_error *err)
{
    pjs_shm_region *dropped = NULL;
    shm_object *delisted = NULL;
    bool all = name == NULL || name[0] == '\0';
    pthread_mutex_lock(&r->lock);
    for (pjs_shm_region **link = &r->regions; *link != NULL;) {
        pjs_shm_region *g = *link;
        if (g->info.kind != kind || (!all && strcmp(g->info.name, name) != 0)) {
            link = &g->next;
            continue;
        }
        *link = g->next;
        g->next = dropped;
        dropped = g;
        r->n_regions--;
        r->n_bytes -= g->info.byte_size;
        if (g->object != NULL)
            g->object->registered--;
    }
    for (shm_object **link = &r->objects; *link != NULL;) {
        shm_object *ob = *link;
        if (ob->registered > 0) {
            link = &ob->next;
            continue;
        }
        *link = ob->next;
        ob->next = delisted;
        delisted = ob;
        r->n_objects--;
    }
    pthread_mutex_unlock(&r->lock);
    if (dropped == NULL && !all)
        return not_registered(kind, name, err);
    for (pjs_shm_region *next; dropped != NULL; dropped = next) {
        next = dropped->next;
        region_unref(dropped);
    }
    for (shm_object *next; delisted != NULL; delisted = next) {
        next = delisted->next;
        object_unref(delisted);
    }
    return 0;
}

int pjs_shm_status(pjs_shm_registry *r, const char *name, pjs_shm_info *out, size_t cap,
                   pjs_error *err)
{
    return pjs_shm_status_kind(r, PJS_SHM_SYSTEM, name, out, cap, err);
}

int pjs_shm_status_kind(pjs_shm_registry *r, pjs_shm_kind kind, const char *name,
                        pjs_shm_info *out, size_t cap, pjs_error *err)
{
    size_t n = 0;
    pthread_mutex_lock(&r->lock);
    for (pjs_shm_region *g = r->regions; g != NULL; g = g->next) {
        if (g->info.kind != kind ||
            (name != NULL && name[0] != '\0' && strcmp(g->info.name, name) != 0))
            continue;
        if (n < cap)
            out[n] = g->info;
        n++;
    }
    pthread_mutex_unlock(&r->lock);
    if (n == 0 && name != NULL && name[0] != '\0')
        return not_registered(kind, name, err);
    return (int)n;
}

size_t pjs_shm_open_objects(pjs_shm_registry *r)
{
    pthread_mutex_lock(&r->lock);
    size_t n = r->n_objects;
    pthread_mutex_unlock(&r->lock);
    return n;
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
    out->offset = offset;
    out->size = (size_t)size;
    return 0;
}

/* The error for a window [.., end) that g's object no longer holds. */
static int shrank(const pjs_shm_region *g, uint64_t end, pjs_error *err)
{
    struct stat st;
    char now[64] = "fewer";
    if (fstat(g->object->fd, &st) == 0)
        snprintf(now, sizeof now, "%llu", (unsigned long long)st.st_size);
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "shared memory region \"%s\" shrank: its object \"%s\" now holds %s "
                         "bytes, and the request needs bytes up to %llu; create the object "
                         "again and register the region again",
                         g->info.name, g->info.key, now, (unsigned long long)end);
}

/* Reads size bytes at `offset` into g's window from its object. */
static int read_object(const pjs_shm_region *g, uint64_t offset, unsigned char *data,
                       size_t size, pjs_error *err)
{
    uint64_t at = g->info.offset + offset;
    size_t done = 0;
    int rc = 0;
    while (done < size && rc == 0) {
        ssize_t n = pread(g->object->fd, data + done, size - done, (off_t)(at + done));
        if (n > 0)
            done += (size_t)n;
        else if (n == 0)
            rc = shrank(g, at + size, err);
        else if (errno != EINTR)
            rc = pjs_error_set(err, PJS_ERR_IO, "shared memory region \"%s\": read: %s",
                               g->info.name, strerror(errno));
    }
    return rc;
}

/* Copies size bytes at `offset` into g's device memory to data. */
static int read_device(const pjs_shm_region *g, uint64_t offset, unsigned char *data,
                       size_t size, pjs_error *err)
{
    int rc = g->cuda->read(g->mapping, offset, data, size, err);
    if (rc != 0)
        pjs_error_prefix(err, "CUDA shared memory region \"%s\": ", g->info.name);
    return rc;
}

int pjs_shm_view_read_into(const pjs_shm_view *v, void *dst, pjs_error *err)
{
    const pjs_shm_region *g = v->region;
    return g->mapping != NULL ? read_device(g, v->offset, dst, v->size, err)
                              : read_object(g, v->offset, dst, v->size, err);
}

bool pjs_shm_view_device(const pjs_shm_view *v, int64_t *device_id, uint64_t *address)
{
    const pjs_shm_region *g = v->region;
    if (g == NULL || g->mapping == NULL || g->cuda->address == NULL)
        return false;
    *device_id = g->info.device_id;
    *address = g->cuda->address(g->mapping) + v->offset;
    return true;
}

int pjs_shm_view_write_from_device(const pjs_shm_view *v, uint64_t src, size_t n,
                                   pjs_error *err)
{
    const pjs_shm_region *g = v->region;
    if (n > v->size || g->mapping == NULL || g->cuda->write_from_device == NULL)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "shared memory region \"%s\": no device copy of %zu bytes into "
                             "its %zu-byte window",
                             g->info.name, n, v->size);
    int rc = g->cuda->write_from_device(g->mapping, v->offset, src, n, err);
    if (rc != 0)
        pjs_error_prefix(err, "CUDA shared memory region \"%s\": ", g->info.name);
    return rc;
}

int pjs_shm_view_read(pjs_shm_view *v, pjs_error *err)
{
    const pjs_shm_region *g = v->region;
    if (g->budget != NULL) {
        char what[PJS_SHM_NAME_MAX + 32];
        snprintf(what, sizeof what, "shared memory region \"%s\"", g->info.name);
        int rc = pjs_byte_budget_take_or_fail(g->budget, v->size, what, err);
        if (rc != 0)
            return rc;
    }
    unsigned char *data = malloc(v->size > 0 ? v->size : 1);
    if (data == NULL) {
        if (g->budget != NULL)
            pjs_byte_budget_give(g->budget, v->size);
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for %zu bytes of shared memory "
                             "region \"%s\"", v->size, g->info.name);
    }
    int rc = pjs_shm_view_read_into(v, data, err);
    if (rc != 0) {
        free(data);
        if (g->budget != NULL)
            pjs_byte_budget_give(g->budget, v->size);
        return rc;
    }
    v->data = data;
    v->budget = g->budget;
    return 0;
}

/* Writes n bytes to the start of v's window in its region's object. */
static int write_object(const pjs_shm_view *v, const void *src, size_t n, pjs_error *err)
{
    const pjs_shm_region *g = v->region;
    uint64_t at = g->info.offset + v->offset;
    struct stat st;
    if (fstat(g->object->fd, &st) != 0)
        return pjs_error_set(err, PJS_ERR_IO, "shared memory region \"%s\": %s", g->info.name,
                             strerror(errno));
    if ((uint64_t)st.st_size < at + n)
        return shrank(g, at + n, err);
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(g->object->fd, (const unsigned char *)src + done, n - done,
                           (off_t)(at + done));
        if (w > 0)
            done += (size_t)w;
        else if (w == 0 || errno != EINTR)
            return pjs_error_set(err, PJS_ERR_IO, "shared memory region \"%s\": write: %s",
                                 g->info.name, w == 0 ? "no progress" : strerror(errno));
    }
    return 0;
}

int pjs_shm_view_write(const pjs_shm_view *v, const void *src, size_t n, pjs_error *err)
{
    const pjs_shm_region *g = v->region;
    if (n > v->size)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "shared memory region \"%s\": %zu bytes written to a %zu-byte "
                             "window",
                             g->info.name, n, v->size);
    if (g->mapping == NULL)
        return write_object(v, src, n, err);
    int rc = g->cuda->write(g->mapping, v->offset, src, n, err);
    if (rc != 0)
        pjs_error_prefix(err, "CUDA shared memory region \"%s\": ", g->info.name);
    return rc;
}

void pjs_shm_view_release(pjs_shm_view *v)
{
    if (v->data != NULL) {
        free(v->data);
        if (v->budget != NULL)
            pjs_byte_budget_give(v->budget, v->size);
    }
    if (v->region != NULL)
        region_unref(v->region);
    memset(v, 0, sizeof *v);
}
