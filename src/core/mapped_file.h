/*
 * mapped_file.h - read-only memory maps of files, and bounded whole-file reads.
 *
 * A pjs_mapped_file owns one private read-only mapping of a regular file; the
 * bytes stay valid until pjs_mapped_file_close. An empty file maps to
 * data == NULL, size == 0. Not shared between threads while being opened or
 * closed; reading the mapped bytes from several threads is fine.
 */
#ifndef PJS_CORE_MAPPED_FILE_H
#define PJS_CORE_MAPPED_FILE_H

#include <stddef.h>

#include "core/status.h"

typedef struct pjs_mapped_file {
    const unsigned char *data;
    size_t size;
} pjs_mapped_file;

int pjs_mapped_file_open(pjs_mapped_file *mf, const char *path, pjs_error *err);
void pjs_mapped_file_close(pjs_mapped_file *mf);

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
