/*
 * mapped_file.c - mmap and bounded reads of regular files (see mapped_file.h).
 */
#include "core/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

int pjs_mapped_file_open(pjs_mapped_file *mf, const char *path, pjs_error *err)
{
    mf->data = NULL;
    mf->size = 0;
    struct stat st;
    int fd = open_regular(path, &st, err);
    if (fd < 0)
        return fd;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return pjs_error_set(err, PJS_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        mf->data = p;
        mf->size = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

void pjs_mapped_file_close(pjs_mapped_file *mf)
{
    if (mf->data != NULL)
        munmap((void *)mf->data, mf->size);
    mf->data = NULL;
    mf->size = 0;
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
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = pjs_error_set(err, PJS_ERR_IO, "%s: read failed: %s", path,
                               n < 0 ? strerror(errno) : "file shrank while reading");
            goto out;
        }
        got += (size_t)n;
    }
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
