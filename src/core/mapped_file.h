/*
 * mapped_file.h - whole files in memory, positioned reads that notice a file
 * changed under us, and atomic writes.
 *
 * A pjs_mapped_file owns a private copy of a regular file's bytes, read at
 * open; they stay valid until pjs_mapped_file_close. It is a copy, not a
 * memory map, on purpose: a mapped file that someone truncates raises SIGBUS
 * on the next access, which no error path can catch; a copy cannot change
 * under us. An empty file gives data == NULL, size == 0. Not shared between
 * threads while being opened or closed; reading the bytes from several
 * threads is fine.
 *
 * Files read again later (weights of models without a host floor) are read
 * with pjs_pread_exact from a descriptor kept open, after comparing the
 * file's identity (pjs_file_identity: device, inode, size, modification
 * time) with the one taken when it was opened.
 */
#ifndef PJS_CORE_MAPPED_FILE_H
#define PJS_CORE_MAPPED_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

typedef struct pjs_mapped_file {
    const unsigned char *data;
    size_t size;
} pjs_mapped_file;

int pjs_mapped_file_open(pjs_mapped_file *mf, const char *path, pjs_error *err);
void pjs_mapped_file_close(pjs_mapped_file *mf);

/* What tells one state of a file from another, cheaply: a write or a
 * truncation changes the size or the modification time (unless the time is
 * set back, or the write lands within one clock tick of the last: a checksum
 * of the bytes covers those). Not the change time: it also moves when the
 * path is renamed over, which leaves the bytes of the file held open as
 * they were. */
typedef struct pjs_file_identity {
    unsigned long long dev, ino;
    long long size;
    long long mtime_s, mtime_ns;
} pjs_file_identity;

/* Opens a regular file read-only (close-on-exec) and takes its identity;
 * returns the descriptor, or a negative status with err naming path. */
int pjs_file_open_identity(const char *path, pjs_file_identity *id, pjs_error *err);
/* The identity of an open descriptor now; IO error naming path. */
int pjs_file_identity_of(int fd, const char *path, pjs_file_identity *id, pjs_error *err);
bool pjs_file_identity_equal(const pjs_file_identity *a, const pjs_file_identity *b);

/* Reads exactly n bytes at offset into dst; a file that ends first (it was
 * truncated) is an IO error naming path. */
int pjs_pread_exact(int fd, void *dst, size_t n, unsigned long long offset, const char *path,
                    pjs_error *err);

/* Reads a whole regular file into a fresh NUL-terminated buffer (freed with
 * free()); refuses files larger than max_size with PJS_ERR_RESOURCE_EXHAUSTED. */
int pjs_read_file(const char *path, size_t max_size, char **out_data, size_t *out_size,
                  pjs_error *err);

/* One piece of a file written with pjs_write_file_atomic_parts. */
typedef struct pjs_file_part {
    const void *data;
    size_t size;
} pjs_file_part;

/* Writes the parts, in order, to path atomically (temporary file in the same
 * directory, then rename), creating the file with mode 0644. On failure no
 * file is left behind and path is unchanged. Messages name path. */
int pjs_write_file_atomic_parts(const char *path, const pjs_file_part *parts, size_t n_parts,
                                pjs_error *err);
/* The same for one buffer. */
int pjs_write_file_atomic(const char *path, const void *data, size_t size, pjs_error *err);

#endif
