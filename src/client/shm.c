/*
 * shm.c - POSIX shared memory regions this process creates for staging
 * inputs and outputs: shm_open (exclusive: a region never silently
 * shares an older object), ftruncate, mmap; destroy unmaps and unlinks.
 * Registration with the server is in calls.c.
 */
#include "client/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct pjs_client_shm {
    char *key;
    void *data;
    size_t size;
};

int pjs_client_shm_create(const char *key, size_t byte_size, pjs_client_shm **out,
                          pjs_client_error *err)
{
    *out = NULL;
    if (key == NULL || key[0] != '/' || strchr(key + 1, '/') != NULL || byte_size == 0)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "a region needs a key \"/name\" (one slash, first) and a size above 0");
    pjs_client_shm *s = calloc(1, sizeof *s);
    if (s == NULL || (s->key = pjsc_strdup(key)) == NULL) {
        free(s);
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a region");
    }
    int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int e = errno;
        free(s->key);
        free(s);
        return pjsc_fail(err, e == EEXIST ? PJS_CLIENT_ALREADY_EXISTS : PJS_CLIENT_INTERNAL,
                         "cannot create shared memory %s: %s%s", key, strerror(e),
                         e == EEXIST ? " (pick another key, or remove /dev/shm/... if it is "
                                       "left from a crashed run)"
                                     : "");
    }
    int rc = 0;
    if (ftruncate(fd, (off_t)byte_size) != 0) {
        rc = pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "cannot size shared memory %s to %zu "
                       "bytes: %s", key, byte_size, strerror(errno));
    } else {
        s->data = mmap(NULL, byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (s->data == MAP_FAILED)
            rc = pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "cannot map shared memory %s: %s",
                           key, strerror(errno));
    }
    close(fd);
    if (rc != 0) {
        shm_unlink(key);
        free(s->key);
        free(s);
        return rc;
    }
    s->size = byte_size;
    *out = s;
    pjsc_ok(err);
    return 0;
}

void pjs_client_shm_destroy(pjs_client_shm *s)
{
    if (s == NULL)
        return;
    munmap(s->data, s->size);
    shm_unlink(s->key);
    free(s->key);
    free(s);
}

void *pjs_client_shm_data(const pjs_client_shm *s)
{
    return s->data;
}

size_t pjs_client_shm_size(const pjs_client_shm *s)
{
    return s->size;
}

const char *pjs_client_shm_key(const pjs_client_shm *s)
{
    return s->key;
}
