/*
 * weight_store.h - one host copy of each bundle's weights for all the
 * workers of a node, in shared memory (`pjserve serve --shared-weights DIR`).
 *
 * A model's host floor (registry/model.h) is normally private memory, so N
 * workers on one machine hold N copies of every weight. With a store, the
 * floor is a read-only shared mapping of a segment file in DIR, a directory
 * on a tmpfs (/dev/shm/pjserve-NODE): N workers cost one copy. Loads still
 * copy host -> device through the device owner, as before; the store backs
 * the host floor only.
 *
 * Segments are content-addressed. A segment's key is a checksum over the
 * weights' layout (each weight's name, dtype, shape, size) and each weight's
 * checksum of its bytes (registry/bundle.h), so the same weights share one
 * segment (across models and restarts) and a changed bundle gets a new
 * one. A segment file KEY.weights holds a header (magic, version, sizes,
 * key, one entry per weight: offset, size, checksum; a checksum over the
 * header) and then the weights, each 64-byte aligned.
 *
 * Attaching checks everything before the memory is used: the file size, the
 * header against the layout this worker computed from its own weights file,
 * and every weight's bytes against the checksum this worker took of the
 * file. A segment that fails is refused with a warning naming it and why,
 * unlinked, and replaced by a fresh one; it is never served from. Each load
 * from a shared floor checks the size and the checksums again (another
 * process with write access to DIR could change a segment after attach).
 *
 * Protocol (every step relative to DIR's descriptor, nothing followed through
 * a symbolic link):
 *   - DIR/.lock orders publishing and sweeping: attach, create and publish
 *     hold it shared for a few system calls; a sweep holds it exclusively.
 *   - A worker that maps a segment holds a shared flock on it for as long
 *     as it maps it; the kernel drops it when the process dies, kill -9
 *     included.
 *   - Creating: .KEY.creating is made with O_EXCL and held exclusively while
 *     it is filled; then renamed to KEY.weights (never replacing one) and
 *     the lock turned shared. A half-written segment never has the final
 *     name. A second worker needing the same key waits on the temporary's
 *     lock, then attaches.
 *   - Sweeping (at store open, after each release, and from
 *     pjs_wstore_sweep_dir, which a node supervisor calls after a worker
 *     died) removes every segment and temporary it can lock exclusively:
 *     nobody maps them any more, so no live model needs them.
 *
 * Where: DIR is named by the operator, or, for `pjserve node --shared-weights
 * auto`, made by the node with mkdtemp (pjs_wstore_dir_make_private) and
 * handed to every worker: a name under /dev/shm that another user could
 * make first would otherwise be refused (as it must be) and stop the node.
 * A given DIR is opened with O_NOFOLLOW and checked on its descriptor; a
 * symbolic link, or a directory others may write, is refused with a
 * message saying what to do.
 *
 * Modes: segments and the lock file 0600; with a group, 0660 and that group
 * (the directory, created 0700 or 2770, must not be writable by others, nor by
 * its group without one). DIR must be on a tmpfs: a segment on a disk would
 * be written back to it.
 *
 * Threads: a pjs_wstore is read-only after open and may be used from any
 * thread; a pjs_wstore_segment is owned by one model.
 */
#ifndef PJS_REGISTRY_WEIGHT_STORE_H
#define PJS_REGISTRY_WEIGHT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

typedef struct pjs_wstore pjs_wstore;
typedef struct pjs_wstore_segment pjs_wstore_segment;

/* One weight as the store sees it: enough to name and check its bytes. */
typedef struct pjs_wstore_tensor {
    const char *name;
    pjs_dtype dtype;
    const pjs_shape *shape;
    uint64_t nbytes;
    uint64_t sum;     /* pjs_checksum_of its bytes, as read from the weights file */
} pjs_wstore_tensor;

/* Fills dst (t->nbytes bytes, 64-byte aligned) with weight i's bytes. */
typedef int (*pjs_wstore_fill_fn)(void *ctx, size_t i, void *dst, pjs_error *err);

typedef struct pjs_wstore_options {
    const char *dir;      /* on a tmpfs; created (0700, or 2770 with a group) when missing */
    const char *group;    /* NULL: mode 0600; else a group name or number: mode 0660 */
} pjs_wstore_options;

