/*
 * mapped_file.c - whole-file copies, identities, positioned and bounded
 * reads, atomic writes (see mapped_file.h).
 */
#include "core/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int open_regular(const char *path, struct stat *st, pjs_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pjs_error_set(err, errno == ENOENT ? PJS_ERR_NOT_FOUND : PJS_ERR_IO,
                             "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return pjs_error_set(err, PJS_ERR_IO, "%s: not a regular file", path);
    }
    return fd;
}

/* Reads size bytes from the start of fd into buf; messages name path. */
static int read_all(int fd, char *buf, size_t size, const char *path, pjs_error *err)
{
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return pjs_error_set(err, PJS_ERR_IO, "%s: read failed: %s", path,
                                 n < 0 ? strerror(errno) : "file shrank while reading");
        got += (size_t)n;
    }
    return 0;
}

int pjs_mapped_file_open(pjs_mapped_file *mf, const char *path, pjs_error *err)
{
    mf->data = NULL;
    mf->size = 0;
    char *data;
    size_t size;
    int rc = pjs_read_file(path, SIZE_MAX - 1, &data, &size, err);
    if (rc != 0)
        return rc;
    if (size == 0) {
        free(data);
        return 0;
    }
    mf->data = (const unsigned char *)data;
    mf->size = size;
    return 0;
}

void pjs_mapped_file_close(pjs_mapped_file *mf)
{
    free((void *)mf->data);
    mf->data = NULL;
    mf->size = 0;
}

static void identity_from(const struct stat *st, pjs_file_identity *id)
{
    memset(id, 0, sizeof *id);
    id->dev = (unsigned long long)st->st_dev;
    id->ino = (unsigned long long)st->st_ino;
    id->size = (long long)st->st_size;
    id->mtime_s = (long long)st->st_mtim.tv_sec;
    id->mtime_ns = (long long)st->st_mtim.tv_nsec;
}

int pjs_file_open_identity(const char *path, pjs_file_identity *id, pjs_error *err)
{
    struct stat st;
    int fd = open_regular(path, &st, err);
    if (fd >= 0)
        identity_from(&st, id);
    return fd;
}

int pjs_file_identity_of(int fd, const char *path, pjs_file_identity *id, pjs_error *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return pjs_error_set(err, PJS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    identity_from(&st, id);
    return 0;
}

bool pjs_file_identity_equal(const pjs_file_identity *a, const pjs_file_identity *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_s == b->mtime_s && a->mtime_ns == b->mtime_ns;
}

int pjs_pread_exact(int fd, void *dst, size_t n, unsigned long long offset, const char *path,
                    pjs_error *err)
{
    char *p = dst;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, p + got, n - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return pjs_error_set(err, PJS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return pjs_error_set(err, PJS_ERR_IO,
                                 "%s: the file ends at byte %llu, before the %zu bytes expected "
                                 "at offset %llu (it was truncated)",
                                 path, offset + got, n, offset);
        got += (size_t)r;
    }
    return 0;
}

int pjs_read_file(const char *path, size_t max_size, char **out_data, size_t *out_size,
                  pjs_error *err)
{
    struct stat st;
    int fd = open_regular(path, &st, err);
    if (fd < 0)
        return fd;
    int rc = 0;
    char *buf = NULL;
    if ((unsigned long long)st.st_size > max_size) {
        rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED, "%s: %lld bytes, more than the %zu allowed",
                           path, (long long)st.st_size, max_size);
        goto out;
    }
    size_t size = (size_t)st.st_size;
    buf = malloc(size + 1);
    if (buf == NULL) {
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, size);
        goto out;
    }
    rc = read_all(fd, buf, size, path, err);
    if (rc != 0)
        goto out;
    buf[size] = '\0';
    *out_data = buf;
    *out_size = size;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

static int write_all(int fd, const void *data, size_t size)
{
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

int pjs_write_file_atomic_parts(const char *path, const pjs_file_part *parts, size_t n_parts,
                                pjs_error *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return pjs_error_set(err, PJS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n_parts; i++)
        if (write_all(fd, parts[i].data, parts[i].size) != 0)
            rc = pjs_error_set(err, PJS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = pjs_error_set(err, PJS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = pjs_error_set(err, PJS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    if (rc != 0)
        unlink(tmp);
    return rc;
}

int pjs_write_file_atomic(const char *path, const void *data, size_t size, pjs_error *err)
{
    pjs_file_part part = {data, size};
    return pjs_write_file_atomic_parts(path, &part, 1, err);
}