/* Opens (or creates) the directory, checks it and sweeps it. */
int pjs_wstore_open(const pjs_wstore_options *o, pjs_wstore **out, pjs_error *err);
void pjs_wstore_close(pjs_wstore *s);
const char *pjs_wstore_dir(const pjs_wstore *s);

/* The shared floor for weights t[0..n): an existing segment with these
 * contents, checked, or a new one filled with fill(ctx, i, dst) and
 * published. `model` names the model in logs. On success *out maps it and
 * holds it; pjs_wstore_segment_weight gives each weight's bytes.
 * Errors from fill are returned as they are (the weights file is at fault);
 * a failure of the store itself (no space on the tmpfs, permissions) is
 * UNAVAILABLE, and the caller may fall back to private memory. */
int pjs_wstore_acquire(pjs_wstore *s, const char *model, const pjs_wstore_tensor *t, size_t n,
                       pjs_wstore_fill_fn fill, void *ctx, pjs_wstore_segment **out,
                       pjs_error *err);
/* Unmaps the segment, drops its lock and sweeps the directory. */
void pjs_wstore_release(pjs_wstore *s, pjs_wstore_segment *seg);

/* Weight i's bytes in the segment (read-only mapping). */
const void *pjs_wstore_segment_weight(const pjs_wstore_segment *seg, size_t i);
/* The segment file's path, for messages. */
const char *pjs_wstore_segment_path(const pjs_wstore_segment *seg);
/* Checks that the segment still has its size and every weight its checksum;
 * FAILED_PRECONDITION naming the file otherwise. */
int pjs_wstore_segment_verify(const pjs_wstore_segment *seg, pjs_error *err);

/* Removes every segment in dir that no process maps (and temporaries whose
 * creator died); returns how many were removed, or a negative status. */
int pjs_wstore_sweep_dir(const char *dir, pjs_error *err);

/* Makes a fresh directory for the store of one node's workers, with a name
 * nobody can guess or make first: base/pjserve-weights-XXXXXX by mkdtemp,
 * mode 0700 (`pjserve node --shared-weights auto`). */
int pjs_wstore_dir_make_private(const char *base, char *out, size_t size, pjs_error *err);

/* Sweeps dir, then removes its lock file and the directory (left as it is
 * while a process still maps a segment in it); for the maker of a private
 * directory once every worker is gone. */
void pjs_wstore_dir_remove(const char *dir);

/* ---- the segment format, exposed for tests and the fuzz driver ---------- */

#define PJS_WSTORE_MAGIC "PJSWSEG1"
#define PJS_WSTORE_VERSION 1u
/* Each weight starts at a multiple of this in the segment. */
#define PJS_WSTORE_ALIGN 64u

/* Where each weight lies in a segment for weights t[0..n). */
typedef struct pjs_wstore_layout {
    uint64_t key;            /* content key: names the segment */
    size_t n;
    uint64_t header_bytes;   /* page-rounded: the weights start there */
    uint64_t total_bytes;    /* the file's size, page-rounded */
    uint64_t *offsets;       /* n, owned */
    const pjs_wstore_tensor *tensors; /* borrowed */
} pjs_wstore_layout;

int pjs_wstore_layout_init(pjs_wstore_layout *l, const pjs_wstore_tensor *t, size_t n,
                           pjs_error *err);
void pjs_wstore_layout_free(pjs_wstore_layout *l);
/* The segment's file name for a key: 16 hex digits and ".weights". */
void pjs_wstore_segment_name(uint64_t key, char out[32]);
/* Writes the header of layout l into hdr (l->header_bytes bytes). */
void pjs_wstore_header_write(const pjs_wstore_layout *l, void *hdr);
/* Checks that `size` bytes at `seg` start with the header of l and have
 * its size; INVALID_ARGUMENT saying what differs otherwise. Reads only the
 * header (seg may be any bytes: a segment written by another process). */
int pjs_wstore_header_check(const pjs_wstore_layout *l, const void *seg, size_t size,
                            pjs_error *err);
/* Checks every weight's bytes in a segment of layout l against its sum. */
int pjs_wstore_data_check(const pjs_wstore_layout *l, const void *seg, pjs_error *err);

#endif
